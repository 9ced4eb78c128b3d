"""Tests of the split protocol and of the split files/cache."""

import dataclasses
import json
import os

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel.data import loaders
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import split_io
from tff_fedrecgel.errors import DataError

def _frame(rows):
    return pd.DataFrame(rows, columns=['user', 'item', 'timestamp'])


def _fillers():
    # Two users with 120 disjoint items each, so that every user of a tiny
    # frame has at least the 99 never-interacted items the negatives need.
    return [(900 + f, 1000 * (f + 1) + i, i) for f in range(2)
            for i in range(120)]


def _random_frame(seed=0, num_users=30, num_items=1000):
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 15, size=num_users)  # Some users below 5.
    users = np.repeat(np.arange(num_users) * 7 + 3, counts)  # Sparse raw ids.
    items = rng.integers(0, num_items, size=len(users)) * 2 + 1
    timestamps = rng.integers(0, 6, size=len(users))  # Many ties.
    order = rng.permutation(len(users))
    return _frame({'user': users[order], 'item': items[order],
                   'timestamp': timestamps[order]})


def _build(frame, **kwargs):
    return preprocess.build_split(frame, **kwargs)


def test_filter_keeps_users_with_five_rows_and_all_their_items():
    rows = [(1, 10, t) for t in range(5)] + [(2, 20, t) for t in range(4)]
    rows += [(1, 11, 9), (3, 10, 1), (3, 12, 2), (3, 13, 3), (3, 14, 4),
             (3, 15, 5)] + _fillers()
    split = _build(_frame(rows))
    assert split.num_users == 4  # Users 1, 3 and the two fillers.
    # Item 20 belonged only to the dropped user; the others are all kept.
    assert split.num_items == 6 + 240
    assert split.num_interactions == 6 + 5 + 240


def test_reindex_uses_sorted_original_ids():
    codes, uniques = preprocess.reindex(np.array([10, 2, 33, 2]),
                                        source='x', what='user')
    assert codes.tolist() == [1, 0, 2, 0]
    assert uniques.tolist() == [2, 10, 33]
    codes, _ = preprocess.reindex(np.array(['b', 'a', 'c'], dtype=object),
                                  source='x', what='item')
    assert codes.tolist() == [1, 0, 2]


def test_reindex_rejects_mixed_types():
    with pytest.raises(DataError, match='mix types'):
        preprocess.reindex(np.array([1, 'a'], dtype=object), source='x',
                           what='user')


def _authors_ranks(frame):
    """The authors' tie rule written with pandas: index items by first
    appearance, sort each user's rows stably by it, then rank 'first'."""
    frame = frame.assign(first=pd.factorize(frame['item'])[0])
    ordered = frame.sort_values(['user', 'first'], kind='stable')
    ranks = ordered.groupby('user')['timestamp'].rank(method='first',
                                                      ascending=False)
    return ranks.reindex(frame.index).to_numpy()


def test_leave_one_out_ranks_follow_the_authors_tie_rule():
    frame = _random_frame()
    keys = preprocess.first_appearance_index(frame['item'].to_numpy())
    ranks = preprocess.leave_one_out_ranks(frame['user'].to_numpy(),
                                           frame['timestamp'].to_numpy(), keys)
    np.testing.assert_array_equal(ranks, _authors_ranks(frame))
    # The rule differs from plain row order on this frame (the test can fail).
    row_order = frame.groupby('user')['timestamp'].rank(method='first',
                                                        ascending=False)
    assert not np.array_equal(ranks, row_order.to_numpy())


def test_first_appearance_index():
    got = preprocess.first_appearance_index(np.array([7, 3, 7, 9, 3]))
    assert got.tolist() == [0, 1, 0, 2, 1]


def test_ties_go_to_the_first_occurrence():
    # User 0's latest timestamp (9) appears on items 3 (first) and 4.
    rows = [(0, 1, 1), (0, 3, 9), (0, 2, 5), (0, 4, 9), (0, 5, 2)]
    split = _build(_frame(rows + _fillers()), validation=True)
    assert split.test_items[0] == 2  # Original item 3 (ids 1..5 -> 0..4).
    assert split.valid_items[0] == 3  # The tied second occurrence is next.


