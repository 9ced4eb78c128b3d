"""The model a run serves is the round its summary reports (chosen on the
validation item), and early stopping watches that choice."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_train_program import REPO
from tests.test_train_program import SMALL
from tests.test_train_program import _run
from tests.test_train_program import _summary
from tff_fedrecgel import api

RECOMMEND = os.path.join(REPO, 'launch', 'recommend.py')
AUTO = [flag for flag in SMALL if not flag.startswith('--preset')]  # Own data: auto.


@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory):
    """A run with validation under both protocols, stopped early."""
    root = tmp_path_factory.mktemp('selected')
    code, output = _run([*AUTO, '--total_rounds=30', '--validation', '--eval_protocol=both',
                         '--early_stopping_patience=2', f'--root_output_dir={root}',
                         '--experiment_name=run'], root)
    assert code == 0, output
    return root / 'run', _summary(output), output


def test_the_summary_leads_with_the_validation_selected_round(stopped_run):
    _, summary, output = stopped_run
    headline = summary['headline']
    assert headline['selection'] == 'valid_full' and headline['protocol'] == 'full'
    assert headline['round'] == summary['selections']['valid_full']['round']
    assert headline['test_full/hr@10'] == summary['selections']['valid_full']['test_full/hr@10']
    assert f'result: round {headline["round"]}, chosen on the validation item' in output
    floor = summary['popularity']['test_full/hr@10']
    assert f'item popularity on the same split: HR@10 {floor:.4f}' in output
    # The banner of own data names the transfer preset.
    assert 'preset auto: update gradient -> model_delta' in output
    assert 'interactions per user < 50' in output


def test_early_stopping_stops_after_the_patience(stopped_run):
    run, summary, _ = stopped_run
    stopped = summary['stopped_early']
    best = summary['selections']['valid_full']['round']
    assert stopped['patience'] == 2 and stopped['round'] == best + 2 < 30
    assert summary['rounds'] == stopped['round']
    # A second call finds the run stopped and trains nothing more.
    code, output = _run([*AUTO, '--total_rounds=30', '--validation', '--eval_protocol=both',
                         '--early_stopping_patience=2', f'--root_output_dir={run.parent}',
                         '--experiment_name=run'], run.parent, name='again.txt')
    assert code == 0, output
    assert _summary(output)['rounds'] == stopped['round']


def test_served_model_reproduces_the_reported_metrics(stopped_run):
    run, summary, _ = stopped_run
    chosen = summary['headline']['round']
    with api.Session():
        served = api.load_run(run)
        assert served.round_num == chosen
        metrics = served.simulation.evaluate('test', protocol='full')
        assert metrics['hr@10'] == pytest.approx(summary['headline']['test_full/hr@10'],
                                                 abs=1e-6)
        assert metrics['ndcg@10'] == pytest.approx(summary['headline']['test_full/ndcg@10'],
                                                   abs=1e-6)
        assert api.load_run(run, checkpoint='latest').round_num == summary['rounds']
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    out = subprocess.run([sys.executable, RECOMMEND, f'--run_dir={run}', '--user=3',
                          '--json'], capture_output=True, text=True, env=env, timeout=300,
                         stdin=subprocess.DEVNULL, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])['round'] == chosen


def test_early_stopping_needs_a_validation_item(tmp_path):
    code, output = _run([*SMALL, '--early_stopping_patience=2',
                         f'--root_output_dir={tmp_path}'], tmp_path)
    assert code == 2 and 'early_stopping_patience needs --validation' in output
    assert not any(tmp_path.glob('synthetic_*'))
