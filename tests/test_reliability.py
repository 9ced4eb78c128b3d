"""Nothing lost, nothing left behind: the in-process half (issue 15).

The TFF runtime's worker, the experiment lock, metrics rows kept through
resumes and file damage, TensorBoard without duplicated steps after a resume,
checkpoint housekeeping, and runs that stop when training breaks down. The
subprocess faults (signals, concurrent runs, a full disk, bad flags) are in
test_fault_injection.py.
"""

import asyncio
import collections
import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------
# The worker of `runtime.LocalRuntime`.

_SCRIPT_HEAD = textwrap.dedent('''
    import os, sys, time
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
    sys.path.insert(0, {repo!r})
    import numpy as np
    import tensorflow_federated as tff
    from tff_fedrecgel import runtime

    @tff.tensorflow.computation(np.int32)
    def add_one(x):
        return x + 1
''')


def _start_script(body, tmp_path, **kwargs):
    code = _SCRIPT_HEAD.format(repo=str(REPO)) + textwrap.dedent(body)
    log = open(tmp_path / 'script.log', 'w')  # pylint: disable=consider-using-with
    return subprocess.Popen(
        [sys.executable, '-c', code], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)


def _wait_for_line(path, prefix, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        assert proc.poll() is None, path.read_text()
        time.sleep(0.05)
    raise AssertionError(f'no {prefix!r} line: {path.read_text()}')


def _start_time(pid):
    """The process's start time (field 22 of /proc/pid/stat), or None."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ('Z', 'X') else fields[19]


def _gone(pid, start_time, timeout=20):
    """Whether that process (pid and start time) ends within `timeout`."""
    deadline = time.monotonic() + timeout
    while _start_time(pid) == start_time and time.monotonic() < deadline:
        time.sleep(0.05)
    return _start_time(pid) != start_time


def _parent(pid):
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(')', 1)[1].split()[1])


def test_worker_dies_with_its_parent(tmp_path):
    """Killed by SIGKILL (no clean-up at all), a program's worker dies with
    it: the kernel's parent-death signal. (SIGTERM and SIGINT of training
    runs: test_fault_injection.py.)"""
    sig = signal.SIGKILL
    proc = _start_script('''
        local = runtime.LocalRuntime().install()
        assert add_one(1) == 2
        print('worker', local.worker_pid, flush=True)
        time.sleep(300)
    ''', tmp_path)
    try:
        worker = int(_wait_for_line(tmp_path / 'script.log', 'worker', proc))
        assert _parent(worker) == proc.pid
        assert os.getpgid(worker) == worker  # Its own group: no terminal Ctrl-C.
        started = _start_time(worker)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        assert _gone(worker, started), 'the worker outlived its parent'
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_worker_death_is_an_error_not_a_hang(tmp_path):
    """A worker killed under a program (say for lack of memory) makes the next
    computation fail at once with one message, instead of TFF retrying."""
    proc = _start_script('''
        local = runtime.LocalRuntime().install()
        assert add_one(1) == 2
        os.kill(local.worker_pid, 9)
        time.sleep(0.5)
        try:
            add_one(2)
        except runtime.WorkerExitedError as e:
            print('error:', e, flush=True)
        local.stop()
        print('left:', len(runtime.worker_pids()), flush=True)
    ''', tmp_path)
    try:
        assert proc.wait(timeout=180) == 0, (tmp_path / 'script.log').read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = (tmp_path / 'script.log').read_text()
    assert 'was killed by SIGKILL' in out and 'left: 0' in out, out


def test_stop_puts_back_the_previous_context(tff_runtime):
    """Leaving a `with LocalRuntime()` block stops its worker and restores
    the context that was there before (here the session's runtime)."""
    import tensorflow_federated as tff
    from tff_fedrecgel import runtime

    @tff.tensorflow.computation(np.int32)
    def double(x):
        return x * 2

    with runtime.LocalRuntime() as inner:
        assert double(4) == 8
        pid = inner.worker_pid
        assert pid is not None and pid != tff_runtime.worker_pid
        started = _start_time(pid)
    assert inner.worker_pid is None and _gone(pid, started)
    assert tff.framework.get_context_stack().current is tff_runtime._context  # pylint: disable=protected-access
    assert double(5) == 10


def _tiny_split(num_users=40):
    from tff_fedrecgel.data import preprocess, synthetic

    frame = synthetic.generate_synthetic(num_users=num_users, num_items=300, seed=0)
    return preprocess.build_split(frame, validation=False)


def _simulation(split, **kwargs):
    from tff_fedrecgel.algorithms import ClientWorkConfig
    from tff_fedrecgel.simulation import build_simulation

    return build_simulation(
        split=split, method='fedrecgel', work=ClientWorkConfig(rho_sh=0.01, rho_ns=0.05),
        clients_per_round=5, seed=3, **kwargs)


def test_local_runtime_matches_tffs_default_context(tff_runtime):
    """Two FedRecGEL rounds give bit-identical weights and metrics on the
    runtime's worker and on a context TFF builds and starts itself."""
    import tensorflow_federated as tff

    split = _tiny_split()
    results = {}
    for name in ('tff', 'runtime'):
        simulation = _simulation(split)
        context = (tff.backends.native.create_sync_local_cpp_execution_context()
                   if name == 'tff' else tff_runtime._context)  # pylint: disable=protected-access
        with tff.framework.get_context_stack().install(context):
            simulation.initialize()
            metrics = [simulation.run_round() for _ in range(2)]
        for m in metrics:
            m.pop('round_seconds')
        results[name] = (simulation.global_weights, metrics)
        del context
    tff_weights, tff_metrics = results['tff']
    weights, metrics = results['runtime']
    assert metrics == tff_metrics
    for a, b in zip(weights, tff_weights):
        np.testing.assert_array_equal(a, b)


def test_signals_wait_for_the_end_of_a_write():
    """SIGTERM inside `deferred_signals` is raised when the block ends, as
    `Terminated` (a KeyboardInterrupt carrying the signal)."""
    from tff_fedrecgel import runtime

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    runtime.install_signal_handlers()
    finished = False
    try:
        with runtime.armed_signals():
            with pytest.raises(runtime.Terminated) as raised:
                with runtime.deferred_signals():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.1)  # The handler has run by now.
                    finished = True
            assert finished and raised.value.signum == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


