"""A preprocessed leave-one-out split: its arrays, ids and checks.

`preprocess.build_split` makes one; `split_io` stores and reads it. Imports
no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterator
import dataclasses
import os
from typing import Any, Literal

import numpy as np

from tff_fedrecgel.errors import DataError

# Rows read at once by `array_chunks` (about this many bytes).
_CHUNK_BYTES = 1 << 26


def _mapped_file(array: np.ndarray) -> str | None:
    """The file a read-only array is mapped whole from, else None."""
    if (isinstance(array, np.memmap) and not array.flags.writeable
            and array.base is getattr(array, '_mmap', None)):
        return array.filename
    return None


def array_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`array[rows]`; a mapped file's rows are read one by one from it (a
    sample of scattered rows would otherwise fault in the pages around each
    of them, gigabytes of a large split's negatives)."""
    rows = np.asarray(rows)
    path = _mapped_file(array)
    if path is None or rows.dtype.kind not in 'iu' or (
            len(rows) and (rows.min() < 0 or rows.max() >= len(array))):
        return array[rows]  # Numpy's own rules (and errors).
    rows = rows.astype(np.int64)
    out = np.empty((len(rows), *array.shape[1:]), array.dtype)
    row_bytes = out.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    view = memoryview(out.reshape(-1).view(np.uint8))
    fd = os.open(path, os.O_RDONLY)
    try:
        for k, row in enumerate(rows.tolist()):
            os.preadv(fd, [view[k * row_bytes:(k + 1) * row_bytes]],
                      array.offset + row * row_bytes)
    finally:
        os.close(fd)
    return out


