"""Evaluation of a fixed sample of users (--eval_users), with standard errors."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tff_fedrecgel import eval_sample
from tff_fedrecgel import evaluation
from tff_fedrecgel import full_ranking
from tff_fedrecgel import run_settings
from tff_fedrecgel import simulation
from tff_fedrecgel import tasks
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.errors import SettingError

REPO = pathlib.Path(__file__).resolve().parents[1]
WORK = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.02, reconstruction_steps=2)


@pytest.fixture(scope='module')
def split():
    return tasks.get_task('synthetic').load_split(num_users=80, num_items=150)


def test_the_sample_depends_only_on_the_population():
    first = eval_sample.sample_positions(1000, 50)
    assert len(first) == 50 and len(set(first.tolist())) == 50
    assert np.all(np.diff(first) > 0) and first.max() < 1000
    np.testing.assert_array_equal(first, eval_sample.sample_positions(1000, 50))
    assert not np.array_equal(first, eval_sample.sample_positions(1001, 50))
    assert eval_sample.sample_positions(1000, None) is None
    assert eval_sample.sample_positions(1000, 1000) is None  # Everyone.


def test_standard_errors_follow_the_finite_population_formula():
    values = {'hr@10': np.array([1, 0, 0, 1, 1, 0, 0, 0], np.float32),
              'ndcg@10': np.array([0.5, 0, 0, 1, 0.3, 0, 0, 0.1], np.float32)}
    got = eval_sample.summarize(values, population=40)
    for name, v in values.items():
        v = v.astype(np.float64)
        assert got[name] == pytest.approx(v.mean())
        expected = np.sqrt((1 - 8 / 40) * v.var(ddof=1) / 8)
        assert got[name + '_se'] == pytest.approx(expected, rel=1e-9)
    assert list(eval_sample.summarize(values, None)) == ['hr@10', 'ndcg@10']
    assert eval_sample.summarize(values, population=8)['hr@10_se'] == 0.0


@pytest.mark.parametrize('method', ['fedrecgel', 'itempop'])
def test_sampled_evaluation_is_the_evaluation_of_the_sampled_users(split, method):
    everyone = simulation.build_simulation(split=split, method=method, work=WORK,
                                           clients_per_round=10, seed=0)
    sampled = simulation.build_simulation(split=split, method=method, work=WORK,
                                          clients_per_round=10, seed=0, eval_users=25)
    for sim in (everyone, sampled):
        sim.initialize()
        sim.run_round()
    users, positions = sampled.evaluated_users()
    assert len(users) == 25
    np.testing.assert_array_equal(users, everyone.train_users[positions])
    for protocol in ('sampled', 'full'):
        full = everyone.evaluate('test', protocol=protocol)
        got = sampled.evaluate('test', protocol=protocol)
        assert set(got) == set(full) | {k + '_se' for k in full}
        if method == 'itempop':
            scores = everyone.algorithm.item_scores
            if protocol == 'sampled':
                expected = evaluation.evaluate_item_scores(
                    scores, split.candidates('test', users), sample_of=80)
            else:
                expected = full_ranking.evaluate_item_scores(
                    scores, split.test_items[users], everyone.train_data.csr(users),
                    sample_of=80)
        else:
            tables = [t[users] for t in everyone.algorithm.local_tables()]
            if protocol == 'sampled':
                expected = evaluation.evaluate_users(
                    everyone.algorithm.model_config, everyone.global_weights, tables,
                    split.candidates('test', users), sample_of=80)
            else:
                expected = full_ranking.evaluate_full(
                    everyone.algorithm.model_config, everyone.global_weights, tables,
                    split.test_items[users], everyone.train_data.csr(users), sample_of=80)
        assert got == pytest.approx(dict(expected), rel=1e-6, abs=1e-9)
        assert all(got[k + '_se'] > 0 for k in full if 0 < got[k] < 1)


def test_the_sample_is_the_same_for_every_seed_and_method(split):
    chosen = [simulation.build_simulation(split=split, method=method, work=WORK,
                                          clients_per_round=10, seed=seed,
                                          eval_users=30).evaluated_users()[0]
              for method, seed in (('fedrecgel', 0), ('fedrecgel', 7), ('fedmf', 3))]
    for users in chosen[1:]:
        np.testing.assert_array_equal(users, chosen[0])


def test_the_setting_is_range_checked_and_recorded():
    with pytest.raises(SettingError, match='eval_users'):
        run_settings.settings('synthetic', eval_users=0)
    with pytest.raises(SettingError, match='eval_users'):
        run_settings.settings('synthetic', eval_users=2.5)
    assert run_settings.settings('synthetic', eval_users=50).hparams()['eval_users'] == 50
    assert run_settings.settings('synthetic').hparams()['eval_users'] is None


def test_train_reports_a_sample_with_standard_errors(tmp_path):
    # Output to a file, not a pipe: TFF's worker may hold a pipe open.
    log = tmp_path / 'log.txt'
    with open(log, 'w') as out:
        code = subprocess.run(
            [sys.executable, str(REPO / 'launch' / 'train.py'), '--task=synthetic',
             '--num_users=60', '--num_items=300', '--progress=false', '--preset=paper',
             '--total_rounds=2', '--eval_users=20', '--rounds_per_checkpoint=0',
             f'--root_output_dir={tmp_path}', '--experiment_name=sample'],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
            timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')).returncode
    output = log.read_text()
    assert code == 0, output[-2000:]
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary['evaluated_users']['populations']['train'] == {'evaluated': 20, 'of': 60}
    assert 'test/hr@10_se' in summary['headline']
    assert 'test/hr@10_se' in summary['selections']['test']
    assert 'hr@10_se' in summary['final']
    hparams = json.loads((tmp_path / 'sample' / 'hparams.json').read_text())
    assert hparams['eval_users'] == 20


def test_users_without_stored_state_rebuild_only_the_sample(split):
    everyone = simulation.build_simulation(split=split, method='fedrecon', work=WORK,
                                           clients_per_round=10, seed=0)
    sampled = simulation.build_simulation(split=split, method='fedrecon', work=WORK,
                                          clients_per_round=10, seed=0, eval_users=25)
    for sim in (everyone, sampled):
        sim.initialize()
        sim.run_round()
    users, positions = sampled.evaluated_users()
    rebuilt = [t[positions] for t in everyone.local_tables()]
    expected = evaluation.evaluate_users(
        everyone.algorithm.model_config, everyone.global_weights, rebuilt,
        split.candidates('test', users), sample_of=80)
    got = sampled.evaluate('test')
    assert got == pytest.approx(dict(expected), rel=1e-4, abs=1e-6)
    assert len(sampled._rebuilt['train_sample'][1][0]) == 25
