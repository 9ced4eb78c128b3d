"""Bring-your-own interactions from a delimited text file.

Named ``csv_data`` (task name ``csv``) so that it never shadows the standard
library's ``csv`` module.
"""

from tff_fedrecgel import recipes
from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.data import csv_reader

# `data_dir` may be the file itself or a folder holding this file.
DEFAULT_FILE = 'ratings.csv'

TASK = Task(
    name='csv',
    raw_file=DEFAULT_FILE,
    rho_sh=0.01,
    rho_ns=0.05,
    description='A user-supplied CSV of (user, item[, rating][, timestamp]).',
    default_preset=recipes.AUTO,
    reader=csv_reader.load_csv,
    option_names=('sep', 'header', 'user_col', 'item_col', 'timestamp_col',
                  'rating_col', 'min_rating'),
    data_dir_may_be_file=True,
    options_check=csv_reader.check_csv_options,
)
