"""End-to-end checks of launch/train.py: outputs, resume, errors.

Each run is a subprocess (as users run it); its output goes to a file, not a
pipe, and a killed run's whole process group (with TFF's worker) is killed.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN = str(REPO / 'launch' / 'train.py')
# A small synthetic population: quick rounds, 99 test negatives available.
# The paper's settings (generated data defaults to --preset=auto, whose
# tests are test_presets.py and test_selected_round.py).
SMALL = ['--task=synthetic', '--num_users=80', '--num_items=400',
         '--progress=false', '--preset=paper']
TIMING_COLUMNS = ('train/round_seconds', 'eval_seconds')


def _start(args, log_path):
    log = open(log_path, 'w')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    return subprocess.Popen(
        [sys.executable, TRAIN, *args], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=True)


def _run(args, tmp_path, name='log.txt', timeout=300):
    log_path = tmp_path / name
    proc = _start(args, log_path)
    try:
        proc.wait(timeout=timeout)
    finally:
        _kill_group(proc)
    return proc.returncode, log_path.read_text()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _summary(output):
    return json.loads(output.strip().splitlines()[-1])


def _metrics_rows(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in TIMING_COLUMNS:
            row.pop(column, None)
    return rows


def _strip_timing(summary):
    return {k: v for k, v in summary.items()
            if 'seconds' not in k and k not in ('output_dir', 'peak_rss_mb')}


def _read_scalars(log_dir):
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {tag: [e.step for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()['tensors']}


@pytest.fixture(scope='module')
def reference_run(train_reference):
    """An uninterrupted 6-round run with checkpoints every 2 rounds (shared
    with test_fault_injection.py: conftest.train_reference)."""
    return train_reference


def test_outputs_and_summary_line(reference_run):
    """The experiment folder holds every output; the last line is the summary."""
    folder, output = reference_run
    summary = _summary(output)
    for key in ('best_round', 'best_test_hr@10', 'best_test_ndcg@10',
                'best_valid_round', 'best_valid_test_hr@10', 'final',
                'rounds', 'seconds_per_round'):
        assert key in summary
    assert summary['rounds'] == 6
    assert 1 <= summary['best_round'] <= 6
    assert set(summary['final']) == {
        f'{m}@{k}' for k in (5, 10, 15, 20) for m in ('hr', 'ndcg')}
    assert json.loads((folder / 'summary.json').read_text())['rounds'] == 6
    hparams = json.loads((folder / 'hparams.json').read_text())
    assert hparams['task'] == 'synthetic' and hparams['total_rounds'] == 6
    rows = _metrics_rows(folder / 'metrics.csv')
    assert [int(r['round']) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(float(r['train/clients']) == 8 for r in rows)
    assert (folder / 'tensorboard' / 'ref' / 'projector_config.pbtxt').exists()


def test_tensorboard_scalars_have_every_round(reference_run):
    """TensorBoard holds the training, SAM and ranking scalars at steps 1..6,
    in the run's subfolder named after the experiment."""
    folder, _ = reference_run
    scalars = _read_scalars(folder / 'tensorboard' / 'ref')
    for tag in ('train/loss', 'train/sam_loss_global', 'train/sam_loss_local',
                'train/sharpness_global', 'train/sharpness_local',
                'workload/clients', 'workload/dropped_clients',
                'workload/round_seconds', 'workload/eval_seconds', 'test/hr@10',
                'test/ndcg@10', 'test/hr@20', 'valid/hr@10'):
        assert scalars.get(tag) == [1, 2, 3, 4, 5, 6], tag


def test_killed_run_resumes_exactly(reference_run, tmp_path):
    """SIGKILL mid-run, restart with the same flags: same metrics as uninterrupted."""
    folder, reference_output = reference_run
    args = [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=ref',
            '--total_rounds=6', '--rounds_per_checkpoint=2', '--validation']
    proc = _start(args, tmp_path / 'killed.txt')
    checkpoint = tmp_path / 'ref' / 'checkpoints' / 'program_state_4'
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and proc.poll() is None:
        assert time.monotonic() < deadline, 'no checkpoint appeared'
        time.sleep(0.05)
    _kill_group(proc)
    code, output = _run(args, tmp_path, 'resumed.txt')
    assert code == 0, output
    assert 'resuming from the checkpoint of round' in output
    assert _metrics_rows(tmp_path / 'ref' / 'metrics.csv') == _metrics_rows(
        folder / 'metrics.csv')
    assert _strip_timing(_summary(output)) == _strip_timing(
        _summary(reference_output))


