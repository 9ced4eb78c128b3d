"""The transfer study: which recipe to use on data nobody tuned for.

Candidate recipes run on FilmTrust, LastFM-2K, Amazon-Video and two
generated logs, one of short and one of long histories, each with a
validation item, 10% of users held out and both protocols, as the recipe
study (`study.recipe_plan`). Leave one dataset out: the recipe is chosen on
the other datasets' validation items, never on a test item, and measured on
the one left out. A candidate's training negatives may follow the data by
the rule of `recipes.auto_negatives`. A `Rule` candidate picks one of two
recipes by the data's interactions per user; it runs nothing of its own: on
each dataset it is the run of the recipe it picks there. A second rule is
the first run for `recipes.AUTO_VALIDATED_ROUNDS` rounds; its recipes run
only where it picks them.

Where a candidate's settings on a paper dataset equal that dataset's tuned
preset in everything that shapes the training users' model, the recipe
study's runs of the preset (docs/recipe_runs.csv) are its further seeds
(`same_as_tuned`); its seed 0 is still run here, for its validation score.

`launch/run_study.py --plan=transfer` runs it; `launch/report_study.py
--plan=transfer` writes the tables (docs/RESULTS.md, "Transfer") and keeps
every run's selected figures in docs/transfer_runs.csv, so the tables can be
rewritten after the run folders are gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import pathlib
from typing import Any

import numpy as np
import pandas as pd

from tff_fedrecgel.launch import study
from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel import tasks

ROUNDS = 100
SEEDS = 3
BASELINES = ('itempop', 'central')
CENTRAL_ROUNDS = 30


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset of the study: a task, and the options of generated data."""

    key: str
    task: str
    title: str
    options: Mapping[str, float] = dataclasses.field(default_factory=dict)
    full_every: int = 5

    def flags(self) -> tuple[str, ...]:
        """The data flags of its options (they are named as the options)."""
        return tuple(f'--{name}={value:g}' for name, value in self.options.items())


DATASETS = (
    *(Dataset(name, name, title, full_every=study.RECIPE_FULL_EVERY[name])
      for name, title in (('filmtrust', 'FilmTrust'), ('lastfm_2k', 'LastFM-2K'),
                          ('amazon_video', 'Amazon-Video'))),
    Dataset('synthetic', 'synthetic', 'generated, short histories',
            {'num_users': 1000, 'num_items': 1000}),
    Dataset('synthetic_long', 'synthetic', 'generated, long histories',
            {'num_users': 1000, 'num_items': 2000, 'mean_interactions': 100}),
)
KEYS = tuple(d.key for d in DATASETS)
TITLES = {d.key: d.title for d in DATASETS}


def get_dataset(key: str) -> Dataset:
    return next(d for d in DATASETS if d.key == key)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A recipe: settings over the paper's protocol, and optionally training
    negatives from the data (`negatives_per_user` / interactions per user)."""

    name: str
    description: str
    settings: Mapping[str, Any]
    negatives_per_user: float | None = None
    rounds: int = ROUNDS

    def longer(self, rounds: int) -> 'Candidate':
        """The same recipe run for `rounds` rounds (its round chosen on the
        validation item, as every run of the study)."""
        return dataclasses.replace(self, name=f'{self.name}r{rounds}', rounds=rounds,
                                   description=f'{self.description}, {rounds} rounds')

    def settings_for(self, profile: recipes.DataProfile) -> dict[str, Any]:
        out = dict(self.settings)
        if self.negatives_per_user is not None:
            out['num_negatives'] = recipes.auto_negatives(profile, self.negatives_per_user)
        return out

    def run_flags(self, profile: recipes.DataProfile) -> tuple[str, ...]:
        return ('--preset=paper', *(f'--{k}={v:g}' if isinstance(v, float) else f'--{k}={v}'
                                    for k, v in self.settings_for(profile).items()))


@dataclasses.dataclass(frozen=True)
class Rule:
    """A candidate that is one of two recipes by the data's history length."""

    name: str
    short: Candidate
    long: Candidate
    threshold: float

    @property
    def description(self) -> str:
        return (f'`{self.short.name}` below {self.threshold:g} interactions per user, '
                f'else `{self.long.name}`')

    def pick(self, profile: recipes.DataProfile) -> Candidate:
        return self.short if profile.interactions_per_user < self.threshold else self.long


