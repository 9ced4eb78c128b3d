r"""Times data preparation and training rounds at scale; checks sampled
evaluation against full.

Prints figures, never asserts them. Examples (from the repository root)::

    nice -n 10 .venv/bin/python launch/benchmark_scale.py --mode=prep \
        --num_users=162000 --num_items=59000 --mean_interactions=155
    nice -n 10 .venv/bin/python launch/benchmark_scale.py --mode=eval_error \
        --num_users=100000 --num_items=2000
    nice -n 10 .venv/bin/python launch/benchmark_scale.py --mode=train \
        --num_users=1000000 --num_items=20000 --clients_per_round=1000 --rounds=2 \
        --user_state_store=disk --cache_dir=/tmp/bench/syn1m
    nice -n 10 .venv/bin/python launch/benchmark_scale.py --mode=store \
        --num_users=10000000 --clients_per_round=1000 --rounds=5

`--mode=prep` runs three phases, each in a fresh process so that each peak
memory is its own: `generate` (the synthetic log, saved as raw columns),
`prepare` (the columns read into the raw frame, `preprocess.build_split`:
filter, re-index, leave-one-out, sampled negatives; then the cache written
as in `Task.prepare`) and `reload` (`split_io.read_split` of that cache,
every file's SHA-1 checked, every array read). It prints one line per phase
and a JSON object with the seconds, peak resident memory (VmHWM) and CPU
seconds of each (the CPU time of the whole process, loading included: on a
shared machine it moves less than the wall time; the 1-minute load average
at the end of the phase says how shared it was).
The files go to a temporary folder under --work_dir, removed at the end.

`--mode=train` times FedRecGEL training rounds on a synthetic population
with `--user_state_store` (the disk store in a temporary `user_states/`
under --work_dir): building the simulation and the store, `--warmup`
untimed rounds, then `--rounds` timed rounds, each followed by a checkpoint's
`mark` of the disk store (its seconds apart), and prints the seconds per
round and the peak resident memory (VmHWM) of this process and of TFF's
worker apart (the process's includes the split, prepared or read from
--cache_dir). No evaluation.

`--mode=store` times the disk store alone (no data, no TFF): creating it
for `--num_users` users at the default NeuMF sizes, then `--rounds` rounds of
a `--clients_per_round` cohort's gather, scatter (with its undo record) and
a checkpoint's mark, and prints the seconds and this process's peak memory.

`--mode=eval_error` trains `--rounds` FedRecGEL rounds on a synthetic
population, evaluates every user, then the fixed `--eval_users` sample
(`eval_sample`) and `--repeats` other random samples of the same size, and
prints, per metric, the full mean, the sample's mean and standard error,
and the spread (standard deviation) of the other samples' means, which the
standard error estimates.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
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
# pylint: enable=g-import-not-at-top,wrong-import-position

_MODE = flags.DEFINE_enum('mode', 'prep', ['prep', 'train', 'store', 'eval_error'],
                          'What to measure.')
_PHASE = flags.DEFINE_enum('phase', None, ['generate', 'prepare', 'reload'],
                           'Internal: run one phase of --mode=prep in this process.')
_NUM_USERS = flags.DEFINE_integer('num_users', 162_000, 'Synthetic users.', lower_bound=1)
_NUM_ITEMS = flags.DEFINE_integer('num_items', 59_000, 'Synthetic items.', lower_bound=10)
_MEAN_INTERACTIONS = flags.DEFINE_float(
    'mean_interactions', 155.0, 'Mean interactions per synthetic user (train: the '
    'synthetic task\'s default of 20 unless given).')
_VALIDATION = flags.DEFINE_boolean('validation', False, 'Hold out a validation item too.')
_WORKERS = flags.DEFINE_integer(
    'workers', None, 'Threads drawing the negatives (default: the usable cores, up to 4).',
    lower_bound=1)
_WORK_DIR = flags.DEFINE_string('work_dir', None, 'Folder for the temporary files '
                                '(default: the system temporary folder).')
_FOLDER = flags.DEFINE_string('folder', None, 'Internal: the files of --phase.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'eval_error: training rounds.', lower_bound=0)
_CLIENTS = flags.DEFINE_integer('clients_per_round', 1000, 'eval_error: cohort.',
                                lower_bound=1)
_EVAL_USERS = flags.DEFINE_integer('eval_users', 10_000, 'eval_error: sample size.',
                                   lower_bound=2)
_STORE = flags.DEFINE_enum('user_state_store', 'disk', ['memory', 'disk'],
                           'train: where the users\' states live.')
_WARMUP = flags.DEFINE_integer('warmup', 1, 'train: untimed rounds first.', lower_bound=0)
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, 'train: reuse (or write) the prepared '
                                 'split here.')
_REPEATS = flags.DEFINE_integer('repeats', 20, 'eval_error: other samples drawn.',
                                lower_bound=2)

_COLUMNS = ('user', 'item', 'timestamp')


def _peak_rss_mb() -> float:
    """High-water resident memory of this process (VmHWM), MB."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024
    return float('nan')