def test_ties_go_to_the_item_first_seen_in_the_raw_file(tmp_path):
    # A LastFM-2K-format file (uid,iid,tagid,ts). User 2's latest timestamp
    # (900) is shared by items 40, 30 and 20, in that row order; the raw file
    # shows item 20 first (user 1, who is filtered out with 3 rows), then 30
    # (user 3), then 40. Tie rule: 20 is the test item, 30 the validation
    # item; row order would have picked 40.
    lines = ['1,20,1,5', '1,21,1,6', '1,22,1,7']
    lines += [f'3,{item},1,{t}' for t, item in enumerate([30, 31, 32, 33, 34])]
    lines += ['2,40,1,900', '2,40,2,900', '2,30,1,900', '2,20,1,900',
              '2,50,1,100', '2,51,1,100']
    lines += [f'{900 + f},{1000 * (f + 1) + i},1,{i}' for f in range(2)
              for i in range(120)]
    path = tmp_path / 'last-fm-2k-ratings.dat'
    path.write_text('\n'.join(lines) + '\n')
    raw = loaders.load_lastfm_2k(str(path))
    split = preprocess.build_split(raw, validation=True)
    kept_items = np.unique(raw['item'][raw['user'] != 1].to_numpy())
    user = 0  # Raw user 2 is the first kept user.
    assert kept_items[split.test_items[user]] == 20
    assert kept_items[split.valid_items[user]] == 30
    # Both rows of item 40 stay in training, as do the older rows.
    train = sorted(kept_items[split.train_items[split.train_users == user]])
    assert train == [40, 40, 50, 51]


def test_test_item_is_the_latest_and_duplicates_stay_in_train():
    rows = [(0, 7, 1), (0, 7, 2), (0, 8, 3), (0, 7, 4), (0, 9, 5)]
    split = _build(_frame(rows + _fillers()))
    # Original items 7, 8, 9 have indices 0, 1, 2.
    assert split.test_items[0] == 2
    assert split.train_items[split.train_users == 0].tolist() == [0, 0, 1, 0]
    assert split.num_train_interactions == split.num_interactions - 3


def test_counts_and_shapes():
    split = _build(_random_frame())
    stats = split.summary()
    assert stats['train_interactions'] == stats['interactions'] - stats['users']
    assert stats['test_users'] == stats['users']
    assert stats['valid_users'] == 0
    assert split.test_negatives.shape == (split.num_users, 99)
    for array in (split.train_users, split.train_items, split.test_items,
                  split.test_negatives):
        assert array.dtype == np.int32


def test_test_negatives_are_distinct_never_interacted_and_deterministic():
    frame = _random_frame()
    split = _build(frame)
    seen = [set() for _ in range(split.num_users)]
    for u, i in zip(split.train_users, split.train_items):
        seen[u].add(int(i))
    for u in range(split.num_users):
        seen[u].add(int(split.test_items[u]))
        row = split.test_negatives[u]
        assert len(set(row.tolist())) == 99
        assert not seen[u] & set(row.tolist())
        assert row.min() >= 0 and row.max() < split.num_items
    assert split == _build(frame)
    other = _build(frame, test_seed=7)
    assert not np.array_equal(other.test_negatives, split.test_negatives)


def test_negatives_do_not_depend_on_the_block_size():
    users = np.array([0, 0, 1, 2, 2, 2])
    items = np.array([1, 5, 2, 0, 3, 4])
    kwargs = dict(num_users=3, num_items=40, num_negatives=10, seed=42)
    big = preprocess.sample_heldout_negatives(users, items, **kwargs)
    small = preprocess.sample_heldout_negatives(users, items, block_floats=1,
                                                **kwargs)
    np.testing.assert_array_equal(big, small)


def test_negatives_follow_the_documented_random_key_procedure():
    users, items = np.array([0, 1]), np.array([2, 0])
    got = preprocess.sample_heldout_negatives(
        users, items, num_users=2, num_items=8, num_negatives=3, seed=5)
    keys = np.random.default_rng(5).random((2, 8))
    keys[0, 2] = keys[1, 0] = 2.0
    np.testing.assert_array_equal(got, np.argsort(keys, axis=1)[:, :3])


def test_negatives_are_roughly_uniform():
    num_users, num_items = 4000, 20
    users = np.arange(num_users)
    items = np.zeros(num_users, dtype=np.int64)  # Everyone saw item 0.
    negatives = preprocess.sample_heldout_negatives(
        users, items, num_users=num_users, num_items=num_items,
        num_negatives=5, seed=1)
    counts = np.bincount(negatives.ravel(), minlength=num_items)
    assert counts[0] == 0
    expected = num_users * 5 / (num_items - 1)
    assert np.all(np.abs(counts[1:] - expected) < 0.1 * expected)


