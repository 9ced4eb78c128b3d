"""The recipe study's tables and figure (launch/report_study.py --plan=recipe).

Every number is a mean over seeds of test metrics at a selected round:
`valid` selects on the validation item's HR@10 under the sampled protocol,
`valid_full` under full ranking, `test` on the test item's (the authors'
selection). Held-out users are measured at the round their run selected.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pandas as pd

from tff_fedrecgel.launch import _report
from tff_fedrecgel.launch import study

BEGIN, END = '<!-- recipe-tables:begin -->', '<!-- recipe-tables:end -->'
TITLES = _report.TITLES
ROWS = (('itempop', 'itempop', 'popularity (floor, federated counts)'),
        ('central', 'central', 'central NeuMF (non-federated ceiling)'),
        ('paper', 'fedncf', 'FedNCF, paper protocol'),
        ('paper', 'fedrecgel', 'FedRecGEL, paper protocol'),
        ('tuned', 'fedncf', 'FedNCF, tuned preset'),
        ('tuned', 'fedrecgel', 'FedRecGEL, tuned preset'))
COLUMNS = (  # (selection, recorded metric, header)
    ('test', 'test/hr@10', 'HR@10 s, test-sel.'),
    ('valid', 'test/hr@10', 'HR@10 s'),
    ('valid', 'test/ndcg@10', 'NDCG@10 s'),
    ('valid_full', 'test_full/hr@10', 'HR@10 f'),
    ('valid_full', 'test_full/ndcg@10', 'NDCG@10 f'),
    ('valid_full', 'test_full/mrr', 'MRR f'),
    ('valid_full', 'heldout_full/hr@10', 'held-out HR@10 f'),
)


def _stats(values: pd.Series) -> tuple[float, float, int]:
    values = values.dropna()
    if not len(values):
        return math.nan, math.nan, 0
    std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    return float(values.mean()), std, len(values)


def _runs(runs: pd.DataFrame, dataset: str, kind: str, method: str) -> pd.DataFrame:
    chosen = runs[(runs.dataset == dataset) & (runs.method == method)]
    if kind == 'paper' and not (chosen.kind == 'paper').any():
        kind = 'tuned'  # The task's tuned preset is the paper's protocol.
    return chosen[chosen.kind == kind]


def gap_closure(runs: pd.DataFrame, dataset: str, kind: str, method: str,
                column: str = 'valid:test/hr@10') -> float:
    """(method - popularity) / (central - popularity), seed means."""
    means = {key: _stats(_runs(runs, dataset, k, m).get(column, pd.Series(dtype=float)))[0]
             for key, (k, m) in (('x', (kind, method)), ('floor', ('itempop', 'itempop')),
                                 ('ceiling', ('central', 'central')))}
    gap = means['ceiling'] - means['floor']
    return (means['x'] - means['floor']) / gap if gap else math.nan


def dataset_table(runs: pd.DataFrame, dataset: str) -> list[str]:
    """Floor, ceiling, paper and tuned rows of one dataset."""
    header = ' | '.join(h for _, _, h in COLUMNS)
    lines = [f'### {TITLES[dataset]}', '',
             f'| method | {header} | gap closed (HR@10 s) | seeds |',
             '|---|' + '---|' * (len(COLUMNS) + 2)]
    for kind, method, label in ROWS:
        chosen = _runs(runs, dataset, kind, method)
        if not len(chosen) or (kind == 'paper' and not (
                (runs.dataset == dataset) & (runs.kind == 'paper')).any()):
            continue
        cells = []
        for selection, metric, _ in COLUMNS:
            column = f'{selection}:{metric}'
            cells.append(_report.cell(*_stats(chosen[column])) if column in chosen else '—')
        closure = gap_closure(runs, dataset, kind, method)
        closed = '—' if kind in ('itempop', 'central') or math.isnan(closure) else (
            f'{closure:.2f}')
        lines.append(f'| {label} | {" | ".join(cells)} | {closed} | {len(chosen)} |')
    return lines + ['']


def paired_points(a: pd.DataFrame, b: pd.DataFrame, column: str) -> np.ndarray | None:
    """`a - b` in points on the seeds both have (frames indexed by seed);
    None if either lacks the column."""
    if column not in a or column not in b:
        return None
    seeds = sorted(set(a.index) & set(b.index))
    return 100 * np.array([a.loc[s, column] - b.loc[s, column] for s in seeds])


def paired_lines(runs: pd.DataFrame) -> list[str]:
    """FedRecGEL minus FedNCF under the tuned preset, paired by seed."""
    columns = (('test', 'test/hr@10', 'HR@10 s, test-sel.'),
               ('valid', 'test/hr@10', 'HR@10 s'),
               ('valid_full', 'test_full/hr@10', 'HR@10 f'),
               ('valid_full', 'test_full/ndcg@10', 'NDCG@10 f'),
               ('valid_full', 'heldout_full/hr@10', 'held-out HR@10 f'),
               ('valid_full', 'heldout_full/ndcg@10', 'held-out NDCG@10 f'))
    lines = ['### FedRecGEL minus FedNCF, tuned preset, paired by seed (points)', '',
             '| dataset | ' + ' | '.join(h for _, _, h in columns) + ' | seeds |',
             '|---|' + '---|' * (len(columns) + 1)]
    for dataset in study.DATASETS:
        a = _runs(runs, dataset, 'tuned', 'fedrecgel').set_index('seed')
        b = _runs(runs, dataset, 'tuned', 'fedncf').set_index('seed')
        seeds = sorted(set(a.index) & set(b.index))
        if not seeds:
            continue
        cells = []
        for selection, metric, _ in columns:
            diff = paired_points(a, b, f'{selection}:{metric}')
            if diff is None:
                cells.append('—')
                continue
            spread = f' ± {diff.std(ddof=1):.2f}' if len(diff) > 1 else ''
            wins = int((diff > 0).sum())
            cells.append(f'{diff.mean():+.2f}{spread} ({wins}/{len(diff)} up)')
        lines.append(f'| {TITLES[dataset]} | {" | ".join(cells)} | {len(seeds)} |')
    return lines + ['']


def sweep_lines(runs: pd.DataFrame) -> list[str]:
    """LastFM-2K's radii under the tuned preset."""
    sweep = runs[(runs.dataset == 'lastfm_2k') & (runs.kind.isin(['sweep', 'tuned']))
                 & runs.method.isin(['fedrecgel', 'fedncf'])]
    if not (sweep.kind == 'sweep').any():
        return []
    seeds = int(sweep[sweep.kind == 'sweep'].seed.max()) + 1
    sweep = sweep[sweep.seed < seeds]
    lines = ['### LastFM-2K, tuned preset: the SAM radii', '',
             f'Seeds 0-{seeds - 1} of each point; (0, 0) is FedNCF, (0.01, 0.01) the '
             'task\'s radii.', '',
             '| rho_sh | rho_ns | HR@10 s | HR@10 f | held-out HR@10 f | seeds |',
             '|---|---|---|---|---|---|']
    for (sh, ns), group in sorted(sweep.groupby(['rho_sh', 'rho_ns'])):
        cells = [_report.cell(*_stats(group[c])) if c in group else '—'
                 for c in ('valid:test/hr@10', 'valid_full:test_full/hr@10',
                           'valid_full:heldout_full/hr@10')]
        lines.append(f'| {sh:g} | {ns:g} | {" | ".join(cells)} | {len(group)} |')
    return lines + ['']


