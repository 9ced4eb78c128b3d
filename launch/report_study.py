r"""Writes the study's tables and curves from its runs (docs/RESULTS.md).

Example (from the repository root, after launch/run_study.py)::

    python launch/report_study.py --root_output_dir=runs/study

Reads every finished run's summary.json, hparams.json and metrics.csv under
--root_output_dir and writes:

- the tables into --results between the lines `<!-- study-tables:begin -->`
  and `<!-- study-tables:end -->` (the prose around them is left alone);
- every run's figures to --runs_csv;
- PNG curves to --images_dir: study_hr10.png (HR@10 per round),
  study_sharpness.png (sharpness at one probe radius, with and without SAM)
  study_sweep.png (the FilmTrust radius sweep) and study_long.png (the
  LastFM-2K runs past round 100).

With --plan=recipe it writes the recipe-tables block, docs/recipe_runs.csv and
recipe_hr10.png instead (and with --readme=README.md the README's results
block); --keep_reported_runs adds new runs to a report whose
earlier run folders are gone, keeping their rows from the runs CSV (the
figure's curves are then drawn from the folders present).
"""

from __future__ import annotations

import math
import os
import pathlib
import sys

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

from absl import flags
import numpy as np
import pandas as pd

from tff_fedrecgel.launch import _peers_report
from tff_fedrecgel.launch import _recipe_report
from tff_fedrecgel.launch import _report
from tff_fedrecgel.launch import peers_study
from tff_fedrecgel.launch import study
from tff_fedrecgel.launch import transfer_study
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

_ROOT = flags.DEFINE_string('root_output_dir', 'runs/study', 'Study output root.')
_RESULTS = flags.DEFINE_string('results', 'docs/RESULTS.md',
                               'Markdown file whose table block is rewritten.')
_README = flags.DEFINE_string(
    'readme', None, 'Recipe study: also rewrite the results block of this README '
    '(README.md from the repository root).')
_IMAGES_DIR = flags.DEFINE_string('images_dir', 'docs/images', 'Where the PNGs go.')
_RUNS_CSV = flags.DEFINE_string('runs_csv', None,
                                'Every finished run, one row each (default: '
                                f'{_report.LEDGERS["paper"]}, or {_report.LEDGERS["recipe"]}).')
_KEEP_REPORTED = flags.DEFINE_bool(
    'keep_reported_runs', False,
    'Recipe study: keep the rows of --runs_csv whose run folders are not under '
    '--root_output_dir (runs reported before whose outputs are gone), so a few '
    'new runs can be added to a finished report. The figure is redrawn: its '
    'curves average the run folders present (the legend gives their count), '
    'its central line the rows.')
_TRANSFER_CSV = flags.DEFINE_string(
    'transfer_csv', _report.LEDGERS['transfer'],
    'Transfer study: every run\'s selected figures; rows whose run folders are '
    'gone are kept, so the tables can be rewritten without them.')
_PEERS_CSV = flags.DEFINE_string(
    'peers_csv', _report.LEDGERS['peers'],
    'Peers study: every peer run\'s selected figures, kept as the transfer rows are.')
_PEERS_SEARCHES = flags.DEFINE_string(
    'peers_searches', peers_study.SEARCH_LEDGER,
    'Peers study: every search\'s trials, kept when their folders are gone, from '
    'which launch/run_study.py resumes a search in a fresh checkout.')
_DATASETS_DIR = flags.DEFINE_string(
    'datasets_dir', None, 'Transfer study: the folder of the paper datasets (their '
    'profiles choose each recipe\'s negatives and the rule\'s branch).')
_PLAN = flags.DEFINE_enum(
    'plan', 'paper', ['paper', 'recipe', 'transfer', 'peers'],
    'Which study: the paper reproduction (the study-tables block), the recipe '
    'study (the recipe-tables block, recipe_hr10.png) or the transfer study '
    '(the transfer-tables block; floor and ceiling from --runs_csv\'s recipe rows) '
    'or the peers study (the peers-tables block; the same reference rows).')

BEGIN, END = '<!-- study-tables:begin -->', '<!-- study-tables:end -->'
TITLES, LABELS = _report.TITLES, _report.LABELS


