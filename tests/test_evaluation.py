"""Tests of the ranking evaluation (fast, federated and reconstruction paths)."""

import collections
import math
import os
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import tasks
from tff_fedrecgel import evaluation
from tff_fedrecgel import ranking
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.models import neumf

TINY = neumf.ModelConfig(num_items=50, gmf_dim=4, mlp_dim=6, mlp_layers=(8, 4))
TINY_GMF = neumf.ModelConfig(num_items=50, gmf_dim=5, mlp_layers=(), use_mlp=False)


def _global_weights(config, seed=0):
    return [v.numpy() for v in neumf.NeuMF(config, seed=seed).global_variables]


def _dims(config):
    return [config.gmf_dim] + ([config.mlp_dim] if config.use_mlp else [])


def _random_tables(config, num_users, rng, stddev=0.1):
    return [
        rng.normal(0.0, stddev, (num_users, d)).astype(np.float32)
        for d in _dims(config)
    ]


def _random_candidates(num_users, num_candidates, num_items, rng):
    return np.stack(
        [rng.choice(num_items, num_candidates, replace=False) for _ in range(num_users)]
    ).astype(np.int32)


def _assert_metrics_close(actual, expected, atol):
    assert list(actual) == list(expected)
    for key in expected:
        assert abs(float(actual[key]) - float(expected[key])) <= atol, key


# --- numpy reference ---------------------------------------------------------


def _np_logits(config, global_weights, tables, candidates):
    """NeuMF forward pass written directly in numpy (float64)."""
    weights = [np.asarray(w, np.float64) for w in global_weights]
    item_gmf = weights.pop(0)
    item_mlp = weights.pop(0) if config.use_mlp else None
    kernel, bias = weights[-2], weights[-1]
    user_gmf = np.asarray(tables[0], np.float64)[:, None, :]
    features = user_gmf * item_gmf[candidates]
    if config.use_mlp:
        user_mlp = np.asarray(tables[1], np.float64)[:, None, :]
        user_mlp = np.broadcast_to(user_mlp, candidates.shape + user_mlp.shape[-1:])
        hidden = np.concatenate([user_mlp, item_mlp[candidates]], axis=-1)
        for i in range(len(config.mlp_layers)):
            hidden = np.maximum(hidden @ weights[2 * i] + weights[2 * i + 1], 0.0)
        features = np.concatenate([features, hidden], axis=-1)
    return (features @ kernel + bias)[..., 0]


def _np_mean_metrics(scores, top_ks=ranking.TOP_KS):
    rank = np.sum(scores[:, 1:] >= scores[:, :1], axis=1)
    out = collections.OrderedDict()
    for k in top_ks:
        hit = rank < k
        out[f'hr@{k}'] = float(np.mean(hit))
        out[f'ndcg@{k}'] = float(np.mean(np.where(hit, 1.0 / np.log2(rank + 2), 0.0)))
    return out


# --- ranking_metrics ---------------------------------------------------------


def test_ranking_metrics_keys_in_order():
    metrics = ranking.ranking_metrics(tf.zeros([2, 3]))
    assert list(metrics) == [
        'hr@5', 'ndcg@5', 'hr@10', 'ndcg@10', 'hr@15', 'ndcg@15', 'hr@20', 'ndcg@20'
    ]
    for values in metrics.values():
        assert values.dtype == tf.float32 and values.shape == (2,)


def test_ranking_metrics_strict_winner():
    metrics = ranking.ranking_metrics(tf.constant([[5.0, 1.0, 2.0, 3.0]]))
    for key, values in metrics.items():
        assert values.numpy().tolist() == [1.0], key


