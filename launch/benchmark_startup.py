r"""Times what a run spends before its rounds, and what running several in one
process saves; prints figures, never asserts them.

Example (from the repository root)::

    .venv/bin/python launch/benchmark_startup.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --rounds=5

Two measurements on the same settings (`--algorithm`, `--preset`, a
validation item, `--eval_protocol`):

* **One command**: `launch/train.py` with `--total_rounds=1` in a fresh
  process, its wall time as a user sees it (imports, TFF's worker, the data,
  building and tracing the computations, one round and its evaluation, the
  outputs), beside the time of a steady round measured below.
* **In one process, through the API**: the phases in order, each timed: the
  imports (TensorFlow, TFF, the library), the session (`api.Session`; TFF's
  worker starts at the first computation, so its start falls in building or
  the first round), the data (`api.prepare_data`), building the run
  (`api.experiment`), its first round (tracing included), then `--rounds` more rounds (the steady
  round). Then a second run in the same process (another seed, same data):
  its build and first round are what a study runner or a tuner that keeps
  one process pays per run.

The last line is one JSON object; `startup_share` gives, for runs of 20 and
100 rounds, the part of a run's time that is not steady rounds, started
fresh and reusing the process.
"""

from __future__ import annotations

import json
import os
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

from tff_fedrecgel.launch import _benchmark_flags as common
from tff_fedrecgel.evaluation import protocols
# pylint: enable=g-import-not-at-top,wrong-import-position

_PRESET = flags.DEFINE_string('preset', None, 'The preset (default: the task\'s).')
_EVAL_PROTOCOL = flags.DEFINE_enum('eval_protocol', protocols.BOTH, list(protocols.CHOICES),
                                   'Evaluation of every round.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Steady rounds timed after the first.',
                               lower_bound=1)

_LENGTHS = (20, 100)


def _timed(call):
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def _settings() -> dict:
    out = {'algorithm': common.ALGORITHM.value, 'validation': True,
           'eval_protocol': _EVAL_PROTOCOL.value}
    if _PRESET.value:
        out['preset'] = _PRESET.value
    if common.DATA_DIR.value:
        out['data_dir'] = common.DATA_DIR.value
    return out


def _command(work: str) -> float:
    """Wall seconds of a one-round `launch/train.py` in a fresh process."""
    train = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
    args = [sys.executable, train, f'--task={common.TASK.value}',
            f'--algorithm={common.ALGORITHM.value}',
            '--validation', f'--eval_protocol={_EVAL_PROTOCOL.value}', '--total_rounds=1',
            '--noprogress', f'--root_output_dir={work}', '--experiment_name=command']
    args += [f'--preset={_PRESET.value}'] if _PRESET.value else []
    args += [f'--data_dir={common.DATA_DIR.value}'] if common.DATA_DIR.value else []
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)
    if done.returncode:
        raise SystemExit(f'train.py failed: {done.stderr.strip().splitlines()[-1:]}')
    return time.perf_counter() - start


def _in_process(work: str) -> dict:
    phases = {}

    def imports():
        import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
        import tensorflow_federated  # pylint: disable=g-import-not-at-top,unused-import
        from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top
        return api

    api, phases['imports'] = _timed(imports)
    session, phases['session'] = _timed(api.Session)
    try:
        split, phases['data'] = _timed(lambda: api.prepare_data(
            common.TASK.value, data_dir=common.DATA_DIR.value, validation=True))
        runs = []
        for seed in (0, 1):
            run, build = _timed(lambda s=seed: api.experiment(
                common.TASK.value, run_dir=os.path.join(work, f'api_seed{s}'), split=split, seed=s,
                **_settings()))
            _, first = _timed(lambda r=run: r.train(total_rounds=1))
            runs.append({'build': build, 'first_round': first})
        _, steady = _timed(lambda: run.train(total_rounds=1 + _ROUNDS.value))
    finally:
        session.close()
    phases.update(build=runs[0]['build'], first_round=runs[0]['first_round'])
    return {'phases': phases, 'steady_round': steady / _ROUNDS.value, 'again': runs[1]}


def main(argv: list[str]) -> int:
    del argv
    with tempfile.TemporaryDirectory(dir=common.WORK_DIR.value) as work:
        command = _command(work)
        measured = _in_process(work)
    steady = measured['steady_round']
    fresh = sum(measured['phases'].values()) - steady
    again = sum(measured['again'].values()) - steady
    command_startup = command - steady
    share = {f'{n}_rounds': {
        'fresh_command': round(command_startup / (command_startup + n * steady), 3),
        'same_process': round(again / (again + n * steady), 3)} for n in _LENGTHS}
    for name, seconds in measured['phases'].items():
        print(f'{name:>12}: {seconds:7.2f} s')
    print(f'{"steady round":>12}: {steady:7.2f} s (training and evaluation)')
    print(f'one command of one round: {command:.1f} s, {command_startup:.1f} s of it before '
          f'and around a steady round; in-process start-up {fresh:.1f} s; a second run in '
          f'the same process: {again:.1f} s')
    print(json.dumps({
        'task': common.TASK.value, 'algorithm': common.ALGORITHM.value,
        'command_seconds': round(command, 2),
        'phases': {k: round(v, 2) for k, v in measured['phases'].items()},
        'steady_round_seconds': round(steady, 3),
        'second_run': {k: round(v, 2) for k, v in measured['again'].items()},
        'startup_share': share, 'load_average': os.getloadavg()[0]}))
    return 0


if __name__ == '__main__':
    _entry.run_main(main)
