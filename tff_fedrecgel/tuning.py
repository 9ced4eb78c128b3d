"""A federated hyperparameter search on the validation item, with Optuna.

Each trial is an ordinary run folder (`<root>/trials/trial_NNN`) trained
through the Python API in this process: one TFF runtime and one loaded split
serve every trial, so a trial costs its rounds and its tracing, not a
process start. Trials report their validation metric at every evaluation;
Optuna's TPE sampler proposes the next settings and its median pruner stops
trials that fall behind. The study lives in `<root>/study.db` (SQLite), so a
search that was killed resumes where it was: a trial it left unfinished
(stopped by a signal, or killed) runs again first, with the same settings
under a new number (its partial folder stays). A folder holding another
search (other fixed settings, space, objective or seed) is refused
(`tuning_study`); only the budget may change on resumption.

Why Optuna and not the google-vizier that TFF installs: TPE with pruning
of running trials on their intermediate values, and an SQLite study that
resumes after SIGKILL without a server (Vizier's service needs one).

Trials also stop on the wall clock: one past its share of the budget
(`trial_minutes`, by default a quarter of `max_minutes`) is pruned and
marked `stopped: wall clock`, so one slow setting (ten local epochs over a
fifth of the users) cannot spend it; one the budget's end cuts is
interrupted, and the next call resumes it from its last checkpoint.

A new search's first trial is the `auto` preset's recipe for the data (its
values of the searched settings), so the search starts from what the project
would run untuned and can only improve on it (`start_from_auto`).

The test item is never looked at by the search: trials are ranked on the
validation item (`objective`, default `valid_full/ndcg@10`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

import optuna

from tff_fedrecgel import methods
from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel import runtime
from tff_fedrecgel import setting_checks
from tff_fedrecgel import settings_tree
from tff_fedrecgel import tuning_study
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.program import outputs

BEST_PRESET = 'best_preset.json'
# Whether the search reached its trials (a study runner waits on it).
PROGRESS = 'search.json'
# What the refusal of a folder another search holds tells the user to change.
TUNING_FOLDER = 'tuning folder (--root_output_dir)'
DEFAULT_OBJECTIVE = 'valid_full/ndcg@10'


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched setting (a `run_settings.Settings` field).

    Attributes:
      name: The setting.
      low, high: The range of a number (searched on a log scale if `log`).
      choices: The choices of a categorical setting.
      integer: Whether the number is an integer.
      log: Search the range on a log scale.
      needs_sam: Only for methods with a free SAM radius.
      needs_model_delta: Only when `update` is 'model_delta'.
      federated: Only for federated methods (not the central model).
    """

    name: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    integer: bool = False
    log: bool = False
    needs_sam: bool = False
    needs_model_delta: bool = False
    federated: bool = False

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def nearest(self, value: Any) -> Any:
        """`value` if the dimension can take it, else the nearest end of its
        range (a radius of 0 under a log-scale search starts at its low end)."""
        if self.choices is not None or value is None:
            return value
        return type(value)(min(max(value, self.low), self.high))


def _dimension(setting: settings_tree.Setting) -> Dimension:
    """A setting's default search (`settings_tree.Search`) as a dimension."""
    search = setting.search
    kind, _ = setting_checks.field_kind(run_settings.Settings.__dataclass_fields__[setting.name])  # pylint: disable=no-member
    return Dimension(setting.name, search.low, search.high, choices=search.choices,
                     integer=kind == 'int', log=search.log,
                     needs_sam=search.when == 'sam',
                     needs_model_delta=search.when == 'model_delta',
                     federated=search.when == 'federated')


# Every setting the tuner can search (`settings_tree`'s searched settings),
# and the default space: the levers that moved the validation metric in the
# project's studies (docs/RESULTS.md), searched unasked.
SEARCHABLE = tuple(_dimension(s) for s in settings_tree.searched())
SPACE_NAMES = tuple(d.name for d in SEARCHABLE)
SEARCH_SPACE = tuple(_dimension(s) for s in settings_tree.searched() if s.search.by_default)


