"""Exports the computations a FedRecGEL deployment needs, as TFF protos.

Everything is built from the one-user device form of the client update
(`client_update.build_client_update(single_user=True)`): the same function
the simulation runs on groups of users, for a group of one. `build_deployment` returns, by name:

  initialize             () -> server_state@SERVER
  next                   the round; persistent mode:
                         (server_state@SERVER, client_states@CLIENTS,
                         client_data@CLIENTS) -> (server_state@SERVER,
                         client_states@CLIENTS, metrics@SERVER)
  federated_evaluation   HR@K / NDCG@K, each device ranking its own candidates
                         (the sampled protocol; `federated_full_evaluation` under
                         full ranking: one per protocol of `eval_protocols`)
  client_update          device: (global_weights, client_state, client_data)
                         -> OrderedDict(update, weight, dropped, users,
                         client_state, metrics)
  server_update          server: (global_weights, optimizer_state, round_num,
                         mean_update, contributing) -> new server state parts
  mapreduce_round        (server_state@SERVER, device_input@CLIENTS) ->
                         (server_state@SERVER, metrics@SERVER): the round with
                         the device's stored state read as part of its input
  mapreduce_initialize   the unplaced initial server state (MapReduceForm)
  mapreduce_<piece>      the `MapReduceForm` of `mapreduce_round`
  distribute_aggregate_<piece>
                         its `DistributeAggregateForm`

`write_deployment` serializes each with `tff.framework.serialize_computation`
to `<name>.pb`, writes the two forms' summaries and a `manifest.json` (file,
type signature and placement side of every computation, the hyperparameters
baked into the graphs, and the bytes each device downloads and uploads per
round). `load_computations` reads them back.

Why a separate `mapreduce_round`: `MapReduceForm` and `DistributeAggregateForm`
let clients contribute only to aggregates, so the stateful `next` (whose result
has CLIENTS-placed user state) cannot be compiled into them. In
`mapreduce_round` the device reads its stored user embedding and local Adam
state as part of its input; writing the new state back is a device-side effect
outside the form (the device runs `client_update`, whose outputs include it).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
import dataclasses
import json
import os
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.evaluation import reconstruction
# Where computations run, and the type checks (re-exported: part of this API).
from tff_fedrecgel.export_checks import AGGREGATION
from tff_fedrecgel.export_checks import DEVICE
from tff_fedrecgel.export_checks import FEDERATED
from tff_fedrecgel.export_checks import SERVER
from tff_fedrecgel.export_checks import find_local_weights_on_server
from tff_fedrecgel.export_checks import type_bytes
from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf

MANIFEST_NAME = 'manifest.json'
MAPREDUCE_SUMMARY_NAME = 'mapreduce_form.txt'
DISTRIBUTE_AGGREGATE_SUMMARY_NAME = 'distribute_aggregate_form.txt'
PROTO_SUFFIX = '.pb'
MANIFEST_FORMAT = 1

MAPREDUCE_PIECES = (
    ('prepare', SERVER),
    ('work', DEVICE),
    ('zero', AGGREGATION),
    ('accumulate', AGGREGATION),
    ('merge', AGGREGATION),
    ('report', AGGREGATION),
    ('secure_sum_bitwidth', AGGREGATION),
    ('secure_sum_max_input', AGGREGATION),
    ('secure_modular_sum_modulus', AGGREGATION),
    ('update', SERVER),
)
DISTRIBUTE_AGGREGATE_PIECES = (
    ('server_prepare', FEDERATED),
    ('server_to_client_broadcast', FEDERATED),
    ('client_work', FEDERATED),
    ('client_to_server_aggregation', FEDERATED),
    ('server_result', FEDERATED),
)

_DESCRIPTIONS = {
    'initialize': 'Initial server state (global weights, server Adam state, '
    'aggregator state, round number).',
    'next': 'One round as simulated: server state and the cohort\'s user '
    'states and round batches in; new server state, new user states '
    '(persistent mode) and metrics out.',
    'federated_evaluation': 'Leave-one-out HR@K/NDCG@K; each device scores its '
    'own candidates with its own embedding, the server gets the mean.',
    'federated_full_evaluation': 'Full-ranking HR@K/NDCG@K/MRR; each device ranks its '
    'held-out item among every item it did not train on, the server gets the mean.',
    'client_update': 'The device\'s round: SAM gradients at the received '
    'global weights, local Adam step on the user embedding; returns the upload '
    '(update, weight, dropped, users, metrics) and the new device state.',
    'server_update': 'Server optimizer step on the aggregated update (skipped when no '
    'client contributed); round number + 1.',
    'distributor_next': 'The round\'s distributor: the global weights broadcast to the '
    'devices (a tff.learning DistributionProcess).',
    'client_work_next': 'The round\'s client work: client_update on every device, the '
    'device states in and out; measures the means of the devices\' metrics.',
    'aggregator_next': 'The round\'s aggregator: the tff.aggregators process over the '
    'devices\' updates (the weighted mean, or DP / secure sums).',
    'finalizer_next': 'The round\'s finalizer: the server optimizer step on '
    '<update, contributing devices> (a tff.learning FinalizerProcess).',
    'mapreduce_round': 'The round with the device state read as part of the '
    'device input: (server_state@SERVER, device_input@CLIENTS) -> '
    '(server_state@SERVER, metrics@SERVER). Compiles into the forms.',
    'mapreduce_initialize': 'Unplaced initial server state for MapReduceForm.',
}


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Everything `write_deployment` serializes.

    Attributes:
      computations: Name -> computation, in export order.
      runs_on: Name -> DEVICE, SERVER, AGGREGATION or FEDERATED.
      pieces: The round's parts (`fedrecgel.build_round_pieces`).
      map_reduce_form: The `MapReduceForm` of `computations['mapreduce_round']`.
      distribute_aggregate_form: Its `DistributeAggregateForm`.
      hyperparameters: Everything baked into the graphs, JSON-serializable.
      traffic: Bytes per device and round: 'download_bytes' (the broadcast),
        'upload_bytes' (everything a device contributes to the aggregates),
        'global_params' (floats of the dense global weights), and
        'device_state_bytes' (what a device stores between rounds; 0 in
        reconstruct mode).
    """

    computations: collections.OrderedDict[str, tff.Computation]
    runs_on: dict[str, str]
    pieces: fedrecgel.RoundPieces
    map_reduce_form: tff.backends.mapreduce.MapReduceForm
    distribute_aggregate_form: tff.backends.mapreduce.DistributeAggregateForm
    hyperparameters: dict[str, Any]
    traffic: dict[str, int]


