"""FedLESAM and FedGloSS: SAM whose global perturbation the server provides
(`algorithms/global_perturbation.py`, docs/ALGORITHM.md).

Tiny NeuMF and synthetic data; each process is built once per module.
"""

import asyncio
import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import global_perturbation as gp
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.errors import SettingError
from tff_fedrecgel.models import neumf
from tff_types import nodes as _walk  # pylint: disable=g-bad-import-order

CONFIG = neumf.ModelConfig(num_items=12, gmf_dim=4, mlp_dim=4, mlp_layers=(8, 4))
SPECS = neumf.global_weight_specs(CONFIG)
RHO = 0.3


def _work(mode):
    return ClientWorkConfig(rho_sh=RHO, update='model_delta', chunk_size=4, local_epochs=2,
                            client_lr=0.1, global_perturbation=mode)


def _pieces(mode):
    work = _work(mode)
    return fedrecgel.build_round_pieces(
        model_config=CONFIG, client_update=gp.build_client_update(CONFIG, work),
        server_optimizer=fedrecgel.build_server_optimizer(1.0, 'sgd'),
        global_perturbation=gp.build_global_perturbation(work, SPECS))


@pytest.fixture(scope='module')
def lesam():
    return _pieces('global_change')


@pytest.fixture(scope='module')
def gloss():
    return _pieces('server')


def _round_inputs(seed=0, users=(7, 10)):
    """Client states and padded data of two TFF clients, one user each."""
    rng = np.random.default_rng(seed)
    states, data = [], []
    for n in users:
        local = [rng.normal(scale=0.1, size=(1, d)).astype(np.float32)
                 for d in CONFIG.local_dims]
        states.append(client_update.ClientState(local, np.zeros([1], np.int32),
                                                [np.zeros_like(w) for w in local],
                                                [np.zeros_like(w) for w in local]))
        data.append(collections.OrderedDict(
            items=rng.integers(0, CONFIG.num_items, (1, n)).astype(np.int32),
            labels=(rng.random((1, n)) < 0.5).astype(np.float32),
            lengths=np.array([n], np.int32)))
    return states, data


def _sent(distributor, state, weights):
    """`(new state, what one client receives)` of a distributor's `next`."""
    next_type = distributor.next.type_signature.parameter

    # A CLIENTS-placed argument gives the broadcast its one client.
    @tff.federated_computation(next_type[0], next_type[1],
                               tff.FederatedType(np.int32, tff.CLIENTS))
    def run(state, weights, clients):
        del clients
        out = distributor.next(state, weights)
        return out.state, out.result

    # A broadcast is all-equal: one value, not one per client.
    return run(state, weights, [0])


def _random_weights(seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=0.1, size=s.shape).astype(np.float32) for s in SPECS]


def test_config_validates_the_global_perturbation():
    assert ClientWorkConfig().global_perturbation == 'local'
    with pytest.raises(ValueError, match='global_perturbation must be one of'):
        ClientWorkConfig(global_perturbation='everywhere')
    for bad in (dict(update='gradient'), dict(update='model_delta', rho_ns=0.1),
                dict(update='model_delta', sam_eta=0.2)):
        with pytest.raises(ValueError, match='needs update'):
            ClientWorkConfig(global_perturbation='server', **bad)
    assert ClientWorkConfig(update='model_delta', global_perturbation='server').rho_ns == 0


def test_lesam_distributor_sends_the_weights_and_the_last_change(lesam):
    distributor = lesam.distributor
    w1, w2 = _random_weights(1), _random_weights(2)
    state, sent = _sent(distributor, distributor.initialize(), w1)
    for got, want in zip(sent['weights'], w1):
        np.testing.assert_array_equal(got, want)
    assert all(np.all(np.asarray(d) == 0) for d in sent['direction'])
    _, sent = _sent(distributor, state, w2)
    for got, a, b in zip(sent['direction'], w1, w2):
        np.testing.assert_allclose(got, a - b, atol=1e-7)
    # What reaches a client is twice the model.
    member = distributor.next.type_signature.result.result.member
    assert len(list(member)) == 2 and len(list(member[0])) == len(SPECS)


def test_gloss_distributor_sends_w_first_then_the_server_sam_point(gloss):
    distributor = gloss.distributor
    w, d = _random_weights(3), _random_weights(4)
    _, first = _sent(distributor, distributor.initialize(), w)
    for got, want in zip(first, w):
        np.testing.assert_array_equal(got, want)
    norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in d))
    _, sent = _sent(distributor, d, w)
    for got, a, b in zip(sent, w, d):
        np.testing.assert_allclose(got, a + RHO * b / norm, atol=1e-6)