def search_space(names: Sequence[str] | None = None) -> tuple[Dimension, ...]:
    """The default space, the searchable dimensions named by `names`, or
    the default space plus those named `+NAME`.

    Raises:
      DataError: For a name the tuner cannot search, or names of both kinds.
    """
    if not names:
        return SEARCH_SPACE
    added = {n[1:] for n in names if n.startswith('+')}
    named = {n for n in names if not n.startswith('+')}
    if added and named:
        raise DataError('a search space either names its settings or adds to the default '
                        'space with +NAME, not both')
    unknown = sorted((added | named) - set(SPACE_NAMES))
    if unknown:
        raise DataError(f'unknown search dimension(s) {", ".join(unknown)}; choose from '
                        f'{", ".join(SPACE_NAMES)}')
    wanted = named or added | {d.name for d in SEARCH_SPACE}
    return tuple(d for d in SEARCHABLE if d.name in wanted)


def method_space(space: Sequence[Dimension], algorithm: str) -> tuple[Dimension, ...]:
    """The dimensions of `space` a trial of `algorithm` may be asked (those
    it takes and does not fix; a model-change dimension is asked only when
    the trial's update is a model change)."""
    method = methods.get_method(algorithm)
    has_sam = method.rho_sh is None or method.rho_ns is None
    return tuple(
        dim for dim in space
        if not method.refused([dim.name])  # It takes the setting and does not fix it.
        and not (dim.needs_sam and (not has_sam or getattr(method, dim.name) is not None))
        and not (dim.federated and method.algorithm == methods.CENTRAL))


