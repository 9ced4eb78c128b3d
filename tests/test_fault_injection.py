"""Faults injected into `launch/train.py`, as a user's machine would (issue 15).

SIGKILL, SIGTERM and SIGINT at random points of a small synthetic run, each
followed by a resume; two runs on one folder; a disk that fills up; bad
flags. After every fault: the run resumes to the metrics of an uninterrupted
run (conftest.train_reference), no metrics row is lost, and no TFF worker
the run started is left (found by parent pid while the run lives, checked by
pid and start time after it ends).

The signal chain samples `FEDRECGEL_FAULTS` faults (default 3) with the seed
`FEDRECGEL_FAULT_SEED` (default 0); `FEDRECGEL_FAULT_REPORT=path` writes
the figures of docs/RELIABILITY.md as JSON.
"""

import concurrent.futures
import csv
import json
import os
import re
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import TRAIN_SMALL_RUN
import worker_watch

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN = str(REPO / 'launch' / 'train.py')
TIMING = ('train/round_seconds', 'eval_seconds')
_REPORT = {}


class Run:
    """One `launch/train.py` process and every worker seen under it."""

    def __init__(self, args, log_path):
        self.log_path = log_path
        self._log = open(log_path, 'w')  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(
            [sys.executable, TRAIN, *args], stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
        self.workers = {}  # pid -> start time

    def _look(self):
        worker_watch.note_workers(self.proc.pid, self.workers)

    def wait(self, timeout=300, until=None):
        """Waits for the exit (or `until()`), noting workers; the exit code
        or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._look()
            if self.proc.poll() is not None:
                return self.proc.returncode
            if until is not None and until():
                return None
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f'run did not end in {timeout} s: {self.output()}')

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output(self):
        return self.log_path.read_text()

    def workers_left(self, timeout=20):
        """Workers of this run still running `timeout` s after it ended."""
        return worker_watch.workers_left(self.workers, timeout)


def _rows(path):
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in TIMING:
            row.pop(column, None)
    return rows


def _summary(output):
    summary = json.loads(output.strip().splitlines()[-1])
    return {k: v for k, v in summary.items()
            if 'seconds' not in k and k not in ('output_dir', 'peak_rss_mb')}


def _last_line(output):
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ''


def _args(root, name='run'):
    return [*TRAIN_SMALL_RUN, f'--root_output_dir={root}', f'--experiment_name={name}']


@pytest.fixture(scope='module')
def reference(train_reference):
    folder, output = train_reference
    return _rows(folder / 'metrics.csv'), _summary(output), train_reference.seconds


@pytest.fixture(scope='module', autouse=True)
def report():
    yield _REPORT
    path = os.environ.get('FEDRECGEL_FAULT_REPORT')
    if path:
        pathlib.Path(path).write_text(json.dumps(_REPORT, indent=2) + '\n')


def _count(key, n=1):
    _REPORT[key] = _REPORT.get(key, 0) + n


_EXIT = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 128 + signal.SIGTERM,
         signal.SIGINT: 128 + signal.SIGINT}
# A signal during start-up (flag parsing) ends the program before it knows
# its hint; the line starts the same.
_LINE = {signal.SIGTERM: 'terminated (SIGTERM): stopped',
         signal.SIGINT: 'interrupted (Ctrl-C): stopped'}


def test_signals_at_random_points_resume_identically(reference, tmp_path):
    """SIGKILL, SIGTERM and SIGINT in turn, each at a random time of a run
    (or of its resumption); every run then resumes, and every finished
    series ends with the uninterrupted run's metrics and summary."""
    reference_rows, reference_summary, seconds = reference
    faults = int(os.environ.get('FEDRECGEL_FAULTS', '3'))
    rng = random.Random(int(os.environ.get('FEDRECGEL_FAULT_SEED', '0')))
    kinds = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
    # Signal times span a whole run on this machine, however loaded.
    series, attempt, injected, span = 0, 0, 0, seconds
    while True:
        attempt += 1
        run = Run(_args(tmp_path, f'series{series}'), tmp_path / f'attempt{attempt}.txt')
        if injected < faults:
            sig = kinds[injected % len(kinds)]
            # Times count from when the program handles signals (before
            # that, Python's defaults apply); SIGKILL needs no handler.
            run.wait(timeout=120, until=lambda: worker_watch.handles(run.proc.pid, signal.SIGTERM))
            delay = rng.uniform(0.0, span)
            start = time.monotonic()
            code = run.wait(timeout=delay + 120, until=lambda: time.monotonic() - start >= delay)
            if code is None:
                worker_running = bool(run.workers)
                os.kill(run.proc.pid, sig)  # The process only, not its group.
                code = run.wait()
                if code == -sig and _last_line(run.output()).startswith('{'):
                    # It had finished (the summary is out) and the signal came
                    # during the interpreter's own exit, where Python restores
                    # the default handlers: a finished run.
                    code = 0
                if code != 0:  # 0: it had just finished.
                    injected += 1
                    _count(f'faults_{signal.Signals(sig).name}')
                    _count('faults_with_worker_running', int(worker_running))
                    output = run.output()
                    assert code == _EXIT[sig], output
                    assert 'Traceback' not in output, output
                    if sig in _LINE:
                        assert _last_line(output).startswith(_LINE[sig]), output
                    assert 'in use by' not in output, output
        else:
            code = run.wait()
        left = run.workers_left()
        _count('workers_seen', len(run.workers))
        _count('workers_left', len(left))
        assert not left, f'workers {left} outlived {run.output()}'
        if code == 0:
            output = run.output()
            assert 'in use by' not in output
            rows = _rows(tmp_path / f'series{series}' / 'metrics.csv')
            _count('rows_lost', sum(r not in rows for r in reference_rows))
            assert rows == reference_rows
            assert _summary(output) == reference_summary
            _count('series_resumed_identical')
            series += 1
            if injected >= faults:
                break
        else:
            _count('resumes')
    _REPORT['faults_injected'] = injected
    _REPORT['runs_started'] = attempt
    _REPORT['signal_times_span_seconds'] = round(span, 1)


def test_second_run_on_a_folder_is_refused(reference, tmp_path):
    """While a run holds the folder, the same command is refused at once with
    one line naming the holder; the first run loses nothing."""
    reference_rows, _, _ = reference
    lock = tmp_path / 'run' / 'run.lock'
    first = Run(_args(tmp_path), tmp_path / 'first.txt')
    try:
        first.wait(timeout=180, until=lambda: lock.exists() and lock.read_text().startswith(
            f'pid {first.proc.pid} '))
        # Paused, the first run holds the folder however long the second takes
        # to start (it could otherwise finish its few rounds first).
        os.killpg(first.proc.pid, signal.SIGSTOP)
        try:
            second = Run(_args(tmp_path), tmp_path / 'second.txt')
            code = second.wait(timeout=180)
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        output = second.output()
        assert code == 2, output
        assert _last_line(output).startswith(
            f'error: {tmp_path / "run"} is in use by pid {first.proc.pid} on '), output
        assert ' since ' in _last_line(output) and 'Traceback' not in output
        assert not second.workers
        assert first.wait() == 0, first.output()
    finally:
        first.kill()
    assert not first.workers_left()
    assert _rows(tmp_path / 'run' / 'metrics.csv') == reference_rows
    _count('concurrent_runs_refused')


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs (mounting needs root; skipped otherwise)."""
    mount_point = tmp_path / 'disk'
    mount_point.mkdir()
    mounted = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', str(mount_point)],
        capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip('cannot mount a tmpfs to fill up (needs root): '
                    + ' '.join((mounted.stderr or 'mount failed').split()))
    try:
        yield mount_point
    finally:
        subprocess.run(['umount', '-l', str(mount_point)], check=False)


def test_full_disk_is_one_line_then_resumes(reference, small_disk):
    """The disk fills up at the second checkpoint: one `error:` line, exit 2,
    no worker left, the rows written so far intact; with space again the
    same command ends with the uninterrupted run's metrics."""
    reference_rows, reference_summary, _ = reference
    filler = small_disk / 'filler'
    stat = os.statvfs(small_disk)
    # Room for the first checkpoint and the validation-selected state beside
    # it (1.5 MB each) and the small files, not for more.
    with open(filler, 'wb') as f:
        f.write(b'\0' * (stat.f_bavail * stat.f_frsize - 4_200_000))
    run = Run(_args(small_disk), small_disk.parent / 'full.txt')
    code = run.wait()
    output = run.output()
    assert code == 2, output
    # The checkpoint, or the validation-selected round's state kept beside it.
    assert re.match(r'error: cannot write the (checkpoint of round \d+|selected state) ',
                    _last_line(output)), output
    assert _last_line(output).endswith(': No space left on device'), output
    assert 'Traceback' not in output
    assert not run.workers_left()
    rows = _rows(small_disk / 'run' / 'metrics.csv')
    assert rows and rows == reference_rows[:len(rows)]
    filler.unlink()
    run = Run(_args(small_disk), small_disk.parent / 'resumed.txt')
    assert run.wait() == 0, run.output()
    assert not run.workers_left()
    assert _rows(small_disk / 'run' / 'metrics.csv') == reference_rows
    assert _summary(run.output()) == reference_summary
    _count('full_disks')


# Every bad value of issue 15 and its neighbours: (flags, words of the line).
BAD_INPUTS = [
    (['--rho_sh=-0.5'], '--rho_sh must be >= 0'),
    (['--rho_ns=inf'], '--rho_ns must be a finite number'),
    (['--local_lr=nan'], '--local_lr must be a finite number'),
    (['--local_lr=-0.1'], '--local_lr must be > 0'),
    (['--server_lr=nan'], '--server_lr must be a finite number'),
    (['--server_lr=0'], '--server_lr must be > 0'),
    (['--client_lr=inf'], '--client_lr must be a finite number'),
    (['--clients_per_round=0'], '--clients_per_round must be >= 1'),
    (['--clients_per_round=81'], '--clients_per_round must be <= 80'),
    (['--client_fraction=nan'], '--client_fraction must be a finite number'),
    (['--client_fraction=0'], '--client_fraction must be > 0'),
    (['--client_fraction=1.5'], '--client_fraction must be <= 1'),
    (['--experiment_name=..'], "invalid experiment name '..'"),
    (['--experiment_name=a/b'], "invalid experiment name 'a/b'"),
    (['--experiment_name='], "invalid experiment name ''"),
    (['--total_rounds=-3'], '--total_rounds must be >= 1'),
    (['--rounds_per_eval=0'], '--rounds_per_eval must be >= 1'),
    (['--rounds_per_checkpoint=-1'], '--rounds_per_checkpoint must be >= 0'),
    (['--seed=-1'], '--seed must be >= 0'),
    (['--seed=4294967296'], '--seed must be <= 4294967295'),
    (['--data_seed=-2'], '--data_seed must be >= 0'),
    (['--sharpness_probe=nan'], '--sharpness_probe must be a finite number'),
    (['--max_group_examples=0'], '--max_group_examples must be >= 1'),
    (['--local_epochs=0'], '--local_epochs must be >= 1'),
    (['--reconstruction_steps=0'], '--reconstruction_steps must be >= 1'),
    (['--dp_noise_multiplier=nan', '--dp_clip=1'], '--dp_noise_multiplier must be a finite'),
    (['--dp_noise_multiplier=1', '--dp_clip=nan'], '--dp_clip must be a finite positive'),
    (['--dp_noise_multiplier=1', '--dp_clip=1', '--dp_delta=nan'], '--dp_delta must be in'),
    (['--num_users=0'], 'num_users must be >= 1'),
    (['--total_rounds=2.5'], 'total_rounds'),
]


@pytest.fixture(scope='module')
def bad_input_results(tmp_path_factory):
    """Every bad input, two at a time: (exit code, output, files written)."""
    base = [flag for flag in TRAIN_SMALL_RUN if not flag.startswith('--validation')]

    def attempt(index):
        flags, _ = BAD_INPUTS[index]
        root = tmp_path_factory.mktemp(f'bad{index}')
        run = Run([*base, f'--root_output_dir={root}/out', *flags], root / 'log.txt')
        code = run.wait(timeout=300)
        written = sorted(str(p) for p in (root / 'out').rglob('*')) if (root / 'out').exists() else []
        return code, run.output(), written, (root / 'out').exists(), run.workers

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(attempt, range(len(BAD_INPUTS))))


