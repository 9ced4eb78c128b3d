"""Tests of the client work (docs/ALGORITHM.md, steps 3-8), run eagerly.

The references below re-derive the client's SAM step by hand from a fresh
NeuMF, `tf.GradientTape` and dense perturbations; they use neither the
project's SAM optimizer nor its loss weighting.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf

CONFIG = neumf.ModelConfig(
    num_items=20, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
EPSILON = 1e-12
CHUNK = 16


def _random_weights(seed):
    """Global weights and a client state that give clear gradients."""
    rng = np.random.default_rng(seed)
    model = neumf.NeuMF(CONFIG, seed=seed)
    global_weights = [
        (v.numpy() + rng.normal(scale=0.3, size=v.shape)).astype(np.float32)
        for v in model.global_variables]
    local = [rng.normal(scale=0.3, size=v.shape).astype(np.float32)
             for v in model.local_variables]
    state = collections.OrderedDict(
        local_weights=local,
        adam_step=np.int32(3),
        adam_m=[rng.normal(scale=0.01, size=w.shape).astype(np.float32)
                for w in local],
        adam_v=[rng.uniform(1e-5, 1e-4, size=w.shape).astype(np.float32)
                for w in local],
    )
    return global_weights, state


def _batch(seed, n=40, nan=False):
    rng = np.random.default_rng(seed)
    items = rng.integers(0, CONFIG.num_items, size=n).astype(np.int32)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    if nan:
        labels[5] = np.nan
    return collections.OrderedDict(items=items, labels=labels)


def _loss_weights(n, reduction, chunk):
    if reduction == 'mean':
        return np.full(n, 1.0 / n, np.float32)
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    return np.concatenate([np.full(s, 1.0 / s) for s in sizes]).astype(
        np.float32)


class _Reference:
    """A fresh NeuMF evaluated at given weights with a GradientTape."""

    def __init__(self):
        self.model = neumf.NeuMF(CONFIG)

    def grads(self, global_weights, local_weights, items, labels, weights):
        model = self.model
        for var, value in zip(model.global_variables, global_weights):
            var.assign(value)
        for var, value in zip(model.local_variables, local_weights):
            var.assign(value)
        with tf.GradientTape() as tape:
            losses = tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=model(items))
            loss = tf.reduce_sum(losses * weights)
        grads = tape.gradient(
            loss, model.global_variables + model.local_variables)
        dense = [tf.reshape(tf.convert_to_tensor(g), v.shape).numpy()
                 for g, v in zip(grads, model.global_variables +
                                 model.local_variables)]
        split = len(model.global_variables)
        return float(loss.numpy()), dense[:split], dense[split:]

    def sam(self, global_weights, local_weights, items, labels, weights,
            rho_sh, rho_ns):
        """Steps 4-6 (docs/ALGORITHM.md) with dense perturbations."""
        loss, g_sh, g_ns = self.grads(
            global_weights, local_weights, items, labels, weights)

        def perturb(weights_, grads_, rho):
            norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64))
                               for g in grads_))
            return [(w + rho * g / (norm + EPSILON)).astype(np.float32)
                    for w, g in zip(weights_, grads_)]

        loss_sh, sam_sh, _ = self.grads(
            perturb(global_weights, g_sh, rho_sh), local_weights, items,
            labels, weights)
        loss_ns, _, sam_ns = self.grads(
            global_weights, perturb(local_weights, g_ns, rho_ns), items,
            labels, weights)
        return dict(loss=loss, plain_sh=g_sh, plain_ns=g_ns, sam_sh=sam_sh,
                    sam_ns=sam_ns, loss_sh=loss_sh, loss_ns=loss_ns)


def _tff_adam_step(state, local_weights, grads, lr=0.1, fresh=False):
    adam = tff.learning.optimizers.build_adam(lr, epsilon=1e-8)
    specs = [tf.TensorSpec(w.shape, tf.float32) for w in local_weights]
    adam_state = adam.initialize(specs)
    if not fresh:
        adam_state['step'] = int(state['adam_step'])
        adam_state['accumulator'] = [tf.constant(m) for m in state['adam_m']]
        adam_state['preconditioner'] = [
            tf.constant(v) for v in state['adam_v']]
    new_state, new_weights = adam.next(
        adam_state, [tf.constant(w) for w in local_weights],
        [tf.constant(g) for g in grads])
    return new_state, [w.numpy() for w in new_weights]


def _numpy(structure):
    structure = tf.nest.map_structure(lambda t: np.asarray(t), structure)
    if isinstance(structure, dict) and 'client_state' in structure:
        structure['client_state'] = structure['client_state']._asdict()
    return structure


def _example_weights(n, **kwargs):
    """One user's weights: a group of one, unpadded."""
    return local_training.example_weights(
        tf.reshape(n, [1]), n, **kwargs)[0]


