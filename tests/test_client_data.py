"""Tests of the per-client training data and round batches."""

import numpy as np
import pytest

from tff_fedrecgel.data import client_data
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.errors import DataError


def _split(train_users, train_items, num_users, num_items):
    train_users = np.asarray(train_users, dtype=np.int32)
    return preprocess.Split(
        num_users=num_users, num_items=num_items,
        num_interactions=len(train_users) + num_users,
        train_users=train_users,
        train_items=np.asarray(train_items, dtype=np.int32),
        test_items=np.zeros(num_users, dtype=np.int32),
        test_negatives=np.ones((num_users, 1), dtype=np.int32))


@pytest.fixture(scope='module')
def data():
    frame = synthetic.generate_synthetic(num_users=200, num_items=300, seed=2)
    split = preprocess.build_split(frame)
    return split, client_data.FederatedTrainData.from_split(split)


def test_unique_positives_in_first_occurrence_order():
    split = _split([1, 0, 1, 1, 0, 1], [5, 2, 3, 5, 2, 0], 3, 8)
    data = client_data.FederatedTrainData.from_split(split)
    assert data.positives(0).tolist() == [2]
    assert data.positives(1).tolist() == [5, 3, 0]
    assert data.positives(2).tolist() == []
    assert data.indptr.tolist() == [0, 1, 4, 4]
    assert data.sorted_items.tolist() == [2, 0, 3, 5]
    assert data.num_positives(1) == 3
    assert data.num_examples(1) == 15
    assert data.num_examples(1, num_negatives=2) == 9


def _check_batch(data, user, items, labels, k=4):
    positives = data.positives(user)
    assert items.dtype == np.int32 and labels.dtype == np.float32
    assert len(items) == len(labels) == data.num_examples(user, num_negatives=k)
    table = items.reshape(-1, 1 + k)
    np.testing.assert_array_equal(labels.reshape(-1, 1 + k),
                                  np.tile([1] + [0] * k, (len(table), 1)))
    # Every positive exactly once.
    assert sorted(table[:, 0].tolist()) == sorted(positives.tolist())
    negatives = table[:, 1:]
    assert not np.isin(negatives, positives).any()  # Never training items.
    assert np.all((negatives >= 0) & (negatives < data.num_items))
    for row in negatives:
        assert len(set(row.tolist())) == k  # Distinct within the group.


def test_round_batch_properties(data):
    split, train = data
    for user in range(split.num_users):
        items, labels = train.round_batch(user, seed=0, round_num=3)
        _check_batch(train, user, items, labels)


def test_round_batch_other_negative_counts(data):
    _, train = data
    for k in (0, 1, 9):
        items, labels = train.round_batch(5, seed=1, round_num=0,
                                          num_negatives=k)
        _check_batch(train, 5, items, labels, k=k)


def test_round_batch_is_deterministic_and_varies_by_round(data):
    _, train = data
    a = train.round_batch(7, seed=11, round_num=2)
    b = train.round_batch(7, seed=11, round_num=2)
    c = train.round_batch(7, seed=11, round_num=3)
    d = train.round_batch(7, seed=12, round_num=2)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    assert not np.array_equal(a[0], d[0])


def test_round_batch_matches_the_documented_generator(data):
    _, train = data
    user, k = 9, 4
    p = train.num_positives(user)
    draws = np.random.default_rng([5, 1, user]).random(p * (1 + k))
    items, _ = train.round_batch(user, seed=5, round_num=1)
    expected = train.positives(user)[np.argsort(draws[:p], kind='stable')]
    np.testing.assert_array_equal(items.reshape(-1, 1 + k)[:, 0], expected)


def test_cohort_order_and_composition_do_not_matter(data):
    _, train = data
    cohort = [3, 150, 42, 7]
    batches = train.round_batches(cohort, seed=1, round_num=4)
    shuffled = train.round_batches([42, 7, 99, 3, 150], seed=1, round_num=4)
    by_user = dict(zip([42, 7, 99, 3, 150], shuffled))
    for user, (items, labels) in zip(cohort, batches):
        np.testing.assert_array_equal(items, by_user[user][0])
        np.testing.assert_array_equal(labels, by_user[user][1])
        single = train.round_batch(user, seed=1, round_num=4)
        np.testing.assert_array_equal(items, single[0])
    assert train.round_batches([], seed=1, round_num=4) == []


def test_negatives_are_uniform_over_non_training_items():
    split = _split([0, 0, 0], [0, 1, 2], 1, 10)
    data = client_data.FederatedTrainData.from_split(split)
    counts = np.zeros(10)
    rounds = 3000
    for r in range(rounds):
        items, _ = data.round_batch(0, seed=0, round_num=r, num_negatives=3)
        negatives = items.reshape(-1, 4)[:, 1:]
        np.add.at(counts, negatives.ravel(), 1)
    assert counts[:3].sum() == 0
    expected = rounds * 3 * 3 / 7  # 3 positives x 3 negatives over 7 items.
    assert np.all(np.abs(counts[3:] - expected) < 0.06 * expected)


def test_all_non_training_items_can_be_needed():
    # Exactly num_negatives candidates: each group is all of them.
    split = _split([0, 0], [1, 3], 1, 6)
    data = client_data.FederatedTrainData.from_split(split)
    items, _ = data.round_batch(0, seed=0, round_num=0)
    for row in items.reshape(-1, 5)[:, 1:]:
        assert sorted(row.tolist()) == [0, 2, 4, 5]


def test_too_few_non_training_items():
    split = _split([0, 0, 0], [0, 1, 2], 1, 6)
    data = client_data.FederatedTrainData.from_split(split)
    with pytest.raises(DataError, match='fewer than num_negatives'):
        data.round_batch(0, seed=0, round_num=0)


def test_bad_user(data):
    _, train = data
    with pytest.raises(DataError, match='out of range'):
        train.round_batch(10_000, seed=0, round_num=0)
