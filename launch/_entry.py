"""Helpers shared by the absl entry points in ``launch/``.

Usage in a script::

    from tff_fedrecgel.launch import _entry
    _entry.setup_environment()      # before anything imports TensorFlow
    ...
    def main(argv):
        ...                         # validate the flags first, then:
        _entry.tff_runtime()        # TFF's worker, stopped with this process
        ...

    if __name__ == '__main__':
        _entry.register_tff_shutdown()
        _entry.run_main(main)

Errors the user can fix (bad data, bad flags, unwritable output folders, a
full disk) print one line ``error: <message>`` to stderr and exit with status
2, without a traceback (``--verbosity=1`` logs the traceback as well).

Ctrl-C (SIGINT), SIGTERM and SIGHUP unwind the program the same way (clean-up
runs, TFF's worker stops) and print one line; the exit status is 128 + the
signal (130 for Ctrl-C, 143 for SIGTERM).
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
_runtime = None
_interrupted_hint = None
_said_stopped = False


def setup_environment() -> None:
    """Quietens TensorFlow's C++ logging; call before importing TensorFlow.

    `tf_logs.quiet_tensorflow_logs`: TF_CPP_MIN_LOG_LEVEL=0 shows everything.
    """
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tf_logs  # pylint: disable=g-import-not-at-top

    tf_logs.quiet_tensorflow_logs()
    # TFF's worker process (started later, inheriting this environment) is a
    # multi-threaded C++ server; with glibc's default of one malloc arena per
    # thread its memory crept up round after round (Amazon-Video: 1.9 GB
    # after 60 rounds instead of 1.3 GB with two arenas).
    os.environ.setdefault('MALLOC_ARENA_MAX', '2')
    # Also replaces an ignored SIGINT: a background job of a shell script
    # starts with SIGINT ignored, and a worker TFF starts itself would inherit
    # that, though SIGINT is how TFF stops it.
    runtime.install_signal_handlers(on_early_signal=_print_stopped)


def _stopped_line(signum: int, hint: str | None = None) -> str:
    what = ('interrupted (Ctrl-C)' if signum == signal.SIGINT
            else f'terminated ({signal.Signals(signum).name})')
    return f'{what}: stopped' + (f'; {hint}' if hint else '')


def _print_stopped(signum: int) -> None:
    """Says once that a signal stopped the program (a second signal, e.g.
    during the exit hooks, ends it without a second line)."""
    global _said_stopped
    if not _said_stopped:
        _said_stopped = True
        sys.stderr.write(_stopped_line(signum, _interrupted_hint) + '\n')
    sys.stderr.flush()


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
    if 'config' in flags.FLAGS:  # The commands that take a run's settings file.
        from tff_fedrecgel.launch import _config_file  # pylint: disable=g-import-not-at-top
        try:
            argv = [argv[0], *_config_file.expand(argv[1:], list(flags.FLAGS))]
        except DataError as e:
            fail(e)
    from tff_fedrecgel.launch import _flag_groups  # pylint: disable=g-import-not-at-top

    if _flag_groups.wants_help(argv):
        _flag_groups.print_help_and_exit(flags.FLAGS)  # Grouped by concern.
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as e:
        fail(e)
    except UnicodeDecodeError:
        # absl reads --flagfile as text.
        fail('a --flagfile is not a UTF-8 text file (it holds one --flag=value a line)')
    except OSError as e:
        fail(f'cannot read a --flagfile: {e.strerror or e}')


def run_main(main: Callable[[list[str]], Any], *,
             interrupted_hint: str | None = None) -> None:
    """Runs ``main`` with ``absl.app.run``, turning user errors into exit 2.

    Args:
      main: The absl main function, called with the remaining argv.
      interrupted_hint: Appended to the one line printed when a signal stops
        the program (e.g. how to resume).
    """
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    global _interrupted_hint
    _interrupted_hint = interrupted_hint

    def wrapped(argv: list[str]) -> Any:
        if not flags.FLAGS['verbosity'].present:
            # TFF and TensorFlow log every checkpoint at INFO; keep it quiet.
            logging.set_verbosity(logging.WARNING)
        if len(argv) > 1:
            fail(f'unexpected arguments: {" ".join(argv[1:])}')
        try:
            with runtime.armed_signals():
                return main(argv)
        except USER_ERRORS as e:
            logging.debug('Exiting on a user error', exc_info=True)
            fail(e)
        except tf_errors() as e:
            # TensorFlow's own I/O errors (e.g. a full disk under a checkpoint).
            logging.debug('Exiting on a TensorFlow error', exc_info=True)
            fail(e.message)
        except KeyboardInterrupt as e:
            logging.debug('Stopped by a signal', exc_info=True)
            signum = getattr(e, 'signum', signal.SIGINT)
            _print_stopped(signum)
            _exit_without_finalizing(128 + signum)

    app.run(wrapped, flags_parser=_parse_flags)


def _exit_without_finalizing(code: int) -> NoReturn:
    """Runs the exit hooks (TFF's worker stops), then ends the process.

    A signal stops the program while TFF's threads may be inside a call to
    the worker. Python 3.11's finalization ends such threads with
    ``pthread_exit``, which aborts the whole process (status -6, "FATAL:
    exception not rethrown") when the thread is in gRPC's C++ code; exiting
    after the hooks, without finalization, cannot.
    """
    try:
        atexit._run_exitfuncs()  # pylint: disable=protected-access
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)  # pylint: disable=protected-access


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


def tf_errors() -> tuple[type[Exception], ...]:
    """TensorFlow's errors about files and resources, once TF is imported.

    These are I/O or data errors (not found, permission denied, disk full,
    corrupt data): the user's to fix, reported like other user errors.
    """
    tf = sys.modules.get('tensorflow')
    if tf is None:
        return ()
    errors = tf.errors
    return (errors.NotFoundError, errors.PermissionDeniedError,
            errors.ResourceExhaustedError, errors.DataLossError,
            errors.AlreadyExistsError, errors.FailedPreconditionError)


def register_tff_shutdown() -> None:
    """Registers (once) an ``atexit`` hook that stops TFF's worker processes.

    Cheap (imports no TensorFlow): call it at start-up. Entry points then
    call `tff_runtime` before their first TFF computation.
    """
    global _shutdown_registered
    if not _shutdown_registered:
        from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

        atexit.register(runtime.shutdown_tff_workers)
        _shutdown_registered = True


def tff_runtime(*, secure_sum: bool = False):
    """Gives TFF a worker owned by this process; returns its runtime.

    Installs (once; again to change `secure_sum`) a `runtime.LocalRuntime` as
    TFF's default context: its worker starts at the first computation and
    dies with this process, even on SIGKILL. Imports TensorFlow Federated.

    Args:
      secure_sum: Also run TFF's secure-sum intrinsics (simulated).

    Returns:
      The `runtime.LocalRuntime`.
    """
    global _runtime
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    register_tff_shutdown()
    if _runtime is None:
        _runtime = runtime.LocalRuntime()
    return _runtime.install(secure_sum=secure_sum)


def define_checkpoint_flag():
    """--checkpoint of the entry points that serve a run's trained model."""
    from tff_fedrecgel.program import run_folder  # pylint: disable=g-import-not-at-top

    # The script's own flag (as absl names `__main__`), so that --help lists it.
    return flags.DEFINE_enum(
        'checkpoint', run_folder.SELECTED, list(run_folder.CHECKPOINT_CHOICES),
        'selected: the round chosen on the validation item, which the summary '
        'reports (runs with --validation keep it; others serve the latest); '
        'latest: the latest checkpoint.', module_name=sys.argv[0])
