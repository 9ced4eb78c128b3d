"""Tests of the FedRecGEL TFF process (docs/ALGORITHM.md, steps 1-9).

Each process is built once per module. Reference results come from eager
client updates or from a fresh NeuMF with `tf.GradientTape`, then one TFF Adam
step on the server weights.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.data import client_data
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.models import neumf
from tff_types import nodes as _walk  # pylint: disable=g-bad-import-order

CONFIG = neumf.ModelConfig(
    num_items=20, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
SAM_WORK = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.2)
PLAIN_WORK = client_update.ClientWorkConfig()
SERVER_LR = 0.001
COHORT_SIZES = (30, 150, 12)  # 150 examples: two chunks of the default 128.


# ----------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------


def _state(rng, config=CONFIG, scale=0.3, step=0):
    dims = [config.gmf_dim] + ([config.mlp_dim] if config.use_mlp else [])
    local = [rng.normal(scale=scale, size=(1, d)).astype(np.float32)
             for d in dims]
    return client_update.ClientState(
        local_weights=local,
        adam_step=np.int32(step),
        adam_m=[np.zeros_like(w) for w in local],
        adam_v=[np.zeros_like(w) for w in local],
    )


def _batch(rng, n, num_items=CONFIG.num_items, nan=False):
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[0] = 1.0
    if nan:
        labels[n // 2] = np.nan
    return collections.OrderedDict(
        items=rng.integers(0, num_items, size=n).astype(np.int32),
        labels=labels)


def _numpy(structure):
    return tf.nest.map_structure(np.asarray, structure)


def _process(model_config, work, **kwargs):
    """The round with one user per TFF client (the deployable form)."""
    return fedrecgel.build_round_pieces(
        model_config=model_config,
        client_update=client_update.build_client_update(model_config, work, single_user=True),
        **kwargs).process


def _adam_step(weights, gradients, lr):
    """One TFF Adam step from a fresh state (epsilon 1e-8)."""
    adam = tff.learning.optimizers.build_adam(lr, epsilon=1e-8)
    state = adam.initialize([tf.TensorSpec(w.shape, tf.float32)
                             for w in weights])
    _, new = adam.next(state, [tf.constant(w) for w in weights],
                       [tf.constant(g) for g in gradients])
    return [w.numpy() for w in new]


def _mean(updates):
    return [np.mean(np.stack(parts), axis=0) for parts in zip(*updates)]


def _assert_all_close(actual, expected, atol=1e-6):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol)


def _chunk_weights(n, chunk=128):
    sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    return np.concatenate([np.full(s, 1.0 / s) for s in sizes]).astype(
        np.float32)


def _plain_gradients(model, global_weights, local_weights, data):
    """Plain chunk_sum gradients (global, local) from a GradientTape."""
    for var, value in zip(model.global_variables, global_weights):
        var.assign(value)
    for var, value in zip(model.local_variables, local_weights):
        var.assign(value)
    variables = model.global_variables + model.local_variables
    with tf.GradientTape() as tape:
        losses = tf.nn.sigmoid_cross_entropy_with_logits(
            labels=data['labels'], logits=model(data['items']))
        loss = tf.reduce_sum(losses * _chunk_weights(len(data['items'])))
    grads = [tf.reshape(tf.convert_to_tensor(g), v.shape).numpy()
             for g, v in zip(tape.gradient(loss, variables), variables)]
    split = len(model.global_variables)
    return grads[:split], grads[split:]


def _tensors(type_spec, placement=None):
    return [(p, t) for p, t in _walk(type_spec, placement)
            if isinstance(t, tff.TensorType)]


def _leaf_shapes(type_spec):
    return [tuple(t.shape) for _, t in _tensors(type_spec)]


def _synthetic_data():
    frame = synthetic.generate_synthetic(num_users=60, num_items=80, seed=0)
    split = preprocess.build_split(frame, num_negatives=10)
    return client_data.FederatedTrainData.from_split(split)


# ----------------------------------------------------------------------------
# Fixtures: every process is built once.
# ----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def sam_process():
    return _process(CONFIG, SAM_WORK)


@pytest.fixture(scope='module')
def plain_process():
    return _process(CONFIG, PLAIN_WORK)


@pytest.fixture(scope='module')
def train_data():
    return _synthetic_data()


@pytest.fixture(scope='module')
def learn_config(train_data):
    return neumf.ModelConfig(num_items=train_data.num_items, gmf_dim=8,
                             mlp_dim=8, mlp_layers=(8, 4))


@pytest.fixture(scope='module')
def reconstruct_process(learn_config):
    work = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.05,
                                        local_state='reconstruct')
    return _process(learn_config, work,
                    server_optimizer=fedrecgel.build_server_optimizer(0.01))


@pytest.fixture(scope='module')
def cohort():
    """Three clients with their states and data."""
    rng = np.random.default_rng(0)
    states = [_state(rng) for _ in COHORT_SIZES]
    data = [_batch(rng, n) for n in COHORT_SIZES]
    return states, data


@pytest.fixture(scope='module')
def initial_state(sam_process):
    return sam_process.initialize()


@pytest.fixture(scope='module')
def eager_sam_outputs(initial_state, cohort):
    """The three clients' eager SAM updates at the initial server weights."""
    update_fn = client_update.build_client_update(CONFIG, SAM_WORK, single_user=True).fn
    states, data = cohort
    return [_numpy(update_fn(initial_state.global_weights, s, d))
            for s, d in zip(states, data)]


