r"""Times GPFedRec's server products; prints figures, never asserts them.

Example (from the repository root; LastFM-2K's shape, every user a round)::

    .venv/bin/python launch/benchmark_gpfedrec.py --users=1600 --items=12454

The server relates the round's users by the Gram matrix of their flattened
item tables and propagates the tables over the graph
(`recommenders/gpfedrec/computation.py`). When the round's users are
consecutive rows of the table store (every user in every round, the
authors' setting) the Gram matrix reads the tables in place; otherwise,
and always for the propagation, each column block of the users' rows is
copied first. This script times the Gram matrix on random tables
`--repeats` times, alternating the two ways of reading (the same users in
reverse order are scattered rows, so they take the copy), and the
propagation beside them, and prints the medians and the Gram matrix's
ratio as one JSON object. The
two Gram matrices are the same up to the order of the users and float
rounding; the script checks that and prints their largest relative gap.
"""

from __future__ import annotations

import json
import os
import sys
import time

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags
import numpy as np

from tff_fedrecgel.recommenders.gpfedrec import computation as gpfedrec

_USERS = flags.DEFINE_integer('users', 1600, 'Users in the round (rows of the tables).', lower_bound=2)
_ITEMS = flags.DEFINE_integer('items', 12454, 'Items of each table.', lower_bound=1)
_DIM = flags.DEFINE_integer('dim', 32, 'Embedding width.', lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timings of each product and way.', lower_bound=1)


def _timed(fn, *args):
    """`(seconds, fn(*args))`."""
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def main(argv: list[str]) -> int:
    del argv
    n = _USERS.value
    flat = np.random.default_rng(0).standard_normal((n, _ITEMS.value * _DIM.value),
                                                    dtype=np.float32)
    ways = {'in_place': np.arange(n), 'copied': np.arange(n)[::-1].copy()}
    graph = np.eye(n, dtype=np.float32)  # Keeps the tables as they are.
    times = {**{f'gram_{way}': [] for way in ways}, 'propagation': []}
    grams = {}
    for _ in range(_REPEATS.value):
        for way, rows in ways.items():
            seconds, grams[way] = _timed(gpfedrec.rows_gram, flat, rows)
            times[f'gram_{way}'].append(seconds)
        seconds, _ = _timed(gpfedrec.rows_transform, flat, ways['in_place'], graph)
        times['propagation'].append(seconds)
    gram, reordered = grams['in_place'], grams['copied'][::-1, ::-1]
    gap = float(np.abs(gram - reordered).max() / np.abs(gram).max())
    if gap > 1e-5:
        raise RuntimeError(f'the two ways gave different Gram matrices (relative gap {gap:.1e})')
    medians = {name: float(np.median(values)) for name, values in times.items()}
    print(json.dumps({
        'users': n, 'items': _ITEMS.value, 'dim': _DIM.value, 'repeats': _REPEATS.value,
        **{f'{name}_s': float(f'{value:.3g}') for name, value in medians.items()},
        'gram_copied_over_in_place': round(medians['gram_copied'] / medians['gram_in_place'], 2),
        'gram_relative_gap': float(f'{gap:.1e}'), 'load_average': round(os.getloadavg()[0], 1)}))
    return 0


if __name__ == '__main__':
    _entry.run_main(main)
