"""The peers study: the peer recommenders beside the popularity floor.

Each peer method runs under the settings its registry entry names
(`methods.Method.peer`: the flags beyond the common ones, `PEER_SETTINGS`);
every run holds out a validation item and 10% of the users and evaluates
under both protocols, as the recipe study does.

Then the same at equal tuning: every method of `SEARCHED` (FedRecGEL, its
no-SAM twin FedNCF and each peer) is searched by the same tuner with the
same budget (`launch/tune.py`, `--peer_search_trials` trials of the plan's
rounds, on the validation item, seed 0) into `<dataset>/search_<method>/`,
and its `searched_<method>_seed<s>` runs train at the search's
`best_preset.json` once the search has reached its trials.
`launch/run_study.py --plan=peers` runs both halves. A search outlives its
folder: `launch/report_study.py --plan=peers` records every search's trials
in `SEARCH_LEDGER`, from which a fresh checkout resumes it (`Search.restore`).
"""

from __future__ import annotations

from collections.abc import Sequence
import copy
import dataclasses
import json
import os
import pathlib

from tff_fedrecgel import tasks
from tff_fedrecgel.launch import study
from tff_fedrecgel.launch.study import Run
from tff_fedrecgel.methods import METHODS

# Each peer method's settings are its registry entry's (`Method.peer`).
PEER_SETTINGS = {name: tuple(f'--{k}={v}' for k, v in method.peer.settings.items())
                 for name, method in METHODS.items() if method.peer}
# The control of FedSAM's row: the same local training without SAM (FedNCF
# uploading its change, i.e. FedAvg), so that FedSAM minus it is what local
# SAM adds. Its runs are named control_<method>_seed<s>; it runs with FedSAM.
CONTROL_METHOD = 'fedncf'
CONTROL_SETTINGS = (*PEER_SETTINGS['fedsam'], '--update=model_delta')
PEER_SEEDS = 5
# The floors every seed gets: popularity, and each user's own history first
# (where test items repeat training pairs, as on LastFM-2K, remembering
# the history is worth much of a full-ranking figure).
FLOORS = ('itempop', 'history')
# The methods searched with equal budgets: FedRecGEL, FedNCF and each peer.
SEARCHED = ('fedrecgel', CONTROL_METHOD, *PEER_SETTINGS)
# Finished trials of each search (the budget every method gets).
SEARCH_TRIALS = 20
# What a search writes (`tuning.PROGRESS`, `tuning.BEST_PRESET`); not
# imported, so that listing the plan loads no TensorFlow.
_PROGRESS, _BEST_PRESET = 'search.json', 'best_preset.json'
# Every search's trials (`tuning_study.export_study`), committed beside the
# runs' rows, keyed by search name.
SEARCH_LEDGER = 'docs/peers_searches.json'
# Where the ledger's searches read their data: the runner's --datasets_dir,
# named when a search resumes (so the ledger holds no machine's paths).
_DATASETS_DIR_MARK = '<datasets_dir>'