# ----------------------------------------------------------------------------
# One round.
# ----------------------------------------------------------------------------


def test_initial_weights_match_seeded_model(initial_state):
    """Server init (graph mode) gives the eager NeuMF(seed=0) weights."""
    model = neumf.NeuMF(CONFIG, seed=0)
    weights = initial_state.global_weights
    assert len(weights) == len(model.global_variables)
    for value, var in zip(weights, model.global_variables):
        np.testing.assert_array_equal(value, var.numpy())
    assert initial_state.round_num == 0


def test_one_round_equals_eager_mean_then_adam(
        sam_process, initial_state, cohort, eager_sam_outputs):
    """Server: Adam(0.001) on the mean upload; clients: eager new states."""
    states, data = cohort
    new_server, new_states, metrics = sam_process.next(
        initial_state, states, data)
    mean_update = _mean([o['update'] for o in eager_sam_outputs])
    expected = _adam_step(initial_state.global_weights, mean_update,
                          SERVER_LR)
    _assert_all_close(new_server.global_weights, expected)
    moved = [np.abs(a - b).max() for a, b in zip(
        new_server.global_weights, initial_state.global_weights)]
    assert max(moved) > 5e-4  # Adam moves every coordinate by ~lr.
    assert new_server.round_num == 1
    assert new_server.optimizer_state['step'] == 1
    assert len(new_states) == 3
    for got, eager in zip(new_states, eager_sam_outputs):
        tf.nest.map_structure(
            lambda a, b: np.testing.assert_allclose(
                a, b, rtol=1e-5, atol=1e-6),
            _numpy(got), eager['client_state'])
    assert metrics['clients'] == 3
    assert metrics['dropped_clients'] == 0
    assert metrics['loss'] == pytest.approx(
        np.mean([o['metrics']['loss'] for o in eager_sam_outputs]), rel=1e-5)
    assert metrics['examples_per_client'] == pytest.approx(
        np.mean(COHORT_SIZES), rel=1e-6)


def test_non_finite_client_is_excluded_from_mean(
        sam_process, initial_state, cohort, eager_sam_outputs):
    """A NaN client is dropped; the update is the mean over the other two."""
    states, data = cohort
    rng = np.random.default_rng(5)
    bad_state = _state(rng)
    bad_data = _batch(rng, 25, nan=True)
    new_server, new_states, metrics = sam_process.next(
        initial_state, [states[0], bad_state, states[2]],
        [data[0], bad_data, data[2]])
    assert metrics['dropped_clients'] == 1
    assert metrics['clients'] == 3
    mean_update = _mean([eager_sam_outputs[0]['update'],
                         eager_sam_outputs[2]['update']])
    expected = _adam_step(initial_state.global_weights, mean_update,
                          SERVER_LR)
    _assert_all_close(new_server.global_weights, expected)
    assert all(np.all(np.isfinite(w)) for w in new_server.global_weights)
    tf.nest.map_structure(np.testing.assert_array_equal,
                          _numpy(new_states[1]), bad_state)
    assert np.isfinite(metrics['loss'])
    assert metrics['loss'] == pytest.approx(
        np.mean([eager_sam_outputs[i]['metrics']['loss'] for i in (0, 2)]),
        rel=1e-5)


def test_all_clients_non_finite_leaves_model_unchanged(
        sam_process, initial_state):
    """A cohort where every client is dropped leaves the server model as is."""
    rng = np.random.default_rng(6)
    states = [_state(rng) for _ in range(3)]
    data = [_batch(rng, 10, nan=True) for _ in range(3)]
    new_server, new_states, metrics = sam_process.next(
        initial_state, states, data)
    assert metrics['dropped_clients'] == 3
    for new, old in zip(new_server.global_weights,
                        initial_state.global_weights):
        np.testing.assert_array_equal(new, old)
    assert new_server.optimizer_state['step'] == 0
    for new, old in zip(new_states, states):
        tf.nest.map_structure(np.testing.assert_array_equal, _numpy(new), old)


