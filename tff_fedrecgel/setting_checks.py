"""Type and range checks of the run settings (`run_settings.Settings`).

Each numeric setting's range and each list setting's entries are written
here once; the settings, their flags and `--help` read them. Imports no
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from tff_fedrecgel import sizes
from tff_fedrecgel.errors import SettingError

MAX_SEED = 2**32 - 1  # TFF's client sampling seeds numpy's RandomState.


# 32-bit signed integers: what TensorFlow's counters and loop bounds hold.
INT32_MAX = 2**31 - 1
# Rounds a run may ask for (a round takes at least milliseconds).
MAX_ROUNDS = 1_000_000
# Local work per user and round: beyond these a round or an evaluation runs
# for hours without changing the model any more.
MAX_LOCAL_EPOCHS = 1_000
MAX_RECONSTRUCTION_STEPS = 10_000
# HR@K past this many items says nothing a user would see.
MAX_TOP_K = 1_000

# Each numeric setting's range: (lowest, lowest allowed itself, highest).
RANGES = {
    'total_rounds': (1, True, MAX_ROUNDS),
    **dict.fromkeys(('rounds_per_eval', 'rounds_per_full_eval', 'clients_per_round',
                     'max_group_examples', 'early_stopping_patience', 'eval_users'),
                    (1, True, INT32_MAX)),
    'local_epochs': (1, True, MAX_LOCAL_EPOCHS),
    'reconstruction_steps': (1, True, MAX_RECONSTRUCTION_STEPS),
    **dict.fromkeys(('rounds_per_checkpoint', 'num_negatives'), (0, True, INT32_MAX)),
    **dict.fromkeys(('rho_sh', 'rho_ns'), (0, True, None)),
    'client_fraction': (0, False, 1),
    **dict.fromkeys(('local_lr', 'server_lr', 'client_lr', 'sharpness_probe'),
                    (0, False, None)),
    'seed': (0, True, MAX_SEED),
    'heldout_users': (0, True, 0.9),
    'data_seed': (0, True, MAX_SEED),
    **dict.fromkeys(('gmf_dim', 'mlp_dim'), (1, True, sizes.MAX_WIDTH)),
    'chunk_size': (1, True, INT32_MAX),
    'eval_negatives': (1, True, INT32_MAX),
}
# Settings that are lists of ints: (what each entry is, lowest, highest).
INT_LISTS = {'mlp_layers': ('width', 1, sizes.MAX_WIDTH),
             'top_ks': ('cut-off', 1, MAX_TOP_K)}


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