def test_corrupt_latest_checkpoint_falls_back(reference_run, tmp_path):
    """A truncated latest checkpoint is reported and the previous one used."""
    folder, _ = reference_run
    args = [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=ref',
            '--total_rounds=4', '--rounds_per_checkpoint=2', '--validation']
    code, output = _run(args, tmp_path, 'first.txt')
    assert code == 0, output
    latest = tmp_path / 'ref' / 'checkpoints' / 'program_state_4'
    for path in latest.rglob('*'):
        if path.is_file() and path.stat().st_size > 0:
            with open(path, 'r+b') as f:
                f.truncate(path.stat().st_size // 2)
    args[-3] = '--total_rounds=6'
    code, output = _run(args, tmp_path, 'second.txt')
    assert code == 0, output
    assert 'checkpoint of round 4 is unreadable' in output
    assert 'resuming from the checkpoint of round 2' in output
    assert _metrics_rows(tmp_path / 'ref' / 'metrics.csv') == _metrics_rows(
        folder / 'metrics.csv')


@pytest.mark.parametrize('args, expected', [
    (['--task=nosuch'], 'task'),
    (['--task=filmtrust', '--data_dir=/nonexistent/filmtrust'], '/nonexistent'),
    (['--task=synthetic', '--algorithm=fedncf', '--rho_sh=0.1'], 'fedncf'),
    (['--task=synthetic', '--client_fraction=0.2', '--clients_per_round=5'],
     'clients_per_round'),
    (['--task=synthetic', '--total_rounds=0'], 'total_rounds'),
    (['--task=synthetic', 'extra'], 'unexpected'),
    (['--task=synthetic', '--algorithm=fedrecon', '--local_state=persistent'],
     'fedrecon'),
    (['--task=synthetic', '--algorithm=fedrecon', '--sharpness_probe=0.05'],
     'sharpness_probe'),
    (['--task=synthetic', '--sharpness_probe=-1'], 'sharpness_probe'),
    (['--task=synthetic', '--num_negatives=-1'], 'num_negatives'),
    (['--task=synthetic', '--algorithm=fedrecon', '--server_optimizer=yogi'],
     'server_optimizer'),
])
def test_bad_input_is_one_line(args, expected, tmp_path):
    """User errors print one line 'error: ...' and exit 2, no traceback."""
    code, output = _run([*args, f'--root_output_dir={tmp_path}'], tmp_path)
    assert code == 2, output
    lines = [l for l in output.strip().splitlines() if l.strip()]
    assert lines[-1].startswith('error: ') and expected in lines[-1], output
    assert 'Traceback' not in output


def test_unwritable_output_folder_is_one_line(tmp_path):
    """An output root below a regular file cannot be created: one-line error."""
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    code, output = _run(['--task=synthetic', f'--root_output_dir={blocker}/runs'],
                        tmp_path)
    assert code == 2, output
    assert output.strip().splitlines()[-1].startswith('error: ')
    assert 'Traceback' not in output


def test_sharpness_probe_measures_without_changing_training(tmp_path):
    """--sharpness_probe adds the probe columns; every other figure is equal."""
    rows = {}
    for name, extra in (('plain', []), ('probe', ['--sharpness_probe=0.05'])):
        code, output = _run([*SMALL, f'--root_output_dir={tmp_path}',
                             f'--experiment_name={name}', '--total_rounds=3',
                             '--algorithm=fedncf', *extra], tmp_path, f'{name}.txt')
        assert code == 0, output
        rows[name] = _metrics_rows(tmp_path / name / 'metrics.csv')
    for plain, probe in zip(rows['plain'], rows['probe']):
        sharpness = {k: float(probe.pop(k)) for k in list(probe) if 'probe_' in k}
        assert set(sharpness) == {'train/probe_sharpness_global',
                                  'train/probe_sharpness_local'}
        # FedNCF trains without SAM, yet the probe measures its sharpness.
        assert all(v > 0 for v in sharpness.values()), sharpness
        assert probe == plain


def test_fedrecon_trains_from_the_command_line(tmp_path):
    """--algorithm=fedrecon runs TFF's FedRecon and reports like the others."""
    code, output = _run([*SMALL, f'--root_output_dir={tmp_path}',
                         '--experiment_name=fr', '--total_rounds=3',
                         '--algorithm=fedrecon'], tmp_path)
    assert code == 0, output
    summary = _summary(output)
    assert summary['rounds'] == 3 and 0 <= summary['best_test_hr@10'] <= 1
    hparams = json.loads((tmp_path / 'fr' / 'hparams.json').read_text())
    assert hparams['algorithm'] == 'fedrecon'
    assert hparams['local_state'] == 'reconstruct' and hparams['loss_reduction'] == 'mean'
    rows = _metrics_rows(tmp_path / 'fr' / 'metrics.csv')
    assert [int(r['round']) for r in rows] == [1, 2, 3]
    assert all(float(r['train/loss']) > 0 for r in rows)


def test_server_optimizer_and_negatives_flags(tmp_path):
    """--server_optimizer and --num_negatives reach the round and hparams."""
    rows, hparams = {}, {}
    for name, extra in (('default', []),
                        ('custom', ['--server_optimizer=sgdm', '--server_lr=0.5',
                                    '--num_negatives=2'])):
        code, output = _run([*SMALL, f'--root_output_dir={tmp_path}',
                             f'--experiment_name={name}', '--total_rounds=2',
                             '--algorithm=fedncf', *extra], tmp_path, f'{name}.txt')
        assert code == 0, output
        rows[name] = _metrics_rows(tmp_path / name / 'metrics.csv')
        hparams[name] = json.loads((tmp_path / name / 'hparams.json').read_text())
    assert (hparams['default']['server_optimizer'], hparams['default']['num_negatives']) == (
        'adam', 4)
    assert (hparams['custom']['server_optimizer'], hparams['custom']['num_negatives']) == (
        'sgdm', 2)
    # Same cohort and positives: (1 + 2) / (1 + 4) of the examples.
    first = [float(rows[n][0]['train/examples_per_client']) for n in ('default', 'custom')]
    assert first[1] == pytest.approx(first[0] * 3 / 5)


def test_metrics_csv_columns_in_reading_order(reference_run):
    """round, train/, then test/ and valid/ with hr@5 < hr@10 < ... < ndcg@5."""
    folder, _ = reference_run
    with open(folder / 'metrics.csv') as f:
        header = next(csv.reader(f))
    assert header[0] == 'round' and header[-1] == 'eval_seconds'
    ranking = [f'{m}@{k}' for m in ('hr', 'ndcg') for k in (5, 10, 15, 20)]
    groups = [c.split('/')[0] for c in header[1:-1]]
    assert list(dict.fromkeys(groups)) == ['train', 'test', 'valid']
    for group in ('test', 'valid'):
        assert [c.split('/')[1] for c in header if c.startswith(f'{group}/')] == ranking


def test_flagfile_with_plain_progress_lines(tmp_path):
    """--flagfile reads flags (later ones win); progress to a file is plain lines."""
    flagfile = tmp_path / 'run.flags'
    flagfile.write_text('\n'.join(
        ['# a tiny synthetic run', *SMALL[:3], '--total_rounds=9',
         f'--root_output_dir={tmp_path}', '--experiment_name=ff', '']))
    code, output = _run([f'--flagfile={flagfile}', '--total_rounds=2', '--progress'],
                        tmp_path)
    assert code == 0, output
    assert _summary(output)['rounds'] == 2
    assert json.loads((tmp_path / 'ff' / 'hparams.json').read_text())['data_num_users'] == 80
    assert '\r' not in output
    progress = [l for l in output.splitlines() if l.startswith('round ')]
    assert [l.split()[1] for l in progress] == ['1/2', '2/2'], output
    assert 'sampled hr@10=' in progress[-1] and 'left 00:00' in progress[-1]


def test_progress_line_shows_the_validation_chosen_figure(tmp_path):
    """With a validation item the progress line shows what the headline
    will: the test HR@10 at the round chosen on it so far, named by its
    protocol (not the round's own figure)."""
    code, output = _run([*SMALL[:3], '--preset=paper', '--total_rounds=3', '--validation',
                         '--eval_protocol=both', '--rounds_per_full_eval=1', '--progress',
                         f'--root_output_dir={tmp_path}', '--experiment_name=chosen'],
                        tmp_path)
    assert code == 0, output
    headline = _summary(output)['headline']
    progress = [l for l in output.splitlines() if l.startswith('round ')]
    assert (f'valid-chosen r{headline["round"]} full hr@10='
            f'{headline["test_full/hr@10"]:.4f}  ') in progress[-1], progress
