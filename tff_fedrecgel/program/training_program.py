"""The round loop of a simulation run, with releases and checkpoints.

Nothing a finished round produced is lost, and a fault leaves a run that
resumes to the same numbers:

* metrics rows are kept in memory and in every checkpoint; `metrics.csv` is
  rewritten whole (to a temporary file, then renamed) after each round and
  never read back, so a file deleted or garbled mid-run is whole again after
  the next round, and a resumed run rewrites it from its checkpoint's rows;
* TensorBoard scalars go through `tensorboard_extras.ScalarReleaseManager`:
  the rounds a resumed run writes again replace the interrupted run's;
* checkpoints go through `tff.program.FileProgramStateManager`; an
  unreadable one is set aside (`unreadable_*`, the newest kept for a look)
  and the previous one used; folders of writes cut short are removed;
* writes run with SIGINT/SIGTERM held back (`runtime.deferred_signals`), and
  their I/O errors (a full disk) become one-line `OutputError`s;
* a round in which every client was dropped, or after which the global
  weights are not finite, stops the run (`TrainingStoppedError`) before
  anything of it is released or saved: the last checkpoint stays the last
  good state.

Hold the experiment's lock (`outputs.lock_experiment`) while running.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator, Mapping
import contextlib
import errno
import json
import math
import os
import re
import shutil
import sys
import time
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import runtime
from tff_fedrecgel.models import neumf
from tff_fedrecgel.data import split_io
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.program import progress as progress_lib
from tff_fedrecgel.program import run_record
from tff_fedrecgel.program.metrics_log import MetricsLog
from tff_fedrecgel.program import tensorboard_extras
from tff_fedrecgel.program import tensorboard_hparams
from tff_fedrecgel.program.evaluation_plan import SELECT_ON
from tff_fedrecgel.program.evaluation_plan import EvaluationPlan
from tff_fedrecgel.program.outputs import ExperimentPaths, OutputError
from tff_fedrecgel.program.outputs import run_state_io, write_atomically
from tff_fedrecgel.program.selected_state import SelectedState
from tff_fedrecgel.program.selected_state import evaluations_since
from tff_fedrecgel.simulation import Simulation



class TrainingStoppedError(ValueError):
    """Training cannot go on (no client contributed, or weights not finite).

    Nothing of the failing round is released or saved; the run's latest
    checkpoint is its last good state.
    """


# Errors of the file system that TensorFlow reports inside longer messages.
_OS_REASONS = tuple(os.strerror(code) for code in (
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO, errno.ENOENT))


def _first_line(error: BaseException) -> str:
    """The reason of an error, on one line and without TensorFlow's noise."""
    if isinstance(error, tf.errors.OpError):
        text = re.sub(r'\{\{[^}]*\}\}', '', error.message)
        for reason in _OS_REASONS:
            if reason in text:
                return reason
    elif isinstance(error, OSError) and error.strerror:
        text = error.strerror
    else:
        text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


@contextlib.contextmanager
def _writing(what: str) -> Iterator[None]:
    """Holds signals back during a write; its I/O errors become one line."""
    try:
        with runtime.deferred_signals():
            yield
    except OutputError:
        raise
    except (OSError, tf.errors.OpError) as e:
        raise OutputError(f'cannot write {what}: {_first_line(e)}') from None


def _warn(message: str) -> None:
    logging.warning('%s', message)
    print(f'warning: {message}', file=sys.stderr, flush=True)