def _generate(folder: str) -> dict:
    from tff_fedrecgel.data import synthetic  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    raw = synthetic.generate_synthetic(num_users=_NUM_USERS.value, num_items=_NUM_ITEMS.value,
                                       mean_interactions=_MEAN_INTERACTIONS.value, seed=0)
    seconds = time.perf_counter() - start
    os.makedirs(os.path.join(folder, 'raw'), exist_ok=True)
    for column in _COLUMNS:
        np.save(os.path.join(folder, 'raw', f'{column}.npy'), raw[column].to_numpy())
    return {'rows': len(raw), 'seconds': seconds}


def _prepare(folder: str) -> dict:
    import pandas as pd  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.data import preprocess  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.data import split_io  # pylint: disable=g-import-not-at-top

    raw = pd.DataFrame({c: np.load(os.path.join(folder, 'raw', f'{c}.npy')) for c in _COLUMNS})
    start = time.perf_counter()
    split = preprocess.build_split(raw, validation=_VALIDATION.value, workers=_WORKERS.value)
    split_seconds = time.perf_counter() - start
    del raw
    split_io.write_split(split, os.path.join(folder, 'split'), key={'benchmark': 1})
    seconds = time.perf_counter() - start
    return {**split.summary(), 'seconds': seconds, 'split_seconds': split_seconds,
            'write_seconds': seconds - split_seconds,
            'cache_mb': sum(os.path.getsize(os.path.join(folder, 'split', name))
                            for name in os.listdir(os.path.join(folder, 'split'))) / 2**20}


def _reload(folder: str) -> dict:
    from tff_fedrecgel.data import split_io  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    split, _ = split_io.read_split(os.path.join(folder, 'split'))
    checksum = sum(int(np.sum(getattr(split, name), dtype=np.int64)) for name in (
        'train_users', 'train_items', 'test_items', 'test_negatives'))
    return {'seconds': time.perf_counter() - start, 'checksum': checksum}


def _run_phase(phase: str, folder: str) -> dict:
    """One phase in a fresh process; its JSON line."""
    command = [sys.executable, os.path.abspath(__file__), f'--phase={phase}',
               f'--folder={folder}', f'--num_users={_NUM_USERS.value}',
               f'--num_items={_NUM_ITEMS.value}',
               f'--mean_interactions={_MEAN_INTERACTIONS.value}',
               f'--validation={_VALIDATION.value}']
    if _WORKERS.value:
        command.append(f'--workers={_WORKERS.value}')
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f'phase {phase} failed: {_entry.one_line(done.stderr[-500:])}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def _prep() -> int:
    folder = tempfile.mkdtemp(prefix='fedrecgel_scale_', dir=_WORK_DIR.value)
    try:
        figures = {}
        for phase in ('generate', 'prepare', 'reload'):
            figures[phase] = _run_phase(phase, folder)
            line = figures[phase]
            print(f'{phase}: {line["seconds"]:.1f} s ({line["cpu_seconds"]:.1f} s of CPU in '
                  f'the whole process, load {line["load_average"]:.1f}), peak '
                  f'{line["peak_rss_mb"]:.0f} MB'
                  + (f', {line["rows"]:,} rows' if 'rows' in line else '')
                  + (f' (split {line["split_seconds"]:.1f} s, cache write '
                     f'{line["write_seconds"]:.1f} s, {line["cache_mb"]:.0f} MB)'
                     if 'split_seconds' in line else ''), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({'num_users': _NUM_USERS.value, 'num_items': _NUM_ITEMS.value,
                      'mean_interactions': _MEAN_INTERACTIONS.value,
                      'validation': _VALIDATION.value, **figures}), flush=True)
    return 0