def test_validation_holds_out_the_second_latest():
    frame = _random_frame(seed=3)
    plain = _build(frame)
    split = _build(frame, validation=True)
    stats = split.summary()
    assert stats['valid_users'] == stats['users']
    assert stats['train_interactions'] == stats['interactions'] - 2 * stats[
        'users']
    np.testing.assert_array_equal(split.test_items, plain.test_items)
    np.testing.assert_array_equal(split.test_negatives, plain.test_negatives)
    assert not np.array_equal(split.valid_negatives, split.test_negatives)
    kept = preprocess.filter_users(frame)
    users, _ = preprocess.reindex(kept['user'].to_numpy(), source='x',
                                  what='user')
    items, _ = preprocess.reindex(kept['item'].to_numpy(), source='x',
                                  what='item')
    ranks = _authors_ranks(kept)
    expected_valid = np.empty(split.num_users, dtype=np.int32)
    expected_valid[users[ranks == 2]] = items[ranks == 2]
    np.testing.assert_array_equal(split.valid_items, expected_valid)
    for u in range(split.num_users):
        assert not set(split.valid_negatives[u]) & set(items[users == u])


def test_candidates():
    split = _build(_random_frame(), validation=True)
    test = split.candidates()
    assert test.shape == (split.num_users, 100) and test.dtype == np.int32
    np.testing.assert_array_equal(test[:, 0], split.test_items)
    np.testing.assert_array_equal(test[:, 1:], split.test_negatives)
    np.testing.assert_array_equal(split.candidates('valid')[:, 0],
                                  split.valid_items)
    with pytest.raises(ValueError):
        _build(_random_frame()).candidates('valid')


def test_fixed_item_count():
    frame = _random_frame()
    natural = _build(frame).num_items
    assert _build(frame, num_items=natural + 5).num_items == natural + 5
    with pytest.raises(DataError, match='more than the fixed item count'):
        _build(frame, num_items=natural - 1)


def test_no_user_left():
    with pytest.raises(DataError, match='no user has at least 5') as error:
        _build(_frame([(1, 2, 3)] * 4), source='tiny.csv')
    assert 'tiny.csv' in str(error.value)


def test_too_few_items_for_the_negatives_names_the_original_user():
    with pytest.raises(DataError, match=r"user 7 interacted with 10 of the 10 items, "
                       r"leaving 0 for the 99 sampled evaluation negatives; rank against "
                       r"every item \(--eval_protocol=full\)"):
        _build(_frame([(7, i, i) for i in range(10)]))


def test_a_small_catalog_without_sampled_negatives():
    """Full ranking alone draws none: 9 items are enough; 3 sampled fit."""
    frame = _frame([(u, (u + i) % 12, i) for u in range(4) for i in range(6)])
    split = _build(frame, num_negatives=0)
    assert split.num_items == 9 and split.test_negatives.shape == (4, 0)
    assert split.candidates('test', np.arange(4)).shape == (4, 1)
    assert _build(frame, num_negatives=3).test_negatives.shape == (4, 3)
    with pytest.raises(DataError, match='leaving 3 for the 4 sampled'):
        _build(frame, num_negatives=4)


def test_split_rejects_inconsistent_arrays():
    with pytest.raises(DataError):
        preprocess.Split(num_users=1, num_items=3, num_interactions=3,
                         train_users=np.zeros(1, np.int32),
                         train_items=np.zeros(1, np.int32),
                         test_items=np.zeros(1, np.int32),
                         test_negatives=np.zeros((1, 1), np.int32))


# Split files and cache --------------------------------------------------------


@pytest.mark.parametrize('validation', [False, True])
def test_write_read_round_trip(tmp_path, validation):
    split = _build(_random_frame(), validation=validation)
    split_io.write_split(split, tmp_path, key={'dataset': 'x'}, csv=True)
    back, meta = split_io.read_split(tmp_path)
    assert back == split
    assert isinstance(back.train_users, np.memmap)
    with pytest.raises(ValueError):  # Read-only: nothing can change it.
        back.train_users[0] += 1
    # Hashed chunk by chunk from the files: the same as from memory.
    assert split_io.split_fingerprint(back) == split_io.split_fingerprint(split)
    assert meta['statistics'] == split.summary()
    assert (tmp_path / 'valid_negatives.npy').exists() == validation
    header = (tmp_path / 'test.csv').read_text().splitlines()[0].split(',')
    assert header[:3] == ['user', 'item', 'neg_1'] and header[-1] == 'neg_99'
    assert (tmp_path / 'train.csv').read_text().startswith('user,item\n')
    assert (tmp_path / 'valid.csv').exists() == validation
    train = pd.read_csv(tmp_path / 'train.csv').to_numpy()
    np.testing.assert_array_equal(train[:, 0], split.train_users)
    np.testing.assert_array_equal(train[:, 1], split.train_items)


