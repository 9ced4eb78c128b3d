"""Tests of the synthetic generator."""

import time

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.errors import DataError


@pytest.fixture(scope='module')
def default_data():
    start = time.perf_counter()
    frame, truth = synthetic.generate_synthetic_with_truth()
    seconds = time.perf_counter() - start
    return frame, truth, seconds


def _hit_rate_at_10(split, frame, scores_fn):
    # Every user survives the filter, so split indices are the sorted raw ids.
    user_ids = np.unique(frame['user'].to_numpy())
    item_ids = np.unique(frame['item'].to_numpy())
    candidates = item_ids[split.candidates()]
    scores = scores_fn(user_ids[:, None], candidates)
    # Ties count against the held-out item (it is ranked after them).
    rank = (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    return float(np.mean(rank < 10))


def test_schema_and_default_sizes(default_data):
    frame, _, seconds = default_data
    assert list(frame.columns) == ['user', 'item', 'timestamp']
    assert frame['timestamp'].dtype == np.int64
    assert frame['user'].nunique() == 500
    assert frame['item'].max() < 400
    assert 15 <= len(frame) / 500 <= 25
    assert seconds < 5


def test_deterministic_given_the_seed():
    a = synthetic.generate_synthetic(seed=3, num_users=50, num_items=120)
    b = synthetic.generate_synthetic(seed=3, num_users=50, num_items=120)
    c = synthetic.generate_synthetic(seed=4, num_users=50, num_items=120)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_config_object_and_overrides():
    config = synthetic.SyntheticConfig(num_users=40, num_items=100, seed=1)
    a = synthetic.generate_synthetic(config)
    b = synthetic.generate_synthetic(config, num_users=30)
    assert a['user'].nunique() == 40 and b['user'].nunique() == 30


def test_users_are_heterogeneous_and_all_survive_filtering(default_data):
    frame, _, _ = default_data
    counts = frame.groupby('user').size()
    assert counts.min() >= 5
    assert counts.max() >= 4 * counts.median()  # Heavy-tailed activity.
    assert not frame.duplicated(['user', 'item']).any()


def test_item_popularity_is_long_tailed(default_data):
    frame, _, _ = default_data
    popularity = frame['item'].value_counts().to_numpy()
    top_tenth = popularity[:len(popularity) // 10].sum() / popularity.sum()
    assert top_tenth > 0.2  # A uniform catalogue would give about 0.1.


def test_timestamps_increase_within_each_user(default_data):
    frame, _, _ = default_data
    assert frame['timestamp'].is_monotonic_increasing  # Rows form a log.
    per_user = frame.groupby('user')['timestamp'].apply(
        lambda t: bool(np.all(np.diff(t.to_numpy()) > 0)))
    assert per_user.all()


def test_latent_structure_is_learnable(default_data):
    frame, truth, _ = default_data
    split = preprocess.build_split(frame)
    assert split.num_users == 500
    oracle = _hit_rate_at_10(split, frame, truth.logits)
    popularity = _hit_rate_at_10(
        split, frame, lambda u, i: np.broadcast_to(
            truth.item_log_popularity[i], i.shape))
    assert oracle > 0.5  # Random ranking gives 0.10.
    assert oracle > popularity + 0.2


def test_bad_parameters():
    with pytest.raises(DataError, match='num_users'):
        synthetic.generate_synthetic(num_users=0)
    with pytest.raises(DataError, match='num_items'):
        synthetic.generate_synthetic(num_items=3)
    with pytest.raises(DataError, match='unexpected keyword|got an'):
        synthetic.generate_synthetic(colour='blue')