def suggest_settings(trial: optuna.Trial, space: Sequence[Dimension],
                     algorithm: str) -> dict[str, Any]:
    """The settings a trial tries (what the method cannot use is not asked)."""
    method = methods.get_method(algorithm)
    # A method without an upload mode (a recommender of its own) always
    # trains local epochs.
    modes = 'update' in method.takes or 'update' in method.fixes
    values: dict[str, Any] = {}
    for dim in method_space(space, algorithm):
        update = values.get('update', method.fixes.get('update', 'gradient'))
        if dim.needs_model_delta and modes and update != 'model_delta':
            continue
        values[dim.name] = dim.suggest(trial)
    return values


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """What a search runs.

    Attributes:
      task: The task name.
      algorithm: The method tuned.
      trials: Finished (completed or pruned) trials to reach.
      max_minutes: Wall-clock budget of this call (None: no limit).
      trial_minutes: Wall-clock limit of one trial (None: a
        `recipes.TUNER_TRIAL_SHARE` of `max_minutes`, or no limit).
      objective: The validation metric maximized (`valid_full/...` or
        `valid/...`).
      space: The searched dimensions.
      seed: Seed of the sampler and of every trial's run.
      base: Settings every trial shares (e.g. `total_rounds`, data options).
      start_from_auto: Whether a new search's first trial is the `auto`
        preset's recipe, as far as the method takes its settings.
      prune_after: The share of a trial's rounds (0 to below 1) it runs
        before the median pruner may stop it on its metric.
    """

    task: str
    algorithm: str = methods.FEDRECGEL
    trials: int = recipes.TUNER_TRIALS
    max_minutes: float | None = None
    trial_minutes: float | None = None
    objective: str = DEFAULT_OBJECTIVE
    space: tuple[Dimension, ...] = SEARCH_SPACE
    seed: int = 0
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    start_from_auto: bool = recipes.TUNER_STARTS_FROM_AUTO
    prune_after: float = recipes.TUNER_PRUNE_AFTER

    def __post_init__(self):
        group, _, metric = self.objective.partition('/')
        protocol = self._objective_protocol
        if protocol is None or not metric:
            raise DataError(f'objective must be a validation metric (valid/... or '
                            f'valid_full/...), got {self.objective!r}')
        names = protocol.metric_names(self.base.get('top_ks', protocols.TOP_KS))
        if metric not in names:
            raise DataError(f'objective {self.objective!r}: {group} has no {metric!r}; '
                            f'choose one of {", ".join(names)}')
        if self.trials < 1:
            raise DataError(f'trials must be >= 1, got {self.trials}')
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise DataError(f'max_minutes must be > 0, got {self.max_minutes}')
        if self.trial_minutes is not None and not self.trial_minutes > 0:
            raise DataError(f'trial_minutes must be > 0, got {self.trial_minutes}')
        if not 0 <= self.prune_after < 1:
            raise DataError(f'prune_after must be in [0, 1), got {self.prune_after}')

    @property
    def trial_limit_minutes(self) -> float | None:
        """One trial's wall-clock limit, in minutes (None: none)."""
        if self.trial_minutes is not None:
            return self.trial_minutes
        if self.max_minutes is not None:
            return recipes.TUNER_TRIAL_SHARE * self.max_minutes
        return None

    @property
    def definition(self) -> dict[str, Any]:
        """What the search is, as its study records it: everything but the
        budget, which a resumed search may change (the data folder is
        compared as an absolute path)."""
        base = dict(self.base)
        if base.get('data_dir'):
            base['data_dir'] = os.path.abspath(base['data_dir'])
        return {'task': self.task, 'algorithm': self.algorithm, 'objective': self.objective,
                'seed': self.seed, 'base': base, 'space': [d.name for d in self.space]}

    @classmethod
    def create(cls, task: str, *, algorithm: str = methods.FEDRECGEL,
               space: Sequence[str] | None = None, fixed: Mapping[str, Any] | None = None,
               objective: str | None = None, **options: Any) -> 'TuneConfig':
        """A search whose fixed settings are checked first and left out of
        the searched space, as are those serving only held-out users when
        none are held out (the central model's rebuild rate).

        Args:
          task, algorithm: As the attributes.
          space: Names of `SEARCHABLE` dimensions (default: `SEARCH_SPACE`).
          fixed: Settings every trial shares (`base`).
          objective: The validation metric (default `DEFAULT_OBJECTIVE`).
          **options: `trials`, `max_minutes`, `trial_minutes`, `seed`,
            `start_from_auto`, `prune_after`.

        Raises:
          DataError, ValueError: On a bad fixed setting or dimension name, or a
            named dimension no trial would try.
        """
        fixed = dict(fixed or {})
        resolved = run_settings.settings(task, algorithm=algorithm, preset=recipes.PAPER,
                                         validation=True, **fixed)
        unused = set(fixed) | (set() if resolved.heldout_users
                               else methods.get_method(algorithm).heldout_only)
        dims = tuple(d for d in search_space(space) if d.name not in unused)
        asked = {d.name for d in method_space(dims, algorithm)}
        idle = [n for n in space or () if not n.startswith('+') and n not in asked]
        if idle:  # Named, yet no trial would try it: say why rather than drop it.
            why = {n: 'fixed by its flag' if n in fixed else
                   'it serves only held-out users and none are (--heldout_users)'
                   if n in unused else f'not searched for {algorithm}' for n in idle}
            raise DataError('the search space names settings no trial would try: '
                            + '; '.join(f'{n} ({w})' for n, w in why.items()))
        return cls(task=task, algorithm=algorithm, space=dims, base=fixed,
                   objective=objective or DEFAULT_OBJECTIVE, **options)

    @property
    def _objective_protocol(self) -> protocols.Protocol | None:
        group = self.objective.partition('/')[0]
        return {p.group('valid'): p for p in (protocols.SAMPLED, protocols.FULL)}.get(group)

    @property
    def eval_protocol(self) -> str:
        full = self._objective_protocol is protocols.FULL
        return protocols.BOTH if full else protocols.SAMPLED.name

    @property
    def trial_schedule(self) -> dict[str, Any]:
        """A full-ranking objective reads only the full-ranking rounds, so
        trials rank by sampled negatives there too, not every round."""
        every = self.base.get('rounds_per_full_eval')
        return {'rounds_per_eval': every} if every and self.eval_protocol == protocols.BOTH else {}