class _Checkpoints:
    """Program states, falling back to an older one when the latest is bad."""

    _PREFIX = 'program_state_'
    _UNREADABLE = 'unreadable_'

    def __init__(self, paths: ExperimentPaths, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._root = paths.checkpoints
        self._manager = tff.program.FileProgramStateManager(
            str(paths.checkpoints), prefix=self._PREFIX, keep_total=3, keep_first=False
        )
        self._prune()

    def _prune(self) -> None:
        """Removes folders of saves cut short and all but the newest
        unreadable checkpoint (the run holds the folder's lock: no save is
        in progress)."""
        stale = [p for p in self._root.glob(f'{self._PREFIX}*_temp*') if p.is_dir()]
        unreadable = sorted(
            (p for p in self._root.glob(f'{self._UNREADABLE}*') if p.is_dir()),
            key=lambda p: p.stat().st_mtime)
        for path in stale + unreadable[:-1]:
            shutil.rmtree(path, ignore_errors=True)

    def _set_aside(self, version: int) -> str:
        """Renames an unreadable checkpoint so the round can be saved again."""
        path = self._root / f'{self._PREFIX}{version}'
        target = self._root / f'{self._UNREADABLE}{self._PREFIX}{version}_{int(time.time())}'
        path.rename(target)
        return target.name

    def save(self, state, round_num: int) -> None:
        with _writing(f'the checkpoint of round {round_num} in {self._root}'):
            run_state_io(self._loop, self._manager.save(state, round_num))

    def load_latest(self, structures, check_record=None) -> tuple[Any, int, int]:
        """The latest readable state; (None, 0, -1) when there is none.

        Args:
          structures: Candidate structures, current first (older checkpoints
            may have an older structure).
          check_record: Called with (record or None, version) before a state
            is loaded; raises to refuse a checkpoint of another run.

        Returns:
          (state, version, index of the structure that fitted).
        """
        versions = sorted(
            self._loop.run_until_complete(self._manager.get_versions()) or [], reverse=True)
        for i, version in enumerate(versions):
            if check_record is not None:
                check_record(run_record.read_record(self._root / f'{self._PREFIX}{version}'),
                             version)
            error = None
            for index, structure in enumerate(structures):
                try:
                    state = run_state_io(self._loop, self._manager.load(version, structure))
                    return state, version, index
                except Exception as e:  # pylint: disable=broad-except
                    # A run killed while writing leaves a partial SavedModel.
                    error = error or e
            kept_as = self._set_aside(version)
            older = versions[i + 1:]
            then = (f'trying the checkpoint of round {older[0]}' if older
                    else 'no older checkpoint: starting from round 0')
            _warn(f'checkpoint of round {version} is unreadable ({_first_line(error)}); '
                  f'kept as {kept_as}; {then}')
        return None, 0, -1


def _program_state(simulation, best, train_seconds, eval_seconds,
                   metrics: MetricsLog | None = None, record: np.ndarray | None = None):
    """The state a checkpoint saves; without `record`, that of older versions."""
    state = collections.OrderedDict(
        simulation=simulation.get_state(),
        best=best,
        train_seconds=np.float64(train_seconds),
        eval_seconds=np.float64(eval_seconds),
        metrics_rows=metrics.to_state() if metrics else np.array('[]'),
    )
    if record is not None:
        state[run_record.RECORD_KEY] = record
    return state


def _check_round(simulation, train: Mapping[str, float], round_num: int,
                 last_checkpoint: int) -> None:
    """Stops a run that no longer trains (see `TrainingStoppedError`)."""
    kept = (f'the checkpoint of round {last_checkpoint} is kept' if last_checkpoint
            else 'no checkpoint was made yet')
    clients, dropped = train.get('clients'), train.get('dropped_clients')
    if clients and dropped is not None and dropped >= clients:
        raise TrainingStoppedError(
            f'round {round_num}: every client\'s update was non-finite ({int(dropped)} '
            f'of {int(clients)} dropped), so nothing trains; stopped ({kept}); lower '
            'the learning rates or the SAM radii')
    if not all(np.isfinite(w).all() for w in simulation.global_weights):
        raise TrainingStoppedError(
            f'round {round_num}: the global weights are no longer finite (NaN or '
            f'inf); stopped ({kept}); lower the learning rates or the SAM radii')


def _projector_tables(simulation) -> dict[str, np.ndarray] | None:
    """The item tables TensorBoard's projector shows (None: the model has none)."""
    own = getattr(simulation.algorithm, 'projector_tables', None)
    if own is not None:
        return own()
    if simulation.algorithm.item_scores is not None:  # Scores, no tables.
        return None
    item_gmf, item_mlp, _, _ = neumf.split_global_weights(  # A NeuMF.
        simulation.algorithm.model_config, simulation.global_weights)
    return {'item_gmf': item_gmf} if item_mlp is None else {
        'item_gmf': item_gmf, 'item_mlp': item_mlp}


def run_training(
    simulation: Simulation,
    *,
    paths: ExperimentPaths,
    total_rounds: int,
    rounds_per_eval: int = 1,
    rounds_per_checkpoint: int = 10,
    hparams: Mapping[str, Any] | None = None,
    validation: bool = False,
    eval_protocol: str = protocols.SAMPLED.name,
    rounds_per_full_eval: int | None = None,
    progress: bool = True,
    on_round_end: Callable[[int, Mapping[str, float]], None] | None = None,
    extra_train_metrics: Callable[[int], Mapping[str, float]] | None = None,
    extra_summary: Callable[[int], Mapping[str, Any]] | None = None,
    early_stopping_patience: int | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) a simulation to `total_rounds`; returns the summary.

    Args:
      simulation: The simulation to run (not yet initialized).
      paths: The experiment's output folders.
      total_rounds: The last round to run.
      rounds_per_eval: Evaluate (sampled protocol) every this many rounds
        (and at the end).
      rounds_per_checkpoint: Save program state every this many rounds (and at
        the end); 0 disables checkpoints.
      hparams: Settings shown in TensorBoard's hparams dashboard.
      validation: Whether the split has validation items; then the round with
        the best validation HR@10 is reported too (the honest selection).
      eval_protocol: 'sampled' (eval_negatives sampled negatives, the paper's 99), 'full'
        (every item the user did not train on) or 'both'
        (`evaluation_plan.EvaluationPlan`); users the simulation holds out are
        evaluated under the same protocols.
      rounds_per_full_eval: Full ranking every this many rounds (and at the
        end); default `rounds_per_eval`.
      progress: Show a progress bar.
      on_round_end: Called with (round, released metrics) after every round.
      extra_train_metrics: Called with the round number; its values are
        released with that round's `train/` metrics (e.g. `dp_epsilon`).
      extra_summary: Called with the rounds run; its values join the summary.
      early_stopping_patience: With a validation item, stop once this many
        evaluations of the served selection's group (`valid_full` under
        full ranking, else `valid`) have not improved on its best round.

    Returns:
      The summary dictionary (also written to `summary.json`).

    Raises:
      ValueError: On bad arguments.
      TrainingStoppedError: If a round leaves nothing trained or non-finite
        weights.
      OutputError: If an output cannot be written (e.g. a full disk).
    """
    if total_rounds < 1 or rounds_per_checkpoint < 0:
        raise ValueError('total_rounds must be >= 1, rounds_per_checkpoint >= 0')
    plan = EvaluationPlan(
        protocol=eval_protocol, rounds_per_eval=rounds_per_eval,
        rounds_per_full_eval=rounds_per_full_eval, validation=validation,
        heldout=len(simulation.heldout_users) > 0,
        stderr=_evaluation_sample(simulation) is not None, top_ks=simulation.top_ks)
    if early_stopping_patience and plan.served_selection is None:
        raise ValueError('early stopping needs a validation item (validation=True)')
    loop = asyncio.new_event_loop()
    try:
        return _run(
            simulation, loop, paths, total_rounds, plan,
            rounds_per_checkpoint, dict(hparams or {}), progress,
            on_round_end, extra_train_metrics, extra_summary, early_stopping_patience,
        )
    finally:
        loop.close()


def _restore(simulation, checkpoints, plan, paths, hparams, record):
    """Resumes from the latest readable checkpoint; returns its state, round
    and metrics rows (fresh values when there is none).

    A checkpoint whose record names other settings or other data is refused
    (`run_record.RunRecordError`). A missing `hparams.json` is rebuilt from
    a checkpoint whose record matches, and refused for one without a record.
    """
    fresh = _program_state(simulation, plan.empty_best(), 0.0, 0.0, record=record)
    legacy = _program_state(simulation, plan.empty_best(), 0.0, 0.0)
    fingerprint = run_record.parse_record(record)['data']
    found = {}

    def check_record(saved, version):
        run_record.check(saved, hparams=hparams, data_fingerprint=fingerprint,
                         round_num=version, root=paths.root)
        found[version] = saved

    restored, version, _ = checkpoints.load_latest([fresh, legacy], check_record)
    if restored is None:
        return fresh, 0, []
    if hparams and not paths.hparams.exists():
        if found.get(version) is None:
            raise run_record.RunRecordError(
                f'{paths.root}: hparams.json is missing and the checkpoint of round '
                f'{version} does not record its settings; put hparams.json back, or use '
                'another --experiment_name')
        with _writing(str(paths.hparams)):
            write_atomically(paths.hparams,
                             json.dumps(dict(hparams), indent=2, sort_keys=True) + '\n')
        _warn(f'{paths.hparams} was missing; rebuilt from the checkpoint of round {version}')
    simulation.restore(restored['simulation'], resume=True)
    del restored['simulation']  # Now the simulation's own: not kept twice.
    logging.info('resumed from the checkpoint of round %d', version)
    print(f'resuming from the checkpoint of round {version}', flush=True)
    return restored, version, MetricsLog.from_state(restored['metrics_rows'])


def _prune_temporary_files(paths: ExperimentPaths) -> None:
    """Removes temporary files of writes cut short (`write_atomically`'s and
    those of TFF's CSV release manager, which earlier versions used)."""
    for pattern in ('*.*.tmp', 'metrics.csv_temp*'):
        for path in paths.root.glob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()


def _evaluate(simulation, plan: EvaluationPlan, round_num: int, total_rounds: int,
              released: dict) -> None:
    """Adds the groups due at `round_num` to `released`."""
    for protocol in plan.protocols:
        if plan.due(protocol, round_num, total_rounds):
            for group in plan.groups(protocol):
                released[group.name] = simulation.evaluate(
                    group.which, heldout=group.heldout, protocol=protocol)


def _run(simulation, loop, paths, total_rounds, plan, rounds_per_checkpoint, hparams,
         progress, on_round_end, extra_train_metrics=None, extra_summary=None,
         patience=None):
    _prune_temporary_files(paths)
    checkpoints = _Checkpoints(paths, loop)
    simulation.use_state_folder(paths.user_states)
    simulation.initialize()
    record = run_record.make_record(hparams, split_io.split_fingerprint(simulation.split))
    program_state, last_checkpoint, rows = _restore(simulation, checkpoints, plan, paths,
                                                    hparams, record)
    best = program_state['best']
    train_seconds = float(program_state['train_seconds'])
    eval_seconds = float(program_state['eval_seconds'])

    metrics = MetricsLog(paths.metrics_csv, rows, plan)
    with _writing(str(paths.metrics_csv)):
        # Drops rows of rounds after the checkpoint (run again below) and
        # restores a file deleted or garbled since.
        metrics.write()
    start_round = simulation.round_num + 1
    served = plan.served_selection
    selected = SelectedState(paths, loop, served) if served else None
    since_best = 0
    if selected is not None:
        with _writing(f'the selected state in {paths.selected}'):
            selected.discard_after(simulation.round_num)
        since_best = evaluations_since(metrics.rows, served, int(best[served]['round']))
    stopped_early = bool(patience) and since_best >= patience
    if stopped_early:
        start_round = total_rounds + 1  # Stopped before; nothing more to run.
    with _writing(f'TensorBoard events in {paths.tensorboard_run}'):
        paths.tensorboard_run.mkdir(parents=True, exist_ok=True)
        tb_manager = tensorboard_extras.ScalarReleaseManager(
            paths.tensorboard_run, first_step=start_round)
        floor = plan.popularity(simulation)
        tb_manager.write_floor(floor, steps=(min(start_round, total_rounds), total_rounds))
        # Written again on a resume, so the dashboard shows the current settings.
        tensorboard_hparams.write_hparams(
            paths.tensorboard_run, hparams=hparams, trial_id=paths.root.name,
            metrics=plan.dashboard_metrics(), runs_folder=paths.root.parent)

    bar = progress_lib.progress_display(
        total=total_rounds, initial=simulation.round_num, enabled=progress)
    test_metrics, shown = None, plan.progress_fields(best, {})
    try:
        for round_num in range(start_round, total_rounds + 1):
            train = simulation.run_round()
            _check_round(simulation, train, round_num, last_checkpoint)
            if extra_train_metrics is not None:
                train.update(extra_train_metrics(round_num))
            train_seconds += train['round_seconds']
            released = collections.OrderedDict(train=train)
            eval_start = time.perf_counter()
            _evaluate(simulation, plan, round_num, total_rounds, released)
            if len(released) > 1:
                best = plan.update_best(best, round_num, released)
                test_metrics = released.get('test', released.get('test_full'))
                shown = plan.progress_fields(best, released)
                if selected is not None and served in released:
                    with _writing(f'the selected state in {paths.selected}'):
                        chosen = selected.save_if_chosen(simulation, best, round_num)
                    since_best = 0 if chosen else since_best + 1
                released['eval_seconds'] = time.perf_counter() - eval_start
                eval_seconds += released['eval_seconds']
            metrics.add(round_num, released)
            with _writing(str(paths.metrics_csv)):
                metrics.write()
            with _writing(f'TensorBoard events in {paths.tensorboard_run}'):
                loop.run_until_complete(tb_manager.release(released, key=round_num))
            if on_round_end is not None:
                on_round_end(round_num, released)
            bar.set_postfix({**shown, 'loss': f'{train["loss"]:.4f}' if 'loss' in train else '-'},
                            refresh=False)
            bar.update(1)
            stopped_early = bool(patience) and since_best >= patience
            checkpoint_due = rounds_per_checkpoint and (
                round_num % rounds_per_checkpoint == 0 or round_num == total_rounds
                or stopped_early
            )
            if checkpoint_due:
                checkpoints.save(
                    _program_state(simulation, best, train_seconds, eval_seconds, metrics,
                                   record),
                    round_num,
                )
                last_checkpoint = round_num
            if stopped_early:
                print(f'early stopping at round {round_num}: {served}/{SELECT_ON} has not '
                      f'improved for {since_best} evaluations (best round '
                      f'{int(best[served]["round"])})', flush=True)
                break
    finally:
        bar.close()
        with contextlib.suppress(Exception):
            tb_manager.close()

    if test_metrics is None and simulation.round_num > 0:
        # Resumed at or past total_rounds: report the current model.
        test_metrics = simulation.evaluate('test', protocol=plan.protocols[0])
    item_tables = _projector_tables(simulation)
    if item_tables is not None:
        with _writing(f'the item projector in {paths.tensorboard_run}'):
            tensorboard_extras.write_item_projector(
                paths.tensorboard_run, split=simulation.split, item_tables=item_tables)
    with _writing(f'the selected metrics in {paths.tensorboard_run}'):
        # Also on a resume with nothing left to run: one file, one value a tag.
        tensorboard_hparams.write_selected(paths.tensorboard_run,
                                           selected=plan.selected_metrics(best))
    summary = _summary(simulation, plan, best, test_metrics, train_seconds, eval_seconds)
    summary['popularity'] = floor
    if stopped_early:
        summary['stopped_early'] = {'round': simulation.round_num, 'patience': patience}
    if extra_summary is not None:
        summary.update(extra_summary(simulation.round_num))
    with _writing(str(paths.summary)):
        write_atomically(paths.summary, json.dumps(summary, indent=2) + '\n')
    return summary


def _evaluation_sample(simulation) -> dict[str, Any] | None:
    """The simulation's evaluation sample (None: every user is evaluated)."""
    describe = getattr(simulation, 'evaluation_sample', None)
    return None if describe is None else describe()


def _summary(simulation, plan, best, final, train_seconds, eval_seconds):
    rounds = simulation.round_num
    summary = plan.summary(best)
    summary['eval_protocol'] = plan.protocol
    sample = _evaluation_sample(simulation)
    if sample is not None:
        summary['evaluated_users'] = sample
    summary['final'] = {k: float(v) for k, v in (final or {}).items()}
    summary['rounds'] = rounds
    # Seconds of training plus evaluation, and of training alone, per round.
    summary['seconds_per_round'] = (
        (train_seconds + eval_seconds) / rounds if rounds else math.nan)
    summary['train_seconds_per_round'] = train_seconds / rounds if rounds else math.nan
    summary['peak_rss_mb'] = round(runtime.peak_rss_mb(), 1)
    return summary