def test_the_text_copies_are_optional(tmp_path):
    split = _build(_random_frame())
    split_io.write_split(split, tmp_path, key={'a': 1}, csv=True)
    split_io.write_split(split, tmp_path, key={'a': 1})
    assert not (tmp_path / 'train.csv').exists()  # Stale copy removed.
    assert split_io.read_split(tmp_path)[0] == split
    # A cache without them gets them when asked, without recomputing.
    again, cached = split_io.load_or_compute(
        tmp_path, key={'a': 1}, compute=lambda: 1 / 0, csv=True)
    assert cached and again == split
    assert (tmp_path / 'test.csv').exists()
    assert split_io.read_split(tmp_path)[0] == split


def _cached(tmp_path, frame, key, validation=False):
    calls = []

    def compute():
        calls.append(1)
        return _build(frame, validation=validation)

    split, cached = split_io.load_or_compute(tmp_path, key=key, compute=compute,
                                             csv=True)
    return split, cached, len(calls)


def test_cache_reuses_matching_files(tmp_path):
    frame = _random_frame()
    first, cached, calls = _cached(tmp_path, frame, {'a': 1})
    assert (cached, calls) == (False, 1)
    second, cached, calls = _cached(tmp_path, frame, {'a': 1})
    assert (cached, calls) == (True, 0)
    assert first == second


def test_cache_recomputes_for_another_key(tmp_path):
    frame = _random_frame()
    _cached(tmp_path, frame, {'a': 1}, validation=True)
    split, cached, _ = _cached(tmp_path, frame, {'a': 2})
    assert not cached
    assert not (tmp_path / 'valid.csv').exists()  # Stale files removed.
    assert not (tmp_path / 'valid_items.npy').exists()
    assert split_io.read_split(tmp_path)[0] == split


@pytest.mark.parametrize('damage', ['truncate', 'edit', 'edit_text', 'delete',
                                    'delete_array', 'meta'])
def test_cache_recomputes_damaged_files(tmp_path, damage):
    frame = _random_frame()
    split, _, _ = _cached(tmp_path, frame, {'a': 1})
    train = tmp_path / 'train_items.npy'
    if damage == 'truncate':
        train.write_bytes(train.read_bytes()[:150])
    elif damage == 'edit':
        data = bytearray(train.read_bytes())
        data[-1] ^= 1
        train.write_bytes(bytes(data))
    elif damage == 'edit_text':
        text = tmp_path / 'train.csv'
        text.write_text(text.read_text().replace('\n1,', '\n2,', 1))
    elif damage == 'delete':
        os.remove(tmp_path / 'test.csv')
    elif damage == 'delete_array':
        os.remove(tmp_path / 'test_negatives.npy')
    else:
        (tmp_path / 'meta.json').write_text('{"format_version": 1, "key"')
    with pytest.raises(DataError):
        split_io.read_split(tmp_path)
    again, cached, calls = _cached(tmp_path, frame, {'a': 1})
    assert (cached, calls) == (False, 1)
    assert again == split
    assert split_io.read_split(tmp_path)[0] == split  # Files repaired.


def test_cache_rejects_other_format_versions(tmp_path):
    frame = _random_frame()
    _cached(tmp_path, frame, {'a': 1})
    meta = json.loads((tmp_path / 'meta.json').read_text())
    meta['format_version'] = 0
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    assert _cached(tmp_path, frame, {'a': 1})[1:] == (False, 1)


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    target = blocker / 'sub'
    with pytest.raises(DataError, match='cannot create the output directory'
                       ) as error:
        _cached(target, _random_frame(), {'a': 1})
    assert str(target) in str(error.value)


def test_file_fingerprint(tmp_path):
    path = tmp_path / 'raw.txt'
    path.write_text('abc')
    fingerprint = split_io.file_fingerprint(path)
    assert fingerprint['name'] == 'raw.txt'
    assert fingerprint['size'] == 3
    assert fingerprint['sha1'] == 'a9993e364706816aba3e25717850c26c9cd0d89d'
    with pytest.raises(DataError, match='cannot read'):
        split_io.file_fingerprint(tmp_path / 'missing.txt')


@pytest.mark.parametrize('inflate', [1, 50])  # 50: forces the slow fallback.
def test_smallest_keys_matches_a_full_sort(inflate):
    rng = np.random.default_rng(0)
    keys = rng.random((200, 400))
    keys[rng.random(keys.shape) < 0.3] = 2.0
    available = (keys < 2).sum(axis=1)
    expected = np.argsort(keys, axis=1)[:, :99]
    np.testing.assert_array_equal(
        preprocess.smallest_keys(keys, 99, available * inflate), expected)


