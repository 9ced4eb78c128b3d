"""TFF's local worker, owned by this process: it never outlives it.

TFF's default context starts its C++ executor service (`worker_binary`) as a
plain child process: killed with SIGKILL or SIGTERM, a program left it
running (about 300 MB, listening on a port), and a runner reading the output
pipe to its end hung on it. `LocalRuntime` owns the worker instead:

* it starts `worker_binary --port=N` itself, with a parent-death signal
  (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`), so the kernel kills the worker
  whenever this process ends, SIGKILL included. util-linux's `setpriv` sets
  it where installed, so no Python code runs in the forked child (a
  `preexec_fn` there can crash while other threads hold locks); the
  `preexec_fn` is the fallback;
* the worker runs in its own process group, so a terminal's Ctrl-C reaches
  only this process, which then stops the worker in order;
* it installs a TFF execution context on that worker, the same stack as TFF's
  local C++ context (a `RemoteExecutor` over gRPC, the native compiler), so
  results are identical;
* `stop()` (also run by `atexit` and on leaving a `with` block) kills and
  reaps the worker and puts back the previous context.

The binary has no flag for its listening address: it binds `[::]:N`. It lives
only as long as this process. `shutdown_tff_workers` stops every worker of
this process, also those TFF started itself (e.g. after
`tff.backends.native.set_sync_local_cpp_execution_context()`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable

from tff_fedrecgel.runtime import processes

_PR_SET_PDEATHSIG = 1
# As TFF's local context: large enough for any round's values.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
_START_ATTEMPTS = 3  # A picked port may be taken before the worker binds it.


class WorkerExitedError(ConnectionError):
    """The local TFF worker died (e.g. killed for lack of memory).

    A `ConnectionError` (so an `OSError`): entry points print it as one
    `error: ...` line.
    """


def _parent_death_preexec() -> Callable[[], None]:
    """A `preexec_fn` making the child die with this process.

    libc's `prctl` is looked up here, before the fork: the child only calls
    it (no loading, no allocation while other threads' locks may be held).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec():
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # The parent died before prctl took effect.
            os._exit(1)  # pylint: disable=protected-access

    return preexec


class LocalRuntime:
    """TFF's local worker, owned by this process, and a context that uses it.

    Usage::

        with runtime.LocalRuntime():
            ...  # TFF computations run on a worker that dies with this process

    The worker starts at the first computation (or with `start_worker`), from
    a thread the runtime keeps alive until `stop`: the parent-death signal
    follows the thread that forked the worker.
    """

    def __init__(self, *, max_concurrent_computation_calls: int = -1,
                 startup_timeout: float = 120.0):
        """Prepares the runtime; nothing starts before `install`.

        Args:
          max_concurrent_computation_calls: As TFF's local context (-1: no
            limit).
          startup_timeout: Seconds to wait for the worker to answer.
        """
        self._max_calls = max_concurrent_computation_calls
        self._startup_timeout = startup_timeout
        self._lock = threading.RLock()
        self._process: subprocess.Popen | None = None
        self._channel = None
        self._stub = None
        self._owner_release: threading.Event | None = None
        self._context = None
        self._secure_sum = False
        self._retired = []  # Replaced contexts whose executors await release.
        self._previous_context = None
        self._installed = False
        self._users = 0
        self.port: int | None = None

    # -- the worker ----------------------------------------------------------

    @property
    def worker_pid(self) -> int | None:
        """The worker's pid while it runs, else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def start_worker(self) -> int:
        """Starts the worker unless it runs; returns its pid.

        Raises:
          RuntimeError: If the runtime is not installed or the worker does
            not start.
          WorkerExitedError: If the worker started earlier has died.
        """
        self._ensure_stub()
        return self._process.pid

    def _ensure_stub(self):
        with self._lock:
            if not self._installed:
                raise RuntimeError('the TFF runtime was stopped')
            if self._process is not None:
                code = self._process.poll()
                if code is not None:
                    how = (f'was killed by {signal.Signals(-code).name}' if code < 0
                           else f'exited with status {code}')
                    raise WorkerExitedError(
                        f'TFF\'s worker process (pid {self._process.pid}) {how}; '
                        'out of memory? The run can be resumed from its latest '
                        'checkpoint')
                return self._stub
            self._start()
            return self._stub

    def _start(self) -> None:
        import grpc  # pylint: disable=g-import-not-at-top
        import portpicker  # pylint: disable=g-import-not-at-top
        import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

        binary = str(processes.worker_binary_path())
        failures = []
        for _ in range(_START_ATTEMPTS):
            port = portpicker.pick_unused_port()
            process = self._spawn_from_owner_thread([
                binary, f'--port={port}',
                f'--max_concurrent_computation_calls={self._max_calls}'])
            channel = grpc.insecure_channel(f'localhost:{port}', options=_CHANNEL_OPTIONS)
            ready = grpc.channel_ready_future(channel)
            deadline = time.monotonic() + self._startup_timeout
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    ready.result(timeout=0.2)
                    break
                except grpc.FutureTimeoutError:
                    continue
            else:
                ready.cancel()
                failures.append(f'port {port}: ' + (
                    f'exit status {process.returncode}' if process.poll() is not None
                    else f'no answer in {self._startup_timeout:g} s'))
                self._kill(process)
                self._release_owner_thread()
                continue
            self._process, self._channel, self.port = process, channel, port
            self._stub = tff.framework.RemoteExecutorGrpcStub(channel)
            return
        raise RuntimeError('TFF\'s worker did not start: ' + '; '.join(failures))

    def _spawn_from_owner_thread(self, args: list[str]) -> subprocess.Popen:
        """Forks the worker from a thread that lives until `stop`."""
        setpriv = shutil.which('setpriv')
        if setpriv:
            args, preexec = [setpriv, '--pdeathsig', 'KILL', '--', *args], None
        else:
            preexec = _parent_death_preexec()
        release = threading.Event()
        result = {}
        started = threading.Event()

        def own():
            try:
                result['process'] = subprocess.Popen(
                    args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    preexec_fn=preexec, process_group=0, close_fds=True)
            except BaseException as e:  # pylint: disable=broad-except
                result['error'] = e
            started.set()
            release.wait()

        threading.Thread(target=own, name='tff-worker-owner', daemon=True).start()
        started.wait()
        if 'error' in result:
            raise result['error']
        self._owner_release = release
        return result['process']

    def _release_owner_thread(self) -> None:
        if self._owner_release is not None:
            self._owner_release.set()
            self._owner_release = None

    @staticmethod
    def _kill(process: subprocess.Popen) -> None:
        # The worker holds no state worth a graceful stop.
        try:
            process.kill()
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    # -- the context ---------------------------------------------------------

    def _executor_fn(self, cardinalities):
        from tff_fedrecgel.runtime import executors  # pylint: disable=g-import-not-at-top

        return executors.remote_executor(self._ensure_stub(), cardinalities)

    def install(self, *, secure_sum: bool = False) -> 'LocalRuntime':
        """Makes this runtime TFF's default execution context.

        Args:
          secure_sum: Compile TFF's secure-sum intrinsics to plain sums of the
            quantized values with range checks (TFF's test backend; simulation
            only, nothing is masked). Other computations run as without it.

        Installing again in the same mode keeps the context (and what its
        executors hold); a replaced context's executors are released as soon
        as no span of work (`in_use`) is open.

        Returns:
          self.
        """
        import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

        from tff_fedrecgel.runtime import executors  # pylint: disable=g-import-not-at-top

        with self._lock:
            if (self._installed and self._secure_sum == secure_sum
                    and tff.framework.get_context_stack().current is self._context):
                return self
        if secure_sum:
            def compiler(comp):
                comp = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
                return tff.backends.native.desugar_and_transform_to_native(comp)
        else:
            compiler = tff.backends.native.desugar_and_transform_to_native
        context = executors.worker_context(self._executor_fn, compiler_fn=compiler)
        with self._lock:
            stack = tff.framework.get_context_stack()
            if not self._installed:
                self._previous_context = stack.current
                _live_runtimes.add(self)
            elif self._context is not None:
                self._retired.append(self._context)
            self._installed = True
            self._context, self._secure_sum = context, secure_sum
            tff.framework.set_default_context(context)
            if self._users == 0:
                self._release_executors(retired_only=True)
        return self

    def _release_executors(self, *, retired_only: bool = False,
                           worker_stopped: bool = False) -> None:
        # Called under the lock: with no span of work open, or just after the
        # worker was stopped. Then values a stopped computation still holds
        # would each try to free themselves on the dead worker (a traceback
        # apiece, at exit); closed executors make their finalizers skip.
        contexts, self._retired = self._retired, []
        if not retired_only and self._context is not None:
            contexts.append(self._context)
        if self.worker_pid is None and not worker_stopped:
            return
        for context in contexts:
            with contextlib.suppress(Exception) if worker_stopped else contextlib.nullcontext():
                context.executor_factory.release()

    @contextlib.contextmanager
    def in_use(self):
        """Marks a span of work (an experiment) that uses this runtime.

        When the last span open ends, the worker's executors are closed, so
        what they hold of that work (compiled computations, values) is freed
        before the next experiment: a search's trials share one worker.
        Spans may nest and overlap (threads). A span left by an exception
        releases nothing: a stopped computation may still be running in
        TFF's event-loop thread, and closing its executor under it left
        TFF's values broken (tracebacks at exit); the next span to end
        cleanly releases every executor.
        """
        with self._lock:
            self._users += 1
        try:
            yield self
        except BaseException:
            with self._lock:
                self._users -= 1
            raise
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._release_executors()

    def stop(self) -> None:
        """Stops the worker and puts back the previous context (idempotent)."""
        with self._lock:
            process, self._process = self._process, None
            if process is not None:
                self._kill(process)
                self._release_executors(worker_stopped=True)
            self._release_owner_thread()
            # Not `channel.close()`: TFF's stub keeps a connectivity
            # subscription whose polling thread fails on a channel closed
            # under it (a gRPC race); a dropped channel unsubscribes when it
            # is collected, and its polling thread ends.
            self._channel = self._stub = None
            if self._installed:
                self._installed = False
                tff = sys.modules.get('tensorflow_federated')
                if tff is not None:
                    stack = tff.framework.get_context_stack()
                    if stack.current is self._context and self._previous_context is not None:
                        with contextlib.suppress(Exception):  # Interpreter teardown.
                            tff.framework.set_default_context(self._previous_context)
            self._context = self._previous_context = None
            self._retired = []
            _live_runtimes.discard(self)

    def __enter__(self) -> 'LocalRuntime':
        return self.install()

    def __exit__(self, *exc_info) -> None:
        self.stop()


_live_runtimes: 'weakref.WeakSet[LocalRuntime]' = weakref.WeakSet()


def _stop_live_runtimes() -> None:
    for local_runtime in list(_live_runtimes):
        local_runtime.stop()


atexit.register(_stop_live_runtimes)


def shutdown_tff_workers() -> None:
    """Stops every TFF worker this process started (no-op without TFF).

    `LocalRuntime`s are stopped first. Workers TFF started itself are
    stopped next, and left unreaped: TFF's service manager, collected next,
    sends its worker SIGINT and then waits for it with no timeout. A worker
    that ignores SIGINT (it inherits that from a background job of a
    non-interactive shell) would make that wait, and so the program's exit,
    hang forever.
    """
    _stop_live_runtimes()
    pids = processes.worker_pids()
    processes.stop_processes(pids, timeout=5.0)
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
    processes.reap(pids, timeout=1.0)  # What no manager reaped.