# --------------------------------------------------------------------------
# The experiment lock.


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    from tff_fedrecgel import program

    with program.lock_experiment(root_output_dir=tmp_path, experiment_name='x') as paths:
        holder = paths.lock.read_text()
        assert f'pid {os.getpid()} on ' in holder and ' since ' in holder
        # Another process (flock locks belong to open files, so another open
        # file in this process stands in for it).
        with pytest.raises(program.ExperimentLockedError, match=f'in use by pid {os.getpid()} '):
            program.lock_experiment(root_output_dir=tmp_path, experiment_name='x')
    # Released: the next run takes it.
    program.lock_experiment(root_output_dir=tmp_path, experiment_name='x').release()


def test_lock_of_a_dead_process_does_not_block(tmp_path):
    """A SIGKILLed holder leaves its lock file; the kernel dropped its lock."""
    from tff_fedrecgel import program

    script = textwrap.dedent(f'''
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from tff_fedrecgel.program import outputs
        outputs.lock_experiment(root_output_dir={str(tmp_path)!r}, experiment_name='x')
        print('locked', flush=True)
        os.kill(os.getpid(), 9)
    ''')
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == -9 and 'locked' in out.stdout
    assert (tmp_path / 'x' / 'run.lock').read_text().startswith('pid ')
    program.lock_experiment(root_output_dir=tmp_path, experiment_name='x').release()


@pytest.mark.parametrize('name', ['..', '.', '', 'a/b', '../x'])
def test_experiment_name_stays_inside_the_root(name, tmp_path):
    from tff_fedrecgel import program

    with pytest.raises(ValueError, match='invalid experiment name'):
        program.lock_experiment(root_output_dir=tmp_path / 'root', experiment_name=name)
    assert not (tmp_path / 'root').exists()


# --------------------------------------------------------------------------
# The training program: metrics, TensorBoard, checkpoints.


@pytest.fixture(scope='module')
def simulation():
    """One small simulation, reused: `run_training` initializes it anew."""
    return _simulation(_tiny_split())