def _worker_peak_mb() -> float:
    """High-water resident memory of this process's TFF workers, MB."""
    from tff_fedrecgel.runtime import processes  # pylint: disable=g-import-not-at-top

    total = 0.0
    for pid in processes.worker_pids():
        with open(f'/proc/{pid}/status') as f:
            total += sum(int(line.split()[1]) for line in f if line.startswith('VmHWM:'))
    return total / 1024


def _train() -> int:
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top

    _entry.tff_runtime()
    start = time.perf_counter()
    # The synthetic default (20 per user) unless --mean_interactions is given.
    extra = ({'mean_interactions': _MEAN_INTERACTIONS.value}
             if flags.FLAGS['mean_interactions'].present else {})
    split = tasks.get_task('synthetic').load_split(
        num_users=_NUM_USERS.value, num_items=_NUM_ITEMS.value, cache_dir=_CACHE_DIR.value,
        **extra)
    load_seconds = time.perf_counter() - start
    split_peak = _peak_rss_mb()
    folder = tempfile.mkdtemp(prefix='fedrecgel_store_', dir=_WORK_DIR.value)
    try:
        work = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.05)
        start = time.perf_counter()
        sim = simulation.build_simulation(split=split, method='fedrecgel', work=work,
                                          clients_per_round=_CLIENTS.value, seed=0,
                                          user_state_store=_STORE.value)
        sim.use_state_folder(os.path.join(folder, 'user_states'))
        sim.initialize()
        sim.algorithm.local_tables()  # Creates the disk store (else at round 1).
        build_seconds = time.perf_counter() - start
        for _ in range(_WARMUP.value):
            sim.run_round()
        rounds, marks = [], []
        for _ in range(_ROUNDS.value):
            start = time.perf_counter()
            sim.run_round()
            rounds.append(time.perf_counter() - start)
            start = time.perf_counter()
            sim.algorithm.client_states.checkpoint_state()
            marks.append(time.perf_counter() - start)
        store_mb = _folder_mb(folder)
        out = {'num_users': split.num_users, 'num_items': split.num_items,
               'clients_per_round': _CLIENTS.value, 'user_state_store': _STORE.value,
               'load_seconds': load_seconds, 'build_seconds': build_seconds,
               'round_seconds': rounds, 'mark_seconds': marks,
               'split_peak_rss_mb': split_peak, 'peak_rss_mb': _peak_rss_mb(),
               'worker_peak_rss_mb': _worker_peak_mb(), 'store_mb': store_mb,
               'load_average': os.getloadavg()[0]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f'{_STORE.value} store, {split.num_users:,} users, {_CLIENTS.value:,} clients per '
          f'round: {np.mean(rounds):.2f} s per round ({", ".join(f"{r:.2f}" for r in rounds)}), '
          f'checkpoint mark {np.mean(marks):.3f} s; build {build_seconds:.1f} s; peak '
          f'{out["peak_rss_mb"]:.0f} MB process (after loading the split: '
          f'{split_peak:.0f} MB) + {out["worker_peak_rss_mb"]:.0f} MB worker; store files '
          f'{store_mb:.0f} MB (apparent size); load {out["load_average"]:.1f}', flush=True)
    print(json.dumps(out), flush=True)
    return 0



