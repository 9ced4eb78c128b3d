"""Runs a FedRecGEL round across several TFF worker services.

Each worker is a TFF executor service (`worker_binary --port=N`, see
`launch/workers.py` and docs/WORKERS.md), reached over gRPC. TFF's mergeable
context can split a cohort across such workers, but it returns SERVER-placed
results only, and FedRecGEL also needs every sampled user's new state back.
So this driver does the split itself:

1. the round's TFF clients (users, or groups of users in vectorized mode) are
   split into one shard per live worker, balanced by examples;
2. every worker runs, concurrently, a shard computation built from the same
   client work as the process (`client_work.build_client_update_fn` or
   `group_client_work.build_group_update_fn`): it returns the shard's client
   states (CLIENTS) and its partial aggregate (SERVER): the weighted sum of
   the updates, the summed weight, the metric sums weighted by contributing
   users, and the user / dropped counts;
3. the driver adds the partial aggregates, divides (the default aggregator's
   weighted mean, dividing safely when every client was dropped) and applies
   the same server Adam step as the process.

The result equals `build_fedrecgel_process(...).next` up to float summation
order. Only the default aggregator (a plain weighted mean) decomposes this
way; `FedRecSimulation` refuses custom aggregators with workers.

Failures: a worker that cannot be reached, dies or exceeds the RPC deadline
raises `WorkerError` inside its shard (TFF's own context would retry an
unavailable service forever). The driver prints one line naming the worker,
drops it, and runs the failed shards once more on the remaining workers. If
that fails too, or no worker is left, `next` raises `WorkerError` and nothing
of the round is applied, so a training run stops with its last checkpoint
intact and resumes from it when started again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import concurrent.futures
import dataclasses
import sys
import threading
from typing import Any

from absl import logging
import grpc
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_work as client_work_lib
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.models import neumf

# As TFF's own local worker channel: large enough for any round's values.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
METRIC_KEYS = ('loss', 'sam_loss_global', 'sam_loss_local', 'num_examples')
# gRPC codes of a worker that is gone, restarted (its executors lost) or hung;
# anything else is an error of the computation itself and would recur on any
# worker, so it is raised as is instead of retried.
_WORKER_LOST_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
})


class WorkerError(ConnectionError):
    """A worker service could not be reached or failed during a round.

    A `ConnectionError` (so an `OSError`): entry points report it as one
    `error: ...` line.

    Attributes:
      address: The worker's `host:port`, or None when several are involved.
    """

    def __init__(self, message: str, *, address: str | None = None):
        super().__init__(message)
        self.address = address


def parse_worker_addresses(workers: str | Sequence[str]) -> list[str]:
    """Validates worker addresses.

    Args:
      workers: `'host:port,host:port'` or a sequence of `'host:port'`.

    Returns:
      The addresses as a list, in the given order.

    Raises:
      ValueError: If empty, malformed, or an address repeats.
    """
    if isinstance(workers, str):
        workers = [w for w in workers.split(',') if w.strip()]
    addresses = [w.strip() for w in workers]
    if not addresses:
        raise ValueError('--workers needs at least one host:port')
    for address in addresses:
        host, sep, port = address.rpartition(':')
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f'--workers: {address!r} is not host:port')
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(f'--workers: repeated address {", ".join(repeated)}')
    return addresses


class _CallDetails(
    collections.namedtuple(
        '_CallDetails',
        ('method', 'timeout', 'metadata', 'credentials', 'wait_for_ready', 'compression'),
    ),
    grpc.ClientCallDetails,
):
    """Mutable-free copy of a call's details (grpc's own type is private)."""


class _DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Gives every RPC a deadline, so a hung worker cannot stall the round."""

    def __init__(self, seconds: float):
        self._seconds = seconds

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details = _CallDetails(
            client_call_details.method,
            self._seconds,
            client_call_details.metadata,
            client_call_details.credentials,
            getattr(client_call_details, 'wait_for_ready', None),
            getattr(client_call_details, 'compression', None),
        )
        return continuation(details, request)


