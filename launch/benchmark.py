r"""Times FedRecGEL rounds and evaluation; prints figures, never asserts them.

Examples (from the repository root)::

    .venv/bin/python launch/benchmark.py --task=filmtrust \
        --data_dir=/path/to/filmtrust
    .venv/bin/python launch/benchmark.py --task=amazon_video \
        --data_dir=/path/to/amazon_video --simulation=per_user --rounds=2
    .venv/bin/python launch/benchmark.py --task=synthetic --num_users=100000 \
        --num_items=20000 --clients_per_round=1000
    .venv/bin/python launch/benchmark.py --task=amazon_video \
        --data_dir=/path/to/amazon_video --eval_protocol=full

Runs `--warmup` rounds (tracing, worker start), then times `--rounds` rounds
of training and one evaluation of all users per timed round, as the authors'
protocol does (evaluation every round). Peak memory is the high-water
resident set of this process plus TFF's worker process after the data is
loaded (`data_peak_rss_mb`: the peak of loading and preprocessing). The last
line is one JSON object; where docs/ALGORITHM.md has a figure for the
authors' code on this machine, it includes the ratio.

With `--eval_protocol=full` it instead times the full-ranking evaluation of
all users (`full_ranking.evaluate_full`, every user's test item against every
item it did not train on) after `--warmup` training rounds, `--rounds` times,
and prints its GFLOP/s (`full_ranking.scoring_flops`: 2 x the useful
multiply-adds of the factored scoring) beside the GFLOP/s of a dense
`tf.matmul` (`--matmul_size` square float32) measured in the same run, their
ratio (median over repetitions of each), and the peak memory of the
evaluation (`eval_peak_rss_mb`, this process plus TFF's worker). The
`--matmul_reps` matmul repetitions run before every timed evaluation and at
the end, so both rates see the same load from other processes; the rates per
CPU second of this process are printed too. `--check_federated=N` also runs
the federated computation (`build_federated_full_evaluation`) on the first N
users and prints its largest difference from the fast path on the same users.
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

from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel import runtime
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.evaluation import protocols
# pylint: enable=g-import-not-at-top,wrong-import-position

# --help lists the shared flags this script uses with its own.
flags.adopt_module_key_flags(_data_flags)

# Seconds per round of the authors' PyTorch code on this machine, FedRecGEL
# with the task radii, evaluation every round (docs/ALGORITHM.md, "Reference figures").
AUTHORS_SECONDS_PER_ROUND = {'filmtrust': 3.7, 'lastfm_2k': 12.1, 'amazon_video': 47.0}

_TASK = flags.DEFINE_enum('task', None, tasks.TASK_NAMES, 'Dataset task.')
_SIMULATION = flags.DEFINE_enum(
    'simulation', 'vectorized', ['vectorized', 'per_user'],
    'vectorized: several users per TFF client; per_user: one user per client.')
_CLIENTS_PER_ROUND = flags.DEFINE_list(
    'clients_per_round', None,
    'Cohort size (default: 10% of users); several, comma-separated, sweep '
    'them in one process.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds.')
_WARMUP = flags.DEFINE_integer('warmup', 1, 'Untimed rounds first.')
_RHO_SH = flags.DEFINE_float('rho_sh', None, 'Default: the task\'s.')
_RHO_NS = flags.DEFINE_float('rho_ns', None, 'Default: the task\'s.')
_MAX_GROUP_EXAMPLES = flags.DEFINE_integer(
    'max_group_examples', 16384, 'vectorized: padded examples per TFF client.')
_EVAL = flags.DEFINE_bool('eval', True, 'Also time the evaluation of all users.')
_STATE_ROUND_TRIP = flags.DEFINE_integer(
    'state_round_trip', 0, 'Also time this many calls of a TFF computation that '
    'returns the server state it is given: what passing the state into TFF\'s '
    'worker and back costs a round.')
_EVAL_USERS = flags.DEFINE_integer(
    'eval_users', None, 'sampled: evaluate a fixed sample of this many users '
    '(as launch/train.py --eval_users) instead of all of them.', lower_bound=1)
_EVAL_PROTOCOL = flags.DEFINE_enum(
    'eval_protocol', protocols.SAMPLED.name, list(protocols.NAMES),
    'sampled: time training rounds and the sampled (100-candidate) '
    'evaluation; full: time the full-ranking evaluation of all users against '
    'a dense matmul.')
_MATMUL_SIZE = flags.DEFINE_integer(
    'matmul_size', 4096, 'full: side of the square float32 reference matmul.')
_MATMUL_REPS = flags.DEFINE_integer(
    'matmul_reps', 3,
    'full: reference matmul repetitions before each timed evaluation and at '
    'the end.')
_USERS_PER_CALL = flags.DEFINE_integer(
    'users_per_call', None, 'full: users per compiled call (default: the '
    "module's).")
_ITEM_BLOCK = flags.DEFINE_integer(
    'item_block', None, "full: items per matrix product (default: the module's).")
_USERS_PER_STEP = flags.DEFINE_integer(
    'users_per_step', None, "full: users scored together (default: the module's, "
    '32; 1 scores each user alone, as a device does).')
_COMPARE_RANKS = flags.DEFINE_bool(
    'compare_ranks', False, 'full: also rank every user alone, as a device does (one '
    'user per product, blocks of about 2,048 items), and count the users whose rank '
    'differs from the timed scorer\'s.')
_CHECK_FEDERATED = flags.DEFINE_integer(
    'check_federated', 0,
    'full: also evaluate the first N users with the federated computation '
    'and report the largest metric difference from the fast path.')


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if not _TASK.value:
        raise DataError(f'--task is required; choose one of {", ".join(tasks.TASK_NAMES)}')
    if _ROUNDS.value < 1 or _WARMUP.value < 0:
        raise ValueError('--rounds must be >= 1 and --warmup >= 0')
    task = tasks.get_task(_TASK.value)
    start = time.perf_counter()
    split = task.load_split(data_dir=_data_flags.DATA_DIR.value,
                            cache_dir=_data_flags.CACHE_DIR.value,
                            **_data_flags.task_options(task))
    load_seconds = time.perf_counter() - start
    # Data preparation (pandas) has its own peak; measure the simulation's.
    data_peak_rss_mb = runtime.peak_rss_mb()
    runtime.reset_peak_rss()

    _entry.tff_runtime()  # TFF's worker dies with this process.
    # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import ClientWorkConfig
    from tff_fedrecgel.simulation import clients_per_round_for
    # pylint: enable=g-import-not-at-top

    default_clients = clients_per_round_for(split.num_users, task.client_fraction)
    try:
        cohorts = [int(c) for c in (_CLIENTS_PER_ROUND.value or [default_clients])]
    except ValueError:
        raise ValueError('--clients_per_round takes whole numbers') from None
    work = ClientWorkConfig(
        rho_sh=task.rho_sh if _RHO_SH.value is None else _RHO_SH.value,
        rho_ns=task.rho_ns if _RHO_NS.value is None else _RHO_NS.value)
    if _EVAL_PROTOCOL.value == protocols.FULL.name:
        result = _measure_full(split, work, cohorts[0])
        result.update(task=task.name, load_seconds=round(load_seconds, 2),
                      data_peak_rss_mb=round(data_peak_rss_mb, 1))
        print(json.dumps(result), flush=True)
        return 0
    results = []
    for clients in cohorts:
        result = _measure(split, work, clients)
        result.update(task=task.name, load_seconds=round(load_seconds, 2),
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
    from tff_fedrecgel.simulation import build_simulation  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    simulation = build_simulation(
        split=split, method='fedrecgel', work=work, clients_per_round=clients, seed=0,
        users_per_client=None if _SIMULATION.value == 'vectorized' else 1,
        max_group_examples=_MAX_GROUP_EXAMPLES.value, eval_users=_EVAL_USERS.value)
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
        'simulation': _SIMULATION.value,
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
        'eval_users': len(simulation.evaluated_users()[0]),
        'peak_rss_mb': round(runtime.peak_rss_mb(), 1),
        'build_seconds': round(build_seconds, 2),
        'warmup_seconds': round(warmup_seconds, 2),
    }
    if _STATE_ROUND_TRIP.value < 0:
        raise ValueError(f'--state_round_trip must be >= 0, got {_STATE_ROUND_TRIP.value}')
    if _STATE_ROUND_TRIP.value > 0:
        result.update(_state_round_trip(simulation.algorithm, _STATE_ROUND_TRIP.value))
    if metrics:
        result['hr@10_after'] = round(metrics['hr@10'], 4)
        if 'hr@10_se' in metrics:
            result['hr@10_after_se'] = round(metrics['hr@10_se'], 4)
    return result


def _state_round_trip(algorithm, calls: int) -> dict:
    """Median seconds of passing the server state into TFF's worker and back."""
    # pylint: disable=g-import-not-at-top
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff
    # pylint: enable=g-import-not-at-top
    state = algorithm.server_state
    echo = tff.federated_computation(
        lambda s: s, algorithm.pieces.process.next.type_signature.parameter[0])
    echo(state)
    times = [_timed(lambda: echo(state))[0] for _ in range(calls)]
    return {'state_mb': round(sum(np.asarray(t).nbytes for t in tf.nest.flatten(state)) / 1e6, 2),
            'state_round_trip_seconds': round(float(np.median(times)), 4)}


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process's threads) of `fn()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _matmul_timer(size: int):
    """A dense float32 [size, size] product, traced and warmed up."""
    # pylint: disable=g-import-not-at-top
    import tensorflow as tf
    # pylint: enable=g-import-not-at-top
    a = tf.random.normal([size, size], seed=1)
    b = tf.random.normal([size, size], seed=2)
    product = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)[0]))
    product(a, b).numpy()
    return lambda: _timed(lambda: product(a, b).numpy())


