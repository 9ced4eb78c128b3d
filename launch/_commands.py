"""The installed commands (setup.py `entry_points`): each runs one entry point.

`tff-fedrecgel-train` is `python launch/train.py` from anywhere: the module
runs as `__main__` (as with `python -m`), so that absl's `--help` lists its
flags and its usage text.
"""

from __future__ import annotations

import runpy

def _run(module: str) -> None:
    runpy.run_module(f'tff_fedrecgel.launch.{module}', run_name='__main__', alter_sys=True)


def train() -> None:
    """`tff-fedrecgel-train`: launch/train.py."""
    _run('train')


def recommend() -> None:
    """`tff-fedrecgel-recommend`: launch/recommend.py."""
    _run('recommend')


def export() -> None:
    """`tff-fedrecgel-export`: launch/export.py."""
    _run('export')


def tune() -> None:
    """`tff-fedrecgel-tune`: launch/tune.py."""
    _run('tune')


def download() -> None:
    """`tff-fedrecgel-download`: launch/download.py."""
    _run('download')