def auto_trial(config: TuneConfig, split: Split) -> dict[str, Any]:
    """The searched settings' values under the `auto` preset on `split`.

    Args:
      config: The search.
      split: Its data.

    Returns:
      Values by dimension name, only those the method takes (what
      `suggest_settings` would ask): the central ceiling's search starts
      from `auto`'s training negatives, so the frame's two searches start
      alike. A value outside a dimension's range is its nearest end
      (FilmTrust's global radius 0 under the log-scale radius search).
      Empty if the settings are refused.
    """
    try:
        auto = run_settings.settings(
            config.task, algorithm=config.algorithm, preset=recipes.AUTO,
            data_profile=recipes.DataProfile.of(split), validation=True, **config.base)
    except (DataError, ValueError):
        return {}
    return suggest_settings(optuna.trial.FixedTrial(
        {d.name: d.nearest(getattr(auto, d.name)) for d in config.space}), config.space,
        config.algorithm)


def run_search(config: TuneConfig, *, root: str | os.PathLike, split: Split,
               make_experiment: Callable[..., Any],
               on_trial_end: Callable[[dict[str, Any]], None] | None = None
               ) -> dict[str, Any]:
    """Runs (or resumes) the search to `config.trials` finished trials.

    Args:
      config: The search.
      root: The tuning folder (the study, `trials/`, `best_preset.json`).
      split: The loaded split (with a validation item), shared by every trial.
      make_experiment: `api.experiment`, or a stand-in with its signature
        (its result's `train`, and with `prune_after` its
        `settings.total_rounds`, are used).
      on_trial_end: Called with each finished trial's record (its `value`
        is the best objective it reached, None if it was stopped before
        its first evaluation).

    Returns:
      The search's record: the best trial, its settings, trials run and
      their timing.

    Raises:
      DataError: If the split has no validation item.
      ExperimentLockedError: If another process is running a search in `root`.
    """
    if split.valid_items is None:
        raise DataError('the search ranks trials on the validation item: load the split '
                        'with validation')
    root = pathlib.Path(root)
    with outputs.lock_experiment(root_output_dir=root.parent, experiment_name=root.name,
                                 elsewhere=TUNING_FOLDER):
        return _search(config, root, split, make_experiment, on_trial_end)


