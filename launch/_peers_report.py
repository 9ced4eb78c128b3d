"""The peers study's tables (launch/report_study.py --plan=peers).

The peer runs and the floors the plan runs (popularity, each user's own
history first) come from the study folder (and `docs/peers_runs.csv` for
runs whose folders are gone); the ceiling, FedRecGEL's rows and popularity's
other seeds come from the recipe study (`docs/recipe_runs.csv`), whose runs
use the same split for the same seed (a validation item, 10% of the users
held out). Every figure is a test metric at the round chosen on the
validation item.
"""

from __future__ import annotations

import math
import pathlib

import pandas as pd

from tff_fedrecgel.launch import _recipe_report
from tff_fedrecgel.launch import _report
from tff_fedrecgel.launch import peers_study
from tff_fedrecgel.launch import study

BEGIN, END = '<!-- peers-tables:begin -->', '<!-- peers-tables:end -->'
# (kind, method, label) of the rows read from the recipe study.
REFERENCE = (('itempop', 'itempop', 'popularity (floor)'),
             ('history', 'history', 'own history, then popularity (floor)'),
             ('central', 'central', 'central NeuMF (ceiling)'),
             ('paper', 'fedrecgel', 'FedRecGEL, paper settings'),
             ('tuned', 'fedncf', 'FedNCF, tuned preset'),
             ('tuned', 'fedrecgel', 'FedRecGEL, tuned preset'))
# The FedRecGEL every method is paired with.
BASELINE = ('tuned', 'fedrecgel')
COLUMNS = (('valid', 'test/hr@10', 'HR@10 s'),
           ('valid', 'test/ndcg@10', 'NDCG@10 s'),
           ('valid_full', 'test_full/hr@10', 'HR@10 f'),
           ('valid_full', 'test_full/ndcg@10', 'NDCG@10 f'),
           ('valid_full', 'heldout_full/hr@10', 'held-out HR@10 f'))
PAIRED = (('valid', 'test/hr@10', 'HR@10 s'), ('valid_full', 'test_full/hr@10', 'HR@10 f'),
          ('valid_full', 'test_full/ndcg@10', 'NDCG@10 f'))
_REFERENCE_KINDS = ('itempop', 'central', 'paper', 'tuned')


def combine(peers: pd.DataFrame, recipe: pd.DataFrame) -> pd.DataFrame:
    """The peer runs and the recipe study's reference runs, one row per run
    (a run in both, such as a popularity seed, is taken from `peers`)."""
    reference = recipe[recipe.kind.isin(_REFERENCE_KINDS)]
    both = pd.concat([peers, reference], ignore_index=True)
    return both.drop_duplicates('name', keep='first').reset_index(drop=True)


def _rows(runs: pd.DataFrame, dataset: str, kind: str, method: str) -> pd.DataFrame:
    return _recipe_report._runs(runs, dataset, kind, method)  # pylint: disable=protected-access


def _row_specs(runs: pd.DataFrame, dataset: str):
    for kind, method, label in REFERENCE:
        if kind == 'paper' and not ((runs.dataset == dataset) & (runs.kind == 'paper')).any():
            continue  # The tuned preset is the paper's settings here.
        yield kind, method, label
    for kind, method in _compared():
        yield kind, method, f'{_report.LABELS[method]}, {peers_study.settings_source(method)}'
    for method in peers_study.SEARCHED:
        yield 'searched', method, f'{_report.LABELS[method]}, searched (equal tuning)'


def _compared() -> list[tuple[str, str]]:
    """(kind, method) of the rows the plan runs: each peer, then FedSAM's control."""
    return [('peer', m) for m in peers_study.PEER_SETTINGS] + [
        ('control', peers_study.CONTROL_METHOD)]


def _closed(runs: pd.DataFrame, dataset: str, kind: str, method: str) -> str:
    """The share of the full-ranking gap from popularity to the central model;
    '—' for those two, and where the central model does not beat popularity."""
    column = 'valid_full:test_full/hr@10'
    means = [_recipe_report._stats(_rows(runs, dataset, k, m).get(  # pylint: disable=protected-access
        column, pd.Series(dtype=float)))[0] for k, m in (('itempop', 'itempop'),
                                                          ('central', 'central'))]
    if kind in ('itempop', 'central') or not means[1] > means[0]:
        return '—'
    closure = _recipe_report.gap_closure(runs, dataset, kind, method, column=column)
    return '—' if math.isnan(closure) else f'{closure:.2f}'


