"""The user-state store (issue 30): memory and disk keep the same numbers,
and a disk store killed mid-round rolls back to its last checkpoint.

Unit tests on tiny arrays (no TensorFlow), then whole short runs of
launch/train.py on tiny synthetic data: a disk run SIGKILLed mid-run and
resumed gives the rows and summary of the uninterrupted memory run, and its
checkpoints read back as the memory run's.
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
    # An evaluation sample's rows, read row by row, equal the tables' rows.
    sample = [22, 5, 9]
    for table in (memory, disk):
        rows = table.local_rows(sample)
        assert len(rows) == len(memory.local_tables())
        for got, whole in zip(rows, memory.local_tables()):
            np.testing.assert_array_equal(got, whole[sample])


# ---------------------------------------------------------------------------
# Whole runs: launch/train.py on tiny synthetic data (conftest.TRAIN_SMALL_RUN:
# 6 rounds, a checkpoint every 2, a validation item).

_TIMING = ('seconds', 'peak_rss')


def _metric_rows(run_dir):
    import csv  # pylint: disable=g-import-not-at-top

    with open(run_dir / 'metrics.csv', newline='') as f:
        return [{k: v for k, v in row.items() if not any(t in k for t in _TIMING)}
                for row in csv.DictReader(f)]


def _summary(text):
    out = json.loads(text.strip().splitlines()[-1])
    return {k: v for k, v in out.items()
            if 'seconds' not in k and k not in ('output_dir', 'peak_rss_mb')}


@pytest.fixture(scope='module')
def runs(train_reference, tmp_path_factory):
    """The uninterrupted memory run (conftest's reference), and a disk run
    SIGKILLed once it has run 3 rounds (after its checkpoint of round 2)
    then run again to its end: (memory folder, memory output, disk folder,
    the killed run's exit status, the resumed run)."""
    import signal  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top

    from conftest import TRAIN_SMALL_RUN  # pylint: disable=g-import-not-at-top

    root = tmp_path_factory.mktemp('store_runs')
    command = [sys.executable, str(REPO / 'launch' / 'train.py'), *TRAIN_SMALL_RUN,
               '--user_state_store=disk', f'--root_output_dir={root}', '--experiment_name=disk']
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(REPO))
    metrics = root / 'disk' / 'metrics.csv'
    with open(root / 'first.txt', 'w') as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while first.poll() is None and time.monotonic() < deadline:
                if metrics.exists() and len(metrics.read_text().splitlines()) > 3:
                    break
                time.sleep(0.02)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)  # The run and its TFF worker.
            first.wait()
    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300,
                             check=False)
    folder, output = train_reference
    return folder, output, root / 'disk', first.returncode, resumed


def test_disk_run_killed_mid_run_resumes_to_the_memory_run(runs):
    memory, output, disk, killed, resumed = runs
    assert killed == -9
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert 'resuming from the checkpoint of round' in resumed.stdout
    assert _metric_rows(disk) == _metric_rows(memory)
    assert _summary(resumed.stdout) == _summary(output)
    assert (disk / 'user_states' / 'journal.bin').is_file()
    assert not (memory / 'user_states').exists()
    assert json.loads((disk / 'hparams.json').read_text())['user_state_store'] == 'disk'
    assert json.loads((memory / 'hparams.json').read_text())['user_state_store'] == 'memory'


def test_disk_checkpoint_reads_back_as_the_memory_run(runs):
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.program import run_folder  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation import client_states  # pylint: disable=g-import-not-at-top

    memory, _, disk, _, _ = runs
    journal = (disk / 'user_states' / 'journal.bin').read_bytes()

    def saved(folder, round_num):
        return run_folder.load_checkpoint(folder, round_num=round_num)[1][
            'simulation']['algorithm']['client_states']

    def same(a, b):
        for x, y in zip(a, b):
            for u, v in zip(*(z if isinstance(z, list) else [z] for z in (x, y))):
                np.testing.assert_array_equal(u, v)

    with api.Session():  # Round 2: the journal's records undone in memory.
        tables = api.load_run(disk, round_num=2).simulation.algorithm.local_tables()
    same([tables], [client_states.ClientStateTable(saved(memory, 2)).state[0]])
    # Round 6, the files' own version: mapped copy-on-write.
    table = client_states.restore_table(saved(disk, 6), disk / 'user_states', resume=False)
    same(table.state, client_states.ClientStateTable(saved(memory, 6)).state)
    # The validation-selected state is kept whole, as the memory run's.
    selected = run_folder.load_checkpoint(disk, checkpoint='selected')[1]
    assert not client_states.is_store_reference(
        selected['simulation']['algorithm']['client_states'])
    # Readers leave the store as it was.
    assert (disk / 'user_states' / 'journal.bin').read_bytes() == journal


def test_old_records_without_the_setting_still_resume(runs):
    from tff_fedrecgel.program import outputs  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.program import run_record  # pylint: disable=g-import-not-at-top

    hparams = json.loads((runs[0] / 'hparams.json').read_text())
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