def method_tables(runs: pd.DataFrame) -> list[str]:
    """One Markdown table per dataset."""
    lines = []
    for dataset in study.DATASETS:
        if not (runs.dataset == dataset).any():
            continue
        table = study.method_table(runs, dataset)
        rho = study.spec_radii(dataset)
        lines += [f'### {TITLES[dataset]} (FedRecGEL radii rho_sh={rho[0]:g}, '
                  f'rho_ns={rho[1]:g})', '',
                  '| method | HR@10, best test round | NDCG@10, best test round | seeds '
                  '| HR@10, best validation round | NDCG@10, best validation round | seeds '
                  '| authors\' code here (HR@10 / NDCG@10) |',
                  '|---|---|---|---|---|---|---|---|']
        for method, row in table.iterrows():
            label = LABELS[method]
            if row['same_as']:
                label += f' (= {LABELS[row["same_as"]]} here)'
            reference = study.AUTHORS_REFERENCE.get((dataset, method))
            reference = (f'{reference[0]:.4f} / {reference[1]:.4f} ({reference[2]})'
                         if reference else '')
            lines.append(
                f'| {label} | {_report.cell(row.test_hr, row.test_hr_std, row.n_test)} '
                f'| {_report.cell(row.test_ndcg, row.test_ndcg_std, row.n_test)} | {row.n_test} '
                f'| {_report.cell(row.valid_hr, row.valid_hr_std, row.n_valid)} '
                f'| {_report.cell(row.valid_ndcg, row.valid_ndcg_std, row.n_valid)} | {row.n_valid} '
                f'| {reference} |')
        lines += ['', f'The authors\' own sweep plots sit at '
                  f'{study.AUTHORS_SWEEP_LEVEL[dataset]} (HR@10 / NDCG@10).']
        lines += _identity_lines(runs, dataset) + ['']
    return lines


def _identity_lines(runs: pd.DataFrame, dataset: str) -> list[str]:
    """Checks that each redundant ablation's seed-0 run equals its twin."""
    lines = []
    main = study.main_runs(runs, dataset)
    for method, twin in study.redundant_methods(dataset).items():
        for validation in (False, True):
            a = main[(main.method == method) & (main.validation == validation) & (main.seed == 0)]
            b = main[(main.method == twin) & (main.validation == validation) & (main.seed == 0)]
            if len(a) and len(b):
                columns = ['test_hr', 'test_ndcg', 'test_round', 'valid_hr', 'valid_round']
                same = np.allclose(a[columns].to_numpy(float), b[columns].to_numpy(float),
                                   equal_nan=True, rtol=0, atol=0)
                lines.append(f'Check: {LABELS[method]} (seed 0'
                             f'{", validation" if validation else ""}) ran and '
                             f'{"equals" if same else "DIFFERS FROM"} {LABELS[twin]}: '
                             f'HR@10 {a.test_hr.iloc[0]:.4f} vs {b.test_hr.iloc[0]:.4f}.')
    return [''] + lines if lines else []


def paired_table(runs: pd.DataFrame) -> list[str]:
    """FedRecGEL minus FedNCF, paired by seed."""
    lines = ['### FedRecGEL minus FedNCF, paired by seed', '',
             '| dataset | selection | seeds | ΔHR@10 mean ± std [min, max] '
             '| ΔNDCG@10 mean ± std [min, max] |', '|---|---|---|---|---|']
    for dataset in study.DATASETS:
        for long in (False, True):
            diffs = study.paired_differences(runs, dataset, long=long)
            for selection, name in (('test', 'best test round'),
                                    ('valid', 'best validation round')):
                hr, ndcg = diffs[f'{selection}_hr'], diffs[f'{selection}_ndcg']
                if not hr['n']:
                    continue
                if long:
                    name += f' of {study.LONG_ROUNDS}'
                lines.append(
                    f'| {TITLES[dataset]} | {name} | {hr["n"]} '
                    f'| {_signed(hr)} | {_signed(ndcg)} |')
    return lines + ['']


def _signed(d: dict) -> str:
    std = f' ± {d["std"]:.4f}' if d['n'] > 1 else ''
    return f'{d["mean"]:+.4f}{std} [{d["min"]:+.4f}, {d["max"]:+.4f}]'


