"""TFF's worker process never outlives a program (CI reads pipes to the end)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUN_COMPUTATION = textwrap.dedent('''
    import os, sys
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
    sys.path.insert(0, {repo!r})
    import numpy as np
    import tensorflow_federated as tff
    from tff_fedrecgel import runtime

    @tff.tensorflow.computation(np.int32)
    def add_one(x):
        return x + 1

    assert add_one(1) == 2
    print('workers while running:', len(runtime.worker_pids()), flush=True)
''')


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_piped(code, ignore_sigint=False):
    """Runs code with stdout piped; returns its output or fails on a hang.

    With `ignore_sigint`, the program starts with SIGINT ignored, as a
    background job of a non-interactive shell does (`cmd &` in a script).
    """
    proc = subprocess.Popen(
        [sys.executable, '-c', code], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, preexec_fn=_ignore_sigint if ignore_sigint else None)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise AssertionError('the output pipe stayed open: a worker leaked')
    return proc.returncode, out


@pytest.mark.parametrize('ignore_sigint', [False, True])
def test_shutdown_stops_the_worker(ignore_sigint):
    """After shutdown_tff_workers no worker is left and the pipe closes.

    Also when the worker ignores SIGINT: TFF's own service manager would then
    wait for it forever at exit.
    """
    code = _RUN_COMPUTATION.format(repo=REPO) + textwrap.dedent('''
        runtime.shutdown_tff_workers()
        print('workers after shutdown:', len(runtime.worker_pids()), flush=True)
    ''')
    returncode, out = _run_piped(code, ignore_sigint)
    assert returncode == 0, out
    assert 'workers while running: 1' in out
    assert 'workers after shutdown: 0' in out


def test_entry_point_hook_closes_the_pipe():
    """An entry point's atexit hook stops the worker without explicit calls."""
    code = _RUN_COMPUTATION.format(repo=REPO) + textwrap.dedent('''
        from tff_fedrecgel.launch import _entry
        _entry.register_tff_shutdown()
    ''')
    returncode, out = _run_piped(code)
    assert returncode == 0, out
    assert 'workers while running: 1' in out


def test_entry_points_restore_sigint_for_the_worker():
    """Started with SIGINT ignored, an entry point handles it again, so a
    worker TFF starts itself does not inherit the ignored SIGINT."""
    code = textwrap.dedent(f'''
        import signal, sys
        sys.path.insert(0, {REPO!r})
        print('ignored before:', signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
        from tff_fedrecgel.launch import _entry
        from tff_fedrecgel import runtime
        _entry.setup_environment()
        print('handled after:', signal.getsignal(signal.SIGINT) is runtime.signals._handle_signal)
    ''')
    returncode, out = _run_piped(code, ignore_sigint=True)
    assert returncode == 0, out
    assert 'ignored before: True' in out and 'handled after: True' in out


def _sigterm_during(slow: str, *, setup: str = '', path: tuple[str, ...] = ()):
    """Runs `slow` (code that prints a line, then takes 3 s) with the signal
    handlers armed and sends SIGTERM once the line is out.

    Returns:
      The rest of stdout (`after` once `slow` is over, then how the program
      stopped) and stderr.
    """
    script = '\n'.join([
        'import sys, time, weakref',
        f'sys.path[:0] = {[REPO, *path]!r}',
        'from tff_fedrecgel import runtime',
        textwrap.dedent(setup),
        'runtime.install_signal_handlers()',
        'try:',
        '    with runtime.armed_signals():',
        textwrap.indent(textwrap.dedent(slow).strip(), ' ' * 8),
        "        print('after', flush=True)",
        '        time.sleep(30)',
        "        print('not stopped', flush=True)",
        'except KeyboardInterrupt as e:',
        "    print('stopped by', e.signum, flush=True)"])
    proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline(), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=25)
    finally:
        proc.kill()


def test_a_signal_inside_an_import_stops_the_program_after_it(tmp_path):
    """Imported code may swallow the exception a signal raises (a stopped
    run once went on, half imported): the signal comes again after it."""
    (tmp_path / 'swallowing.py').write_text(textwrap.dedent('''
        import time
        print('importing', flush=True)
        try:
            time.sleep(3)
        except BaseException:
            pass
    '''))
    out, err = _sigterm_during('import swallowing', path=(str(tmp_path),))
    assert out.split('\n')[:2] == ['after', f'stopped by {int(signal.SIGTERM)}'], out + err


_SLOW_FINALIZER = '''
    def slow():
        print('finalizing', flush=True)
        time.sleep(3)

    class Held:
        def __del__(self):
            slow()
'''


@pytest.mark.parametrize('finalizer', [
    'held = Held()\nweakref.finalize(held, slow)\nHeld.__del__ = lambda self: None\ndel held',
    'held = Held()\ndel held',
], ids=['weakref', '__del__'])
def test_a_signal_inside_a_finalizer_stops_the_program_after_it(finalizer):
    """Python drops an exception raised in a finalizer ("Exception ignored
    in ..."), as TFF's freeing of remote values once dropped a second
    Ctrl-C: the signal comes again after it."""
    out, err = _sigterm_during(finalizer, setup=_SLOW_FINALIZER)
    assert out.split('\n')[:2] == ['after', f'stopped by {int(signal.SIGTERM)}'], out + err
    assert 'Exception ignored' not in err, err
