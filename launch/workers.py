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
its output closes. Does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_STATE_FILE = REPO / 'runs' / 'workers' / 'state.json'
STATE_ENV = 'FEDRECGEL_WORKERS_STATE'
_BINARY = 'worker_binary'
_POLL_SECONDS = 0.05


class WorkerLaunchError(RuntimeError):
    """A worker could not be started, or the state file is unusable."""


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One started worker service.

    Attributes:
      pid: Its process id.
      port: The port it serves on.
      host: The host name the driver should use to reach it.
      log: Its log file.
    """

    pid: int
    port: int
    host: str
    log: str

    @property
    def address(self) -> str:
        return f'{self.host}:{self.port}'


def default_state_file() -> pathlib.Path:
    """The state file: `$FEDRECGEL_WORKERS_STATE` or `runs/workers/state.json`."""
    return pathlib.Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_FILE)


def worker_binary_path() -> pathlib.Path:
    """TFF's worker binary inside the installed `tensorflow_federated` package.

    Returns:
      The path of `tensorflow_federated/data/worker_binary`.

    Raises:
      WorkerLaunchError: If the package or the binary is missing.
    """
    # find_spec locates the package without importing it (and TensorFlow).
    spec = importlib.util.find_spec('tensorflow_federated')
    if spec is None or not spec.submodule_search_locations:
        raise WorkerLaunchError(
            f'tensorflow_federated is not installed for {sys.executable}')
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / 'data' / _BINARY
    if not os.access(path, os.X_OK):
        raise WorkerLaunchError(f'no executable TFF worker binary at {path}')
    return path


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(('', port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free (all bound at once, so distinct)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(('', 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_answers(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _is_our_worker(pid: int, port: int) -> bool:
    """True if pid is alive and still a worker_binary serving `port`.

    Guards against signalling an unrelated process that reused the pid.
    """
    try:
        with open(f'/proc/{pid}/stat') as f:
            if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                # The main thread has exited. The worker is gone (only its
                # parent's wait is due) once its other threads are too: until
                # then it still holds its files, the listening socket included.
                return len(os.listdir(f'/proc/{pid}/task')) > 1
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            args = f.read().split(b'\0')
    except (OSError, IndexError):
        return False
    return _BINARY.encode() in args[0] and f'--port={port}'.encode() in args


def _reap(pid: int) -> None:
    """Collects the exit status if the worker is this process's child."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # Not our child: its parent (or init) reaps it.


def read_state(state_file: pathlib.Path) -> list[WorkerInfo]:
    """The workers recorded in `state_file` (empty if there is none).

    Raises:
      WorkerLaunchError: If the file exists but cannot be parsed.
    """
    if not state_file.exists():
        return []
    try:
        records = json.loads(state_file.read_text())['workers']
        return [WorkerInfo(**record) for record in records]
    except (ValueError, KeyError, TypeError) as e:
        raise WorkerLaunchError(f'unreadable worker state file {state_file}: {e}') from e


def _write_state(state_file: pathlib.Path, workers: list[WorkerInfo]) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix('.tmp')
    tmp.write_text(json.dumps(
        {'workers': [dataclasses.asdict(w) for w in workers]}, indent=2) + '\n')
    tmp.replace(state_file)  # Atomic: `stop` never reads half a file.


def alive_workers(state_file: pathlib.Path) -> list[WorkerInfo]:
    """The recorded workers that are still running."""
    return [w for w in read_state(state_file) if _is_our_worker(w.pid, w.port)]


def _log_tail(path: str, lines: int = 5) -> str:
    try:
        text = pathlib.Path(path).read_text(errors='replace').strip().splitlines()
    except OSError:
        return ''
    return ' | '.join(text[-lines:])


