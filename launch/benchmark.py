r"""Times FedRecGEL rounds and evaluation; prints figures, never asserts them.

Examples (from the repository root)::

    python launch/benchmark.py --dataset=filmtrust \
        --data_dir=../shared/datasets/filmtrust
    python launch/benchmark.py --dataset=amazon_video \
        --data_dir=../shared/datasets/amazon_video --path=per_user --rounds=2
    python launch/benchmark.py --dataset=synthetic --num_users=100000 \
        --num_items=20000 --clients_per_round=1000

Runs `--warmup` rounds (tracing, worker start), then times `--rounds` rounds
of training and one evaluation of all users per timed round, as the authors'
protocol does (evaluation every round). Peak memory is the high-water
resident set of this process plus TFF's worker process after the data is
loaded (`data_peak_rss_mb`: the peak of loading and preprocessing). The last
line is one JSON object; where SPEC.md has a figure for the authors' code on
this machine, it includes the ratio.
"""

from __future__ import annotations

import json
import os
import sys
import time

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import _entry

_entry.setup_environment()

from absl import flags

import tasks
from launch import _data_flags
from tff_fedrecgel import runtime
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

# Seconds per round of the authors' PyTorch code on this machine, FedRecGEL
# with the task radii, evaluation every round (SPEC.md, reference figures).
AUTHORS_SECONDS_PER_ROUND = {'filmtrust': 3.7, 'lastfm_2k': 12.1, 'amazon_video': 47.0}

_DATASET = flags.DEFINE_enum('dataset', None, tasks.TASK_NAMES, 'Dataset task.')
_PATH = flags.DEFINE_enum(
    'path', 'vectorized', ['vectorized', 'per_user'],
    'vectorized: several users per TFF client; per_user: one user per client.')
_CLIENTS_PER_ROUND = flags.DEFINE_list(
    'clients_per_round', None,
    'Cohort size (default: 10% of users); several, comma-separated, sweep '
    'them in one process.')
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir', None, 'Reuse (or write) the prepared split here.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds.')
_WARMUP = flags.DEFINE_integer('warmup', 1, 'Untimed rounds first.')
_RHO_SH = flags.DEFINE_float('rho_sh', None, 'Default: the task\'s.')
_RHO_NS = flags.DEFINE_float('rho_ns', None, 'Default: the task\'s.')
_MAX_GROUP_EXAMPLES = flags.DEFINE_integer(
    'max_group_examples', 16384, 'vectorized: padded examples per TFF client.')
_EVAL = flags.DEFINE_bool('eval', True, 'Also time the evaluation of all users.')


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if not _DATASET.value:
        raise DataError(f'--dataset is required; choose one of {", ".join(tasks.TASK_NAMES)}')
    if _ROUNDS.value < 1 or _WARMUP.value < 0:
        raise ValueError('--rounds must be >= 1 and --warmup >= 0')
    task = tasks.get_task(_DATASET.value)
    start = time.perf_counter()
    split = task.load_split(data_dir=_data_flags.DATA_DIR.value,
                            cache_dir=_CACHE_DIR.value,
                            **_data_flags.task_options(task))
    load_seconds = time.perf_counter() - start
    # Data preparation (pandas) has its own peak; measure the simulation's.
    data_peak_rss_mb = runtime.peak_rss_mb()
    runtime.reset_peak_rss()

    _entry.tff_runtime()  # TFF's worker dies with this process.
    # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import ClientWorkConfig
    from tff_fedrecgel.simulation.simulation import clients_per_round_for
    # pylint: enable=g-import-not-at-top

    default_clients = clients_per_round_for(split.num_users, task.client_fraction)
    try:
        cohorts = [int(c) for c in (_CLIENTS_PER_ROUND.value or [default_clients])]
    except ValueError:
        raise ValueError('--clients_per_round takes whole numbers') from None
    work = ClientWorkConfig(
        rho_sh=task.rho_sh if _RHO_SH.value is None else _RHO_SH.value,
        rho_ns=task.rho_ns if _RHO_NS.value is None else _RHO_NS.value)
    results = []
    for clients in cohorts:
        result = _measure(split, work, clients)
        result.update(dataset=task.name, load_seconds=round(load_seconds, 2),
                      data_peak_rss_mb=round(data_peak_rss_mb, 1))
        authors = AUTHORS_SECONDS_PER_ROUND.get(task.name)
        if authors and _EVAL.value and clients == default_clients:
            result['authors_seconds_per_round'] = authors
            result['speedup_vs_authors'] = round(
                authors / result['seconds_per_round'], 2)
        results.append(result)
        if len(cohorts) > 1:
            print(json.dumps(result), flush=True)
    final = dict(results[-1])
    if len(results) > 1:
        final['sweep'] = [
            {k: r[k] for k in ('clients_per_round', 'seconds_per_round',
                               'train_seconds_per_round', 'eval_seconds',
                               'peak_rss_mb')} for r in results]
    print(json.dumps(final), flush=True)
    return 0


def _measure(split, work, clients: int) -> dict:
    """Builds a simulation for one cohort size and times its rounds."""
    # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import ModelConfig
    from tff_fedrecgel.simulation import FedRecSimulation
    # pylint: enable=g-import-not-at-top

    start = time.perf_counter()
    simulation = FedRecSimulation(
        split=split, model_config=ModelConfig(num_items=split.num_items),
        work=work, clients_per_round=clients, seed=0,
        vectorized=_PATH.value == 'vectorized',
        max_group_examples=_MAX_GROUP_EXAMPLES.value)
    simulation.initialize()
    build_seconds = time.perf_counter() - start

    start = time.perf_counter()
    for _ in range(_WARMUP.value):
        simulation.run_round()
        if _EVAL.value:
            simulation.evaluate()
    warmup_seconds = time.perf_counter() - start

    train, evaluate, metrics = [], [], None
    for _ in range(_ROUNDS.value):
        t = time.perf_counter()
        simulation.run_round()
        train.append(time.perf_counter() - t)
        if _EVAL.value:
            t = time.perf_counter()
            metrics = simulation.evaluate()
            evaluate.append(time.perf_counter() - t)
    train_s = sum(train) / len(train)
    eval_s = sum(evaluate) / len(evaluate) if evaluate else 0.0
    result = {
        'path': _PATH.value,
        'users': split.num_users,
        'items': split.num_items,
        'clients_per_round': clients,
        'rho_sh': work.rho_sh,
        'rho_ns': work.rho_ns,
        'timed_rounds': _ROUNDS.value,
        'seconds_per_round': round(train_s + eval_s, 4),
        'train_seconds_per_round': round(train_s, 4),
        'train_ms_per_client': round(1000 * train_s / clients, 3),
        'eval_seconds': round(eval_s, 4),
        'peak_rss_mb': round(runtime.peak_rss_mb(), 1),
        'build_seconds': round(build_seconds, 2),
        'warmup_seconds': round(warmup_seconds, 2),
    }
    if metrics:
        result['hr@10_after'] = round(metrics['hr@10'], 4)
    return result


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