def _measure_full(split, work, clients: int) -> dict:
    """Times the full-ranking evaluation of all users against a dense matmul."""
    # pylint: disable=g-import-not-at-top
    import numpy as np
    from tff_fedrecgel.evaluation import full_ranking
    from tff_fedrecgel.simulation import build_simulation
    # pylint: enable=g-import-not-at-top

    if _MATMUL_SIZE.value < 1 or _MATMUL_REPS.value < 1 or _CHECK_FEDERATED.value < 0:
        raise ValueError('--matmul_size and --matmul_reps must be positive, '
                         '--check_federated non-negative')
    simulation = build_simulation(
        split=split, method='fedrecgel', work=work, clients_per_round=clients, seed=0,
        users_per_client=None if _SIMULATION.value == 'vectorized' else 1,
        max_group_examples=_MAX_GROUP_EXAMPLES.value)
    config = simulation.algorithm.model_config
    simulation.initialize()
    for _ in range(_WARMUP.value):
        simulation.run_round()  # trained weights; the speed does not depend on them
    weights, tables = simulation.global_weights, simulation.local_tables()
    csr = (simulation.train_data.indptr, simulation.train_data.items)
    options = {}
    if _USERS_PER_CALL.value is not None:
        options['users_per_call'] = _USERS_PER_CALL.value
    if _ITEM_BLOCK.value is not None:
        options['item_block'] = _ITEM_BLOCK.value
    if _USERS_PER_STEP.value is not None:
        options['users_per_step'] = _USERS_PER_STEP.value

    def evaluate():
        return full_ranking.evaluate_full(
            config, weights, tables, split.test_items, csr, **options)

    setup_peak_rss_mb = runtime.peak_rss_mb()  # simulation build and warmup rounds
    runtime.reset_peak_rss()
    load_before = os.getloadavg()[0]
    matmul = _matmul_timer(_MATMUL_SIZE.value)
    start = time.perf_counter()
    metrics = evaluate()
    first_seconds = time.perf_counter() - start
    # Matmul repetitions before every evaluation and at the end, so that both
    # rates see the same load from other processes on the machine.
    matmul_times, eval_times = [], []
    for _ in range(_ROUNDS.value):
        matmul_times += [matmul() for _ in range(_MATMUL_REPS.value)]
        eval_times.append(_timed(evaluate))
    matmul_times += [matmul() for _ in range(_MATMUL_REPS.value)]
    flops = full_ranking.scoring_flops(config, split.num_users)
    matmul_flops = 2 * _MATMUL_SIZE.value**3

    def rate(work, times, column, pick=np.median):
        return float(work / pick([t[column] for t in times]) / 1e9)

    full_rate = rate(flops, eval_times, 0)
    matmul_rate = rate(matmul_flops, matmul_times, 0)
    full_cpu, matmul_cpu = rate(flops, eval_times, 1), rate(matmul_flops, matmul_times, 1)
    result = {
        'eval_protocol': 'full',
        'users': split.num_users,
        'items': split.num_items,
        'warmup_rounds': _WARMUP.value,
        'full_eval_seconds': round(float(np.median([t[0] for t in eval_times])), 3),
        'full_eval_seconds_best': round(min(t[0] for t in eval_times), 3),
        'full_eval_first_call_seconds': round(first_seconds, 3),
        'timed_evaluations': len(eval_times),
        'scoring_gflop': round(flops / 1e9, 2),
        'full_gflops': round(full_rate, 1),
        'full_gflops_best': round(rate(flops, eval_times, 0, min), 1),
        'matmul_size': _MATMUL_SIZE.value,
        'matmul_reps': len(matmul_times),
        'matmul_gflops': round(matmul_rate, 1),
        'matmul_gflops_best': round(rate(matmul_flops, matmul_times, 0, min), 1),
        'ratio_to_matmul': round(full_rate / matmul_rate, 3),
        # Per second of CPU time of this process (all its threads): less
        # sensitive to other processes than the wall-clock rates above.
        'full_gflops_per_cpu_second': round(full_cpu, 1),
        'matmul_gflops_per_cpu_second': round(matmul_cpu, 1),
        'cpu_ratio_to_matmul': round(full_cpu / matmul_cpu, 3),
        'load_average_before_after': [round(load_before, 2),
                                      round(os.getloadavg()[0], 2)],
        'eval_peak_rss_mb': round(runtime.peak_rss_mb(), 1),
        'setup_peak_rss_mb': round(setup_peak_rss_mb, 1),
        'full_metrics': {k: round(v, 4) for k, v in metrics.items()},
    }
    if _COMPARE_RANKS.value:
        ranks = full_ranking.full_ranks(config, weights, tables, split.test_items, csr,
                                        **options)
        alone = full_ranking.full_ranks(config, weights, tables, split.test_items, csr,
                                        users_per_step=1,
                                        item_block=full_ranking.DEVICE_ITEM_BLOCK)
        result['ranks_differing_from_one_user_scoring'] = int(np.sum(ranks != alone))
        result['max_rank_change_from_one_user_scoring'] = int(np.max(np.abs(ranks - alone)))
    if _CHECK_FEDERATED.value:
        result.update(_check_federated(
            config, weights, tables, split.test_items, csr,
            min(_CHECK_FEDERATED.value, split.num_users), options))
        result['peak_rss_mb_with_federated'] = round(runtime.peak_rss_mb(), 1)
    return result


def _check_federated(config, weights, tables, heldout, csr, num_users: int,
                     options: dict) -> dict:
    """Federated vs fast path on the first `num_users` users."""
    # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.evaluation import full_ranking
    # pylint: enable=g-import-not-at-top

    indptr, items = csr
    users = range(num_users)
    fast = full_ranking.evaluate_full(
        config, weights, [t[:num_users] for t in tables], heldout[:num_users],
        (indptr[:num_users + 1], items[:indptr[num_users]]), **options)
    evaluate = full_ranking.build_federated_full_evaluation(
        config, **{k: v for k, v in options.items() if k == 'item_block'})
    start = time.perf_counter()
    federated = evaluate(
        weights, [[t[u:u + 1] for t in tables] for u in users],
        [{'heldout_item': heldout[u], 'train_items': items[indptr[u]:indptr[u + 1]]}
         for u in users])
    seconds = time.perf_counter() - start
    return {
        'federated_users': num_users,
        'federated_seconds': round(seconds, 2),
        'federated_max_abs_diff': float(max(
            abs(float(federated[k]) - fast[k]) for k in fast)),
    }


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