def sweep_lines(runs: pd.DataFrame) -> list[str]:
    """The FilmTrust radius sweep."""
    table = study.sweep_table(runs)
    if not table.n.any():
        return []
    lines = ['### FilmTrust radius sweep (best test round)', '',
             '| radius value | rho_sh swept (rho_ns = 0.02): HR@10 | NDCG@10 | seeds '
             '| rho_ns swept (rho_sh = 0): HR@10 | NDCG@10 | seeds |',
             '|---|---|---|---|---|---|---|']
    for value in study.SWEEP_GRID:
        sh, ns = table.loc[('rho_sh', value)], table.loc[('rho_ns', value)]
        lines.append(
            f'| {value:g} | {_report.cell(sh.hr, sh.hr_std, sh.n)} | {_report.cell(sh.ndcg, sh.ndcg_std, sh.n)} '
            f'| {int(sh.n)} | {_report.cell(ns.hr, ns.hr_std, ns.n)} '
            f'| {_report.cell(ns.ndcg, ns.ndcg_std, ns.n)} | {int(ns.n)} |')
    return lines + ['']


def probe_lines(runs: pd.DataFrame, root: pathlib.Path) -> list[str]:
    """Sharpness at the probe radius, late in training, and a check that the
    probe runs trained exactly as the main runs of the same seed."""
    probes = runs[runs.probe]
    if probes.empty:
        return []
    lines = [f'### Sharpness at radius {study.PROBE_RADIUS:g} (seed 0, mean over '
             'rounds 51-100)', '',
             '| dataset | method | global part | local part | same training as the '
             'main run |', '|---|---|---|---|---|']
    main = study.main_runs(runs)
    main = main[~main.validation & (main.seed == 0)]
    columns = ['train/probe_sharpness_global', 'train/probe_sharpness_local']
    for _, probe in probes.sort_values(['dataset', 'method']).iterrows():
        frame = study.curves(root, probes[probes.name == probe['name']],
                             columns).get(probe['name'])
        if frame is None or not all(c in frame for c in columns):
            continue
        late = frame.loc[51:]
        twin = main[(main.dataset == probe.dataset) & (main.method == probe.method)]
        same = ('—' if twin.empty else 'yes' if
                (twin.test_hr.iloc[0], twin.test_ndcg.iloc[0], twin.test_round.iloc[0])
                == (probe.test_hr, probe.test_ndcg, probe.test_round) else 'NO')
        lines.append(f'| {TITLES[probe.dataset]} | {LABELS[probe.method]} '
                     f'| {late[columns[0]].mean():.2e} | {late[columns[1]].mean():.2e} '
                     f'| {same} |')
    return lines + ['']


def long_lines(runs: pd.DataFrame, root: pathlib.Path) -> list[str]:
    """HR@10 and NDCG@10 of the long runs every 100 rounds, and a check that
    their first rounds equal the main run's of the same seed."""
    long_runs = runs[runs.long]
    if long_runs.empty:
        return []
    checkpoints = range(100, study.LONG_ROUNDS + 1, 100)
    lines = [f'### Past round 100: {study.LONG_ROUNDS} rounds (test HR@10 / NDCG@10)', '',
             '| dataset | method | seed | '
             + ' | '.join(f'round {r}' for r in checkpoints)
             + ' | best test round | rounds 1-100 equal the main run |',
             '|---|---|---|' + '---|' * (len(checkpoints) + 2)]
    main = study.main_runs(runs)
    main = main[~main.validation]
    columns = ['test/hr@10', 'test/ndcg@10']
    for _, run in long_runs.sort_values(['dataset', 'method', 'seed']).iterrows():
        frame = study.curves(root, long_runs[long_runs.name == run['name']],
                             columns).get(run['name'])
        if frame is None or not all(c in frame for c in columns):
            continue
        cells = [f'{frame.loc[r, columns[0]]:.4f} / {frame.loc[r, columns[1]]:.4f}'
                 if r in frame.index else '—' for r in checkpoints]
        twin = main[(main.dataset == run.dataset) & (main.method == run.method)
                    & (main.seed == run.seed)]
        twin_frame = study.curves(root, twin, columns).get(
            twin.name.iloc[0]) if len(twin) else None
        same = '—' if twin_frame is None else (
            'yes' if twin_frame.index.isin(frame.index).all() and np.array_equal(
                twin_frame[columns].to_numpy(),
                frame.loc[twin_frame.index, columns].to_numpy()) else 'NO')
        lines.append(f'| {TITLES[run.dataset]} | {LABELS[run.method]} | {run.seed} | '
                     + ' | '.join(cells)
                     + f' | {run.test_hr:.4f} / {run.test_ndcg:.4f} (round '
                       f'{run.test_round:.0f}) | {same} |')
    return lines + ['']


