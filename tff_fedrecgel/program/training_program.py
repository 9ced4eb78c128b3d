"""The round loop of a simulation run, with releases and checkpoints.

Metrics go out through TFF's program release managers (TensorBoard and CSV,
one merged value per round, since the CSV manager drops rows at or after the
released key), checkpoints through `tff.program.FileProgramStateManager`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
import json
import math
import time
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tff_fedrecgel import ranking
from tff_fedrecgel import runtime
from tff_fedrecgel.models import neumf
from tff_fedrecgel.program import tensorboard_extras
from tff_fedrecgel.program.outputs import ExperimentPaths
from tff_fedrecgel.simulation import Simulation

METRIC_NAMES = tuple(ranking.metric_names())
SELECT_ON = 'hr@10'


def _empty_best() -> collections.OrderedDict:
    """Best-so-far record: the round (0 = none yet) and its test metrics."""
    best = collections.OrderedDict(round=np.int64(0), score=np.float64(-1.0))
    for name in METRIC_NAMES:
        best[name] = np.float64(0.0)
    return best


def _update_best(best, round_num, score, test_metrics):
    if score > float(best['score']):
        best = collections.OrderedDict(round=np.int64(round_num), score=np.float64(score))
        for name in METRIC_NAMES:
            best[name] = np.float64(test_metrics[name])
    return best


class _Checkpoints:
    """Program states, falling back to an older one when the latest is bad."""

    _PREFIX = 'program_state_'

    def __init__(self, paths: ExperimentPaths, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._root = paths.checkpoints
        self._manager = tff.program.FileProgramStateManager(
            str(paths.checkpoints), prefix=self._PREFIX, keep_total=3, keep_first=False
        )

    def _set_aside(self, version: int) -> None:
        """Renames an unreadable checkpoint so the round can be saved again."""
        path = self._root / f'{self._PREFIX}{version}'
        target = self._root / f'unreadable_{self._PREFIX}{version}_{int(time.time())}'
        path.rename(target)

    def save(self, state, round_num: int) -> None:
        self._loop.run_until_complete(self._manager.save(state, round_num))

    def load_latest(self, structure) -> tuple[Any, int]:
        versions = self._loop.run_until_complete(self._manager.get_versions()) or []
        for version in sorted(versions, reverse=True):
            try:
                state = self._loop.run_until_complete(
                    self._manager.load(version, structure)
                )
                return state, version
            except Exception as e:  # pylint: disable=broad-except
                # A run killed while writing leaves a partial SavedModel.
                logging.warning(
                    'checkpoint of round %d is unreadable (%s); trying an older one',
                    version,
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                )
                self._set_aside(version)
                print(f'warning: checkpoint of round {version} is unreadable '
                      '(kept as unreadable_*); using an older one', flush=True)
        return None, 0


def run_training(
    simulation: Simulation,
    *,
    paths: ExperimentPaths,
    total_rounds: int,
    rounds_per_eval: int = 1,
    rounds_per_checkpoint: int = 10,
    hparams: Mapping[str, Any] | None = None,
    validation: bool = False,
    progress: bool = True,
    on_round_end: Callable[[int, Mapping[str, float]], None] | None = None,
    extra_train_metrics: Callable[[int], Mapping[str, float]] | None = None,
    extra_summary: Callable[[int], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) a simulation to `total_rounds`; returns the summary.

    Args:
      simulation: The simulation to run (not yet initialized).
      paths: The experiment's output folders.
      total_rounds: The last round to run.
      rounds_per_eval: Evaluate every this many rounds (and at the end).
      rounds_per_checkpoint: Save program state every this many rounds (and at
        the end); 0 disables checkpoints.
      hparams: Settings shown in TensorBoard's hparams dashboard.
      validation: Whether the split has validation items; then the round with
        the best validation HR@10 is reported too (the honest selection).
      progress: Show a progress bar.
      on_round_end: Called with (round, released metrics) after every round.
      extra_train_metrics: Called with the round number; its values are
        released with that round's `train/` metrics (e.g. `dp_epsilon`).
      extra_summary: Called with the rounds run; its values join the summary.

    Returns:
      The summary dictionary (also written to `summary.json`).
    """
    if total_rounds < 1 or rounds_per_eval < 1 or rounds_per_checkpoint < 0:
        raise ValueError(
            'total_rounds and rounds_per_eval must be >= 1, rounds_per_checkpoint >= 0'
        )
    loop = asyncio.new_event_loop()
    try:
        return _run(
            simulation, loop, paths, total_rounds, rounds_per_eval,
            rounds_per_checkpoint, dict(hparams or {}), validation, progress,
            on_round_end, extra_train_metrics, extra_summary,
        )
    finally:
        loop.close()


