r"""Downloads a paper dataset's raw file into the folder launch/train.py reads.

Examples (from the repository root)::

    .venv/bin/python launch/download.py --task=filmtrust --data_dir=~/fedrec-data/filmtrust
    .venv/bin/python launch/train.py --task=filmtrust --data_dir=~/fedrec-data/filmtrust

The file comes from its pinned public address (a commit of a public GitHub
repository; `tff_fedrecgel/data/download.py`), is checked against its pinned
size and digest, and is stored under the name the task reads
(filmtrust-ratings.txt, last-fm-2k-ratings.dat, amazon-video-ratings.dat). A
file already there with the right bytes is kept. `--task=qb_article` prints
how to get QB-article, which needs a licence accepted on its site. On any
failure (unreachable, wrong size or digest) one `error:` line, exit status
2, and nothing written. docs/DATA.md says who distributes each dataset and
under which terms. Does not import TensorFlow.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ''):
    # Run as `python launch/download.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from tff_fedrecgel.launch import _entry
from tff_fedrecgel import tasks
from tff_fedrecgel.data import download
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

_TASK = flags.DEFINE_enum(
    'task', None, sorted(download.SOURCES), 'The dataset to download.')
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, 'Folder to store it in (created if missing); then give the '
    'same --data_dir to launch/train.py.')


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if not _TASK.value:
        raise DataError(f'--task is required: one of {", ".join(sorted(download.SOURCES))}')
    if not _DATA_DIR.value:
        raise DataError('--data_dir is required')
    task = tasks.get_task(_TASK.value)
    source = download.SOURCES[task.name]
    destination = os.path.join(os.path.abspath(os.path.expanduser(_DATA_DIR.value)),
                               task.raw_file)
    if source.url is None:
        raise DataError(source.licence.format(path=destination))
    print(f'{task.name}: {source.page}', flush=True)
    if download.fetch(source, destination):
        print(f'{task.name}: downloaded {source.size:,} bytes, size and digest checked: '
              f'{destination}', flush=True)
    else:
        print(f'{task.name}: already there, size and digest checked: {destination}',
              flush=True)
    print(f'next: launch/train.py --task={task.name} '
          f'--data_dir={os.path.dirname(destination)}', flush=True)
    return 0


def run() -> None:
    """The `tff-fedrecgel-download` command."""
    _entry.setup_environment()
    _entry.run_main(main)


if __name__ == '__main__':
    run()
