"""Helpers shared by the study reports (no flags)."""

from __future__ import annotations

import math
import pathlib

import pandas as pd

from tff_fedrecgel import methods
from tff_fedrecgel.errors import DataError

TITLES = {'filmtrust': 'FilmTrust', 'lastfm_2k': 'LastFM-2K', 'amazon_video': 'Amazon-Video'}
# Each study plan's reported rows (one per finished run, kept when its folder
# is gone): the tables are rewritten from them, and the runner skips them.
LEDGERS = {'paper': 'docs/study_runs.csv', 'recipe': 'docs/recipe_runs.csv',
           'transfer': 'docs/transfer_runs.csv', 'peers': 'docs/peers_runs.csv'}


def reported_runs(ledger: pathlib.Path) -> set[str]:
    """The names (`<dataset>/<run>`) of the runs a ledger CSV holds; none if
    it does not exist."""
    if not ledger.exists():
        return set()
    return set(pd.read_csv(ledger, usecols=['name'])['name'])
# Every method's name in tables and figures (the registry's labels).
LABELS = {m.name: m.label for m in methods.METHODS.values()}


def cell(mean: float, std: float, count: int) -> str:
    if count == 0 or math.isnan(mean):
        return '—'
    spread = f' ± {std:.4f}' if count > 1 else ''
    return f'{mean:.4f}{spread}'


def write_block(path: pathlib.Path, block: str, begin: str, end: str) -> None:
    """Replaces the block between `begin` and `end` in `path` (which must hold both)."""
    text = path.read_text(encoding='utf-8')
    if begin not in text or end not in text:
        raise DataError(f'{path} lacks the lines {begin} and {end}')
    head, rest = text.split(begin, 1)
    path.write_text(head + block + rest.split(end, 1)[1], encoding='utf-8')


def band(ax, frames, column, label, color):
    series = [f[column] for f in frames if column in f]
    if not series:
        return
    joined = pd.concat(series, axis=1)
    ax.plot(joined.index, joined.mean(axis=1), color=color,
            label=f'{label} ({joined.shape[1]} seed{"s" * (joined.shape[1] > 1)})')
    if joined.shape[1] > 1:
        ax.fill_between(joined.index, joined.min(axis=1), joined.max(axis=1),
                        color=color, alpha=0.2, linewidth=0)


def save(fig, images: pathlib.Path, name: str, written: list[str]) -> None:
    fig.tight_layout()
    fig.savefig(images / name, dpi=110)
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
    plt.close(fig)
    written.append(name)


