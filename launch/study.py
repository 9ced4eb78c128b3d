"""The reproduction study: which runs it makes and how their results combine.

`study_plan` lists the runs (dataset x method x seed x selection, and the
FilmTrust radius sweep) in the order they are worth having; `launch/run_study.py`
runs them, skipping finished ones. `collect` reads every finished run's
`summary.json` and `hparams.json` into one table; `method_table`,
`paired_differences` and `sweep_table` reduce it to the report's tables.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Sequence

import numpy as np
import pandas as pd

from tff_fedrecgel import tasks
from tff_fedrecgel.evaluation import protocols

DATASETS = ('filmtrust', 'lastfm_2k', 'amazon_video')
# The paper reproduction's methods (the floor and ceiling are the recipe study's).
METHODS = ('fedrecgel', 'fedncf', 'sam_global', 'sam_local', 'fedmf', 'fedrecon')
SWEEP_GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Radius at which the sharpness-probe runs measure both parts' sharpness.
PROBE_RADIUS = 0.05
PROBE_METHODS = ('fedrecgel', 'fedncf')
# LastFM-2K is still improving at round 100; these runs go on to
# LONG_ROUNDS (rounds 1-100 equal the main run of the same seed).
LONG_ROUNDS = 400
LONG_RUNS = (('lastfm_2k', 'fedrecgel'), ('lastfm_2k', 'fedncf'))
LONG_SEEDS = 3


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the study.

    Attributes:
      name: Folder name under the study root, also the experiment name.
      dataset: Task name.
      method: `--algorithm` value.
      seed: `--seed` value.
      validation: Whether the run holds out a validation item (the honest
        selection) rather than selecting on the test item.
      rho_sh: Radius override of a sweep run (None: the method's).
      rho_ns: Radius override of a sweep run (None: the method's).
      sharpness_probe: `--sharpness_probe` radius of a probe run (its
        training equals the main run of the same seed).
      total_rounds: `--total_rounds` of a long run (None: the task's 100).
      preset: `--preset` ('paper' or 'tuned').
      heldout_users: `--heldout_users` fraction.
      eval_protocol: `--eval_protocol`.
      rounds_per_full_eval: `--rounds_per_full_eval` (None: every round).
      extra: Further flags, last (a transfer candidate's settings).
    """
    name: str
    dataset: str
    method: str
    seed: int
    validation: bool = False
    rho_sh: float | None = None
    rho_ns: float | None = None
    sharpness_probe: float | None = None
    total_rounds: int | None = None
    preset: str = 'paper'
    heldout_users: float = 0.0
    eval_protocol: str = protocols.SAMPLED.name
    rounds_per_full_eval: int | None = None
    extra: tuple[str, ...] = ()

    def flags(self, data_dir: str) -> list[str]:
        """`launch/train.py` flags of this run (without the output flags)."""
        data = [] if tasks.get_task(self.dataset).raw_file is None else [f'--data_dir={data_dir}']
        out = [f'--task={self.dataset}', *data, f'--algorithm={self.method}',
               f'--seed={self.seed}', *(['--validation'] if self.validation else [])]
        # (flag, value, the value that needs no flag), in order.
        optional = (('rho_sh', self.rho_sh, None), ('rho_ns', self.rho_ns, None),
                    ('sharpness_probe', self.sharpness_probe, None),
                    ('total_rounds', self.total_rounds, None), ('preset', self.preset, 'paper'),
                    ('heldout_users', self.heldout_users or None, None),
                    ('eval_protocol', self.eval_protocol, protocols.SAMPLED.name),
                    ('rounds_per_full_eval', self.rounds_per_full_eval, None))
        out += [f'--{name}={value:g}' if isinstance(value, float) else f'--{name}={value}'
                for name, value, needless in optional if value not in (None, needless)]
        return out + list(self.extra)


def spec_radii(dataset: str) -> tuple[float, float]:
    """The task's radii (rho_sh, rho_ns), of the authors' final runs (docs/ALGORITHM.md)."""
    task = tasks.get_task(dataset)
    return task.rho_sh, task.rho_ns