def _assert_all_close(actual, expected, atol=1e-6):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol)


def _run(work, global_weights, state, data):
    fn = client_update.build_client_update(CONFIG, work, single_user=True).fn
    return _numpy(fn(global_weights, state, data))


# ----------------------------------------------------------------------------
# example_weights
# ----------------------------------------------------------------------------


def test_example_weights_chunk_sum():
    """chunk_sum weighs each example by 1 / len(its chunk)."""
    weights = _example_weights(
        300, loss_reduction='chunk_sum', chunk_size=128).numpy()
    expected = np.concatenate([np.full(128, 1 / 128), np.full(128, 1 / 128),
                               np.full(44, 1 / 44)])
    np.testing.assert_allclose(weights, expected, rtol=1e-7)
    assert weights.sum() == pytest.approx(3.0, rel=1e-6)
    exact = _example_weights(
        256, loss_reduction='chunk_sum', chunk_size=128).numpy()
    np.testing.assert_allclose(exact, np.full(256, 1 / 128), rtol=1e-7)
    small = _example_weights(
        5, loss_reduction='chunk_sum', chunk_size=128).numpy()
    np.testing.assert_allclose(small, np.full(5, 1 / 5), rtol=1e-7)


def test_example_weights_mean_and_graph_mode():
    """mean gives 1/n; chunk_sum also works with a dynamic n in a graph."""
    mean = _example_weights(
        300, loss_reduction='mean', chunk_size=128).numpy()
    np.testing.assert_allclose(mean, np.full(300, 1 / 300), rtol=1e-7)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def weights_of(n):
        return _example_weights(
            n, loss_reduction='chunk_sum', chunk_size=128)

    for n in (1, 128, 129, 300):
        np.testing.assert_allclose(weights_of(tf.constant(n)).numpy(),
                                   _loss_weights(n, 'chunk_sum', 128),
                                   rtol=1e-7)


# ----------------------------------------------------------------------------
# Gradient mode (the authors' algorithm).
# ----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def reference():
    return _Reference()


def test_sam_client_update_matches_reference(reference):
    """Upload = global SAM gradient; local = one Adam step on local SAM."""
    work = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.2,
                                        chunk_size=CHUNK)
    global_weights, state = _random_weights(0)
    data = _batch(0)
    out = _run(work, global_weights, state, data)
    ref = reference.sam(global_weights, state['local_weights'], data['items'],
                        data['labels'],
                        _loss_weights(40, 'chunk_sum', CHUNK), 0.05, 0.2)
    _assert_all_close(out['update'], ref['sam_sh'])
    for sam_grad, plain in zip(ref['sam_sh'], ref['plain_sh']):
        assert sam_grad.shape == plain.shape
    assert max(np.abs(s - p).max()
               for s, p in zip(ref['sam_sh'], ref['plain_sh'])) > 1e-4
    adam_state, expected_local = _tff_adam_step(
        state, state['local_weights'], ref['sam_ns'])
    new_state = out['client_state']
    _assert_all_close(new_state['local_weights'], expected_local)
    assert int(new_state['adam_step']) == 4
    _assert_all_close(new_state['adam_m'], adam_state['accumulator'])
    _assert_all_close(new_state['adam_v'], adam_state['preconditioner'])
    assert out['weight'] == 1.0 and out['dropped'] == 0
    metrics = out['metrics']
    assert metrics['loss'] == pytest.approx(ref['loss'], rel=1e-5)
    assert metrics['sam_loss_global'] == pytest.approx(ref['loss_sh'],
                                                       rel=1e-5)
    assert metrics['sam_loss_local'] == pytest.approx(ref['loss_ns'], rel=1e-5)
    assert metrics['num_examples'] == 40


