"""Signals: SIGTERM and SIGHUP stop a program the way Ctrl-C does.

`install_signal_handlers` makes them raise in the main thread (so `finally`
blocks and `atexit` run), and `deferred_signals` holds them back while a
checkpoint or an output file is being written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; handled like Ctrl-C (a `KeyboardInterrupt`).

    Attributes:
      signum: The signal number.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_TERMINATING = (signal.SIGTERM, signal.SIGHUP)
_signal_state = {'depth': 0, 'pending': None, 'armed': False, 'unarmed': None}


def _handle_signal(signum, frame):
    if not _signal_state['armed']:
        # Before the program's main code runs (imports) or after it ended:
        # nothing to clean up that the kernel does not do.
        unarmed = _signal_state['unarmed']
        if unarmed is not None:
            unarmed(signum)
        os._exit(128 + signum)  # pylint: disable=protected-access
    if _signal_state['depth'] > 0:
        _signal_state['pending'] = signum
        return
    if _cannot_raise_here(frame):
        # Raised inside an import, the exception can be swallowed by the
        # imported code (a stopped run then went on with a half-imported
        # module and died on it); inside a finalizer (`__del__`, a weakref
        # callback, e.g. TFF's freeing of remote values) Python prints it as
        # "Exception ignored" and drops it: deliver the signal again later.
        timer = threading.Timer(_REDELIVER_SECONDS, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


_REDELIVER_SECONDS = 0.05


def _cannot_raise_here(frame) -> bool:
    """Whether the main thread, at `frame`, is inside an `import` or a finalizer."""
    while frame is not None:
        code = frame.f_code
        if (code.co_filename.startswith('<frozen importlib') or code.co_name == '__del__'
                or code.co_filename == weakref.__file__):
            return True
        frame = frame.f_back
    return False


def install_signal_handlers(*, on_early_signal=None) -> None:
    """SIGINT, SIGTERM and SIGHUP raise in the main thread (call from it).

    SIGINT raises `KeyboardInterrupt`; SIGTERM and SIGHUP raise `Terminated`
    (a `KeyboardInterrupt`), so a terminated program unwinds like an
    interrupted one. Until `armed_signals` is entered, a signal ends the
    process at once with status 128 + signal.

    Args:
      on_early_signal: Called with the signal number before such an early
        exit (e.g. to print a line).
    """
    _signal_state['unarmed'] = on_early_signal
    for signum in (signal.SIGINT, *_TERMINATING):
        signal.signal(signum, _handle_signal)


@contextlib.contextmanager
def armed_signals() -> Iterator[None]:
    """Within, the handlers of `install_signal_handlers` raise exceptions."""
    _signal_state['armed'] = True
    try:
        yield
    finally:
        _signal_state['armed'] = False


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Holds SIGINT/SIGTERM back until the block ends (e.g. a checkpoint write).

    Only with the handlers of `install_signal_handlers`; otherwise a no-op.
    A signal that arrived inside the block is raised when it ends.
    """
    _signal_state['depth'] += 1
    try:
        yield
    finally:
        _signal_state['depth'] -= 1
        pending = _signal_state['pending']
        if _signal_state['depth'] == 0 and pending is not None:
            _signal_state['pending'] = None
            if _signal_state['armed']:
                raise KeyboardInterrupt() if pending == signal.SIGINT else Terminated(pending)
