"""Where every user's state lives: in memory, or memory-mapped on disk.

A store holds named arrays with a leading `[num_users]` axis; a round
gathers its cohort's rows and scatters their new values back.

* `MemoryStore`: numpy arrays; a checkpoint holds them whole.
* `DiskStore`: one `.npy` file per array, memory-mapped
  (`np.lib.format.open_memmap`) for whole-table reads (evaluation); a round
  reads and writes only its cohort's rows, through the files (`pread`,
  `pwrite`: the process keeps no file pages resident). A checkpoint holds only a
  version (`mark`); exactness comes from an undo journal
  (`user_state_journal`): before each scatter the rows it overwrites are
  appended, so after a crash `rollback(version)` undoes the records after
  that version's mark, newest first.

`--user_state_store` (`run_settings.Settings.user_state_store`) picks one.
Imports no TensorFlow.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
import json
import os
import pathlib
import secrets

import numpy as np

from tff_fedrecgel.errors import DataError
from tff_fedrecgel.simulation import user_state_journal

# Marks kept in the journal: the training program keeps 3 checkpoints, and a
# mark is written just before a save that may not complete.
KEEP_MARKS = 4
_META = 'meta.json'
_JOURNAL = 'journal.bin'

# (name, shape of one user's row, dtype), in the store's order.
Layout = Sequence[tuple[str, tuple[int, ...], np.dtype]]


class StoreError(DataError):
    """A disk store that cannot serve a request (a one-line message): its
    folder is missing or another run's, or its journal no longer holds the
    version a checkpoint names."""


class UserStateStore(abc.ABC):
    """Named per-user arrays: gather a cohort's rows, scatter them back."""

    arrays: dict[str, np.ndarray]

    @property
    def num_users(self) -> int:
        """Rows of every array."""
        return int(next(iter(self.arrays.values())).shape[0])

    def gather(self, users: Sequence[int],
               names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Copies of the rows of `users`, per array.

        Args:
          users: Row indices.
          names: The arrays to read (default: every one).

        Returns:
          `{name: array[users]}`.
        """
        index = np.asarray(users, np.int64)
        return {name: self.arrays[name][index] for name in names or self.arrays}

    @abc.abstractmethod
    def scatter(self, users: Sequence[int], rows: Mapping[str, np.ndarray]) -> None:
        """Stores new rows of `users` (distinct), per array (`gather`'s layout)."""


class MemoryStore(UserStateStore):
    """Every array in memory (the checkpoint saves them whole)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        """Args:
          arrays: Named arrays with a common leading axis (kept, not copied:
            a copy of a population's state is what the disk store avoids).
        """
        self.arrays = dict(arrays)

    def scatter(self, users, rows) -> None:
        index = np.asarray(users, np.int64)
        for name, table in self.arrays.items():
            table[index] = rows[name]


class DiskStore(UserStateStore):
    """Memory-mapped `.npy` arrays in `folder`, with an undo journal.

    Attributes:
      folder: The store's folder (`<run_dir>/user_states`).
      store_id: A random id given at creation: a checkpoint's version is
        only meaningful for the store that wrote it.
      version: The version of the last mark.
    """

    def __init__(self, folder: str | os.PathLike, *, writable: bool = True):
        """Opens an existing store.

        Args:
          folder: The folder `create` wrote.
          writable: False for a reader: nothing in the folder changes
            (`snapshot` only).

        Raises:
          StoreError: If the folder holds no complete store.
        """
        self.folder = pathlib.Path(folder)
        try:
            meta = json.loads((self.folder / _META).read_text(encoding='utf-8'))
            self.store_id = int(meta['store_id'])
            self.layout = [(name, tuple(shape), np.dtype(dtype))
                           for name, shape, dtype in meta['arrays']]
            self.arrays = {name: np.lib.format.open_memmap(
                self.folder / f'{name}.npy', 'r+' if writable else 'r')
                           for name, _, _ in self.layout}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreError(f'{self.folder}: no readable user-state store ({e})') from None
        # A round's rows go through the files (pread/pwrite), not the
        # mappings: a fault on a mapping maps the whole page-cache folio
        # around a row (about 1 GB of resident file pages for 1,000 random
        # rows of 2,000,000), the files' reads only the rows.
        self._files = {}
        for name, shape, dtype in self.layout:
            table = self.arrays[name]
            self._files[name] = (
                os.open(self.folder / f'{name}.npy', os.O_RDWR if writable else os.O_RDONLY),
                table.offset, table.itemsize * int(np.prod(shape, dtype=np.int64)))
        self.journal = user_state_journal.Journal(self.folder / _JOURNAL, writable=writable)
        self._writable = writable
        marks = self.journal.marks()
        if not marks:
            raise StoreError(f'{self.folder}: the user-state journal has no version')
        self.version = marks[-1].value
        # Records after the last mark: rows changed since (a crash's work).
        self.dirty = self.journal.records[-1].kind != user_state_journal.MARK

    @classmethod
    def exists(cls, folder: str | os.PathLike) -> bool:
        """Whether `folder` holds a complete store (its meta file is written last)."""
        return (pathlib.Path(folder) / _META).is_file()

    @classmethod
    def create(cls, folder: str | os.PathLike, layout: Layout, num_users: int,
               fill: Callable[[str, Callable[[int, np.ndarray], None]], None] | None = None
               ) -> 'DiskStore':
        """Writes a new store (replacing any in `folder`) at version 0.

        Args:
          folder: Where (created if missing).
          layout: `(name, row shape, dtype)` of each array.
          num_users: Rows.
          fill: Called with each array's name and a `write(first_row, rows)`
            function to write its initial values (rows not written, and
            arrays of no `fill`: zeros). Writes go through the file, not a
            mapping: the process's resident memory stays small.

        Returns:
          The opened store.
        """
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _META).unlink(missing_ok=True)  # Incomplete until rewritten.
        (folder / _JOURNAL).unlink(missing_ok=True)
        for name, shape, dtype in layout:
            path = folder / f'{name}.npy'
            # The header, then a file that reads as zeros without being written.
            table = np.lib.format.open_memmap(path, 'w+', np.dtype(dtype), (num_users, *shape))
            offset, row_bytes = table.offset, table.itemsize * int(np.prod(shape, dtype=np.int64))
            del table
            if fill is not None:
                with open(path, 'r+b') as f:
                    def write(first, rows, f=f, dtype=dtype, offset=offset, row_bytes=row_bytes):
                        f.seek(offset + first * row_bytes)
                        f.write(np.ascontiguousarray(rows, dtype).tobytes())
                    fill(name, write)
                    f.flush()
                    os.fsync(f.fileno())
        journal = user_state_journal.Journal(folder / _JOURNAL)
        journal.append_mark(0)
        journal.close()
        meta = {'format': 1, 'store_id': secrets.randbits(62),
                'arrays': [[name, list(shape), np.dtype(dtype).str] for name, shape, dtype in layout]}
        temporary = folder / (_META + '.tmp')
        temporary.write_text(json.dumps(meta) + '\n', encoding='utf-8')
        os.replace(temporary, folder / _META)
        return cls(folder)

    def _row_layout(self):
        return [(shape, dtype) for _, shape, dtype in self.layout]

    def _read(self, name: str, index: np.ndarray) -> np.ndarray:
        fd, offset, row_bytes = self._files[name]
        _, shape, dtype = next(entry for entry in self.layout if entry[0] == name)
        out = np.empty((len(index), *shape), dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        for k, row in enumerate(index.tolist()):
            os.preadv(fd, [view[k * row_bytes:(k + 1) * row_bytes]], offset + row * row_bytes)
        return out

    def _write(self, name: str, index: np.ndarray, rows: np.ndarray) -> None:
        fd, offset, row_bytes = self._files[name]
        dtype = self.arrays[name].dtype
        view = memoryview(np.ascontiguousarray(rows, dtype).reshape(-1).view(np.uint8))
        for k, row in enumerate(index.tolist()):
            os.pwrite(fd, view[k * row_bytes:(k + 1) * row_bytes], offset + row * row_bytes)

    def gather(self, users, names=None):
        index = np.asarray(users, np.int64)
        return {name: self._read(name, index) for name in names or self.arrays}

    def scatter(self, users, rows) -> None:
        index = np.asarray(users, np.int64)
        # The rows' old values are on disk (synced) before any is overwritten.
        self.journal.append_undo(index, [self._read(name, index) for name, _, _ in self.layout])
        self.dirty = True
        for name in self.arrays:
            self._write(name, index, np.broadcast_to(rows[name], (len(index),
                                                                  *self.arrays[name].shape[1:])))

    def _sync(self) -> None:
        for fd, _, _ in self._files.values():
            os.fsync(fd)

    def mark(self) -> int:
        """Syncs the arrays and records their state as a new version
        (the same version when nothing changed since the last).

        Returns:
          The version a checkpoint records.
        """
        if not self.dirty:
            return self.version
        self._sync()
        self.version += 1
        self.journal.append_mark(self.version)
        self.dirty = False
        marks = self.journal.marks()
        if len(marks) > KEEP_MARKS:
            self.journal.drop_before(marks[-KEEP_MARKS])
        return self.version

    def _mark_of(self, version: int):
        marks = [m for m in self.journal.marks() if m.value == version]
        if not marks:
            kept = ', '.join(str(m.value) for m in self.journal.marks())
            raise StoreError(f'{self.folder}: version {version} of the user states is no '
                             f'longer in the journal (it keeps versions {kept})')
        return marks[-1]

    def _undo_records(self, version: int):
        """The undo records after `version`'s mark, newest first."""
        mark = self._mark_of(version)
        after = self.journal.records[self.journal.records.index(mark) + 1:]
        return mark, [r for r in reversed(after) if r.kind == user_state_journal.UNDO]

    def rollback(self, version: int) -> None:
        """Restores the arrays of `version` in place and forgets later records
        (what a resume does: rows written after that checkpoint are undone).

        Raises:
          StoreError: If the journal no longer holds `version`.
        """
        mark, records = self._undo_records(version)
        layout = self._row_layout()
        for record in records:
            index, rows = self.journal.read_undo(record, layout)
            for (name, _, _), old in zip(self.layout, rows):
                self._write(name, index, old)
        self._sync()
        self.journal.truncate_after(mark)
        self.version, self.dirty = version, False

    def snapshot(self, version: int) -> dict[str, np.ndarray]:
        """The arrays of `version` in memory, leaving the files as they are
        (what a reader of an older checkpoint needs).

        Raises:
          StoreError: If the journal no longer holds `version`.
        """
        _, records = self._undo_records(version)
        out = {name: np.array(table) for name, table in self.arrays.items()}
        layout = self._row_layout()
        for record in records:
            index, rows = self.journal.read_undo(record, layout)
            for (name, _, _), old in zip(self.layout, rows):
                out[name][index] = old
        return out

    def close(self) -> None:
        """Syncs the arrays and closes their files and the journal."""
        if self._writable:
            self._sync()
        for fd, _, _ in self._files.values():
            os.close(fd)
        self._files = {}
        self.journal.close()
