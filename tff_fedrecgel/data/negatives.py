"""Held-out negatives by the random-key method, exact and fast at scale.

The procedure (unchanged since the first split format, so that a seed gives
the same negatives): ``rng = numpy.random.default_rng(seed)``; conceptually
``keys = rng.random((num_users, num_items))`` (float64, row-major, one
continuous stream); the keys of the items a user interacted with are set to
2.0 (above every draw); the user's negatives are the ``num_negatives`` items
with the smallest keys, in ascending key order (equal keys: lower item
first).

Every one of the ``num_users * num_items`` draws decides which items are
smallest, so the cost is that many draws of the stream (about 3-5 ns each on
one core of the reference machine), not a cost per interaction. What is
saved here is everything around the draws: the keys are drawn into a small
reused buffer that stays in the core's cache, only keys under a per-user
threshold are looked at, and disjoint ranges of users are drawn on threads
from copies of the generator jumped to the range's place in the stream
(``PCG64.advance``), so the result does not depend on the number of
threads or the block size.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np

from tff_fedrecgel.errors import DataError

# Keys drawn per block: 512 KiB of float64, within one core's L2 cache.
BLOCK_FLOATS = 1 << 16
# Below this many keys in all, one thread (starting threads costs more).
_THREADED_MIN_KEYS = 1 << 24
_MAX_WORKERS = 4


@dataclasses.dataclass(frozen=True)
class InteractedPairs:
    """The distinct (user, item) pairs to exclude, sorted by user then item.

    Attributes:
      users: int64 [P] user of every distinct pair.
      items: int64 [P] item of every distinct pair.
      available: int64 [num_users] items each user did not interact with.
      num_items: Size of the item index space.
    """

    users: np.ndarray
    items: np.ndarray
    available: np.ndarray
    num_items: int


def interacted_pairs(users: np.ndarray, items: np.ndarray, *, num_users: int,
                     num_items: int) -> InteractedPairs:
    """Collects the distinct interactions of every user.

    Args:
      users: User index of every interaction (duplicates allowed).
      items: Item index of every interaction.
      num_users: Number of users.
      num_items: Size of the item index space.

    Returns:
      The pairs, sorted by user then item.
    """
    codes = np.unique(np.asarray(users, dtype=np.int64) * num_items
                      + np.asarray(items, dtype=np.int64))
    pair_users, pair_items = np.divmod(codes, num_items)
    available = num_items - np.bincount(pair_users, minlength=num_users)
    return InteractedPairs(pair_users, pair_items, available.astype(np.int64),
                           int(num_items))


def default_workers() -> int:
    """Threads for the draws: the usable cores, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_WORKERS, cores))


