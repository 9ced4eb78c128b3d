"""A search's Optuna study: its SQLite file, its definition, its resumption.

The study lives in `<root>/study.db`. It records what the search is (task,
method, objective, seed, fixed settings, searched dimensions) when first
opened, and a later search on the folder must be the same one: like a run
folder (`program.outputs.check_hparams`), a study cannot silently mix trials
of two configurations, nor write a best preset whose fixed settings are not
those its trials ran with. Only the budget (trials, minutes) may change.
Trials a killed or interrupted search left unfinished run again, once.
A study also travels as plain JSON (`export_study`, `import_study`), so that
a search resumes where its folder is gone (a fresh checkout).
"""

from __future__ import annotations

from collections.abc import Mapping
import csv
import json
import logging
import os
import pathlib
import re
from typing import Any

import optuna

from tff_fedrecgel import recipes
from tff_fedrecgel.errors import DataError

STUDY_FILE = 'study.db'
STUDY_NAME = 'tune'
# Trial attributes: stopped by a signal; the trial whose settings it runs again.
INTERRUPTED, RETRY_OF = 'interrupted', 'retry_of'
# A trial's run folder under `trials/`: a retry trains on in the folder of
# the trial it retries, from that run's last checkpoint.
RUN_DIR = 'run_dir'


def trial_folder(trial: optuna.trial.FrozenTrial | optuna.Trial) -> str:
    """The name of a trial's run folder under `trials/` (its own number's,
    unless it retries another trial)."""
    return trial.user_attrs.get(RUN_DIR, f'trial_{trial.number:03d}')
# The study attribute holding the search's definition.
DEFINITION = 'definition'


class BudgetEnd(Exception):
    """The call's budget ended inside a trial: it runs again, from its run's
    last checkpoint, when the search resumes."""


class _QuietInterrupts(logging.Filter):
    """Drops Optuna's two warnings (and traceback) of a trial stopped by a
    signal or by the budget's end: the trial's own line says it runs again
    when the search resumes."""

    def __init__(self):
        super().__init__()
        self._interrupted: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        trial = re.match(r'Trial (\d+) failed', record.getMessage())
        if trial is None:
            return True
        if record.exc_info and issubclass(record.exc_info[0], (KeyboardInterrupt, BudgetEnd)):
            self._interrupted.add(trial.group(1))
        return trial.group(1) not in self._interrupted


def quiet_optuna() -> None:
    """Optuna's warnings only, none for an interrupted trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger('optuna').handlers:
        if not any(isinstance(f, _QuietInterrupts) for f in handler.filters):
            handler.addFilter(_QuietInterrupts())


def _plain(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The definition as stored (JSON: tuples become lists, keys sorted)."""
    return json.loads(json.dumps(definition, sort_keys=True, default=str))


def check_folder(root: pathlib.Path, definition: Mapping[str, Any]) -> None:
    """Refuses a folder whose study is another search's (reads only: an
    entry point checks before it loads the data).

    Raises:
      DataError: If `root` holds a study with another definition.
    """
    if (root / STUDY_FILE).exists():
        quiet_optuna()
        study = optuna.load_study(study_name=STUDY_NAME,
                                  storage=f'sqlite:///{root / STUDY_FILE}')
        _compare(study, root, definition)


def _compare(study: optuna.Study, root: pathlib.Path, definition: Mapping[str, Any]) -> None:
    wanted = _plain(definition)
    held = study.user_attrs.get(DEFINITION)
    if held is None:  # New, or written before studies kept theirs: its trials tell.
        drawn = {k for t in study.get_trials(deepcopy=False) for k in t.params}
        held = wanted if drawn <= set(wanted['space']) else {**wanted, 'space': sorted(drawn)}
    changed = sorted(k for k in set(held) | set(wanted) if held.get(k) != wanted.get(k))
    base = []
    if changed == ['base']:  # Name the fixed settings that differ.
        old, new = held.get('base', {}), wanted.get('base', {})
        base = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        raise DataError(f'{root} holds a search with other settings '
                        f'({", ".join(base or changed)}); resume it with the same ones '
                        'or use another tuning folder (--root_output_dir)')