def splitfix_lines(runs: pd.DataFrame) -> list[str]:
    """LastFM-2K on the authors' tie rule, the paper's protocol alone."""
    fix = runs[runs.kind == 'splitfix']
    if fix.empty:
        return []
    authors = {'fedrecgel': study.AUTHORS_REFERENCE[('lastfm_2k', 'fedrecgel')],
               'fedncf': study.AUTHORS_REFERENCE[('lastfm_2k', 'fedncf')]}
    lines = ['### LastFM-2K on the authors\' tie rule (the paper\'s protocol)', '',
             '| method | best test round HR@10 / NDCG@10 | validation-selected | '
             'authors\' code | seeds |', '|---|---|---|---|---|']
    for method in ('fedrecgel', 'fedncf'):
        chosen = fix[fix.method == method]
        test = chosen[~chosen.name.str.contains('_valid_')]
        valid = chosen[chosen.name.str.contains('_valid_')]
        hr, ndcg = (_report.cell(*_stats(test[f'test:test/{m}@10'])) for m in ('hr', 'ndcg'))
        vhr = _report.cell(*_stats(valid['valid:test/hr@10'])) if len(valid) else '—'
        ref = authors[method]
        lines.append(f'| {method} | {hr} / {ndcg} | {vhr} | {ref[0]:.4f} / {ref[1]:.4f} '
                     f'({ref[2]}) | {len(test)} + {len(valid)} |')
    return lines + ['']