GRADIENT = Candidate(
    f'n{recipes.AUTO_GRADIENT_NEGATIVES:g}',
    f'server Adam 0.01, 20% of users, negatives {recipes.AUTO_GRADIENT_NEGATIVES:g} / '
    'interactions per user', recipes.AUTO_GRADIENT, recipes.AUTO_GRADIENT_NEGATIVES)
EPOCHS = Candidate(
    f'd5n{recipes.AUTO_EPOCHS_NEGATIVES:g}',
    'five local epochs uploading the change, server Adam 0.003, negatives '
    f'{recipes.AUTO_EPOCHS_NEGATIVES:g} / interactions per user', recipes.AUTO_EPOCHS,
    recipes.AUTO_EPOCHS_NEGATIVES)
CANDIDATES = (GRADIENT, EPOCHS)
# The rule `--preset=auto` is (`recipes.auto_recipe`), then the same with a
# validation item's longer runs (they run only where the rule picks them).
# Last: on a tie the plain recipe, then the shorter runs, are chosen.
_LONG = recipes.AUTO_VALIDATED_ROUNDS
LONG_CANDIDATES = _LONG_GRADIENT, _LONG_EPOCHS = tuple(c.longer(_LONG) for c in CANDIDATES)
RULES = (Rule(f'h{recipes.AUTO_LONG_HISTORY:g}', EPOCHS, GRADIENT, recipes.AUTO_LONG_HISTORY),
         Rule(f'h{recipes.AUTO_LONG_HISTORY:g}r{_LONG}', _LONG_EPOCHS, _LONG_GRADIENT,
              recipes.AUTO_LONG_HISTORY))
CHOICES = (*CANDIDATES, *RULES)


def profile_of(dataset: Dataset, datasets_dir: pathlib.Path) -> recipes.DataProfile:
    """The data profile of a dataset of the study (reads its split)."""
    task = tasks.get_task(dataset.task)
    data_dir = None if task.raw_file is None else datasets_dir / dataset.task
    return recipes.DataProfile.of(task.load_split(data_dir=data_dir, **dataset.options))


def same_as_tuned(dataset: Dataset, candidate: Candidate,
                  profile: recipes.DataProfile) -> bool:
    """Whether `candidate` on `dataset` trains the training users' model as the
    dataset's tuned preset does: every setting equal, except the preset's name
    and, with persistent user state, the reconstruction steps (they only
    build the embeddings of users never seen in training)."""
    spec = tasks.get_task(dataset.task)
    if not spec.tuned or dataset.options:
        return False
    mine = run_settings.settings(dataset.task, preset=recipes.PAPER,
                                 **candidate.settings_for(profile))
    tuned = run_settings.settings(dataset.task, preset=recipes.TUNED)
    ignored = {'preset'} | ({'reconstruction_steps'} if mine.local_state == 'persistent'
                            else set())
    return all(getattr(mine, f.name) == getattr(tuned, f.name)
               for f in dataclasses.fields(run_settings.Settings) if f.name not in ignored)


