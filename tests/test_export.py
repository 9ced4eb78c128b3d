"""Tests of the deployment export (`tff_fedrecgel/export.py`, `launch/export.py`).

A small synthetic task is exported once to a temporary folder and read back;
the tests compare the deserialized computations, and the MapReduce /
DistributeAggregate forms run piece by piece, with the in-memory process on
the same inputs, check the manifest, and check that no server-visible type
carries a user's local weights. The CLI runs as a subprocess on bad input.
"""

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import tasks
from tff_fedrecgel import export
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.data import client_data
from tff_fedrecgel.models import neumf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'launch', 'export.py')
# Small, with enough items for the 99 held-out negatives of every user (the
# split keeps only the items that occur).
NUM_USERS, NUM_ITEMS = 20, 300
COHORT = (0, 1, 2)
ATOL = 1e-6


def _run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=REPO, env=env, capture_output=True,
        stdin=subprocess.DEVNULL, text=True, timeout=120, check=False)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """A small synthetic task's export, written, read back, and in memory.

    The export goes through the library calls `launch/export.py` makes (the
    CLI itself is tested on bad input only: a full run as a subprocess costs
    another TensorFlow import and build, about 20 s on two cores).
    """
    out = tmp_path_factory.mktemp('export') / 'synthetic'
    task = tasks.get_task('synthetic')
    split = task.load_split(num_users=NUM_USERS, num_items=NUM_ITEMS)
    config = neumf.ModelConfig(num_items=split.num_items)
    work = client_update.ClientWorkConfig(rho_sh=task.rho_sh, rho_ns=task.rho_ns)
    deployment = export.build_deployment(model_config=config, work=work)
    written = export.write_deployment(
        deployment, out, extra_hyperparameters={'task': task.name})
    return collections.OrderedDict(
        out=out,
        written=written,
        manifest=export.read_manifest(out),
        loaded=export.load_computations(out),
        deployment=deployment,
        config=config,
        work=work,
        split=split,
    )


def _inputs(exported, round_num, *, nan_user=None):
    """Round batches of the cohort from the synthetic split."""
    data = client_data.FederatedTrainData.from_split(exported['split'])
    batches = []
    for user in COHORT:
        items, labels = data.round_batch(user, seed=0, round_num=round_num)
        labels = labels.copy()
        if user == nan_user:
            labels[0] = np.nan  # The client's update is not finite: dropped.
        batches.append(collections.OrderedDict(items=items, labels=labels))
    return batches


def _initial_states(config):
    rng = np.random.default_rng(0)
    states = []
    for _ in COHORT:
        local = [rng.normal(scale=0.3, size=(1, d)).astype(np.float32)
                 for d in (config.gmf_dim, config.mlp_dim)]
        states.append(collections.OrderedDict(
            local_weights=local, adam_step=np.int32(0),
            adam_m=[np.zeros_like(w) for w in local],
            adam_v=[np.zeros_like(w) for w in local]))
    return states


