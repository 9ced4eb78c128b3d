"""Tests of the full-ranking evaluation (fast and federated paths)."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrecgel import evaluation
from tff_fedrecgel import ranking
from tff_fedrecgel import full_ranking
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.models import neumf

TINY = neumf.ModelConfig(num_items=50, gmf_dim=4, mlp_dim=6, mlp_layers=(8, 4))
TINY_GMF = neumf.ModelConfig(num_items=50, gmf_dim=5, mlp_layers=(), use_mlp=False)


def _dims(config):
    return [config.gmf_dim] + ([config.mlp_dim] if config.use_mlp else [])


def _eighths(values):
    return (np.round(values * 8) / 8).astype(np.float32)


def _problem(config, num_users=23, seed=0):
    """Random weights and data with deliberate ties and awkward cases.

    Items 40-44 duplicate items 0-4 (same rows in every item table), so their
    scores tie exactly: every weight is a small multiple of 1/8, so every
    product and sum is exact in float32, whatever order a CPU's kernels add
    in (with arbitrary floats, equal rows at different positions of a
    matmul can round differently on some processors). Held-out items are drawn from 0-9 so that many users
    have a tied duplicate; user 0 has its target among its training items,
    user 1 has no training items, user 2 trains on every item but its target
    and one other.
    """
    rng = np.random.default_rng(seed)
    weights = [
        _eighths(rng.normal(0.0, 0.5, v.shape))
        for v in neumf.NeuMF(config, seed=seed).global_variables
    ]
    tables_per_item = 2 if config.use_mlp else 1
    for table in weights[:tables_per_item]:
        table[40:45] = table[0:5]
    tables = [
        _eighths(rng.normal(0.0, 0.5, (num_users, d)))
        for d in _dims(config)
    ]
    heldout = rng.integers(0, 10, num_users).astype(np.int32)
    train = [rng.choice(config.num_items, rng.integers(1, 12), replace=False)
             for _ in range(num_users)]
    train[0] = np.append(train[0], [heldout[0], heldout[0]])  # repeats too
    train[1] = np.zeros(0, np.int64)
    others = np.setdiff1d(np.arange(config.num_items), [heldout[2]])
    train[2] = np.delete(others, 7)
    indptr = np.concatenate([[0], np.cumsum([len(t) for t in train])])
    return weights, tables, heldout, (indptr, np.concatenate(train).astype(np.int32))


def _np_scores(config, weights, tables):
    """NeuMF logits of every (user, item), written directly in numpy (float64)."""
    weights = [np.asarray(w, np.float64) for w in weights]
    item_gmf = weights.pop(0)
    item_mlp = weights.pop(0) if config.use_mlp else None
    kernel, bias = weights[-2], weights[-1]
    num_users, num_items = tables[0].shape[0], item_gmf.shape[0]
    user_gmf = np.asarray(tables[0], np.float64)
    features = user_gmf[:, None, :] * item_gmf[None, :, :]
    if config.use_mlp:
        user_mlp = np.asarray(tables[1], np.float64)
        hidden = np.concatenate([
            np.broadcast_to(user_mlp[:, None, :],
                            (num_users, num_items, user_mlp.shape[1])),
            np.broadcast_to(item_mlp[None, :, :], (num_users,) + item_mlp.shape),
        ], axis=-1)
        for i in range(len(config.mlp_layers)):
            hidden = np.maximum(hidden @ weights[2 * i] + weights[2 * i + 1], 0.0)
        features = np.concatenate([features, hidden], axis=-1)
    return (features @ kernel + bias)[..., 0]


def _np_ranks(scores, heldout, train_csr):
    """Brute force: count the candidates at least as high as the target."""
    indptr, items = train_csr
    scores = np.where(np.isnan(scores), -np.inf, scores)
    ranks = []
    for u, target in enumerate(heldout):
        candidate = np.ones(scores.shape[1], bool)
        candidate[items[indptr[u]:indptr[u + 1]]] = False
        candidate[target] = False
        ranks.append(int(np.sum(scores[u, candidate] >= scores[u, target])))
    return np.array(ranks)


def _np_mean_metrics(ranks, top_ks=ranking.TOP_KS):
    out = {}
    for k in top_ks:
        hit = ranks < k
        out[f'hr@{k}'] = np.mean(hit)
        out[f'ndcg@{k}'] = np.mean(np.where(hit, 1.0 / np.log2(ranks + 2.0), 0.0))
    out['mrr'] = np.mean(1.0 / (ranks + 1.0))
    return out


def _assert_metrics_close(actual, expected, atol):
    assert list(actual) == list(expected)
    for key in expected:
        assert abs(float(actual[key]) - float(expected[key])) <= atol, key


# --- metrics_from_ranks ------------------------------------------------------


def test_metric_names_in_order():
    assert full_ranking.metric_names() == [
        'hr@5', 'ndcg@5', 'hr@10', 'ndcg@10', 'hr@15', 'ndcg@15', 'hr@20',
        'ndcg@20', 'mrr']
    # The sampled protocol's keys are the same without MRR.
    assert ranking.metric_names((10, 5)) == list(
        ranking.ranking_metrics(tf.zeros([1, 3]), top_ks=(5, 10)))


def test_metrics_from_ranks_values():
    ranks = np.array([0, 1, 4, 5, 9, 10, 1000])
    metrics = ranking.metrics_from_ranks(ranks, top_ks=(5, 10), mrr=True)
    assert list(metrics) == ['hr@5', 'ndcg@5', 'hr@10', 'ndcg@10', 'mrr']
    np.testing.assert_array_equal(metrics['hr@5'], [1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(metrics['hr@10'], [1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(
        metrics['ndcg@10'],
        [1.0, 1 / math.log2(3), 1 / math.log2(6), 1 / math.log2(7),
         1 / math.log2(11), 0.0, 0.0], rtol=1e-7)
    np.testing.assert_allclose(metrics['mrr'], 1.0 / (ranks + 1.0), rtol=1e-7)
    for values in metrics.values():
        assert values.dtype == tf.float32


def test_metrics_from_ranks_equal_sampled_ranking_metrics():
    # The sampled protocol's metrics are this function of its ranks, bit for bit.
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 6, (200, 100)).astype(np.float32)  # many ties
    scores[::7, 0] = np.nan
    sampled = ranking.ranking_metrics(tf.constant(scores))
    clean = np.where(np.isnan(scores), -np.inf, scores)
    ranks = np.sum(clean[:, 1:] >= clean[:, :1], axis=1)
    from_ranks = ranking.metrics_from_ranks(ranks, mrr=False)
    assert list(from_ranks) == list(sampled)
    for key in sampled:
        np.testing.assert_array_equal(from_ranks[key], sampled[key])


def test_metrics_from_ranks_rejects_bad_input():
    with pytest.raises(ValueError):
        ranking.metrics_from_ranks(np.array([0.0, 1.0]), mrr=True)
    with pytest.raises(ValueError):
        ranking.metrics_from_ranks(np.zeros([2, 2], np.int32), mrr=True)
    with pytest.raises(ValueError):
        ranking.metrics_from_ranks(np.zeros([2], np.int32), mrr=True, top_ks=(0,))


def test_scoring_flops_counts_factored_multiply_adds():
    config = neumf.ModelConfig(num_items=11830)
    per_pair = 128 * 64 + 64 * 32 + (32 + 32)
    per_side = 128 * 128
    assert full_ranking.scoring_flops(config, 8072) == 2 * (
        8072 * 11830 * per_pair + (8072 + 11830) * per_side)
    assert full_ranking.scoring_flops(TINY_GMF, 3) == 2 * 3 * 50 * 5


# --- the fast path against the brute-force reference -------------------------


@pytest.mark.parametrize('config', [TINY, TINY_GMF], ids=['neumf', 'gmf'])
@pytest.mark.parametrize('users_per_call,item_block,users_per_step',
                         [(5, 16, 1), (5, 16, 3), (64, 50, 32), (1, 7, 4), (64, 256, 32)])
def test_full_ranks_match_brute_force(config, users_per_call, item_block, users_per_step):
    weights, tables, heldout, csr = _problem(config)
    ranks = full_ranking.full_ranks(
        config, weights, tables, heldout, csr, users_per_call=users_per_call,
        item_block=item_block, users_per_step=users_per_step)
    expected = _np_ranks(_np_scores(config, weights, tables), heldout, csr)
    np.testing.assert_array_equal(ranks, expected)
    # The constructed cases are present: exact ties, the target in training,
    # a user with almost no candidates.
    scores = _np_scores(config, weights, tables)
    assert np.sum(heldout < 5) > 0 and np.all(
        scores[:, 40:45] == scores[:, 0:5])
    assert expected[2] <= 1


# Arbitrary floats (not eighths): the sums round, so the order matters.
SMALL = neumf.ModelConfig(num_items=1003, gmf_dim=16, mlp_dim=32, mlp_layers=(64, 32, 16))
SMALL_GMF = neumf.ModelConfig(num_items=1003, gmf_dim=16, mlp_layers=(), use_mlp=False)


def _products_are_row_exact() -> bool:
    """Whether this CPU's XLA matrix products give a row the same bits
    whatever the row count (true of the AVX-512 machine measured in
    docs/PERFORMANCE.md, "Scoring"; not of an AVX2 one)."""
    rng = np.random.default_rng(0)
    rows, kernel = (rng.normal(size=s).astype(np.float32) for s in ((1003, 64), (64, 32)))
    product = tf.function(tf.matmul, jit_compile=True)
    whole = product(rows, kernel).numpy()
    return all(np.array_equal(product(rows[:m], kernel).numpy(), whole[:m])
               for m in (1, 2, 3, 7, 37, 63))


@pytest.mark.parametrize('config', [SMALL, SMALL_GMF], ids=['neumf', 'gmf'])
def test_scores_do_not_depend_on_who_is_scored_together_nor_the_block(config):
    """Bit for bit where the CPU's products are row-exact; elsewhere to
    float rounding (a product's row sums in an order set by its row count)."""
    rng = np.random.default_rng(3)
    weights = [rng.normal(0.0, 0.3, v.shape).astype(np.float32)
               for v in neumf.NeuMF(config, seed=0).global_variables]
    tables = [rng.normal(0.0, 0.3, (12, d)).astype(np.float32) for d in _dims(config)]
    side = full_ranking._item_sider(config)(neumf.global_tensors(config, weights))

    def scores(users, block):
        score = full_ranking._scorer(config, block, users)
        return np.concatenate([score(side, [tf.constant(t[s:s + users]) for t in tables]).numpy()
                               for s in range(0, 12, users)])

    alone = scores(1, full_ranking.DEVICE_ITEM_BLOCK)
    assert len(np.unique(alone)) > 0.9 * alone.size  # Not a degenerate case.
    exact = _products_are_row_exact()
    for users, block in [(1, 64), (3, 100), (4, full_ranking.DEFAULT_ITEM_BLOCK), (12, 37),
                         (full_ranking.DEFAULT_USERS_PER_STEP // 8, 1003)]:
        grouped = scores(users, block)
        np.testing.assert_allclose(grouped, alone, rtol=1e-5, atol=1e-5,
                                   err_msg=f'{users} x {block}')
        if exact:
            np.testing.assert_array_equal(grouped, alone, err_msg=f'{users} x {block}')


def test_ties_count_against_the_target():
    weights, tables, heldout, csr = _problem(TINY)
    # Make every item a copy of item 0: all candidates tie with the target.
    for table in weights[:2]:
        table[:] = table[0]
    ranks = full_ranking.full_ranks(
        TINY, weights, tables, heldout, csr, users_per_call=8, item_block=16)
    indptr, items = csr
    for u in range(len(heldout)):
        train = set(items[indptr[u]:indptr[u + 1]].tolist()) - {heldout[u]}
        assert ranks[u] == TINY.num_items - 1 - len(train)


def test_training_items_are_excluded_but_not_the_target():
    weights, tables, heldout, _ = _problem(TINY)
    scores = _np_scores(TINY, weights, tables)
    order = np.argsort(-scores[0])
    # User 0's target is its 10th best item; train on the 9 above it and on
    # the target itself: rank 0.
    heldout = heldout.copy()
    heldout[0] = order[9]
    indptr = np.array([0, 10] + [10] * (len(heldout) - 1))
    items = order[:10].astype(np.int32)
    ranks = full_ranking.full_ranks(
        TINY, weights, tables, heldout, (indptr, items),
        users_per_call=4, item_block=16)
    assert ranks[0] == 0
    np.testing.assert_array_equal(
        ranks, _np_ranks(scores, heldout, (indptr, items)))


def test_nan_scores_rank_below_everything():
    weights, tables, heldout, csr = _problem(TINY)
    weights[0][45:48] = np.nan  # three items score NaN for every user
    heldout = heldout.copy()
    heldout[3] = 46  # user 3's target is NaN: every candidate beats it
    tables[0][4] = np.nan  # user 4: every score NaN, all tie
    ranks = full_ranking.full_ranks(
        TINY, weights, tables, heldout, csr, users_per_call=8, item_block=16)
    expected = _np_ranks(_np_scores(TINY, weights, tables), heldout, csr)
    np.testing.assert_array_equal(ranks, expected)
    indptr, items = csr
    for u in (3, 4):
        train = set(items[indptr[u]:indptr[u + 1]].tolist()) - {heldout[u]}
        assert ranks[u] == TINY.num_items - 1 - len(train)
    # For the other users the NaN items are never counted.
    assert not np.isnan(_np_scores(TINY, weights, tables)[5, 0])


@pytest.mark.parametrize('config', [TINY, TINY_GMF], ids=['neumf', 'gmf'])
def test_evaluate_full_matches_brute_force_metrics(config):
    weights, tables, heldout, csr = _problem(config, num_users=31, seed=4)
    actual = full_ranking.evaluate_full(
        config, weights, tables, heldout, csr, users_per_call=8, item_block=20)
    ranks = _np_ranks(_np_scores(config, weights, tables), heldout, csr)
    _assert_metrics_close(actual, _np_mean_metrics(ranks), atol=1e-7)
    assert all(isinstance(v, float) for v in actual.values())


def test_evaluate_full_traces_once():
    config = neumf.ModelConfig(num_items=50, gmf_dim=3, mlp_dim=2, mlp_layers=(4,))
    for num_users, per_call in [(7, 3), (10, 4), (3, 8)]:
        weights, tables, heldout, csr = _problem(config, num_users=num_users)
        full_ranking.evaluate_full(
            config, weights, tables, heldout, csr, users_per_call=per_call,
            item_block=8)
    step = full_ranking.DEFAULT_USERS_PER_STEP
    ranker = full_ranking._block_ranker(config, 8, step)
    assert ranker.experimental_get_tracing_count() == 1
    assert full_ranking._scorer(config, 8, step).experimental_get_tracing_count() == 1


def test_evaluate_full_rejects_bad_input():
    weights, tables, heldout, (indptr, items) = _problem(TINY, num_users=5)

    def run(**overrides):
        args = dict(model_config=TINY, global_weights=weights, local_tables=tables,
                    heldout_items=heldout, train_csr=(indptr, items))
        args.update(overrides)
        return full_ranking.evaluate_full(**args)

    for bad in [
        dict(heldout_items=np.append(heldout, 1)),
        dict(heldout_items=np.where(np.arange(5) == 0, 50, heldout)),
        dict(train_csr=(indptr[:-1], items)),
        dict(train_csr=(indptr, np.where(np.arange(len(items)) == 0, -1, items))),
        dict(local_tables=[tables[0][:4], tables[1][:4]]),
        dict(global_weights=weights[:-1]),
        dict(users_per_call=0),
        dict(users_per_step=0),
    ]:
        with pytest.raises(ValueError):
            run(**bad)


# --- the federated path ------------------------------------------------------


def _client_inputs(tables, heldout, csr):
    indptr, items = csr
    local = [[t[u:u + 1] for t in tables] for u in range(len(heldout))]
    data = [
        dict(heldout_item=np.int32(heldout[u]),
             train_items=np.asarray(items[indptr[u]:indptr[u + 1]], np.int32))
        for u in range(len(heldout))
    ]
    return local, data


@pytest.mark.parametrize('config', [TINY, TINY_GMF], ids=['neumf', 'gmf'])
def test_federated_equals_fast_path(config):
    weights, tables, heldout, csr = _problem(config, num_users=17, seed=5)
    tables[0][6] = np.nan  # a diverged user
    fast = full_ranking.evaluate_full(
        config, weights, tables, heldout, csr, users_per_call=6, item_block=16)
    evaluate = full_ranking.build_federated_full_evaluation(config, item_block=16)
    federated = evaluate(weights, *_client_inputs(tables, heldout, csr))
    _assert_metrics_close(federated, fast, atol=1e-6)
    ranks = _np_ranks(_np_scores(config, weights, tables), heldout, csr)
    _assert_metrics_close(federated, _np_mean_metrics(ranks), atol=1e-6)


def test_federated_type_signature():
    evaluate = full_ranking.build_federated_full_evaluation(TINY)
    signature = str(evaluate.type_signature)
    assert '@SERVER' in signature and '@CLIENTS' in signature
    assert 'heldout_item=int32,train_items=int32[?]' in signature
    assert signature.endswith(
        '-> <hr@5=float32,ndcg@5=float32,hr@10=float32,ndcg@10=float32,'
        'hr@15=float32,ndcg@15=float32,hr@20=float32,ndcg@20=float32,'
        'mrr=float32>@SERVER)')


# --- the benchmark ------------------------------------------------------------

BENCHMARK = pathlib.Path(__file__).resolve().parents[1] / 'launch' / 'benchmark.py'


def _run_benchmark(args, tmp_path):
    log_path = tmp_path / 'log.txt'
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, str(BENCHMARK), *args], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=BENCHMARK.parents[1], start_new_session=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
        try:
            proc.wait(timeout=300)
        finally:
            try:  # the process group, with any TFF worker
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode, log_path.read_text()


def test_benchmark_full_protocol_reports_rates(tmp_path):
    code, output = _run_benchmark(
        ['--task=synthetic', '--num_users=40', '--num_items=300',
         '--eval_protocol=full', '--warmup=1', '--rounds=1', '--matmul_size=64',
         '--matmul_reps=2', '--check_federated=12', '--users_per_step=4',
         '--item_block=64', '--compare_ranks'], tmp_path)
    assert code == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    assert result['users'] == 40 and result['items'] > 99
    # Four users per product against one: the same scores, the same ranks.
    assert result['max_rank_change_from_one_user_scoring'] == 0
    assert result['ranks_differing_from_one_user_scoring'] == 0
    for key in ('full_eval_seconds', 'full_gflops', 'matmul_gflops',
                'ratio_to_matmul', 'eval_peak_rss_mb'):
        assert result[key] > 0, key
    assert result['federated_users'] == 12
    assert result['federated_max_abs_diff'] <= 1e-6  # Ranks equal; means summed apart.
    assert list(result['full_metrics']) == full_ranking.metric_names()


def test_benchmark_rejects_bad_matmul_size(tmp_path):
    code, output = _run_benchmark(
        ['--task=synthetic', '--num_users=40', '--num_items=300',
         '--eval_protocol=full', '--matmul_size=0'], tmp_path)
    assert code == 2
    assert output.strip().splitlines()[-1].startswith('error: ')


def test_benchmark_times_the_state_round_trip(tmp_path):
    code, output = _run_benchmark(
        ['--task=synthetic', '--num_users=40', '--num_items=300', '--warmup=1',
         '--rounds=1', '--noeval', '--state_round_trip=2'], tmp_path)
    assert code == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    # The global weights alone are items x (GMF + MLP) floats.
    assert result['state_mb'] > 300 * (32 + 128) * 4 / 1e6
    assert result['state_round_trip_seconds'] > 0


@pytest.mark.parametrize('config', [TINY, TINY_GMF], ids=['neumf', 'gmf'])
def test_batched_scoring_matches_brute_force(config):
    weights, tables, heldout, csr = _problem(config, num_users=37, seed=6)
    full = protocols.get('full')
    ranks = _np_ranks(_np_scores(config, weights, tables), heldout, csr)
    for scoring in protocols.SCORINGS:
        actual = full.evaluate_model(config, weights, tables, (heldout, csr),
                                     scoring=scoring)
        _assert_metrics_close(actual, _np_mean_metrics(ranks), atol=1e-7)
    with pytest.raises(ValueError, match='scoring'):
        full.evaluate_model(config, weights, tables, (heldout, csr), scoring='fast')