def transfer_plan(profiles: Mapping[str, recipes.DataProfile], seeds: int = SEEDS,
                  datasets: Sequence[Dataset] = DATASETS) -> list[study.Run]:
    """Every candidate on every dataset at seed 0; the recipe `--preset=auto`
    picks there on more seeds (unless the recipe study has them); the
    generated logs' floor and ceiling."""
    runs = []
    for dataset in datasets:
        profile = profiles[dataset.key]
        common = dict(dataset=dataset.task, validation=True,
                      heldout_users=study.RECIPE_HELDOUT, eval_protocol='both',
                      rounds_per_full_eval=dataset.full_every, total_rounds=ROUNDS)
        auto = RULES[0].pick(profile)
        for seed in range(seeds):
            for candidate in CANDIDATES:
                if seed and (candidate != auto or same_as_tuned(dataset, candidate, profile)):
                    continue  # Seed 0 chooses; more seeds measure the choice.
                runs.append(_candidate_run(dataset, candidate, seed, profile, common))
            runs.append(_candidate_run(dataset, RULES[-1].pick(profile), seed, profile, common))
            if dataset.options:
                # As the recipe study's: the paper's settings (4 negatives).
                paper = (*dataset.flags(), '--preset=paper')
                runs.append(study.Run(name=f'{dataset.key}/itempop_seed{seed}',
                                      method='itempop', seed=seed, extra=paper, **common))
                runs.append(study.Run(
                    name=f'{dataset.key}/central_seed{seed}', method='central', seed=seed,
                    extra=paper, **{**common, 'total_rounds': CENTRAL_ROUNDS,
                                    'rounds_per_full_eval': 1}))
    # Seed 0 everywhere first; FilmTrust, which neither chooses nor counts, last.
    return sorted(runs, key=lambda run: (run.dataset == 'filmtrust', run.seed))


def _candidate_run(dataset: Dataset, candidate: Candidate, seed: int,
                   profile: recipes.DataProfile, common: Mapping[str, Any]) -> study.Run:
    return study.Run(name=f'{dataset.key}/{candidate.name}_seed{seed}', method='fedrecgel',
                     seed=seed, extra=(*dataset.flags(), *candidate.run_flags(profile)),
                     **{**common, 'total_rounds': candidate.rounds})


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


