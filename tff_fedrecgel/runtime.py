"""Stopping TFF's worker process, so nothing outlives the program.

Executing a TFF computation with the default context starts a `worker_binary`
subprocess (TFF's C++ executor service). It inherits stdout/stderr and
outlives Python unless its service manager is garbage-collected while the
interpreter is still whole, so a runner reading the output pipe to its end
(CI, pytest -s, `cmd | tail`) would hang. `shutdown_tff_workers` installs a
inert context (the old one's manager then stops its worker when collected)
and, for workers whose manager is still referenced somewhere, stops this
process's remaining `worker_binary` children directly.
"""

import gc
import os
import signal
import sys
import time

_WORKER_NAME = 'worker_binary'


def _children(pid: int) -> list[int]:
    children = []
    try:
        for task in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{task}/children') as f:
                children.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return children


def _is_worker(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return _WORKER_NAME.encode() in f.read().split(b'\0')[0]
    except OSError:
        return False


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
    return [pid for pid in _children(os.getpid()) if _is_worker(pid)]


def _wait_gone(pids, timeout):
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


def shutdown_tff_workers() -> None:
    """Stops every TFF worker this process started (no-op without TFF)."""
    tff = sys.modules.get('tensorflow_federated')
    if tff is not None:
        try:
            # An inert context replaces the executing one: its service
            # manager stops the worker when collected, and no new manager is
            # left to fail in its destructor at interpreter teardown.
            from tensorflow_federated.python.core.impl.context_stack import (  # pylint: disable=g-import-not-at-top
                runtime_error_context,
            )

            tff.framework.set_default_context(runtime_error_context.RuntimeErrorContext())
        except Exception:  # pylint: disable=broad-except
            pass  # Interpreter shutting down; fall through to the direct stop.
        gc.collect()
    pids = worker_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGINT)  # What TFF's own manager sends.
        except ProcessLookupError:
            pass
    for pid in _wait_gone(pids, timeout=5.0):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait_gone(pids, timeout=5.0)