def cost_lines(runs: pd.DataFrame) -> list[str]:
    """Runs and machine time per dataset and method."""
    runs = runs.assign(seconds=runs.seconds_per_round * runs.rounds)
    lines = ['### Runs and their time', '',
             '| dataset | method | runs | seconds per run (mean) | seconds per round |',
             '|---|---|---|---|---|']
    for (dataset, method), group in runs.groupby(['dataset', 'method'], sort=False):
        lines.append(f'| {TITLES.get(dataset, dataset)} | {LABELS.get(method, method)} '
                     f'| {len(group)} | {group.seconds.mean():.0f} '
                     f'| {group.seconds_per_round.mean():.2f} |')
    total = runs.seconds.sum()
    lines += ['', f'{len(runs)} runs, {total / 3600:.2f} hours of training and '
              'evaluation in all (sum over runs; runs went two or three at a time '
              'on the 2 cores).', '']
    return lines


def tables_block(runs: pd.DataFrame, root: pathlib.Path) -> str:
    """The whole generated block, markers included."""
    lines = [BEGIN, '<!-- Generated by launch/report_study.py; edit the script, '
             'not this block. -->', '']
    lines += (method_tables(runs) + paired_table(runs) + sweep_lines(runs)
              + probe_lines(runs, root) + long_lines(runs, root) + cost_lines(runs))
    return '\n'.join(lines + [END])


def plot_curves(root: pathlib.Path, runs: pd.DataFrame, images: pathlib.Path) -> list[str]:
    """Writes the PNGs; returns their file names."""
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

    images.mkdir(parents=True, exist_ok=True)
    written = []
    main = study.main_runs(runs)
    main = main[~main.validation]
    colors = {'fedrecgel': 'tab:red', 'fedncf': 'tab:blue', 'fedrecon': 'tab:green',
              'fedmf': 'tab:gray'}
    datasets = [d for d in study.DATASETS if (main.dataset == d).any()]
    if datasets:
        # Top row: the whole run; bottom row: the last 60 rounds, zoomed in.
        fig, axes = plt.subplots(2, len(datasets), figsize=(5 * len(datasets), 7.2),
                                 squeeze=False)
        for col, dataset in enumerate(datasets):
            finals = []
            for method, color in colors.items():
                chosen = main[(main.dataset == dataset) & (main.method == method)]
                frames = list(study.curves(root, chosen, ['test/hr@10']).values())
                for ax in axes[:, col]:
                    _report.band(ax, frames, 'test/hr@10', LABELS[method], color)
                finals += [f['test/hr@10'].loc[40:] for f in frames if 'test/hr@10' in f]
            for row, ax in enumerate(axes[:, col]):
                ax.set_title(TITLES[dataset] + (' (rounds 40 on)' if row else ''))
                ax.set_xlabel('round')
                ax.set_ylabel('test HR@10 (mean; band: seeds min–max)')
                ax.grid(alpha=0.3)
            axes[0, col].legend(fontsize=8)
            tail = pd.concat(finals) if finals else pd.Series(dtype=float)
            if len(tail):
                low, high = tail.quantile(0.02), tail.max()
                axes[1, col].set_xlim(40, tail.index.max())
                axes[1, col].set_ylim(low - 0.1 * (high - low), high + 0.1 * (high - low))
        _report.save(fig, images, 'study_hr10.png', written)

    probes = runs[runs.probe]
    datasets = [d for d in study.DATASETS if (probes.dataset == d).any()]
    if datasets:
        fig, axes = plt.subplots(2, len(datasets), figsize=(5 * len(datasets), 6.5),
                                 squeeze=False)
        for col, dataset in enumerate(datasets):
            for row, part in enumerate(('global', 'local')):
                ax = axes[row][col]
                column = f'train/probe_sharpness_{part}'
                for method in study.PROBE_METHODS:
                    chosen = probes[(probes.dataset == dataset) & (probes.method == method)]
                    for frame in study.curves(root, chosen, [column]).values():
                        if column in frame:
                            ax.plot(frame.index, frame[column], color=colors[method],
                                    alpha=0.25, linewidth=0.8)
                            ax.plot(frame.index, frame[column].rolling(9, center=True,
                                                                       min_periods=1).mean(),
                                    color=colors[method], label=LABELS[method])
                ax.set_title(f'{TITLES[dataset]}: {part} part')
                ax.set_xlabel('round')
                ax.set_ylabel(f'L(w + e) − L(w), radius {study.PROBE_RADIUS:g}')
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
        _report.save(fig, images, 'study_sharpness.png', written)

    table = study.sweep_table(runs)
    if table.n.any():
        fig, ax = plt.subplots(figsize=(6, 3.8))
        positions = np.arange(len(study.SWEEP_GRID))
        for offset, radius, color in ((-0.08, 'rho_sh', 'tab:purple'),
                                      (0.08, 'rho_ns', 'tab:orange')):
            part = table.loc[radius]
            ax.errorbar(positions + offset, part.hr, yerr=part.hr_std.fillna(0),
                        marker='o', capsize=3, color=color, label=f'{radius} swept')
        ax.set_xticks(positions, [f'{v:g}' for v in study.SWEEP_GRID])
        ax.set_xlabel('radius (other radius at the task\'s value)')
        ax.set_ylabel('FilmTrust best test HR@10')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _report.save(fig, images, 'study_sweep.png', written)
    _plot_long(root, runs, images, written, colors)
    return written