def _folder_mb(folder: str) -> float:
    """The apparent size of every file under `folder`, in MB."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) for name in names) / 2**20

def _store() -> int:
    from tff_fedrecgel import sizes  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation import client_states  # pylint: disable=g-import-not-at-top

    folder = tempfile.mkdtemp(prefix='fedrecgel_store_', dir=_WORK_DIR.value)
    try:
        start = time.perf_counter()
        table = client_states.ClientStateTable(store=client_states.create_disk_store(
            os.path.join(folder, 'user_states'), sizes.ModelConfig(num_items=1),
            num_users=_NUM_USERS.value, seed=0))
        create_seconds = time.perf_counter() - start
        rng = np.random.default_rng(0)
        steps = {'gather': [], 'scatter': [], 'mark': []}
        for _ in range(_ROUNDS.value):
            users = rng.choice(_NUM_USERS.value, _CLIENTS.value, replace=False)
            start = time.perf_counter()
            state = table.gather(users)
            steps['gather'].append(time.perf_counter() - start)
            start = time.perf_counter()
            table.scatter(users, state._replace(adam_step=state.adam_step + 1))
            steps['scatter'].append(time.perf_counter() - start)
            start = time.perf_counter()
            table.checkpoint_state()
            steps['mark'].append(time.perf_counter() - start)
        store_mb = _folder_mb(folder)
        out = {'num_users': _NUM_USERS.value, 'clients_per_round': _CLIENTS.value,
               'create_seconds': create_seconds, **steps, 'store_mb': store_mb,
               'peak_rss_mb': _peak_rss_mb(), 'load_average': os.getloadavg()[0]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ms = {step: np.mean(seconds) * 1000 for step, seconds in steps.items()}
    print(f'disk store of {_NUM_USERS.value:,} users ({store_mb:,.0f} MB of files): created in '
          f'{create_seconds:.1f} s; per round of {_CLIENTS.value:,} users: gather '
          f'{ms["gather"]:.1f} ms, scatter {ms["scatter"]:.1f} ms, mark {ms["mark"]:.1f} ms; '
          f'peak {out["peak_rss_mb"]:.0f} MB; load {out["load_average"]:.1f}', flush=True)
    print(json.dumps(out), flush=True)
    return 0


def _eval_error() -> int:
    from tff_fedrecgel.evaluation import eval_sample  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.evaluation import sampled as evaluation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top

    _entry.tff_runtime()
    split = tasks.get_task('synthetic').load_split(num_users=_NUM_USERS.value,
                                                   num_items=_NUM_ITEMS.value)
    work = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.05)
    sim = simulation.build_simulation(split=split, method='fedrecgel', work=work,
                                      clients_per_round=_CLIENTS.value, seed=0,
                                      eval_users=_EVAL_USERS.value)
    sim.initialize()
    for _ in range(_ROUNDS.value):
        sim.run_round()
    tables = sim.algorithm.local_tables()
    candidates = split.candidates('test')
    start = time.perf_counter()
    full = evaluation.evaluate_users(sim.algorithm.model_config, sim.global_weights,
                                     tables, candidates)
    full_seconds = time.perf_counter() - start
    start = time.perf_counter()
    sampled = sim.evaluate('test')
    sample_seconds = time.perf_counter() - start
    rng = np.random.default_rng(1)
    others = []
    for _ in range(_REPEATS.value):
        users = np.sort(rng.choice(split.num_users, _EVAL_USERS.value, replace=False))
        others.append(evaluation.evaluate_users(
            sim.algorithm.model_config, sim.global_weights, [t[users] for t in tables],
            candidates[users]))
    rows = {}
    for name in full:
        spread = float(np.std([o[name] for o in others], ddof=1))
        rows[name] = {'full': full[name], 'sample': sampled[name],
                      'se': sampled[name + eval_sample.STDERR_SUFFIX],
                      'spread_of_other_samples': spread}
        print(f'{name:8s} full {full[name]:.4f}  sample {sampled[name]:.4f} ± '
              f'{rows[name]["se"]:.4f}  (off by {sampled[name] - full[name]:+.4f}; '
              f'sd of {_REPEATS.value} other samples {spread:.4f})', flush=True)
    print(f'evaluation of {split.num_users:,} users {full_seconds:.1f} s, of the '
          f'{_EVAL_USERS.value:,}-user sample {sample_seconds:.2f} s', flush=True)
    print(json.dumps({'num_users': split.num_users, 'num_items': split.num_items,
                      'rounds': _ROUNDS.value, 'eval_users': _EVAL_USERS.value,
                      'full_seconds': full_seconds, 'sample_seconds': sample_seconds,
                      'metrics': rows}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv
    if _PHASE.value:
        run = {'generate': _generate, 'prepare': _prepare, 'reload': _reload}[_PHASE.value]
        out = run(_FOLDER.value)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({**out, 'peak_rss_mb': _peak_rss_mb(),
                          'cpu_seconds': usage.ru_utime + usage.ru_stime,
                          'load_average': os.getloadavg()[0]}), flush=True)
        return 0
    return {'prep': _prep, 'train': _train, 'store': _store,
            'eval_error': _eval_error}[_MODE.value]()


if __name__ == '__main__':
    _entry.run_main(main)
