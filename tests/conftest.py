"""Shared pytest fixtures.

TFF's default context starts a `worker_binary` subprocess that outlives
Python and keeps the output pipe open; the session fixture stops it
(`tff_fedrecgel.runtime.shutdown_tff_workers`) so the run can never hang.
"""

import os
import pathlib
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session', autouse=True)
def shutdown_tff_worker():
    yield
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    runtime.shutdown_tff_workers()


@pytest.fixture(scope='session')
def datasets_dir() -> pathlib.Path:
    """The shared real datasets (FEDRECGEL_DATASETS overrides the location)."""
    return pathlib.Path(
        os.environ.get('FEDRECGEL_DATASETS', REPO_ROOT.parent / 'shared' / 'datasets')
    )
