"""Shared pytest fixtures.

The session runs TFF computations on a `runtime.LocalRuntime`: its
`worker_binary` dies with the test process, however that ends, and is
stopped when the session ends; workers TFF starts by itself (tests that
install TFF's own contexts) are stopped too
(`tff_fedrecgel.runtime.shutdown_tff_workers`), so the run can never hang.
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
def tff_runtime():
    """The session's `runtime.LocalRuntime` (installed as TFF's context)."""
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    local_runtime = runtime.LocalRuntime().install()
    try:
        yield local_runtime
    finally:
        local_runtime.stop()
        runtime.shutdown_tff_workers()


@pytest.fixture(scope='session')
def datasets_dir() -> pathlib.Path:
    """The shared real datasets (FEDRECGEL_DATASETS overrides the location)."""
    return pathlib.Path(
        os.environ.get('FEDRECGEL_DATASETS', REPO_ROOT.parent / 'shared' / 'datasets')
    )