def start_workers(
    num_workers: int,
    *,
    base_port: int | None = None,
    host: str = 'localhost',
    state_file: pathlib.Path | None = None,
    ready_timeout: float = 60.0,
) -> list[WorkerInfo]:
    """Starts `num_workers` TFF worker services on this machine.

    Args:
      num_workers: How many workers.
      base_port: First port (the others follow); None picks free ports.
      host: Host name written into the addresses (the workers listen on all
        interfaces).
      state_file: Where to record them (default: `default_state_file()`).
      ready_timeout: Seconds to wait for every port to accept connections.

    Returns:
      The started workers, in port order.

    Raises:
      WorkerLaunchError: On a bad count or port, workers already recorded as
        running, or a worker that exits or does not answer in time (the ones
        already started are then stopped again).
    """
    state_file = pathlib.Path(state_file or default_state_file())
    if num_workers < 1:
        raise WorkerLaunchError(f'the number of workers must be >= 1, got {num_workers}')
    running = alive_workers(state_file)
    if running:
        raise WorkerLaunchError(
            f'{len(running)} workers recorded in {state_file} are still running '
            f'({",".join(w.address for w in running)}); stop them first')
    if base_port is None:
        ports = _free_ports(num_workers)
    else:
        ports = list(range(base_port, base_port + num_workers))
        if base_port < 1 or ports[-1] > 65535:
            raise WorkerLaunchError(f'ports {ports[0]}..{ports[-1]} are out of range')
        busy = [p for p in ports if not _port_free(p)]
        if busy:
            raise WorkerLaunchError(f'ports already in use: {busy}')
    binary = worker_binary_path()
    env = dict(os.environ)
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    workers, processes = [], {}
    for port in ports:
        log = state_file.parent / f'worker_{port}.log'
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, 'wb') as out:
            # Own session and no inherited pipes: the worker neither gets the
            # terminal's Ctrl-C nor keeps a caller's output pipe open.
            process = subprocess.Popen(
                [str(binary), f'--port={port}'], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        workers.append(WorkerInfo(pid=process.pid, port=port, host=host, log=str(log)))
        processes[port] = process
    # Recorded before waiting, so `stop` can clean up even if this is killed.
    _write_state(state_file, workers)
    deadline = time.monotonic() + ready_timeout
    waiting = list(workers)
    while waiting:
        for worker in list(waiting):
            # poll(), not /proc: until exec the child still looks like Python.
            if processes[worker.port].poll() is not None:
                _abort(processes.values(), state_file)
                raise WorkerLaunchError(
                    f'worker on port {worker.port} exited at start: '
                    f'{_log_tail(worker.log)}')
            if port_answers('localhost', worker.port, timeout=0.5):
                waiting.remove(worker)
        if waiting and time.monotonic() > deadline:
            _abort(processes.values(), state_file)
            raise WorkerLaunchError(
                f'workers on ports {[w.port for w in waiting]} did not answer '
                f'within {ready_timeout:.0f} s')
        if waiting:
            time.sleep(_POLL_SECONDS * 4)
    return workers


def _abort(processes, state_file: pathlib.Path) -> None:
    """Stops workers this call just started (SIGINT, then SIGKILL)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    state_file.unlink(missing_ok=True)


def stop_workers(*, state_file: pathlib.Path | None = None, timeout: float = 10.0) -> dict:
    """Stops the recorded workers: SIGINT, then SIGKILL after `timeout` s.

    Args:
      state_file: The state file of `start_workers`.
      timeout: Seconds to wait after SIGINT before SIGKILL.

    Returns:
      `{'stopped': n, 'killed': k, 'left': pids still alive}` (`left` is empty
      unless a worker survived SIGKILL, e.g. one stuck in the kernel).
    """
    state_file = pathlib.Path(state_file or default_state_file())
    workers = read_state(state_file)
    alive = [w for w in workers if _is_our_worker(w.pid, w.port)]
    for worker in alive:
        try:
            os.kill(worker.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    remaining = _wait_gone(alive, timeout)
    for worker in remaining:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    left = _wait_gone(remaining, 5.0)
    if not left:
        state_file.unlink(missing_ok=True)
    return {
        'stopped': len(alive),
        'killed': len(remaining),
        'left': [w.pid for w in left],
    }


def _wait_gone(workers: list[WorkerInfo], timeout: float) -> list[WorkerInfo]:
    deadline = time.monotonic() + timeout
    remaining = list(workers)
    while True:
        for worker in remaining:
            _reap(worker.pid)
        remaining = [w for w in remaining if _is_our_worker(w.pid, w.port)]
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(_POLL_SECONDS)


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
            workers = start_workers(
                args.num_workers, base_port=base_port, host=args.host,
                state_file=state_file, ready_timeout=args.ready_timeout)
            print(f'started {len(workers)} TFF workers (pids '
                  f'{" ".join(str(w.pid) for w in workers)}; state {state_file})',
                  file=sys.stderr)
            print(','.join(w.address for w in workers), flush=True)
        elif args.command == 'stop':
            result = stop_workers(state_file=state_file, timeout=args.timeout)
            print(f'stopped {result["stopped"]} TFF workers '
                  f'({result["killed"]} needed SIGKILL)', file=sys.stderr)
            if result['left']:
                print(f'error: still alive: {result["left"]}', file=sys.stderr)
                return 1
        else:
            recorded = read_state(state_file)
            for worker in recorded:
                alive = _is_our_worker(worker.pid, worker.port)
                answers = alive and port_answers('localhost', worker.port)
                print(f'{worker.address} pid {worker.pid}: '
                      f'{"running" if alive else "gone"}'
                      f'{", answers" if answers else ""}')
            if not recorded:
                print(f'no workers recorded in {state_file}')
    except WorkerLaunchError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
