"""Shared pytest fixtures.

The session runs TFF computations on a `runtime.LocalRuntime`: its
`worker_binary` dies with the test process, however that ends, and is
stopped when the session ends; workers TFF starts by itself (tests that
install TFF's own contexts) are stopped too
(`tff_fedrecgel.runtime.shutdown_tff_workers`), so the run can never hang.
"""

import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pytest  # pylint: disable=g-import-not-at-top
import signal  # pylint: disable=g-import-not-at-top,wrong-import-order

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started as a background job of a script: workers TFF starts itself
    # would inherit the ignored SIGINT, and TFF waits for them to stop on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


# The small synthetic run of the command-line tests: 80 users, 6 rounds,
# a checkpoint every 2 rounds, validation on.
TRAIN_SMALL_RUN = ('--task=synthetic', '--num_users=80', '--num_items=400',
                   '--progress=false', '--preset=paper', '--total_rounds=6',
                   '--rounds_per_checkpoint=2', '--validation')


@pytest.fixture(scope='session')
def train_reference(tmp_path_factory):
    """`launch/train.py` run uninterrupted with TRAIN_SMALL_RUN: its folder
    (experiment `ref`) and its output; `.seconds` its duration."""
    root = tmp_path_factory.mktemp('reference')
    log_path = root / 'log.txt'
    start = time.monotonic()
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / 'launch' / 'train.py'), *TRAIN_SMALL_RUN,
             f'--root_output_dir={root}', '--experiment_name=ref'],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
            start_new_session=True)
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    output = log_path.read_text()
    assert proc.returncode == 0, output
    return _Reference((root / 'ref', output), seconds=time.monotonic() - start)


class _Reference(tuple):
    """(folder, output), and `seconds`: how long the run took on this machine."""

    def __new__(cls, values, *, seconds):
        reference = super().__new__(cls, values)
        reference.seconds = seconds
        return reference


@pytest.fixture(scope='session')
def planted():
    """Two tastes: even users take items of the first half, odd users of the
    second; popularity cannot tell them apart, a personal model can (60
    users, 40 items, 10 rows each)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import pandas as pd  # pylint: disable=import-outside-toplevel
    from tff_fedrecgel.data import preprocess  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    num_users, num_items, per_user = 60, 40, 10
    rows = []
    for u in range(num_users):
        pool = np.arange(num_items // 2) + (num_items // 2) * (u % 2)
        rows += [(u, int(i), t) for t, i in enumerate(rng.choice(pool, per_user, replace=False))]
    return preprocess.build_split(pd.DataFrame(rows, columns=['user', 'item', 'timestamp']),
                                  num_negatives=20)