def array_chunks(array: np.ndarray) -> Iterator[np.ndarray]:
    """An array's rows in chunks of about 64 MB, in order.

    A read-only array mapped whole from a file (`split_io.read_split`'s) is
    read from the file instead of through its mapping: a pass over a
    10,000,000-user split's 4 GB of negatives then leaves its pages in the
    kernel's cache, not in this process's resident memory.

    Args:
      array: Any array (at least one dimension).

    Yields:
      Consecutive row blocks; together, the array's rows.
    """
    row_items = int(np.prod(array.shape[1:], dtype=np.int64))
    rows = max(1, _CHUNK_BYTES // max(1, array.itemsize * row_items))
    if not _mapped_file(array):
        for start in range(0, len(array), rows):
            yield array[start:start + rows]
        return
    with open(array.filename, 'rb') as f:
        f.seek(array.offset)
        for start in range(0, len(array), rows):
            count = min(rows, len(array) - start)
            chunk = np.fromfile(f, dtype=array.dtype, count=count * row_items)
            yield chunk.reshape((count, *array.shape[1:]))


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """A preprocessed leave-one-out split with held-out candidates.

    Attributes:
      num_users: Users after filtering; user indices are ``0..num_users-1``.
      num_items: Item index space size; item indices are ``0..num_items-1``.
      num_interactions: Rows after filtering (train + held-out rows).
      train_users: int32 [R] user index of every training row (file order).
      train_items: int32 [R] item index of every training row.
      test_items: int32 [num_users] each user's test item.
      test_negatives: int32 [num_users, K] each user's test negatives.
      valid_items: int32 [num_users] validation items, or None.
      valid_negatives: int32 [num_users, K] validation negatives, or None.
      user_ids: [num_users] the original id of every user index (int64, or
        str objects), or None when unknown.
      item_ids: The original id of every item index (int64, or str objects),
        or None when unknown. It may be shorter than ``num_items`` when the
        item count is fixed (Amazon-Video): the indices past its end were
        never seen in the data and have no original id.
      filtered: What the filters dropped (`filter_line` says it in words), or
        None when unknown: ``users_read``, ``rows_read`` (the raw input),
        ``min_rating`` with ``rating_users`` / ``rating_rows`` (the reader's
        rating threshold: users left with no row, rows below it), and
        ``min_interactions`` with ``few_users`` / ``few_rows`` (users with
        fewer rows, and their rows).
    """

    num_users: int
    num_items: int
    num_interactions: int
    train_users: np.ndarray
    train_items: np.ndarray
    test_items: np.ndarray
    test_negatives: np.ndarray
    valid_items: np.ndarray | None = None
    valid_negatives: np.ndarray | None = None
    user_ids: np.ndarray | None = None
    item_ids: np.ndarray | None = None
    filtered: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Fail early on inconsistent arrays (e.g. a hand-built or cached split).
        u, i = self.num_users, self.num_items
        if self.train_users.shape != self.train_items.shape:
            raise DataError('split: train_users and train_items differ in size')
        if self.test_items.shape != (u,) or self.test_negatives.ndim != 2 or (
                self.test_negatives.shape[0] != u):
            raise DataError('split: test arrays do not have one row per user')
        if (self.valid_items is None) != (self.valid_negatives is None):
            raise DataError(
                'split: valid_items and valid_negatives go together')
        held_out = 1 if self.valid_items is None else 2
        if self.num_interactions != len(self.train_users) + held_out * u:
            raise DataError('split: row counts do not add up')
        for name in ('train_users', 'train_items', 'test_items',
                     'test_negatives', 'valid_items', 'valid_negatives'):
            array = getattr(self, name)
            if array is None:
                continue
            if array.dtype != np.int32:
                raise DataError(f'split: {name} must be int32')
            bound = u if name == 'train_users' else i
            if array.size and any(c.min() < 0 or c.max() >= bound
                                  for c in array_chunks(array) if c.size):
                raise DataError(f'split: {name} out of range')
        for name, limit in (('user_ids', u), ('item_ids', i)):
            ids = getattr(self, name)
            if ids is None:
                continue
            if ids.ndim != 1 or ids.dtype not in (np.int64, object):
                raise DataError(f'split: {name} must be int64 or str [n]')
            if len(ids) > limit or (name == 'user_ids' and len(ids) != u):
                raise DataError(f'split: {name} has {len(ids)} entries for '
                                f'{limit} indices')

    @property
    def has_validation(self) -> bool:
        """Whether a validation item was held out for every user."""
        return self.valid_items is not None

    @property
    def num_train_interactions(self) -> int:
        """Training rows (duplicates counted)."""
        return int(len(self.train_users))

    def filter_line(self) -> str | None:
        """One line on what the filters dropped, or None when unknown."""
        f = self.filtered
        if not f:
            return None
        kept_users = f['users_read'] - f['rating_users'] - f['few_users']
        kept_rows = f['rows_read'] - f['rating_rows'] - f['few_rows']
        parts = []
        if f.get('min_rating') is not None:  # The reader's filter comes first.
            parts.append(f"{f['rating_rows']:,} rows rated below {f['min_rating']:g} "
                         f"({f['rating_users']:,} users left with none)")
        parts.append(f"{f['few_users']:,} users with fewer than {f['min_interactions']} "
                     f"rows ({f['few_rows']:,} rows)")
        return (f"filters: kept {kept_users:,} of {f['users_read']:,} users and "
                f"{kept_rows:,} of {f['rows_read']:,} rows; dropped " + ', then '.join(parts))

    def summary(self) -> dict[str, int]:
        """Statistics of the split.

        Returns:
          ``users``, ``items``, ``interactions``, ``train_interactions``,
          ``test_users`` and ``valid_users`` (0 without validation).
        """
        return {
            'users': int(self.num_users),
            'items': int(self.num_items),
            'interactions': int(self.num_interactions),
            'train_interactions': self.num_train_interactions,
            'test_users': int(len(self.test_items)),
            'valid_users': 0 if self.valid_items is None else int(
                len(self.valid_items)),
        }

    def candidates(self, which: Literal['test', 'valid'] = 'test',
                   users: np.ndarray | None = None) -> np.ndarray:
        """Evaluation candidates: the held-out item, then its negatives.

        Args:
          which: ``'test'`` or ``'valid'``.
          users: Only these users' rows, in this order (None: every user).

        Returns:
          int32 [num_users (or len(users)), 1 + K]; column 0 is the held-out
          item.

        Raises:
          ValueError: For an unknown ``which`` or ``'valid'`` without
            validation.
        """
        if which == 'test':
            items, negatives = self.test_items, self.test_negatives
        elif which == 'valid':
            if self.valid_items is None:
                raise ValueError('this split has no validation hold-out')
            items, negatives = self.valid_items, self.valid_negatives
        else:
            raise ValueError(f"which must be 'test' or 'valid', got {which!r}")
        if users is not None:
            items, negatives = array_rows(items, users), array_rows(negatives, users)
        return np.concatenate([items[:, None], negatives], axis=1).astype(
            np.int32)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Split):
            return NotImplemented
        for field in dataclasses.fields(self):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if a is None or b is None or not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # Mutable-content arrays: not hashable.