def _as_dicts(structure):
    """Typed states (named tuples) as the dicts deserialized computations give."""
    if hasattr(structure, '_asdict'):
        structure = structure._asdict()
    if isinstance(structure, dict):
        return {k: _as_dicts(v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return [_as_dicts(v) for v in structure]
    return structure


def _assert_same(actual, expected):
    actual = tf.nest.flatten(_as_dicts(actual))
    expected = tf.nest.flatten(_as_dicts(expected))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if a is None or e is None:  # E.g. the metrics of the initial state.
            assert a is e
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0,
                                   atol=ATOL)


@pytest.fixture(scope='module')
def rounds(exported):
    """Two rounds of the in-memory process and of the deserialized one."""
    process = exported['deployment'].pieces.process
    loaded = exported['loaded']
    states = _initial_states(exported['config'])
    data = [_inputs(exported, 0), _inputs(exported, 1, nan_user=COHORT[1])]
    results = {'memory': [], 'loaded': []}
    for key, initialize, next_fn in (
            ('memory', process.initialize, process.next),
            ('loaded', loaded['initialize'], loaded['next'])):
        server, clients = initialize(), states
        results[key].append((server, clients, None))
        for batches in data:
            server, clients, metrics = next_fn(server, clients, batches)
            results[key].append((server, clients, metrics))
    return collections.OrderedDict(states=states, data=data, **results)


# ----------------------------------------------------------------------------
# The CLI's output and the manifest.
# ----------------------------------------------------------------------------


def test_files_and_manifest(exported):
    manifest = exported['manifest']
    assert manifest == json.loads(json.dumps(exported['written']))
    for required in ('initialize', 'next', 'federated_evaluation',
                     'client_update', 'server_update', 'distributor_next',
                     'client_work_next', 'aggregator_next', 'finalizer_next',
                     'mapreduce_round',
                     'mapreduce_prepare', 'mapreduce_work', 'mapreduce_update',
                     'distribute_aggregate_client_work'):
        assert required in manifest['computations']
    expected_files = {export.MANIFEST_NAME, *manifest['forms'].values()}
    for entry in manifest['computations'].values():
        expected_files.add(entry['file'])
        assert entry['runs_on'] in (export.DEVICE, export.SERVER,
                                    export.AGGREGATION, export.FEDERATED)
    assert {p.name for p in exported['out'].iterdir()} == expected_files
    assert manifest['device_state'] == str(
        exported['deployment'].pieces.client_state_type)


def test_manifest_types_match_loaded_and_in_memory(exported):
    memory = exported['deployment'].computations
    assert list(exported['loaded']) == list(memory)
    for name, comp in exported['loaded'].items():
        entry = exported['manifest']['computations'][name]
        assert entry['type_signature'] == str(comp.type_signature), name
        assert comp.type_signature.is_equivalent_to(memory[name].type_signature)


def test_manifest_hyperparameters_and_traffic(exported):
    manifest, config = exported['manifest'], exported['config']
    hp = manifest['hyperparameters']
    num_items = exported['split'].num_items
    assert hp['task'] == 'synthetic'
    assert hp['num_items'] == num_items
    assert hp['model'] == {'num_items': num_items, 'gmf_dim': 32, 'mlp_dim': 128,
                           'mlp_layers': [128, 64, 32], 'use_mlp': True}
    assert (hp['rho_sh'], hp['rho_ns']) == (0.01, 0.05)
    assert (hp['local_lr'], hp['server_lr']) == (0.1, 0.001)
    assert hp['loss_reduction'] == 'chunk_sum'
    assert hp['local_state'] == 'persistent'
    # 160 * num_items + 43,297 floats for the default NeuMF sizes.
    params = 160 * num_items + 43_297
    assert hp['num_global_params'] == config.num_global_params() == params
    traffic = manifest['traffic_per_device_and_round']
    assert traffic['download_bytes'] == 4 * params
    # The SAM gradient plus a few scalars (weight, dropped, users, metrics).
    assert 4 * params < traffic['upload_bytes'] <= 4 * params + 64
    # Embedding rows, Adam moments (3 x 160 floats) and the Adam step.
    assert traffic['device_state_bytes'] == 4 * (3 * (32 + 128) + 1)
    summary = (exported['out'] / export.MAPREDUCE_SUMMARY_NAME).read_text()
    for piece, _ in export.MAPREDUCE_PIECES:
        assert piece in summary


def _server_visible(type_spec, on_server):
    """Every server-visible sub-type (written apart from the library's)."""
    if isinstance(type_spec, tff.FederatedType):
        on_server = type_spec.placement is tff.SERVER
        type_spec = type_spec.member
    if on_server:
        yield type_spec
    children = []
    if isinstance(type_spec, tff.FunctionType):
        children = [t for t in (type_spec.parameter, type_spec.result)
                    if t is not None]
    elif isinstance(type_spec, tff.StructType):
        children = list(type_spec)
    for child in children:
        yield from _server_visible(child, on_server)


def test_no_user_weights_in_server_visible_types(exported):
    config = exported['config']
    pieces = exported['deployment'].pieces
    local_shapes = {(1, config.gmf_dim), (1, config.mlp_dim)}
    checked = 0
    for name, comp in exported['loaded'].items():
        runs_on = exported['manifest']['computations'][name]['runs_on']
        if runs_on == export.DEVICE:
            continue
        for part in _server_visible(comp.type_signature,
                                    runs_on != export.FEDERATED):
            checked += 1
            assert not part.is_equivalent_to(pieces.client_state_type), name
            if isinstance(part, tff.TensorType):
                assert tuple(part.shape) not in local_shapes, (name, part)
        assert not export.find_local_weights_on_server(
            comp.type_signature, runs_on=runs_on, pieces=pieces,
            model_config=config)
    assert checked > 100
    # The checks do see user weights where they are: in the device's types.
    assert export.find_local_weights_on_server(
        exported['loaded']['client_update'].type_signature,
        runs_on=export.SERVER, pieces=pieces, model_config=config)


# ----------------------------------------------------------------------------
# Deserialized computations equal the in-memory process.
# ----------------------------------------------------------------------------


def test_deserialized_initialize_and_rounds_match(rounds):
    assert len(rounds['memory']) == len(rounds['loaded']) == 3
    for memory, loaded in zip(rounds['memory'], rounds['loaded']):
        _assert_same(loaded, memory)
    # The rounds did something: the weights moved, one client was dropped.
    first, second = rounds['memory'][1][0], rounds['memory'][2][0]
    assert second['round_num'] == 2
    assert rounds['memory'][2][2]['dropped_clients'] == 1
    assert not np.allclose(first['global_weights'][0],
                           rounds['memory'][0][0]['global_weights'][0])


def test_federated_evaluation_matches(exported, rounds):
    server, clients, _ = rounds['memory'][2]
    split = exported['split']
    candidates = [np.concatenate([[split.test_items[u]],
                                  split.test_negatives[u]]).astype(np.int32)
                  for u in COHORT]
    local = [c['local_weights'] for c in clients]
    memory = exported['deployment'].computations['federated_evaluation'](
        server['global_weights'], local, candidates)
    loaded = exported['loaded']['federated_evaluation'](
        server['global_weights'], local, candidates)
    _assert_same(loaded, memory)
    assert set(memory) >= {'hr@10', 'ndcg@10'}


# ----------------------------------------------------------------------------
# The MapReduce forms, run piece by piece from the deserialized pieces.
# ----------------------------------------------------------------------------


def _device_inputs(states, batches):
    return [collections.OrderedDict(client_state=s, data=b)
            for s, b in zip(states, batches)]


def _mapreduce_by_hand(loaded, server_state, device_inputs):
    """prepare -> work per device -> accumulate (two groups) / merge / report
    -> update, as a MapReduce backend runs the form."""
    for name in ('secure_sum_bitwidth', 'secure_sum_max_input',
                 'secure_modular_sum_modulus'):
        # The round has no secure sums; their slots stay empty.
        assert not loaded[f'mapreduce_{name}'].type_signature.result
    broadcast = loaded['mapreduce_prepare'](server_state)
    accumulators = []
    for group in (device_inputs[:1], device_inputs[1:]):
        accumulator = loaded['mapreduce_zero']()
        for device_input in group:
            work_out = loaded['mapreduce_work'](device_input, broadcast)
            accumulator = loaded['mapreduce_accumulate'](accumulator, work_out[0])
        accumulators.append(accumulator)
    merged = loaded['mapreduce_merge'](*accumulators)
    report = loaded['mapreduce_report'](merged)
    return loaded['mapreduce_update'](server_state, (report, (), (), ()))


def test_mapreduce_form_by_hand_matches_round(exported, rounds):
    loaded = exported['loaded']
    states = rounds['states']
    for r, batches in enumerate(rounds['data']):
        server_in = rounds['memory'][r][0]
        expected_server, expected_clients, expected_metrics = (
            rounds['memory'][r + 1])
        new_server, metrics = _mapreduce_by_hand(
            loaded, server_in, _device_inputs(states, batches))
        _assert_same(new_server, expected_server)
        _assert_same(metrics, expected_metrics)
        # The device-side write-back: client_update gives the next state.
        states = [
            loaded['client_update'](server_in['global_weights'], s, b)[
                'client_state'] for s, b in zip(states, batches)]
        _assert_same(states, expected_clients)


def test_forms_rebuild_from_loaded_pieces_and_run(exported, rounds):
    loaded = exported['loaded']
    round_type = loaded['mapreduce_round'].type_signature
    # The constructors check that the pieces' types fit together.
    tff.backends.mapreduce.MapReduceForm(
        round_type, *[loaded[f'mapreduce_{p}'] for p, _ in export.MAPREDUCE_PIECES])
    daf = tff.backends.mapreduce.DistributeAggregateForm(
        round_type, *[loaded[f'distribute_aggregate_{p}']
                      for p, _ in export.DISTRIBUTE_AGGREGATE_PIECES])
    server_in = rounds['memory'][0][0]
    expected_server, _, expected_metrics = rounds['memory'][1]
    devices = _device_inputs(rounds['states'], rounds['data'][0])
    # Not `get_computation_for_map_reduce_form(mrf)`: it calls the secure-sum
    # intrinsics (on empty values here), which TFF 0.87's local C++ runtime
    # cannot execute ("Cannot embed a federated value"); the MapReduceForm is
    # run piece by piece above instead.
    for comp in (
            loaded['mapreduce_round'],
            tff.backends.mapreduce.get_computation_for_distribute_aggregate_form(
                daf)):
        new_server, metrics = comp(server_in, devices)
        _assert_same(new_server, expected_server)
        _assert_same(metrics, expected_metrics)


def test_distribute_aggregate_form_by_hand_matches_round(exported, rounds):
    loaded = exported['loaded']
    server_in = rounds['memory'][0][0]
    expected_server, _, expected_metrics = rounds['memory'][1]
    devices = _device_inputs(rounds['states'], rounds['data'][0])
    broadcast_in, temp = loaded['distribute_aggregate_server_prepare'](
        server_in).values()
    # `server_to_client_broadcast` alone cannot run in TFF's local context (no
    # CLIENTS cardinality without a CLIENTS input); a broadcast hands every
    # device the same value, which is what passing `broadcast_in` does.
    work_out = loaded['distribute_aggregate_client_work'](devices, broadcast_in)
    aggregated = loaded['distribute_aggregate_client_to_server_aggregation'](
        temp, work_out)
    new_server, metrics = loaded['distribute_aggregate_server_result'](
        temp, aggregated)
    _assert_same(new_server, expected_server)
    _assert_same(metrics, expected_metrics)


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('args, fragment', [
    ((), '--task is required'),
    (('--task=synthetic',), '--output_dir is required'),
    (('--task=filmtrust', '--data_dir={tmp}/missing', '--output_dir={tmp}/o'),
     'data directory not found'),
    (('--task=synthetic', '--output_dir={tmp}/full'), 'not empty'),
    (('--task=synthetic', '--algorithm=fedncf', '--rho_sh=0.1',
      '--output_dir={tmp}/o'), '--rho_sh must be 0.0 for fedncf'),
    (('--task=synthetic', '--top_ks=5,20', '--output_dir={tmp}/o'), 'must include 10'),
    (('--run_dir={tmp}/missing', '--output_dir={tmp}/o'), 'run folder not found'),
    (('--run_dir={tmp}/full', '--output_dir={tmp}/o'), 'not a run folder'),
    (('--run_dir={tmp}/full', '--task=synthetic', '--output_dir={tmp}/o'),
     'drop --task'),
])
def test_bad_input_is_one_line(tmp_path, args, fragment):
    (tmp_path / 'full').mkdir()
    (tmp_path / 'full' / 'file.txt').write_text('x')
    result = _run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
    assert fragment in lines[0]
    assert not (tmp_path / 'o').exists()


def test_the_export_takes_the_server_optimizer_it_is_given():
    """--server_optimizer is exported, not silently replaced by Adam."""
    config = neumf.ModelConfig(num_items=40, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
    deployment = export.build_deployment(model_config=config, server_optimizer='sgd')
    assert deployment.hyperparameters['server_optimizer'] == 'sgd'
    adam = fedrecgel.build_server_optimizer(name='adam').initialize(
        neumf.global_weight_specs(config))
    assert 'preconditioner' in adam  # Adam's second moments ...
    # ... are not in the exported server state: its optimizer is SGD.
    assert 'preconditioner' not in str(deployment.pieces.server_state_type.optimizer_state)
