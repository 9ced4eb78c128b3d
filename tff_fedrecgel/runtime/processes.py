"""This machine's TFF worker processes: where the binary is, which pids are
workers, their memory, and stopping them.

Reads `/proc` (Linux) and imports neither TensorFlow nor TFF, so command
lines that manage workers start at once.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable

WORKER_NAME = 'worker_binary'


def worker_binary_path() -> pathlib.Path:
    """TFF's worker binary inside the installed `tensorflow_federated` package.

    Returns:
      The path of `tensorflow_federated/data/worker_binary`.

    Raises:
      RuntimeError: If the package or the binary is missing.
    """
    # find_spec locates the package without importing it (and TensorFlow).
    spec = importlib.util.find_spec('tensorflow_federated')
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f'tensorflow_federated is not installed for {sys.executable}')
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / 'data' / WORKER_NAME
    if not os.access(path, os.X_OK):
        raise RuntimeError(f'TFF\'s worker binary is missing: no executable {path}')
    return path


def _children(pid: int) -> list[int]:
    children = []
    try:
        for task in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{task}/children') as f:
                children.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return children


def is_worker(pid: int, port: int | None = None) -> bool:
    """Whether `pid` is alive as TFF's worker binary (serving `port`, if given).

    Checks the command line, so a pid reused by another program is not taken
    for a worker.
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
    return WORKER_NAME.encode() in args[0] and (
        port is None or f'--port={port}'.encode() in args)


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        out.append(child)
        out.extend(_descendants(child))
    return out


def peak_rss_mb() -> float:
    """High-water resident memory of this process plus its children (MB).

    TFF's worker process does the computation, so its memory counts too.
    """
    pid = os.getpid()
    return sum(_vm_hwm_kb(p) for p in [pid, *_descendants(pid)]) / 1024


def reset_peak_rss() -> None:
    """Restarts the high-water marks of `peak_rss_mb` (Linux clear_refs)."""
    pid = os.getpid()
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f'/proc/{p}/clear_refs', 'w') as f:
                f.write('5')
        except OSError:
            pass


def worker_pids() -> list[int]:
    """The TFF worker processes started by this process."""
    return [pid for pid in _children(os.getpid()) if is_worker(pid)]


def reap(pids, timeout: float) -> list[int]:
    """Waits up to `timeout` s to collect these children's exit statuses.

    Returns:
      The pids not collected (still running).
    """
    deadline = time.monotonic() + timeout
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        for pid in list(remaining):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                remaining.remove(pid)
        if remaining:
            time.sleep(0.02)
    return remaining


def exited(pid: int) -> bool:
    """Whether `pid` has exited (a zombie or gone), without reaping it."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except (OSError, IndexError):
        return True


def stop_processes(pids: list[int], *, timeout: float,
                   alive: Callable[[int], bool] | None = None) -> tuple[list[int], list[int]]:
    """SIGINT (what TFF's own manager sends its worker), then SIGKILL.

    Never reaps: a parent that waits for its child (TFF's service manager)
    still can.

    Args:
      pids: The processes.
      timeout: Seconds to wait after each signal.
      alive: Whether a pid still runs (default: not `exited`).

    Returns:
      `(killed, left)`: the pids that needed SIGKILL, and those alive even
      after it (e.g. stuck in the kernel).
    """
    alive = alive or (lambda pid: not exited(pid))
    killed = []
    for sig in (signal.SIGINT, signal.SIGKILL):
        if sig == signal.SIGKILL:
            killed = list(pids)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.02)
        pids = [p for p in pids if alive(p)]
        if not pids:
            break
    return killed, pids