@dataclasses.dataclass(frozen=True)
class Search:
    """One method's search on one dataset (a `launch/tune.py` call).

    Attributes:
      name: `<dataset>/search_<method>`, its folder under the study root.
      dataset: Task name.
      method: `--algorithm` value.
      trials: Finished trials it reaches (resumed across calls).
      heldout_users: `--heldout_users` of its trials (the plan's).
      rounds_per_full_eval: Its trials' full-ranking evaluations.
      max_minutes: Wall-clock limit of one call (None: none), enforced by
        the runner stopping the call, so that no trial is cut on the wall
        clock and counted; the next call resumes.
    """

    name: str
    dataset: str
    method: str
    trials: int
    heldout_users: float
    rounds_per_full_eval: int
    max_minutes: float | None = None
    seed: int = 0
    script = 'tune.py'

    def flags(self, data_dir: str) -> list[str]:
        """`launch/tune.py` flags (without the output folder)."""
        task = tasks.get_task(self.dataset)
        data = [] if task.raw_file is None else [f'--data_dir={data_dir}']
        # The task's rounds for every method, as its seeded runs have, stated
        # so that the searches compare settings at equal rounds whatever the
        # tuner's default space.
        return [f'--task={self.dataset}', *data, f'--algorithm={self.method}',
                f'--total_rounds={task.total_rounds}',
                f'--seed={self.seed}', f'--trials={self.trials}', '--noframe',
                f'--heldout_users={self.heldout_users:g}',
                f'--rounds_per_full_eval={self.rounds_per_full_eval}']

    def preset_path(self, root: pathlib.Path) -> pathlib.Path:
        """Where its best settings are written."""
        return root / self.name / _BEST_PRESET

    def finished(self, root: pathlib.Path) -> bool:
        """Whether it has reached its trials (and written its preset)."""
        try:
            progress = json.loads((root / self.name / _PROGRESS).read_text())
        except (OSError, ValueError):
            return False
        # Its own trials, not the search.json's: a larger budget resumes it.
        return (progress.get('finished_trials', 0) >= self.trials
                and self.preset_path(root).exists())

    def restore(self, root: pathlib.Path, recorded: dict, datasets_dir: pathlib.Path) -> int:
        """Brings its recorded trials into its folder if that holds no study
        (a fresh checkout), so that the search resumes instead of starting
        again.

        Args:
          root: The study root.
          recorded: `recorded_searches` of the ledger.
          datasets_dir: The folder of the datasets it now reads.

        Returns:
          How many trials it brought (0: none recorded, or the folder has
          its own study).
        """
        from tff_fedrecgel import tuning_study  # pylint: disable=g-import-not-at-top
        folder = root / self.name
        if self.name not in recorded or (folder / tuning_study.STUDY_FILE).exists():
            return 0
        record = copy.deepcopy(recorded[self.name])
        base = (record.get('definition') or {}).get('base', {})
        if base.get('data_dir') == f'{_DATASETS_DIR_MARK}/{self.dataset}':
            base['data_dir'] = os.path.abspath(datasets_dir / self.dataset)  # As tune.py has it.
        tuning_study.import_study(folder, record)
        return len(record['trials'])


def settings_source(method: str) -> str:
    """Whose settings a method runs under in this plan."""
    if method == CONTROL_METHOD:
        return f'{METHODS["fedsam"].peer.source}, no SAM (FedSAM\'s control)'
    return METHODS[method].peer.source


def peers_plan(datasets: Sequence[str] = study.DATASETS,
               methods: Sequence[str] = tuple(PEER_SETTINGS),
               seeds: int = PEER_SEEDS, root: pathlib.Path | None = None,
               search_trials: int = SEARCH_TRIALS,
               search_minutes: float | None = None) -> list[Run | Search]:
    """The peers study's runs: per dataset the floors, then each peer method
    (and FedSAM's control with FedSAM), `seeds` seeds each, lowest seeds first;
    with `root`, also each `SEARCHED` method's search and its seeds.

    Args:
      datasets: Task names.
      methods: Peer methods (names of `PEER_SETTINGS`).
      seeds: Seeds of each.
      root: The study root (the searched runs' presets are under it); None
        leaves the equal-tuning half out.
      search_trials: Finished trials of each search.
      search_minutes: Wall-clock limit of one call of a search.

    Returns:
      The runs and searches.

    Raises:
      ValueError: For a method without authors' settings here.
    """
    unknown = [m for m in methods if m not in PEER_SETTINGS]
    if unknown:
        raise ValueError(f'no peer settings for {", ".join(unknown)}; choose from '
                         f'{", ".join(PEER_SETTINGS)}')
    runs = []
    for dataset in datasets:
        common = dict(dataset=dataset, validation=True, heldout_users=study.RECIPE_HELDOUT,
                      eval_protocol='both',
                      rounds_per_full_eval=study.RECIPE_FULL_EVERY[dataset])
        for s in range(seeds):
            runs += [Run(name=f'{dataset}/{floor}_seed{s}', method=floor, seed=s, **common)
                     for floor in FLOORS]
            runs += [Run(name=f'{dataset}/peer_{m}_seed{s}', method=m, seed=s,
                         extra=PEER_SETTINGS[m], **common) for m in methods]
            if 'fedsam' in methods:
                runs.append(Run(name=f'{dataset}/control_{CONTROL_METHOD}_seed{s}',
                                method=CONTROL_METHOD, seed=s, extra=CONTROL_SETTINGS,
                                **common))
        if root is not None:
            runs += searched_runs(dataset, common, seeds, root, search_trials, search_minutes)
    return sorted(runs, key=lambda run: (run.seed, run.name))


