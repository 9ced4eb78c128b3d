"""The FedRecGEL round split across several TFF worker services.

TFF's mergeable context can split a cohort across workers, but it returns
SERVER-placed results only, and FedRecGEL also needs every sampled user's new
state back. So this driver splits the round itself, from the round's own
parts (`fedrecgel.build_round_pieces`):

1. the round's TFF clients are split into one shard per live worker,
   balanced by examples (`data.batching.split_into_shards`);
2. every worker runs, concurrently, a shard computation that maps the
   round's `client_work` over its clients and returns their new states
   (CLIENTS) and the partial sums of the default aggregator's weighted mean
   and of the metrics (SERVER);
3. the driver adds the partial sums, divides, and runs the round's
   `server_update` on a worker.

The result equals the process's `next` up to float summation order. Only the
default aggregator (a plain weighted mean) decomposes this way.

Failures: a worker that cannot be reached, dies or exceeds the RPC deadline
raises `transport.WorkerError` inside its shard. The driver prints one line
naming the worker, drops it, and runs the failed shards once more on the
remaining workers. If that fails too, or no worker is left, `next` raises
`WorkerError` and nothing of the round is applied, so a training run stops
with its last checkpoint intact and resumes from it when started again.
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
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import round_parts
from tff_fedrecgel.data import batching
from tff_fedrecgel.simulation import transport

METRIC_KEYS = client_update_lib.METRIC_NAMES


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


def _build_shard_computation(pieces: fedrecgel.RoundPieces) -> tff.Computation:
    """The round's client work over one shard, with partial aggregates.

    Persistent mode: `(global_weights@SERVER, client_states@CLIENTS,
    client_data@CLIENTS) -> (client_states@CLIENTS, partial@SERVER)`;
    reconstruct mode: `(global_weights@SERVER, client_data@CLIENTS) ->
    partial@SERVER`. `partial` sums over the shard's clients the pieces of the
    round's weighted means: the weighted update, the weight, the metrics
    weighted by contributing users, and the user and dropped counts.
    """
    persistent = pieces.client_state_type is not None
    output_type = pieces.client_work.type_signature.result

    @tff.tensorflow.computation(output_type)
    def partial_of(out):
        contributing = out['users'] - out['dropped']
        as_float = tf.cast(contributing, tf.float32)
        return collections.OrderedDict(
            weighted_update=[u * out['weight'] for u in out['update']],
            weight=out['weight'],
            metric_sums=collections.OrderedDict(
                (k, out['metrics'][k] * as_float) for k in METRIC_KEYS),
            contributing=contributing, users=out['users'], dropped=out['dropped'])

    server_weights = tff.FederatedType(pieces.global_type, tff.SERVER)
    data_at = tff.FederatedType(pieces.client_data_type, tff.CLIENTS)
    if persistent:

        @tff.federated_computation(
            server_weights, tff.FederatedType(pieces.client_state_type, tff.CLIENTS), data_at)
        def shard(global_weights, client_states, client_data):
            outputs = tff.federated_map(pieces.client_work, (
                tff.federated_broadcast(global_weights), client_states, client_data))
            return (outputs.client_state,
                    tff.federated_sum(tff.federated_map(partial_of, outputs)))

    else:

        @tff.federated_computation(server_weights, data_at)
        def shard(global_weights, client_data):
            outputs = tff.federated_map(pieces.client_work, (
                tff.federated_broadcast(global_weights), client_data))
            return tff.federated_sum(tff.federated_map(partial_of, outputs))

    return shard


def _sum_partials(partials):
    """Adds the shards' partial aggregates (float64, then back to float32)."""

    def add(*values):
        arrays = [np.asarray(v) for v in values]
        if arrays[0].dtype.kind == 'f':
            return np.sum([a.astype(np.float64) for a in arrays], axis=0).astype(np.float32)
        return np.sum(arrays, axis=0).astype(arrays[0].dtype)

    return tf.nest.map_structure(add, *partials)


