"""Reaching TFF worker services over gRPC, with failures that surface.

Each worker is a TFF executor service (`worker_binary --port=N`, see
`launch/workers.py` and docs/WORKERS.md). `connect_worker` builds a TFF
execution context whose computations run on one such worker: the same stack
as TFF's local C++ context (a `RemoteExecutor` over gRPC), pointed at a
given address instead of a worker it starts itself. Unlike TFF's own stub, a
worker that cannot be reached, dies or exceeds the RPC deadline raises
`WorkerError` at once (TFF's context would retry an unavailable service
forever), so a caller can drop it and carry on.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import dataclasses

import grpc
import tensorflow_federated as tff

from tff_fedrecgel.runtime import executors

# As TFF's own local worker channel: large enough for any round's values.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
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

    context = executors.worker_context(
        lambda cardinalities: executors.remote_executor(stub, cardinalities))
    return WorkerConnection(address, context, stub)