def test_gloss_finalizer_steps_the_unperturbed_weights_and_keeps_d(gloss):
    states, data = _round_inputs()
    process = gloss.process
    state0 = process.initialize()
    state1, states1, _ = process.next(state0, states, data)
    w0, w1 = state0.global_weights, state1.global_weights
    # SGD at rate 1: the kept d is exactly the step the server took.
    for d, a, b in zip(state1.distributor_state, w0, w1):
        np.testing.assert_allclose(d, a - b, atol=1e-6)
    state2, _, _ = process.next(state1, states1, data)
    _, perturbed = _sent(gloss.distributor, state1.distributor_state, w1)
    updates = [gloss.client_work(perturbed, s, x)['update'] for s, x in zip(states1, data)]
    for w2, w, *ups in zip(state2.global_weights, w1, *updates):
        np.testing.assert_allclose(w2, w - np.mean(ups, axis=0), atol=1e-6)
    # Stepping the perturbed point instead would differ by the perturbation.
    assert not np.allclose(perturbed[0], w1[0], atol=1e-4)


def test_fixed_step_sam_takes_one_backward_pass_at_the_moved_point():
    calls = []

    def loss_fn(at):
        calls.append(1)
        return tf.reduce_sum(3.0 * tf.square(at['global'][0])) + tf.reduce_sum(
            at['global'][0]) * tf.reduce_sum(at['local'][0])

    x, y, e = np.array([1.0, -2.0], np.float32), np.array([0.5], np.float32), np.array(
        [0.1, 0.2], np.float32)
    optimizer = gp.FixedStepSam([tf.constant(e)])
    result = optimizer.sam_gradients_at(loss_fn, {'global': [x], 'local': [y]})
    assert len(calls) == 1 and optimizer.gradient_passes == 1
    np.testing.assert_allclose(result.gradients['global'][0], 6 * (x + e) + y.sum(), rtol=1e-6)
    np.testing.assert_allclose(result.gradients['local'][0], [(x + e).sum()], rtol=1e-6)
    np.testing.assert_allclose(result.loss, loss_fn({'global': [x + e], 'local': [y]}),
                               rtol=1e-6)


def test_lesam_step_is_rho_times_the_change_over_the_sum_of_norms():
    _, data = _round_inputs()
    group = client_update.NeuMFGroup(CONFIG, _work('global_change'), data[0])
    direction = [tf.constant(w) for w in _random_weights(5)]
    step = gp.lesam_step(group, direction, RHO)
    total = sum(np.linalg.norm(np.asarray(d).ravel()) for d in direction)
    for got, want in zip(step, group.point(direction)):
        np.testing.assert_allclose(got, RHO * np.asarray(want) / (total + 1e-7), rtol=1e-5)


def test_lesam_round_one_is_plain_local_training(lesam):
    """No change yet: the first round is the same round without SAM."""
    states, data = _round_inputs(seed=1)
    plain = fedrecgel.build_round_pieces(
        model_config=CONFIG,
        client_update=client_update.build_client_update(
            CONFIG, ClientWorkConfig(update='model_delta', chunk_size=4, local_epochs=2,
                                     client_lr=0.1)),
        server_optimizer=fedrecgel.build_server_optimizer(1.0, 'sgd')).process
    a, _, _ = lesam.process.next(lesam.process.initialize(), states, data)
    b, _, _ = plain.next(plain.initialize(), states, data)
    for x, y in zip(a.global_weights, b.global_weights):
        np.testing.assert_allclose(x, y, atol=1e-6)
    # The second round is moved by the change.
    a2, _, _ = lesam.process.next(a, states, data)
    b2, _, _ = plain.next(b._replace(global_weights=a.global_weights), states, data)
    assert not all(np.allclose(x, y, atol=1e-7) for x, y in zip(a2.global_weights,
                                                                b2.global_weights))


def _shapes(type_spec):
    return [tuple(t.shape) for _, t in _walk(type_spec) if isinstance(t, tff.TensorType)]


def _flows(comp):
    """(uri, CLIENTS-placed operand members, SERVER-placed?) of every intrinsic."""
    flows = []

    def visit(node):
        if isinstance(node, tff.framework.Intrinsic):
            sig = node.type_signature
            members = [t.member for _, t in _walk(sig.parameter)
                       if isinstance(t, tff.FederatedType) and t.placement == tff.CLIENTS]
            to_server = any(isinstance(t, tff.FederatedType) and t.placement == tff.SERVER
                            for _, t in _walk(sig.result))
            flows.append((node.uri, members, to_server, sig))
        return node, False

    tff.framework.transform_postorder(comp.to_building_block(), visit)
    return flows