def collect(root: pathlib.Path, kept: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every finished run's selections (`selected`), one row per run: the
    run folders under `root`, then the rows of `kept` (runs reported before)
    whose folders are gone."""
    rows = []
    for dataset in KEYS:
        for name in (*(c.name for c in CANDIDATES + LONG_CANDIDATES), *BASELINES):
            for path in sorted((root / dataset).glob(f'{name}_seed*/metrics.csv')):
                # An unfinished run (no summary yet) may not have evaluated.
                values = (path.parent / 'summary.json').exists() and selected(path)
                if values:
                    seed = int(path.parent.name.rsplit('_seed', 1)[1])
                    rows.append({'name': f'{dataset}/{path.parent.name}', 'dataset': dataset,
                                 'candidate': name, 'seed': seed, **values})
    runs = pd.DataFrame(rows)
    if kept is not None and len(kept):
        kept = kept[~kept['name'].isin(runs['name'] if len(runs) else [])]
        runs = pd.concat([runs, kept], ignore_index=True)
    return runs.sort_values('name', ignore_index=True) if len(runs) else runs


def with_tuned_seeds(runs: pd.DataFrame, recipe_rows: pd.DataFrame,
                     profiles: Mapping[str, recipes.DataProfile]) -> pd.DataFrame:
    """`runs` plus, for each candidate equal to a paper dataset's tuned
    preset (`same_as_tuned`), the recipe study's FedRecGEL runs of that
    preset on the seeds not run here (test figures; no validation score)."""
    extra = []
    tuned = recipe_rows[(recipe_rows.kind == 'tuned') & (recipe_rows.method == 'fedrecgel')]
    for dataset in DATASETS:
        if dataset.key not in profiles:
            continue
        for candidate in CANDIDATES:
            if not same_as_tuned(dataset, candidate, profiles[dataset.key]):
                continue
            have = set(runs[(runs.dataset == dataset.key) & (runs.candidate == candidate.name)]
                       .seed) if len(runs) else set()
            for _, r in tuned[tuned.dataset == dataset.key].iterrows():
                if int(r.seed) not in have:
                    extra.append({'name': r['name'], 'dataset': dataset.key,
                                  'candidate': candidate.name, 'seed': int(r.seed),
                                  'test_hr': r['valid:test/hr@10'],
                                  'test_full_hr': r['valid_full:test_full/hr@10'],
                                  'test_full_ndcg': r['valid_full:test_full/ndcg@10']})
    return pd.concat([runs, pd.DataFrame(extra)], ignore_index=True) if extra else runs


def baselines(runs: pd.DataFrame, recipe_rows: pd.DataFrame) -> dict[tuple, dict]:
    """Floor and ceiling per dataset: test HR@10 (both protocols) at the
    round chosen on the validation item, mean over seeds (the recipe study's
    for the paper datasets, this study's for the generated logs)."""
    out = {}
    for dataset in DATASETS:
        for method in BASELINES:
            if dataset.options:
                rows = runs[(runs.dataset == dataset.key) & (runs.candidate == method)] if len(
                    runs) else runs
                columns = ('test_hr', 'test_full_hr')
            else:
                rows = recipe_rows[(recipe_rows.dataset == dataset.key)
                                   & (recipe_rows.kind == method)]
                columns = ('valid:test/hr@10', 'valid_full:test_full/hr@10')
            if len(rows):
                out[(dataset.key, method)] = {'test_hr': rows[columns[0]].mean(),
                                              'test_full_hr': rows[columns[1]].mean(),
                                              'n': len(rows)}
    return out


def counted(base: Mapping, dataset: str) -> bool:
    """Whether central beats popularity under full ranking on `dataset` (else
    the dataset says nothing of learning, and neither chooses nor counts)."""
    floor, ceiling = base.get((dataset, 'itempop')), base.get((dataset, 'central'))
    return bool(floor and ceiling and ceiling['test_full_hr'] > floor['test_full_hr'])


def runs_of(runs: pd.DataFrame, choice, dataset: str,
            profiles: Mapping[str, recipes.DataProfile]) -> pd.DataFrame:
    """The runs of a candidate or rule on `dataset` (a rule's: its pick's)."""
    if isinstance(choice, Rule):
        choice = choice.pick(profiles[dataset])
    if not len(runs):
        return runs
    return runs[(runs.dataset == dataset) & (runs.candidate == choice.name)]


def validation_scores(runs: pd.DataFrame, profiles: Mapping) -> pd.DataFrame:
    """Seed 0's validation HR@10 under full ranking, choice x dataset."""
    table = {}
    for choice in CHOICES:
        for dataset in profiles:
            mine = runs_of(runs, choice, dataset, profiles)
            mine = mine[(mine.seed == 0) & mine.valid_full_hr.notna()] if len(mine) else mine
            if len(mine):
                table[(choice.name, dataset)] = float(mine.valid_full_hr.iloc[0])
    if not table:
        return pd.DataFrame()
    return pd.Series(table).unstack().reindex([c.name for c in CHOICES])


def leave_one_out(runs: pd.DataFrame, base: Mapping,
                  profiles: Mapping[str, recipes.DataProfile]) -> list[dict]:
    """For each dataset left out: the choice (candidate or rule) that scores
    best on the others' validation items (each dataset's validation HR@10
    under full ranking over the best choice's there, averaged; the first in
    `CHOICES` on a tie), and its test figures on the one left out."""
    scores = validation_scores(runs, profiles)
    if scores.empty:
        return []
    needed = [d for d in KEYS if counted(base, d) and d in scores.columns]
    complete = scores[needed].dropna()
    relative = complete / complete.max(axis=0)
    by_name = {c.name: c for c in CHOICES}
    out = []
    for left_out in [d for d in KEYS if d in scores.columns]:
        chooses = [d for d in needed if d != left_out]
        if relative.empty or not chooses:
            continue
        choice = by_name[relative[chooses].mean(axis=1).idxmax()]
        mine = runs_of(runs, choice, left_out, profiles)
        picked = choice.pick(profiles[left_out]).name if isinstance(choice, Rule) else None
        record = {'left_out': left_out, 'chosen_on': chooses, 'choice': choice.name,
                  'picked': picked, 'seeds': len(mine), 'counted': counted(base, left_out)}
        for column in ('test_hr', 'test_full_hr'):
            record[column] = mine[column].mean()
            record[f'{column}_sd'] = mine[column].std(ddof=1) if len(mine) > 1 else 0.0
        floor, ceiling = base.get((left_out, 'itempop')), base.get((left_out, 'central'))
        for protocol, column in (('sampled', 'test_hr'), ('full', 'test_full_hr')):
            record[f'gap_{protocol}'] = gap(record[column], floor, ceiling, column)
        out.append(record)
    return out


def gap(value: float, floor: Mapping | None, ceiling: Mapping | None, column: str) -> float:
    """(value - floor) / (ceiling - floor) on `column`; NaN without a gap."""
    if not (floor and ceiling) or ceiling[column] <= floor[column]:
        return float('nan')
    return (value - floor[column]) / (ceiling[column] - floor[column])


def _cell(value: float) -> str:
    return '—' if value is None or np.isnan(value) else f'{value:.2f}'


def report_lines(runs: pd.DataFrame, recipe_rows: pd.DataFrame,
                 profiles: Mapping[str, recipes.DataProfile]) -> list[str]:
    """The transfer tables (markdown).

    Args:
      runs: `collect`'s rows.
      recipe_rows: The recipe study's rows (docs/recipe_runs.csv): the paper
        datasets' floor, ceiling and tuned runs.
      profiles: Each dataset's profile, by key.
    """
    runs = with_tuned_seeds(runs, recipe_rows, profiles)
    base = baselines(runs, recipe_rows)
    lines = ['### Every candidate, seed 0', '',
             '| dataset | interactions per user | recipe | valid HR@10 f (chooses) '
             '| test HR@10 s | test HR@10 f | gap closed f |',
             '|---|---|---|---|---|---|---|']
    for key in KEYS:
        if key not in profiles:
            continue
        history = f'{profiles[key].interactions_per_user:.1f}'
        floor, ceiling = base.get((key, 'itempop')), base.get((key, 'central'))
        for label, record in (('popularity', floor), ('central NeuMF', ceiling)):
            if record:
                seeds = f'{record["n"]} seed{"s" * (record["n"] > 1)}'
                lines.append(f'| {TITLES[key]} | {history} | {label} ({seeds}) | | '
                             f'{record["test_hr"]:.4f} | {record["test_full_hr"]:.4f} | |')
        for candidate in CANDIDATES + LONG_CANDIDATES:
            row = runs_of(runs, candidate, key, profiles)
            row = row[(row.seed == 0) & row.valid_full_hr.notna()] if len(row) else row
            if len(row):
                r = row.iloc[0]
                lines.append(
                    f'| {TITLES[key]} | {history} | {candidate.name} | {r.valid_full_hr:.4f} | '
                    f'{r.test_hr:.4f} | {r.test_full_hr:.4f} | '
                    f'{_cell(gap(r.test_full_hr, floor, ceiling, "test_full_hr"))} |')
    lines += ['', '### Leave one dataset out', '',
              '| left out | chosen on | choice (recipe there) | seeds | test HR@10 s '
              '| gap closed s | test HR@10 f | gap closed f | counted |',
              '|---|---|---|---|---|---|---|---|---|']
    for r in leave_one_out(runs, base, profiles):
        choice = f'{r["choice"]} ({r["picked"]})' if r['picked'] else r['choice']
        if not r['seeds']:  # Chosen, but its runs there have not finished yet.
            chosen_on = ', '.join(TITLES[d] for d in r['chosen_on'])
            lines.append(f'| {TITLES[r["left_out"]]} | {chosen_on} | {choice} | 0 | '
                         'not run yet | | | | |')
            continue
        spread = {c: f' ± {r[c + "_sd"]:.4f}' if r['seeds'] > 1 else ''
                  for c in ('test_hr', 'test_full_hr')}
        lines.append(
            f'| {TITLES[r["left_out"]]} | {", ".join(TITLES[d] for d in r["chosen_on"])} | '
            f'{choice} | {r["seeds"]} | {r["test_hr"]:.4f}{spread["test_hr"]} | '
            f'{_cell(r["gap_sampled"])} | {r["test_full_hr"]:.4f}{spread["test_full_hr"]} | '
            f'{_cell(r["gap_full"])} | {"yes" if r["counted"] else "no"} |')
    return lines + ['', 'Recipes: ' + '; '.join(f'`{c.name}`: {c.description}'
                                                 for c in CHOICES) + '.']
