"""FedRecGEL as a TFF iterative process with stateful clients.

`tff.learning.templates.LearningProcess` can only carry SERVER-placed state, so
the round is a `tff.templates.IterativeProcess` whose `next` also takes and
returns CLIENTS-placed state: the simulation driver keeps every user's state
and feeds the sampled users' rows in.

Persistent mode (default):
  next(server_state@SERVER, client_states@CLIENTS, client_data@CLIENTS)
    -> (server_state@SERVER, client_states@CLIENTS, metrics@SERVER)
Reconstruct mode (no per-user state):
  next(server_state@SERVER, client_data@CLIENTS)
    -> (server_state@SERVER, metrics@SERVER)

Server state: OrderedDict(global_weights, optimizer_state, aggregator_state,
round_num). Only the global part's update and scalar metrics reach the server.
"""

import collections
import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_work as client_work_lib
from tff_fedrecgel.algorithms import group_client_work
from tff_fedrecgel.models import neumf

SERVER_ADAM_EPSILON = client_work_lib.ADAM_EPSILON


def client_work_for(
    model_config: neumf.ModelConfig,
    work: client_work_lib.ClientWorkConfig,
    *,
    vectorized: bool,
):
    """The client state type, data type and update function of a round.

    Args:
      model_config: The NeuMF sizes.
      work: What each client does.
      vectorized: Groups of users per client (`group_client_work`) or one.

    Returns:
      `(client_state_type, client_data_type, update_fn)`.

    Raises:
      ValueError: If `vectorized` and `work` needs one user per client.
    """
    if vectorized:
        group_client_work.check_supported(work)
        return (
            tff.types.tensorflow_to_type(group_client_work.group_state_spec(model_config)),
            tff.types.tensorflow_to_type(group_client_work.group_data_spec()),
            group_client_work.build_group_update_fn(model_config, work),
        )
    return (
        tff.types.tensorflow_to_type(client_work_lib.client_state_spec(model_config)),
        tff.types.tensorflow_to_type(client_work_lib.client_data_spec()),
        client_work_lib.build_client_update_fn(model_config, work),
    )


def _server_optimizer_or_default(optimizer, server_lr):
    if optimizer is not None:
        return optimizer
    return tff.learning.optimizers.build_adam(
        learning_rate=server_lr, epsilon=SERVER_ADAM_EPSILON
    )


@dataclasses.dataclass(frozen=True)
class RoundPieces:
    """The FedRecGEL round and the parts it is composed of.

    Attributes:
      process: The round as a `tff.templates.IterativeProcess`.
      client_update: The one-user client work, a TF computation of
        `(global_weights, client_state, client_data)` (persistent mode) or
        `(global_weights, client_data)` (reconstruct mode) -> OrderedDict(
        update, weight, dropped, users[, client_state], metrics).
      server_update: TF computation of `(global_weights, optimizer_state,
        round_num, mean_update, contributing)` -> OrderedDict(global_weights,
        optimizer_state, round_num).
      round_body: The Python function tracing one round inside a
        `tff.federated_computation`: `(server_state@SERVER,
        client_states@CLIENTS or None, client_data@CLIENTS)` ->
        `(server_state@SERVER, client_states@CLIENTS or None, metrics@SERVER)`.
      global_type: Type of the global (aggregated) weights.
      client_state_type: Type of one client's state; None in reconstruct mode.
      client_data_type: Type of one client's round batch.
      server_state_type: Type of the server state (unplaced).
    """

    process: tff.templates.IterativeProcess
    client_update: tff.Computation
    server_update: tff.Computation
    round_body: Callable
    global_type: tff.Type
    client_state_type: tff.Type | None
    client_data_type: tff.Type
    server_state_type: tff.Type


