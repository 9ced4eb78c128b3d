"""Type and range checks of the run settings (`run_settings.Settings`).

Each setting's range, entries and choices are `settings_tree`'s; the
checks are written here once, for the run settings and for the client
work's and the server's configurations. Imports no
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from tff_fedrecgel import settings_tree
from tff_fedrecgel.errors import SettingError

MAX_SEED = settings_tree.MAX_SEED
# Each numeric setting's range: (lowest, lowest allowed itself, highest).
RANGES = settings_tree.ranges()
# Settings that are lists of ints: (what each entry is, lowest, highest).
INT_LISTS = settings_tree.int_lists()
# Settings with a list of allowed values.
CHOICES = settings_tree.choices()


def check_type(name: str, value: Any, kind: str) -> None:
    """Refuses a value that is not of `kind` ('int', 'float', 'str', 'bool').

    An int passes as a float; a bool passes only as a bool (True is not 1).

    Raises:
      SettingError: If `value` is of another type.
    """
    if kind == 'bool':
        ok = isinstance(value, (bool, np.bool_))
    elif isinstance(value, (bool, np.bool_)):
        ok = False
    elif kind == 'int':
        ok = isinstance(value, numbers.Integral)
    elif kind == 'float':
        ok = isinstance(value, numbers.Real)
    else:
        ok = isinstance(value, str)
    if not ok:
        article = 'an' if kind == 'int' else 'a'
        what = {'int': 'integer', 'float': 'number', 'str': 'string', 'bool': 'bool'}[kind]
        raise SettingError(name, f'must be {article} {what}', value)


def check_range(name: str, value: Any) -> None:
    """Refuses NaN, infinities and values out of `name`'s range (None passes).

    Raises:
      SettingError: If `value` is out of range.
    """
    if value is None or name not in RANGES:
        return
    low, low_inclusive, high = RANGES[name]
    if isinstance(value, numbers.Real) and not math.isfinite(value):
        raise SettingError(name, 'must be a finite number', value)
    if value < low if low_inclusive else value <= low:
        raise SettingError(name, f'must be {">=" if low_inclusive else ">"} {low}', value)
    if high is not None and value > high:
        raise SettingError(name, f'must be <= {high}', value)


def check_choice(name: str, value: Any) -> None:
    """Refuses a value outside `name`'s choices (other names pass).

    Raises:
      SettingError: If `value` is not one of the choices.
    """
    if name in CHOICES and value not in CHOICES[name]:
        raise SettingError(name, f'must be one of {CHOICES[name]}', value)


def check_config(config: Any) -> None:
    """Checks every field of a configuration dataclass that is a setting
    (`algorithm_config.ClientWorkConfig`, `ServerConfig`): its choices and
    range, the same rules as the run settings'.

    Raises:
      SettingError: On the first field out of its choices or range.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        check_choice(field.name, value)
        check_range(field.name, value)


def field_kind(field: dataclasses.Field) -> tuple[str | None, bool]:
    """(kind for `check_type`, whether None is allowed) of a field's annotation."""
    parts = [p.strip() for p in str(field.type).split('|')]
    kind = parts[0] if parts[0] in ('int', 'float', 'str', 'bool') else None
    return kind, 'None' in parts


def int_list(name: str, value: Any) -> tuple[int, ...]:
    """A list setting (`INT_LISTS`) as a tuple of ints, checked.

    Accepts a sequence of ints or of strings of digits (a flag's `a,b,c`).

    Raises:
      SettingError: On an empty list, an entry that is not an integer, or
        one out of range.
    """
    what, low, high = INT_LISTS[name]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise SettingError(name, f'must be a non-empty list of integers (a {what} each)',
                           value)
    out = []
    for entry in value:
        if isinstance(entry, str) and entry.strip().lstrip('-').isdigit():
            entry = int(entry)
        if isinstance(entry, (bool, np.bool_)) or not isinstance(entry, numbers.Integral):
            raise SettingError(name, f'must be integers, comma-separated ({entry!r} is not one)',
                               ','.join(map(str, value)))
        if not low <= entry <= high:
            raise SettingError(name, f'must be in [{low}, {high}] each ({entry} is not)',
                               ','.join(map(str, value)))
        out.append(int(entry))
    return tuple(out)
