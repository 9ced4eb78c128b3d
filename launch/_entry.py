"""Helpers shared by the absl entry points in ``launch/``.

Usage in a script::

    from launch import _entry
    _entry.setup_environment()      # before anything imports TensorFlow
    ...
    if __name__ == '__main__':
        _entry.register_tff_shutdown()
        _entry.run_main(main)

Errors the user can fix (bad data, bad flags, unwritable output folders)
print one line ``error: <message>`` to stderr and exit with status 2, without
a traceback (``--verbosity=1`` logs the traceback as well).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app
from absl import flags
from absl import logging

from tff_fedrecgel.errors import DataError

EXIT_USAGE = 2

# Exceptions that describe a user-fixable problem. `ValueError` covers flag
# validation in `main`; `OSError` covers unwritable output folders.
USER_ERRORS = (DataError, flags.Error, ValueError, OSError)

_shutdown_registered = False


def setup_environment() -> None:
    """Quietens TensorFlow's C++ logging; call before importing TensorFlow.

    Level 3 also hides the harmless CUDA plugin registration errors that
    TensorFlow prints at import on a machine without GPUs; set
    TF_CPP_MIN_LOG_LEVEL=0 to see everything.
    """
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    # TFF's worker process (started later, inheriting this environment) is a
    # multi-threaded C++ server; with glibc's default of one malloc arena per
    # thread its memory crept up round after round (Amazon-Video: 1.9 GB
    # after 60 rounds instead of 1.3 GB with two arenas).
    os.environ.setdefault('MALLOC_ARENA_MAX', '2')
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A background job of a shell script starts with SIGINT ignored, and
        # TFF's worker would inherit that, though SIGINT is how TFF stops it
        # (runtime.shutdown_tff_workers then needs its SIGKILL fallback).
        signal.signal(signal.SIGINT, signal.default_int_handler)


def one_line(message: object) -> str:
    """Collapses a message onto one line."""
    text = ' '.join(str(message).split())
    return text or type(message).__name__


def fail(message: object) -> NoReturn:
    """Prints ``error: <message>`` to stderr and exits with status 2.

    Args:
      message: The message or exception.

    Raises:
      SystemExit: Always, with code 2.
    """
    sys.stderr.write(f'error: {one_line(message)}\n')
    sys.stderr.flush()
    sys.exit(EXIT_USAGE)


def _parse_flags(argv: Sequence[str]) -> list[str]:
    """absl flag parsing with the one-line error convention."""
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as e:
        fail(e)


def run_main(main: Callable[[list[str]], Any]) -> None:
    """Runs ``main`` with ``absl.app.run``, turning user errors into exit 2.

    Args:
      main: The absl main function, called with the remaining argv.
    """

    def wrapped(argv: list[str]) -> Any:
        if not flags.FLAGS['verbosity'].present:
            # TFF and TensorFlow log every checkpoint at INFO; keep it quiet.
            logging.set_verbosity(logging.WARNING)
        if len(argv) > 1:
            fail(f'unexpected arguments: {" ".join(argv[1:])}')
        try:
            return main(argv)
        except USER_ERRORS as e:
            logging.debug('Exiting on a user error', exc_info=True)
            fail(e)

    app.run(wrapped, flags_parser=_parse_flags)


def tensorboard_command(logdir: os.PathLike | str) -> str:
    """The shell command that shows ``logdir`` in TensorBoard.

    `tensorboard` is installed in this Python's environment (usually
    ``.venv``), which is not on PATH outside it: the command names that
    environment's `tensorboard` script, or runs TensorBoard's module with this
    Python where the script is missing. Paths inside the current folder are
    given relative to it.

    Args:
      logdir: The TensorBoard log folder.

    Returns:
      The command, e.g. ``.venv/bin/tensorboard --logdir runs/x/tensorboard``.
    """

    def shown(path: str) -> str:
        relative = os.path.relpath(path)
        return relative if not relative.startswith(os.pardir) else path

    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)),
                          'tensorboard')
    if os.access(script, os.X_OK):
        program = shown(script)
    else:
        program = f'{shown(os.path.abspath(sys.executable))} -m tensorboard.main'
    return f'{program} --logdir {shown(os.path.abspath(logdir))}'


def register_tff_shutdown() -> None:
    """Registers (once) an ``atexit`` hook that stops TFF's worker process."""
    global _shutdown_registered
    if not _shutdown_registered:
        from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

        atexit.register(runtime.shutdown_tff_workers)
        _shutdown_registered = True
