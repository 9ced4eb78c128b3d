"""The user-state store (issue 30): memory and disk keep the same numbers,
and a disk store killed mid-round rolls back to its last checkpoint.

Unit tests on tiny arrays (no TensorFlow), then short whole runs on tiny
synthetic data: the two stores give the same metrics, and a disk run
resumed from a checkpoint gives the numbers of an uninterrupted one.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tff_fedrecgel.simulation import user_state_journal
from tff_fedrecgel.simulation import user_state_store as store_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
LAYOUT = [('w', (3,), np.float32), ('step', (), np.int32)]
USERS = 10


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {'w': rng.normal(size=(USERS, 3)).astype(np.float32),
            'step': np.arange(USERS, dtype=np.int32)}


def _disk(folder):
    start = _arrays()
    return store_lib.DiskStore.create(folder, LAYOUT, USERS,
                                      lambda name, table: table.__setitem__(..., start[name]))


def _rows(users, value):
    return {'w': np.full((len(users), 3), value, np.float32),
            'step': np.full(len(users), int(value), np.int32)}


def _equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_memory_and_disk_gather_scatter_equal(tmp_path):
    memory, disk = store_lib.MemoryStore(_arrays()), _disk(tmp_path / 's')
    for step, users in enumerate([[1, 4, 7], [0, 9], [4, 2, 3, 8]]):
        _equal(memory.gather(users), disk.gather(users))
        memory.scatter(users, _rows(users, step + 10))
        disk.scatter(users, _rows(users, step + 10))
    _equal(memory.arrays, disk.arrays)
    _equal(memory.gather([5, 4]), disk.gather([5, 4]))
    disk.close()
    _equal(memory.arrays, store_lib.DiskStore(tmp_path / 's').arrays)  # Reopened.


def test_mark_gives_versions_and_keeps_the_last_ones(tmp_path):
    disk = _disk(tmp_path / 's')
    assert disk.version == 0 and disk.mark() == 0  # Nothing changed: same version.
    versions = []
    for round_num in range(store_lib.KEEP_MARKS + 2):
        disk.scatter([round_num], _rows([round_num], round_num + 1))
        versions.append(disk.mark())
    assert versions == list(range(1, store_lib.KEEP_MARKS + 3))
    kept = [m.value for m in disk.journal.marks()]
    assert kept == versions[-store_lib.KEEP_MARKS:]
    with pytest.raises(store_lib.StoreError, match='no longer in the journal'):
        disk.rollback(1)


def test_rollback_after_a_crash_restores_the_checkpoint(tmp_path):
    folder = tmp_path / 's'
    disk = _disk(folder)
    disk.scatter([1, 2], _rows([1, 2], 5))
    version = disk.mark()
    at_checkpoint = {k: np.array(v) for k, v in disk.arrays.items()}
    disk.scatter([2, 3], _rows([2, 3], 6))
    disk.scatter([3, 9], _rows([3, 9], 7))
    # A crash: the process dies without closing; then a write cut short.
    del disk
    with open(folder / 'journal.bin', 'ab') as f:
        f.write(b'UNDO' + b'\x05' * 10)
    reopened = store_lib.DiskStore(folder)
    assert reopened.dirty and reopened.version == version
    older = reopened.snapshot(0)  # A reader: the files stay as they are.
    _equal(older, _arrays())
    assert reopened.arrays['step'][9] == 7
    reopened.rollback(version)
    _equal(reopened.arrays, at_checkpoint)
    assert reopened.journal.records[-1].kind == user_state_journal.MARK
    reopened.close()
    _equal(store_lib.DiskStore(folder).arrays, at_checkpoint)


def test_store_killed_mid_scatter_rolls_back(tmp_path):
    """A real SIGKILL between the journal's record and the rows' write."""
    folder = tmp_path / 's'
    disk = _disk(folder)
    disk.scatter([0], _rows([0], 3))
    version = disk.mark()
    expected = {k: np.array(v) for k, v in disk.arrays.items()}
    disk.close()
    code = f'''
import os, signal, numpy as np
from tff_fedrecgel.simulation import user_state_store as s
d = s.DiskStore({str(folder)!r})
d.scatter([4, 5], {{'w': np.ones((2, 3), np.float32), 'step': np.ones(2, np.int32)}})
# A scatter cut short: its record written, then part of its rows.
d.journal.append_undo(np.array([6], np.int64), [d.arrays['w'][[6]], d.arrays['step'][[6]]])
d.arrays['w'][6] = 9
os.kill(os.getpid(), signal.SIGKILL)
'''
    done = subprocess.run([sys.executable, '-c', code], env={**os.environ, 'PYTHONPATH': str(REPO)},
                          check=False, timeout=60)
    assert done.returncode == -9
    reopened = store_lib.DiskStore(folder)
    assert reopened.arrays['w'][4, 0] == 1
    assert reopened.arrays['w'][6, 0] == 9
    reopened.rollback(version)
    _equal(reopened.arrays, expected)


def test_create_replaces_a_store_and_changes_its_id(tmp_path):
    first = _disk(tmp_path / 's')
    first.scatter([0], _rows([0], 3))
    first.mark()
    first.close()
    second = _disk(tmp_path / 's')
    assert second.store_id != first.store_id and second.version == 0
    _equal(second.arrays, _arrays())
    assert not store_lib.DiskStore.exists(tmp_path / 'none')
    with pytest.raises(store_lib.StoreError, match='no readable user-state store'):
        store_lib.DiskStore(tmp_path / 'none')