def _plot_long(root, runs, images, written, colors) -> None:
    """study_long.png: the long runs' HR@10 and NDCG@10 per round."""
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
    long_runs = runs[runs.long]
    if long_runs.empty:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric, label in zip(axes, ('hr@10', 'ndcg@10'), ('HR@10', 'NDCG@10')):
        for method in dict.fromkeys(method for _, method in study.LONG_RUNS):
            chosen = long_runs[long_runs.method == method]
            frames = list(study.curves(root, chosen, [f'test/{metric}']).values())
            _report.band(ax, frames, f'test/{metric}', LABELS[method], colors[method])
        ax.axvline(100, color='black', linewidth=0.8, linestyle=':')
        ax.set_xlabel('round')
        ax.set_ylabel(f'test {label} (mean; band: seeds min–max)')
        ax.set_title(f'{", ".join(sorted({TITLES[d] for d in long_runs.dataset}))}: {label}')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _report.save(fig, images, 'study_long.png', written)


def main(argv: list[str]) -> int:
    del argv
    root = pathlib.Path(_ROOT.value)
    if _KEEP_REPORTED.value and _PLAN.value != 'recipe':
        raise DataError('--keep_reported_runs applies to --plan=recipe only')
    if _PLAN.value == 'recipe':
        return _recipe(root)
    if _PLAN.value == 'transfer':
        return _transfer(root)
    if _PLAN.value == 'peers':
        return _peers(root)
    runs = study.collect(root)
    if runs.empty:
        raise DataError(f'no finished runs under {root}; run launch/run_study.py first')
    results = pathlib.Path(_RESULTS.value)
    block = tables_block(runs, root)
    _report.write_block(results, block, BEGIN, END)
    runs_csv = _RUNS_CSV.value or _report.LEDGERS['paper']
    pathlib.Path(runs_csv).parent.mkdir(parents=True, exist_ok=True)
    runs.sort_values('name').to_csv(runs_csv, index=False, float_format='%.6g')
    written = plot_curves(root, runs, pathlib.Path(_IMAGES_DIR.value))
    print(f'{len(runs)} runs: tables in {results}, rows in {runs_csv}, '
          f'images {", ".join(written) or "none"} in {_IMAGES_DIR.value}')
    return 0