def _train(simulation, folder, total_rounds, **kwargs):
    from tff_fedrecgel import program

    with program.lock_experiment(root_output_dir=folder.parent,
                                 experiment_name=folder.name) as paths:
        return program.run_training(
            simulation, paths=paths, total_rounds=total_rounds,
            rounds_per_checkpoint=kwargs.pop('rounds_per_checkpoint', 2),
            progress=False, **kwargs)


def _run_async(coroutine):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def _rows(path, drop_timing=True):
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    if drop_timing:
        for row in rows:
            row.pop('train/round_seconds', None)
            row.pop('eval_seconds', None)
    return rows


@pytest.fixture(scope='module')
def reference(simulation, tmp_path_factory):
    """An uninterrupted 6-round run: its metrics rows."""
    folder = tmp_path_factory.mktemp('reference') / 'run'
    _train(simulation, folder, 6)
    return _rows(folder / 'metrics.csv')


def test_metrics_file_deleted_or_garbled_mid_run(simulation, reference, tmp_path):
    """metrics.csv removed after round 2 and garbled after round 4: the run
    goes on and the file ends whole (rows never read back from it)."""
    folder = tmp_path / 'run'

    def damage(round_num, released):
        del released
        if round_num == 2:
            (folder / 'metrics.csv').unlink()
        if round_num == 4:
            (folder / 'metrics.csv').write_bytes(b'\x00garbage,"\nround\n')

    _train(simulation, folder, 6, on_round_end=damage)
    assert _rows(folder / 'metrics.csv') == reference


def test_resume_rewrites_metrics_from_the_checkpoint(simulation, reference, tmp_path):
    """A crash after round 5 (checkpoint of round 4) with metrics.csv then
    garbled: the resumed run rebuilds rounds 1-4 from the checkpoint's rows."""
    folder = tmp_path / 'run'
    _train(simulation, folder, 5)
    (folder / 'checkpoints' / 'program_state_5').rename(
        folder / 'checkpoints' / 'program_state_5_temp1234')  # A save cut short.
    (folder / 'metrics.csv').write_text('round,train/loss\n1,oops\n')
    (folder / 'metrics.csv.12345.tmp').write_text('half a row')  # A write cut short.
    _train(simulation, folder, 6)
    assert _rows(folder / 'metrics.csv') == reference
    assert not list((folder / 'checkpoints').glob('*_temp*'))
    assert not list(folder.glob('*.tmp'))


def _scalars(log_dir):
    """Steps and values per tag, as TensorBoard's data provider loads them."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={plugin_event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                  for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()['tensors']
            if tag.startswith(('train/', 'test/', 'workload/'))}


def _raw_steps(log_dir, tag):
    """Every step written for `tag` in the event files, duplicates included."""
    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2

    steps = []
    for path in sorted(pathlib.Path(log_dir).glob('events.out.tfevents.*')):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return steps


def test_tensorboard_shows_each_round_once_after_a_resume(simulation, tmp_path):
    """Rounds written by a run that crashed after its last checkpoint are
    written again on resume; TensorBoard shows each round once, with the
    resumed run's values (those of metrics.csv)."""
    folder = tmp_path / 'run'
    _train(simulation, folder, 5)  # Checkpoints 2, 4, 5.
    (folder / 'checkpoints' / 'program_state_5').rename(
        folder / 'checkpoints' / 'program_state_5_temp1')
    _train(simulation, folder, 7)  # Resumes at 4: writes 5, 6, 7.
    log_dir = folder / 'tensorboard' / folder.name  # The run's own subfolder.
    assert sorted(_raw_steps(log_dir, 'train/loss')) == [1, 2, 3, 4, 5, 5, 6, 7]
    scalars = _scalars(log_dir)
    assert scalars, 'no scalars loaded'
    for tag, points in scalars.items():
        assert [step for step, _ in points] == [1, 2, 3, 4, 5, 6, 7], tag
    rows = {int(r['round']): r for r in _rows(folder / 'metrics.csv', drop_timing=False)}
    for step, value in scalars['workload/round_seconds']:
        assert value == pytest.approx(float(rows[step]['train/round_seconds']), rel=1e-6)


