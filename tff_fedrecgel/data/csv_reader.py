"""The reader of the `csv` task: any delimited file of interactions.

Rules (docs/DATA.md, "Bring your own CSV"):

* the separator is a literal string (a few names such as ``tab`` and
  ``space`` are aliases), never a regular expression;
* every line has as many fields as the first (the header, or with
  ``header=False`` the first row);
* without a header, a first row whose id is text while every other row's is
  an integer is a header read as data, and is refused;
* ids: a column whose every (kept) id is an integer of at most 64 bits is
  read as integers and ordered numerically; otherwise the whole column is
  text, ordered as text. The user and the item column are decided apart.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tff_fedrecgel.data import loaders
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import OptionError

_SEPARATOR_ALIASES = {
    'tab': '\t',
    '\\t': '\t',
    'comma': ',',
    'semicolon': ';',
    'space': r'\s+',
    'whitespace': r'\s+',
}
# Characters that would end a field or a line in the middle of one.
_BAD_SEPARATOR_CHARS = ('\n', '\r', '"')
_COLUMN_OPTIONS = ('user_col', 'item_col', 'timestamp_col', 'rating_col')


def normalize_separator(sep: str) -> str:
    """The `pandas.read_csv` separator of a command-line spelling.

    Aliases (``tab``, ``\\t``, ``space``, ...) map to their separator; any
    other string is taken literally (escaped, as pandas reads a separator
    of more than one character as a regular expression).

    Args:
      sep: A separator or one of its aliases.

    Returns:
      The separator to pass to pandas.

    Raises:
      DataError: If `sep` is empty or holds a newline or a quote.
    """
    if not isinstance(sep, str) or not sep:
        raise DataError(f'csv separator must be a non-empty string, got {sep!r}')
    if sep.lower() in _SEPARATOR_ALIASES:
        return _SEPARATOR_ALIASES[sep.lower()]
    if any(c in sep for c in _BAD_SEPARATOR_CHARS):
        raise DataError(f'csv separator must not hold a newline or a quote, got {sep!r}')
    return sep if len(sep) == 1 else re.escape(sep)


def check_csv_options(options: Mapping[str, Any]) -> None:
    """Checks the types of the csv task's reader options.

    Raises:
      OptionError: On an option of the wrong type or a non-finite rating.
    """
    sep = options.get('sep', ',')
    try:
        normalize_separator(sep)
    except DataError as e:
        raise OptionError('csv', 'sep', str(e).split('csv separator ', 1)[-1]) from None
    if not isinstance(options.get('header', True), (bool, np.bool_)):
        raise OptionError('csv', 'header', f'must be a bool, got {options["header"]!r}')
    for name in _COLUMN_OPTIONS:
        value = options.get(name)
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, (str, numbers.Integral))):
            raise OptionError('csv', name, f'must be a column name or number, got {value!r}')
    rating = options.get('min_rating')
    if rating is not None:
        if isinstance(rating, bool) or not isinstance(rating, numbers.Real) or (
                not math.isfinite(rating)):
            raise OptionError('csv', 'min_rating', f'must be a finite number, got {rating!r}')
        if options.get('rating_col') is None:
            raise OptionError('csv', 'min_rating', 'needs a rating column (rating_col)')


def _resolve_column(frame: pd.DataFrame, ref, *, path: str, header: bool,
                    role: str) -> str | int:
    """Finds a column by name (header) or 0-based position (no header)."""
    if header:
        name = str(ref).strip()
        if name not in frame.columns:
            raise DataError(
                f'{path}: no {role} column {name!r} (found '
                f'{", ".join(map(str, frame.columns))})')
        return name
    text = str(ref).strip()
    if not re.fullmatch(r'\d+', text):
        raise DataError(
            f'{path}: the file has no header, so the {role} column must be a '
            f'0-based column number, got {ref!r}')
    index = int(text)
    if index >= frame.shape[1]:
        raise DataError(
            f'{path}: {role} column {index} does not exist (the file has '
            f'{frame.shape[1]} columns)')
    return index


def _check_not_a_header(used: pd.DataFrame, path: str) -> None:
    """Refuses a first row that reads as a header (header=False)."""
    if len(used) < 2:
        return
    for role in ('user', 'item'):
        text = used[role].str.strip()
        integral = text.str.fullmatch(loaders.INT_PATTERN).to_numpy(dtype=bool)
        if not integral[0] and integral[1:].all():
            raise DataError(
                f'{path}: line 1 looks like a header ({role} {used[role].iloc[0]!r} is '
                f'text, every other {role} id a number); read it as one (csv '
                'header on, the default) or remove the line')


def _engine_checking_fields(path: str, sep: str) -> str | None:
    """The pandas engine to read `path` with, after checking field counts.

    pandas' C engine pads a short line with empty fields; lines without
    quotes are counted here, and a file with quotes is read by the Python
    engine, which marks short lines (slower, but quotes are rare).
    """
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except UnicodeDecodeError:
        raise DataError(f'{path}: not a UTF-8 text file') from None
    pandas_sep = normalize_separator(sep)
    if '"' in text:
        return 'python'
    lines = (line for line in text.splitlines() if line.strip())
    if pandas_sep == r'\s+':
        counts = (len(line.split()) for line in lines)
    else:
        literal = _SEPARATOR_ALIASES.get(sep.lower(), sep)
        counts = (line.count(literal) + 1 for line in lines)
    first = None
    for number, count in enumerate(counts, start=1):
        if first is None:
            first = count
        elif count != first:
            raise DataError(f'{path}: line {number} has {count} fields, the first line '
                            f'{first} (every line needs the same fields)')
    return None if len(pandas_sep) == 1 or pandas_sep == r'\s+' else 'python'


def load_csv(path, *, sep: str = ',', header: bool = True, user_col=None,
             item_col=None, timestamp_col=None, rating_col=None,
             min_rating: float | None = None) -> pd.DataFrame:
    """Reads a user-supplied interaction file (the rules of this module).

    Args:
      path: The delimited text file.
      sep: Field separator, literal (``tab``, ``\\t``, ``space`` are aliases).
      header: Whether the first line holds column names. Without a header the
        column arguments are 0-based column numbers.
      user_col: User id column (default ``user``, or column 0 without header).
      item_col: Item id column (default ``item``, or column 1 without header).
      timestamp_col: Optional numeric timestamp column. Without it, the row
        order within a user stands in (1, 2, 3, ...).
      rating_col: Optional numeric rating column.
      min_rating: If set, only rows with ``rating >= min_rating`` are kept as
        implicit positives (requires ``rating_col``).

    Returns:
      The raw interactions. A column whose ids are all integers becomes
      int64, otherwise it stays strings.

    Raises:
      DataError: On a missing, empty or malformed file, lines with another
        number of fields, unknown columns, a header read as data,
        non-numeric timestamps/ratings or when no row passes the threshold.
    """
    path = loaders.check_file(path)
    if min_rating is not None and rating_col is None:
        raise DataError(f'{path}: min_rating needs a rating column')
    frame = loaders.read_table(path, sep=normalize_separator(sep), header=header,
                               engine=_engine_checking_fields(path, sep))
    user_col = _resolve_column(
        frame, ('user' if header else 0) if user_col is None else user_col,
        path=path, header=header, role='user')
    item_col = _resolve_column(
        frame, ('item' if header else 1) if item_col is None else item_col,
        path=path, header=header, role='item')
    wanted = {'user': user_col, 'item': item_col}
    if timestamp_col is not None:
        wanted['timestamp'] = _resolve_column(
            frame, timestamp_col, path=path, header=header, role='timestamp')
    if rating_col is not None:
        wanted['rating'] = _resolve_column(
            frame, rating_col, path=path, header=header, role='rating')
    used = frame[list(wanted.values())]
    used.columns = list(wanted)
    loaders.check_no_missing(used, path, header=header)
    if not header:
        _check_not_a_header(used, path)

    keep = np.ones(len(used), dtype=bool)
    if rating_col is not None:
        ratings = loaders.parse_numbers(used['rating'], path=path, what='rating',
                                        header=header)
        if min_rating is not None:
            keep = ratings >= min_rating
            if not keep.any():
                raise DataError(f'{path}: no row has rating >= {min_rating:g}')
    timestamps = None
    if 'timestamp' in wanted:
        timestamps = loaders.parse_numbers(used['timestamp'], path=path,
                                           what='timestamp', header=header)[keep]
    users_read = used['user'].nunique() if min_rating is not None else 0
    used = used[keep]
    users = loaders.parse_any_ids(used['user'], path=path, what='user id', header=header)
    items = loaders.parse_any_ids(used['item'], path=path, what='item id', header=header)
    if timestamps is None:
        timestamps = loaders.occurrence_index(users) + 1
    raw = loaders.raw_frame(users, items, timestamps)
    if min_rating is not None:
        raw.attrs[loaders.RATING_FILTER_ATTR] = {
            'min_rating': float(min_rating), 'rows': int((~keep).sum()),
            'users': int(users_read - raw['user'].nunique())}
    return raw