@pytest.mark.parametrize('index', range(len(BAD_INPUTS)),
                         ids=[' '.join(flags) for flags, _ in BAD_INPUTS])
def test_bad_input_is_refused_before_anything_is_written(bad_input_results, index):
    """One `error:` line, exit 2, no traceback, no output folder, no worker."""
    code, output, written, root_exists, workers = bad_input_results[index]
    expected = BAD_INPUTS[index][1]
    assert code == 2, output
    assert _last_line(output).startswith('error: ') and expected in _last_line(output), output
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output
    assert not root_exists, written
    assert not workers
    _count('bad_inputs_refused')


def test_rejected_flag_does_not_poison_the_folder(tmp_path):
    """`--rho_sh=-0.5` is refused, then the corrected command runs there."""
    args = [*TRAIN_SMALL_RUN[:4], '--total_rounds=1', f'--root_output_dir={tmp_path}',
            '--experiment_name=x']
    run = Run([*args, '--rho_sh=-0.5'], tmp_path / 'bad.txt')
    assert run.wait() == 2
    run = Run(args, tmp_path / 'good.txt')
    assert run.wait() == 0, run.output()
    assert not run.workers_left()


@pytest.mark.parametrize('second', ['while unwinding', 'after the line'])
def test_a_second_ctrl_c_while_stopping_says_so_once(tmp_path, second):
    """Ctrl-C pressed twice during training: one line, status 130, no
    traceback (a second signal once broke TFF's clean-up mid-way, or printed
    the line again from the exit hooks), and no worker left."""
    run = Run([*TRAIN_SMALL_RUN, '--total_rounds=300', f'--root_output_dir={tmp_path}',
               '--experiment_name=run'], tmp_path / 'out.txt')
    metrics = tmp_path / 'run' / 'metrics.csv'
    run.wait(timeout=240, until=lambda: metrics.exists() and len(
        metrics.read_text().splitlines()) > 2)
    os.kill(run.proc.pid, signal.SIGINT)
    if second == 'while unwinding':
        time.sleep(0.05)
    else:
        run.wait(timeout=120, until=lambda: _LINE[signal.SIGINT] in run.output())
    if run.proc.poll() is None:
        os.kill(run.proc.pid, signal.SIGINT)
    code = run.wait(timeout=120)
    output = run.output()
    assert code == 128 + signal.SIGINT, output
    assert 'Traceback' not in output and 'Exception ignored' not in output, output
    assert output.count(_LINE[signal.SIGINT]) == 1, output
    assert not run.workers_left()