def _recipe(root: pathlib.Path) -> int:
    runs = study.collect_recipe(root)
    runs_csv = pathlib.Path(_RUNS_CSV.value or _report.LEDGERS['recipe'])
    kept = pd.DataFrame()
    if _KEEP_REPORTED.value and runs_csv.exists():
        kept = pd.read_csv(runs_csv)
        kept = kept[~kept['name'].isin(runs['name'] if len(runs) else [])]
        runs = pd.concat([runs, kept], ignore_index=True)
    if runs.empty:
        raise DataError(f'no finished runs under {root}; run launch/run_study.py '
                        '--plan=recipe first')
    results = pathlib.Path(_RESULTS.value)
    previous = None  # The paper study's runs, for its methods' rows.
    if pathlib.Path(_report.LEDGERS['paper']).exists():
        previous = pd.read_csv(_report.LEDGERS['paper'])
    _report.write_block(results, _recipe_report.tables_block(runs, previous),
                        _recipe_report.BEGIN, _recipe_report.END)
    if _README.value:
        _report.write_block(pathlib.Path(_README.value), _recipe_report.readme_block(runs),
                            _recipe_report.README_BEGIN, _recipe_report.README_END)
    runs.sort_values('name').to_csv(runs_csv, index=False, float_format='%.6g')
    written = _recipe_report.plot(root, runs, pathlib.Path(_IMAGES_DIR.value))
    images = f'images {", ".join(written) or "none"} in {_IMAGES_DIR.value}'
    if not kept.empty:
        images += f' (curves from the folders under {root}); {len(kept)} rows kept from {runs_csv}'
    print(f'{len(runs)} runs: tables in {results}, rows in {runs_csv}, {images}')
    return 0


TRANSFER_BEGIN = '<!-- transfer-tables:begin -->'
TRANSFER_END = '<!-- transfer-tables:end -->'


def _transfer(root: pathlib.Path) -> int:
    recipe_csv = pathlib.Path(_RUNS_CSV.value or _report.LEDGERS['recipe'])
    if not recipe_csv.exists():
        raise DataError(f'{recipe_csv}: the recipe study\'s rows are needed (the floor, '
                        'the ceiling and the tuned runs of the paper\'s datasets)')
    if not _DATASETS_DIR.value:
        raise DataError('--datasets_dir is required: the transfer tables read each '
                        'dataset\'s profile')
    transfer_csv = pathlib.Path(_TRANSFER_CSV.value)
    kept = pd.read_csv(transfer_csv) if transfer_csv.exists() else None
    runs = transfer_study.collect(root, kept)
    if runs.empty:
        raise DataError(f'no finished runs under {root} nor in {transfer_csv}; run '
                        'launch/run_study.py --plan=transfer first')
    datasets_dir = pathlib.Path(_DATASETS_DIR.value)
    profiles = {d.key: transfer_study.profile_of(d, datasets_dir)
                for d in transfer_study.DATASETS if (runs.dataset == d.key).any()}
    lines = transfer_study.report_lines(runs, pd.read_csv(recipe_csv), profiles)
    block = '\n'.join([TRANSFER_BEGIN, '<!-- Generated by launch/report_study.py --plan=transfer; edit the '
                       'script, not this block. -->', '', *lines, TRANSFER_END])
    results = pathlib.Path(_RESULTS.value)
    _report.write_block(results, block, TRANSFER_BEGIN, TRANSFER_END)
    runs.to_csv(transfer_csv, index=False, float_format='%.6g')
    print(f'{len(runs)} runs: transfer tables in {results}, rows in {transfer_csv}')
    return 0


def _peers(root: pathlib.Path) -> int:
    recipe_csv = pathlib.Path(_RUNS_CSV.value or _report.LEDGERS['recipe'])
    if not recipe_csv.exists():
        raise DataError(f'{recipe_csv}: the recipe study\'s rows are needed (the floor, '
                        'the ceiling and FedRecGEL on the same splits)')
    peers_csv = pathlib.Path(_PEERS_CSV.value)
    peers = _peers_report.collect(root, peers_csv)
    if peers.empty:
        raise DataError(f'no finished runs under {root} nor in {peers_csv}; run '
                        'launch/run_study.py --plan=peers first')
    searches = pathlib.Path(_PEERS_SEARCHES.value)
    recorded = peers_study.recorded_searches(searches)  # Refused before anything is written.
    runs = _peers_report.combine(peers, pd.read_csv(recipe_csv))
    results = pathlib.Path(_RESULTS.value)
    _report.write_block(results, _peers_report.tables_block(runs),
                        _peers_report.BEGIN, _peers_report.END)
    peers.sort_values('name').to_csv(peers_csv, index=False, float_format='%.6g')
    recorded = peers_study.record_searches(root, searches, recorded)
    print(f'{len(peers)} peer runs: tables in {results}, rows in {peers_csv}; '
          f'{recorded} searches\' trials in {searches}')
    return 0


if __name__ == '__main__':
    _entry.run_main(main)