class _FailFastStub(tff.framework.RemoteExecutorStub):
    """TFF's gRPC stub, but a failed RPC raises `WorkerError` at once.

    TFF's execution context retries `RetryableError`s (an unavailable service)
    forever; a `WorkerError` is not retryable, so the driver sees it.
    """

    def __init__(self, address: str, *, rpc_timeout: float):
        self.address = address
        # Serialized request / response bytes (the payload on the wire).
        self.sent_bytes = 0
        self.received_bytes = 0
        channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.channel = channel
        self._stub = tff.framework.RemoteExecutorGrpcStub(
            grpc.intercept_channel(channel, _DeadlineInterceptor(rpc_timeout))
        )

    def _call(self, name: str, request):
        try:
            self.sent_bytes += request.ByteSize()
            response = getattr(self._stub, name)(request)
            self.received_bytes += response.ByteSize()
            return response
        except (grpc.RpcError, tff.framework.RetryableError) as e:
            code = e.code() if hasattr(e, 'code') else None
            details = e.details() if hasattr(e, 'details') else str(e)
            message = (
                f'worker {self.address}: {getattr(code, "name", type(e).__name__)}: '
                f'{" ".join(str(details).split())}'
            )
            if code is None or code in _WORKER_LOST_CODES:
                raise WorkerError(message, address=self.address) from None
            raise RuntimeError(message) from None

    def _call_quietly(self, name: str, request):
        # Freeing values on a worker that is gone: nothing left to free.
        try:
            return self._call(name, request)
        except WorkerError:
            return None

    def get_executor(self, request):
        return self._call('get_executor', request)

    def create_value(self, request):
        return self._call('create_value', request)

    def create_struct(self, request):
        return self._call('create_struct', request)

    def create_call(self, request):
        return self._call('create_call', request)

    def create_selection(self, request):
        return self._call('create_selection', request)

    def compute(self, request):
        return self._call('compute', request)

    def dispose(self, request):
        return self._call_quietly('dispose', request)

    def dispose_executor(self, request):
        return self._call_quietly('dispose_executor', request)

    @property
    def is_ready(self) -> bool:
        return self._stub.is_ready


@dataclasses.dataclass(frozen=True)
class WorkerConnection:
    """A TFF execution context bound to one worker service.

    Attributes:
      address: The worker's `host:port`.
      context: A `tff.framework.SyncExecutionContext` running computations on
        the worker; install it with
        `tff.framework.get_context_stack().install(context)`.
    """

    address: str
    context: tff.framework.SyncExecutionContext
    _stub: _FailFastStub

    @property
    def sent_bytes(self) -> int:
        """Serialized bytes sent to the worker so far."""
        return self._stub.sent_bytes

    @property
    def received_bytes(self) -> int:
        """Serialized bytes received from the worker so far."""
        return self._stub.received_bytes


def connect_worker(
    address: str, *, rpc_timeout: float = 600.0, connect_timeout: float = 10.0
) -> WorkerConnection:
    """Connects to one worker service and builds a TFF context for it.

    The same stack as TFF's local C++ context (a `RemoteExecutor` over gRPC),
    pointed at `address` instead of a worker it starts itself.

    Args:
      address: The worker's `host:port`.
      rpc_timeout: Deadline of each RPC, seconds.
      connect_timeout: Seconds to wait for the worker to answer.

    Returns:
      A `WorkerConnection`.

    Raises:
      WorkerError: If the worker does not answer within `connect_timeout`.
    """
    stub = _FailFastStub(address, rpc_timeout=rpc_timeout)
    try:
        grpc.channel_ready_future(stub.channel).result(timeout=connect_timeout)
    except grpc.FutureTimeoutError:
        raise WorkerError(
            f'worker {address} does not answer (is `worker_binary --port=` '
            'running there? see launch/start_workers.sh)',
            address=address,
        ) from None

    def executor_fn(cardinalities):
        # As TFF's local context: computations without CLIENTS values still
        # need a cardinality for the placement.
        cardinalities.setdefault(tff.CLIENTS, 0)
        executor = tff.framework.RemoteExecutor(stub)
        executor.set_cardinalities(cardinalities)
        return executor

    context = tff.framework.SyncExecutionContext(
        executor_fn=tff.framework.ResourceManagingExecutorFactory(executor_fn),
        compiler_fn=tff.backends.native.desugar_and_transform_to_native,
        transform_args=tff.tensorflow.transform_args,
        transform_result=tff.tensorflow.transform_result,
    )
    return WorkerConnection(address, context, stub)