def test_zero_radii_give_plain_gradient(reference):
    """rho_sh = rho_ns = 0 uploads the plain gradient of one tape pass."""
    work = client_update.ClientWorkConfig(chunk_size=CHUNK)
    global_weights, state = _random_weights(1)
    data = _batch(1)
    out = _run(work, global_weights, state, data)
    loss, g_sh, g_ns = reference.grads(
        global_weights, state['local_weights'], data['items'], data['labels'],
        _loss_weights(40, 'chunk_sum', CHUNK))
    _assert_all_close(out['update'], g_sh)
    _, expected_local = _tff_adam_step(state, state['local_weights'], g_ns)
    _assert_all_close(out['client_state']['local_weights'], expected_local)
    assert out['metrics']['loss'] == pytest.approx(loss, rel=1e-6)
    assert out['metrics']['sam_loss_global'] == out['metrics']['loss']


def test_mean_and_chunk_sum_reductions(reference):
    """chunk_sum's loss is the sum of chunk means, mean's the plain mean."""
    global_weights, state = _random_weights(2)
    data = _batch(2)
    outs = {
        reduction: _run(
            client_update.ClientWorkConfig(loss_reduction=reduction,
                                         chunk_size=CHUNK),
            global_weights, state, data)
        for reduction in ('chunk_sum', 'mean')
    }
    model = reference.model
    for var, value in zip(model.global_variables, global_weights):
        var.assign(value)
    for var, value in zip(model.local_variables, state['local_weights']):
        var.assign(value)
    bce = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=data['labels'], logits=model(data['items'])).numpy()
    chunk_means = [bce[s:s + CHUNK].mean() for s in range(0, 40, CHUNK)]
    assert len(chunk_means) == 3
    assert outs['chunk_sum']['metrics']['loss'] == pytest.approx(
        sum(chunk_means), rel=1e-5)
    assert outs['mean']['metrics']['loss'] == pytest.approx(bce.mean(),
                                                            rel=1e-5)
    # The chunk of 8 weighs twice as much per example: not a rescaled mean.
    for reduction in ('chunk_sum', 'mean'):
        _, g_sh, _ = reference.grads(
            global_weights, state['local_weights'], data['items'],
            data['labels'], _loss_weights(40, reduction, CHUNK))
        _assert_all_close(outs[reduction]['update'], g_sh)
    ratio = outs['chunk_sum']['update'][-1] / outs['mean']['update'][-1]
    assert abs(float(ratio[0]) - 3.0) > 1e-3


def test_non_finite_client_is_dropped():
    """NaN labels: weight 0, dropped 1, zero update, state unchanged."""
    work = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.2)
    global_weights, state = _random_weights(3)
    out = _run(work, global_weights, state, _batch(3, nan=True))
    assert out['weight'] == 0.0
    assert out['dropped'] == 1
    for update in out['update']:
        assert np.all(update == 0.0)
    tf.nest.map_structure(np.testing.assert_array_equal, out['client_state'],
                          _numpy(state))
    for value in out['metrics'].values():
        assert np.isfinite(value)


# ----------------------------------------------------------------------------
# Other modes.
# ----------------------------------------------------------------------------


