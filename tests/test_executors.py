"""TFF executors that free the worker: values as soon as Python drops them,
evicted executors closed, every executor released when an experiment ends."""

import gc

import grpc
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrecgel import api
from tff_fedrecgel.runtime import executors


class _Executor:
    def __init__(self, cardinalities):
        self.cardinalities = dict(cardinalities)
        self.closed = False

    def close(self):
        self.closed = True


def test_the_factory_keeps_one_executor_per_cardinalities_and_closes_what_it_drops():
    factory = executors.ReleasingExecutorFactory(_Executor, max_executors=2)
    a = factory.create_executor({tff.CLIENTS: 1})
    assert factory.create_executor({tff.CLIENTS: 1}) is a
    b = factory.create_executor({tff.CLIENTS: 2})
    factory.create_executor({tff.CLIENTS: 1})  # `a` is now the latest used.
    c = factory.create_executor({tff.CLIENTS: 3})
    assert b.closed and not a.closed and not c.closed and factory.kept == 2
    factory.clean_up_executor({tff.CLIENTS: 3})
    assert c.closed and factory.kept == 1
    assert factory.release() == 1 and a.closed and factory.kept == 0
    assert factory.create_executor({tff.CLIENTS: 1}) is not a


class _RecordingStub:
    """A worker's stub that records the values and executors it made and freed."""

    def __init__(self, stub):
        self._stub = stub
        self.values, self.disposed, self.executors, self.closed = set(), set(), set(), set()

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def get_executor(self, request):
        response = self._stub.get_executor(request)
        self.executors.add(response.executor.id)
        return response

    def _made(self, name, request):
        response = getattr(self._stub, name)(request)
        self.values.add(response.value_ref.id)
        return response

    def create_value(self, request):
        return self._made('create_value', request)

    def create_call(self, request):
        return self._made('create_call', request)

    def create_struct(self, request):
        return self._made('create_struct', request)

    def create_selection(self, request):
        return self._made('create_selection', request)

    def dispose(self, request):
        self.disposed.update(ref.id for ref in request.value_ref)
        return self._stub.dispose(request)

    def dispose_executor(self, request):
        self.closed.add(request.executor.id)
        return self._stub.dispose_executor(request)


def test_a_call_leaves_nothing_on_the_worker_once_released(tff_runtime):
    tff_runtime.start_worker()
    stub = _RecordingStub(tff.framework.RemoteExecutorGrpcStub(
        grpc.insecure_channel(f'localhost:{tff_runtime.port}')))
    context = executors.worker_context(
        lambda cardinalities: executors.remote_executor(stub, cardinalities))

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def total(values):
        return tff.federated_sum(values)

    with tff.framework.get_context_stack().install(context):
        for n in (2, 3, 2):
            assert total(list(np.arange(n, dtype=np.float32))) == pytest.approx(n * (n - 1) / 2)
    gc.collect()
    # TFF's default frees values 20 at a time: these few calls would leave all.
    assert stub.values and stub.values <= stub.disposed
    assert context.executor_factory.kept == 2 and not stub.closed
    context.executor_factory.release()
    assert stub.executors and stub.closed == stub.executors


def test_an_experiment_releases_the_workers_executors_when_it_ends(tmp_path):
    with api.Session() as session:
        experiment = api.experiment('synthetic', run_dir=tmp_path / 'run',
                                    data_options={'num_users': 30}, total_rounds=1)
        kept_during = []
        factory = tff.framework.get_context_stack().current.executor_factory
        experiment.train(on_round_end=lambda *_: kept_during.append(factory.kept))
        assert kept_during[0] > 0 and factory.kept == 0
        with session.in_use():
            experiment.train(total_rounds=2)
            assert factory.kept > 0  # An open span (here the caller's) keeps them.
        assert factory.kept == 0


def test_a_span_stopped_by_a_signal_leaves_the_executors_to_the_next_span(tff_runtime):
    """A stopped computation may still run in TFF's thread: closing its
    executor under it broke TFF's values (tracebacks at exit)."""
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def total(values):
        return tff.federated_sum(values)

    tff_runtime.install()
    factory = tff.framework.get_context_stack().current.executor_factory
    factory.release()  # What earlier tests of the session left.
    with pytest.raises(KeyboardInterrupt):
        with tff_runtime.in_use():
            assert total([1.0, 2.0]) == pytest.approx(3.0)
            raise KeyboardInterrupt
    assert factory.kept == 1
    with tff_runtime.in_use():
        pass
    assert factory.kept == 0


def test_switching_the_context_releases_the_replaced_ones_executors(tff_runtime):
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def total(values):
        return tff.federated_sum(values)

    def current():
        return tff.framework.get_context_stack().current

    try:
        tff_runtime.install(secure_sum=True)
        secure = current()
        assert tff_runtime.install(secure_sum=True) is tff_runtime and current() is secure
        assert total([1.0, 2.0]) == pytest.approx(3.0)
        assert secure.executor_factory.kept == 1
        tff_runtime.install()  # No experiment runs: released at once.
        assert current() is not secure and secure.executor_factory.kept == 0

        plain = current()
        with tff_runtime.in_use():
            assert total([1.0, 2.0]) == pytest.approx(3.0)
            tff_runtime.install(secure_sum=True)
            assert plain.executor_factory.kept == 1  # An open span keeps them...
        assert plain.executor_factory.kept == 0  # ...until it ends.
    finally:
        tff_runtime.install()


_HOLDS_A_VALUE_AS_THE_WORKER_STOPS = '''
import asyncio
import numpy as np
import tensorflow_federated as tff
from tff_fedrecgel import runtime

local_runtime = runtime.LocalRuntime().install()
executor = tff.framework.get_context_stack().current.executor_factory.create_executor(
    {tff.CLIENTS: 1})
value = asyncio.run(executor.create_value(np.float32(1.0), tff.TensorType(np.float32)))
local_runtime.stop()  # As a stopped run does, with a computation's value still held.
print('stopped')
'''


def test_values_held_when_the_worker_stops_do_not_try_to_free_themselves_on_it():
    """A run stopped mid-computation printed a traceback per value at exit."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, '-c', _HOLDS_A_VALUE_AS_THE_WORKER_STOPS],
                          capture_output=True, text=True, timeout=300, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stdout == 'stopped\n', done.stderr
    assert 'Traceback' not in done.stderr and 'Exception ignored' not in done.stderr, done.stderr
