"""The flags the in-process benchmarks share: which task, data and method."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import methods

TASK = flags.DEFINE_string('task', 'synthetic', 'Task name.')
DATA_DIR = flags.DEFINE_string('data_dir', None, 'The task\'s data folder (paper tasks).')
ALGORITHM = flags.DEFINE_enum('algorithm', methods.FEDRECGEL, list(methods.METHODS),
                              'The method.')
WORK_DIR = flags.DEFINE_string('work_dir', None, 'Folder for the temporary run folders.')