def searched_runs(dataset: str, common: dict, seeds: int, root: pathlib.Path,
                  trials: int, minutes: float | None) -> list[Run | Search]:
    """Each `SEARCHED` method's search on `dataset` and its seeds' runs at
    the search's preset (`common`: the plan's shared run settings)."""
    out: list[Run | Search] = []
    for method in SEARCHED:
        search = Search(f'{dataset}/search_{method}', dataset, method, trials,
                        common['heldout_users'], common['rounds_per_full_eval'], minutes)
        out.append(search)
        out += [Run(name=f'{dataset}/searched_{method}_seed{s}', method=method, seed=s,
                    preset=str(search.preset_path(root)), **common) for s in range(seeds)]
    return out


def search_of(run: Run | Search, plan: Sequence[Run | Search]) -> Search | None:
    """The search whose preset `run` trains at, if any."""
    return next((s for s in plan if isinstance(s, Search) and run.name != s.name
                 and run.name.startswith(s.name.replace('/search_', '/searched_') + '_seed')),
                None)


def recorded_searches(ledger: pathlib.Path) -> dict:
    """The searches a ledger holds (`SEARCH_LEDGER`), by name; none if it
    does not exist.

    Raises:
      ValueError: The file is not a ledger (say, a merge left it broken).
    """
    if not ledger.exists():
        return {}
    try:
        recorded = json.loads(ledger.read_text(encoding='utf-8'))
    except json.JSONDecodeError as e:
        recorded = e
    if not isinstance(recorded, dict):
        detail = f' ({recorded})' if isinstance(recorded, Exception) else ''
        raise ValueError(f'{ledger} is not a search ledger{detail}: restore it with '
                         f'git checkout -- {ledger}, or move it away to search again')
    return recorded


def record_searches(root: pathlib.Path, ledger: pathlib.Path,
                    recorded: dict | None = None) -> int:
    """Records the trials of every search under `root` in `ledger`, keeping
    the ledger's searches whose folders are gone.

    Args:
      root: The study root.
      ledger: The ledger's file.
      recorded: Its `recorded_searches`, when already read.

    Returns:
      How many searches the ledger holds (it is left as it was when `root`
      holds none).
    """
    from tff_fedrecgel import tuning_study  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.program import outputs  # pylint: disable=g-import-not-at-top
    recorded = recorded_searches(ledger) if recorded is None else recorded
    found = {f'{folder.parent.name}/{folder.name}': tuning_study.export_study(folder)
             for folder in sorted(root.glob('*/search_*')) if folder.is_dir()}
    found = {name: record for name, record in found.items() if record is not None}
    for name, record in found.items():
        base = (record.get('definition') or {}).get('base', {})
        if base.get('data_dir'):
            base['data_dir'] = f'{_DATASETS_DIR_MARK}/{name.split("/")[0]}'
    if found:
        recorded.update(found)
        outputs.write_atomically(ledger, json.dumps(recorded, indent=1, sort_keys=True) + '\n')
    return len(recorded)
