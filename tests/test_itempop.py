"""Tests of the federated popularity baseline."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrecgel import evaluation
from tff_fedrecgel.algorithms import itempop


def _clients(*lists):
    return [np.asarray(x, np.int32) for x in lists]


def test_counts_are_exact_and_accumulate_over_rounds():
    process = itempop.build_itempop_process(num_items=6)
    state = process.initialize()
    np.testing.assert_array_equal(state['counts'], np.zeros(6))
    state, metrics = process.next(state, _clients([0, 1, 1], [5], []))
    np.testing.assert_array_equal(state['counts'], [1, 2, 0, 0, 0, 1])
    assert metrics['clients'] == 3
    state, _ = process.next(state, _clients([1, 3], [3, 3, 0]))
    np.testing.assert_array_equal(state['counts'], [2, 3, 0, 3, 0, 1])
    assert state['round_num'] == 2


def test_state_and_upload_types():
    process = itempop.build_itempop_process(num_items=4)
    state_type = process.initialize.type_signature.result
    assert state_type.placement is tff.SERVER
    assert state_type.member.counts == tff.TensorType(np.float32, [4])
    items_type = process.next.type_signature.parameter[1]
    assert items_type.placement is tff.CLIENTS


def test_an_unweighted_dp_factory_plugs_in():
    # Noise 0 and a clip above every upload's norm: the DP mean is the mean.
    factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.0, clients_per_round=2, clip=100.0)
    process = itempop.build_itempop_process(num_items=3,
                                            model_aggregator=factory)
    state, _ = process.next(process.initialize(), _clients([0, 0, 2], [2]))
    np.testing.assert_allclose(state['counts'], [1.0, 0.0, 1.0], rtol=1e-6)


def test_weighted_factory_and_bad_sizes_are_refused():
    with pytest.raises(TypeError, match='unweighted'):
        itempop.build_itempop_process(num_items=3,
                                      model_aggregator=tff.aggregators.MeanFactory())
    with pytest.raises(ValueError, match='num_items'):
        itempop.build_itempop_process(num_items=0)


def _numpy_metrics(counts, candidates, k):
    scores = counts[candidates]
    # Ties count against the held-out item (column 0).
    rank = (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    hit = rank < k
    return hit.mean(), np.where(hit, 1.0 / np.log2(rank + 2.0), 0.0).mean()


def test_popularity_metrics_match_a_numpy_reference_with_ties():
    rng = np.random.default_rng(0)
    num_items, num_users = 40, 300
    counts = rng.integers(0, 5, size=num_items).astype(np.float32)  # Ties.
    candidates = np.stack([rng.choice(num_items, 12, replace=False)
                           for _ in range(num_users)])
    got = evaluation.evaluate_item_scores(counts, candidates, top_ks=(1, 5, 10))
    for k in (1, 5, 10):
        hr, ndcg = _numpy_metrics(counts.astype(np.float64), candidates, k)
        assert got[f'hr@{k}'] == pytest.approx(hr, abs=1e-6)
        assert got[f'ndcg@{k}'] == pytest.approx(ndcg, abs=1e-6)
    # All-equal scores: the held-out item ranks last, never a hit at k < 12.
    flat = evaluation.evaluate_item_scores(np.ones(num_items), candidates,
                                      top_ks=(10,))
    assert flat['hr@10'] == 0.0


def test_process_counts_rank_like_the_reference():
    # The process's counts of a small log equal np.bincount, so its ranking
    # metrics are those of the numpy popularity.
    rng = np.random.default_rng(1)
    num_items = 30
    users = [rng.integers(0, num_items, size=rng.integers(1, 8))
             for _ in range(20)]
    process = itempop.build_itempop_process(num_items=num_items)
    state, _ = process.next(process.initialize(), _clients(*users))
    expected = np.bincount(np.concatenate(users), minlength=num_items)
    np.testing.assert_array_equal(state['counts'], expected)
    candidates = np.stack([rng.choice(num_items, 10, replace=False)
                           for _ in range(50)])
    got = evaluation.evaluate_item_scores(state['counts'], candidates, top_ks=(5,))
    hr, ndcg = _numpy_metrics(expected.astype(np.float64), candidates, 5)
    assert got['hr@5'] == pytest.approx(hr)
    assert got['ndcg@5'] == pytest.approx(ndcg)


def test_popularity_metrics_reject_unknown_items():
    with pytest.raises(ValueError, match='outside'):
        evaluation.evaluate_item_scores(np.ones(3), np.array([[0, 3]]))