@pytest.mark.parametrize('name,copies', [('lesam', 2), ('gloss', 1)])
def test_what_leaves_a_device_and_what_is_downloaded(name, copies, request):
    pieces = request.getfixturevalue(name)
    global_shapes = _shapes(pieces.global_type)
    local_shapes = {(None, d) for d in CONFIG.local_dims}
    uploads = []
    for uri, members, to_server, sig in _flows(pieces.process.next):
        if uri == 'federated_broadcast':
            assert _shapes(sig.result.member) == global_shapes * copies
        if members and to_server:
            for member in members:
                shapes = _shapes(member)
                assert shapes == global_shapes or all(s == () for s in shapes), (uri, member)
                uploads.append(shapes)
    assert global_shapes in uploads
    # No SERVER-placed value is shaped like a user's embedding.
    for placement, node in _walk(pieces.process.next.type_signature):
        if placement == tff.SERVER and isinstance(node, tff.TensorType):
            assert tuple(node.shape) not in local_shapes


def test_registry_lines_and_refusals():
    for name, mode, rho in (('fedlesam', 'global_change', 0.1), ('fedgloss', 'server', 0.15)):
        method = methods.get_method(name)
        assert method.refused(methods.TRAINING_SETTINGS) == ['update', 'sharpness_probe',
                                                             'workers', 'lr_scale']
        work = run_settings.settings('filmtrust', algorithm=name, preset='paper').client_work()
        assert (work.global_perturbation, work.rho_sh, work.rho_ns, work.update) == (
            mode, rho, 0.0, 'model_delta')
        with pytest.raises(SettingError):
            run_settings.settings('filmtrust', algorithm=name, rho_ns=0.1)
        with pytest.raises(ValueError, match=f'{name} does not take workers'):
            run_settings.settings('filmtrust', algorithm=name, workers='localhost:1')
    assert run_settings.settings('filmtrust', algorithm='fedsam').client_work(
    ).global_perturbation == 'local'
    with pytest.raises(ValueError, match='NeuMF only'):
        fedrecgel.build_fedrecgel_process(
            lambda: None, work=ClientWorkConfig(update='model_delta',
                                                global_perturbation='server'))


def test_server_state_round_trip_keeps_the_distributor_state(tmp_path):
    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=30, num_items=60, mean_interactions=8, seed=0), num_negatives=20)
    settings = run_settings.settings('synthetic', algorithm='fedgloss', preset='paper',
                                     total_rounds=3)
    simulation = settings.build_simulation(split)
    simulation.initialize()
    for _ in range(2):
        simulation.run_round()
    state = simulation.algorithm.get_state()
    assert state['server_state']._fields[-1] == 'distributor_state'
    manager = tff.program.FileProgramStateManager(str(tmp_path))
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(manager.save(state, 2))
        loaded, version = loop.run_until_complete(manager.load_latest(state))
    finally:
        loop.close()
    assert version == 2
    # The same round from the live state and from the loaded one.
    rng = np.random.default_rng(0)
    users = list(range(6))
    batches = [(rng.integers(0, split.num_items, 9).astype(np.int32),
                 (rng.random(9) < 0.5).astype(np.float32)) for _ in users]
    algorithm = simulation.algorithm
    algorithm.next(users, batches)
    continued = algorithm.global_weights
    algorithm.restore(loaded)
    for got, want in zip(algorithm.server_state.distributor_state,
                         state['server_state'].distributor_state):
        np.testing.assert_array_equal(got, want)
    assert np.any(np.asarray(algorithm.server_state.distributor_state[0]) != 0)
    algorithm.next(users, batches)
    for a, b in zip(algorithm.global_weights, continued):
        np.testing.assert_array_equal(a, b)


def test_the_peers_plan_runs_both_under_their_authors_settings():
    from tff_fedrecgel.launch import peers_study  # pylint: disable=g-import-not-at-top

    runs = peers_study.peers_plan(datasets=['filmtrust'], methods=['fedlesam', 'fedgloss'],
                                  seeds=1)
    assert [r.name for r in runs] == ['filmtrust/history_seed0', 'filmtrust/itempop_seed0',
                                      'filmtrust/peer_fedgloss_seed0',
                                      'filmtrust/peer_fedlesam_seed0']
    flags = runs[3].flags('/data')
    assert '--algorithm=fedlesam' in flags and '--local_epochs=5' in flags
    assert '--server_optimizer=sgd' in runs[2].flags('/data')
    for run in runs[2:]:  # The settings are ones the method takes.
        extra = dict(f[2:].split('=') for f in run.extra)
        run_settings.settings('filmtrust', algorithm=run.method,
                              rho_sh=float(extra.pop('rho_sh')),
                              **{k: (v if k == 'server_optimizer' else float(v)
                                     if '.' in v else int(v)) for k, v in extra.items()})
