"""The transfer study: which recipe to use on data nobody tuned for.

Candidate recipes run on FilmTrust, LastFM-2K, Amazon-Video and a generated
log (1,000 users, 1,000 items), each with a validation item, 10% of users
held out and both protocols, as the recipe study (`study.recipe_plan`).
Leave one dataset out: the recipe is chosen on the other datasets' validation
items, never on a test item, and measured on the one left out. A candidate's
training negatives may follow the data by the rule of
`recipes.auto_negatives`, with its own negatives-per-user constant.

`launch/run_study.py --plan=transfer` runs it; `launch/report_study.py
--plan=transfer` writes the tables (docs/RESULTS.md, "Transfer"). The
popularity floor and central ceiling of the paper's datasets are the recipe
study's runs (docs/recipe_runs.csv); the generated log's are run here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import pathlib

import numpy as np
import pandas as pd

from tff_fedrecgel.launch import study
from tff_fedrecgel import recipes
from tff_fedrecgel import tasks

DATASETS = ('filmtrust', 'lastfm_2k', 'amazon_video', 'synthetic')
SYNTHETIC = ('--num_users=1000', '--num_items=1000')
FULL_EVERY = {**study.RECIPE_FULL_EVERY, 'synthetic': 5}
ROUNDS = 100
SEEDS = 3


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A recipe: fixed flags, and optionally negatives from the data."""

    name: str
    description: str
    flags: tuple[str, ...]
    negatives_per_user: float | None = None

    def run_flags(self, profile: recipes.DataProfile) -> tuple[str, ...]:
        if self.negatives_per_user is None:
            return self.flags
        negatives = recipes.auto_negatives(profile, per_user=self.negatives_per_user)
        return (*self.flags, f'--num_negatives={negatives}')


CANDIDATES = (
    Candidate('paper', "the paper's protocol", ('--preset=paper',)),
    # The recipe `--preset=auto` is (`recipes.auto_recipe`).
    Candidate(f'n{recipes.AUTO_NEGATIVES_PER_USER:g}',
              'server Adam 0.01, 20% of users, negatives 300 / interactions per user',
              ('--preset=paper', *(f'--{k}={v:g}' for k, v in recipes.AUTO_FIXED.items())),
              recipes.AUTO_NEGATIVES_PER_USER),
    Candidate('d5n150', 'five local epochs uploading the change, server Adam 0.003, '
              'negatives 150 / interactions per user',
              ('--preset=paper', '--update=model_delta', '--local_epochs=5',
               '--server_lr=0.003'), 150),
    Candidate('d5n250', 'five local epochs uploading the change, server Adam 0.003, '
              'negatives 250 / interactions per user',
              ('--preset=paper', '--update=model_delta', '--local_epochs=5',
               '--server_lr=0.003'), 250),
)
BASELINES = ('itempop', 'central')
CHOSEN = CANDIDATES[1]  # Measured on every seed.


def profile_of(dataset: str, datasets_dir: pathlib.Path) -> recipes.DataProfile:
    """The data profile of a dataset of the study (reads its split)."""
    task = tasks.get_task(dataset)
    options = {'num_users': 1000, 'num_items': 1000} if dataset == 'synthetic' else {}
    data_dir = None if task.raw_file is None else datasets_dir / dataset
    return recipes.DataProfile.of(task.load_split(data_dir=data_dir, **options))


def transfer_plan(profiles: Mapping[str, recipes.DataProfile], seeds: int = SEEDS,
                  datasets: Sequence[str] = DATASETS) -> list[study.Run]:
    """Every candidate on every dataset (and the generated log's baselines)."""
    runs = []
    for dataset in datasets:
        extra = SYNTHETIC if dataset == 'synthetic' else ()
        common = dict(dataset=dataset, validation=True, heldout_users=study.RECIPE_HELDOUT,
                      eval_protocol='both', rounds_per_full_eval=FULL_EVERY[dataset],
                      total_rounds=ROUNDS)
        for seed in range(seeds):
            for candidate in CANDIDATES:
                if seed and candidate.name != CHOSEN.name:
                    continue  # Seed 0 chooses; more seeds measure the choice.
                runs.append(study.Run(
                    name=f'{dataset}/{candidate.name}_seed{seed}', method='fedrecgel',
                    seed=seed, extra=(*extra, *candidate.run_flags(profiles[dataset])),
                    **common))
            if dataset == 'synthetic':
                # As the recipe study's: the paper's settings (4 negatives).
                paper = (*extra, '--preset=paper')
                runs.append(study.Run(name=f'{dataset}/itempop_seed{seed}', method='itempop',
                                      seed=seed, extra=paper, **common))
                runs.append(study.Run(
                    name=f'{dataset}/central_seed{seed}', method='central', seed=seed,
                    extra=paper, **{**common, 'total_rounds': 30, 'rounds_per_full_eval': 1}))
    return runs