def test_the_filters_report_what_they_dropped(tmp_path):
    """The csv task's split says in one line how many users and rows its
    rating threshold and the >= 5 filter dropped, also when read back from
    its cached split files."""
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top

    lines = ['user,item,rating']
    for user in range(8):  # Users 0-1: 3 rows; users 2-7: 12 rows.
        for item in range(3 if user < 2 else 12):
            # Rows with item >= 10 rate 1: below the threshold.
            lines.append(f'u{user},i{(user + item) % 120},{1 if item >= 10 else 4}')
    lines += ['u8,i1,1', 'u8,i2,1']  # Every row of u8 is below it.
    # 12 more users, 10 rows each, kept: enough items for the 99 negatives.
    lines += [f'f{user},j{user * 10 + item},5' for user in range(12) for item in range(10)]
    path = tmp_path / 'ratings.csv'
    path.write_text('\n'.join(lines) + '\n')
    task = tasks.get_task('csv')
    options = {'rating_col': 'rating', 'min_rating': 3.0}
    expected = ('filters: kept 18 of 21 users and 180 of 200 rows; dropped 14 rows rated '
                'below 3 (1 users left with none), then 2 users with fewer than 5 rows '
                '(6 rows)')
    prepared = task.prepare(data_dir=path, cache_dir=tmp_path / 'split', **options)
    assert prepared.split.filter_line() == expected and not prepared.cached
    again = task.prepare(data_dir=path, cache_dir=tmp_path / 'split', **options)
    assert again.cached and again.split.filter_line() == expected
    plain = task.load_split(data_dir=path)
    assert plain.filter_line() == ('filters: kept 18 of 21 users and 192 of 200 rows; '
                                   'dropped 3 users with fewer than 5 rows (8 rows)')


@pytest.mark.parametrize('wide', [False, True])  # True: keys too wide to pack.
def test_leave_one_out_ranks_match_a_lexsort_with_ties(wide):
    rng = np.random.default_rng(4)
    n = 3000
    users = rng.integers(0, 40, n)
    timestamps = rng.integers(0, 30, n)
    tie_keys = rng.integers(0, 5, n) * (2**50 if wide else 1)
    order = np.lexsort((np.arange(n), tie_keys, -timestamps, users))
    expected = np.empty(n, np.int64)
    sorted_users = users[order]
    for u in np.unique(users):
        rows = order[sorted_users == u]
        expected[rows] = np.arange(1, len(rows) + 1)
    np.testing.assert_array_equal(
        preprocess.leave_one_out_ranks(users, timestamps, tie_keys), expected)


def test_range_checks_read_mapped_arrays_from_their_files(tmp_path, monkeypatch):
    from tff_fedrecgel.data import split as split_lib  # pylint: disable=g-import-not-at-top

    monkeypatch.setattr(split_lib, '_CHUNK_BYTES', 64)  # Many chunks.
    split = _build(_random_frame())
    split_io.write_split(split, tmp_path, key={'dataset': 'x'})
    negatives = np.array(split.test_negatives)
    negatives[-1, -1] = split.num_items  # Out of range, in the last chunk.
    np.save(tmp_path / 'bad.npy', negatives)
    mapped = np.load(tmp_path / 'bad.npy', mmap_mode='r')
    chunks = list(split_lib.array_chunks(mapped))
    assert len(chunks) > 1 and all(not isinstance(c, np.memmap) for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), negatives)
    with pytest.raises(DataError, match='test_negatives out of range'):
        dataclasses.replace(split, test_negatives=mapped)
    users = np.array([7, 0, 24, 7, 3])
    np.testing.assert_array_equal(split_lib.array_rows(mapped, users), negatives[users])
    back, _ = split_io.read_split(tmp_path)
    np.testing.assert_array_equal(back.candidates('test', users),
                                  split.candidates('test', users))
    with pytest.raises(IndexError):
        split_lib.array_rows(mapped, np.array([len(negatives)]))


def test_the_fingerprint_does_not_depend_on_the_chunk_sizes(monkeypatch):
    from tff_fedrecgel.data import split as split_lib  # pylint: disable=g-import-not-at-top

    split = _build(_random_frame())
    assert split.user_ids is not None
    whole = split_io.split_fingerprint(split)
    monkeypatch.setattr(split_lib, '_CHUNK_BYTES', 64)
    monkeypatch.setattr(split_io, '_IDS_PER_CHUNK', 7)
    assert split_io.split_fingerprint(split) == whole