def build_round_pieces(
    *,
    model_config: neumf.ModelConfig,
    work: client_work_lib.ClientWorkConfig = client_work_lib.ClientWorkConfig(),
    server_lr: float = 0.001,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: (
        tff.aggregators.WeightedAggregationFactory
        | tff.aggregators.UnweightedAggregationFactory
        | None
    ) = None,
    init_seed: int = 0,
    vectorized: bool = False,
) -> 'RoundPieces':
    """Builds the FedRecGEL round and hands out the parts it is made of.

    `build_fedrecgel_process` returns just the process; export uses the parts
    (with `vectorized=False`, the deployable one-user client work).

    Args:
      model_config: The NeuMF sizes (`use_mlp=False` gives FedMF's GMF model).
      work: What each client does (SAM radii, local Adam, modes).
      server_lr: Learning rate of the default server optimizer, Adam.
      server_optimizer: Any `tff.learning.optimizers` optimizer; overrides
        `server_lr`.
      model_aggregator: A `tff.aggregators` factory for the global update.
        Default: the mean weighted by `work.client_weighting` (uniform weights
        give the authors' unweighted mean), dividing safely when every client
        was dropped. An unweighted factory (e.g. a DP one) receives the updates
        of dropped clients as zeros.
      init_seed: Seed of the initial global weights.
      vectorized: If True, each TFF client simulates a group of users with
        their per-user computations vectorized (`group_client_work`): client
        states and data then carry a leading user axis. Equal to one user per
        client up to float rounding; for simulation only.

    Returns:
      A `RoundPieces` (see the module docstring for the process's types).
    """
    server_optimizer = _server_optimizer_or_default(server_optimizer, server_lr)
    if model_aggregator is None:
        model_aggregator = tff.aggregators.MeanFactory(no_nan_division=True)
    persistent = work.local_state == 'persistent'

    global_specs = client_work_lib.global_weight_specs(model_config)
    global_type = tff.types.tensorflow_to_type(global_specs)
    state_type, data_type, update_fn = client_work_for(
        model_config, work, vectorized=vectorized
    )

    weighted = isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory)
    if weighted:
        aggregation = model_aggregator.create(global_type, tff.TensorType(np.float32))
    else:
        aggregation = model_aggregator.create(global_type)

    @tff.tensorflow.computation
    def server_init():
        model = neumf.NeuMF(model_config, seed=init_seed)
        weights = [tf.identity(v) for v in model.global_variables]
        return collections.OrderedDict(
            global_weights=weights,
            optimizer_state=server_optimizer.initialize(global_specs),
            round_num=tf.constant(0, tf.int32),
        )

    @tff.federated_computation
    def initialize_fn():
        server = tff.federated_eval(server_init, tff.SERVER)
        return tff.federated_zip(
            collections.OrderedDict(
                global_weights=server.global_weights,
                optimizer_state=server.optimizer_state,
                aggregator_state=aggregation.initialize(),
                round_num=server.round_num,
            )
        )

    server_state_type = initialize_fn.type_signature.result.member

    if persistent:

        @tff.tensorflow.computation(global_type, state_type, data_type)
        def client_update(global_weights, client_state, data):
            return update_fn(global_weights, client_state, data)

    else:

        @tff.tensorflow.computation(global_type, data_type)
        def client_update(global_weights, data):
            return update_fn(global_weights, None, data)

    @tff.tensorflow.computation(
        server_state_type.global_weights,
        server_state_type.optimizer_state,
        server_state_type.round_num,
        global_type,
        np.int32,
    )
    def server_update(weights, optimizer_state, round_num, mean_update, contributing):
        weights = list(weights)

        def step():
            new_state, new_weights = server_optimizer.next(
                optimizer_state, weights, list(mean_update)
            )
            return new_state, list(new_weights)

        def skip():
            return optimizer_state, weights

        # A round where every client was dropped leaves the model untouched.
        new_state, new_weights = tf.cond(contributing > 0, step, skip)
        return collections.OrderedDict(
            global_weights=new_weights,
            optimizer_state=new_state,
            round_num=round_num + 1,
        )

    @tff.tensorflow.computation(np.int32, np.int32)
    def contributed(users, dropped):
        return users - dropped

    def round_body(server_state, client_states, client_data):
        weights = tff.federated_broadcast(server_state.global_weights)
        if persistent:
            outputs = tff.federated_map(
                client_update, (weights, client_states, client_data)
            )
        else:
            outputs = tff.federated_map(client_update, (weights, client_data))
        if weighted:
            aggregated = aggregation.next(
                server_state.aggregator_state, outputs.update, outputs.weight
            )
        else:
            aggregated = aggregation.next(server_state.aggregator_state, outputs.update)
        client_contributing = tff.federated_map(
            contributed, (outputs.users, outputs.dropped)
        )
        contributing = tff.federated_sum(client_contributing)
        server = tff.federated_map(
            server_update,
            (
                server_state.global_weights,
                server_state.optimizer_state,
                server_state.round_num,
                aggregated.result,
                contributing,
            ),
        )
        new_server_state = tff.federated_zip(
            collections.OrderedDict(
                global_weights=server.global_weights,
                optimizer_state=server.optimizer_state,
                aggregator_state=aggregated.state,
                round_num=server.round_num,
            )
        )
        client_metrics = tff.federated_mean(
            outputs.metrics,
            weight=tff.federated_map(_as_float, client_contributing),
        )
        metrics = tff.federated_zip(
            collections.OrderedDict(
                loss=client_metrics.loss,
                sam_loss_global=client_metrics.sam_loss_global,
                sam_loss_local=client_metrics.sam_loss_local,
                examples_per_client=client_metrics.num_examples,
                clients=tff.federated_sum(outputs.users),
                dropped_clients=tff.federated_sum(outputs.dropped),
                aggregation=aggregated.measurements,
            )
        )
        client_out = outputs.client_state if persistent else None
        return new_server_state, client_out, metrics

    server_at = tff.FederatedType(server_state_type, tff.SERVER)
    data_at = tff.FederatedType(data_type, tff.CLIENTS)
    if persistent:

        @tff.federated_computation(
            server_at, tff.FederatedType(state_type, tff.CLIENTS), data_at
        )
        def next_fn(server_state, client_states, client_data):
            return round_body(server_state, client_states, client_data)

    else:

        @tff.federated_computation(server_at, data_at)
        def next_fn(server_state, client_data):
            new_state, _, metrics = round_body(server_state, None, client_data)
            return new_state, metrics

    return RoundPieces(
        process=tff.templates.IterativeProcess(initialize_fn, next_fn),
        client_update=client_update,
        server_update=server_update,
        round_body=round_body,
        global_type=global_type,
        client_state_type=state_type if persistent else None,
        client_data_type=data_type,
        server_state_type=server_state_type,
    )


def build_fedrecgel_process(
    *,
    model_config: neumf.ModelConfig,
    work: client_work_lib.ClientWorkConfig = client_work_lib.ClientWorkConfig(),
    server_lr: float = 0.001,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: (
        tff.aggregators.WeightedAggregationFactory
        | tff.aggregators.UnweightedAggregationFactory
        | None
    ) = None,
    init_seed: int = 0,
    vectorized: bool = False,
) -> tff.templates.IterativeProcess:
    """Builds the FedRecGEL round (FedNCF and the ablations are radii settings).

    Args: as `build_round_pieces`.

    Returns:
      A `tff.templates.IterativeProcess` (see the module docstring for types).
    """
    return build_round_pieces(
        model_config=model_config,
        work=work,
        server_lr=server_lr,
        server_optimizer=server_optimizer,
        model_aggregator=model_aggregator,
        init_seed=init_seed,
        vectorized=vectorized,
    ).process


@tff.tensorflow.computation(np.int32)
def _as_float(count):
    return tf.cast(count, tf.float32)