def selected(metrics_csv: pathlib.Path) -> dict[str, float] | None:
    """A run's validation scores and its test metrics at the rounds they
    chose (`valid/hr@10` for sampled, `valid_full/hr@10` for full ranking)."""
    if not metrics_csv.exists():
        return None
    rows = pd.read_csv(metrics_csv)
    out = {'rounds': int(rows['round'].max())}
    for group, test in (('valid', 'test'), ('valid_full', 'test_full')):
        rated = rows.dropna(subset=[f'{group}/hr@10'])
        if rated.empty:
            return None
        best = rated.loc[rated[f'{group}/hr@10'].idxmax()]
        out[f'{group}_hr'] = float(best[f'{group}/hr@10'])
        out[f'{test}_hr'] = float(best[f'{test}/hr@10'])
        out[f'{test}_ndcg'] = float(best[f'{test}/ndcg@10'])
    return out


def baselines(root: pathlib.Path, recipe_rows: pd.DataFrame) -> dict[str, dict]:
    """Floor and ceiling per dataset: test HR@10 (both protocols) at the
    round chosen on the validation item, mean over seeds."""
    out = {}
    for dataset in DATASETS:
        for method in BASELINES:
            if dataset == 'synthetic':
                values = [selected(p) for p in sorted((root / dataset).glob(
                    f'{method}_seed*/metrics.csv'))]
                values = [v for v in values if v]
                if values:
                    out[(dataset, method)] = {
                        'test_hr': np.mean([v['test_hr'] for v in values]),
                        'test_full_hr': np.mean([v['test_full_hr'] for v in values]),
                        'n': len(values)}
                continue
            rows = recipe_rows[(recipe_rows.dataset == dataset) & (recipe_rows.kind == method)]
            if len(rows):
                out[(dataset, method)] = {
                    'test_hr': rows['valid:test/hr@10'].mean(),
                    'test_full_hr': rows['valid_full:test_full/hr@10'].mean(), 'n': len(rows)}
    return out


def collect(root: pathlib.Path) -> pd.DataFrame:
    """Every candidate run's selections (`selected`), one row per run."""
    rows = []
    for dataset in DATASETS:
        for candidate in CANDIDATES:
            for path in sorted((root / dataset).glob(f'{candidate.name}_seed*/metrics.csv')):
                values = selected(path)
                if values and (path.parent / 'summary.json').exists():
                    seed = int(path.parent.name.rsplit('_seed', 1)[1])
                    rows.append({'dataset': dataset, 'candidate': candidate.name,
                                 'seed': seed, **values})
    return pd.DataFrame(rows)


def counted(base: Mapping, dataset: str) -> bool:
    """Whether central beats popularity under full ranking on `dataset` (else
    the dataset says nothing of learning, and neither chooses nor counts)."""
    floor, ceiling = base.get((dataset, 'itempop')), base.get((dataset, 'central'))
    return bool(floor and ceiling and ceiling['test_full_hr'] > floor['test_full_hr'])


def leave_one_out(runs: pd.DataFrame, base: Mapping) -> list[dict]:
    """For each dataset left out: the candidate that scores best on the
    others' validation items (each dataset's validation HR@10 under full
    ranking over the best candidate's there, averaged), and its test
    figures on the one left out."""
    seed0 = runs[runs.seed == 0]
    needed = {d for d in DATASETS if counted(base, d)}
    complete = [c.name for c in CANDIDATES
                if set(seed0[seed0.candidate == c.name].dataset) >= needed]
    scores = seed0[seed0.candidate.isin(complete)].pivot(
        index='candidate', columns='dataset', values='valid_full_hr')
    relative = scores / scores.max(axis=0)
    out = []
    for left_out in [d for d in DATASETS if d in set(seed0.dataset)]:
        chooses = [d for d in DATASETS if d != left_out and d in needed]
        if relative.empty or not chooses:
            continue
        choice = relative[chooses].mean(axis=1).idxmax()
        mine = runs[(runs.dataset == left_out) & (runs.candidate == choice)]
        record = {'left_out': left_out, 'chosen_on': chooses, 'choice': choice,
                  'seeds': len(mine), 'counted': counted(base, left_out)}
        for column in ('test_hr', 'test_full_hr', 'test_full_ndcg'):
            record[column] = mine[column].mean()
        floor, ceiling = base.get((left_out, 'itempop')), base.get((left_out, 'central'))
        if floor and ceiling:
            for protocol, column in (('sampled', 'test_hr'), ('full', 'test_full_hr')):
                gap = ceiling[column] - floor[column]
                record[f'gap_{protocol}'] = ((record[column] - floor[column]) / gap
                                             if gap > 0 else float('nan'))
        out.append(record)
    return out


