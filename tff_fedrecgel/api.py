"""The Python API: data, training, evaluation, checkpoints and recommendations.

For scripts and notebooks, with plain arguments (no absl flags)::

    from tff_fedrecgel import api

    with api.Session():                        # TFF's worker lives inside
        experiment = api.experiment(
            'synthetic', run_dir='runs/demo', total_rounds=5)
        summary = experiment.train()           # checkpoints in runs/demo
        print(experiment.evaluate())           # HR@K / NDCG@K of every user
        print(experiment.recommend(user_id=3, k=10))

    with api.Session():
        experiment = api.load_run('runs/demo')  # any run folder, also
        experiment.export('export/demo')        # launch/train.py's

The pieces, each what the library already has:
* `Session`: TFF's execution context on a worker owned by this process
  (`runtime.LocalRuntime`); leaving the `with` block, `close()`, the end
  of the process or of a notebook's kernel stops the worker. Without an
  open session, the first computation opens one that lasts until the
  process ends.
* `settings` / `Settings`: every setting of a run, the task's defaults
  (`tasks.Task`: SAM radii, rounds, client fraction) filled in; the same
  names and values as `launch/train.py`'s flags and `hparams.json`.
* `Experiment`: `simulation.build_simulation` trained by
  `program.run_training` in a run folder (locked while training, resumed
  from its latest checkpoint), evaluated with `Simulation.evaluate`, turned
  into a `recommendation.TrainedModel` for top-K lists in original ids, and
  exported with `serving.export_saved_model`.
* `load_run`: a finished (or running) run folder back as an `Experiment`
  at the round it serves: the one chosen on the validation item where the
  run has one, else its latest checkpoint (`program.run_folder`).
* `tune`: a search of a method's settings on the validation item
  (`tuning`, Optuna), each trial a run folder, the best a preset file.

TensorFlow is imported when an `Experiment` is built, not on import. Its
start-up messages (CUDA plugin registration on a machine without GPUs, CPU
instruction notices) are hidden as on the command line, unless
`TF_CPP_MIN_LOG_LEVEL` is set (`tf_logs.quiet_tensorflow_logs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import os
import pathlib
from typing import Any

from tff_fedrecgel import export_settings
from tff_fedrecgel import methods
from tff_fedrecgel import sizes
from tff_fedrecgel import recipes
from tff_fedrecgel import sessions
from tff_fedrecgel import tasks
from tff_fedrecgel import tf_logs
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.program import outputs
from tff_fedrecgel.program import run_folder
from tff_fedrecgel.program import training_thread
from tff_fedrecgel.run_settings import Settings
from tff_fedrecgel.run_settings import settings

# Before any TensorFlow import of this process (this module imports none).
tf_logs.quiet_tensorflow_logs()

get_task = tasks.get_task
Session = sessions.Session
ensure_session = sessions.ensure_session
TASK_NAMES = tasks.TASK_NAMES
METHOD_NAMES = methods.METHOD_NAMES


def prepare_data(task: str, *, data_dir: str | os.PathLike | None = None,
                 validation: bool = False, cache_dir: str | os.PathLike | None = None,
                 eval_negatives: int = sizes.EVAL_NEGATIVES, **options: Any) -> Split:
    """A task's split (`tasks.Task.load_split`).

    Args:
      task: A name of `TASK_NAMES`.
      data_dir: Folder of the raw file (docs/DATA.md); not for synthetic.
      validation: Also hold out each user's second-latest interaction.
      cache_dir: Folder for the split files (reused while the raw file and
        the options are unchanged; `launch/prepare_data.py` writes the same).
      eval_negatives: Sampled evaluation negatives per user (0: none, for
        runs that rank against every item only).
      **options: Reader options of the task.

    Returns:
      The split, with its id maps.

    Raises:
      DataError: On missing or malformed data, or unknown options.
    """
    return get_task(task).load_split(data_dir=data_dir, validation=validation,
                                     cache_dir=cache_dir, eval_negatives=eval_negatives,
                                     **options)


def _load_split(run_settings: Settings) -> Split:
    return prepare_data(run_settings.task, data_dir=run_settings.data_dir,
                        validation=run_settings.validation,
                        eval_negatives=run_settings.split_negatives,
                        **run_settings.data_options)


# ---------------------------------------------------------------------------
# Experiments.


class Experiment:
    """One run: its simulation, its folder, and what can be done with it.

    The run folder holds what `launch/train.py` writes (`hparams.json`,
    `metrics.csv`, `tensorboard/`, `checkpoints/`, `summary.json`), so either
    can continue or read the other's runs.
    """

    def __init__(self, run_settings: Settings, *, run_dir: str | os.PathLike,
                 split: Split | None = None, foreign_settings: tuple[str, ...] = ()):
        """Builds the simulation (untrained until `train` or `restore`).

        Args:
          run_settings: The run's settings.
          run_dir: The run folder (created by `train`).
          split: The data (default: loaded from the settings).
          foreign_settings: Recorded settings the API does not reproduce
            (`Settings.from_hparams`); `train` refuses to continue then.

        Raises:
          DataError: On bad data.
          ValueError: On inconsistent settings.
        """
        # Building imports TFF, whose default context fails noisily when
        # collected at the interpreter's exit unless the hook replaces it.
        sessions.register_exit_hook()
        root = pathlib.Path(run_dir).expanduser().resolve()
        outputs.check_experiment_name(root.name)
        self.paths = outputs.ExperimentPaths(root)
        self.settings = run_settings
        self.split = split if split is not None else _load_split(run_settings)
        self.foreign_settings = tuple(foreign_settings)
        run_settings.check_split(self.split)
        self.simulation = run_settings.build_simulation(self.split)
        self.simulation.use_state_folder(self.paths.user_states)
        self._has_state = False

    @property
    def round_num(self) -> int:
        """Rounds the model has been trained (0 before training or restoring)."""
        return self.simulation.round_num

    def train(self, *, total_rounds: int | None = None, progress: bool = False,
              on_round_end: Callable[[int, Mapping[str, Any]], None] | None = None
              ) -> dict[str, Any]:
        """Trains to `total_rounds`, resuming from the run's latest checkpoint.

        Args:
          total_rounds: The last round (default: the settings'); a later call
            with more rounds continues the run.
          progress: Show a progress bar.
          on_round_end: Called with (round, that round's metrics).

        Returns:
          The summary (also in `summary.json`).

        Raises:
          ValueError: If the folder holds a run with other settings, or is in
            use by another process.
          OSError: If an output cannot be written.
        """
        if self.foreign_settings:
            raise ValueError(
                f'{self.paths.root} was trained with settings the Python API does not '
                f'reproduce ({", ".join(self.foreign_settings)}); continue it with '
                'launch/train.py')
        from tff_fedrecgel import program  # pylint: disable=g-import-not-at-top

        run_settings = self.settings if total_rounds is None else dataclasses.replace(
            self.settings, total_rounds=total_rounds)
        hparams = run_settings.hparams(num_users=self.split.num_users)
        report = run_settings.privacy_report(self.split.num_users)
        session = ensure_session()
        if run_settings.secure_aggregation:
            session.use_secure_sum()

        def run(check_stop):
            def round_end(round_num, released):
                if on_round_end is not None:
                    on_round_end(round_num, released)
                check_stop()

            return program.run_training(
                self.simulation, paths=paths, total_rounds=run_settings.total_rounds,
                rounds_per_eval=run_settings.rounds_per_eval,
                eval_protocol=run_settings.eval_protocol,
                rounds_per_full_eval=run_settings.rounds_per_full_eval,
                rounds_per_checkpoint=run_settings.rounds_per_checkpoint,
                hparams=hparams, validation=run_settings.validation, progress=progress,
                on_round_end=round_end,
                early_stopping_patience=run_settings.early_stopping_patience,
                extra_train_metrics=report.round_metrics if report else None,
                extra_summary=report.summary if report else None)

        with session.in_use(), program.open_run(
                root_output_dir=self.paths.root.parent,
                experiment_name=self.paths.root.name, hparams=hparams) as paths:
            self._has_state = False
            summary = training_thread.run_here_or_in_thread(run)
        self.settings = run_settings
        self._has_state = True
        return summary

    def restore(self, *, round_num: int | None = None,
                checkpoint: str = run_folder.LATEST) -> int:
        """Loads a checkpoint of the run (default: the latest readable one).

        Args:
          round_num: A checkpoint's round (None: as `checkpoint`).
          checkpoint: 'latest', or 'selected': the round chosen on the
            validation item, which a run with one keeps (else the latest).

        Returns:
          The checkpoint's round.

        Raises:
          RunFolderError: If the run has no such checkpoint.
        """
        version, state = run_folder.load_checkpoint(self.paths.root, round_num=round_num,
                                                    checkpoint=checkpoint)
        ensure_session()
        self.simulation.restore(state['simulation'])
        self._has_state = True
        return version

    def _ensure_state(self) -> None:
        """Before the first use: the latest checkpoint, else the initial model."""
        if self._has_state:
            return
        ensure_session()
        if self.paths.hparams.exists() and run_folder.checkpoint_rounds(self.paths.root):
            self.restore()
        else:
            self.simulation.initialize()
            self._has_state = True

    def evaluate(self, which: str = 'test', *, heldout: bool = False,
                 protocol: str = protocols.SAMPLED.name) -> dict[str, float]:
        """Ranking metrics of every training (or held-out) user (`Simulation.evaluate`).

        Args:
          which: 'test' or 'valid' (with `validation`).
          heldout: The users held out of training instead.
          protocol: A name of `evaluation.protocols.NAMES`: 'sampled'
            (eval_negatives sampled negatives, the paper's 99) or 'full'
            (every item the user did not train on; with MRR).
        """
        self._ensure_state()
        return self.simulation.evaluate(which, heldout=heldout, protocol=protocol)

    def metrics(self):
        """Every finished round's metrics (`metrics.csv`) as a pandas DataFrame
        indexed by round (empty before the first round)."""
        import pandas as pd  # pylint: disable=g-import-not-at-top

        if not self.paths.metrics_csv.exists():
            return pd.DataFrame(index=pd.Index([], name='round'))
        return pd.read_csv(self.paths.metrics_csv).set_index('round')

    def model(self):
        """The current model as a `recommendation.TrainedModel`."""
        from tff_fedrecgel.recommendation import TrainedModel  # pylint: disable=g-import-not-at-top

        self._ensure_state()
        return TrainedModel.from_simulation(self.simulation)

    def recommend(self, user_id: Any = None, *, items: list[Any] | None = None,
                  k: int = 10, exclude: list[Any] | None = None):
        """A user's top-`k` items in original ids (`TrainedModel.recommend`).

        Args:
          user_id: A user of the data (original id), or None with `items`.
          items: The items (original ids) of a new user.
          k: How many.
          exclude: Original ids left out ([]: none); None: the items the
            user has seen (the SavedModel's default too).

        Returns:
          A list of `recommendation.Recommendation`, best first.
        """
        return self.model().recommend(user_id, items=items, k=k, exclude=exclude)

    def export(self, output_dir: str | os.PathLike) -> dict[str, Any]:
        """Writes the trained model as a SavedModel (`serving.export_saved_model`).

        Returns:
          The written `model.json` (the run's settings, privacy ones included).

        Raises:
          SettingError: If the SavedModel cannot honour a setting of the run
            (`export_settings.check_saved_model`).
        """
        from tff_fedrecgel import serving  # pylint: disable=g-import-not-at-top

        export_settings.check_saved_model(self.settings, self.foreign_settings)
        return serving.export_saved_model(self.model(), output_dir, metadata={
            'run_dir': str(self.paths.root), 'round': self.round_num,
            'settings': self.settings.hparams(num_users=self.split.num_users)})


def experiment(task: str, *, run_dir: str | os.PathLike, split: Split | None = None,
               **settings_args: Any) -> Experiment:
    """A new (or resumed) run of `task` in `run_dir`.

    Args:
      task: A name of `TASK_NAMES`.
      run_dir: The run folder; a folder holding a run with the same settings
        resumes it.
      split: The data (default: `prepare_data` with the settings' `data_dir`,
        `validation` and `data_options`).
      **settings_args: As `settings` (algorithm, radii, rounds, data_dir,
        preset, ...); without a preset, the task's (`auto` for csv and
        synthetic data, `paper` for the paper's datasets).

    Returns:
      The `Experiment`.
    """
    run_settings = settings(task, **settings_args)  # Checked before the data is read.
    if recipes.needs_data(run_settings.preset) and 'data_profile' not in settings_args:
        if split is None:
            split = _load_split(run_settings)
        run_settings = settings(task, data_profile=recipes.DataProfile.of(split),
                                **settings_args)
    return Experiment(run_settings, run_dir=run_dir, split=split)


def read_run(run_dir: str | os.PathLike, *, data_dir: str | os.PathLike | None = None
             ) -> tuple[Settings, tuple[str, ...], Split]:
    """A run folder's settings and data, checked (imports no TensorFlow).

    Args:
      run_dir: The run folder.
      data_dir: Where the raw data is now, if not where the run read it.

    Returns:
      `(settings, foreign settings, split)`.

    Raises:
      RunFolderError: If the folder, its settings or a checkpoint is missing.
      DataError: If the data cannot be read.
    """
    hparams = run_folder.read_hparams(run_dir)
    run_folder.check_has_checkpoint(run_dir)
    run_settings, foreign = Settings.from_hparams(hparams)
    if data_dir is not None:
        run_settings = dataclasses.replace(run_settings, data_dir=os.fspath(data_dir))
    return run_settings, tuple(foreign), _load_split(run_settings)


def load_run(run_dir: str | os.PathLike, *, data_dir: str | os.PathLike | None = None,
             round_num: int | None = None,
             checkpoint: str = run_folder.SELECTED) -> Experiment:
    """A run folder back as an `Experiment`, at the round it serves: the
    one chosen on the validation item where the run has one, else its
    latest checkpoint (`train()` continues from the latest either way).

    Args:
      run_dir: A folder written by `launch/train.py` or `Experiment.train`.
      data_dir: Where the raw data is now, if not where the run read it.
      round_num: A checkpoint's round (default: as `checkpoint`).
      checkpoint: 'selected' (the validation-selected round, else the
        latest) or 'latest'.

    Returns:
      The restored `Experiment`.

    Raises:
      RunFolderError: If the folder, its settings or the checkpoint is missing.
      DataError: If the data cannot be read.
    """
    run_settings, foreign, split = read_run(run_dir, data_dir=data_dir)
    loaded = Experiment(run_settings, run_dir=run_dir, split=split,
                        foreign_settings=foreign)
    loaded.restore(round_num=round_num, checkpoint=checkpoint)
    return loaded


def tune(task: str, *, root: str | os.PathLike, trials: int = recipes.TUNER_TRIALS,
         max_minutes: float | None = None, trial_minutes: float | None = None,
         objective: str | None = None,
         space: list[str] | None = None, algorithm: str = methods.FEDRECGEL,
         seed: int = 0, frame: bool = True,
         start_from_auto: bool = recipes.TUNER_STARTS_FROM_AUTO,
         prune_after: float = recipes.TUNER_PRUNE_AFTER, **fixed: Any) -> dict[str, Any]:
    """Searches a method's settings on the validation item (`tuning`), as
    `launch/tune.py` does; resumes the search kept in `root`.

    Args:
      task: A name of `TASK_NAMES`.
      root: The tuning folder (the study, its trials, `best_preset.json`).
      trials: Finished trials to reach.
      max_minutes: Wall-clock budget of this call.
      trial_minutes: Wall-clock limit of one trial, past which it is pruned
        (default: a quarter of `max_minutes`).
      objective: The validation metric maximized (default
        `valid_full/ndcg@10`).
      space: Dimensions of `tuning.SEARCHABLE` to search, or `+NAME` ones
        added to the default (`tuning.SEARCH_SPACE`, which leaves out the
        rounds).
      algorithm: The method tuned (a method whose spec is `tunable`).
      seed: Seed of the sampler and of every trial.
      frame: Then search the central model with the same trials and budget
        and set the tuned method between popularity and it
        (`tuning_frame`), unless tuning it.
      start_from_auto: A new search's first trial is the `auto` recipe.
      prune_after: The share of a trial's rounds it runs before the pruner
        may stop it on its metric.
      **fixed: Settings shared by every trial (`data_dir`, `data_options`,
        `total_rounds`, ...), left out of the search.

    Returns:
      The search's record; its `preset_file` is a preset `settings` accepts;
      with `frame`, its `frame` holds the ceiling's search, and `table`
      the comparison (`tuning_frame.table_lines`).
    """
    from tff_fedrecgel import tuning  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning_frame  # pylint: disable=g-import-not-at-top

    config = tuning.TuneConfig.create(
        task, algorithm=algorithm, space=space, fixed=fixed, objective=objective, trials=trials,
        max_minutes=max_minutes, trial_minutes=trial_minutes, seed=seed,
        start_from_auto=start_from_auto, prune_after=prune_after)
    frame = frame and algorithm != tuning_frame.CEILING
    if frame:
        tuning_frame.ceiling_config(config)  # Checked before anything runs.
    split = prepare_data(task, data_dir=fixed.get('data_dir'), validation=True,
                         **fixed.get('data_options', {}))
    with Session():
        record = tuning.run_search(config, root=root, split=split, make_experiment=experiment)
        if frame:
            record['frame'] = tuning_frame.run_frame(config, root=root, split=split,
                                                     make_experiment=experiment)
            record['table'] = tuning_frame.table_lines(record, record['frame'])
        return record