def _protocol_stats(runs: pd.DataFrame) -> list[tuple[float, float, int]]:
    """Best-test-round HR@10 and NDCG@10, then validation-selected ones, of
    runs named `*_valid_*` when chosen on the validation item."""
    test = runs[~runs.name.str.contains('_valid_')]
    valid = runs[runs.name.str.contains('_valid_')]
    empty = pd.Series(dtype=float)
    return [_stats(test.get('test:test/hr@10', empty)),
            _stats(test.get('test:test/ndcg@10', empty)),
            _stats(valid.get('valid:test/hr@10', empty)),
            _stats(valid.get('valid:test/ndcg@10', empty))]


def paper_protocol_lines(runs: pd.DataFrame, previous: pd.DataFrame | None) -> list[str]:
    """The floor and the ceiling beside every method of the paper study.

    The paper's protocol alone (sampled metrics, no users held out). The
    methods come from the paper study (`previous`, its docs/study_runs.csv);
    on LastFM-2K FedNCF and FedRecGEL come from the reruns on the authors'
    tie rule, the other methods from the paper study's older split.
    """
    base = runs[runs.kind.isin(['paperbase', 'splitfix'])]
    if base.empty:
        return []
    lines = ['### The paper\'s protocol: floor, ceiling and the paper\'s methods', '',
             'Sampled metrics, no users held out; one seed for the floor and the '
             'ceiling, the paper study\'s seeds for the methods. On LastFM-2K only '
             'FedNCF and FedRecGEL were rerun on the authors\' tie rule; the other '
             'methods are on the older split (251 of 1,600 test items differ).', '',
             '| dataset | method | best test round HR@10 / NDCG@10 | validation-selected '
             'HR@10 / NDCG@10 | gap closed (valid.) |', '|---|---|---|---|---|']
    for dataset in study.DATASETS:
        here = base[base.dataset == dataset]
        if here.empty:
            continue
        floor = _protocol_stats(here[(here.kind == 'paperbase') & (here.method == 'itempop')])
        ceiling = _protocol_stats(here[(here.kind == 'paperbase') & (here.method == 'central')])
        rows = [('popularity (floor)', floor, False), ('central (ceiling)', ceiling, False)]
        for method, label in _report.LABELS.items():
            fixed = here[(here.kind == 'splitfix') & (here.method == method)]
            if len(fixed):
                rows.append((f'{label} (tie rule fixed)', _protocol_stats(fixed), True))
            elif previous is not None:
                chosen = previous[(previous.dataset == dataset) & (previous.method == method)
                                  & ~previous.sweep & ~previous.probe & ~previous.long]
                if chosen.empty:
                    continue
                test, valid = chosen[~chosen.validation], chosen[chosen.validation]
                rows.append((label, [_stats(test.test_hr), _stats(test.test_ndcg),
                                     _stats(valid.valid_hr), _stats(valid.valid_ndcg)], True))
        gap = ceiling[2][0] - floor[2][0]
        for label, stats, is_method in rows:
            closure = '—'
            if is_method and gap and not math.isnan(gap) and not math.isnan(stats[2][0]):
                closure = f'{(stats[2][0] - floor[2][0]) / gap:.2f}'
            lines.append(f'| {TITLES[dataset]} | {label} | {_report.cell(*stats[0])} / '
                         f'{_report.cell(*stats[1])} | {_report.cell(*stats[2])} / '
                         f'{_report.cell(*stats[3])} | {closure} |')
    return lines + ['']


README_BEGIN = '<!-- readme-results:begin -->'
README_END = '<!-- readme-results:end -->'
_README_COLUMNS = (('itempop', 'itempop', 'popularity'), ('paper', 'fedrecgel', 'FedRecGEL, paper'),
                   ('tuned', 'fedrecgel', 'FedRecGEL, tuned'), ('central', 'central', 'central'))


