"""The FedRecGEL data protocol: filter, re-index, leave-one-out, negatives.

Steps (docs/ALGORITHM.md, "The data protocol"):

1. Keep users with at least ``min_interactions`` (5) rows. Items are not
   filtered. Duplicate (user, item) rows are kept.
2. Re-index users and items contiguously from 0 in sorted order of their
   original ids (only ids that survive step 1 get an index).
3. Rank each user's rows by timestamp, descending. Ties follow the authors'
   rule: items are numbered in order of first appearance in the raw file,
   each user's rows are sorted (stably) by that number, then ranked with
   ``rank(method='first', ascending=False)``; so among equal timestamps the
   item that appears first in the raw file wins. Rank 1 is the test
   interaction; with ``validation=True`` rank 2 is the validation
   interaction. Every other row (duplicates included) is training.
4. Held-out negatives (see `sample_heldout_negatives`): for each user, 99
   items it never interacted with in the filtered data, without replacement.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tff_fedrecgel import sizes
from tff_fedrecgel.data import loaders
from tff_fedrecgel.data import negatives
from tff_fedrecgel.data.split import Split
from tff_fedrecgel.errors import DataError

MIN_INTERACTIONS = 5
NUM_HELDOUT_NEGATIVES = sizes.EVAL_NEGATIVES
TEST_NEGATIVE_SEED = 42
VALID_NEGATIVE_SEED = 43


def filter_users(raw: pd.DataFrame, *,
                 min_interactions: int = MIN_INTERACTIONS) -> pd.DataFrame:
    """Keeps the rows of users with at least ``min_interactions`` rows.

    Args:
      raw: Raw interactions (``user``, ``item``, ``timestamp``).
      min_interactions: Minimum rows per user.

    Returns:
      The kept rows in their original order, with a fresh 0-based index.
    """
    keep = rows_of_active_users(raw['user'].to_numpy(), min_interactions)
    return raw[keep].reset_index(drop=True)


def rows_of_active_users(users: np.ndarray, min_interactions: int) -> np.ndarray:
    """Which rows belong to users with at least ``min_interactions`` rows.

    Args:
      users: Original user id of every row.
      min_interactions: Minimum rows per user.

    Returns:
      bool [rows].
    """
    codes, _ = pd.factorize(np.asarray(users), sort=False)
    return np.bincount(codes)[codes] >= min_interactions


def original_ids(uniques: np.ndarray) -> np.ndarray:
    """The id map of a split: integer ids as int64, any other id as str.

    Args:
      uniques: The sorted original ids of `reindex`.

    Returns:
      int64 [n], or an object array of str [n].
    """
    uniques = np.asarray(uniques)
    if uniques.dtype.kind in 'iu':
        return uniques.astype(np.int64)
    return np.array([str(v) for v in uniques], dtype=object)


def reindex(values: np.ndarray, *, source: str, what: str,
            ) -> tuple[np.ndarray, np.ndarray]:
    """Maps original ids to 0..n-1 in sorted order of the ids.

    The ids are hashed first and only the distinct ones sorted, which gives
    ``numpy.unique(values, return_inverse=True)`` without sorting every row.

    Args:
      values: Original ids, one per row.
      source: Name used in error messages.
      what: ``'user'`` or ``'item'`` for error messages.

    Returns:
      ``(codes, uniques)``: int32 codes per row and the sorted original ids.

    Raises:
      DataError: If the ids cannot be sorted (e.g. mixed numbers and text).
    """
    codes, uniques = pd.factorize(np.asarray(values), sort=False)
    try:
        order = np.argsort(uniques, kind='stable')
    except TypeError:
        raise DataError(
            f'{source}: {what} ids mix types that cannot be sorted') from None
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return rank[codes], uniques[order]


def first_appearance_index(values: np.ndarray) -> np.ndarray:
    """Numbers each distinct value by the row of its first appearance.

    Args:
      values: One id per row.

    Returns:
      int64 per row: 0 for the first distinct value met, 1 for the next, ...
    """
    codes, _ = pd.factorize(np.asarray(values), sort=False)
    return codes.astype(np.int64)


def leave_one_out_ranks(users: np.ndarray, timestamps: np.ndarray,
                        tie_keys: np.ndarray) -> np.ndarray:
    """Rank of each row within its user: 1 = latest timestamp.

    Equal timestamps are ordered by ``tie_keys`` (ascending), then by row
    order. With ``tie_keys`` = `first_appearance_index` of the items this is
    the authors' rule: sort each user's rows stably by the item's index, then
    ``groupby('user')['timestamp'].rank(method='first', ascending=False)``.

    Args:
      users: User of every row.
      timestamps: Numeric timestamp of every row.
      tie_keys: Integer key of every row that breaks timestamp ties.

    Returns:
      int64 ranks starting at 1.

    Raises:
      ValueError: If the three arrays differ in length.
    """
    users = np.asarray(users)
    timestamps = np.asarray(timestamps)
    tie_keys = np.asarray(tie_keys)
    num_rows = len(users)
    if not len(timestamps) == len(tie_keys) == num_rows:
        raise ValueError('users, timestamps and tie_keys differ in length')
    user_codes, _ = pd.factorize(users, sort=False)
    # Descending timestamp without negation (exact for any numeric dtype).
    time_rank = np.unique(timestamps, return_inverse=True)[1].reshape(-1)
    order = _sort_rows(user_codes, time_rank, tie_keys)
    del time_rank
    sorted_users = user_codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_users[1:] != sorted_users[:-1]])
    del sorted_users
    sizes = np.diff(np.r_[starts, num_rows])
    ranks = np.empty(num_rows, dtype=np.int64)
    ranks[order] = np.arange(num_rows) - np.repeat(starts, sizes) + 1
    return ranks


def _sort_rows(user_codes: np.ndarray, time_rank: np.ndarray,
               tie_keys: np.ndarray) -> np.ndarray:
    """Rows by user, latest time first, then tie key, then row (stable).

    When the three fit in 63 bits together they are packed into one int64
    key and sorted once (a few times faster than `np.lexsort`'s pass per
    key); the order is the same.
    """
    bits = [max(1, int(np.max(a, initial=0)).bit_length()) if len(a) else 1
            for a in (user_codes, time_rank, tie_keys)]
    if min(np.min(tie_keys, initial=0), 0) < 0 or sum(bits) > 63:
        return np.lexsort((tie_keys, -time_rank, user_codes))
    latest_first = int(np.max(time_rank, initial=0)) - time_rank.astype(np.int64)
    key = user_codes.astype(np.int64) << (bits[1] + bits[2])
    key |= latest_first << bits[2]
    key |= tie_keys.astype(np.int64)
    return np.argsort(key, kind='stable')


def sample_heldout_negatives(interacted_users: np.ndarray,
                             interacted_items: np.ndarray, *, num_users: int,
                             num_items: int,
                             num_negatives: int = NUM_HELDOUT_NEGATIVES,
                             seed: int, source: str = 'data',
                             block_floats: int = negatives.BLOCK_FLOATS,
                             workers: int | None = None) -> np.ndarray:
    """Samples per-user negatives without replacement (random-key method).

    Exact procedure: ``rng = numpy.random.default_rng(seed)``; conceptually
    ``keys = rng.random((num_users, num_items))`` (float64, row-major, drawn in
    row blocks from the one stream); keys of the items a user interacted with
    are set to 2.0 (above every draw); the user's negatives are the
    ``num_negatives`` items with the smallest keys, in ascending key order.
    This is uniform sampling without replacement from the non-interacted
    items, vectorized and independent of the block size and of the threads
    (see `tff_fedrecgel.data.negatives`).

    Args:
      interacted_users: User index of every interaction to exclude.
      interacted_items: Item index of every interaction to exclude.
      num_users: Number of users (rows of the result).
      num_items: Size of the item index space.
      num_negatives: Negatives per user.
      seed: Seed of ``numpy.random.default_rng``.
      source: Name used in error messages.
      block_floats: Approximate floats per block of keys (memory bound).
      workers: Threads drawing the keys (None: the usable cores, up to 4).

    Returns:
      int32 [num_users, num_negatives].

    Raises:
      DataError: If some user has fewer than ``num_negatives`` candidates.
    """
    pairs = negatives.interacted_pairs(interacted_users, interacted_items,
                                       num_users=num_users, num_items=num_items)
    return negatives.sample(pairs, num_negatives=num_negatives, seed=seed,
                            source=source, block_floats=block_floats,
                            workers=workers)


def smallest_keys(keys: np.ndarray, k: int,
                  available: np.ndarray) -> np.ndarray:
    """Column indices of the ``k`` smallest keys of each row, ascending.

    Equal to ``np.argsort(keys, axis=1)[:, :k]`` for distinct keys, but fast:
    only keys below a per-row threshold (about ``k + 8 sqrt(k) + 16`` expected
    hits among the row's ``available`` uniform keys) are sorted; rows with
    fewer than ``k`` hits fall back to a full partition.

    Args:
      keys: float64 [rows, n]; uniform in [0, 1) except excluded entries (2.0).
      k: How many indices per row.
      available: int [rows] number of non-excluded entries per row (>= k).

    Returns:
      int32 [rows, k].
    """
    threshold = negatives.hit_threshold(k, np.asarray(available))
    row_idx, col_idx = np.nonzero(keys < threshold[:, None])
    return negatives.smallest_from_hits(keys, k, row_idx, col_idx)


def build_split(raw: pd.DataFrame, *, validation: bool = False,
               min_interactions: int = MIN_INTERACTIONS,
               num_negatives: int = NUM_HELDOUT_NEGATIVES,
               test_seed: int = TEST_NEGATIVE_SEED,
               valid_seed: int = VALID_NEGATIVE_SEED,
               num_items: int | None = None,
               source: str = 'data', workers: int | None = None) -> Split:
    """Applies the FedRecGEL data protocol to raw interactions.

    Args:
      raw: Raw interactions with ``user``, ``item``, ``timestamp``.
      validation: Also hold out each user's second-latest interaction.
      min_interactions: Users with fewer rows are dropped (5 in the paper).
      num_negatives: Held-out negatives per user (99 in the paper; 0: none,
        for full ranking only).
      test_seed: Seed of the test negatives.
      valid_seed: Seed of the validation negatives.
      num_items: Fixed size of the item index space (Amazon-Video: 11,830);
        it must be at least the number of distinct items. None: the number
        of distinct items after filtering.
      source: Name (usually the raw file) used in error messages.
      workers: Threads drawing the negatives (None: the usable cores, up to
        4); the split is the same for any number.

    Returns:
      The split.

    Raises:
      DataError: On a bad frame, no user left after filtering, too few
        items for the negatives or a fixed item count that is too small.
    """
    loaders.validate_raw(raw, source=source)
    needed = 3 if validation else 2
    if min_interactions < needed:
        raise DataError(
            f'{source}: min_interactions must be at least {needed} '
            f'(got {min_interactions})')
    # Columns, not rows: the raw frame is read once into numpy arrays.
    raw_items = raw['item'].to_numpy()
    # The tie rule numbers items by first appearance in the raw file.
    tie_keys = first_appearance_index(raw_items)
    keep = rows_of_active_users(raw['user'].to_numpy(), min_interactions)
    num_kept = int(np.count_nonzero(keep))
    # The reader's own threshold (csv --min_rating) dropped rows before this.
    by_rating = raw.attrs.get(loaders.RATING_FILTER_ATTR) or {}
    users_in_raw = int(raw['user'].nunique())
    filtered = {
        'users_read': users_in_raw + by_rating.get('users', 0),
        'rows_read': int(len(raw)) + by_rating.get('rows', 0),
        'min_rating': by_rating.get('min_rating'),
        'rating_users': by_rating.get('users', 0),
        'rating_rows': by_rating.get('rows', 0),
        'min_interactions': int(min_interactions),
        'few_rows': int(len(keep) - num_kept),
    }
    if not num_kept:
        raise DataError(
            f'{source}: no user has at least {min_interactions} interactions')
    every_row = num_kept == len(keep)
    users, user_ids = reindex(_kept(raw['user'].to_numpy(), keep, every_row),
                              source=source, what='user')
    items, item_ids = reindex(_kept(raw_items, keep, every_row),
                              source=source, what='item')
    del raw_items
    filtered['few_users'] = users_in_raw - len(user_ids)
    num_users = int(users.max()) + 1
    if num_items is None:
        num_items = len(item_ids)
    elif len(item_ids) > num_items:
        raise DataError(
            f'{source}: {len(item_ids)} distinct items, more than the fixed '
            f'item count {num_items}')

    ranks = leave_one_out_ranks(
        users, _kept(raw['timestamp'].to_numpy(), keep, every_row),
        _kept(tie_keys, keep, every_row))
    del tie_keys, keep
    # Held-out rows are among the interactions excluded from the negatives.
    pairs = negatives.interacted_pairs(users, items, num_users=num_users,
                                       num_items=num_items)
    _check_room(pairs.available, num_negatives, user_ids, num_items, source)

    def sample(seed):
        if not num_negatives:  # Full ranking only: no sampled candidates.
            return np.empty((num_users, 0), np.int32)
        return negatives.sample(pairs, num_negatives=num_negatives, seed=seed,
                                source=source, workers=workers)

    test_items = _held_out_items(users, items, ranks == 1, num_users)
    test_negatives = sample(test_seed)
    valid_items = valid_negatives = None
    if validation:
        valid_items = _held_out_items(users, items, ranks == 2, num_users)
        valid_negatives = sample(valid_seed)
    del pairs
    train = ranks > (2 if validation else 1)
    del ranks
    return Split(
        num_users=num_users,
        num_items=int(num_items),
        num_interactions=num_kept,
        train_users=users[train],
        train_items=items[train],
        test_items=test_items,
        test_negatives=test_negatives,
        valid_items=valid_items,
        valid_negatives=valid_negatives,
        user_ids=original_ids(user_ids),
        item_ids=original_ids(item_ids),
        filtered=filtered,
    )


def _check_room(available: np.ndarray, num_negatives: int, user_ids: np.ndarray,
                num_items: int, source: str) -> None:
    """Refuses a catalog too small for the sampled negatives, naming the
    user (by its original id) with the fewest items left."""
    if not num_negatives or not len(available):
        return
    user = int(np.argmin(available))
    left = int(available[user])
    user_id = user_ids[user]
    if isinstance(user_id, np.generic):
        user_id = user_id.item()
    if left < num_negatives:
        raise DataError(
            f'{source}: user {user_id!r} interacted with {num_items - left} of the '
            f'{num_items} items, leaving {left} for the {num_negatives} sampled evaluation '
            'negatives; rank against every item (--eval_protocol=full) or sample fewer '
            '(--eval_negatives)')


def _kept(values: np.ndarray, keep: np.ndarray, every_row: bool) -> np.ndarray:
    return values if every_row else values[keep]


def _held_out_items(users: np.ndarray, items: np.ndarray, rows: np.ndarray,
                    num_users: int) -> np.ndarray:
    """int32 [num_users]: the item of each user's row where ``rows`` holds."""
    held_out = np.empty(num_users, dtype=np.int32)
    held_out[users[rows]] = items[rows]
    return held_out
