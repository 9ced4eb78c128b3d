"""docs/api_tour.ipynb runs headlessly (nbclient) and leaves no TFF worker.

Every cell must run without error within its timeout; the kernel's TFF
workers, noted after each cell by parent pid, must all be gone once the
kernel has shut down.
"""

import pathlib

import pytest

import worker_watch

nbclient = pytest.importorskip(
    'nbclient', reason='nbclient is not installed (pip install -e ".[dev]")')
nbformat = pytest.importorskip(
    'nbformat', reason='nbformat is not installed (pip install -e ".[dev]")')
pytest.importorskip('ipykernel', reason='ipykernel is not installed (pip install -e ".[dev]")')

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / 'docs' / 'api_tour.ipynb'
CELL_TIMEOUT = 240


@pytest.mark.timeout(600)
def test_notebook_runs_and_leaves_no_worker():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    workers = {}  # pid -> start time
    outputs = {}

    def note_workers(cell, cell_index, execute_reply):
        del execute_reply
        outputs[cell_index] = cell.get('outputs', [])
        kernel = getattr(client.km.provisioner, 'process', None)
        if kernel is not None:
            worker_watch.note_workers(kernel.pid, workers, recursive=True)

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
    left = worker_watch.workers_left(workers)
    assert not left, f'TFF workers {left} outlived the notebook kernel'
