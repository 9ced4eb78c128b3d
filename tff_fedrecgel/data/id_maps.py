"""Original ids <-> indices of a split (`Split.user_ids`, `Split.item_ids`).

The split re-indexes users and items to 0..n-1; its id maps keep each index's
original id (int64, or str). An `IdMap` answers both ways and takes ids as
typed on a command line: "42" finds the integer id 42. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tff_fedrecgel.errors import DataError


class UnknownIdError(DataError):
    """An original id that the split does not hold (a one-line message)."""


class IdMap:
    """Original ids of the indices 0..size-1 of one kind (users or items).

    Attributes:
      kind: 'user' or 'item' (for messages).
      size: Number of indices.
      ids: The original id of every index that has one (shorter than `size`
        when the last indices were never seen in the data, e.g.
        Amazon-Video's fixed item count), or None when the split kept no ids:
        an index is then its own id.
    """

    def __init__(self, *, kind: str, size: int, ids: np.ndarray | None):
        """Builds the lookup.

        Args:
          kind: 'user' or 'item'.
          size: Number of indices.
          ids: `Split.user_ids` or `Split.item_ids`.

        Raises:
          DataError: If there are more ids than indices, or repeated ids.
        """
        self.kind = kind
        self.size = int(size)
        self.ids = None if ids is None else np.asarray(ids)
        if self.ids is not None and len(self.ids) > self.size:
            raise DataError(f'{kind} ids: {len(self.ids)} ids for {self.size} indices')
        self._integer = self.ids is None or self.ids.dtype.kind in 'iu'
        known = range(self.size) if self.ids is None else self.ids.tolist()
        self._index = {self._key(v): i for i, v in enumerate(known)}
        if len(self._index) != (self.size if self.ids is None else len(self.ids)):
            raise DataError(f'{kind} ids: repeated ids')

    @property
    def num_with_id(self) -> int:
        """Indices 0..num_with_id-1 have an original id."""
        return self.size if self.ids is None else len(self.ids)

    def _key(self, value: Any) -> Any:
        if self._integer:
            if isinstance(value, (int, np.integer)):
                return int(value)
            try:
                return int(str(value).strip())
            except ValueError:
                return None
        return str(value)

    def __contains__(self, value: Any) -> bool:
        return self._key(value) in self._index

    def index(self, value: Any) -> int:
        """The index of an original id (an int, or its text).

        Raises:
          UnknownIdError: If the split has no such id.
        """
        index = self._index.get(self._key(value))
        if index is None:
            raise UnknownIdError(f'unknown {self.kind} id {value!r}: not in the data')
        return index

    def indices(self, values: Iterable[Any]) -> np.ndarray:
        """The indices of several original ids (int32, in the given order).

        Raises:
          UnknownIdError: Naming every unknown id.
        """
        values = list(values)
        unknown = [v for v in values if v not in self]
        if unknown:
            shown = ', '.join(repr(v) for v in unknown[:5])
            more = f' and {len(unknown) - 5} more' if len(unknown) > 5 else ''
            raise UnknownIdError(f'unknown {self.kind} id{"s" if len(unknown) > 1 else ""} '
                                 f'{shown}{more}: not in the data')
        return np.asarray([self.index(v) for v in values], np.int32)

    def original(self, index: int) -> Any:
        """The original id of an index (a Python int or str).

        Raises:
          DataError: If the index is out of range or has no original id.
        """
        index = int(index)
        if not 0 <= index < self.num_with_id:
            raise DataError(f'{self.kind} index {index} has no original id')
        if self.ids is None:
            return index
        value = self.ids[index]
        return int(value) if self._integer else str(value)

    def originals(self, indices: Sequence[int]) -> list[Any]:
        """The original ids of several indices."""
        return [self.original(i) for i in indices]

    def as_strings(self) -> list[str]:
        """Every index's original id as text ('' where it has none)."""
        known = [str(v) for v in (range(self.size) if self.ids is None else self.ids.tolist())]
        return known + [''] * (self.size - len(known))