def test_ranking_metrics_ties_count_against_held_out():
    # Held-out score 1.0 tied with one other: rank 1, not 0.
    metrics = ranking.ranking_metrics(
        tf.constant([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), top_ks=(1, 2, 3)
    )
    np.testing.assert_array_equal(metrics['hr@1'], [0.0, 0.0])
    np.testing.assert_array_equal(metrics['hr@2'], [1.0, 0.0])
    np.testing.assert_allclose(metrics['ndcg@2'], [1.0 / math.log2(3.0), 0.0])
    # All four tied: rank 3.
    np.testing.assert_allclose(metrics['ndcg@3'], [1.0 / math.log2(3.0), 0.0])
    assert ranking.ranking_metrics(
        tf.constant([[1.0, 1.0, 1.0, 1.0]]), top_ks=(4,)
    )['ndcg@4'].numpy()[0] == pytest.approx(1.0 / math.log2(5.0))


@pytest.mark.parametrize('k', [5, 10])
def test_ranking_metrics_rank_k_minus_one_vs_k(k):
    def scores_with_rank(rank):
        row = np.zeros(100, np.float32)
        row[0] = 0.5
        row[1 : 1 + rank] = 1.0  # `rank` candidates strictly above.
        return row

    metrics = ranking.ranking_metrics(
        tf.constant(np.stack([scores_with_rank(k - 1), scores_with_rank(k)])),
        top_ks=(k, k + 1),
    )
    np.testing.assert_array_equal(metrics[f'hr@{k}'], [1.0, 0.0])
    np.testing.assert_allclose(
        metrics[f'ndcg@{k}'], [1.0 / math.log2(k + 1), 0.0], rtol=1e-7
    )
    np.testing.assert_array_equal(metrics[f'hr@{k + 1}'], [1.0, 1.0])
    np.testing.assert_allclose(
        metrics[f'ndcg@{k + 1}'],
        [1.0 / math.log2(k + 1), 1.0 / math.log2(k + 2)],
        rtol=1e-7,
    )


def test_ranking_metrics_ndcg_values():
    # Ranks 0..4 by construction: candidates above the held-out item.
    scores = np.tile(np.arange(5, 0, -1, dtype=np.float32), (5, 1))
    scores[:, 0] = np.array([4.5, 3.5, 2.5, 1.5, 0.5])
    metrics = ranking.ranking_metrics(tf.constant(scores), top_ks=(5,))
    np.testing.assert_allclose(
        metrics['ndcg@5'], [1.0 / math.log2(r + 2) for r in range(5)], rtol=1e-7
    )
    np.testing.assert_array_equal(metrics['hr@5'], np.ones(5))


def test_ranking_metrics_nan_held_out_ranks_last():
    metrics = ranking.ranking_metrics(
        tf.constant([[np.nan, 0.0, 1.0], [2.0, np.nan, 1.0]]), top_ks=(1, 2)
    )
    np.testing.assert_array_equal(metrics['hr@2'], [0.0, 1.0])
    np.testing.assert_array_equal(metrics['hr@1'], [0.0, 1.0])


def test_ranking_metrics_rejects_bad_input():
    with pytest.raises(ValueError):
        ranking.ranking_metrics(tf.zeros([3]))
    with pytest.raises(ValueError):
        ranking.ranking_metrics(tf.zeros([2, 3]), top_ks=(0,))
    with pytest.raises(ValueError):
        ranking.ranking_metrics(tf.zeros([2, 3]), top_ks=())


# --- evaluate_users ----------------------------------------------------------


@pytest.mark.parametrize('config', [TINY, TINY_GMF], ids=['neumf', 'gmf'])
@pytest.mark.parametrize('batch_size', [5, 64])
def test_evaluate_users_matches_numpy(config, batch_size):
    rng = np.random.default_rng(1)
    num_users = 23  # Not a multiple of 5.
    global_weights = [
        rng.normal(0.0, 0.5, w.shape).astype(np.float32)
        for w in _global_weights(config)
    ]
    tables = _random_tables(config, num_users, rng, stddev=0.5)
    candidates = _random_candidates(num_users, 20, config.num_items, rng)
    actual = evaluation.evaluate_users(
        config, global_weights, tables, candidates, batch_size=batch_size
    )
    expected = _np_mean_metrics(_np_logits(config, global_weights, tables, candidates))
    _assert_metrics_close(actual, expected, atol=1e-6)
    assert all(isinstance(v, float) for v in actual.values())


def test_evaluate_users_traces_once():
    config = neumf.ModelConfig(num_items=30, gmf_dim=3, mlp_dim=2, mlp_layers=(4,))
    rng = np.random.default_rng(2)
    weights = _global_weights(config)
    for num_users, batch_size in [(7, 3), (10, 4), (2, 8)]:
        evaluation.evaluate_users(
            config,
            weights,
            _random_tables(config, num_users, rng),
            _random_candidates(num_users, 10, config.num_items, rng),
            batch_size=batch_size,
        )
    scorer = evaluation.sampled._batch_scorer(config, ranking.TOP_KS)
    assert scorer.experimental_get_tracing_count() == 1


def test_evaluate_users_rejects_mismatched_shapes():
    rng = np.random.default_rng(3)
    weights = _global_weights(TINY)
    candidates = _random_candidates(4, 10, TINY.num_items, rng)
    with pytest.raises(ValueError, match='table shape'):
        evaluation.evaluate_users(
            TINY, weights, _random_tables(TINY, 5, rng), candidates
        )
    with pytest.raises(ValueError, match='global_weights'):
        evaluation.evaluate_users(
            TINY, weights[:-1], _random_tables(TINY, 4, rng), candidates
        )


# --- federated evaluation ----------------------------------------------------


def _client_local_weights(tables):
    return [[t[u : u + 1] for t in tables] for u in range(tables[0].shape[0])]


def test_federated_evaluation_matches_fast_path_synthetic():
    rng = np.random.default_rng(4)
    num_users = 9
    weights = _global_weights(TINY)
    tables = _random_tables(TINY, num_users, rng)
    candidates = _random_candidates(num_users, 15, TINY.num_items, rng)
    federated = evaluation.build_federated_evaluation(TINY)
    actual = federated(weights, _client_local_weights(tables), list(candidates))
    expected = evaluation.evaluate_users(TINY, weights, tables, candidates)
    _assert_metrics_close(actual, expected, atol=1e-6)


def _filmtrust_dir(datasets_dir):
    task = tasks.get_task('filmtrust')
    path = os.path.join(datasets_dir, 'filmtrust')
    if not os.path.isfile(os.path.join(path, task.raw_file)):
        pytest.skip(
            f'filmtrust: {task.raw_file} not found under {path} '
            '(set FEDRECGEL_DATASETS to the shared datasets folder)'
        )
    return path


def test_federated_evaluation_matches_fast_path_filmtrust(datasets_dir):
    split = tasks.get_task('filmtrust').load_split(
        data_dir=_filmtrust_dir(datasets_dir)
    )
    config = neumf.ModelConfig(num_items=split.num_items)
    weights = _global_weights(config, seed=0)
    rng = np.random.default_rng(0)
    tables = _random_tables(config, split.num_users, rng)
    candidates = split.candidates('test')
    assert candidates.shape == (1227, 100)

    start = time.perf_counter()
    expected = evaluation.evaluate_users(config, weights, tables, candidates)
    fast_seconds = time.perf_counter() - start
    federated = evaluation.build_federated_evaluation(config)
    start = time.perf_counter()
    actual = federated(weights, _client_local_weights(tables), list(candidates))
    federated_seconds = time.perf_counter() - start
    print(
        f'filmtrust, {split.num_users} users: evaluate_users {fast_seconds:.2f}s '
        f'(incl. trace), federated {federated_seconds:.2f}s'
    )
    _assert_metrics_close(actual, expected, atol=1e-6)


# --- reconstruction ----------------------------------------------------------


def _reconstruct_one(config, work, global_weights, items, labels):
    """One user's reconstruction, eagerly, as the client work does it."""
    model = neumf.NeuMF(config)
    for var, value in zip(model.global_variables, global_weights):
        var.assign(value)
    local_vars = model.local_variables
    for var in local_vars:
        var.assign(tf.zeros_like(var))
    adam = tff.learning.optimizers.build_adam(
        learning_rate=work.local_lr, epsilon=1e-8
    )
    state = tf.nest.map_structure(
        tf.convert_to_tensor,
        adam.initialize(neumf.local_weight_specs(config)),
    )
    n = len(items)
    if work.loss_reduction == 'mean':
        weights = np.full(n, 1.0 / max(n, 1), np.float32)
    else:
        weights = np.concatenate([np.zeros(0)] + [
            np.full(min(work.chunk_size, n - s), 1.0 / min(work.chunk_size, n - s))
            for s in range(0, n, work.chunk_size)]).astype(np.float32)
    for _ in range(work.reconstruction_steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=model(items)))
        grads = tape.gradient(loss, local_vars)
        state, new_local = adam.next(
            state,
            [v.read_value() for v in local_vars],
            [tf.reshape(g, v.shape) for g, v in zip(grads, local_vars)],
        )
        for var, value in zip(local_vars, new_local):
            var.assign(value)
    return [v.numpy()[0] for v in local_vars]


