"""The held-out negative sampler: one result whatever the threads and blocks."""

import numpy as np
import pytest

from tff_fedrecgel.data import negatives
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.errors import DataError


def _interactions(num_users=37, num_items=150, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(num_users), 5)
    items = rng.integers(0, num_items, size=len(users))
    return users, items


def _reference(users, items, num_users, num_items, k, seed):
    """The documented procedure, drawn in one piece."""
    keys = np.random.default_rng(seed).random((num_users, num_items))
    keys[users, items] = 2.0
    return np.argsort(keys, axis=1, kind='stable')[:, :k]


@pytest.mark.parametrize('workers', [1, 2, 3, 8])
@pytest.mark.parametrize('block_floats', [1, 150 * 4 + 7, 1 << 20])
def test_threads_and_blocks_do_not_change_the_negatives(workers, block_floats,
                                                        monkeypatch):
    # Threads even for tiny data, so that the jumped generators are used.
    monkeypatch.setattr(negatives, '_THREADED_MIN_KEYS', 0)
    users, items = _interactions()
    pairs = negatives.interacted_pairs(users, items, num_users=37, num_items=150)
    got = negatives.sample(pairs, num_negatives=20, seed=42, workers=workers,
                           block_floats=block_floats)
    np.testing.assert_array_equal(got, _reference(users, items, 37, 150, 20, 42))


def test_the_jumped_generator_continues_the_stream():
    whole = np.random.default_rng(7).random(1000)
    np.testing.assert_array_equal(negatives._generator_at(7, 613).random(387),
                                  whole[613:])


def test_sparse_true_positions_match_flatnonzero():
    mask = np.random.default_rng(1).random(8 * 500) < 0.03
    np.testing.assert_array_equal(negatives._true_positions(mask),
                                  np.flatnonzero(mask))


def test_pairs_count_distinct_items_per_user():
    pairs = negatives.interacted_pairs(np.array([0, 0, 0, 2]),
                                       np.array([3, 3, 1, 0]), num_users=3,
                                       num_items=10)
    np.testing.assert_array_equal(pairs.users, [0, 0, 2])
    np.testing.assert_array_equal(pairs.items, [1, 3, 0])
    np.testing.assert_array_equal(pairs.available, [8, 10, 9])


def test_too_few_candidates_is_refused_before_drawing():
    with pytest.raises(DataError, match='user index 1 has only 2'):
        preprocess.sample_heldout_negatives(
            np.array([1, 1]), np.array([0, 1]), num_users=2, num_items=4,
            num_negatives=3, seed=0, source='x')