def _main_run(dataset: str, method: str, seed: int, validation: bool) -> Run:
    suffix = '_valid' if validation else ''
    return Run(name=f'{dataset}/{method}{suffix}_seed{seed}', dataset=dataset,
               method=method, seed=seed, validation=validation)


def redundant_methods(dataset: str) -> dict[str, str]:
    """Ablations identical by construction to another method on `dataset`.

    With a radius of 0 in the paper's setting, SAM on one part only is the same
    computation as a method already run (e.g. FilmTrust's rho_sh = 0 makes
    "SAM on global only" FedNCF); the study runs such an ablation for one
    seed to show the identity and reports the other method's seeds for it.
    """
    rho_sh, rho_ns = spec_radii(dataset)
    out = {}
    if rho_sh == 0:
        out.update(sam_global='fedncf', sam_local='fedrecgel')
    if rho_ns == 0:
        out.update(sam_local='fedncf', sam_global='fedrecgel')
    return out


def study_plan(*, seeds: dict[str, int] | None = None, sweep_seeds: int = 3,
               methods: Sequence[str] = METHODS,
               datasets: Sequence[str] = DATASETS) -> list[Run]:
    """The study's runs, most valuable first.

    Args:
      seeds: Seeds per dataset (default: 5 on FilmTrust, 3 elsewhere).
      sweep_seeds: Seeds of each FilmTrust sweep point.
      methods: Methods to include.
      datasets: Datasets to include.

    Returns:
      The runs, without duplicates, in the order of `_priority`.
    """
    seeds = {'filmtrust': 5, 'lastfm_2k': 3, 'amazon_video': 3, **(seeds or {})}
    runs: list[Run] = []
    for dataset in datasets:
        redundant = redundant_methods(dataset)
        for validation in (False, True):
            for method in methods:
                count = 1 if method in redundant else seeds[dataset]
                runs += [_main_run(dataset, method, s, validation) for s in range(count)]
        runs += [Run(name=f'{dataset}/probe_{method}_seed0', dataset=dataset,
                     method=method, seed=0, sharpness_probe=PROBE_RADIUS)
                 for method in PROBE_METHODS if method in methods]
        runs += [Run(name=f'{dataset}/long{LONG_ROUNDS}_{method}_seed{seed}',
                     dataset=dataset, method=method, seed=seed,
                     total_rounds=LONG_ROUNDS)
                 for seed in range(LONG_SEEDS) for long_dataset, method in LONG_RUNS
                 if long_dataset == dataset and method in methods]
    if 'filmtrust' in datasets and 'fedrecgel' in methods:
        rho_sh, rho_ns = spec_radii('filmtrust')
        for seed in range(sweep_seeds):
            for value in SWEEP_GRID:
                for name, overrides in (('rho_sh', dict(rho_sh=value, rho_ns=rho_ns)),
                                        ('rho_ns', dict(rho_sh=rho_sh, rho_ns=value))):
                    if (overrides['rho_sh'], overrides['rho_ns']) in (
                            (rho_sh, rho_ns), (0.0, 0.0)):
                        continue  # The main FedRecGEL run, or FedNCF.
                    runs.append(Run(
                        name=f'filmtrust/sweep_{name}{value:g}_seed{seed}',
                        dataset='filmtrust', method='fedrecgel', seed=seed,
                        **overrides))
    return sorted(runs, key=_priority)


# The recipe study (docs/RESULTS.md, "Between floor and ceiling"): every run
# holds out a validation item and 10% of the users, and evaluates under both
# protocols, full ranking every few rounds (it costs seconds a time).
RECIPE_HELDOUT = 0.1
RECIPE_FULL_EVERY = {'filmtrust': 5, 'lastfm_2k': 10, 'amazon_video': 20}
# Epochs of the central ceiling, and its full-ranking schedule (an epoch is
# one round). Sampled metrics peak within a few epochs; full ranking keeps
# rising much longer (measured: FilmTrust peaks at 21, Amazon-Video at 28,
# LastFM-2K still rises at 25), so the ceiling trains for that long.
CENTRAL_EPOCHS = {'filmtrust': 30, 'lastfm_2k': 25, 'amazon_video': 30}
# Under the paper's protocol alone (sampled metrics, peaking within these).
PAPERBASE_CENTRAL_EPOCHS = {'filmtrust': 15, 'lastfm_2k': 12, 'amazon_video': 10}
CENTRAL_FULL_EVERY = {'filmtrust': 1, 'lastfm_2k': 1, 'amazon_video': 2}
RECIPE_SEEDS = 5
BASELINE_SEEDS = 3
# The tuned recipe's radius sweep on LastFM-2K (rho_sh, rho_ns), where the
# federated model learns most; the task's (0.01, 0.01) is the main run.
RECIPE_SWEEP = ((0.05, 0.01), (0.01, 0.1), (0.05, 0.1))
RECIPE_SWEEP_SEEDS = 2


