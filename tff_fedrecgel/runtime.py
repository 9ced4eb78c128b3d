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


def _exited(pid: int) -> bool:
    """Whether `pid` has exited (a zombie or gone), without reaping it."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except (OSError, IndexError):
        return True


def _stop(pids: list[int], timeout: float) -> None:
    """SIGINT (what TFF's own manager sends), then SIGKILL; never reaps."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(_exited(p) for p in pids):
            time.sleep(0.02)
        pids = [p for p in pids if not _exited(p)]
        if not pids:
            return


def shutdown_tff_workers() -> None:
    """Stops every TFF worker this process started (no-op without TFF).

    The workers are stopped first, and left unreaped: TFF's service manager,
    collected next, sends its worker SIGINT and then waits for it with no
    timeout. A worker that ignores SIGINT (it inherits that from a
    background job of a non-interactive shell) would make that wait, and so
    the program's exit, hang forever.
    """
    pids = worker_pids()
    _stop(pids, timeout=5.0)
    tff = sys.modules.get('tensorflow_federated')
    if tff is not None:
        try:
            # An inert context replaces the executing one: its service
            # manager is collected (reaping its stopped worker), and no new
            # manager is left to fail in its destructor at interpreter teardown.
            from tensorflow_federated.python.core.impl.context_stack import (  # pylint: disable=g-import-not-at-top
                runtime_error_context,
            )

            tff.framework.set_default_context(runtime_error_context.RuntimeErrorContext())
        except Exception:  # pylint: disable=broad-except
            pass  # Interpreter shutting down.
        gc.collect()
    _wait_gone(pids, timeout=1.0)  # Reap what no manager reaped.
