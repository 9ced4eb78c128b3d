"""Readers for the raw interaction files of the supported datasets.

Every loader returns a :class:`pandas.DataFrame` with exactly the columns
``user``, ``item`` (original ids) and ``timestamp`` (int64 or float64), one row
per raw interaction, in file order. No filtering happens here except the
optional rating threshold of the generic CSV reader; preprocessing (the >= 5
filter, re-indexing and the leave-one-out split) lives in ``preprocess.py``.

Every bad-input condition raises :class:`~tff_fedrecgel.errors.DataError` with
a one-line message that starts with the file path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Union

from absl import logging
import numpy as np
import pandas as pd

from tff_fedrecgel.errors import DataError

PathLike = Union[str, os.PathLike]
ColumnRef = Union[str, int, None]

RAW_COLUMNS = ('user', 'item', 'timestamp')

# FilmTrust has no timestamps; the reference preprocessing draws them from this
# seed (see `filmtrust_pseudo_timestamps`).
FILMTRUST_TIMESTAMP_SEED = 42
_FILMTRUST_BASE_HIGH = 1_000_000_000
_FILMTRUST_BASE_SCALE = 1_000_000

_INT_RE = r'[+-]?\d+'


def file_kind(path: PathLike) -> str | None:
    """What a path that is neither a folder nor a regular file is, in words
    ('a FIFO', 'a character device', ...), or None if it is one of those."""
    import stat  # pylint: disable=g-import-not-at-top

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISFIFO, 'a FIFO (named pipe)'),
                       (stat.S_ISCHR, 'a character device'),
                       (stat.S_ISBLK, 'a block device'), (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return name
    return None


def check_file(path: PathLike) -> str:
    """Checks that ``path`` is an existing, non-empty, readable regular file.

    Args:
      path: The file to check.

    Returns:
      The path as a string.

    Raises:
      DataError: If the file is missing, is a directory or another kind of
        file (a FIFO, a device), is empty or cannot be read.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f'{path}: file not found')
    if os.path.isdir(path):
        raise DataError(f'{path}: is a directory, expected a file')
    kind = file_kind(path)
    if kind is not None:
        raise DataError(f'{path}: is {kind}, expected a regular file')
    try:
        with open(path, 'rb') as f:
            first = f.read(1)
    except OSError as e:
        raise DataError(f'{path}: cannot read ({e.strerror or e})') from None
    if not first:
        raise DataError(f'{path}: file is empty')
    return path


def _first_line(message: str) -> str:
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return lines[-1] if lines else 'unreadable file'


def _read_table(path: str, *, sep: str, header: bool,
                engine: str | None = None) -> pd.DataFrame:
    """Reads a delimited text file with every field as a string.

    No line may have more fields than the first (the header, or the first
    row): the header is read as a row, so pandas cannot take a longer data
    row's first field as an index and shift the columns. With
    ``engine='python'`` a shorter line is refused too (pandas' C engine
    pads it with empty fields, which `_check_no_missing` then finds in the
    columns a loader uses).
    """
    try:
        frame = pd.read_csv(
            path,
            sep=sep,
            engine=engine,
            header=None,
            dtype=str,
            keep_default_na=False,
            skip_blank_lines=True,
        )
    except pd.errors.EmptyDataError:
        raise DataError(f'{path}: file is empty') from None
    except pd.errors.ParserError as e:
        raise DataError(f'{path}: cannot parse ({_first_line(e)})') from None
    except UnicodeDecodeError:
        raise DataError(f'{path}: not a UTF-8 text file') from None
    except (ValueError, OverflowError) as e:
        raise DataError(f'{path}: cannot parse ({_first_line(e)})') from None
    short = frame.isna().to_numpy()
    if short.any():
        row = int(np.flatnonzero(short.any(axis=1))[0])
        fields = int((~short[row]).sum())
        raise DataError(
            f'{path}: line {row + 1} has {fields} fields, the first line '
            f'{frame.shape[1]} (every line needs the same fields)')
    if header:
        names = [str(c).strip() for c in frame.iloc[0]]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise DataError(f'{path}: column {repeated[0]!r} appears twice in the header')
        frame = frame.iloc[1:].reset_index(drop=True)
        frame.columns = names
    if frame.empty:
        raise DataError(f'{path}: no data rows')
    return frame


def _line_number(position: int, header: bool) -> int:
    # 1-based line in the file; blank lines are not counted.
    return position + 1 + (1 if header else 0)


def _check_no_missing(frame: pd.DataFrame, path: str, header: bool) -> None:
    """Rejects rows with missing fields (short lines)."""
    missing = frame.isna() | frame.eq('')
    if missing.to_numpy().any():
        row, col = np.argwhere(missing.to_numpy())[0]
        raise DataError(
            f'{path}: missing value in column {frame.columns[col]!r} on line '
            f'{_line_number(int(row), header)}')


