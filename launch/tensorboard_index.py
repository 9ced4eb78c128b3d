r"""Gives every run under a folder one HParams config: the settings that differ.

Example (from the repository root)::

    .venv/bin/python launch/tensorboard_index.py --logdir=runs/study
    .venv/bin/tensorboard --logdir runs/study

TensorBoard's HParams dashboard takes its setting columns from the config of
one run of the logdir (the first it finds). A run started under
--root_output_dir already shares one config with the runs beside it; runs
in nested folders (a study's <root>/<dataset>/<run>/) or moved together
later do not. This command rewrites the hparams file of every run log below
--logdir (each folder holding a dashboard.json) with one config: the
settings that differ between those runs as columns, every run's metric
columns. Scalars and selected metrics are not touched. Prints the columns.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

import pathlib

from absl import flags

from tff_fedrecgel.errors import DataError
from tff_fedrecgel.program import outputs
# pylint: enable=g-import-not-at-top,wrong-import-position

_LOGDIR = flags.DEFINE_string('logdir', None, 'Folder of runs (what tensorboard '
                              '--logdir is given).', required=True)


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv
    root = pathlib.Path(_LOGDIR.value)
    if not root.is_dir():
        raise DataError(f'{root}: --logdir is not a folder')
    logs = sorted(p.parent for p in root.rglob(outputs.DASHBOARD_FILE))
    if not logs:
        raise DataError(f'{root}: no run logs below it (no {outputs.DASHBOARD_FILE}; '
                        'runs write one when they start)')
    # TensorFlow only now: refusals come at once.
    from tff_fedrecgel.program import tensorboard_hparams  # pylint: disable=g-import-not-at-top

    columns = tensorboard_hparams.index_logs(logs)
    print(f'{len(logs)} run logs under {root}; setting columns: {", ".join(columns)}',
          flush=True)
    return 0


if __name__ == '__main__':
    _entry.run_main(main)
