"""The disk store's undo journal: the rows a scatter overwrote, and marks.

An append-only file of records, each a 24-byte header (`<4sqqI`: kind,
value, payload bytes, CRC-32 of header fields and payload) then its payload:

* ``UNDO`` (value: rows; payload: the int64 row indices, then each array's
  rows as they were before the scatter, in the store's array order);
* ``MARK`` (value: a version; no payload): everything before it is the
  state of that version once the records after it are undone.

A record is written whole (one `write`) before the rows it saves are
overwritten, so a process killed at any point leaves either a complete
record or a torn last one, which `Journal` drops on opening. Imports no
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import os
import struct
import zlib

import numpy as np

_HEADER = struct.Struct('<4sqqI')
UNDO, MARK = b'UNDO', b'MARK'


@dataclasses.dataclass(frozen=True)
class Record:
    """One record of the journal.

    Attributes:
      kind: `UNDO` or `MARK`.
      value: Rows of an undo record, the version of a mark.
      offset: Where the record's header starts in the file.
      size: Header and payload bytes.
    """

    kind: bytes
    value: int
    offset: int
    size: int


def _crc(kind: bytes, value: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack('<4sqq', kind, value, len(payload))))


class Journal:
    """The undo journal of one store (`path`), opened for appending."""

    def __init__(self, path: str | os.PathLike, *, writable: bool = True):
        """Opens (or creates) the journal and drops a torn last record.

        Args:
          path: The journal file.
          writable: False for a reader: the file is left as it is (a run may
            be writing it).

        Raises:
          OSError: If the file cannot be opened.
        """
        self.path = os.fspath(path)
        self.records: list[Record] = []
        self._writable = writable
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY,
                           0o644)
        self._scan()

    def _scan(self) -> None:
        size = os.fstat(self._fd).st_size
        offset = 0
        with open(self.path, 'rb') as f:
            while offset + _HEADER.size <= size:
                f.seek(offset)
                kind, value, length, crc = _HEADER.unpack(f.read(_HEADER.size))
                if kind not in (UNDO, MARK) or offset + _HEADER.size + length > size:
                    break
                if _crc(kind, value, f.read(length)) != crc:
                    break
                self.records.append(Record(kind, value, offset, _HEADER.size + length))
                offset += _HEADER.size + length
        if offset != size and self._writable:
            # A write cut short: its rows were never overwritten.
            os.ftruncate(self._fd, offset)

    @property
    def end(self) -> int:
        """Bytes of complete records."""
        last = self.records[-1] if self.records else None
        return last.offset + last.size if last else 0

    def marks(self) -> list[Record]:
        """The marks, oldest first."""
        return [r for r in self.records if r.kind == MARK]

    def _append(self, kind: bytes, value: int, payload: bytes, sync: bool) -> None:
        header = _HEADER.pack(kind, value, len(payload), _crc(kind, value, payload))
        offset = self.end
        data = header + payload
        written = os.pwrite(self._fd, data, offset)
        if written != len(data):
            raise OSError(f'{self.path}: short write ({written} of {len(data)} bytes)')
        if sync:
            os.fsync(self._fd)
        self.records.append(Record(kind, value, offset, len(data)))

    def append_undo(self, index: np.ndarray, rows: Sequence[np.ndarray]) -> None:
        """Saves rows about to be overwritten (synced before returning).

        Args:
          index: int64 row indices.
          rows: Each array's current rows at `index`, in the store's order.
        """
        payload = b''.join([np.ascontiguousarray(index, np.int64).tobytes()]
                           + [np.ascontiguousarray(r).tobytes() for r in rows])
        self._append(UNDO, len(index), payload, sync=True)

    def append_mark(self, version: int) -> None:
        """Marks the state so far as `version` (synced)."""
        self._append(MARK, version, b'', sync=True)

    def read_undo(self, record: Record, layout: Sequence[tuple[tuple[int, ...], np.dtype]]
                  ) -> tuple[np.ndarray, list[np.ndarray]]:
        """An undo record's indices and rows.

        Args:
          record: An `UNDO` record of `records`.
          layout: Each array's row shape and dtype, in the store's order.

        Returns:
          `(index, rows)`.
        """
        n = record.value
        data = os.pread(self._fd, record.size - _HEADER.size, record.offset + _HEADER.size)
        index = np.frombuffer(data, np.int64, n)
        at, rows = 8 * n, []
        for shape, dtype in layout:
            count = n * int(np.prod(shape, dtype=np.int64))
            rows.append(np.frombuffer(data, dtype, count, at).reshape((n, *shape)))
            at += count * np.dtype(dtype).itemsize
        return index, rows

    def truncate_after(self, record: Record) -> None:
        """Drops every record after `record` (synced)."""
        keep = self.records.index(record) + 1
        os.ftruncate(self._fd, record.offset + record.size)
        os.fsync(self._fd)
        del self.records[keep:]

    def drop_before(self, record: Record) -> None:
        """Drops every record before `record`: the file is rewritten from it
        under a temporary name and renamed over the journal."""
        start = record.offset
        if start == 0:
            return
        temporary = self.path + '.tmp'
        with open(temporary, 'wb') as out:
            at, end = start, self.end
            while at < end:
                chunk = os.pread(self._fd, min(1 << 24, end - at), at)
                out.write(chunk)
                at += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self.records = [dataclasses.replace(r, offset=r.offset - start)
                        for r in self.records if r.offset >= start]

    def close(self) -> None:
        """Closes the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