def readme_block(runs: pd.DataFrame) -> str:
    """The README's one results table: test HR@10 sampled / full ranking."""
    lines = [README_BEGIN, '<!-- Generated by launch/report_study.py --plan=recipe from '
             'docs/recipe_runs.csv; edit the script, not this block. -->', '',
             '| dataset | ' + ' | '.join(h for *_, h in _README_COLUMNS) + ' |',
             '|---|' + '---|' * len(_README_COLUMNS)]
    for dataset in study.DATASETS:
        if not (runs.dataset == dataset).any():
            continue
        cells = []
        for kind, method, _ in _README_COLUMNS:
            chosen = _runs(runs, dataset, kind, method)
            sampled = _stats(chosen.get('valid:test/hr@10', pd.Series(dtype=float)))[0]
            full = _stats(chosen.get('valid_full:test_full/hr@10', pd.Series(dtype=float)))[0]
            cells.append('—' if math.isnan(sampled) else f'{sampled:.3f} / {full:.3f}')
        lines.append(f'| {TITLES[dataset]} | {" | ".join(cells)} |')
    return '\n'.join(lines + ['', README_END])


def tables_block(runs: pd.DataFrame, previous: pd.DataFrame | None = None) -> str:
    lines = [BEGIN, '<!-- Generated by launch/report_study.py --plan=recipe; edit the '
             'script, not this block. -->', '']
    for dataset in study.DATASETS:
        if (runs.dataset == dataset).any():
            lines += dataset_table(runs, dataset)
    lines += (paired_lines(runs) + sweep_lines(runs) + splitfix_lines(runs)
              + paper_protocol_lines(runs, previous))
    return '\n'.join(lines + [END])


def plot(root: pathlib.Path, runs: pd.DataFrame, images: pathlib.Path) -> list[str]:
    """recipe_hr10.png: test HR@10 per round, sampled and full ranking."""
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

    images.mkdir(parents=True, exist_ok=True)
    datasets = [d for d in study.DATASETS if (runs.dataset == d).any()]
    if not datasets:
        return []
    curves = (('itempop', 'itempop', 'popularity (floor)', 'tab:gray', '-'),
              ('paper', 'fedncf', 'FedNCF, paper', 'tab:blue', ':'),
              ('paper', 'fedrecgel', 'FedRecGEL, paper', 'tab:red', ':'),
              ('tuned', 'fedncf', 'FedNCF, tuned', 'tab:blue', '-'),
              ('tuned', 'fedrecgel', 'FedRecGEL, tuned', 'tab:red', '-'))
    fig, axes = plt.subplots(2, len(datasets), figsize=(5 * len(datasets), 7.6), squeeze=False)
    for col, dataset in enumerate(datasets):
        has_paper = ((runs.dataset == dataset) & (runs.kind == 'paper')).any()
        for row, column in enumerate(('test/hr@10', 'test_full/hr@10')):
            ax = axes[row, col]
            for kind, method, label, color, style in curves:
                if kind == 'paper' and not has_paper:
                    continue
                chosen = _runs(runs, dataset, kind, method)
                frames = [f[column].dropna() for f in study.curves(root, chosen, [column]).values()
                          if column in f]
                if frames:
                    joined = pd.concat(frames, axis=1)
                    ax.plot(joined.index, joined.mean(axis=1), color=color, linestyle=style,
                            label=f'{label} ({joined.shape[1]})')
            ceiling = _runs(runs, dataset, 'central', 'central')
            selection = 'valid' if row == 0 else 'valid_full'
            key = f'{selection}:{column}'
            if key in ceiling and ceiling[key].notna().any():
                ax.axhline(ceiling[key].mean(), color='black', linestyle='--',
                           label=f'central, best validation epoch ({len(ceiling)})')
            ax.set_title(f'{TITLES[dataset]}: {"sampled" if row == 0 else "full ranking"}')
            ax.set_xlabel('round')
            ax.set_ylabel('test HR@10')
            ax.grid(alpha=0.3)
            if col == 0 or has_paper:  # The paper-protocol curves' labels too.
                ax.legend(fontsize=7)
    written = []
    _report.save(fig, images, 'recipe_hr10.png', written)
    return written