class ShardedRound:
    """The round of `fedrecgel.build_round_pieces`, across worker services.

    `next` has the process's signature and results (persistent mode:
    `next(server_state, client_states, client_data) -> (server_state,
    client_states, metrics)`; reconstruct mode: `next(server_state,
    client_data) -> (server_state, metrics)`), for the default aggregator.
    """

    def __init__(
        self,
        *,
        workers: str | Sequence[str],
        pieces: fedrecgel.RoundPieces,
        rpc_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        report: Callable[[str], None] | None = None,
    ):
        """Connects to the workers and builds the shard computation.

        Args:
          workers: `'host:port,...'` or a sequence of `'host:port'`.
          pieces: The round's parts (built with the default aggregator).
          rpc_timeout: Deadline of each RPC to a worker, seconds; a worker
            exceeding it counts as failed.
          connect_timeout: Seconds to wait for each worker to answer now.
          report: Receives the one-line message when a worker fails (default:
            printed to stderr).

        Raises:
          ValueError: On malformed addresses.
          WorkerError: If a worker does not answer.
        """
        self.addresses = transport.parse_worker_addresses(workers)
        self.pieces = pieces
        self.persistent = pieces.client_state_type is not None
        self._report = report or (lambda m: print(m, file=sys.stderr, flush=True))
        self.failures: list[WorkerFailure] = []
        # Shards each worker has completed (which workers did the work).
        self.shards_done: collections.Counter[str] = collections.Counter()
        # Serialized bytes sent to / received from each worker in the last round.
        self.last_round_traffic: dict[str, tuple[int, int]] = {}
        self.connections = {
            address: transport.connect_worker(address, rpc_timeout=rpc_timeout,
                                              connect_timeout=connect_timeout)
            for address in self.addresses}
        self._live = list(self.addresses)
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(self.addresses), thread_name_prefix='tff-worker')
        self._shard = _build_shard_computation(pieces)

    @property
    def live_workers(self) -> list[str]:
        """The workers still in use (failed ones are dropped)."""
        return list(self._live)

    def close(self) -> None:
        """Releases the driver's threads (the workers keep running)."""
        self._pool.shutdown(wait=True)

    def _traffic(self) -> dict[str, tuple[int, int]]:
        return {a: (c.sent_bytes, c.received_bytes) for a, c in self.connections.items()}

    def _on_worker(self, address: str, fn: Callable[..., Any], *args) -> Any:
        """Runs `fn(*args)` with TFF computations executing on `address`."""
        # The context stack is thread-local: this installs it for this thread.
        with tff.framework.get_context_stack().install(self.connections[address].context):
            return fn(*args)

    def _on_any_worker(self, round_num: int, fn: Callable[..., Any], *args) -> Any:
        for address in list(self._live):
            try:
                return self._on_worker(address, fn, *args)
            except transport.WorkerError as e:
                self._drop(address, round_num, e)
        raise transport.WorkerError(f'round {round_num}: no worker left')

    def _drop(self, address: str, round_num: int, error: Exception) -> None:
        with self._lock:
            if address in self._live:
                self._live.remove(address)
            left = len(self._live)
        self.failures.append(WorkerFailure(address, round_num, str(error)))
        logging.debug('worker %s failed', address, exc_info=error)
        self._report(f'warning: worker {address} failed in round {round_num} ({error}); '
                     f'dropped it, {left} worker{"s" if left != 1 else ""} left')

    def initialize(self):
        """The process's `initialize()` on a worker (so the driver starts none)."""
        return self._on_any_worker(0, self.pieces.process.initialize)

    def next(self, server_state, *args):
        """One round; same arguments and results as the process's `next`.

        Raises:
          WorkerError: If the round failed on a worker and again on the
            remaining ones (or none is left); nothing of the round is applied.
        """
        client_states, client_data = args if self.persistent else (None, args[0])
        round_num = int(server_state.round_num) + 1
        if not client_data:
            raise ValueError('a round needs at least one client')
        costs = [float(max(np.asarray(d['items']).size, 1)) for d in client_data]
        traffic_before = self._traffic()
        results = {}  # First client index of a shard -> (indices, output).
        pending = batching.split_into_shards(costs, max(len(self._live), 1))
        for attempt in range(2):
            workers = list(self._live)
            if not workers:
                break
            if attempt:
                # The failed shards' clients, split again over the survivors.
                retry = sorted(i for shard in pending for i in shard)
                pending = [[retry[j] for j in shard] for shard in
                           batching.split_into_shards([costs[i] for i in retry], len(workers))]
                self._report(f'retrying the {len(retry)} TFF client'
                             f'{"s" if len(retry) != 1 else ""} of round {round_num} on '
                             f'{len(workers)} worker{"s" if len(workers) != 1 else ""}')
            futures = {}
            for shard, address in zip(pending, workers):
                shard_args = [list(server_state.global_weights)]
                if self.persistent:
                    shard_args.append([client_states[i] for i in shard])
                shard_args.append([client_data[i] for i in shard])
                future = self._pool.submit(self._on_worker, address, self._shard, *shard_args)
                futures[future] = (address, shard)
            failed = []
            for future, (address, shard) in futures.items():
                try:
                    results[shard[0]] = (shard, future.result())
                    self.shards_done[address] += 1
                except transport.WorkerError as e:
                    self._drop(address, round_num, e)
                    failed.append(shard)
            if not failed:
                outputs = self._finish(server_state, len(client_data), results, round_num)
                after = self._traffic()
                self.last_round_traffic = {
                    a: (sent - traffic_before[a][0], received - traffic_before[a][1])
                    for a, (sent, received) in after.items()}
                return outputs
            pending = failed
        reason = (f'failed again on the retry ({len(self._live)} of '
                  f'{len(self.addresses)} workers left: {",".join(self._live)})'
                  if self._live else f'no worker left (all {len(self.addresses)} failed)')
        raise transport.WorkerError(
            f'round {round_num}: {reason}; nothing of the round was applied (a training '
            'run stops here and resumes from its latest checkpoint when started again)')

    def _finish(self, server_state, num_clients, results, round_num):
        """Merges the shards' partial aggregates; runs the round's server update."""
        partials, new_states = [], [None] * num_clients
        for indices, output in (results[k] for k in sorted(results)):
            if self.persistent:
                states, output = output
                for i, state in zip(indices, states):
                    new_states[i] = state
            partials.append(output)
        total = _sum_partials(partials)
        weight = np.float32(total['weight'])
        mean_update = [(w / weight if weight != 0 else np.zeros_like(w)).astype(np.float32)
                       for w in total['weighted_update']]
        contributing = int(total['contributing'])
        server = self._on_any_worker(
            round_num, self.pieces.server_update, list(server_state.global_weights),
            server_state.optimizer_state, server_state.round_num, mean_update,
            np.int32(contributing))
        new_server_state = fedrecgel.ServerState(
            global_weights=list(server['global_weights']),
            optimizer_state=server['optimizer_state'],
            aggregator_state=server_state.aggregator_state, round_num=server['round_num'],
            distributor_state=server_state.distributor_state,
            client_work_state=server_state.client_work_state)
        with np.errstate(invalid='ignore', divide='ignore'):
            means = {k: np.float32(np.float32(total['metric_sums'][k]) / np.float32(contributing))
                     for k in METRIC_KEYS}
        metrics = round_parts.round_metrics(
            means.__getitem__, clients=np.int32(total['users']),
            dropped_clients=np.int32(total['dropped']),
            # The default mean's (empty) measurements, as the process reports.
            aggregation=collections.OrderedDict(mean_value=(), mean_weight=()))
        if self.persistent:
            return new_server_state, new_states, metrics
        return new_server_state, metrics