def device_input_type(pieces: fedrecgel.RoundPieces) -> tff.Type:
    """The per-device input of `mapreduce_round`.

    Args:
      pieces: The round's parts.

    Returns:
      `<client_state=..., data=...>` in persistent mode (the device's stored
      state is part of its input), the round batch type in reconstruct mode.
    """
    if pieces.client_state_type is None:
        return pieces.client_data_type
    return tff.StructType(
        [('client_state', pieces.client_state_type), ('data', pieces.client_data_type)]
    )


def build_mapreduce_round(pieces: fedrecgel.RoundPieces) -> tff.Computation:
    """The round in the shape the MapReduce forms need.

    Type: `(server_state@SERVER, device_input@CLIENTS) -> (server_state@SERVER,
    metrics@SERVER)` (see `device_input_type`). It traces the very round body of
    `next` (same client_update, aggregator, server_update and metrics); only
    the new client states are not returned, since these forms cannot carry
    CLIENTS-placed results.

    Args:
      pieces: The round's parts (`fedrecgel.build_round_pieces`).

    Returns:
      A `tff.Computation`.
    """
    persistent = pieces.client_state_type is not None

    @tff.federated_computation(
        tff.FederatedType(pieces.server_state_type, tff.SERVER),
        tff.FederatedType(device_input_type(pieces), tff.CLIENTS),
    )
    def mapreduce_round(server_state, device_input):
        if persistent:
            new_state, _, metrics = pieces.round_body(
                server_state, device_input.client_state, device_input.data
            )
        else:
            new_state, _, metrics = pieces.round_body(server_state, None, device_input)
        return new_state, metrics

    return mapreduce_round


def _hyperparameters(
    model_config: neumf.ModelConfig,
    work: client_update_lib.ClientWorkConfig,
    *,
    server_lr: float,
    server_optimizer: str,
    init_seed: int,
    top_ks: tuple[int, ...],
    eval_protocols: tuple[str, ...],
) -> dict[str, Any]:
    model = dataclasses.asdict(model_config)
    model['mlp_layers'] = list(model_config.mlp_layers)
    return {
        'num_items': model_config.num_items,
        'model': model,
        'num_global_params': model_config.num_global_params(),
        **dataclasses.asdict(work),
        'server_optimizer': server_optimizer,
        'server_lr': server_lr,
        'server_adam_epsilon': fedrecgel.SERVER_ADAM_EPSILON,
        'local_optimizer': 'adam',
        'local_adam_epsilon': local_training.ADAM_EPSILON,
        'aggregation': 'weighted mean (tff.aggregators.MeanFactory, '
        'no_nan_division); weights per client_weighting, 0 for dropped clients',
        'init_seed': init_seed,
        'eval_top_ks': list(top_ks),
        'eval_protocols': list(eval_protocols),
    }


