"""The Python API's TFF session: TFF's execution context on a worker owned
by this process (`runtime.LocalRuntime`), opened and closed by the user or
on first use. `api.Session` and `api.ensure_session` are these.
"""

from __future__ import annotations

import atexit

from tff_fedrecgel import runtime

_open_sessions: list['Session'] = []
_exit_hook = []


def register_exit_hook() -> None:
    """At exit, also stop workers TFF started itself and leave TFF an inert
    context (its default one fails noisily when collected at teardown)."""
    if not _exit_hook:
        atexit.register(runtime.shutdown_tff_workers)
        _exit_hook.append(True)


class Session:
    """TFF's execution context and its worker process, for this process.

    Use as a context manager (`with api.Session():`), or keep the object
    and call `close()` (a notebook). The worker starts at the first
    computation and stops on `close()`, at the end of the `with` block, or
    with the process, however it ends (`runtime.LocalRuntime`).
    """

    def __init__(self, *, max_concurrent_computation_calls: int = -1):
        """Opens the session: TFF computations run on its worker from now on.

        Args:
          max_concurrent_computation_calls: As TFF's local context (-1: no
            limit).
        """
        register_exit_hook()
        self._runtime = runtime.LocalRuntime(
            max_concurrent_computation_calls=max_concurrent_computation_calls).install()
        _open_sessions.append(self)

    @property
    def open(self) -> bool:
        return self in _open_sessions

    @property
    def worker_pid(self) -> int | None:
        """The pid of the session's TFF worker while it runs, else None."""
        return self._runtime.worker_pid

    def use_secure_sum(self) -> None:
        """Also runs TFF's secure sums (simulated), as secure aggregation needs."""
        self._runtime.install(secure_sum=True)

    def in_use(self):
        """A context manager around one experiment: when the last one open
        ends, the worker frees what it held for them (`LocalRuntime.in_use`)."""
        return self._runtime.in_use()

    def close(self) -> None:
        """Stops the worker and puts back the previous context (idempotent)."""
        self._runtime.stop()
        if self in _open_sessions:
            _open_sessions.remove(self)

    def __enter__(self) -> 'Session':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @staticmethod
    def current() -> 'Session | None':
        """The innermost open session, or None."""
        return _open_sessions[-1] if _open_sessions else None


def ensure_session() -> Session:
    """The open session; opens one (lasting until the process ends) if none is."""
    return Session.current() or Session()
