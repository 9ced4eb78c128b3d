"""The original user and item ids: kept by preprocessing, written and read back."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import split_io
from tff_fedrecgel.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.environ.get(
    'FEDRECGEL_DATASETS', os.path.join(os.path.dirname(REPO), 'shared', 'datasets'))


def _frame(users, items, timestamps):
    return pd.DataFrame({'user': users, 'item': items, 'timestamp': timestamps})


def _string_frame(seed=0, num_users=12, num_items=300):
    """Ids with commas, quotes, spaces, non-ASCII text and a number-like id."""
    rng = np.random.default_rng(seed)
    user_names = [f'user "{u}", Zoë' for u in range(num_users - 1)] + ['0042']
    item_names = [f'item,{i}' for i in range(num_items - 1)] + ['NA']
    rows = []
    for u, name in enumerate(user_names):
        for k, i in enumerate(rng.choice(num_items, 5 + u % 4, replace=False)):
            rows.append((name, item_names[i], k))
    # Two users with 120 items of their own: everyone has 99 items to rank against.
    rows += [(f'filler {f}', f'item,{num_items + 120 * f + k}', k)
             for f in range(2) for k in range(120)]
    order = rng.permutation(len(rows))
    users, items, times = zip(*[rows[j] for j in order])
    return _frame(np.array(users, dtype=object), np.array(items, dtype=object),
                  np.array(times, dtype=np.int64))


def _int_frame(seed=0, num_users=15, num_items=400):
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 12, size=num_users)  # Some users are dropped.
    users = np.repeat(np.arange(num_users) * 11 + 5, counts)
    items = rng.integers(0, num_items, size=len(users)) * 3 + 7
    # Two users with 120 items of their own: everyone has 99 items to rank against.
    users = np.concatenate([users, np.repeat([10_000, 10_001], 120)])
    items = np.concatenate([items, 10_000 + np.arange(240)])
    return _frame(users, items, rng.permutation(len(users)))


def _check_maps_explain_the_split(raw, split):
    """Every index maps back to the raw rows it came from."""
    kept = preprocess.filter_users(raw)
    raw_pairs = set(zip(kept['user'], kept['item']))
    train_pairs = set(zip(split.user_ids[split.train_users],
                          split.item_ids[split.train_items]))
    assert train_pairs <= raw_pairs
    latest = kept.loc[kept.groupby('user')['timestamp'].idxmax()]
    for user, item, timestamp in latest.itertuples(index=False):
        index = int(np.flatnonzero(split.user_ids == user)[0])
        held_out_item = split.item_ids[split.test_items[index]]
        # Timestamps in these frames are distinct within a user.
        assert (user, held_out_item) in raw_pairs
        assert kept[(kept['user'] == user) & (kept['item'] == held_out_item)][
            'timestamp'].max() == timestamp
    assert sorted(split.user_ids.tolist()) == split.user_ids.tolist()
    assert set(split.user_ids.tolist()) == set(kept['user'])
    assert set(split.item_ids.tolist()) == set(kept['item'])


def test_integer_ids_are_kept():
    raw = _int_frame()
    split = preprocess.build_split(raw)
    assert split.user_ids.dtype == np.int64 and split.item_ids.dtype == np.int64
    assert len(split.user_ids) == split.num_users
    assert len(split.item_ids) == split.num_items
    _check_maps_explain_the_split(raw, split)


def test_string_ids_are_kept():
    raw = _string_frame()
    split = preprocess.build_split(raw)
    assert split.user_ids.dtype == object and split.item_ids.dtype == object
    assert '0042' in split.user_ids.tolist()  # Not turned into a number.
    _check_maps_explain_the_split(raw, split)


def test_fixed_item_count_leaves_unseen_indices_without_id():
    raw = _int_frame()
    natural = preprocess.build_split(raw).num_items
    split = preprocess.build_split(raw, num_items=natural + 25)
    assert split.num_items == natural + 25 and len(split.item_ids) == natural


@pytest.mark.parametrize('make_frame', [_int_frame, _string_frame])
@pytest.mark.parametrize('validation', [False, True])
def test_split_files_round_trip_the_maps(tmp_path, make_frame, validation):
    split = preprocess.build_split(make_frame(), validation=validation)
    split_io.write_split(split, tmp_path)
    back, meta = split_io.read_split(tmp_path)
    assert back == split
    assert back.user_ids.dtype == split.user_ids.dtype
    assert back.item_ids.tolist() == split.item_ids.tolist()
    users = pd.read_csv(tmp_path / 'users.csv', dtype=str, keep_default_na=False)
    assert list(users.columns) == ['user', 'original_id']
    assert users['original_id'].tolist() == [str(v) for v in split.user_ids]
    assert set(meta['files']) >= {'users.csv', 'items.csv'}


def test_split_without_maps_writes_none(tmp_path):
    split = preprocess.build_split(_int_frame())
    bare = preprocess.Split(**{**split.__dict__, 'user_ids': None,
                               'item_ids': None})
    split_io.write_split(split, tmp_path)
    split_io.write_split(bare, tmp_path)  # Stale map files go.
    assert not (tmp_path / 'users.csv').exists()
    back, _ = split_io.read_split(tmp_path)
    assert back.user_ids is None and back.item_ids is None and back == bare


@pytest.mark.parametrize('damage', ['edit', 'delete'])
def test_damaged_map_files_are_refused_and_recomputed(tmp_path, damage):
    raw = _string_frame()
    split = preprocess.build_split(raw)
    calls = []

    def compute():
        calls.append(1)
        return preprocess.build_split(raw)

    split_io.load_or_compute(tmp_path, key={'k': 1}, compute=compute)
    items = tmp_path / 'items.csv'
    if damage == 'edit':
        items.write_text(items.read_text().replace('item,', 'item;', 2))
    else:
        items.unlink()
    with pytest.raises(DataError):
        split_io.read_split(tmp_path)
    again, cached = split_io.load_or_compute(tmp_path, key={'k': 1},
                                             compute=compute)
    assert not cached and len(calls) == 2 and again == split


def test_a_cache_of_the_previous_format_is_recomputed(tmp_path):
    raw = _int_frame()
    split_io.write_split(preprocess.build_split(raw), tmp_path, key={'k': 1})
    meta = json.loads((tmp_path / 'meta.json').read_text())
    meta['format_version'] = 1  # Written before the maps existed.
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    split, cached = split_io.load_or_compute(
        tmp_path, key={'k': 1}, compute=lambda: preprocess.build_split(raw))
    assert not cached and split.user_ids is not None


def test_split_rejects_maps_of_the_wrong_size():
    split = preprocess.build_split(_int_frame())
    with pytest.raises(DataError, match='user_ids'):
        preprocess.Split(**{**split.__dict__, 'user_ids': split.user_ids[1:]})
    with pytest.raises(DataError, match='item_ids'):
        preprocess.Split(**{**split.__dict__, 'item_ids': np.zeros(
            split.num_items + 1, np.int64)})
    with pytest.raises(DataError, match='user_ids'):
        preprocess.Split(**{**split.__dict__,
                            'user_ids': split.user_ids.astype(np.float64)})


def test_prepare_data_writes_the_maps(tmp_path):
    rows = ['uid\tiid\tts'] + [f'u{u}\tI-{u * 120 + k}\t{k}'
                               for u in range(8) for k in range(6)]
    # Two users with 120 items each, so everyone has 99 items to rank against.
    rows += [f'f{f}\tF-{f}-{k}\t{k}' for f in range(2) for k in range(120)]
    data = tmp_path / 'log.tsv'
    data.write_text('\n'.join(rows) + '\n')
    out = tmp_path / 'out'
    result = subprocess.run(
        [sys.executable, os.path.join('launch', 'prepare_data.py'),
         '--task=csv', f'--data_dir={data}', '--csv_sep=tab',
         '--csv_user_col=uid', '--csv_item_col=iid', '--csv_timestamp_col=ts',
         f'--output_dir={out}'],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    users = pd.read_csv(out / 'users.csv', dtype=str)
    assert users['original_id'].tolist() == sorted(
        [f'u{u}' for u in range(8)] + ['f0', 'f1'])
    split, _ = split_io.read_split(out)
    # The held-out item of u3 is its latest row, I-365.
    u3 = split.user_ids.tolist().index('u3')
    assert split.item_ids[split.test_items[u3]] == 'I-365'


def _real(name):
    task = tasks.get_task(name)
    path = os.path.join(DATASETS, name)
    if not os.path.isfile(os.path.join(path, task.raw_file)):
        pytest.skip(f'{name}: {task.raw_file} not found under {path}')
    return task, path


def test_filmtrust_maps_are_the_raw_ids(tmp_path):
    task, path = _real('filmtrust')
    prepared = task.prepare(data_dir=path, cache_dir=tmp_path)
    split = prepared.split
    raw = pd.read_csv(os.path.join(path, task.raw_file), sep=r'\s+', header=None,
                      names=['user', 'item', 'rating'])
    counts = raw.groupby('user').size()
    assert split.user_ids.tolist() == sorted(counts[counts >= 5].index)
    assert len(split.item_ids) == split.num_items == 2059
    pairs = set(zip(raw['user'], raw['item']))
    assert set(zip(split.user_ids[split.train_users],
                   split.item_ids[split.train_items])) <= pairs
    again = task.prepare(data_dir=path, cache_dir=tmp_path)
    assert again.cached and again.split == split


def test_amazon_video_items_past_the_data_have_no_id():
    task, path = _real('amazon_video')
    split = task.load_split(data_dir=path)
    assert split.num_items == 11830
    assert 0 < len(split.item_ids) <= 11830
    assert split.item_ids.dtype == object and split.user_ids.dtype == object
