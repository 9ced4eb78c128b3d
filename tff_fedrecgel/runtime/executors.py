"""TFF executors on a worker service that free the worker's memory.

TFF's stack for a worker (`RemoteExecutor`s from a
`ResourceManagingExecutorFactory`) leaves memory on the worker for good in
two ways: a finished value is freed only with 19 others (a batch of 20), and
an executor the factory evicts (it keeps ten, one per set of cardinalities)
is dropped without being closed, so the worker keeps it, its values and the
computations it compiled. A worker shared by many experiments (a search's
trials) grew by ~90 MB a round and ~100 MB an experiment until the kernel
killed it. Here values are freed one by one, evicted executors are closed,
and `release` closes them all when an experiment ends.
"""

from __future__ import annotations

import collections
import threading

import tensorflow_federated as tff

DISPOSE_BATCH_SIZE = 1  # Free a value as soon as Python drops it.
MAX_EXECUTORS = 10  # As TFF's factory: one per recent set of cardinalities.


def remote_executor(stub, cardinalities) -> tff.framework.RemoteExecutor:
    """A `RemoteExecutor` on a worker's stub, as TFF's local context makes.

    Args:
      stub: A `tff.framework.RemoteExecutorGrpcStub` (or one like it).
      cardinalities: The placements' sizes; a missing CLIENTS size is set to
        0 in place (computations without CLIENTS values still need one).

    Returns:
      The executor, its cardinalities set.
    """
    if cardinalities.get(tff.CLIENTS) is None:
        cardinalities[tff.CLIENTS] = 0
    executor = tff.framework.RemoteExecutor(stub, dispose_batch_size=DISPOSE_BATCH_SIZE)
    executor.set_cardinalities(cardinalities)
    return executor


def _key(cardinalities) -> tuple:
    return tuple(sorted((str(placement), size) for placement, size in cardinalities.items()))


class ReleasingExecutorFactory(tff.framework.ExecutorFactory):
    """One executor per set of cardinalities, closed when no longer kept.

    As TFF's `ResourceManagingExecutorFactory`, except that an executor it
    evicts is closed (its worker-side state freed), and `release` closes
    every executor it holds.
    """

    def __init__(self, executor_fn, *, max_executors: int = MAX_EXECUTORS):
        """Keeps nothing yet.

        Args:
          executor_fn: Makes an executor for a cardinalities mapping.
          max_executors: How many executors to keep at most.
        """
        self._executor_fn = executor_fn
        self._max_executors = max_executors
        self._executors: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def kept(self) -> int:
        """How many executors are kept (open on the worker)."""
        return len(self._executors)

    def create_executor(self, cardinalities):
        """The kept executor for these cardinalities, else a new one."""
        key = _key(cardinalities)
        with self._lock:
            executor = self._executors.get(key)
            if executor is not None:
                self._executors.move_to_end(key)
                return executor
        executor = self._executor_fn(cardinalities)
        evicted = []
        with self._lock:
            self._executors[key] = executor
            while len(self._executors) > self._max_executors:
                evicted.append(self._executors.popitem(last=False)[1])
        for old in evicted:
            old.close()
        return executor

    def clean_up_executor(self, cardinalities):
        """Closes the executor for these cardinalities, if one is kept."""
        with self._lock:
            executor = self._executors.pop(_key(cardinalities), None)
        if executor is not None:
            executor.close()

    def release(self) -> int:
        """Closes every kept executor; the next call makes fresh ones.

        Returns:
          How many executors were closed.
        """
        with self._lock:
            executors = list(self._executors.values())
            self._executors.clear()
        for executor in executors:
            executor.close()
        return len(executors)


def worker_context(executor_fn, *, compiler_fn=None) -> tff.framework.SyncExecutionContext:
    """TFF's synchronous context over a `ReleasingExecutorFactory`.

    Args:
      executor_fn: Makes an executor for a cardinalities mapping (e.g.
        `remote_executor` on a stub).
      compiler_fn: The compiler (default: TFF's native one, as its local
        context).

    Returns:
      The context; `context.executor_factory.release()` frees the worker.
    """
    return tff.framework.SyncExecutionContext(
        executor_fn=ReleasingExecutorFactory(executor_fn),
        compiler_fn=compiler_fn or tff.backends.native.desugar_and_transform_to_native,
        transform_args=tff.tensorflow.transform_args,
        transform_result=tff.tensorflow.transform_result,
    )