def open_study(root: pathlib.Path, seed: int, definition: Mapping[str, Any]) -> optuna.Study:
    """Opens (or creates) the search's study in `root`.

    Args:
      root: The tuning folder.
      seed: The search's seed (its sampler is seeded by it and the trials so far).
      definition: What the search is (JSON-able); a study that holds
        another is refused before anything in it changes.

    Returns:
      The study, with trials a killed search left running marked failed and
      each interrupted or killed trial queued again under a new number.

    Raises:
      DataError: If the folder's study was another search's.
    """
    quiet_optuna()
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=f'sqlite:///{root / STUDY_FILE}',
        direction='maximize', load_if_exists=True,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=recipes.TUNER_PRUNE_FROM_TRIALS,
                                           n_warmup_steps=0))
    _compare(study, root, definition)
    if study.user_attrs.get(DEFINITION) is None:
        study.set_user_attr(DEFINITION, _plain(definition))
    # Seeded by the trials so far: a resumed search would draw its first settings again.
    study.sampler = optuna.samplers.TPESampler(
        seed=seed + len(study.get_trials(deepcopy=False)), n_startup_trials=5)
    killed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in killed:  # Left running by a search that was killed.
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    _retry_interrupted(study, killed={t.number for t in killed})
    return study


def _retry_interrupted(study: optuna.Study, killed: set[int]) -> None:
    """Queues each interrupted or killed trial's settings again, once, under
    a new number and in its run folder (`RUN_DIR`): a stopped search resumes
    the trial it was running from that run's last checkpoint. A trial that
    failed on an error is not retried (it would fail again)."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials}
    for t in trials:
        if (t.state == optuna.trial.TrialState.FAIL and t.number not in retried
                and (t.user_attrs.get(INTERRUPTED) or t.number in killed)):
            attrs = {k: v for k, v in t.user_attrs.items() if k not in (INTERRUPTED, RETRY_OF)}
            study.enqueue_trial(t.params, user_attrs={**attrs, RUN_DIR: trial_folder(t),
                                                      RETRY_OF: t.number})


def earlier_curve(run_dir: pathlib.Path, column: str) -> list[tuple[int, float]]:
    """`(round, value)` of `column` in the rows a run folder already holds
    (none for a new trial): a retry resumes there, and the rounds before its
    checkpoint count for it as they did for the trial it retries."""
    path = run_dir / 'metrics.csv'
    if not path.exists():
        return []
    with open(path, newline='', encoding='utf-8') as f:
        return [(int(row['round']), float(row[column])) for row in csv.DictReader(f)
                if row.get(column)]


def finished(study: optuna.Study) -> int:
    """Trials that ran to their end or were pruned."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def export_study(root: pathlib.Path) -> dict[str, Any] | None:
    """The search in `root` as plain JSON: its definition and its trials in
    order, enough for `import_study` to resume it where the folder is gone.

    A trial still running is recorded as interrupted (it runs again where
    the record is imported, from its first round: its checkpoints stay
    here); a queued retry is left out (opening the study queues it again).

    Returns:
      The record, or None if `root` holds no study.
    """
    path = root / STUDY_FILE
    if not path.exists():
        return None
    quiet_optuna()
    study = optuna.load_study(study_name=STUDY_NAME, storage=f'sqlite:///{path}')
    trials = []
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING:
            continue
        attrs, state = dict(t.user_attrs), t.state
        if state == optuna.trial.TrialState.RUNNING:
            state, attrs[INTERRUPTED] = optuna.trial.TrialState.FAIL, True
        trials.append({
            'number': t.number, 'state': state.name, 'value': t.value, 'params': t.params,
            'distributions': {k: optuna.distributions.distribution_to_json(d)
                              for k, d in t.distributions.items()},
            'intermediate_values': {str(k): v for k, v in t.intermediate_values.items()},
            'user_attrs': attrs})
    return {'definition': study.user_attrs.get(DEFINITION), 'trials': trials}


def import_study(root: pathlib.Path, record: Mapping[str, Any]) -> None:
    """Writes an `export_study` record as the study of `root`, which holds
    none: `open_study` then resumes the search as it would have resumed in
    the folder the record came from (same trials, numbers, pruning history
    and sampler seed). The file appears whole or not at all.

    Raises:
      DataError: If `root` holds a study already, or the record's trials
        are not numbered 0, 1, ... in order.
    """
    path = root / STUDY_FILE
    if path.exists():
        raise DataError(f'{root} holds a study already; its trials are not replaced')
    numbers = [t['number'] for t in record['trials']]
    if numbers != list(range(len(numbers))):
        raise DataError(f'the recorded search for {root} skips trial numbers '
                        f'({numbers}); it cannot resume with the same ones')
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f'{STUDY_FILE}.part'
    partial.unlink(missing_ok=True)
    quiet_optuna()
    storage = optuna.storages.RDBStorage(f'sqlite:///{partial}')
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction='maximize')
    if record.get('definition') is not None:
        study.set_user_attr(DEFINITION, record['definition'])
    for t in record['trials']:
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState[t['state']], value=t['value'], params=t['params'],
            distributions={k: optuna.distributions.json_to_distribution(d)
                           for k, d in t['distributions'].items()},
            intermediate_values={int(k): v for k, v in t['intermediate_values'].items()},
            user_attrs=t['user_attrs']))
    storage.engine.dispose()
    os.replace(partial, path)