def recipe_plan(datasets: Sequence[str] = DATASETS) -> list[Run]:
    """The recipe study's runs, most valuable first.

    Per dataset: the popularity floor and the central ceiling (3 seeds);
    FedNCF and FedRecGEL with the tuned preset (5 seeds), and with the paper's
    protocol where the preset differs from it (3 seeds); on LastFM-2K a radius
    sweep under the tuned preset, and the paper's protocol alone (sampled
    metrics, no users held out, both selections, 3 seeds) on the authors' tie
    rule, to compare with their code.
    """
    runs = []
    for dataset in datasets:
        common = dict(dataset=dataset, validation=True, heldout_users=RECIPE_HELDOUT,
                      eval_protocol='both', rounds_per_full_eval=RECIPE_FULL_EVERY[dataset])
        runs += [Run(name=f'{dataset}/itempop_seed{s}', method='itempop', seed=s, **common)
                 for s in range(BASELINE_SEEDS)]
        runs += [Run(name=f'{dataset}/central_seed{s}', method='central', seed=s,
                     total_rounds=CENTRAL_EPOCHS[dataset],
                     **{**common, 'rounds_per_full_eval': CENTRAL_FULL_EVERY[dataset]})
                 for s in range(BASELINE_SEEDS)]
        tuned = bool(tasks.get_task(dataset).tuned)
        for method in ('fedncf', 'fedrecgel'):
            runs += [Run(name=f'{dataset}/tuned_{method}_seed{s}', method=method, seed=s,
                         preset='tuned', **common) for s in range(RECIPE_SEEDS)]
            if tuned:
                runs += [Run(name=f'{dataset}/paper_{method}_seed{s}', method=method,
                             seed=s, **common) for s in range(BASELINE_SEEDS)]
        # The floor and the ceiling under the paper's protocol alone, beside the
        # paper reproduction's tables.
        for validation in (False, True):
            suffix = '_valid' if validation else ''
            runs += [Run(name=f'{dataset}/paperbase_itempop{suffix}_seed0', dataset=dataset,
                         method='itempop', seed=0, validation=validation),
                     Run(name=f'{dataset}/paperbase_central{suffix}_seed0', dataset=dataset,
                         method='central', seed=0, validation=validation,
                         total_rounds=PAPERBASE_CENTRAL_EPOCHS[dataset])]
        if dataset == 'lastfm_2k':
            runs += [Run(name=f'{dataset}/tuned_sweep_sh{sh:g}_ns{ns:g}_seed{s}',
                         method='fedrecgel', seed=s, preset='tuned', rho_sh=sh, rho_ns=ns,
                         **common)
                     for s in range(RECIPE_SWEEP_SEEDS) for sh, ns in RECIPE_SWEEP]
            for validation in (False, True):
                suffix = '_valid' if validation else ''
                runs += [Run(name=f'{dataset}/splitfix_{method}{suffix}_seed{s}',
                             dataset=dataset, method=method, seed=s, validation=validation)
                         for method in ('fedrecgel', 'fedncf')
                         for s in range(BASELINE_SEEDS)]
    return sorted(runs, key=_recipe_priority)


