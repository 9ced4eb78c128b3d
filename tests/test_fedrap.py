"""FedRAP: the loss and its gradients against numpy, the curriculum, the
round and the adapter's D_u storage against a dense numpy reference, the
serving of a new user, what the server sees, and the registry."""

import collections
import dataclasses
import math
import types

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel.recommenders.fedrap import computation as fedrap
from tff_fedrecgel.data import preprocess
from tff_types import uploads as _uploads, walk as _walk  # pylint: disable=g-bad-import-order
from tff_fedrecgel.recommenders.fedrap import adapter as fedrap_adapter

NUM_ITEMS = 9
CONFIG = fedrap.FedRAPConfig(
    latent_dim=4, score_lr=0.3, item_lr=2.0, weight_decay=0.01, lam=0.2, mu=0.1,
    batch_size=3, local_epochs=4, tol=0.15, step_decay=0.5, curriculum="fixed")


def _np_loss(e_d, e_c, w, b, y, lam, mu):
    """One minibatch's loss, written out in float64."""
    p = 1 / (1 + np.exp(-((e_d + e_c) @ w + b)))
    bce = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    return bce - lam * np.mean((e_d - e_c) ** 2) + mu * np.mean(np.abs(e_c))


def test_loss_and_gradients_match_numpy():
    rng = np.random.default_rng(0)
    g, n, d = 2, 5, 3
    e_d, e_c = rng.normal(size=(2, g, n, d))
    w, b = rng.normal(size=(g, d)), rng.normal(size=g)
    y = (rng.random((g, n)) < 0.5).astype(np.float64)
    m = np.ones((g, n))
    m[1, 3:] = 0  # User 1 has a short minibatch.
    out = fedrap.batch_loss_grads(*[tf.constant(x, tf.float32) for x in (e_d, e_c, w, b, y, m)],
                                  0.3, 0.2)
    loss, g_d, g_c, g_w, g_b = [np.asarray(x, np.float64) for x in out]
    h = 1e-6
    for u in range(g):
        k = int(m[u].sum())
        args = [e_d[u, :k], e_c[u, :k], w[u], b[u], y[u, :k]]
        assert loss[u] == pytest.approx(_np_loss(*args, 0.3, 0.2), abs=1e-5)
        for which, grad in ((0, g_d), (1, g_c), (2, g_w)):
            x = args[which]
            for pos in np.ndindex(x.shape):
                up, down = [a.copy() for a in args], [a.copy() for a in args]
                up[which][pos] += h
                down[which][pos] -= h
                numeric = (_np_loss(*up, 0.3, 0.2) - _np_loss(*down, 0.3, 0.2)) / (2 * h)
                got = grad[u][pos]
                assert got == pytest.approx(numeric, abs=2e-4), (which, u, pos)
        up, down = list(args), list(args)
        up[3], down[3] = b[u] + h, b[u] - h
        numeric = (_np_loss(*up, 0.3, 0.2) - _np_loss(*down, 0.3, 0.2)) / (2 * h)
        assert g_b[u] == pytest.approx(numeric, abs=2e-4)
    assert np.all(g_d[1, 3:] == 0) and np.all(g_c[1, 3:] == 0)


def test_the_curriculum_grows_lam_and_mu_with_the_rounds():
    config = fedrap.DEFAULT_CONFIG
    assert config.weights(0) == (0.0, 0.0) and config.weights(1) == (0.0, 0.0)
    assert config.weights(2) == pytest.approx((math.tanh(0.1) * 0.1, math.tanh(0.1) * 0.1))
    assert config.weights(40)[0] == pytest.approx(0.1, rel=1e-3)
    assert all(config.weights(r)[0] < config.weights(r + 1)[0] for r in range(1, 30))
    fixed = dataclasses.replace(config, curriculum='fixed')
    assert fixed.weights(0) == (0.1, 0.1)
    for cfg in (config, fixed):
        for r in (0, 1, 3, 17):
            hyper = {k: float(v) for k, v in fedrap.round_hyper(cfg, r).items()}
            assert (hyper['lam'], hyper['mu']) == pytest.approx(cfg.weights(r), rel=1e-5)
            assert (hyper['score_lr'], hyper['item_lr']) == pytest.approx(
                cfg.learning_rates(r), rel=1e-5)
    assert config.learning_rates(2) == pytest.approx((0.5 * 0.97 ** 2, 200 * 0.97 ** 2))
    with pytest.raises(ValueError, match='curriculum'):
        fedrap.FedRAPConfig(curriculum='sin')