def build_deployment(
    *,
    model_config: neumf.ModelConfig,
    work: client_update_lib.ClientWorkConfig = client_update_lib.ClientWorkConfig(),
    server_lr: float = algorithm_config.SERVER.learning_rate,
    server_optimizer: str = algorithm_config.SERVER.optimizer,
    init_seed: int = 0,
    top_ks: tuple[int, ...] = protocols.TOP_KS,
    eval_protocols: tuple[str, ...] = (protocols.SAMPLED.name,),
) -> Deployment:
    """Builds every computation of a deployment, with the MapReduce forms.

    Args:
      model_config: The NeuMF sizes.
      work: What each device does (radii, local Adam, modes).
      server_lr: The server optimizer's learning rate.
      server_optimizer: A name of `algorithm_config.SERVER_OPTIMIZERS`.
      init_seed: Seed of the initial global weights.
      top_ks: Cut-offs of the federated evaluations.
      eval_protocols: Names of `evaluation.protocols.NAMES`: one federated
        evaluation each (`Protocol.federated_name`).

    Returns:
      A `Deployment`.

    Raises:
      RuntimeError: If a server-visible type carries user-local weights (a
        privacy invariant of the algorithm; never expected).
      ValueError: On an unknown protocol, or full ranking with rebuilt
        embeddings (no such federated computation).
      tff.backends.mapreduce compilation errors: if the round does not fit the
        forms.
    """
    pieces = fedrecgel.build_round_pieces(
        model_config=model_config,
        client_update=client_update_lib.build_client_update(
            model_config, work, single_user=True),
        server_optimizer=fedrecgel.build_server_optimizer(server_lr, server_optimizer),
        init_seed=init_seed)
    evaluations = collections.OrderedDict()
    for protocol in map(protocols.get, eval_protocols):
        if work.local_state == 'persistent':
            evaluations[protocol.federated_name] = protocol.build_federated_evaluation(
                model_config, top_ks=top_ks)
        elif protocol is protocols.SAMPLED:
            evaluations[protocol.federated_name] = (
                reconstruction.build_federated_reconstruction_evaluation(
                    model_config, work, top_ks=top_ks))
        else:
            raise ValueError(f'no federated {protocol.name} evaluation rebuilds embeddings '
                             'first (local_state=reconstruct)')
    mapreduce_round = build_mapreduce_round(pieces)
    mrf = tff.backends.mapreduce.get_map_reduce_form_for_computation(mapreduce_round)
    daf = tff.backends.mapreduce.get_distribute_aggregate_form_for_computation(
        mapreduce_round)
    computations = collections.OrderedDict(
        initialize=pieces.process.initialize,
        next=pieces.process.next,
        **evaluations,
        client_update=pieces.client_work,
        server_update=pieces.server_update,
        distributor_next=pieces.distributor.next,
        client_work_next=pieces.client_work_process.next,
        aggregator_next=pieces.aggregator.next,
        finalizer_next=pieces.finalizer.next,
        mapreduce_round=mapreduce_round,
        mapreduce_initialize=tff.backends.mapreduce.get_state_initialization_computation(
            pieces.process.initialize),
    )
    runs_on = {
        # Its result is SERVER-placed and it takes no argument: server only.
        'initialize': SERVER,
        'next': FEDERATED,
        **dict.fromkeys(evaluations, FEDERATED),
        'client_update': DEVICE,
        'server_update': SERVER,
        # The round's four parts, each a process (`fedrecgel.RoundPieces`).
        'distributor_next': FEDERATED,
        'client_work_next': FEDERATED,
        'aggregator_next': FEDERATED,
        'finalizer_next': FEDERATED,
        'mapreduce_round': FEDERATED,
        'mapreduce_initialize': SERVER,
    }
    for piece, side in MAPREDUCE_PIECES:
        computations[f'mapreduce_{piece}'] = getattr(mrf, piece)
        runs_on[f'mapreduce_{piece}'] = side
    for piece, side in DISTRIBUTE_AGGREGATE_PIECES:
        computations[f'distribute_aggregate_{piece}'] = getattr(daf, piece)
        runs_on[f'distribute_aggregate_{piece}'] = side

    leaks = {
        name: found
        for name, comp in computations.items()
        if (found := find_local_weights_on_server(
            comp.type_signature, runs_on=runs_on[name], pieces=pieces,
            model_config=model_config))
    }
    if leaks:
        raise RuntimeError(f'user-local weights in server-visible types: {leaks}')

    traffic = {
        # What `prepare` broadcasts and what `work` feeds the aggregations.
        'download_bytes': type_bytes(mrf.prepare.type_signature.result),
        'upload_bytes': type_bytes(mrf.work.type_signature.result),
        'global_params': model_config.num_global_params(),
        'device_state_bytes': (
            0 if pieces.client_state_type is None
            else type_bytes(pieces.client_state_type)
        ),
    }
    return Deployment(
        computations=computations,
        runs_on=runs_on,
        pieces=pieces,
        map_reduce_form=mrf,
        distribute_aggregate_form=daf,
        hyperparameters=_hyperparameters(
            model_config, work, server_lr=server_lr, server_optimizer=server_optimizer,
            init_seed=init_seed,
            top_ks=tuple(top_ks), eval_protocols=tuple(eval_protocols),
        ),
        traffic=traffic,
    )