def test_model_delta_matches_reference_loop(reference):
    """model_delta: received minus weights after 2 epochs of SAM/SGD steps."""
    work = client_update.ClientWorkConfig(
        rho_sh=0.05, rho_ns=0.2, update='model_delta', local_epochs=2,
        chunk_size=CHUNK, client_lr=0.05, client_weighting='num_examples')
    global_weights, state = _random_weights(4)
    data = _batch(4)
    out = _run(work, global_weights, state, data)

    weights = [w.copy() for w in global_weights]
    local = [w.copy() for w in state['local_weights']]
    step_state = state
    losses, losses_sh, losses_ns = [], [], []
    for _ in range(2):
        for start in range(0, 40, CHUNK):
            chunk = slice(start, start + CHUNK)
            size = len(data['items'][chunk])
            ref = reference.sam(
                weights, local, data['items'][chunk], data['labels'][chunk],
                np.full(size, 1.0 / size, np.float32), 0.05, 0.2)
            losses.append(ref['loss'])
            losses_sh.append(ref['loss_sh'])
            losses_ns.append(ref['loss_ns'])
            weights = [w - 0.05 * g for w, g in zip(weights, ref['sam_sh'])]
            adam_state, local = _tff_adam_step(step_state, local,
                                               ref['sam_ns'])
            step_state = collections.OrderedDict(
                adam_step=adam_state['step'],
                adam_m=[a.numpy() for a in adam_state['accumulator']],
                adam_v=[p.numpy() for p in adam_state['preconditioner']])
    expected = [a - b for a, b in zip(global_weights, weights)]
    assert all(np.all(np.isfinite(u)) for u in out['update'])
    _assert_all_close(out['update'], expected, atol=1e-5)
    assert max(np.abs(u).max() for u in out['update']) > 1e-3
    _assert_all_close(out['client_state']['local_weights'], local, atol=1e-5)
    assert int(out['client_state']['adam_step']) == 3 + 6
    assert out['weight'] == 40.0 and out['dropped'] == 0
    metrics = out['metrics']
    assert metrics['loss'] == pytest.approx(np.mean(losses), rel=1e-5)
    assert metrics['sam_loss_global'] == pytest.approx(np.mean(losses_sh),
                                                       rel=1e-5)
    assert metrics['sam_loss_local'] == pytest.approx(np.mean(losses_ns),
                                                      rel=1e-5)
    assert metrics['sam_loss_global'] > metrics['loss']


def test_num_examples_weighting_in_gradient_mode():
    """'num_examples' weighting gives weight = batch length."""
    work = client_update.ClientWorkConfig(client_weighting='num_examples')
    global_weights, state = _random_weights(6)
    out = _run(work, global_weights, state, _batch(6, n=23))
    assert out['weight'] == 23.0
    assert out['metrics']['num_examples'] == 23.0


def test_reconstruct_mode_matches_reference_and_ignores_state(reference):
    """Reconstruct: rows from zeros by Adam steps, then the SAM upload."""
    work = client_update.ClientWorkConfig(
        rho_sh=0.05, rho_ns=0.2, local_state='reconstruct',
        reconstruction_steps=3, chunk_size=CHUNK)
    global_weights, state = _random_weights(7)
    data, other = _batch(7), _batch(8)
    fn = client_update.build_client_update(CONFIG, work, single_user=True).fn
    first = _numpy(fn(global_weights, None, data))
    _numpy(fn(global_weights, None, other))
    again = _numpy(fn(global_weights, state, data))
    assert 'client_state' not in first
    for a, b in zip(first['update'], again['update']):
        np.testing.assert_array_equal(a, b)
    assert first['metrics'] == again['metrics']

    weights = _loss_weights(40, 'chunk_sum', CHUNK)
    local = [np.zeros((1, CONFIG.gmf_dim), np.float32),
             np.zeros((1, CONFIG.mlp_dim), np.float32)]
    adam_state = None
    for _ in range(3):
        _, _, g_ns = reference.grads(global_weights, local, data['items'],
                                     data['labels'], weights)
        if adam_state is None:
            adam_state, local = _tff_adam_step(None, local, g_ns, fresh=True)
        else:
            adam_state, local = _tff_adam_step(
                collections.OrderedDict(
                    adam_step=adam_state['step'],
                    adam_m=[a.numpy() for a in adam_state['accumulator']],
                    adam_v=[p.numpy() for p in adam_state['preconditioner']]),
                local, g_ns)
    assert np.abs(local[0]).max() > 0.1  # Reconstruction moved the rows.
    ref = reference.sam(global_weights, local, data['items'], data['labels'],
                        weights, 0.05, 0.2)
    _assert_all_close(first['update'], ref['sam_sh'], atol=2e-6)
    assert first['metrics']['loss'] == pytest.approx(ref['loss'], rel=1e-5)


def test_invalid_config():
    """Unknown modes and negative radii are rejected."""
    with pytest.raises(ValueError):
        client_update.ClientWorkConfig(rho_sh=-0.1)
    with pytest.raises(ValueError):
        client_update.ClientWorkConfig(loss_reduction='sum')
    with pytest.raises(ValueError):
        client_update.ClientWorkConfig(update='delta')
    with pytest.raises(ValueError):
        client_update.ClientWorkConfig(local_state='reconstruct',
                                     reconstruction_steps=0)
