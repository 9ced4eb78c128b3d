"""Dataset flags shared by the entry points (prepare_data, train, benchmark)."""

from __future__ import annotations

from typing import Any

from absl import flags

from tff_fedrecgel import tasks
from tff_fedrecgel.launch import _tree_flags
from tff_fedrecgel.errors import DataError

# The recorded data settings and the cache (`settings_tree`'s 'data' leaf);
# the task's reader options below are the tasks'.
FLAGS = _tree_flags.define('data', __name__)
DATA_DIR = FLAGS['data_dir']
VALIDATION = FLAGS['validation']
CACHE_DIR = FLAGS['cache_dir']

NUM_USERS = flags.DEFINE_integer('num_users', None,
                                 'synthetic: number of users (default 500).')
NUM_ITEMS = flags.DEFINE_integer('num_items', None,
                                 'synthetic: number of items (default 400).')
MEAN_INTERACTIONS = flags.DEFINE_float(
    'mean_interactions', None, 'synthetic: mean interactions per user (default 20).')
DATA_SEED = flags.DEFINE_integer('data_seed', None,
                                 'synthetic: generator seed (default 0).')

CSV_SEP = flags.DEFINE_string(
    'csv_sep', ',', 'csv: field separator (also: tab, space, semicolon).')
CSV_HEADER = flags.DEFINE_bool(
    'csv_header', True,
    'csv: the first line holds column names (without it, columns are given '
    'as 0-based numbers).')
CSV_USER_COL = flags.DEFINE_string(
    'csv_user_col', None, 'csv: user column (default user, or 0).')
CSV_ITEM_COL = flags.DEFINE_string(
    'csv_item_col', None, 'csv: item column (default item, or 1).')
CSV_TIMESTAMP_COL = flags.DEFINE_string(
    'csv_timestamp_col', None,
    'csv: numeric timestamp column (default: row order within a user).')
CSV_RATING_COL = flags.DEFINE_string('csv_rating_col', None,
                                     'csv: rating column (optional).')
CSV_MIN_RATING = flags.DEFINE_float(
    'csv_min_rating', None,
    'csv: keep rows with rating >= this as positives (needs csv_rating_col).')

_SYNTHETIC_FLAGS = {'num_users': NUM_USERS, 'num_items': NUM_ITEMS,
                    'mean_interactions': MEAN_INTERACTIONS, 'seed': DATA_SEED}
_CSV_FLAGS = {
    'sep': CSV_SEP, 'header': CSV_HEADER, 'user_col': CSV_USER_COL,
    'item_col': CSV_ITEM_COL, 'timestamp_col': CSV_TIMESTAMP_COL,
    'rating_col': CSV_RATING_COL, 'min_rating': CSV_MIN_RATING,
}


def task_options(task: tasks.Task) -> dict[str, Any]:
    """Collects the dataset flags that apply to ``task``; rejects the others.

    Args:
      task: The selected task.

    Returns:
      Keyword options for ``task.load_split`` / ``task.prepare``.

    Raises:
      DataError: If a flag of another task's data was given.
    """
    groups = {'synthetic': _SYNTHETIC_FLAGS, 'csv': _CSV_FLAGS}
    options = {}
    for owner, group in groups.items():
        for option, holder in group.items():
            if owner == task.name:
                options[option] = holder.value
            elif flags.FLAGS[holder.name].present:
                raise DataError(
                    f'--{holder.name} applies only to the {owner} data')
    return options


def flag_of(option: str) -> str:
    """The flag (without --) of a task's data option, e.g. 'data_seed'."""
    for group in (_SYNTHETIC_FLAGS, _CSV_FLAGS):
        if option in group:
            return group[option].name
    return option