def sample(pairs: InteractedPairs, *, num_negatives: int, seed: int,
           source: str = 'data', block_floats: int = BLOCK_FLOATS,
           workers: int | None = None) -> np.ndarray:
    """Draws every user's held-out negatives (the module's procedure).

    Args:
      pairs: The interactions to exclude (`interacted_pairs`).
      num_negatives: Negatives per user.
      seed: Seed of ``numpy.random.default_rng``.
      source: Name used in error messages.
      block_floats: Approximate keys per block (memory bound).
      workers: Threads (None: `default_workers`); the result is the same
        for any number.

    Returns:
      int32 [num_users, num_negatives].

    Raises:
      DataError: If some user has fewer than ``num_negatives`` candidates.
    """
    num_users, num_items = len(pairs.available), pairs.num_items
    available = pairs.available
    if num_users and available.min() < num_negatives:
        user = int(np.argmin(available))
        raise DataError(
            f'{source}: user index {user} has only {int(available[user])} '
            f'non-interacted items, fewer than the {num_negatives} held-out '
            'negatives needed')
    result = np.empty((num_users, num_negatives), dtype=np.int32)
    if num_users == 0:
        return result
    if workers is None:
        workers = default_workers()
    if num_users * num_items < _THREADED_MIN_KEYS:
        workers = 1
    workers = max(1, min(int(workers), num_users))
    bounds = np.linspace(0, num_users, workers + 1).astype(np.int64)
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    jobs = [(start, stop, _generator_at(seed, start * num_items))
            for start, stop in ranges]
    rows_per_block = max(1, int(block_floats) // max(1, num_items))

    def run(job):
        start, stop, rng = job
        _sample_range(pairs, rng, start, stop, num_negatives, rows_per_block,
                      result)

    if len(jobs) == 1:
        run(jobs[0])
    else:
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            for future in [pool.submit(run, job) for job in jobs]:
                future.result()
    return result


def _generator_at(seed: int, position: int) -> np.random.Generator:
    """``default_rng(seed)`` after ``position`` float64 draws.

    PCG64 spends one 64-bit output on each ``random()`` double, so jumping
    the bit generator by ``position`` steps lands on the same draw.
    """
    bit_generator = np.random.PCG64(seed)
    if position:
        bit_generator.advance(position)
    return np.random.Generator(bit_generator)


def _sample_range(pairs: InteractedPairs, rng: np.random.Generator, start: int,
                  stop: int, k: int, rows_per_block: int,
                  result: np.ndarray) -> None:
    """Fills ``result[start:stop]``, drawing users ``start..stop-1``."""
    num_items = pairs.num_items
    size = min(rows_per_block, stop - start) * num_items
    keys_buffer = np.empty(size, dtype=np.float64)
    # Padded to whole 8-byte words, read 8 flags at a time.
    mask_buffer = np.zeros(-(-size // 8) * 8, dtype=bool)
    threshold = hit_threshold(k, pairs.available[start:stop])
    lo = int(np.searchsorted(pairs.users, start))
    for first in range(start, stop, rows_per_block):
        last = min(stop, first + rows_per_block)
        rows, n = last - first, (last - first) * num_items
        keys = keys_buffer[:n].reshape(rows, num_items)
        rng.random(out=keys)
        hi = int(np.searchsorted(pairs.users, last))
        keys[pairs.users[lo:hi] - first, pairs.items[lo:hi]] = 2.0
        lo = hi
        padded = -(-n // 8) * 8
        mask = mask_buffer[:padded]
        mask[n:] = False
        np.less(keys, threshold[first - start:last - start, None],
                out=mask[:n].reshape(rows, num_items))
        flat = _true_positions(mask)
        row_idx, col_idx = np.divmod(flat, num_items)
        result[first:last] = smallest_from_hits(keys, k, row_idx, col_idx)


def hit_threshold(k: int, available: np.ndarray) -> np.ndarray:
    """Per-row key threshold: about ``k + 8 sqrt(k) + 16`` expected hits."""
    return (k + 8 * np.sqrt(k) + 16) / np.maximum(available, 1)


def _true_positions(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` for a sparse mask of whole 8-byte words."""
    words = np.flatnonzero(mask.view(np.uint64))
    word_rows, offsets = np.nonzero(mask.reshape(-1, 8)[words])
    return words[word_rows] * 8 + offsets


def smallest_from_hits(keys: np.ndarray, k: int, row_idx: np.ndarray,
                       col_idx: np.ndarray) -> np.ndarray:
    """The ``k`` smallest keys of each row, given the keys under threshold.

    Args:
      keys: float64 [rows, n]; uniform in [0, 1) except excluded entries.
      k: How many indices per row.
      row_idx: Row of every key under `hit_threshold`, in row-major order.
      col_idx: Column of the same keys.

    Returns:
      int32 [rows, k] column indices, ascending by key (ties: lower column).
    """
    rows = keys.shape[0]
    result = np.empty((rows, k), dtype=np.int32)
    if k == 0 or rows == 0:
        return result
    hits = np.bincount(row_idx, minlength=rows)
    order = np.lexsort((keys[row_idx, col_idx], row_idx))
    row_idx, col_idx = row_idx[order], col_idx[order]
    starts = np.concatenate([[0], np.cumsum(hits)[:-1]])
    position = np.arange(len(row_idx)) - starts[row_idx]
    ok = hits >= k
    take = (position < k) & ok[row_idx]
    result[ok] = col_idx[take].reshape(-1, k)
    for row in np.flatnonzero(~ok):  # Rare: too few keys below the threshold.
        part = np.argpartition(keys[row], k - 1)[:k] if k < keys.shape[1] else (
            np.arange(keys.shape[1]))
        result[row] = part[np.argsort(keys[row, part], kind='stable')]
    return result