def test_zero_radii_process_is_fedncf(plain_process, cohort):
    """rho = 0: plain gradients (one tape pass) averaged, then server Adam."""
    server = plain_process.initialize()
    states, data = cohort
    new_server, new_states, _ = plain_process.next(server, states, data)
    model = neumf.NeuMF(CONFIG)
    uploads = []
    for state, batch, new_state in zip(states, data, new_states):
        g_sh, g_ns = _plain_gradients(
            model, server.global_weights, state.local_weights, batch)
        uploads.append(g_sh)
        _assert_all_close(new_state.local_weights,
                          _adam_step(state.local_weights, g_ns, 0.1))
        assert new_state.adam_step == 1
    expected = _adam_step(server.global_weights, _mean(uploads), SERVER_LR)
    _assert_all_close(new_server.global_weights, expected)


def test_state_persists_only_for_sampled_users(sam_process, initial_state):
    """Over 3 rounds a user's state changes exactly when it is sampled."""
    rng = np.random.default_rng(7)
    num_users = 8
    # Distinct Adam steps and well-separated rows identify each returned state.
    table = [_state(rng, scale=1.0, step=10 * u) for u in range(num_users)]
    data = [_batch(rng, 20 + 3 * u) for u in range(num_users)]
    rounds = [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7], [6, 0, 2, 5, 7]]
    server = initial_state
    for round_num, users in enumerate(rounds):
        before = [_numpy(s) for s in table]
        server, new_states, metrics = sam_process.next(
            server, [table[u] for u in users], [data[u] for u in users])
        assert metrics['clients'] == 5 and metrics['dropped_clients'] == 0
        assert server.round_num == round_num + 1
        for u, new in zip(users, new_states):
            new = _numpy(new)
            assert new.adam_step == before[u].adam_step + 1
            for w_new, w_old in zip(new.local_weights,
                                    before[u].local_weights):
                assert not np.array_equal(w_new, w_old)
                assert np.abs(w_new - w_old).max() < 0.15  # One Adam step.
            assert np.any(new.adam_m[0] != 0)
            table[u] = new
        for u in set(range(num_users)) - set(users):
            tf.nest.map_structure(np.testing.assert_array_equal,
                                  _numpy(table[u]), before[u])
    steps = [int(s.adam_step) - 10 * u for u, s in enumerate(table)]
    assert steps == [2, 1, 2, 2, 2, 2, 2, 2]


# ----------------------------------------------------------------------------
# Privacy: what the server may see.
# ----------------------------------------------------------------------------

_AGGREGATIONS = (
    'federated_sum', 'federated_mean', 'federated_weighted_mean',
    'federated_aggregate', 'federated_secure_sum',
    'federated_secure_sum_bitwidth', 'federated_secure_modular_sum')


def _server_leaks(signatures, config):
    """SERVER-placed local-row-shaped tensors or client-state structs."""
    local_shapes = {(1, config.gmf_dim), (1, config.mlp_dim)}
    state_shapes = _leaf_shapes(tff.types.tensorflow_to_type(
        client_update.client_state_spec(config, single_user=True)))
    leaks = []
    for signature in signatures:
        for placement, node in _walk(signature):
            if placement != tff.SERVER:
                continue
            if isinstance(node, tff.TensorType) and (
                    tuple(node.shape) in local_shapes):
                leaks.append(node)
            if isinstance(node, tff.StructType) and (
                    _leaf_shapes(node) == state_shapes):
                leaks.append(node)
    return leaks


def _client_to_server_values(comp):
    """(uri, CLIENTS-placed members) of intrinsics with a SERVER result."""
    flows = []

    def visit(node):
        if isinstance(node, tff.framework.Intrinsic):
            signature = node.type_signature
            from_clients = [t.member for _, t in _walk(signature.parameter)
                            if isinstance(t, tff.FederatedType)
                            and t.placement == tff.CLIENTS]
            to_server = any(
                isinstance(t, tff.FederatedType) and t.placement == tff.SERVER
                for _, t in _walk(signature.result))
            if from_clients and to_server:
                flows.append((node.uri, from_clients))
        return node, False

    tff.framework.transform_postorder(comp.to_building_block(), visit)
    return flows


def _upload_violations(comp, config):
    """Client-to-server values that are neither the global weights nor scalars.

    Returns:
      (violations, whether the global weights' type is uploaded).
    """
    global_shapes = _leaf_shapes(tff.types.tensorflow_to_type(
        neumf.global_weight_specs(config)))
    violations, uploads_global = [], False
    for uri, members in _client_to_server_values(comp):
        for member in members:
            shapes = _leaf_shapes(member)
            if uri in _AGGREGATIONS and shapes == global_shapes:
                uploads_global = True
            elif uri not in _AGGREGATIONS or any(s != () for s in shapes):
                violations.append((uri, member))
    return violations, uploads_global


