"""Statistics of the real datasets (skipped when they are not available).

The datasets are read from ``$FEDRECGEL_DATASETS`` (default:
``<repo>/../shared/datasets``); they are never copied into the repository.
"""

import functools
import os
import time

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel.data import client_data

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.environ.get(
    'FEDRECGEL_DATASETS', os.path.join(os.path.dirname(_REPO), 'shared',
                                       'datasets'))

# users, items, interactions, train rows (docs/ALGORITHM.md, "The data protocol").
EXPECTED = {
    'filmtrust': (1227, 2059, 34889, 33662),
    'lastfm_2k': (1600, 12454, 185650, 184050),
    'amazon_video': (8072, 11830, 63836, 55764),
}


def _data_dir(name):
    task = tasks.get_task(name)
    path = os.path.join(DATASETS, name)
    if not os.path.isfile(os.path.join(path, task.raw_file)):
        pytest.skip(f'{name}: {task.raw_file} not found under {path} '
                    '(set FEDRECGEL_DATASETS to the shared datasets folder)')
    return path


@functools.lru_cache(maxsize=None)
def _split(name, validation=False):
    return tasks.get_task(name).load_split(data_dir=_data_dir(name),
                                           validation=validation)


def _reference_test_items(raw):
    """The protocol written the way a pandas notebook would, for comparison.

    Ties follow docs/ALGORITHM.md ("The tie rule"): items numbered by
    first appearance in the raw file, rows sorted stably by that number.
    """
    raw = raw.assign(first=pd.factorize(raw['item'])[0])
    counts = raw.groupby('user')['user'].transform('count')
    kept = raw[counts >= 5].sort_values('first', kind='stable')
    kept['u'] = kept['user'].map(
        {v: k for k, v in enumerate(sorted(kept['user'].unique()))})
    kept['i'] = kept['item'].map(
        {v: k for k, v in enumerate(sorted(kept['item'].unique()))})
    kept['rank'] = kept.groupby('u')['timestamp'].rank(method='first',
                                                       ascending=False)
    test = kept[kept['rank'] == 1].sort_values('u')
    return test['i'].to_numpy(), int((kept['rank'] > 1).sum())


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_statistics(name):
    split = _split(name)
    users, items, interactions, train = EXPECTED[name]
    assert split.summary() == {
        'users': users, 'items': items, 'interactions': interactions,
        'train_interactions': train, 'test_users': users, 'valid_users': 0}
    assert split.test_negatives.shape == (users, 99)


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_matches_an_independent_pandas_reference(name):
    task = tasks.get_task(name)
    raw = task.load_raw(_data_dir(name))
    expected_test, expected_train = _reference_test_items(raw)
    split = _split(name)
    np.testing.assert_array_equal(split.test_items, expected_test)
    assert split.num_train_interactions == expected_train


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_validation_statistics(name):
    split = _split(name, validation=True)
    users, _, interactions, _ = EXPECTED[name]
    stats = split.summary()
    assert stats['valid_users'] == users
    assert stats['train_interactions'] == interactions - 2 * users
    np.testing.assert_array_equal(split.test_items, _split(name).test_items)


def test_filmtrust_pseudo_timestamps_on_the_real_file():
    raw = tasks.get_task('filmtrust').load_raw(_data_dir('filmtrust'))
    base = np.random.default_rng(42).integers(0, 1_000_000_000, size=len(raw))
    occurrence = raw.groupby('user').cumcount().to_numpy()
    np.testing.assert_array_equal(raw['timestamp'],
                                  base * 1_000_000 + occurrence)
    # The split is reproducible run to run.
    again = tasks.get_task('filmtrust').load_split(
        data_dir=_data_dir('filmtrust'))
    assert again == _split('filmtrust')


def test_lastfm_test_artist_may_also_be_in_training():
    split = _split('lastfm_2k')
    train = client_data.FederatedTrainData.from_split(split)
    overlap = sum(bool(np.isin(split.test_items[u], train.positives(u)))
                  for u in range(split.num_users))
    assert overlap > 0  # The authors keep repeated user-artist rows.
    # 70,508 unique pairs in all; a test pair leaves training only when the
    # user has no other row with that artist.
    assert len(train.items) == 70508 - (split.num_users - overlap)


def test_amazon_video_item_count_is_fixed():
    assert tasks.get_task('amazon_video').num_items == 11830
    assert _split('amazon_video').num_items == 11830


def test_filmtrust_cohort_batches_are_fast():
    split = _split('filmtrust')
    train = client_data.FederatedTrainData.from_split(split)
    cohort = np.random.default_rng(0).choice(split.num_users, 122,
                                             replace=False)
    train.round_batches(cohort, seed=0, round_num=0)  # Warm-up.
    start = time.perf_counter()
    for round_num in range(10):
        batches = train.round_batches(cohort, seed=0, round_num=round_num)
    per_round = (time.perf_counter() - start) / 10
    assert len(batches) == 122
    assert per_round < 0.05, f'{per_round * 1000:.1f} ms per cohort'


def test_cached_split_files_round_trip(tmp_path):
    task = tasks.get_task('filmtrust')
    first = task.prepare(data_dir=_data_dir('filmtrust'), cache_dir=tmp_path,
                         write_csv=True)
    second = task.prepare(data_dir=_data_dir('filmtrust'), cache_dir=tmp_path)
    assert (first.cached, second.cached) == (False, True)
    assert first.split == second.split == _split('filmtrust')
    frame = pd.read_csv(tmp_path / 'train.csv')
    assert list(frame.columns) == ['user', 'item'] and len(frame) == 33662
