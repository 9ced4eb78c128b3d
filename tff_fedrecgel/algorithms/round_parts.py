"""The parts FedRecGEL's round is composed of, each a TFF process with state.

As TFF's own learning algorithms (`tff.learning.templates.compose_learning_process`),
a round is

  distributor   `build_distributor`, TFF's broadcast process: the global
                weights to the clients (FedRecon's `build_fed_recon` is
                given the same one);
  client work   `build_client_work_process`: the client update over the
                clients, carrying their CLIENTS-placed state in and out
                (which TFF's `ClientWorkProcess` cannot), measuring the
                means of the clients' metrics;
  aggregator    a `tff.aggregators` process over the clients' updates;
  finalizer     `build_finalizer`, a `tff.learning.templates.FinalizerProcess`:
                one server optimizer step on the aggregate, skipped when no
                client contributed.

The round's metrics have one schema (`round_metrics`), which the process and
the sharded multi-worker round both build.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# The round's mean metrics: name -> the client update's metric it averages
# over the users that contributed.
MEAN_METRICS = collections.OrderedDict(
    loss='loss', sam_loss_global='sam_loss_global', sam_loss_local='sam_loss_local',
    examples_per_client='num_examples')


def round_metrics(mean_of: Callable[[str], Any], *, clients: Any, dropped_clients: Any,
                  aggregation: Any) -> collections.OrderedDict:
    """The round's metrics in their one order.

    Args:
      mean_of: Gives the mean of a client metric (a `MEAN_METRICS` value).
      clients: Users in the round.
      dropped_clients: Users whose update was not finite (left out).
      aggregation: The aggregator's measurements.
    """
    out = collections.OrderedDict(
        (name, mean_of(client_name)) for name, client_name in MEAN_METRICS.items())
    out.update(clients=clients, dropped_clients=dropped_clients, aggregation=aggregation)
    return out


def build_distributor(weights_type: tff.Type) -> tff.learning.templates.DistributionProcess:
    """The distributor: the server's weights broadcast to the clients, no state.

    Args:
      weights_type: The type of what is broadcast (the global weights, or
        TFF's `ModelWeights` for `build_fed_recon`).
    """
    return tff.learning.templates.build_broadcast_process(weights_type)


@tff.tensorflow.computation(np.int32, np.int32)
def contributing_users(users, dropped):
    """The users of a client whose update counts (not dropped)."""
    return users - dropped


@tff.tensorflow.computation(np.int32)
def _as_float(count):
    return tf.cast(count, tf.float32)


@tff.federated_computation
def _no_state():
    return tff.federated_value((), tff.SERVER)


def build_client_work_process(client_work: tff.Computation, *, global_type: tff.Type,
                              client_state_type: tff.Type | None,
                              client_data_type: tff.Type) -> tff.templates.MeasuredProcess:
    """The client work as a measured process over the clients.

    `next(state@SERVER, weights@CLIENTS, client_states@CLIENTS,
    client_data@CLIENTS)` (without `client_states` in reconstruct mode) ->
    `MeasuredProcessOutput(state, result=the client update's outputs@CLIENTS,
    measurements=(metrics: the means of its metrics over contributing users,
    contributing: their count)@SERVER)`.

    Args:
      client_work: The client update as a TF computation.
      global_type: The global weights' type.
      client_state_type: A client's state type; None in reconstruct mode.
      client_data_type: A client's data type.

    Returns:
      A `tff.templates.MeasuredProcess` with empty state.
    """
    state_at = _no_state.type_signature.result
    weights_at = tff.FederatedType(global_type, tff.CLIENTS)
    data_at = tff.FederatedType(client_data_type, tff.CLIENTS)

    def run(state, args):
        outputs = tff.federated_map(client_work, args)
        contributing = tff.federated_map(contributing_users, (outputs.users, outputs.dropped))
        means = tff.federated_mean(outputs.metrics,
                                   weight=tff.federated_map(_as_float, contributing))
        # The round's count of contributing users comes with the means, so
        # that nothing maps over the clients again.
        return tff.templates.MeasuredProcessOutput(
            state=state, result=outputs, measurements=tff.federated_zip(
                collections.OrderedDict(metrics=means,
                                        contributing=tff.federated_sum(contributing))))

    if client_state_type is not None:
        @tff.federated_computation(state_at, weights_at,
                                   tff.FederatedType(client_state_type, tff.CLIENTS), data_at)
        def next_fn(state, weights, client_states, client_data):
            return run(state, (weights, client_states, client_data))
    else:
        @tff.federated_computation(state_at, weights_at, data_at)
        def next_fn(state, weights, client_data):
            return run(state, (weights, client_data))

    return tff.templates.MeasuredProcess(_no_state, next_fn, next_is_multi_arg=True)


def optimizer_step(server_optimizer: tff.learning.optimizers.Optimizer, weights,
                   optimizer_state, update, contributing):
    """One server optimizer step, skipped when no client contributed (TF).

    Returns:
      `(new_weights, new_optimizer_state)`.
    """
    weights = list(weights)

    def step():
        new_state, new_weights = server_optimizer.next(optimizer_state, weights, list(update))
        return list(new_weights), new_state

    return tf.cond(contributing > 0, step, lambda: (weights, optimizer_state))


def build_finalizer(server_optimizer: tff.learning.optimizers.Optimizer,
                    global_specs: list[tf.TensorSpec]
                    ) -> tff.learning.templates.FinalizerProcess:
    """The server optimizer as a finalizer.

    `next(optimizer_state@SERVER, weights@SERVER, <update, contributing>@SERVER)
    -> MeasuredProcessOutput(new optimizer state, new weights, ())`.

    Args:
      server_optimizer: A `tff.learning.optimizers` optimizer.
      global_specs: The global weights' specs.

    Returns:
      A `tff.learning.templates.FinalizerProcess`.
    """
    global_type = tff.types.tensorflow_to_type(global_specs)

    @tff.tensorflow.computation
    def initial_state():
        return server_optimizer.initialize(global_specs)

    @tff.federated_computation
    def initialize_fn():
        return tff.federated_eval(initial_state, tff.SERVER)

    state_type = initial_state.type_signature.result
    update_type = tff.StructType([('update', global_type), ('contributing', np.int32)])

    @tff.tensorflow.computation(global_type, state_type, update_type)
    def apply(weights, optimizer_state, aggregate):
        new_weights, new_state = optimizer_step(
            server_optimizer, weights, optimizer_state, aggregate.update,
            aggregate.contributing)
        return collections.OrderedDict(weights=new_weights, optimizer_state=new_state)

    @tff.federated_computation(initialize_fn.type_signature.result,
                               tff.FederatedType(global_type, tff.SERVER),
                               tff.FederatedType(update_type, tff.SERVER))
    def next_fn(state, weights, aggregate):
        new = tff.federated_map(apply, (weights, state, aggregate))
        return tff.templates.MeasuredProcessOutput(
            state=new.optimizer_state, result=new.weights,
            measurements=tff.federated_value((), tff.SERVER))

    return tff.learning.templates.FinalizerProcess(initialize_fn, next_fn)