@pytest.mark.parametrize('persistent', [True, False])
def test_privacy_invariant(persistent, sam_process, reconstruct_process,
                           learn_config):
    """Server never holds local rows or client state; uploads = global."""
    process = sam_process if persistent else reconstruct_process
    config = CONFIG if persistent else learn_config
    signatures = (process.initialize.type_signature,
                  process.next.type_signature)
    assert not _server_leaks(signatures, config)
    result = process.next.type_signature.result
    metrics = result[2] if persistent else result[1]
    assert metrics.placement == tff.SERVER
    metric_tensors = _tensors(metrics.member)
    assert len(metric_tensors) >= 6
    assert all(tuple(t.shape) == () for _, t in metric_tensors)
    violations, uploads_global = _upload_violations(process.next, config)
    assert not violations
    assert uploads_global
    if persistent:  # The client state does cross the CLIENTS boundary.
        assert result[1].placement == tff.CLIENTS
        assert _server_leaks([result[1].member], config) == []
        client_shapes = {tuple(t.shape) for p, t in _tensors(result[1])}
        assert {(1, config.gmf_dim), (1, config.mlp_dim)} <= client_shapes


def test_privacy_checks_detect_a_leak():
    """The privacy checks flag a computation summing local rows at SERVER."""
    state_type = tff.types.tensorflow_to_type(
        client_update.client_state_spec(CONFIG, single_user=True))

    @tff.federated_computation(tff.FederatedType(state_type, tff.CLIENTS))
    def leaky(states):
        return (tff.federated_sum(states.local_weights),
                tff.federated_sum(states.adam_step))

    assert len(_server_leaks([leaky.type_signature], CONFIG)) == 2
    violations, uploads_global = _upload_violations(leaky, CONFIG)
    assert len(violations) == 1 and not uploads_global


# ----------------------------------------------------------------------------
# Learning and variants.
# ----------------------------------------------------------------------------


def _train(process, train_data, rounds, persistent, config):
    rng = np.random.default_rng(0)
    server = process.initialize()
    init_rng = np.random.default_rng(1)
    table = [_state(init_rng, config=config, scale=0.01)
             for _ in range(train_data.num_users)]
    losses = []
    for round_num in range(rounds):
        users = rng.choice(train_data.num_users, 10, replace=False)
        batches = [
            collections.OrderedDict(items=i, labels=l) for i, l in
            train_data.round_batches(users, seed=0, round_num=round_num)]
        if persistent:
            server, states, metrics = process.next(
                server, [table[u] for u in users], batches)
            for u, state in zip(users, states):
                table[u] = state
        else:
            server, metrics = process.next(server, batches)
        assert metrics['dropped_clients'] == 0
        losses.append(float(metrics['loss']))
    return losses, server


def test_reconstruct_mode_learns(reconstruct_process, train_data,
                                 learn_config):
    """Reconstruct mode: the training loss clearly decreases over 20 rounds."""
    losses, server = _train(reconstruct_process, train_data, 20, False,
                            learn_config)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.1, losses
    assert server.round_num == 20


def test_persistent_mode_learns(train_data, learn_config):
    """Persistent mode: the training loss clearly decreases over 20 rounds."""
    work = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.05)
    process = _process(learn_config, work,
                       server_optimizer=fedrecgel.build_server_optimizer(0.01))
    losses, _ = _train(process, train_data, 20, True, learn_config)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.08, losses


def test_fedmf_variant_runs_a_round():
    """The GMF-only model (FedMF) runs a round with one local row each."""
    config = neumf.ModelConfig(num_items=20, gmf_dim=4, use_mlp=False, mlp_layers=())
    process = _process(config, PLAIN_WORK, server_optimizer=fedrecgel.build_server_optimizer(0.01))
    server = process.initialize()
    assert [w.shape for w in server.global_weights] == [(20, 4), (4, 1), (1,)]
    rng = np.random.default_rng(3)
    states = [_state(rng, config=config) for _ in range(2)]
    data = [_batch(rng, 15), _batch(rng, 25)]
    new_server, new_states, metrics = process.next(server, states, data)
    assert metrics['clients'] == 2 and metrics['dropped_clients'] == 0
    assert np.isfinite(metrics['loss'])
    model = neumf.NeuMF(config)
    uploads = [_plain_gradients(model, server.global_weights, s.local_weights, d)[0]
               for s, d in zip(states, data)]
    _assert_all_close(new_server.global_weights,
                      _adam_step(server.global_weights, _mean(uploads), 0.01))
    for state in new_states:
        assert len(state.local_weights) == 1
        assert state.local_weights[0].shape == (1, 4)
        assert state.adam_step == 1
