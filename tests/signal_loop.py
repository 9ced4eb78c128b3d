"""Sends SIGTERM to small synthetic runs at random times; counts exit codes.

Not a test (it runs for minutes): the measurement behind docs/RELIABILITY.md's
figure on exits after a signal. Each trial starts the fault tests' run
(`conftest.TRAIN_SMALL_RUN`) in a fresh folder, waits until the program
handles SIGTERM, then a time drawn uniformly from --span seconds, and sends
SIGTERM. The promised exit status is 143; a run that had already ended
exits with 0, or by the signal itself if it came after the summary while
Python was exiting (docs/RELIABILITY.md). Anything else is printed with the
trial's log.

    .venv/bin/python tests/signal_loop.py --trials=40 --seed=1
"""

import argparse
import collections
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from conftest import TRAIN_SMALL_RUN
import worker_watch

REPO = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--trials', type=int, default=40)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--span', type=float, default=12.0,
                        help='signal times are drawn from 0.5 s to this')
    args = parser.parse_args()
    rng = random.Random(args.seed)
    codes = collections.Counter()
    for trial in range(args.trials):
        folder = pathlib.Path(tempfile.mkdtemp(prefix='signal_loop_'))
        with open(folder / 'log.txt', 'w') as log:
            proc = subprocess.Popen(
                [sys.executable, str(REPO / 'launch' / 'train.py'), *TRAIN_SMALL_RUN,
                 f'--root_output_dir={folder}', '--experiment_name=run'],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=REPO, start_new_session=True)
            while proc.poll() is None and not worker_watch.handles(proc.pid, signal.SIGTERM):
                time.sleep(0.05)
            time.sleep(rng.uniform(0.5, args.span))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait()
        lines = (folder / 'log.txt').read_text().strip().splitlines()
        finished = bool(lines) and lines[-1].startswith('{')
        if code == 128 + signal.SIGTERM:
            outcome = 'stopped (143)'
        elif finished and code in (0, -signal.SIGTERM):
            outcome = 'had finished'
        else:
            outcome = f'unexpected (exit {code})'
            print(f'trial {trial}: exit {code}; log: {folder / "log.txt"}', flush=True)
        codes[outcome] += 1
        if not outcome.startswith('unexpected'):
            shutil.rmtree(folder)
    unexpected = sum(n for c, n in codes.items() if c.startswith('unexpected'))
    print(f'{args.trials} trials: ' + ', '.join(f'{c}: {n}' for c, n in sorted(codes.items())))
    return 1 if unexpected else 0


if __name__ == '__main__':
    sys.exit(main())