def test_all_checkpoints_unreadable_starts_over(simulation, reference, tmp_path, capfd):
    """Every checkpoint broken: the run says it starts from round 0, does so
    and ends like an uninterrupted run, without duplicated TensorBoard steps;
    only the newest unreadable checkpoint is kept for a look."""
    folder = tmp_path / 'run'
    _train(simulation, folder, 4)
    for state in (folder / 'checkpoints').glob('program_state_*'):
        for path in state.rglob('*'):
            if path.is_file():
                path.write_bytes(b'broken')
    _train(simulation, folder, 6)
    err = capfd.readouterr().err
    assert 'checkpoint of round 4 is unreadable' in err
    assert 'trying the checkpoint of round 2' in err
    assert 'checkpoint of round 2 is unreadable' in err
    assert 'no older checkpoint: starting from round 0' in err
    assert 'using an older one' not in err
    assert _rows(folder / 'metrics.csv') == reference
    for tag, points in _scalars(folder / 'tensorboard' / folder.name).items():
        assert [step for step, _ in points] == [1, 2, 3, 4, 5, 6], tag
    # Two set aside in this run; pruned to the newest at the next start.
    assert len(list((folder / 'checkpoints').glob('unreadable_*'))) == 2
    _train(simulation, folder, 6)
    assert len(list((folder / 'checkpoints').glob('unreadable_*'))) == 1


class _BreakingSimulation:
    """Wraps a simulation; from round `at` on, its rounds break down."""

    def __init__(self, inner, *, at, how):
        self._inner, self._at, self._how = inner, at, how

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run_round(self):
        train = self._inner.run_round()
        if self._inner.round_num >= self._at:
            if self._how == 'all_dropped':
                train['dropped_clients'] = train['clients']
            else:
                algorithm = self._inner.algorithm
                weights = list(algorithm.server_state.global_weights)
                weights[0] = np.full_like(weights[0], np.nan)
                algorithm.server_state = algorithm.server_state._replace(
                    global_weights=weights)
        return train

    @property
    def global_weights(self):
        return self._inner.global_weights


@pytest.mark.parametrize('how', ['all_dropped', 'nan_weights'])
def test_broken_training_stops_and_keeps_the_last_good_checkpoint(
        simulation, reference, tmp_path, how):
    """A round in which every client was dropped, or after which the global
    weights are NaN, stops the run; nothing of it is released or saved."""
    from tff_fedrecgel import program

    folder = tmp_path / 'run'
    broken = _BreakingSimulation(simulation, at=3, how=how)
    with pytest.raises(program.TrainingStoppedError,
                       match='round 3: .*the checkpoint of round 2 is kept'):
        _train(broken, folder, 6)
    assert [r['round'] for r in _rows(folder / 'metrics.csv')] == ['1', '2']
    assert sorted(p.name for p in (folder / 'checkpoints').iterdir()) == ['program_state_2']
    # Fixed, the same command resumes and ends like an uninterrupted run.
    _train(simulation, folder, 6)
    assert _rows(folder / 'metrics.csv') == reference


def test_rows_survive_in_the_checkpoint(simulation, tmp_path):
    """The checkpoint holds every finished round's row (JSON)."""
    import tensorflow_federated as tff

    folder = tmp_path / 'run'
    _train(simulation, folder, 4)
    manager = tff.program.FileProgramStateManager(
        str(folder / 'checkpoints'), prefix='program_state_')
    from tff_fedrecgel.program import training_program
    from tff_fedrecgel.program.evaluation_plan import EvaluationPlan
    from tff_fedrecgel.program import run_record
    from tff_fedrecgel.data import split_io
    structure = training_program._program_state(  # pylint: disable=protected-access
        simulation, EvaluationPlan().empty_best(), 0.0, 0.0, record=np.array('{}'))
    state = _run_async(manager.load(4, structure))
    rows = json.loads(state['metrics_rows'])
    assert [r['round'] for r in rows] == [1, 2, 3, 4]
    assert rows == [collections.OrderedDict(r) for r in rows]
    # And what it belongs to: the split's fingerprint (and the settings given).
    record = run_record.parse_record(state['run_record'])
    assert record['data'] == split_io.split_fingerprint(simulation.split)