def _reference_user(c, dd, w, b, data, i, config, round_index):
    """User i's local round on dense float64 tables: (C_u, D_u, w, b,
    whether it stopped before its last epoch)."""
    score_lr, item_lr = config.learning_rates(round_index)
    lam, mu = config.weights(round_index)
    c, dd, w = c.astype(np.float64), dd.astype(np.float64), w.astype(np.float64)
    b, wd, d = float(b), config.weight_decay, config.latent_dim
    width, nb = int(data.width), int(data.epoch_batches[i])
    active, steps, total, count, done, last = True, 0, 0.0, 0.0, 0, 0.0
    for k in range(data.slots.shape[1] // width):
        cols = slice(k * width, (k + 1) * width)
        real = data.mask[i, cols] > 0
        if not active or not real.any():
            continue
        items = data.local_ids[i][data.slots[i, cols][real]]
        y, n = data.labels[i, cols][real].astype(np.float64), int(real.sum())
        e_d, e_c = dd[items], c[items]
        loss = _np_loss(e_d, e_c, w, b, y, lam, mu)
        g = (1 / (1 + np.exp(-((e_d + e_c) @ w + b))) - y) / n
        g_d, g_c = np.zeros_like(dd), np.zeros_like(c)
        np.add.at(g_d, items, g[:, None] * w - lam * 2 * (e_d - e_c) / (n * d))
        np.add.at(g_c, items, g[:, None] * w + lam * 2 * (e_d - e_c) / (n * d)
                  + mu * np.sign(e_c) / (n * d))
        lr_s, lr_i = score_lr * config.step_decay ** steps, item_lr * config.step_decay ** steps
        new_w = w - lr_s * (g @ (e_d + e_c) + wd * w)
        b = b - lr_s * (g.sum() + wd * b)
        dd, c, w = dd - lr_i * (g_d + wd * dd), c - lr_i * (g_c + wd * c), new_w
        steps, total, count = steps + 1, total + loss * n, count + n
        if (k + 1) % nb == 0:
            mean = total / count
            if done > 0 and abs(mean - last) < config.tol * abs(last):
                active = False
            last, done = mean, done + 1
    return c, dd, w, b, done < config.local_epochs


def _batches(rng, lengths):
    return [(rng.integers(0, NUM_ITEMS, n).astype(np.int32),
             (rng.random(n) < 0.4).astype(np.float32)) for n in lengths]


def _adapter(num_users=4, grouped=True):
    algorithm = fedrap_adapter.FedRAP(model_config=types.SimpleNamespace(num_items=NUM_ITEMS),
                                      num_users=num_users, seed=3, config=CONFIG,
                                      grouped=grouped)
    algorithm.initialize()
    return algorithm


@pytest.mark.parametrize('grouped', [True, False])
def test_rounds_and_the_stored_d_match_a_dense_reference(grouped):
    """Two rounds of three users (one skips round 1): the server's C, every
    user's score function and whole D_u, against dense numpy tables."""
    rng = np.random.default_rng(1)
    algorithm = _adapter(grouped=grouped)
    dense = {u: algorithm.d0.astype(np.float64) for u in range(4)}
    w = {u: algorithm.w[u].astype(np.float64) for u in range(4)}
    b = {u: float(algorithm.b[u]) for u in range(4)}
    stopped = 0
    for users, lengths in (([0, 2], [7, 4]), ([0, 1, 2], [5, 8, 2])):
        batches = _batches(rng, lengths)
        c = np.asarray(algorithm.global_weights[0], np.float64)
        r = algorithm.round_num
        clients = algorithm._client_data(users, batches, r + 1)  # pylint: disable=protected-access
        tables = []
        for group, data in clients:
            for i, pos in enumerate(group):
                u = users[pos]
                c_u, dense[u], w[u], b[u], early = _reference_user(c, dense[u], w[u], b[u], data,
                                                                   i, CONFIG, r)
                tables.append(c_u)
                stopped += early
        metrics = algorithm.next(users, batches)
        np.testing.assert_allclose(algorithm.global_weights[0], np.mean(tables, axis=0),
                                   atol=2e-5)
        for u in range(4):
            np.testing.assert_allclose(algorithm.dense_personal(u), dense[u], atol=2e-5)
            np.testing.assert_allclose(algorithm.w[u], w[u], atol=2e-5)
            assert algorithm.b[u] == pytest.approx(b[u], abs=2e-5)
        assert np.isfinite(metrics['loss'])
    # Storage is sparse: user 3 never trained, user 1 only on its own items.
    assert len(algorithm.resid.items[3]) == 0 and algorithm.scale[3] == 1.0
    assert 0 < len(algorithm.resid.items[1]) < NUM_ITEMS and algorithm.scale[1] < 1.0
    assert stopped  # The early stop is exercised.


def test_state_round_trips():
    rng = np.random.default_rng(2)
    algorithm = _adapter()
    algorithm.next([0, 1], _batches(rng, [6, 3]))
    again = _adapter()
    again.restore(algorithm.get_state())
    for u in range(4):
        np.testing.assert_array_equal(again.dense_personal(u), algorithm.dense_personal(u))
    np.testing.assert_array_equal(again.score_items([0, 1, 3], None),
                                  algorithm.score_items([0, 1, 3], None))


def test_a_new_user_is_served_after_one_local_round_from_c():
    rng = np.random.default_rng(5)
    algorithm = _adapter()
    algorithm.next([0, 1], _batches(rng, [6, 5]))
    server = np.array(algorithm.global_weights[0])
    batches = _batches(rng, [7])
    scores = algorithm.score_items([3], batches)
    (_, data), = algorithm._pack(np.array([3]), batches, 0, [[0]])  # pylint: disable=protected-access
    _, dd, w, b, _ = _reference_user(server, algorithm.d0, algorithm._w0, algorithm._b0,  # pylint: disable=protected-access
                                     data, 0, CONFIG, algorithm.round_num)
    np.testing.assert_allclose(scores[0], (server + dd) @ w + b, atol=1e-4)
    np.testing.assert_array_equal(algorithm.global_weights[0], server)  # Nothing uploaded.
    assert len(algorithm.resid.items[3]) == 0
    trained = algorithm.score_items([0], None)[0]
    np.testing.assert_allclose(trained, (server + algorithm.dense_personal(0)) @ algorithm.w[0]
                               + algorithm.b[0], atol=1e-4)


def test_only_the_c_update_leaves_the_device():
    """Every SERVER-placed type is C or a scalar; users only sum C's update
    and scalars; D_u and the score function stay CLIENTS-placed."""
    process = fedrap.build_fedrap_process(num_items=NUM_ITEMS, config=CONFIG)
    table_shape = (NUM_ITEMS, CONFIG.latent_dim)
    server = [t for sig in (process.initialize.type_signature, process.next.type_signature)
              for p, t in _walk(sig) if p == tff.SERVER]
    assert server and all(tuple(t.shape) in (table_shape, ()) for t in server)
    result = process.next.type_signature.result
    assert result[1].placement == tff.CLIENTS
    flows = _uploads(process.next)
    assert {uri for uri, _ in flows} == {'federated_sum'}
    shapes = [tuple(t.shape) for _, members in flows for t in members]
    assert table_shape in shapes and set(shapes) <= {table_shape, ()}

    spec = tff.TensorType(np.float32, [1, 3, CONFIG.latent_dim])  # A user's D_u rows.

    @tff.federated_computation(tff.FederatedType(spec, tff.CLIENTS))
    def leaky(rows):
        return tff.federated_sum(rows)

    assert any(tuple(t.shape) != () for _, members in _uploads(leaky) for t in members)


def test_registry_and_refused_settings():
    method = methods.get_method('fedrap')
    assert method.takes == frozenset({'num_negatives', 'lr_scale'})
    assert method.tunable and not (method.private or method.exports)
    for name, value in (('local_lr', 0.2), ('local_epochs', 2), ('server_lr', 0.1)):
        with pytest.raises(ValueError, match=f'fedrap does not take {name}'):
            run_settings.settings('synthetic', algorithm='fedrap', **{name: value})
    from tff_fedrecgel.launch import peers_study  # pylint: disable=g-import-not-at-top
    runs = peers_study.peers_plan(datasets=['filmtrust'], methods=['fedrap'], seeds=1)
    assert [r.name for r in runs] == ['filmtrust/history_seed0', 'filmtrust/itempop_seed0',
                                      'filmtrust/peer_fedrap_seed0']
    assert '--client_fraction=1' in runs[2].flags('/data')


def test_fedrap_runs_through_the_driver():
    rng = np.random.default_rng(0)
    rows = [(u, int(i), t) for u in range(40)
            for t, i in enumerate(rng.choice(30, 8, replace=False))]
    split = preprocess.build_split(pd.DataFrame(rows, columns=['user', 'item', 'timestamp']),
                                   num_negatives=20)
    settings = run_settings.settings('synthetic', algorithm='fedrap', client_fraction=1.0,
                                     preset='paper', heldout_users=0.1, num_negatives=4)
    simulation = settings.build_simulation(split)
    simulation.initialize()
    for _ in range(2):
        metrics = simulation.run_round()
    assert np.isfinite(metrics['loss'])
    sampled = simulation.evaluate('test')
    full = simulation.evaluate('test', protocol='full')
    heldout = simulation.evaluate('test', heldout=True)
    assert 0 <= sampled['hr@10'] <= 1 and 0 <= full['mrr'] <= 1 and 0 <= heldout['hr@10'] <= 1
    again = settings.build_simulation(split)
    again.initialize()
    again.restore(simulation.get_state())
    assert again.evaluate('test') == sampled