def _synthetic_batches(num_items, lengths, rng):
    return [
        (
            rng.integers(0, num_items, n).astype(np.int32),
            (rng.random(n) < 0.25).astype(np.float32),
        )
        for n in lengths
    ]


@pytest.mark.parametrize(
    'work',
    [
        client_update.ClientWorkConfig(
            local_state='reconstruct', chunk_size=4, reconstruction_steps=3
        ),
        client_update.ClientWorkConfig(
            local_state='reconstruct', loss_reduction='mean', local_lr=0.05
        ),
    ],
    ids=['chunk_sum', 'mean'],
)
def test_reconstruct_local_tables_matches_per_user(work):
    rng = np.random.default_rng(5)
    weights = _global_weights(TINY, seed=1)
    batches = _synthetic_batches(TINY.num_items, [10, 3, 17, 0, 10, 5, 25], rng)
    # A small budget forces several padded groups.
    tables = evaluation.reconstruct_local_tables(
        TINY, work, weights, batches, max_batch_examples=30
    )
    assert [t.shape for t in tables] == [(7, TINY.gmf_dim), (7, TINY.mlp_dim)]
    for u, (items, labels) in enumerate(batches):
        expected = _reconstruct_one(TINY, work, weights, items, labels)
        for table, row in zip(tables, expected):
            np.testing.assert_allclose(table[u], row, atol=1e-5, err_msg=f'user {u}')
    # The empty user has zero gradients, so it stays at zero.
    assert all(not np.any(t[3]) for t in tables)


def test_federated_reconstruction_evaluation_matches_batched():
    rng = np.random.default_rng(6)
    work = client_update.ClientWorkConfig(local_state='reconstruct', chunk_size=8)
    weights = _global_weights(TINY, seed=2)
    batches = _synthetic_batches(TINY.num_items, [15, 5, 30, 10, 20, 25], rng)
    candidates = _random_candidates(len(batches), 20, TINY.num_items, rng)
    tables = evaluation.reconstruct_local_tables(TINY, work, weights, batches)
    expected = evaluation.evaluate_users(TINY, weights, tables, candidates)
    federated = evaluation.build_federated_reconstruction_evaluation(TINY, work)
    data = [
        collections.OrderedDict(items=items, labels=labels, candidates=c)
        for (items, labels), c in zip(batches, candidates)
    ]
    actual = federated(weights, data)
    _assert_metrics_close(actual, expected, atol=1e-6)