def _recipe_priority(run: Run) -> tuple[int, int, str]:
    """Floors and ceilings, then three seeds of each method, then the rest."""
    kind = run.name.split('/')[1].split('_')[0]
    order = {'itempop': 0, 'central': 0, 'tuned': 1, 'paper': 2, 'splitfix': 3,
             'paperbase': 3}
    stage = order.get(kind, 4)
    if kind == 'tuned' and 'sweep' in run.name:
        stage = 4
    elif kind == 'tuned' and run.seed >= BASELINE_SEEDS:
        stage = 3
    return stage, run.seed, run.name


def _priority(run: Run) -> tuple[int, int]:
    """Order of value: FilmTrust; the other datasets' test-selected runs; the
    sharpness probes and one sweep seed; validation runs (FedRecGEL and
    FedNCF first); more sweep seeds; the long runs. FedRecon, the slowest
    method, comes after all the others (test-selected first)."""
    if run.method == 'fedrecon':
        return 9, int(run.validation)
    if run.name.startswith('filmtrust/sweep_'):
        return (2 if run.seed == 0 else 5), 0
    if run.sharpness_probe is not None:
        return 2, 0
    if run.total_rounds is not None:
        return 6, 0
    if run.dataset == 'filmtrust':
        return 0, 0
    if not run.validation:
        return 1, 0
    return (3 if run.method in ('fedrecgel', 'fedncf') else 4), 0


def is_finished(root: pathlib.Path, run: Run) -> bool:
    """Whether `run` has written its summary under `root`."""
    return (root / run.name / 'summary.json').exists()


def collect(root: pathlib.Path) -> pd.DataFrame:
    """One row per finished run under `root`: settings and selected metrics.

    Columns: name, dataset, method, seed, validation, rho_sh, rho_ns,
    rounds, seconds_per_round, test_hr, test_ndcg, test_round (best test
    round); for validation runs valid_hr, valid_ndcg, valid_round (test
    metrics at the best validation round); and the kind flags sweep, probe
    and long.
    """
    rows = []
    for summary_path in sorted(pathlib.Path(root).glob('*/*/summary.json')):
        summary = json.loads(summary_path.read_text())
        hparams = json.loads((summary_path.parent / 'hparams.json').read_text())
        row = {
            'name': f'{summary_path.parent.parent.name}/{summary_path.parent.name}',
            'dataset': hparams['task'], 'method': hparams['algorithm'],
            'seed': hparams['seed'], 'validation': bool(hparams['validation']),
            'rho_sh': hparams['rho_sh'], 'rho_ns': hparams['rho_ns'],
            'rounds': summary['rounds'],
            'seconds_per_round': summary['seconds_per_round'],
            'test_hr': summary['best_test_hr@10'],
            'test_ndcg': summary['best_test_ndcg@10'],
            'test_round': summary['best_round'],
            'valid_hr': summary.get('best_valid_test_hr@10', math.nan),
            'valid_ndcg': summary.get('best_valid_test_ndcg@10', math.nan),
            'valid_round': summary.get('best_valid_round', math.nan),
        }
        row['sweep'] = row['name'].split('/')[1].startswith('sweep_')
        row['probe'] = hparams.get('sharpness_probe') is not None
        row['long'] = row['name'].split('/')[1].startswith('long')
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_std(values: pd.Series) -> tuple[float, float, int]:
    values = values.dropna()
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return float(values.mean()) if len(values) else math.nan, std, len(values)


def main_runs(runs: pd.DataFrame, dataset: str | None = None) -> pd.DataFrame:
    """The 100-round method runs (no sweep, probe or long run) of `dataset`
    (None: of every dataset)."""
    chosen = runs[~runs.sweep & ~runs.probe & ~runs.long]
    return chosen if dataset is None else chosen[chosen.dataset == dataset]