TITLES = {'filmtrust': 'FilmTrust', 'lastfm_2k': 'LastFM-2K', 'amazon_video': 'Amazon-Video',
          'synthetic': 'generated (1,000 x 1,000)'}


def _gap(value, floor, ceiling) -> str:
    if not (floor and ceiling) or ceiling <= floor:
        return '—'
    return f'{(value - floor) / (ceiling - floor):.2f}'


def report_lines(root: pathlib.Path, recipe_rows: pd.DataFrame) -> list[str]:
    """The transfer tables (markdown)."""
    runs, base = collect(root), baselines(root, recipe_rows)
    lines = ['### Every candidate, seed 0', '',
             '| dataset | recipe | valid HR@10 f (chooses) | test HR@10 s | test HR@10 f '
             '| gap closed f |', '|---|---|---|---|---|---|']
    for dataset in DATASETS:
        floor, ceiling = base.get((dataset, 'itempop')), base.get((dataset, 'central'))
        for label, record in (('popularity', floor), ('central NeuMF', ceiling)):
            if record:
                lines.append(f'| {TITLES[dataset]} | {label} ({record["n"]} seeds) | | '
                             f'{record["test_hr"]:.4f} | {record["test_full_hr"]:.4f} | |')
        mine = runs[(runs.dataset == dataset) & (runs.seed == 0)] if len(runs) else runs
        for candidate in CANDIDATES:
            row = mine[mine.candidate == candidate.name] if len(mine) else mine
            if len(row):
                r = row.iloc[0]
                lines.append(
                    f'| {TITLES[dataset]} | {candidate.name} | {r.valid_full_hr:.4f} | '
                    f'{r.test_hr:.4f} | {r.test_full_hr:.4f} | '
                    f'{_gap(r.test_full_hr, floor and floor["test_full_hr"], ceiling and ceiling["test_full_hr"])} |')
    lines += ['', '### Leave one dataset out', '',
              '| left out | chosen on | recipe chosen | seeds | test HR@10 s | gap closed s '
              '| test HR@10 f | gap closed f | counted |', '|---|---|---|---|---|---|---|---|---|']
    for r in leave_one_out(runs, base) if len(runs) else []:
        lines.append(
            f'| {TITLES[r["left_out"]]} | {", ".join(TITLES[d] for d in r["chosen_on"])} | '
            f'{r["choice"]} | {r["seeds"]} | {r["test_hr"]:.4f} | '
            f'{r.get("gap_sampled", float("nan")):.2f} | {r["test_full_hr"]:.4f} | '
            f'{r.get("gap_full", float("nan")):.2f} | {"yes" if r["counted"] else "no"} |')
    lines += ['', f'### `--preset=auto` (`{CHOSEN.name}`) over seeds', '',
              '| dataset | seeds | test HR@10 s | gap closed s | test HR@10 f | gap closed f |',
              '|---|---|---|---|---|---|']
    for dataset in DATASETS:
        mine = runs[(runs.dataset == dataset) & (runs.candidate == CHOSEN.name)] if len(
            runs) else runs
        floor, ceiling = base.get((dataset, 'itempop')), base.get((dataset, 'central'))
        if not len(mine) or not (floor and ceiling):
            continue
        cells = []
        for column in ('test_hr', 'test_full_hr'):
            mean, std = mine[column].mean(), mine[column].std(ddof=1) if len(mine) > 1 else 0.0
            spread = f' ± {std:.4f}' if len(mine) > 1 else ''
            cells += [f'{mean:.4f}{spread}', _gap(mean, floor[column], ceiling[column])]
        lines.append(f'| {TITLES[dataset]} | {len(mine)} | {" | ".join(cells)} |')
    return lines + ['', 'Recipes: ' + '; '.join(f'`{c.name}`: {c.description}'
                                                 for c in CANDIDATES) + '.']