def _check_num_columns(frame: pd.DataFrame, path: str, names: Sequence[str],
                       ) -> None:
    if frame.shape[1] != len(names):
        raise DataError(
            f'{path}: expected {len(names)} columns ({", ".join(names)}), '
            f'found {frame.shape[1]}')


def _parse_int_ids(values: pd.Series, *, path: str, what: str,
                   header: bool) -> np.ndarray:
    """Parses integer ids, naming the first offending line on failure."""
    text = values.str.strip()
    ok = text.str.fullmatch(_INT_RE).to_numpy(dtype=bool)
    if not ok.all():
        row = int(np.flatnonzero(~ok)[0])
        raise DataError(
            f'{path}: non-numeric {what} {values.iloc[row]!r} on line '
            f'{_line_number(row, header)}')
    try:
        return text.astype(np.int64).to_numpy()
    except (OverflowError, ValueError):
        raise DataError(f'{path}: {what} out of the int64 range') from None


def _parse_any_ids(values: pd.Series, *, path: str, what: str,
                   header: bool) -> np.ndarray:
    """Keeps ids as strings unless every id is an integer.

    Integer-looking ids become int64 so that "sorted order of the original ids"
    is numeric (2 < 10), as it is for the reference preprocessing. If one of
    them does not fit in int64, the whole column stays text (sorted as text)
    and a warning names the first such id.
    """
    text = values.str.strip()
    if text.str.fullmatch(_INT_RE).all():
        try:
            return text.astype(np.int64).to_numpy()
        except (OverflowError, ValueError):
            row = next(i for i, v in enumerate(text)
                       if not -2**63 <= int(v) < 2**63)
            # The frame's index is the row's position in the file.
            logging.warning(
                '%s: %s %s on line %d does not fit in 64 bits, so every %s is '
                'read as text and ids are ordered as text (10 before 2)', path,
                what, text.iloc[row], _line_number(int(values.index[row]), header),
                what)
    return text.to_numpy(dtype=object)


def _parse_numbers(values: pd.Series, *, path: str, what: str,
                   header: bool) -> np.ndarray:
    """Parses a numeric column (int64 if all integral strings, else float64)."""
    text = values.str.strip()
    numbers = pd.to_numeric(text, errors='coerce')
    finite = np.isfinite(numbers.to_numpy(dtype=np.float64))
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise DataError(
            f'{path}: non-numeric {what} {values.iloc[row]!r} on line '
            f'{_line_number(row, header)}')
    if text.str.fullmatch(_INT_RE).all():
        try:
            return text.astype(np.int64).to_numpy()
        except (OverflowError, ValueError):
            pass
    return numbers.to_numpy(dtype=np.float64)


