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
                                      lambda name, write: write(0, start[name]))


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
    size = (folder / 'journal.bin').stat().st_size
    reader = store_lib.DiskStore(folder, writable=False)  # Changes nothing.
    _equal(reader.snapshot(version), at_checkpoint)
    reader.close()
    assert (folder / 'journal.bin').stat().st_size == size
    reopened = store_lib.DiskStore(folder)
    assert reopened.dirty and reopened.version == version
    assert (folder / 'journal.bin').stat().st_size < size  # The torn record dropped.
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
    # The store's modules alone: the package's __init__ would import TensorFlow.
    code = f'''
import os, signal, sys, types, numpy as np
package = types.ModuleType('tff_fedrecgel.simulation')
package.__path__ = [{str(REPO / 'tff_fedrecgel' / 'simulation')!r}]
sys.modules[package.__name__] = package
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


def test_disk_store_starts_from_the_memory_states(tmp_path, monkeypatch):
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation import client_states  # pylint: disable=g-import-not-at-top

    config = neumf.ModelConfig(num_items=20, gmf_dim=4, mlp_dim=6, mlp_layers=(8, 4))
    monkeypatch.setattr(client_states, '_CHUNK_ROWS', 7)  # Drawn in several chunks.
    disk = client_states.ClientStateTable(store=client_states.create_disk_store(
        tmp_path / 's', config, num_users=23, seed=3))
    memory = client_states.ClientStateTable(
        client_update.initial_client_states(config, num_users=23, seed=3))
    for a, b in zip(memory.state, disk.state):
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_array_equal(x, y)
    users = [5, 0, 22]
    new = memory.gather(users)._replace(adam_step=np.array([1, 2, 3], np.int32))
    memory.scatter(users, new)
    disk.scatter(users, new)
    np.testing.assert_array_equal(memory.state.adam_step, disk.state.adam_step)
    ref = disk.checkpoint_state()
    assert int(ref['store_version']) == 1 and client_states.is_store_reference(ref)


# ---------------------------------------------------------------------------
# Whole runs on tiny synthetic data.

DATA = {'num_users': 60}
_TIMING = ('seconds', 'peak_rss')


def _metric_rows(run_dir):
    import csv  # pylint: disable=g-import-not-at-top

    with open(run_dir / 'metrics.csv', newline='') as f:
        return [{k: v for k, v in row.items() if not any(t in k for t in _TIMING)}
                for row in csv.DictReader(f)]


def _train(run_dir, total_rounds, **settings):
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    experiment = api.experiment('synthetic', run_dir=run_dir, data_options=DATA,
                                total_rounds=total_rounds, rounds_per_checkpoint=2,
                                preset='paper', **settings)
    return experiment.train()


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """A memory run of 4 rounds; a disk run of 3, whose last checkpoint is
    then lost (as if killed before saving it), resumed to 4."""
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    root = tmp_path_factory.mktemp('store_runs')
    with api.Session():
        memory = _train(root / 'memory', 4)
        first = _train(root / 'disk', 3, user_state_store='disk')
        rows_before = _metric_rows(root / 'disk')
        import shutil  # pylint: disable=g-import-not-at-top
        shutil.rmtree(root / 'disk' / 'checkpoints' / 'program_state_3')
        resumed = _train(root / 'disk', 4, user_state_store='disk')
    return root, memory, first, rows_before, resumed


def test_disk_and_memory_runs_give_the_same_metrics(runs):
    root, memory, first, rows_before, _ = runs
    assert rows_before == _metric_rows(root / 'memory')[:3]
    assert (root / 'disk' / 'user_states' / 'journal.bin').is_file()
    assert not (root / 'memory' / 'user_states').exists()
    hparams = json.loads((root / 'disk' / 'hparams.json').read_text())
    assert hparams['user_state_store'] == 'disk'
    assert json.loads((root / 'memory' / 'hparams.json').read_text())[
        'user_state_store'] == 'memory'
    assert first['rounds'] == 3


def test_disk_run_resumes_to_the_same_numbers(runs):
    root, memory, _, _, resumed = runs
    assert _metric_rows(root / 'disk') == _metric_rows(root / 'memory')
    assert resumed['final'] == memory['final']
    assert resumed['rounds'] == 4


def test_disk_checkpoint_reads_back_as_the_memory_run(runs):
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.program import run_folder  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation import client_states  # pylint: disable=g-import-not-at-top

    root = runs[0]
    journal = (root / 'disk' / 'user_states' / 'journal.bin').read_bytes()

    def saved(name, round_num):
        return run_folder.load_checkpoint(root / name, round_num=round_num)[1][
            'simulation']['algorithm']['client_states']

    with api.Session():  # Round 2: the journal's records undone in memory.
        tables = api.load_run(root / 'disk', round_num=2).simulation.algorithm.local_tables()
    for disk, memory in zip(tables, client_states.ClientStateTable(saved('memory', 2)).state[0]):
        np.testing.assert_array_equal(disk, memory)
    # Round 4, the files' own version: mapped copy-on-write.
    table = client_states.restore_table(saved('disk', 4), root / 'disk' / 'user_states',
                                        resume=False)
    for disk, memory in zip(table.state, client_states.ClientStateTable(saved('memory', 4)).state):
        for x, y in zip(*(v if isinstance(v, list) else [v] for v in (disk, memory))):
            np.testing.assert_array_equal(x, y)
    # Readers leave the store as it was.
    assert (root / 'disk' / 'user_states' / 'journal.bin').read_bytes() == journal


def test_old_records_without_the_setting_still_resume(runs):
    from tff_fedrecgel.program import outputs  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.program import run_record  # pylint: disable=g-import-not-at-top

    root = runs[0]
    hparams = json.loads((root / 'memory' / 'hparams.json').read_text())
    old = {k: v for k, v in hparams.items() if k != 'user_state_store'}
    assert not run_record.differences({'hparams': old, 'data': 'x'}, hparams, 'x')
    assert outputs._changed_settings(old, hparams) == []  # pylint: disable=protected-access
    assert run_record.differences({'hparams': old, 'data': 'x'},
                                  {**hparams, 'user_state_store': 'disk'}, 'x')


def test_disk_store_is_refused_where_no_user_keeps_state():
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    for kwargs in ({'algorithm': 'fedrecon'}, {'local_state': 'reconstruct'},
                   {'algorithm': 'pfedrec'}):
        with pytest.raises(ValueError, match='user_state_store'):
            api.settings('synthetic', user_state_store='disk', **kwargs)
    with pytest.raises(ValueError, match='user_state_store must be one of'):
        api.settings('synthetic', user_state_store='foo')
    with pytest.raises(ValueError, match='rounds_per_checkpoint must be positive'):
        api.settings('synthetic', user_state_store='disk', rounds_per_checkpoint=0)


def test_bad_flag_is_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / 'launch' / 'train.py'), '--task=synthetic',
         '--num_users=60', '--user_state_store=foo', f'--root_output_dir={tmp_path}/out'],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, 'PYTHONPATH': str(REPO)})
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and 'user_state_store' in lines[0], done.stderr
    assert not (tmp_path / 'out').exists()