def split_into_shards(costs: Sequence[float], num_shards: int) -> list[list[int]]:
    """Splits clients into at most `num_shards` shards of similar total cost.

    Greedy longest-first assignment; deterministic; shards keep the clients
    in their original order and empty shards are dropped.

    Args:
      costs: Each client's cost (its examples).
      num_shards: How many shards at most.

    Returns:
      Lists of client indices.
    """
    loads = [0.0] * num_shards
    shards = [[] for _ in range(num_shards)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(num_shards), key=lambda s: (loads[s], s))
        shards[target].append(i)
        loads[target] += costs[i]
    return [sorted(s) for s in shards if s]


def _client_cost(data) -> float:
    items = np.asarray(data['items'])
    return float(max(items.size, 1))


@dataclasses.dataclass
class WorkerFailure:
    """One worker dropped by the driver.

    Attributes:
      address: The worker's `host:port`.
      round_num: The round in which it failed.
      message: What went wrong.
    """

    address: str
    round_num: int
    message: str


class MultiWorkerRound:
    """The FedRecGEL round of `build_fedrecgel_process`, across workers.

    `next` has the process's signature and results (persistent mode:
    `next(server_state, client_states, client_data) -> (server_state,
    client_states, metrics)`; reconstruct mode: `next(server_state,
    client_data) -> (server_state, metrics)`), for the default aggregator.
    """

    def __init__(
        self,
        *,
        workers: str | Sequence[str],
        model_config: neumf.ModelConfig,
        work: client_work_lib.ClientWorkConfig,
        server_lr: float = 0.001,
        vectorized: bool = False,
        rpc_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        report: Callable[[str], None] | None = None,
    ):
        """Connects to the workers and builds the shard computation.

        Args:
          workers: `'host:port,...'` or a sequence of `'host:port'`.
          model_config: The NeuMF sizes.
          work: What each client does.
          server_lr: Learning rate of the server Adam (as the process's).
          vectorized: Each TFF client is a group of users (as the process's).
          rpc_timeout: Deadline of each RPC to a worker, seconds; a worker
            exceeding it counts as failed.
          connect_timeout: Seconds to wait for each worker to answer now.
          report: Receives the one-line message when a worker fails (default:
            printed to stderr).

        Raises:
          ValueError: On malformed addresses or an unsupported `work` in
            vectorized mode.
          WorkerError: If a worker does not answer.
        """
        self.addresses = parse_worker_addresses(workers)
        self.persistent = work.local_state == 'persistent'
        self._report = report or _print_to_stderr
        self.failures: list[WorkerFailure] = []
        # Shards each worker has completed (which workers did the work).
        self.shards_done: collections.Counter[str] = collections.Counter()
        # Serialized bytes sent to / received from each worker in the last round.
        self.last_round_traffic: dict[str, tuple[int, int]] = {}
        self.connections = {
            address: connect_worker(
                address, rpc_timeout=rpc_timeout, connect_timeout=connect_timeout
            )
            for address in self.addresses
        }
        self._live = list(self.addresses)
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(self.addresses), thread_name_prefix='tff-worker'
        )
        self._shard = _build_shard_computation(model_config, work, vectorized)
        self._server_optimizer = tff.learning.optimizers.build_adam(
            learning_rate=server_lr, epsilon=fedrecgel.SERVER_ADAM_EPSILON
        )
        self._server_step = tf.function(self._server_optimizer.next)

    def _traffic(self) -> dict[str, tuple[int, int]]:
        return {
            a: (c.sent_bytes, c.received_bytes) for a, c in self.connections.items()
        }

    @property
    def live_workers(self) -> list[str]:
        """The workers still in use (failed ones are dropped)."""
        return list(self._live)

    def close(self) -> None:
        """Releases the driver's threads (the workers keep running)."""
        self._pool.shutdown(wait=True)

    def _on_worker(self, address: str, fn: Callable[..., Any], *args) -> Any:
        """Runs `fn(*args)` with TFF computations executing on `address`."""
        # The context stack is thread-local: this installs it for this thread.
        with tff.framework.get_context_stack().install(self.connections[address].context):
            return fn(*args)

    def _drop(self, address: str, round_num: int, error: Exception) -> None:
        with self._lock:
            if address in self._live:
                self._live.remove(address)
            left = len(self._live)
        message = (
            f'warning: worker {address} failed in round {round_num} ({error}); '
            f'dropped it, {left} worker{"s" if left != 1 else ""} left'
        )
        self.failures.append(WorkerFailure(address, round_num, str(error)))
        logging.debug('worker %s failed', address, exc_info=error)
        self._report(message)

    def initialize(self, process: tff.templates.IterativeProcess):
        """`process.initialize()` on a worker (so the driver starts none)."""
        for address in list(self._live):
            try:
                return self._on_worker(address, process.initialize)
            except WorkerError as e:
                self._drop(address, 0, e)
        raise WorkerError('no worker left to initialize the model on')

    def next(self, server_state, *args):
        """One round; same arguments and results as the process's `next`.

        Raises:
          WorkerError: If the round failed on a worker and again on the
            remaining ones (or none is left); nothing of the round is applied.
        """
        if self.persistent:
            client_states, client_data = args
        else:
            (client_data,) = args
            client_states = None
        round_num = int(server_state['round_num']) + 1
        if not client_data:
            raise ValueError('a round needs at least one client')
        costs = [_client_cost(d) for d in client_data]
        traffic_before = self._traffic()
        shard_of_client = split_into_shards(costs, max(len(self._live), 1))
        results = {}  # First client index of a shard -> (indices, output).
        pending = shard_of_client
        for attempt in range(2):
            workers = list(self._live)
            if not workers:
                break
            if attempt:
                # The failed shards' clients, split again over the survivors.
                retry = sorted(i for shard in pending for i in shard)
                pending = [
                    [retry[j] for j in shard]
                    for shard in split_into_shards([costs[i] for i in retry], len(workers))
                ]
                self._report(
                    f'retrying the {len(retry)} TFF client'
                    f'{"s" if len(retry) != 1 else ""} of round {round_num} on '
                    f'{len(workers)} worker{"s" if len(workers) != 1 else ""}'
                )
            futures = {}
            for shard, address in zip(pending, workers):
                args_of_shard = [list(server_state['global_weights'])]
                if self.persistent:
                    args_of_shard.append([client_states[i] for i in shard])
                args_of_shard.append([client_data[i] for i in shard])
                future = self._pool.submit(
                    self._on_worker, address, self._shard, *args_of_shard
                )
                futures[future] = (address, shard)
            failed = []
            for future, (address, shard) in futures.items():
                try:
                    results[shard[0]] = (shard, future.result())
                    self.shards_done[address] += 1
                except WorkerError as e:
                    self._drop(address, round_num, e)
                    failed.append(shard)
            if not failed:
                outputs = self._finish(server_state, client_data, results)
                after = self._traffic()
                self.last_round_traffic = {
                    a: (sent - traffic_before[a][0], received - traffic_before[a][1])
                    for a, (sent, received) in after.items()
                }
                logging.info(
                    'round %d: %d TFF clients in %d shards; bytes sent/received: %s',
                    round_num, len(client_data), len(results),
                    ', '.join(f'{a} {s:,}/{r:,}' for a, (s, r) in self.last_round_traffic.items()),
                )
                return outputs
            pending = failed
        reason = (
            f'failed again on the retry ({len(self._live)} of '
            f'{len(self.addresses)} workers left: {",".join(self._live)})'
            if self._live
            else f'no worker left (all {len(self.addresses)} failed)'
        )
        raise WorkerError(
            f'round {round_num}: {reason}; nothing of the round was applied (a '
            'training run stops here and resumes from its latest checkpoint when '
            'started again)'
        )

    def _finish(self, server_state, client_data, results):
        """Merges the shards' partial aggregates; applies the server step."""
        shards = [results[k] for k in sorted(results)]
        partials = []
        new_states = [None] * len(client_data)
        for indices, output in shards:
            if self.persistent:
                states, partial = output
                for i, state in zip(indices, states):
                    new_states[i] = state
            else:
                partial = output
            partials.append(partial)
        total = _sum_partials(partials)
        weight = np.float32(total['weight'])
        mean_update = [
            (w / weight if weight != 0 else np.zeros_like(w)).astype(np.float32)
            for w in total['weighted_update']
        ]
        contributing = int(total['contributing'])
        old_weights = list(server_state['global_weights'])
        old_optimizer = server_state['optimizer_state']
        if contributing > 0:
            new_optimizer, new_weights = self._server_step(
                _as_tensors(old_optimizer), _as_tensors(old_weights), _as_tensors(mean_update)
            )
            # Back to numpy, in the containers the process returns.
            new_optimizer = tf.nest.pack_sequence_as(
                old_optimizer, [t.numpy() for t in tf.nest.flatten(new_optimizer)]
            )
            new_weights = [t.numpy() for t in new_weights]
        else:
            # A round where every client was dropped leaves the model untouched.
            new_optimizer, new_weights = old_optimizer, old_weights
        new_server_state = collections.OrderedDict(
            global_weights=new_weights,
            optimizer_state=new_optimizer,
            aggregator_state=server_state['aggregator_state'],
            round_num=np.int32(int(server_state['round_num']) + 1),
        )
        with np.errstate(invalid='ignore', divide='ignore'):
            means = {
                k: np.float32(np.float32(total['metric_sums'][k]) / np.float32(contributing))
                for k in METRIC_KEYS
            }
        metrics = collections.OrderedDict(
            loss=means['loss'],
            sam_loss_global=means['sam_loss_global'],
            sam_loss_local=means['sam_loss_local'],
            examples_per_client=means['num_examples'],
            clients=np.int32(total['users']),
            dropped_clients=np.int32(total['dropped']),
            # The default mean's (empty) measurements, as the process reports.
            aggregation=collections.OrderedDict(mean_value=(), mean_weight=()),
        )
        if self.persistent:
            return new_server_state, new_states, metrics
        return new_server_state, metrics


