"""What a checkpoint belongs to: the run's settings and its data.

Every program state the training program saves carries a record (one JSON
string): the run's settings as `hparams.json` holds them and the
fingerprint of its split (`split_io.split_fingerprint`). Before a resume
uses a checkpoint, its record is compared with the command's settings and
data, so a run can never continue on other data or with other settings,
whatever `hparams.json` says (it may be deleted or edited by hand).
Checkpoints of older versions have no record: they resume as before.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from tff_fedrecgel.program.outputs import RESUMABLE_CHANGES

RECORD_KEY = 'run_record'


class RunRecordError(ValueError):
    """A checkpoint made with other settings or on other data (one line)."""


def make_record(hparams: Mapping[str, Any], data_fingerprint: str) -> np.ndarray:
    """The record to save with a program state (a scalar string array)."""
    return np.array(json.dumps({'hparams': dict(hparams), 'data': data_fingerprint},
                               sort_keys=True, default=str))


def parse_record(value: Any) -> dict[str, Any] | None:
    """A saved record back as a dict (None if absent or unreadable)."""
    if value is None:
        return None
    value = value.item() if isinstance(value, np.ndarray) else value
    if hasattr(value, 'numpy'):
        value = value.numpy()
    if isinstance(value, bytes):
        value = value.decode('utf-8', 'replace')
    try:
        record = json.loads(value)
    except (TypeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_record(checkpoint: pathlib.Path) -> dict[str, Any] | None:
    """The record of a saved program state, without knowing its structure.

    Returns:
      The record, or None for a state of an older version (or one that
      cannot be read; the structured load then says why).
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    try:
        state = tf.saved_model.load(str(checkpoint))()
    except Exception:  # pylint: disable=broad-except
        return None
    if not isinstance(state, Mapping) or RECORD_KEY not in state:
        return None
    return parse_record(state[RECORD_KEY])


def differences(record: Mapping[str, Any], hparams: Mapping[str, Any],
                data_fingerprint: str) -> list[str]:
    """What differs between a checkpoint's record and the run, in words
    (a setting added since the record was made counts at its default)."""
    from tff_fedrecgel import run_settings  # pylint: disable=g-import-not-at-top

    out = []
    if record.get('data') not in (None, data_fingerprint):
        out.append('the data (the split differs from the one it was trained on)')
    saved = record.get('hparams') or {}
    if saved and hparams:
        for key in sorted(set(saved) | set(hparams)):
            if key in RESUMABLE_CHANGES:
                continue
            # JSON turned tuples into lists and non-JSON values into text.
            now = json.loads(json.dumps(hparams.get(key), default=str))
            before = saved[key] if key in saved else run_settings.recorded_default(key)
            if before != now:
                out.append(f'{key} ({before!r} in the checkpoint, {now!r} now)')
    return out


def check(record: Mapping[str, Any] | None, *, hparams: Mapping[str, Any],
          data_fingerprint: str, round_num: int, root: pathlib.Path) -> None:
    """Refuses to resume from a checkpoint of another run.

    Raises:
      RunRecordError: If its settings or data differ (naming what differs).
    """
    if record is None:
        return
    changed = differences(record, hparams, data_fingerprint)
    if changed:
        raise RunRecordError(
            f'{root}: the checkpoint of round {round_num} belongs to another run: '
            f'{"; ".join(changed)}; run the command it was made with, or use another '
            '--experiment_name')
