"""`--config=RUN/hparams.json`: a run's settings file as the command's flags.

A run started from another run's hparams.json alone reproduces it (same
settings, same metrics); flags after `--config` win; a file that is not a
run's settings is one clean line.
"""

import json
import os
import pathlib
import subprocess
import sys

import pandas as pd
import pytest

from tff_fedrecgel.launch import _config_file

REPO = pathlib.Path(__file__).resolve().parents[1]


def _train(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, str(REPO / 'launch' / 'train.py'), *args], capture_output=True,
        text=True, timeout=600, stdin=subprocess.DEVNULL, cwd=cwd,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))


def test_the_settings_file_becomes_flags():
    known = ['task', 'algorithm', 'local_lr', 'num_users', 'validation', 'data_dir',
             'local_state', 'seed']
    hparams = {'task': 'synthetic', 'algorithm': 'fedrecgel', 'local_lr': 0.2,
               'data_num_users': 80, 'validation': False, 'data_dir': None,
               'rounds_per_full_eval': None, 'not_a_flag': 1, 'seed': 3}
    assert _config_file.flags_from_hparams(hparams, known) == [
        '--task=synthetic', '--algorithm=fedrecgel', '--local_lr=0.2', '--num_users=80',
        '--novalidation', '--seed=3']
    # What the recorded method does not take stays out (FedRecon fixes these).
    recon = {'task': 'synthetic', 'algorithm': 'fedrecon', 'local_state': 'reconstruct',
             'local_lr': 0.1}
    assert _config_file.flags_from_hparams(recon, known) == [
        '--task=synthetic', '--algorithm=fedrecon', '--local_lr=0.1']


def test_a_run_from_another_runs_settings_file_reproduces_it(train_reference, tmp_path):
    folder, _ = train_reference
    done = _train(f'--config={folder / "hparams.json"}', f'--root_output_dir={tmp_path}',
                  '--experiment_name=again', '--progress=false')
    assert done.returncode == 0, done.stderr
    again = tmp_path / 'again'
    assert json.loads((again / 'hparams.json').read_text()) == json.loads(
        (folder / 'hparams.json').read_text())
    columns = [c for c in pd.read_csv(folder / 'metrics.csv').columns if c.startswith('test/')]
    pd.testing.assert_frame_equal(pd.read_csv(again / 'metrics.csv')[columns],
                                  pd.read_csv(folder / 'metrics.csv')[columns])


def test_flags_after_the_settings_file_win(train_reference, tmp_path):
    folder, _ = train_reference
    done = _train(f'--config={folder / "hparams.json"}', '--local_lr=0.3', '--total_rounds=1',
                  f'--root_output_dir={tmp_path}', '--experiment_name=changed',
                  '--progress=false')
    assert done.returncode == 0, done.stderr
    hparams = json.loads((tmp_path / 'changed' / 'hparams.json').read_text())
    assert (hparams['local_lr'], hparams['total_rounds']) == (0.3, 1)
    assert hparams['num_negatives'] == json.loads(
        (folder / 'hparams.json').read_text())['num_negatives']


@pytest.mark.parametrize('content,fragment', [
    (None, 'not found'),
    ('{"seed": 1}', 'not a run\'s hparams.json'),
    ('not json', 'not a readable JSON file'),
])
def test_a_bad_settings_file_is_one_line(tmp_path, content, fragment):
    path = tmp_path / 'hparams.json'
    if content is not None:
        path.write_text(content)
    done = _train(f'--config={path}', f'--root_output_dir={tmp_path / "runs"}')
    assert done.returncode == 2
    assert done.stderr.strip().count('\n') == 0 and fragment in done.stderr, done.stderr
    assert not (tmp_path / 'runs').exists()
