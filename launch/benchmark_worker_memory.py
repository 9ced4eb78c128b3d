r"""Measures TFF's worker memory over runs that share one process (a search's
trials); prints figures, never asserts them.

Example (from the repository root)::

    .venv/bin/python launch/benchmark_worker_memory.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --algorithm=fedrap --runs=10 \
        --rounds=3 --long_rounds=30

`--runs` identical runs of `--rounds` rounds (same seed, same settings,
`--flag=value` overrides as the API's keywords through `--set`) in one
`api.Session`, on one loaded split, as the tuner's trials share a worker.
After each run: the worker's resident memory (VmRSS) and the run's seconds.
Then, with `--long_rounds`, one more run of that many rounds, with the
worker's resident memory sampled every second: memory kept per round.

The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags

from tff_fedrecgel.launch import _benchmark_flags as common
# pylint: enable=g-import-not-at-top,wrong-import-position

_RUNS = flags.DEFINE_integer('runs', 10, 'Identical runs in one process.', lower_bound=1)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds of each run.', lower_bound=1)
_LONG_ROUNDS = flags.DEFINE_integer('long_rounds', 0,
                                    'Rounds of one more run sampled every second (0: none).',
                                    lower_bound=0)
_SET = flags.DEFINE_multi_string('set', [], 'A setting as NAME=VALUE (a number), e.g. '
                                 '--set=client_fraction=0.18.')


def _worker_rss_mb() -> float:
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    total = 0
    for pid in runtime.worker_pids():
        try:
            with open(f'/proc/{pid}/status') as f:
                total += next(int(line.split()[1]) for line in f if line.startswith('VmRSS'))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _overrides() -> dict:
    out = {}
    for item in _SET.value:
        name, sep, value = item.partition('=')
        try:
            out[name] = float(value) if '.' in value or 'e' in value else int(value)
        except ValueError:
            sep = ''
        if not sep or not name:
            raise ValueError(f'--set wants NAME=NUMBER, got {item!r}')
    return out


def main(argv: list[str]) -> int:
    del argv
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    settings = {'algorithm': common.ALGORITHM.value, 'validation': True, 'seed': 0, **_overrides()}
    split = api.prepare_data(common.TASK.value, data_dir=common.DATA_DIR.value, validation=True)
    after_run, long_samples = [], []
    with tempfile.TemporaryDirectory(dir=common.WORK_DIR.value) as work, api.Session():
        for n in range(_RUNS.value):
            start = time.perf_counter()
            api.experiment(common.TASK.value, run_dir=os.path.join(work, f'run{n}'), split=split,
                           total_rounds=_ROUNDS.value, **settings).train(progress=False)
            after_run.append((_worker_rss_mb(), time.perf_counter() - start))
            print(f'run {n + 1:>3}: worker {after_run[-1][0]:7.0f} MB resident, '
                  f'{after_run[-1][1]:5.1f} s', flush=True)
        if _LONG_ROUNDS.value:
            done = threading.Event()

            def sample():
                while not done.wait(1.0):
                    long_samples.append(_worker_rss_mb())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                api.experiment(common.TASK.value, run_dir=os.path.join(work, 'long'), split=split,
                               total_rounds=_LONG_ROUNDS.value, **settings).train(progress=False)
            finally:
                done.set()
                sampler.join()
            if long_samples:
                print(f'a run of {_LONG_ROUNDS.value} rounds: worker {long_samples[0]:.0f} MB '
                      f'at its first second, {max(long_samples):.0f} MB at most', flush=True)
    print(json.dumps({
        'task': common.TASK.value, 'algorithm': common.ALGORITHM.value, 'rounds': _ROUNDS.value,
        'settings': settings, 'worker_rss_mb_after_each_run': [round(m) for m, _ in after_run],
        'seconds_each_run': [round(s, 1) for _, s in after_run],
        'long_run': ({'rounds': _LONG_ROUNDS.value, 'worker_rss_mb_max': round(max(long_samples)),
                      'worker_rss_mb_first': round(long_samples[0])}
                     if long_samples else None),
        'load_average': os.getloadavg()[0]}))
    return 0


if __name__ == '__main__':
    _entry.run_main(main)
