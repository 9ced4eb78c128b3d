"""Split files on disk and the cache that reuses them.

Layout of an output folder (format 3):

- ``<array>.npy``, one per index array of the split (``train_users``,
  ``train_items``, ``test_items``, ``test_negatives`` and, with validation,
  ``valid_items``, ``valid_negatives``): int32 numpy arrays, read back
  memory-mapped, so a reload costs a check of the bytes, not a parse.
- ``users.csv``: header ``user,original_id``; the original id of every user
  index, in index order.
- ``items.csv``: header ``item,original_id``; the same for the items (items
  past the last row were never seen in the data; Amazon-Video's fixed count).
- With ``csv=True`` (`write_split`), text copies of the arrays:
  ``train.csv`` (header ``user,item``, one line per training row, duplicates
  kept, in the split's order), ``test.csv`` (header
  ``user,item,neg_1,...,neg_K``, one line per user in user order) and
  ``valid.csv`` (same format, with validation).
- ``meta.json``: format version, the cache key (dataset, options, fingerprint
  of the raw input), statistics, the type of the original ids (``int`` or
  ``str``) and the SHA-1 of every file above.

``meta.json`` is written last and removed first, so an interrupted write never
looks like a valid cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np
import pandas as pd

from tff_fedrecgel.data import split as split_lib
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.errors import DataError

PathLike = Union[str, os.PathLike]

# 2: the id maps (users.csv, items.csv); 3: the arrays as .npy, CSV optional.
FORMAT_VERSION = 3
TRAIN_FILE = 'train.csv'
TEST_FILE = 'test.csv'
VALID_FILE = 'valid.csv'
USERS_FILE = 'users.csv'
ITEMS_FILE = 'items.csv'
META_FILE = 'meta.json'
CSV_FILES = (TRAIN_FILE, TEST_FILE, VALID_FILE)
# The index arrays of a split, one .npy file each.
ARRAY_FIELDS = ('train_users', 'train_items', 'test_items', 'test_negatives',
                'valid_items', 'valid_negatives')
# Id map files: (file, index column, Split field).
_ID_MAPS = ((USERS_FILE, 'user', 'user_ids'), (ITEMS_FILE, 'item', 'item_ids'))

_logger = logging.getLogger(__name__)


def file_fingerprint(path: PathLike) -> dict[str, Any]:
    """Identifies a raw input file by name, size, mtime and SHA-1.

    Args:
      path: The file.

    Returns:
      ``{'name', 'size', 'mtime_ns', 'sha1'}``.

    Raises:
      DataError: If the file cannot be read.
    """
    path = os.fspath(path)
    sha1 = hashlib.sha1()
    try:
        stat = os.stat(path)
        with open(path, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                sha1.update(chunk)
    except OSError as e:
        raise DataError(f'{path}: cannot read ({e.strerror or e})') from None
    return {
        'name': os.path.basename(path),
        'size': int(stat.st_size),
        'mtime_ns': int(stat.st_mtime_ns),
        'sha1': sha1.hexdigest(),
    }


_IDS_PER_CHUNK = 1 << 20


def split_fingerprint(split: Split) -> str:
    """A SHA-1 of a split's contents (sizes, every index array, the ids).

    Two splits with the same fingerprint train and evaluate the same: a run
    resumed on other data of the same shape is told apart by it.
    """
    sha1 = hashlib.sha1(f'{split.num_users} {split.num_items}'.encode())
    for name in ('train_users', 'train_items', 'test_items', 'test_negatives',
                 'valid_items', 'valid_negatives'):
        array = getattr(split, name)
        sha1.update(name.encode())
        if array is not None:  # Chunk by chunk: no copy of the whole array.
            for chunk in split_lib.array_chunks(array):
                sha1.update(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
    for ids in (split.user_ids, split.item_ids):
        if ids is None:
            continue
        # The ids joined by '\x1f', a million at a time (the same bytes).
        for start in range(0, len(ids), _IDS_PER_CHUNK):
            if start:
                sha1.update(b'\x1f')
            sha1.update('\x1f'.join(map(str, ids[start:start + _IDS_PER_CHUNK].tolist()))
                        .encode('utf-8', 'replace'))
    return sha1.hexdigest()


def _normalize(value: Any) -> Any:
    """Round-trips through JSON so that keys compare as stored."""
    return json.loads(json.dumps(value, sort_keys=True))


def _heldout_header(num_negatives: int) -> list[str]:
    return ['user', 'item'] + [f'neg_{k}' for k in range(1, num_negatives + 1)]


def _csv_bytes(columns: list[str], data: np.ndarray) -> bytes:
    buffer = io.StringIO()
    pd.DataFrame(data, columns=columns).to_csv(buffer, index=False)
    return buffer.getvalue().encode('ascii')


def _id_type(ids: np.ndarray) -> str:
    return 'int' if ids.dtype == np.int64 else 'str'


def _id_map_bytes(column: str, ids: np.ndarray) -> bytes:
    buffer = io.StringIO()
    pd.DataFrame({column: np.arange(len(ids)), 'original_id': ids}).to_csv(
        buffer, index=False)
    return buffer.getvalue().encode('utf-8')


def _read_id_map(path: str, data: bytes, column: str, id_type: str,
                 rows: int | None) -> np.ndarray:
    frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False,
                        encoding='utf-8')
    if list(frame.columns) != [column, 'original_id']:
        raise DataError(f'{path}: unexpected header')
    if rows is not None and len(frame) != rows:
        raise DataError(f'{path}: expected {rows} rows, found {len(frame)}')
    if not np.array_equal(frame[column].astype(np.int64), np.arange(len(frame))):
        raise DataError(f'{path}: {column}s out of order')
    if id_type == 'int':
        return frame['original_id'].astype(np.int64).to_numpy()
    if id_type == 'str':
        return frame['original_id'].to_numpy(dtype=object)
    raise DataError(f'{path}: unknown id type {id_type!r} in meta.json')


def _text_file_bytes(split: Split, csv: bool) -> dict[str, bytes]:
    """The id maps and, with ``csv``, the text copies of the arrays."""
    files = {}
    if csv:
        users = np.arange(split.num_users, dtype=np.int32)
        files[TRAIN_FILE] = _csv_bytes(
            ['user', 'item'],
            np.stack([split.train_users, split.train_items], axis=1))
        files[TEST_FILE] = _csv_bytes(
            _heldout_header(split.test_negatives.shape[1]),
            np.column_stack([users, split.test_items, split.test_negatives]))
        if split.has_validation:
            files[VALID_FILE] = _csv_bytes(
                _heldout_header(split.valid_negatives.shape[1]),
                np.column_stack([users, split.valid_items,
                                 split.valid_negatives]))
    for name, column, field in _ID_MAPS:
        ids = getattr(split, field)
        if ids is not None:
            files[name] = _id_map_bytes(column, ids)
    return files


class _HashingWriter:
    """A file that hashes what is written to it (for `np.lib.format`)."""

    def __init__(self, f):
        self._file = f
        self.sha1 = hashlib.sha1()

    def write(self, data) -> int:
        self.sha1.update(data)
        return self._file.write(data)


def _write_array(path: str, array: np.ndarray) -> str:
    """Writes ``array`` as ``.npy`` (atomically); returns its SHA-1."""
    tmp = f'{path}.tmp'
    try:
        with open(tmp, 'wb') as f:
            writer = _HashingWriter(f)
            np.lib.format.write_array(writer, np.ascontiguousarray(array),
                                      allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        raise DataError(f'{path}: cannot write ({e.strerror or e})') from None
    return writer.sha1.hexdigest()


def _array_file(field: str) -> str:
    return f'{field}.npy'


def _make_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise DataError(
            f'{output_dir}: cannot create the output directory '
            f'({e.strerror or e})') from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise DataError(f'{output_dir}: output directory is not writable')


def check_writable_dir(output_dir: str) -> None:
    """Checks that `output_dir` is, or can be created as, a writable folder,
    without creating anything.

    Raises:
      DataError: If it is a file, or its nearest existing parent is not a
        writable folder.
    """
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DataError(f'{output_dir}: not a directory (a file is in the way)')
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise DataError(f'{output_dir}: cannot create the output directory ({existing} '
                        'is not a directory)')
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DataError(f'{output_dir}: output directory is not writable' if existing == path
                        else f'{output_dir}: cannot create the output directory '
                        f'({existing} is not writable)')


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f'{path}.tmp'
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise DataError(f'{path}: cannot write ({e.strerror or e})') from None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise DataError(f'{path}: cannot remove ({e.strerror or e})') from None


def write_split(split: Split, output_dir: PathLike, *,
                key: Mapping[str, Any] | None = None,
                csv: bool = False) -> dict[str, Any]:
    """Writes the split files and ``meta.json``.

    Args:
      split: The split to write.
      output_dir: Folder to write into (created if missing).
      key: Cache key stored in ``meta.json`` (dataset, options, raw-input
        fingerprint); `load_or_compute` reuses the files only for an equal key.
      csv: Also write the text copies ``train.csv``, ``test.csv`` (and
        ``valid.csv``).

    Returns:
      The metadata written to ``meta.json``.

    Raises:
      DataError: If the folder cannot be created or written.
    """
    output_dir = os.fspath(output_dir)
    _make_dir(output_dir)
    meta_path = os.path.join(output_dir, META_FILE)
    _remove(meta_path)  # Invalidate first: a crash below leaves no cache.
    files = _text_file_bytes(split, csv)
    hashes = {}
    for field in ARRAY_FIELDS:
        path = os.path.join(output_dir, _array_file(field))
        array = getattr(split, field)
        if array is None:
            _remove(path)
        else:
            hashes[_array_file(field)] = _write_array(path, array)
    for name in CSV_FILES + (USERS_FILE, ITEMS_FILE):
        if name not in files:
            _remove(os.path.join(output_dir, name))
    for name, data in files.items():
        _write_atomic(os.path.join(output_dir, name), data)
        hashes[name] = hashlib.sha1(data).hexdigest()
    meta = {
        'format_version': FORMAT_VERSION,
        'key': _normalize(dict(key or {})),
        'statistics': split.summary(),
        'filtered': split.filtered,
        'num_items': int(split.num_items),
        'num_negatives': int(split.test_negatives.shape[1]),
        'id_types': {field: _id_type(getattr(split, field))
                     for _, _, field in _ID_MAPS
                     if getattr(split, field) is not None},
        'files': dict(sorted(hashes.items())),
    }
    _write_atomic(meta_path,
                  (json.dumps(meta, indent=2, sort_keys=True) + '\n').encode())
    return meta


def _check_sha1(path: str, sha1: str) -> None:
    digest = hashlib.sha1()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 22), b''):
            digest.update(chunk)
    if digest.hexdigest() != sha1:
        raise DataError(f'{path}: content does not match meta.json')


def _read_verified(path: str, sha1: str) -> bytes:
    with open(path, 'rb') as f:
        data = f.read()
    if hashlib.sha1(data).hexdigest() != sha1:
        raise DataError(f'{path}: content does not match meta.json')
    return data


def read_meta(output_dir: PathLike) -> dict[str, Any]:
    """Reads ``meta.json`` of a split folder.

    Args:
      output_dir: The split folder.

    Returns:
      The metadata.

    Raises:
      DataError: If it is missing, unreadable or of another format version.
    """
    path = os.path.join(os.fspath(output_dir), META_FILE)
    try:
        with open(path, encoding='utf-8') as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DataError(f'{path}: file not found') from None
    except (OSError, ValueError) as e:
        raise DataError(f'{path}: unreadable ({e})') from None
    if not isinstance(meta, dict) or (
            meta.get('format_version') != FORMAT_VERSION):
        raise DataError(f'{path}: not a split of format {FORMAT_VERSION}')
    return meta


def read_split(output_dir: PathLike) -> tuple[Split, dict[str, Any]]:
    """Reads a split written by `write_split`, verifying every file.

    The arrays are memory-mapped read-only: pages are read from the file
    when used, and nothing can change them.

    Args:
      output_dir: The split folder.

    Returns:
      ``(split, meta)``.

    Raises:
      DataError: If any file is missing, altered, truncated or inconsistent.
    """
    output_dir = os.fspath(output_dir)
    meta = read_meta(output_dir)
    try:
        stats = meta['statistics']
        num_users = int(stats['users'])
        hashes = meta['files']
        for name, sha1 in hashes.items():  # The text copies too.
            _check_sha1(os.path.join(output_dir, os.path.basename(name)), sha1)
        arrays = {}
        for field in ARRAY_FIELDS:
            name = _array_file(field)
            if name in hashes:
                arrays[field] = np.load(os.path.join(output_dir, name),
                                        mmap_mode='r', allow_pickle=False)
        if ('valid_items' in arrays) != (int(stats['valid_users']) > 0):
            raise DataError(f'{output_dir}: validation files do not match')
        id_maps = {}
        for name, column, field in _ID_MAPS:
            if name not in hashes:
                continue
            path = os.path.join(output_dir, name)
            id_maps[field] = _read_id_map(
                path, _read_verified(path, hashes[name]), column,
                meta['id_types'][field],
                num_users if field == 'user_ids' else None)
        split = Split(num_users=num_users, num_items=int(meta['num_items']),
                      num_interactions=int(stats['interactions']),
                      filtered=meta.get('filtered'), **arrays, **id_maps)
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(f'{e.filename}: file not found') from None
    except (OSError, KeyError, TypeError, ValueError,
            pd.errors.ParserError) as e:
        raise DataError(f'{output_dir}: unreadable split ({e})') from None
    if split.summary() != stats:
        raise DataError(f'{output_dir}: statistics do not match meta.json')
    return split, meta


def load_or_compute(output_dir: PathLike, *, key: Mapping[str, Any],
                    compute: Callable[[], Split],
                    csv: bool = False) -> tuple[Split, bool]:
    """Reuses the split in ``output_dir`` if its key matches, else computes it.

    Args:
      output_dir: Cache folder.
      key: Everything the split depends on (dataset, options, raw-input
        fingerprint); compared with the key stored in ``meta.json``.
      compute: Builds the split when the cache cannot be used.
      csv: The folder must also hold the text copies (`write_split`); a
        cache without them gets them written, from the cached arrays.

    Returns:
      ``(split, cached)``; ``cached`` is True when the files were reused.

    Raises:
      DataError: From ``compute`` or if the folder cannot be written.
    """
    output_dir = os.fspath(output_dir)
    key = _normalize(dict(key))
    if os.path.exists(os.path.join(output_dir, META_FILE)):
        try:
            meta = read_meta(output_dir)
            if meta.get('key') == key:
                split, _ = read_split(output_dir)
                _logger.info('Reusing the cached split in %s', output_dir)
                if csv and TRAIN_FILE not in meta['files']:
                    write_split(split, output_dir, key=key, csv=True)
                return split, True
            _logger.info('Cached split in %s is for other inputs; recomputing',
                         output_dir)
        except DataError as e:
            _logger.info('Cached split is unusable (%s); recomputing', e)
    # Fail on an unwritable folder before the work, creating nothing: bad
    # data must leave no folder behind.
    check_writable_dir(output_dir)
    split = compute()
    write_split(split, output_dir, key=key, csv=csv)
    return split, False