def method_table(runs: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Mean and sample standard deviation over seeds of each method's metrics.

    Test selection uses the runs without a validation item; validation
    selection uses the validation runs. Ablations identical by construction
    to another method (`redundant_methods`) take that method's seeds.

    Returns:
      One row per method in `METHODS` order with columns test_hr, test_hr_std,
      test_ndcg, test_ndcg_std, n_test, valid_hr, valid_hr_std, valid_ndcg,
      valid_ndcg_std, n_valid (NaN where no run finished).
    """
    main = main_runs(runs, dataset)
    redundant = redundant_methods(dataset)
    rows = []
    for method in METHODS:
        source = main[main.method == redundant.get(method, method)]
        row = {'method': method, 'same_as': redundant.get(method, '')}
        for selection, flag in (('test', False), ('valid', True)):
            chosen = source[source.validation == flag]
            for metric in ('hr', 'ndcg'):
                mean, std, count = _mean_std(chosen[f'{selection}_{metric}'])
                row[f'{selection}_{metric}'] = mean
                row[f'{selection}_{metric}_std'] = std
            row[f'n_{selection}'] = count
        rows.append(row)
    return pd.DataFrame(rows).set_index('method')


def paired_differences(runs: pd.DataFrame, dataset: str, *, method: str = 'fedrecgel',
                       baseline: str = 'fedncf',
                       long: bool = False) -> dict[str, dict[str, float]]:
    """Seed-paired `method` minus `baseline` differences of HR@10 and NDCG@10.

    Runs with the same seed share the initial weights, client sampling and
    negatives, so pairing removes that part of the seed noise.

    Args:
      runs: The output of `collect`.
      dataset: Task name.
      method: The method whose gain is measured.
      baseline: The method it is compared with.
      long: Pair the long runs (`LONG_ROUNDS` rounds) instead of the main ones.

    Returns:
      For each selection ('test', 'valid') and metric ('hr', 'ndcg'), under
      keys like 'test_hr': mean, std (sample), n, and the seeds' min and max.
    """
    main = (runs[runs.long & (runs.dataset == dataset)] if long
            else main_runs(runs, dataset))
    out = {}
    for selection, flag in (('test', False), ('valid', True)):
        chosen = main[main.validation == flag]
        a = chosen[chosen.method == method].set_index('seed')
        b = chosen[chosen.method == baseline].set_index('seed')
        seeds = sorted(set(a.index) & set(b.index))
        for metric in ('hr', 'ndcg'):
            column = f'{selection}_{metric}'
            diff = np.array([a.loc[s, column] - b.loc[s, column] for s in seeds])
            out[column] = {
                'mean': float(diff.mean()) if len(diff) else math.nan,
                'std': float(diff.std(ddof=1)) if len(diff) > 1 else math.nan,
                'n': len(diff),
                'min': float(diff.min()) if len(diff) else math.nan,
                'max': float(diff.max()) if len(diff) else math.nan,
            }
    return out


def sweep_table(runs: pd.DataFrame) -> pd.DataFrame:
    """FilmTrust sensitivity: best-test HR@10/NDCG@10 per swept radius value.

    Each point varies one radius with the other at the task's value; the
    point equal to the task's radii is the main FedRecGEL run, and rho_ns = 0
    is FedNCF, so those seeds are reused.

    Returns:
      Rows indexed by (radius, value) with hr, hr_std, ndcg, ndcg_std, n.
    """
    film = runs[(runs.dataset == 'filmtrust') & ~runs.validation & ~runs.probe
                & ~runs.long & runs.method.isin(['fedrecgel', 'fedncf'])]
    rho_sh0, rho_ns0 = spec_radii('filmtrust')
    rows = []
    for radius in ('rho_sh', 'rho_ns'):
        other, other_value = (('rho_ns', rho_ns0) if radius == 'rho_sh'
                              else ('rho_sh', rho_sh0))
        for value in SWEEP_GRID:
            chosen = film[np.isclose(film[radius], value)
                          & np.isclose(film[other], other_value)]
            # Main runs have 5 seeds; keep the sweep's seeds for comparability.
            chosen = chosen[chosen.seed < _sweep_seeds(runs)]
            hr, hr_std, count = _mean_std(chosen.test_hr)
            ndcg, ndcg_std, _ = _mean_std(chosen.test_ndcg)
            rows.append({'radius': radius, 'value': value, 'hr': hr, 'hr_std': hr_std,
                         'ndcg': ndcg, 'ndcg_std': ndcg_std, 'n': count})
    return pd.DataFrame(rows).set_index(['radius', 'value'])


def _sweep_seeds(runs: pd.DataFrame) -> int:
    sweep = runs[runs.sweep]
    return int(sweep.seed.max()) + 1 if len(sweep) else 0


# The authors' code measured on this machine (docs/ALGORITHM.md, "Reference
# figures"; best test round, 100 rounds), as (HR@10, NDCG@10, what they are).
AUTHORS_REFERENCE = {
    ('filmtrust', 'fedrecgel'): (0.9172, 0.7957, 'mean of 3 runs'),
    ('filmtrust', 'fedncf'): (0.9180, 0.7994, 'mean of 3 runs'),
    ('lastfm_2k', 'fedrecgel'): (0.6763, 0.4589, '1 run'),
    ('lastfm_2k', 'fedncf'): (0.6731, 0.4566, '1 run'),
    ('amazon_video', 'fedrecgel'): (0.6295, 0.4140, '1 run'),
}
# The authors' own sensitivity sweeps (single unseeded runs, best test round).
AUTHORS_SWEEP_LEVEL = {'filmtrust': '≈0.916–0.918 / 0.77–0.82',
                       'lastfm_2k': '≈0.80 / 0.73', 'amazon_video': '≈0.627 / 0.413'}


def curves(root: pathlib.Path, runs: pd.DataFrame, columns: Sequence[str]) -> dict:
    """Per-round series of `columns` from each run's metrics.csv.

    Returns:
      {run name: DataFrame indexed by round with the columns present}.
    """
    out = {}
    for name in runs.name:
        path = pathlib.Path(root) / name / 'metrics.csv'
        if path.exists():
            frame = pd.read_csv(path).set_index('round').sort_index()
            out[name] = frame[[c for c in columns if c in frame.columns]]
    return out


RECIPE_SELECTIONS = ('test', 'valid', 'test_full', 'valid_full')


def recipe_kind(name: str) -> str:
    """'itempop', 'central', 'paper', 'tuned', 'sweep', 'splitfix' or
    'paperbase' (the floor or ceiling under the paper's protocol) of a run."""
    stem = name.split('/')[1]
    if stem.startswith('tuned_sweep'):
        return 'sweep'
    return stem.split('_')[0]


def collect_recipe(root: pathlib.Path) -> pd.DataFrame:
    """One row per finished run of the recipe study under `root`.

    Columns: name, dataset, method, kind (`recipe_kind`), seed, rho_sh,
    rho_ns, rounds, seconds_per_round, and for every selection of
    `RECIPE_SELECTIONS` the round and every metric it recorded, named
    `<selection>:round` and `<selection>:<group>/<metric>` (e.g.
    `valid_full:heldout_full/hr@10`: held-out users' full-ranking HR@10 at
    the round chosen on the validation item's full-ranking HR@10).
    """
    rows = []
    for summary_path in sorted(pathlib.Path(root).glob('*/*/summary.json')):
        summary = json.loads(summary_path.read_text())
        hparams = json.loads((summary_path.parent / 'hparams.json').read_text())
        name = f'{summary_path.parent.parent.name}/{summary_path.parent.name}'
        row = {'name': name, 'dataset': hparams['task'], 'method': hparams['algorithm'],
               'kind': recipe_kind(name), 'seed': hparams['seed'],
               'rho_sh': hparams['rho_sh'], 'rho_ns': hparams['rho_ns'],
               'rounds': summary['rounds'], 'seconds_per_round': summary['seconds_per_round']}
        if 'selections' in summary:
            for selection, record in summary['selections'].items():
                row.update({f'{selection}:{k}': v for k, v in record.items()})
        else:  # The sampled protocol's fields (runs without the selections).
            row['test:round'] = summary['best_round']
            row['test:test/hr@10'] = summary['best_test_hr@10']
            row['test:test/ndcg@10'] = summary['best_test_ndcg@10']
            if 'best_valid_round' in summary:
                row['valid:round'] = summary['best_valid_round']
                row['valid:test/hr@10'] = summary['best_valid_test_hr@10']
                row['valid:test/ndcg@10'] = summary['best_valid_test_ndcg@10']
        rows.append(row)
    return pd.DataFrame(rows)
