"""docs/api_tour.ipynb runs headlessly (nbclient) and leaves no TFF worker.

Every cell must run without error within its timeout; the kernel's TFF
workers, noted after each cell by parent pid, must all be gone once the
kernel has shut down.
"""

import os
import pathlib
import time

import pytest

nbclient = pytest.importorskip(
    'nbclient', reason='nbclient is not installed (pip install -e ".[dev]")')
nbformat = pytest.importorskip(
    'nbformat', reason='nbformat is not installed (pip install -e ".[dev]")')
pytest.importorskip('ipykernel', reason='ipykernel is not installed (pip install -e ".[dev]")')

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / 'docs' / 'api_tour.ipynb'
CELL_TIMEOUT = 240


def _stat(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None


def _alive_since(pid):
    stat = _stat(pid)
    return None if stat is None or stat[0] in ('Z', 'X') else stat[19]


def _descendants(pid):
    out = []
    try:
        for task in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{task}/children') as f:
                for child in map(int, f.read().split()):
                    out += [child, *_descendants(child)]
    except OSError:
        pass
    return out


@pytest.mark.timeout(600)
def test_notebook_runs_and_leaves_no_worker():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    workers = {}  # pid -> start time
    outputs = {}

    def note_workers(cell, cell_index, execute_reply):
        del execute_reply
        outputs[cell_index] = cell.get('outputs', [])
        kernel = getattr(client.km.provisioner, 'process', None)
        for pid in _descendants(kernel.pid) if kernel is not None else []:
            since = _alive_since(pid)
            try:
                exe = os.readlink(f'/proc/{pid}/exe')
            except OSError:
                continue
            if since is not None and exe.endswith('/worker_binary'):
                workers[pid] = since

    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT, startup_timeout=120, kernel_name='python3',
        resources={'metadata': {'path': str(REPO)}}, on_cell_executed=note_workers)
    client.execute()  # Raises CellExecutionError on a failing cell.

    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == 'code']
    assert set(code) <= set(outputs)
    images = [o for i in code for o in outputs[i] if 'image/png' in o.get('data', {})]
    assert len(images) == 1, 'the HR@10 plot'
    texts = ''.join(o.get('text', '') for o in outputs[code[-1]])
    assert 'worker running: False' in texts

    assert workers, 'the training must have run on a worker the check can follow'
    deadline = time.monotonic() + 20
    left = dict(workers)
    while left and time.monotonic() < deadline:
        left = {p: s for p, s in left.items() if _alive_since(p) == s}
        time.sleep(0.05)
    assert not left, f'TFF workers {sorted(left)} outlived the notebook kernel'