def _run(simulation, loop, paths, total_rounds, rounds_per_eval,
         rounds_per_checkpoint, hparams, validation, progress, on_round_end,
         extra_train_metrics=None, extra_summary=None):
    checkpoints = _Checkpoints(paths, loop)
    simulation.initialize()
    program_state = collections.OrderedDict(
        simulation=simulation.get_state(),
        best_test=_empty_best(),
        best_valid=_empty_best(),
        train_seconds=np.float64(0.0),
        eval_seconds=np.float64(0.0),
    )
    restored, version = checkpoints.load_latest(program_state)
    if restored is not None:
        simulation.restore(restored['simulation'])
        program_state = restored
        logging.info('resumed from the checkpoint of round %d', version)
        print(f'resuming from the checkpoint of round {version}', flush=True)
    best_test, best_valid = program_state['best_test'], program_state['best_valid']
    train_seconds = float(program_state['train_seconds'])
    eval_seconds = float(program_state['eval_seconds'])

    csv_manager = tff.program.CSVFileReleaseManager(
        str(paths.metrics_csv), key_fieldname='round'
    )
    tb_manager = tff.program.TensorBoardReleaseManager(str(paths.tensorboard))
    # Written again on a resume, so the dashboard shows the current settings.
    tensorboard_extras.write_hparams(
        paths.tensorboard, hparams=hparams, trial_id=paths.root.name,
        metric_tags=_dashboard_metrics(validation))

    start_round = simulation.round_num + 1
    bar = tqdm.tqdm(
        total=total_rounds, initial=simulation.round_num, disable=not progress,
        unit='round', dynamic_ncols=True,
    )
    test_metrics = None
    for round_num in range(start_round, total_rounds + 1):
        train = simulation.run_round()
        if extra_train_metrics is not None:
            train.update(extra_train_metrics(round_num))
        train_seconds += train['round_seconds']
        released = collections.OrderedDict(train=train)
        if round_num % rounds_per_eval == 0 or round_num == total_rounds:
            eval_start = time.perf_counter()
            test_metrics = simulation.evaluate('test')
            released['test'] = test_metrics
            best_test = _update_best(best_test, round_num, test_metrics[SELECT_ON], test_metrics)
            if validation:
                valid_metrics = simulation.evaluate('valid')
                released['valid'] = valid_metrics
                best_valid = _update_best(
                    best_valid, round_num, valid_metrics[SELECT_ON], test_metrics
                )
            released['eval_seconds'] = time.perf_counter() - eval_start
            eval_seconds += released['eval_seconds']
        loop.run_until_complete(csv_manager.release(released, key=round_num))
        loop.run_until_complete(tb_manager.release(released, key=round_num))
        if on_round_end is not None:
            on_round_end(round_num, released)
        bar.set_postfix(
            {'hr@10': f'{test_metrics["hr@10"]:.4f}' if test_metrics else '-',
             'loss': f'{train["loss"]:.4f}'},
            refresh=False,
        )
        bar.update(1)
        checkpoint_due = rounds_per_checkpoint and (
            round_num % rounds_per_checkpoint == 0 or round_num == total_rounds
        )
        if checkpoint_due:
            checkpoints.save(
                collections.OrderedDict(
                    simulation=simulation.get_state(),
                    best_test=best_test,
                    best_valid=best_valid,
                    train_seconds=np.float64(train_seconds),
                    eval_seconds=np.float64(eval_seconds),
                ),
                round_num,
            )
    bar.close()

    if test_metrics is None and simulation.round_num > 0:
        # Resumed at or past total_rounds: report the current model.
        test_metrics = simulation.evaluate('test')
    item_gmf, item_mlp, _, _ = neumf.split_global_weights(
        simulation.model_config, simulation.global_weights)
    tensorboard_extras.write_item_projector(
        paths.tensorboard, split=simulation.split,
        item_tables={'item_gmf': item_gmf} if item_mlp is None else {
            'item_gmf': item_gmf, 'item_mlp': item_mlp})
    summary = _summary(
        simulation, best_test, best_valid, validation, test_metrics,
        train_seconds, eval_seconds,
    )
    if extra_summary is not None:
        summary.update(extra_summary(simulation.round_num))
    paths.summary.write_text(json.dumps(summary, indent=2) + '\n')
    return summary


def _dashboard_metrics(validation: bool) -> list[str]:
    """Scalar tags the hparams dashboard shows: HR@10, NDCG@10, the loss."""
    splits = ('test', 'valid') if validation else ('test',)
    return [f'{s}/{m}@10' for s in splits for m in ('hr', 'ndcg')] + ['train/loss']


def _best_fields(prefix: str, best) -> dict[str, Any]:
    out = {f'{prefix}_round': int(best['round'])}
    for name in METRIC_NAMES:
        out[f'{prefix}_test_{name}'] = float(best[name])
    return out


def _summary(simulation, best_test, best_valid, validation, final,
             train_seconds, eval_seconds):
    rounds = simulation.round_num
    summary = {
        'best_round': int(best_test['round']),
        'best_test_hr@10': float(best_test['hr@10']),
        'best_test_ndcg@10': float(best_test['ndcg@10']),
    }
    if validation:
        summary.update({
            'best_valid_round': int(best_valid['round']),
            'best_valid_test_hr@10': float(best_valid['hr@10']),
            'best_valid_test_ndcg@10': float(best_valid['ndcg@10']),
        })
    summary['final'] = {k: float(v) for k, v in (final or {}).items()}
    summary['rounds'] = rounds
    # Seconds of training plus evaluation, and of training alone, per round.
    summary['seconds_per_round'] = (
        (train_seconds + eval_seconds) / rounds if rounds else math.nan)
    summary['train_seconds_per_round'] = train_seconds / rounds if rounds else math.nan
    summary['peak_rss_mb'] = round(runtime.peak_rss_mb(), 1)
    summary['best_test'] = _best_fields('best', best_test)
    if validation:
        summary['best_valid'] = _best_fields('best_valid', best_valid)
    return summary