def _form_summary(form) -> str:
    lines = []
    form.summary(print_fn=lines.append)
    return '\n'.join(lines) + '\n'


def _description(name: str) -> str:
    if name in _DESCRIPTIONS:
        return _DESCRIPTIONS[name]
    if name.startswith('mapreduce_'):
        return f'MapReduceForm piece `{name[len("mapreduce_"):]}` of mapreduce_round.'
    return (
        'DistributeAggregateForm piece '
        f'`{name[len("distribute_aggregate_"):]}` of mapreduce_round.'
    )


def write_deployment(
    deployment: Deployment,
    output_dir: str | os.PathLike,
    *,
    extra_hyperparameters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes `<name>.pb` per computation, the form summaries and the manifest.

    The manifest is written last, so its presence marks a complete export.

    Args:
      deployment: From `build_deployment`.
      output_dir: Folder to write into (created if missing; files of the same
        names are replaced).
      extra_hyperparameters: Recorded in the manifest too (e.g. the task).

    Returns:
      The manifest, as written.

    Raises:
      OSError: If the folder cannot be created or written.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    entries = collections.OrderedDict()
    for name, comp in deployment.computations.items():
        file_name = name + PROTO_SUFFIX
        proto = tff.framework.serialize_computation(comp)
        with open(os.path.join(output_dir, file_name), 'wb') as f:
            f.write(proto.SerializeToString())
        entries[name] = collections.OrderedDict(
            file=file_name,
            type_signature=str(comp.type_signature),
            runs_on=deployment.runs_on[name],
            description=_description(name),
        )
    for file_name, form in (
        (MAPREDUCE_SUMMARY_NAME, deployment.map_reduce_form),
        (DISTRIBUTE_AGGREGATE_SUMMARY_NAME, deployment.distribute_aggregate_form),
    ):
        with open(os.path.join(output_dir, file_name), 'w') as f:
            f.write(_form_summary(form))
    pieces = deployment.pieces
    manifest = collections.OrderedDict(
        format=MANIFEST_FORMAT,
        tff_version=tff.__version__,
        tensorflow_version=tf.__version__,
        hyperparameters={**deployment.hyperparameters, **(extra_hyperparameters or {})},
        traffic_per_device_and_round=deployment.traffic,
        device_state=(
            None if pieces.client_state_type is None else str(pieces.client_state_type)
        ),
        device_input=str(device_input_type(pieces)),
        forms=collections.OrderedDict(
            mapreduce=MAPREDUCE_SUMMARY_NAME,
            distribute_aggregate=DISTRIBUTE_AGGREGATE_SUMMARY_NAME,
        ),
        computations=entries,
    )
    with open(os.path.join(output_dir, MANIFEST_NAME), 'w') as f:
        json.dump(manifest, f, indent=2)
        f.write('\n')
    return manifest


def read_manifest(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Reads an export's `manifest.json`.

    Args:
      output_dir: The export folder.

    Returns:
      The manifest.

    Raises:
      OSError: If it cannot be read.
      ValueError: If it is not a manifest of a known format.
    """
    with open(os.path.join(os.fspath(output_dir), MANIFEST_NAME)) as f:
        manifest = json.load(f)
    if not isinstance(manifest, dict) or manifest.get('format') != MANIFEST_FORMAT:
        raise ValueError(f'{output_dir}: not a format-{MANIFEST_FORMAT} manifest')
    return manifest


def read_computation(path: str | os.PathLike) -> tff.Computation:
    """Deserializes one exported `.pb` file.

    Args:
      path: The file.

    Returns:
      The `tff.Computation`.

    Raises:
      OSError: If it cannot be read.
      google.protobuf.message.DecodeError: If it is not a computation proto.
    """
    with open(path, 'rb') as f:
        proto = computation_pb2.Computation.FromString(f.read())
    return tff.framework.deserialize_computation(proto)


def load_computations(
    output_dir: str | os.PathLike,
) -> collections.OrderedDict[str, tff.Computation]:
    """Deserializes every computation the manifest lists.

    Args:
      output_dir: The export folder.

    Returns:
      Name -> `tff.Computation`, in manifest order.

    Raises:
      OSError, ValueError: As `read_manifest` and `read_computation`.
    """
    manifest = read_manifest(output_dir)
    return collections.OrderedDict(
        (name, read_computation(os.path.join(os.fspath(output_dir), entry['file'])))
        for name, entry in manifest['computations'].items()
    )