def _search(config: TuneConfig, root: pathlib.Path, split: Split,
            make_experiment: Callable[..., Any],
            on_trial_end: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    (root / 'trials').mkdir(parents=True, exist_ok=True)
    study = tuning_study.open_study(root, config.seed, config.definition)
    if config.start_from_auto and not study.get_trials(deepcopy=False):
        first = auto_trial(config, split)
        if first:
            study.enqueue_trial(first, user_attrs={'recipe': recipes.AUTO})
    deadline = None if config.max_minutes is None else time.monotonic() + 60 * config.max_minutes
    group, _, metric = config.objective.partition('/')
    timings = []

    limit = config.trial_limit_minutes

    def objective(trial: optuna.Trial) -> float:
        values = suggest_settings(trial, config.space, config.algorithm)
        run_dir = root / 'trials' / tuning_study.trial_folder(trial)
        trial.set_user_attr(tuning_study.RUN_DIR, run_dir.name)
        earlier = tuning_study.earlier_curve(run_dir, config.objective)
        resumed = bool(earlier)  # Its wall time is this call's part only.
        start = time.perf_counter()
        own_end = limit and time.monotonic() + 60 * limit
        best, stopped = [None], [None]  # None: stopped before its first evaluation.
        ran = [0]  # Rounds trained in this call (a retry starts at its checkpoint).

        def note(round_num, value):
            best[0] = value if best[0] is None else max(best[0], value)
            trial.report(value, step=round_num)

        def report(round_num, released):
            ran[0] += 1
            if earlier:  # A retry: its rounds before the checkpoint count, later ones rerun.
                for row in earlier:
                    if row[0] < round_num:
                        note(*row)
                earlier.clear()
            if group in released:
                note(round_num, float(released[group][metric]))
                if round_num >= prunable_from and trial.should_prune():
                    stopped[0] = 'metric'
                    raise optuna.TrialPruned()
            now = time.monotonic()
            if own_end and now > own_end:  # Too slow by the user's rule.
                stopped[0] = 'wall clock'
                trial.set_user_attr('stopped', stopped[0])
                raise optuna.TrialPruned()
            if deadline is not None and now > deadline:  # Not its fault: resumed next call.
                stopped[0] = 'budget'
                raise tuning_study.BudgetEnd()

        experiment = make_experiment(
            config.task, run_dir=run_dir, split=split, algorithm=config.algorithm,
            preset=recipes.PAPER, validation=True, eval_protocol=config.eval_protocol,
            seed=config.seed, **{**config.trial_schedule, **config.base, **values})
        # A slow starter may still lead at the end: no metric pruning before this.
        prunable_from = (config.prune_after * experiment.settings.total_rounds
                         if config.prune_after else 0)
        state, summary = 'failed', None
        runtime.reset_peak_rss()  # The trial's `peak_rss_mb` is its own.
        try:
            summary = experiment.train(on_round_end=report)
            state = 'complete'
        except optuna.TrialPruned:
            state = 'pruned'
            raise
        # A worker that died (a crash of TFF's C++ runtime, not the settings'
        # fault) stops the call as a signal does: the trial runs on when resumed.
        except (KeyboardInterrupt, tuning_study.BudgetEnd, runtime.WorkerExitedError) as stop:
            state = 'interrupted'
            trial.set_user_attr(tuning_study.INTERRUPTED, True)
            raise stop
        finally:
            wall = time.perf_counter() - start
            rounds_seconds = summary['seconds_per_round'] * ran[0] if summary else None
            record = {'trial': trial.number, 'state': state, 'stopped': stopped[0],
                      'settings': values, 'value': best[0], 'wall_seconds': round(wall, 1),
                      'overhead_seconds': (round(wall - rounds_seconds, 1)
                                           if rounds_seconds is not None else None),
                      'resumed': resumed, 'run_dir': str(run_dir)}
            timings.append(record)
            if on_trial_end is not None:
                on_trial_end(record)
        return -1.0 if best[0] is None else best[0]

    while tuning_study.finished(study) < config.trials:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        try:
            study.optimize(objective, n_trials=1, timeout=left,
                           catch=(), gc_after_trial=True)
        except tuning_study.BudgetEnd:
            break
    return _write_best(study, config, root, timings)


def _write_best(study: optuna.Study, config: TuneConfig, root: pathlib.Path,
                timings: list[dict[str, Any]]) -> dict[str, Any]:
    completed = study.get_trials(deepcopy=False,
                                 states=(optuna.trial.TrialState.COMPLETE,))
    record: dict[str, Any] = {
        'task': config.task, 'algorithm': config.algorithm, 'objective': config.objective,
        'finished_trials': tuning_study.finished(study), 'completed_trials': len(completed),
        'trials_this_call': timings,
    }
    walls = [t['wall_seconds'] for t in timings
             if t['state'] in ('complete', 'pruned') and not t['resumed']]
    overheads = [t['overhead_seconds'] for t in timings if t['overhead_seconds'] is not None]
    if sum(walls) > 0:
        record['trials_per_hour'] = round(3600 * len(walls) / sum(walls), 1)
    if overheads:  # A trial's wall time beyond its rounds: start-up, tracing, evaluation.
        record['mean_overhead_seconds'] = round(sum(overheads) / len(overheads), 1)
    progress = {'trials': config.trials, 'finished_trials': record['finished_trials'],
                'done': record['finished_trials'] >= config.trials}
    if not completed:
        _write_json(root / PROGRESS, progress)
        return record
    best = max(completed, key=lambda t: t.value)
    # The trials' protocol too, so that a run of the preset alone reproduces the best trial.
    settings = {'validation': True, 'eval_protocol': config.eval_protocol,
                **{k: v for k, v in config.base.items()
                   if k not in run_settings.NOT_PRESETTABLE}, **best.params}
    preset = {'settings': settings, 'objective': config.objective, 'value': best.value,
              'trial': best.number, 'task': config.task, 'algorithm': config.algorithm,
              'run_dir': str(root / 'trials' / tuning_study.trial_folder(best))}
    path = root / BEST_PRESET
    _write_json(path, preset)
    _write_json(root / PROGRESS, {**progress, 'best_trial': best.number})
    record.update(best_trial=best.number, best_value=best.value, best_settings=settings,
                  preset_file=str(path), best_run_dir=preset['run_dir'])
    return record


def _write_json(path: pathlib.Path, value: Any) -> None:
    outputs.write_atomically(path, json.dumps(value, indent=2) + '\n')
