"""FedRecGEL as a TFF iterative process with stateful clients.

`tff.learning.templates.LearningProcess` can only carry SERVER-placed state, so
the round is a `tff.templates.IterativeProcess` whose `next` also takes and
returns CLIENTS-placed state: the simulation driver keeps every user's state
and feeds the sampled users' rows in. The round is composed of four parts,
each a TFF process with its own typed state, as TFF's own learning
algorithms are (`round_parts`): a distributor (broadcast), the client work
(the client update over the clients, CLIENTS-placed state in and out), a
`tff.aggregators` aggregator (the weighted mean by default, DP or secure
sums on request) and a finalizer (one server optimizer step, skipped when no
client contributed). `ServerState` holds the four states.

Persistent mode (default):
  next(server_state@SERVER, client_states@CLIENTS, client_data@CLIENTS)
    -> (server_state@SERVER, client_states@CLIENTS, metrics@SERVER)
Reconstruct mode (no per-user state):
  next(server_state@SERVER, client_data@CLIENTS)
    -> (server_state@SERVER, metrics@SERVER)

Only the global part's update and scalar metrics reach the server.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.algorithms import client_steps
from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.algorithms import model_client_work
from tff_fedrecgel.algorithms import round_parts
from tff_fedrecgel.models import neumf

SERVER_ADAM_EPSILON = local_training.ADAM_EPSILON
Aggregator = (tff.aggregators.WeightedAggregationFactory
              | tff.aggregators.UnweightedAggregationFactory)


class ServerState(NamedTuple):
    """The server's state between rounds.

    Attributes:
      global_weights: The global weights, `NeuMF.global_variables` order.
      optimizer_state: The server optimizer's state.
      aggregator_state: The aggregator's state (empty for the plain mean).
      round_num: int32, rounds completed.
      distributor_state: The distributor's state (empty: a broadcast; the
        previous weights for FedLESAM, the last pseudo-gradient for FedGloSS).
      client_work_state: The client work process's state (empty).

    The finalizer's state is `optimizer_state`. Checkpoints hold
    `stored()`, without the empty states.
    """

    global_weights: Any
    optimizer_state: Any
    aggregator_state: Any
    round_num: Any
    distributor_state: Any = ()
    client_work_state: Any = ()

    __getitem__ = client_steps.item_or_field

    def stored(self):
        """The states with content, as checkpoints hold them (a
        `StoredServerState`, or a `StoredDistributorServerState` when the
        distributor keeps a state)."""
        if tf.nest.flatten(self.distributor_state):
            return StoredDistributorServerState(self.global_weights, self.optimizer_state,
                                                self.aggregator_state, self.round_num,
                                                self.distributor_state)
        return StoredServerState(self.global_weights, self.optimizer_state,
                                 self.aggregator_state, self.round_num)


# What a checkpoint holds of a `ServerState`. Its type name and fields are
# those of the server state before the distributor's and the client work's
# (empty) states joined it, so checkpoints of every version load alike
# (`tf.nest` matches named tuples by name and fields); `ServerState(*stored)`
# restores the whole state.
StoredServerState = collections.namedtuple(
    'ServerState', ['global_weights', 'optimizer_state', 'aggregator_state', 'round_num'])
# The same with the distributor's state (FedLESAM, FedGloSS), so a resume
# keeps the last global change or pseudo-gradient.
StoredDistributorServerState = collections.namedtuple(
    'ServerState', StoredServerState._fields + ('distributor_state',))


def build_server_optimizer(learning_rate: float = algorithm_config.SERVER.learning_rate,
                           name: str = algorithm_config.SERVER.optimizer
                           ) -> tff.learning.optimizers.Optimizer:
    """A server optimizer by name; the default is the paper's Adam (step 9).

    Args:
      learning_rate: Its learning rate.
      name: One of `algorithm_config.SERVER_OPTIMIZERS`: 'adam' (epsilon 1e-8,
        the authors'), 'yogi', 'adagrad', 'sgdm' (momentum 0.9) or 'sgd'.

    Returns:
      A `tff.learning.optimizers.Optimizer`.

    Raises:
      ValueError: On an unknown name or a learning rate that is not positive.
    """
    algorithm_config.ServerConfig(learning_rate=learning_rate, optimizer=name)
    builders = {
        'adam': lambda: tff.learning.optimizers.build_adam(
            learning_rate=learning_rate, epsilon=SERVER_ADAM_EPSILON),
        'yogi': lambda: tff.learning.optimizers.build_yogi(learning_rate=learning_rate),
        'adagrad': lambda: tff.learning.optimizers.build_adagrad(learning_rate=learning_rate),
        'sgdm': lambda: tff.learning.optimizers.build_sgdm(learning_rate=learning_rate,
                                                          momentum=0.9),
        'sgd': lambda: tff.learning.optimizers.build_sgdm(learning_rate=learning_rate),
    }
    return builders[name]()


def build_server_update(server_optimizer: tff.learning.optimizers.Optimizer,
                        global_type: tff.Type, optimizer_state_type: tff.Type
                        ) -> tff.Computation:
    """The finalizer's step as one TF computation, with the round count.

    Type: `(global_weights, optimizer_state, round_num, update, contributing)
    -> OrderedDict(global_weights, optimizer_state, round_num)`. A round in
    which no client contributed leaves the weights and optimizer untouched.
    The multi-worker round and the export call it; the process's finalizer
    (`round_parts.build_finalizer`) runs the same step.
    """

    @tff.tensorflow.computation(global_type, optimizer_state_type, np.int32,
                                global_type, np.int32)
    def server_update(weights, optimizer_state, round_num, update, contributing):
        new_weights, new_state = round_parts.optimizer_step(
            server_optimizer, weights, optimizer_state, update, contributing)
        return collections.OrderedDict(global_weights=new_weights,
                                       optimizer_state=new_state,
                                       round_num=round_num + 1)

    return server_update


@dataclasses.dataclass(frozen=True)
class RoundPieces:
    """The FedRecGEL round and the parts it is assembled from.

    Attributes:
      process: The round as a `tff.templates.IterativeProcess`.
      client_work: The client update as a TF computation of
        `(global_weights, client_state, client_data)` (persistent mode) or
        `(global_weights, client_data)` (reconstruct mode).
      server_update: The finalizer (`build_server_update`).
      round_body: The Python function tracing one round inside a
        `tff.federated_computation`: `(server_state@SERVER,
        client_states@CLIENTS or None, client_data@CLIENTS)` ->
        `(server_state@SERVER, client_states@CLIENTS or None, metrics@SERVER)`.
      global_type: Type of the global (aggregated) weights.
      client_state_type: Type of one client's state; None in reconstruct mode.
      client_data_type: Type of one client's round batch.
      server_state_type: Type of the server state (unplaced).
      distributor: The distributor process (a broadcast, or a
        `global_perturbation` distributor).
      client_work_process: The client work as a process over the clients
        (`round_parts.build_client_work_process`).
      aggregator: The aggregation process over the clients' updates.
      finalizer: The finalizer process (`round_parts.build_finalizer`).
    """

    process: tff.templates.IterativeProcess
    client_work: tff.Computation
    server_update: tff.Computation
    round_body: Callable
    global_type: tff.Type
    client_state_type: tff.Type | None
    client_data_type: tff.Type
    server_state_type: tff.Type
    distributor: tff.templates.MeasuredProcess
    client_work_process: tff.templates.MeasuredProcess
    aggregator: tff.templates.AggregationProcess
    finalizer: tff.learning.templates.FinalizerProcess


def _build_client_work(client_update: client_update_lib.ClientUpdate,
                       global_type: tff.Type) -> tff.Computation:
    fn = client_update.fn
    if client_update.state_type is None:
        return tff.tensorflow.computation(
            lambda weights, data: fn(weights, None, data),
            global_type, client_update.data_type)
    return tff.tensorflow.computation(fn, global_type, client_update.state_type,
                                      client_update.data_type)


@tff.tensorflow.computation(np.int32)
def _next_round(round_num):
    return round_num + 1


def build_round_pieces(
    *,
    model_config: neumf.ModelConfig,
    client_update: client_update_lib.ClientUpdate,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: Aggregator | None = None,
    init_seed: int = 0,
    global_perturbation: Any = None,
) -> RoundPieces:
    """Assembles the NeuMF round from its parts and hands them out.

    Args:
      model_config: The NeuMF sizes (`use_mlp=False` gives FedMF's GMF model).
      client_update: The client work (`client_update.build_client_update`):
        its types say whether a TFF client is one user (the deployable form)
        or a group of users (simulation).
      server_optimizer: Any `tff.learning.optimizers` optimizer; default the
        server Adam at 0.001 (`build_server_optimizer`).
      model_aggregator: A `tff.aggregators` factory for the global update.
        Default: the weighted mean (uniform user weights give the authors'
        unweighted mean), dividing safely when every client was dropped. An
        unweighted factory (e.g. a DP one) receives the updates of dropped
        clients as zeros.
      init_seed: Seed of the initial global weights.
      global_perturbation: A `global_perturbation.GlobalPerturbation`
        (FedLESAM's or FedGloSS's distributor), or None for the broadcast;
        `client_update` must take what it sends.

    Returns:
      A `RoundPieces` (see the module docstring for the process's types).
    """
    return compose_round(
        global_specs=neumf.global_weight_specs(model_config),
        initial_global_weights=lambda: [
            tf.identity(v) for v in neumf.NeuMF(model_config, seed=init_seed).global_variables],
        client_update=client_update, server_optimizer=server_optimizer,
        model_aggregator=model_aggregator, global_perturbation=global_perturbation)


def compose_round(
    *,
    global_specs: list[tf.TensorSpec],
    initial_global_weights: Callable[[], list[tf.Tensor]],
    client_update: client_update_lib.ClientUpdate,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: Aggregator | None = None,
    global_perturbation: Any = None,
) -> RoundPieces:
    """Composes the round from the distributor, the client work, the
    aggregator and the finalizer, for any model.

    Args:
      global_specs: The specs of the global weights.
      initial_global_weights: Returns the initial global weights (traced in
        a TF computation).
      client_update: The client work (a `client_update.ClientUpdate`).
      server_optimizer: As `build_round_pieces`.
      model_aggregator: As `build_round_pieces`.
      global_perturbation: As `build_round_pieces`.

    Returns:
      A `RoundPieces`.
    """
    server_optimizer = server_optimizer or build_server_optimizer()
    model_aggregator = model_aggregator or tff.aggregators.MeanFactory(no_nan_division=True)
    global_type = tff.types.tensorflow_to_type(global_specs)
    weighted = isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory)
    if weighted:
        aggregator = model_aggregator.create(global_type, tff.TensorType(np.float32))
    else:
        aggregator = model_aggregator.create(global_type)
    # What a client receives: the global weights, or what the distributor adds.
    if global_perturbation is None:
        distributor = round_parts.build_distributor(global_type)
        received_type = global_type
    else:
        distributor = global_perturbation.distributor
        received_type = distributor.next.type_signature.result.result.member
    client_work = _build_client_work(client_update, received_type)
    persistent = client_update.state_type is not None
    client_work_process = round_parts.build_client_work_process(
        client_work, global_type=received_type, client_state_type=client_update.state_type,
        client_data_type=client_update.data_type)
    finalizer = round_parts.build_finalizer(server_optimizer, global_specs)

    @tff.tensorflow.computation
    def initial_weights():
        return initial_global_weights()

    @tff.federated_computation
    def initialize_fn():
        return tff.federated_zip(ServerState(
            global_weights=tff.federated_eval(initial_weights, tff.SERVER),
            optimizer_state=finalizer.initialize(), aggregator_state=aggregator.initialize(),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
            distributor_state=distributor.initialize(),
            client_work_state=client_work_process.initialize()))

    server_state_type = initialize_fn.type_signature.result.member
    server_update = build_server_update(server_optimizer, global_type,
                                        server_state_type.optimizer_state)

    def round_body(server_state, client_states, client_data):
        distributed = distributor.next(server_state.distributor_state,
                                       server_state.global_weights)
        args = (distributed.result, client_states, client_data) if persistent else (
            distributed.result, client_data)
        work = client_work_process.next(server_state.client_work_state, *args)
        outputs = work.result
        if weighted:
            aggregated = aggregator.next(server_state.aggregator_state, outputs.update,
                                         outputs.weight)
        else:
            aggregated = aggregator.next(server_state.aggregator_state, outputs.update)
        contributing = work.measurements.contributing
        finalized = finalizer.next(
            server_state.optimizer_state, server_state.global_weights,
            tff.federated_zip(collections.OrderedDict(update=aggregated.result,
                                                      contributing=contributing)))
        distributor_state = distributed.state
        if global_perturbation is not None and global_perturbation.record is not None:
            distributor_state = global_perturbation.record(
                distributed.state, aggregated.result, contributing)
        new_server_state = tff.federated_zip(ServerState(
            global_weights=finalized.result, optimizer_state=finalized.state,
            aggregator_state=aggregated.state,
            round_num=tff.federated_map(_next_round, server_state.round_num),
            distributor_state=distributor_state, client_work_state=work.state))
        metrics = tff.federated_zip(round_parts.round_metrics(
            lambda name: getattr(work.measurements.metrics, name),
            clients=tff.federated_sum(outputs.users),
            dropped_clients=tff.federated_sum(outputs.dropped),
            aggregation=aggregated.measurements))
        return new_server_state, (outputs.client_state if persistent else None), metrics

    server_at = tff.FederatedType(server_state_type, tff.SERVER)
    data_at = tff.FederatedType(client_update.data_type, tff.CLIENTS)
    if persistent:
        next_fn = tff.federated_computation(
            round_body, server_at, tff.FederatedType(client_update.state_type, tff.CLIENTS),
            data_at)
    else:

        @tff.federated_computation(server_at, data_at)
        def next_fn(server_state, client_data):
            new_state, _, metrics = round_body(server_state, None, client_data)
            return new_state, metrics

    return RoundPieces(
        process=tff.templates.IterativeProcess(initialize_fn, next_fn),
        client_work=client_work, server_update=server_update, round_body=round_body,
        global_type=global_type, client_state_type=client_update.state_type,
        client_data_type=client_update.data_type, server_state_type=server_state_type,
        distributor=distributor, client_work_process=client_work_process,
        aggregator=aggregator, finalizer=finalizer)


def build_fedrecgel_process(
    model_fn: model_client_work.ModelFn,
    *,
    work: client_update_lib.ClientWorkConfig = client_update_lib.ClientWorkConfig(),
    example_loss: model_client_work.ExampleLoss = model_client_work.sigmoid_cross_entropy,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: Aggregator | None = None,
) -> tff.templates.IterativeProcess:
    """Builds FedRecGEL for any partially local model, one user per client.

    In the style of `tff.learning.algorithms.build_fed_recon`: the model's
    global variables are aggregated and stepped by the server optimizer;
    its local variables are each user's own, kept between rounds
    (`work.local_state='persistent'`) or rebuilt every round
    ('reconstruct'). The client work runs the Keras SAM optimizer on the
    model's variables (`model_client_work`). FedNCF and the ablations are
    radii settings; FedMF is this builder on a GMF-only NeuMF
    (`neumf.build_reconstruction_model(ModelConfig(use_mlp=False, ...))`).

    Args:
      model_fn: A no-argument function returning a new
        `tff.learning.models.ReconstructionModel`, e.g.
        `functools.partial(neumf.build_reconstruction_model, config)`.
      work: What each user does (`client_update.ClientWorkConfig`).
      example_loss: `(labels, predictions) -> [N]` per-example loss; default
        binary cross-entropy on logits.
      server_optimizer: As `build_round_pieces`.
      model_aggregator: As `build_round_pieces`.

    Returns:
      A `tff.templates.IterativeProcess` (see the module docstring for types;
      a client's state is `client_update.ClientState` shaped like the local
      variables, its data one batch of the model's `input_spec`;
      `model_client_work.initial_client_state` gives a new user's).

    Raises:
      ValueError: If the model has non-trainable or no local variables, or
        `work` takes its perturbation from the server (FedLESAM and FedGloSS
        are built for NeuMF only, `build_round_pieces`).
    """
    if work.global_perturbation != 'local':
        raise ValueError(f'global_perturbation={work.global_perturbation!r} is built for '
                         'NeuMF only (build_round_pieces)')
    global_specs, _, _ = model_client_work.model_specs(model_fn)
    return compose_round(
        global_specs=global_specs,
        initial_global_weights=lambda: model_client_work.initial_global_weights(model_fn),
        client_update=model_client_work.build_model_client_update(
            model_fn, work, example_loss=example_loss),
        server_optimizer=server_optimizer, model_aggregator=model_aggregator).process