def dataset_table(runs: pd.DataFrame, dataset: str) -> list[str]:
    """Every method of one dataset beside the floor and the ceiling."""
    header = ' | '.join(h for _, _, h in COLUMNS)
    lines = [f'### {_report.TITLES[dataset]}', '',
             f'| method | {header} | gap closed f | s/round | seeds |',
             '|---|' + '---|' * (len(COLUMNS) + 3)]
    for kind, method, label in _row_specs(runs, dataset):
        chosen = _rows(runs, dataset, kind, method)
        if not len(chosen):
            continue
        cells = [_report.cell(*_recipe_report._stats(chosen[f'{s}:{m}']))  # pylint: disable=protected-access
                 if f'{s}:{m}' in chosen else '—' for s, m, _ in COLUMNS]
        closed = _closed(runs, dataset, kind, method)
        per_round = chosen['seconds_per_round'].median()
        lines.append(f'| {label} | {" | ".join(cells)} | {closed} | {per_round:.2f} '
                     f'| {len(chosen)} |')
    return lines + ['']


def _paired_cells(base: pd.DataFrame, other: pd.DataFrame) -> tuple[list[str], int]:
    """`base` minus `other` (indexed by seed) in points, mean ± standard error,
    per `PAIRED` column; and the number of seeds both have."""
    seeds = sorted(set(base.index) & set(other.index))
    cells = []
    for selection, metric, _ in PAIRED:
        diff = _recipe_report.paired_points(base, other, f'{selection}:{metric}') if seeds else None
        if diff is None:
            cells.append('—')
            continue
        error = f' ± {diff.std(ddof=1) / math.sqrt(len(diff)):.2f}' if len(diff) > 1 else ''
        cells.append(f'{diff.mean():+.2f}{error}')
    return cells, len(seeds)


def paired_lines(runs: pd.DataFrame) -> list[str]:
    """FedRecGEL (tuned preset) minus each compared method, and FedSAM minus
    its control, paired by seed: mean differences in points, standard errors."""
    head = '| ' + ' | '.join(h for _, _, h in PAIRED) + ' | seeds |'
    rule = '|---|---|' + '---|' * (len(PAIRED) + 1)
    lines = ['### FedRecGEL (tuned preset) minus each method, paired by seed (points, '
             'mean ± standard error)', '', '| dataset | method ' + head, rule]
    control = ['### FedSAM minus the same local training without SAM, paired by seed '
               '(points, mean ± standard error)', '', '| dataset | rows ' + head, rule]
    for dataset in study.DATASETS:
        title = _report.TITLES[dataset]
        base = _rows(runs, dataset, *BASELINE).set_index('seed')
        for kind, method in _compared():
            cells, seeds = _paired_cells(base, _rows(runs, dataset, kind, method).set_index('seed'))
            if seeds:
                label = _report.LABELS[method] + (' (no SAM)' if kind == 'control' else '')
                lines.append(f'| {title} | {label} | {" | ".join(cells)} | {seeds} |')
        cells, seeds = _paired_cells(
            _rows(runs, dataset, 'peer', 'fedsam').set_index('seed'),
            _rows(runs, dataset, 'control', peers_study.CONTROL_METHOD).set_index('seed'))
        if seeds:
            control.append(f'| {title} | FedSAM − FedNCF | {" | ".join(cells)} | {seeds} |')
    return lines + [''] + (control + [''] if len(control) > 4 else []) + _searched_lines(runs)


def _searched_lines(runs: pd.DataFrame) -> list[str]:
    """At equal tuning: searched FedRecGEL minus each searched method,
    paired by seed (none until a pair has run)."""
    head = '| ' + ' | '.join(h for _, _, h in PAIRED) + ' | seeds |'
    lines = ['### At equal tuning: FedRecGEL minus each method, each searched with '
             'the same budget, paired by seed (points, mean ± standard error)', '',
             '| dataset | method ' + head, '|---|---|' + '---|' * (len(PAIRED) + 1)]
    for dataset in study.DATASETS:
        base = _rows(runs, dataset, 'searched', 'fedrecgel').set_index('seed')
        for method in peers_study.SEARCHED[1:]:
            cells, seeds = _paired_cells(
                base, _rows(runs, dataset, 'searched', method).set_index('seed'))
            if seeds:
                lines.append(f'| {_report.TITLES[dataset]} | {_report.LABELS[method]} | '
                             f'{" | ".join(cells)} | {seeds} |')
    return lines + [''] if len(lines) > 4 else []


def tables_block(runs: pd.DataFrame) -> str:
    """The generated block of docs/RESULTS.md's peers section."""
    lines = [BEGIN, '<!-- Generated by launch/report_study.py --plan=peers; edit the '
             'script, not this block. -->', '']
    for dataset in study.DATASETS:
        if ((runs.dataset == dataset) & (runs.kind == 'peer')).any():
            lines += dataset_table(runs, dataset)
    lines += paired_lines(runs)
    return '\n'.join([*lines, END])


def collect(root: pathlib.Path, kept_csv: pathlib.Path) -> pd.DataFrame:
    """The peer runs under `root`, and those of `kept_csv` whose folders are gone."""
    runs = study.collect_recipe(root) if root.exists() else pd.DataFrame()
    if kept_csv.exists():
        kept = pd.read_csv(kept_csv)
        if len(runs):
            kept = kept[~kept['name'].isin(runs['name'])]
        runs = pd.concat([runs, kept], ignore_index=True)
    return runs
