"""TFF worker services on this machine (`worker_binary --port=N`), started
for `--workers` and recorded in a state file.

`start_workers` starts them detached from the calling terminal and pipe
(their own session, output to log files next to the state file) and waits
until each port answers; `stop_workers` sends SIGINT (what TFF itself sends
its worker), then SIGKILL to any still alive after a timeout, and removes the
state file. `launch/workers.py` is the command line over these. Imports
neither TensorFlow nor TFF.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import time

from tff_fedrecgel.runtime import processes

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
    return [w for w in read_state(state_file) if processes.is_worker(w.pid, w.port)]


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
    state_file: pathlib.Path,
    ready_timeout: float = 60.0,
) -> list[WorkerInfo]:
    """Starts `num_workers` TFF worker services on this machine.

    Args:
      num_workers: How many workers.
      base_port: First port (the others follow); None picks free ports.
      host: Host name written into the addresses (the workers listen on all
        interfaces).
      state_file: Where to record them.
      ready_timeout: Seconds to wait for every port to accept connections.

    Returns:
      The started workers, in port order.

    Raises:
      WorkerLaunchError: On a bad count or port, workers already recorded as
        running, or a worker that exits or does not answer in time (the ones
        already started are then stopped again).
    """
    state_file = pathlib.Path(state_file)
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
    try:
        binary = processes.worker_binary_path()
    except RuntimeError as e:
        raise WorkerLaunchError(str(e)) from None
    env = dict(os.environ)
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    workers, started = [], {}
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
        started[port] = process
    # Recorded before waiting, so `stop` can clean up even if this is killed.
    _write_state(state_file, workers)
    deadline = time.monotonic() + ready_timeout
    waiting = list(workers)
    while waiting:
        for worker in list(waiting):
            # poll(), not /proc: until exec the child still looks like Python.
            if started[worker.port].poll() is not None:
                _abort(started.values(), state_file)
                raise WorkerLaunchError(
                    f'worker on port {worker.port} exited at start: '
                    f'{_log_tail(worker.log)}')
            if port_answers('localhost', worker.port, timeout=0.5):
                waiting.remove(worker)
        if waiting and time.monotonic() > deadline:
            _abort(started.values(), state_file)
            raise WorkerLaunchError(
                f'workers on ports {[w.port for w in waiting]} did not answer '
                f'within {ready_timeout:.0f} s')
        if waiting:
            time.sleep(_POLL_SECONDS * 4)
    return workers


def _abort(started, state_file: pathlib.Path) -> None:
    """Stops workers this call just started (SIGINT, then SIGKILL)."""
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in started:
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    state_file.unlink(missing_ok=True)


def stop_workers(*, state_file: pathlib.Path, timeout: float = 10.0) -> dict:
    """Stops the recorded workers: SIGINT, then SIGKILL after `timeout` s.

    Args:
      state_file: The state file of `start_workers`.
      timeout: Seconds to wait after SIGINT before SIGKILL.

    Returns:
      `{'stopped': n, 'killed': k, 'left': pids still alive}` (`left` is empty
      unless a worker survived SIGKILL, e.g. one stuck in the kernel).
    """
    state_file = pathlib.Path(state_file)
    ports = {w.pid: w.port for w in read_state(state_file)}
    alive = [pid for pid, port in ports.items() if processes.is_worker(pid, port)]

    def still_running(pid):
        _reap(pid)
        return processes.is_worker(pid, ports[pid])

    killed, left = processes.stop_processes(alive, timeout=timeout, alive=still_running)
    if not left:
        state_file.unlink(missing_ok=True)
    return {'stopped': len(alive), 'killed': len(killed), 'left': left}
