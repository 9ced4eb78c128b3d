r"""Times FedRecGEL rounds of this tree against another checkout, interleaved.

Example (from the repository root; the other checkout made with
`git worktree add /tmp/base <commit>`)::

    .venv/bin/python launch/benchmark_interleaved.py --baseline_tree=/tmp/base \
        --task=filmtrust --data_dir=/path/to/filmtrust --rounds=150

Two runs timed one after the other see different machines: on a shared
computer the same code varies by 20% from one process to the next, more
than a 5% difference being looked for. Here both versions run in one
process on one TFF worker: the other checkout's `tff_fedrecgel` (with its
`tasks/` and `launch/` when they sit beside it) is copied to a temporary
folder under another package name, each version builds its own simulation
of the same task, seed and cohort, and their rounds alternate (ABBA), so
that both see the same load. It prints one JSON object: each version's
seconds per round (median, mean), the ratio of the means (this tree over
the baseline) with a paired bootstrap 95% interval over rounds, and whether
the two versions' training metrics were equal in every round (they should
be: same seed, same data, same arithmetic).

The other checkout must build a simulation as this tree does:
`tasks.get_task(name).load_split(...)`,
`simulation.build_simulation(split=, method=, work=, clients_per_round=,
seed=)`, `initialize()` and `run_round()`.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags
import numpy as np

from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

flags.adopt_module_key_flags(_data_flags)

_BASELINE_TREE = flags.DEFINE_string(
    'baseline_tree', None, 'A checkout of the version to compare with (the folder that '
    'holds its tff_fedrecgel/).')
_TASK = flags.DEFINE_enum('task', None, tasks.TASK_NAMES, 'Dataset task.')
_ROUNDS = flags.DEFINE_integer('rounds', 100, 'Timed rounds of each version.')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed rounds of each version first.')
_METHOD = flags.DEFINE_string('method', 'fedrecgel', 'The method both versions run.')
_BOOTSTRAP = flags.DEFINE_integer('bootstrap', 2000, 'Resamples of the interval.')

_ALIAS = 'baseline_tff_fedrecgel'
_PACKAGE = 'tff_fedrecgel'


def copy_as_alias(tree: pathlib.Path, folder: pathlib.Path) -> None:
    """Copies the checkout's package into `folder` under the alias name.

    Args:
      tree: The checkout (holds `tff_fedrecgel/`, maybe `tasks/`, `launch/`).
      folder: Where the aliased package goes (put it on `sys.path`).

    Raises:
      DataError: If `tree` holds no `tff_fedrecgel` package.
    """
    source = tree / _PACKAGE
    if not (source / '__init__.py').is_file():
        raise DataError(f'--baseline_tree: {tree} holds no {_PACKAGE}/ package')
    target = folder / _ALIAS
    ignore = shutil.ignore_patterns('__pycache__')
    shutil.copytree(source, target, ignore=ignore)
    # Older checkouts keep these beside the package; an install maps them in.
    for part in ('tasks', 'launch'):
        if (tree / part).is_dir() and not (target / part).exists():
            shutil.copytree(tree / part, target / part, ignore=ignore)
    for path in target.rglob('*.py'):
        path.write_text(re.sub(rf'\b{_PACKAGE}\b', _ALIAS, path.read_text()))


def build(package: str, task_name: str, options: dict):
    """One version's simulation of the task (its own data loading and build)."""
    version_tasks = importlib.import_module(f'{package}.tasks')
    algorithms = importlib.import_module(f'{package}.algorithms')
    simulation = importlib.import_module(f'{package}.simulation')
    task = version_tasks.get_task(task_name)
    split = task.load_split(data_dir=_data_flags.DATA_DIR.value, **options)
    run = simulation.build_simulation(
        split=split, method=_METHOD.value,
        work=algorithms.ClientWorkConfig(rho_sh=task.rho_sh, rho_ns=task.rho_ns),
        clients_per_round=simulation.clients_per_round_for(split.num_users,
                                                           task.client_fraction),
        seed=0)
    run.initialize()
    return run


def interval(now: np.ndarray, base: np.ndarray, resamples: int) -> list[float]:
    """Paired bootstrap 95% interval of mean(now) / mean(base) over rounds."""
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(now), size=(resamples, len(now)))
    ratios = now[picks].mean(axis=1) / base[picks].mean(axis=1)
    return [round(float(q), 4) for q in np.quantile(ratios, [0.025, 0.975])]


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv
    if not _TASK.value or not _BASELINE_TREE.value:
        raise DataError('--task and --baseline_tree are required')
    if _ROUNDS.value < 2 or _WARMUP.value < 0 or _BOOTSTRAP.value < 1:
        raise ValueError('--rounds must be >= 2, --warmup >= 0, --bootstrap >= 1')
    tree = pathlib.Path(_BASELINE_TREE.value).resolve()
    options = _data_flags.task_options(tasks.get_task(_TASK.value))
    with tempfile.TemporaryDirectory(prefix='interleaved-') as folder:
        copy_as_alias(tree, pathlib.Path(folder))
        sys.path.insert(0, folder)
        _entry.tff_runtime()  # One TFF worker for both versions.
        try:
            runs = {'baseline': build(_ALIAS, _TASK.value, options),
                    'this_tree': build(_PACKAGE, _TASK.value, options)}
        except (ImportError, AttributeError, TypeError) as e:
            raise DataError(f'--baseline_tree: {tree} does not build a simulation as '
                            f'this tree does ({type(e).__name__}: {e})') from None
        seconds = {name: [] for name in runs}
        metrics = {name: [] for name in runs}
        for step in range(_WARMUP.value + _ROUNDS.value):
            order = list(runs) if step % 2 == 0 else list(runs)[::-1]
            for name in order:
                start = time.perf_counter()
                result = runs[name].run_round()
                if step >= _WARMUP.value:
                    seconds[name].append(time.perf_counter() - start)
                metrics[name].append({k: float(v) for k, v in result.items()
                                      if np.ndim(v) == 0})
    base, now = np.array(seconds['baseline']), np.array(seconds['this_tree'])
    # Wall-clock fields differ by nature; every other metric must not.
    shared = sorted(k for k in set(metrics['baseline'][0]) & set(metrics['this_tree'][0])
                    if 'seconds' not in k)
    print(json.dumps({
        'task': _TASK.value, 'baseline_tree': str(tree), 'timed_rounds': _ROUNDS.value,
        'baseline_median': round(float(np.median(base)), 4),
        'this_tree_median': round(float(np.median(now)), 4),
        'baseline_mean': round(float(base.mean()), 4),
        'this_tree_mean': round(float(now.mean()), 4),
        'ratio_of_means': round(float(now.mean() / base.mean()), 4),
        'ratio_interval_95': interval(now, base, _BOOTSTRAP.value),
        'median_paired_ratio': round(float(np.median(now / base)), 4),
        'compared_metrics': shared,
        'metrics_equal': all(a[k] == b[k] for a, b in zip(metrics['baseline'],
                                                            metrics['this_tree'])
                             for k in shared),
    }), flush=True)
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