def _print_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _as_tensors(structure):
    return tf.nest.map_structure(tf.convert_to_tensor, structure)


def _sum_partials(partials):
    """Adds the shards' partial aggregates (float64, then back to float32)."""

    def add(*values):
        arrays = [np.asarray(v) for v in values]
        if arrays[0].dtype.kind == 'f':
            return np.sum([a.astype(np.float64) for a in arrays], axis=0).astype(np.float32)
        return np.sum(arrays, axis=0).astype(arrays[0].dtype)

    return tf.nest.map_structure(add, *partials)


def _build_shard_computation(
    model_config: neumf.ModelConfig,
    work: client_work_lib.ClientWorkConfig,
    vectorized: bool,
) -> tff.Computation:
    """The per-shard computation, from the same client work as the process.

    Persistent mode: `(global_weights@SERVER, client_states@CLIENTS,
    client_data@CLIENTS) -> (client_states@CLIENTS, partial@SERVER)`;
    reconstruct mode: `(global_weights@SERVER, client_data@CLIENTS) ->
    partial@SERVER`. `partial` is the sum over the shard's clients of
    OrderedDict(weighted_update, weight, metric_sums, contributing, users,
    dropped), the pieces of the process's weighted means.
    """
    persistent = work.local_state == 'persistent'
    global_type = tff.types.tensorflow_to_type(
        client_work_lib.global_weight_specs(model_config)
    )
    state_type, data_type, update_fn = fedrecgel.client_work_for(
        model_config, work, vectorized=vectorized
    )

    def partial_of(out):
        # As the process: the update weighted by its weight (MeanFactory), the
        # metrics by the client's contributing users (federated_mean's weight).
        contributing = out['users'] - out['dropped']
        as_float = tf.cast(contributing, tf.float32)
        return collections.OrderedDict(
            weighted_update=[u * out['weight'] for u in out['update']],
            weight=out['weight'],
            metric_sums=collections.OrderedDict(
                (k, out['metrics'][k] * as_float) for k in METRIC_KEYS
            ),
            contributing=contributing,
            users=out['users'],
            dropped=out['dropped'],
        )

    server_weights = tff.FederatedType(global_type, tff.SERVER)
    data_at = tff.FederatedType(data_type, tff.CLIENTS)
    if persistent:

        @tff.tensorflow.computation(global_type, state_type, data_type)
        def client_partial(global_weights, client_state, data):
            out = update_fn(global_weights, client_state, data)
            return collections.OrderedDict(
                client_state=out['client_state'], partial=partial_of(out)
            )

        @tff.federated_computation(
            server_weights, tff.FederatedType(state_type, tff.CLIENTS), data_at
        )
        def shard(global_weights, client_states, client_data):
            outputs = tff.federated_map(
                client_partial,
                (tff.federated_broadcast(global_weights), client_states, client_data),
            )
            return outputs.client_state, tff.federated_sum(outputs.partial)

    else:

        @tff.tensorflow.computation(global_type, data_type)
        def client_partial(global_weights, data):
            return partial_of(update_fn(global_weights, None, data))

        @tff.federated_computation(server_weights, data_at)
        def shard(global_weights, client_data):
            return tff.federated_sum(
                tff.federated_map(
                    client_partial, (tff.federated_broadcast(global_weights), client_data)
                )
            )

    return shard
