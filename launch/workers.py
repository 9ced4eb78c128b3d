r"""Starts and stops local TFF worker services (`worker_binary --port=N`).

Examples (from the repository root)::

    python launch/workers.py start 2                 # two workers, free ports
    python launch/workers.py start 2 --base_port=10000   # ports 10000, 10001
    python launch/workers.py status
    python launch/workers.py stop

`start` prints one line, the addresses for `launch/train.py --workers=...`
(`localhost:10000,localhost:10001`), and records the workers' pids and ports
in a state file (default `runs/workers/state.json`, or
`$FEDRECGEL_WORKERS_STATE`); each worker's output goes to a log file next to
it. `stop` sends SIGINT (what TFF itself sends its worker), then SIGKILL to
any worker still alive after `--timeout` seconds, and removes the state file.
`launch/start_workers.sh` is a thin shell wrapper around this script.

The workers are detached from the calling terminal and pipe (their own
session, output to log files), so `start` returns at once and a pipe reading
its output closes. Does not import TensorFlow. The library part is
`tff_fedrecgel.runtime.services`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

if __package__ in (None, ''):
    # Run as `python launch/workers.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.runtime import services
# pylint: enable=g-import-not-at-top,wrong-import-position

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_STATE_FILE = REPO / 'runs' / 'workers' / 'state.json'
STATE_ENV = 'FEDRECGEL_WORKERS_STATE'


def default_state_file() -> pathlib.Path:
    """The state file: `$FEDRECGEL_WORKERS_STATE` or `runs/workers/state.json`."""
    return pathlib.Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_FILE)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        '--state_file', type=pathlib.Path, default=None,
        help=f'worker state file (default: ${STATE_ENV} or {DEFAULT_STATE_FILE})')
    parser = argparse.ArgumentParser(
        prog='workers.py', description='Start or stop local TFF worker services.')
    commands = parser.add_subparsers(dest='command', required=True)
    start = commands.add_parser('start', parents=[common], help='start N workers')
    start.add_argument('num_workers', type=int)
    start.add_argument('base_port', type=int, nargs='?', default=None,
                       help='first port (default: free ports)')
    start.add_argument('--base_port', dest='base_port_flag', type=int, default=None)
    start.add_argument('--host', default='localhost',
                       help='host name printed in the addresses')
    start.add_argument('--ready_timeout', type=float, default=60.0)
    stop = commands.add_parser('stop', parents=[common], help='stop the recorded workers')
    stop.add_argument('--timeout', type=float, default=10.0,
                      help='seconds between SIGINT and SIGKILL')
    commands.add_parser('status', parents=[common], help='list the recorded workers')
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Command-line entry point; returns the exit status."""
    args = _parse_args(argv)
    state_file = args.state_file or default_state_file()
    try:
        if args.command == 'start':
            base_port = args.base_port if args.base_port is not None else args.base_port_flag
            workers = services.start_workers(
                args.num_workers, base_port=base_port, host=args.host,
                state_file=state_file, ready_timeout=args.ready_timeout)
            print(f'started {len(workers)} TFF workers (pids '
                  f'{" ".join(str(w.pid) for w in workers)}; state {state_file})',
                  file=sys.stderr)
            print(','.join(w.address for w in workers), flush=True)
        elif args.command == 'stop':
            result = services.stop_workers(state_file=state_file, timeout=args.timeout)
            print(f'stopped {result["stopped"]} TFF workers '
                  f'({result["killed"]} needed SIGKILL)', file=sys.stderr)
            if result['left']:
                print(f'error: still alive: {result["left"]}', file=sys.stderr)
                return 1
        else:
            recorded = services.read_state(state_file)
            for worker in recorded:
                alive = services.processes.is_worker(worker.pid, worker.port)
                answers = alive and services.port_answers('localhost', worker.port)
                print(f'{worker.address} pid {worker.pid}: '
                      f'{"running" if alive else "gone"}'
                      f'{", answers" if answers else ""}')
            if not recorded:
                print(f'no workers recorded in {state_file}')
    except services.WorkerLaunchError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
