r"""Builds (or reuses) the leave-one-out split files of a dataset.

Examples (from the repository root)::

    .venv/bin/python launch/prepare_data.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --output_dir=/tmp/ft
    .venv/bin/python -m tff_fedrecgel.launch.prepare_data --task=synthetic \
        --output_dir=/tmp/syn
    .venv/bin/python launch/prepare_data.py --task=csv --data_dir=my_log.tsv \
        --csv_sep=tab --csv_user_col=uid --csv_item_col=iid \
        --csv_timestamp_col=ts --output_dir=/tmp/mine

Writes the split's arrays (.npy), users.csv, items.csv, the text copies
train.csv, test.csv (valid.csv with --validation; --nowrite_csv leaves them
out, which saves most of the time at tens of millions of rows) and meta.json
to --output_dir, prints a short summary, and prints one JSON object with the
statistics as its last line. A second run with the same inputs reuses the
files. Does not import TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

if __package__ in (None, ''):
    # Run as `python launch/prepare_data.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel.launch import _entry
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

# --help lists the shared flags this script uses with its own.
flags.adopt_module_key_flags(_data_flags)

_TASK = flags.DEFINE_string(
    'task', None, f'Dataset task: one of {", ".join(tasks.TASK_NAMES)}.')
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Folder for the split files (created if missing).')
_WRITE_CSV = flags.DEFINE_boolean(
    'write_csv', True, 'Also write text copies of the split (train.csv, '
    'test.csv, valid.csv) next to its .npy arrays.')


def _summary_lines(name: str, stats: dict[str, int], output_dir: str,
                   cached: bool, seconds: float) -> list[str]:
    how = 'reused the cached split' if cached else 'computed the split'
    lines = [
        f'{name}: {how} in {seconds:.2f} s',
        (f"  users {stats['users']:,} | items {stats['items']:,} | "
         f"interactions {stats['interactions']:,} | train rows "
         f"{stats['train_interactions']:,} | test users "
         f"{stats['test_users']:,} | validation users "
         f"{stats['valid_users']:,}"),
        f'  files in {output_dir}',
    ]
    return lines


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if not _TASK.value:
        raise DataError('--task is required; choose one of '
                        f'{", ".join(tasks.TASK_NAMES)}')
    task = tasks.get_task(_TASK.value)
    if not _OUTPUT_DIR.value:
        raise DataError('--output_dir is required')
    output_dir = os.path.abspath(os.path.expanduser(_OUTPUT_DIR.value))
    data_dir = _data_flags.DATA_DIR.value
    if data_dir:
        data_dir = os.path.expanduser(data_dir)
    options = _data_flags.task_options(task)

    start = time.perf_counter()
    prepared = task.prepare(data_dir=data_dir, validation=_data_flags.VALIDATION.value,
                            cache_dir=output_dir, write_csv=_WRITE_CSV.value,
                            **options)
    seconds = time.perf_counter() - start
    stats = prepared.split.summary()
    for line in _summary_lines(task.name, stats, output_dir, prepared.cached,
                               seconds):
        print(line)
    if prepared.split.filter_line():
        print(f'  {prepared.split.filter_line()}')
    record = {'task': task.name, **stats, 'output_dir': output_dir,
              'cached': prepared.cached, 'validation': _data_flags.VALIDATION.value,
              'seconds': round(seconds, 3)}
    print(json.dumps(record), flush=True)
    return 0


if __name__ == '__main__':
    _entry.setup_environment()
    _entry.run_main(main)