def _frame(users: np.ndarray, items: np.ndarray,
           timestamps: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({'user': users, 'item': items, 'timestamp': timestamps})


def _occurrence_index(users: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... for each user's rows, in row order."""
    return pd.Series(users).groupby(users, sort=False).cumcount().to_numpy(
        dtype=np.int64)


def filmtrust_pseudo_timestamps(users: np.ndarray, *,
                                seed: int = FILMTRUST_TIMESTAMP_SEED,
                                ) -> np.ndarray:
    """The seeded stand-in timestamps of the reference FilmTrust preprocessing.

    ``base = default_rng(seed).integers(0, 1e9, size=len(users))`` and
    ``timestamp = base * 1e6 + occurrence index of the row within its user``.
    The occurrence index only matters for exact ties of ``base``.

    Args:
      users: User id of every raw row, in file order.
      seed: Seed of ``numpy.random.default_rng``.

    Returns:
      int64 array of timestamps, one per row.
    """
    users = np.asarray(users)
    rng = np.random.default_rng(seed)
    base = rng.integers(0, _FILMTRUST_BASE_HIGH, size=len(users))
    return (base.astype(np.int64) * _FILMTRUST_BASE_SCALE
            + _occurrence_index(users))


def load_filmtrust(path: PathLike) -> pd.DataFrame:
    """Reads FilmTrust ``filmtrust-ratings.txt`` (``user item rating``).

    Args:
      path: The ratings file (whitespace separated, no header, integer ids).

    Returns:
      The raw interactions; timestamps are the seeded pseudo-timestamps of
      `filmtrust_pseudo_timestamps`, drawn over all raw rows in file order.

    Raises:
      DataError: On a missing, empty or malformed file.
    """
    path = check_file(path)
    frame = _read_table(path, sep=r'\s+', header=False)
    _check_num_columns(frame, path, ('user', 'item', 'rating'))
    _check_no_missing(frame, path, header=False)
    users = _parse_int_ids(frame[0], path=path, what='user id', header=False)
    items = _parse_int_ids(frame[1], path=path, what='item id', header=False)
    _parse_numbers(frame[2], path=path, what='rating', header=False)
    return _frame(users, items, filmtrust_pseudo_timestamps(users))


def load_lastfm_2k(path: PathLike) -> pd.DataFrame:
    """Reads LastFM-2K ``last-fm-2k-ratings.dat`` (``uid,iid,tagid,ts_ms``).

    Each row is one tag assignment; a (user, artist) pair may repeat and every
    row is kept, as in the reference preprocessing.

    Args:
      path: The CSV file (no header, integer ids, millisecond timestamps).

    Returns:
      The raw interactions.

    Raises:
      DataError: On a missing, empty or malformed file.
    """
    path = check_file(path)
    frame = _read_table(path, sep=',', header=False)
    _check_num_columns(frame, path, ('uid', 'iid', 'tagid', 'timestamp'))
    _check_no_missing(frame, path, header=False)
    users = _parse_int_ids(frame[0], path=path, what='user id', header=False)
    items = _parse_int_ids(frame[1], path=path, what='item id', header=False)
    timestamps = _parse_numbers(frame[3], path=path, what='timestamp',
                                header=False)
    return _frame(users, items, timestamps)


def load_amazon_video(path: PathLike) -> pd.DataFrame:
    """Reads Amazon-Video ``amazon-video-ratings.dat`` (``user,item,rating,t``).

    Args:
      path: The CSV file (no header, string ids, Unix-second timestamps).

    Returns:
      The raw interactions with string ids.

    Raises:
      DataError: On a missing, empty or malformed file.
    """
    path = check_file(path)
    frame = _read_table(path, sep=',', header=False)
    _check_num_columns(frame, path, ('user', 'item', 'rating', 'timestamp'))
    _check_no_missing(frame, path, header=False)
    timestamps = _parse_numbers(frame[3], path=path, what='timestamp',
                                header=False)
    return _frame(frame[0].str.strip().to_numpy(dtype=object),
                  frame[1].str.strip().to_numpy(dtype=object), timestamps)


def load_qb_article(path: PathLike) -> pd.DataFrame:
    """Reads Tenrec ``QB-article.csv`` (header with ``user_id,item_id``).

    Other columns are ignored. There is no timestamp: the row order within a
    user stands in for it (1, 2, 3, ...).

    Args:
      path: The CSV file.

    Returns:
      The raw interactions.

    Raises:
      DataError: On a missing, empty or malformed file or missing columns.
    """
    path = check_file(path)
    frame = _read_table(path, sep=',', header=True)
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in ('user_id', 'item_id') if c not in frame.columns]
    if missing:
        raise DataError(
            f'{path}: missing column(s) {", ".join(missing)} in the header '
            f'(found {", ".join(map(str, frame.columns))})')
    frame = frame[['user_id', 'item_id']]
    _check_no_missing(frame, path, header=True)
    users = _parse_any_ids(frame['user_id'], path=path, what='user id',
                           header=True)
    items = _parse_any_ids(frame['item_id'], path=path, what='item id',
                           header=True)
    return _frame(users, items, _occurrence_index(users) + 1)


def validate_raw(frame: pd.DataFrame, *, source: str) -> None:
    """Checks that a frame has the raw schema (used for user-built frames).

    Args:
      frame: A frame that should have ``user``, ``item`` and ``timestamp``.
      source: Name used in error messages.

    Raises:
      DataError: On missing columns, missing values or non-numeric timestamps.
    """
    missing = [c for c in RAW_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f'{source}: missing column(s) {", ".join(missing)}')
    if frame.empty:
        raise DataError(f'{source}: no interactions')
    if frame[list(RAW_COLUMNS)].isna().to_numpy().any():
        raise DataError(f'{source}: missing values in user/item/timestamp')
    if not pd.api.types.is_numeric_dtype(frame['timestamp']):
        raise DataError(f'{source}: timestamps must be numeric')


# The helpers the csv task's reader (csv_reader.py) shares.
INT_PATTERN = _INT_RE
read_table = _read_table
check_no_missing = _check_no_missing
parse_numbers = _parse_numbers
parse_any_ids = _parse_any_ids
occurrence_index = _occurrence_index
raw_frame = _frame

# `DataFrame.attrs` key of a reader's own row filter (csv's min_rating):
# {'min_rating', 'rows', 'users'} dropped, reported with the split's filters.
RATING_FILTER_ATTR = 'rating_filter'

_CSV_READER_NAMES = ('check_csv_options', 'load_csv', 'normalize_separator')


def __getattr__(name):
    # The generic reader of the csv task lives in csv_reader.py (it imports
    # this module, so it is looked up on first use).
    if name in _CSV_READER_NAMES:
        from tff_fedrecgel.data import csv_reader  # pylint: disable=g-import-not-at-top

        return getattr(csv_reader, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
