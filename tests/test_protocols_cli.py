"""launch/train.py with both protocols, held-out users, the floor, the
ceiling and the tuned preset (subprocesses, as users run them)."""

import csv
import json

import numpy as np
import pytest

from tests.test_train_program import SMALL
from tests.test_train_program import _run
from tests.test_train_program import _summary

SAMPLED = ['hr@5', 'ndcg@5', 'hr@10', 'ndcg@10', 'hr@15', 'ndcg@15', 'hr@20', 'ndcg@20']
FULL = SAMPLED + ['mrr']


def _columns(path):
    with open(path) as f:
        return next(csv.reader(f))


@pytest.mark.parametrize('algorithm', ['fedncf', 'itempop', 'central'])
def test_both_protocols_and_heldout_users_everywhere(tmp_path, algorithm):
    code, output = _run([*SMALL, f'--algorithm={algorithm}', '--total_rounds=2',
                         '--eval_protocol=both', '--heldout_users=0.1', '--validation',
                         f'--root_output_dir={tmp_path}'], tmp_path)
    assert code == 0, output
    summary = _summary(output)
    run = tmp_path / f'synthetic_{algorithm}_seed0'
    columns = set(_columns(run / 'metrics.csv'))
    for group, names in (('test', SAMPLED), ('valid', SAMPLED), ('heldout', SAMPLED),
                         ('test_full', FULL), ('valid_full', FULL), ('heldout_full', FULL)):
        assert {f'{group}/{m}' for m in names} <= columns, group
    assert set(summary['selections']) == {'test', 'valid', 'test_full', 'valid_full'}
    full = summary['selections']['valid_full']
    assert {f'heldout_full/{m}' for m in FULL} <= set(full)
    for value in full.values():
        assert np.isfinite(value)
    # Full ranking is the harder protocol: never above the sampled one.
    assert summary['best_full_test_full_hr@10'] <= summary['best_test_hr@10'] + 1e-9
    hparams = json.loads((run / 'hparams.json').read_text())
    assert hparams['eval_protocol'] == 'both' and hparams['heldout_users'] == 0.1
    # The Python API reads every setting launch/train.py records.
    from tff_fedrecgel import api
    settings, foreign = api.Settings.from_hparams(hparams)
    unset_options = {k for k, v in hparams.items()
                     if k.startswith('data_') and k != 'data_dir' and v is None}
    assert foreign == [] and settings.hparams() == {
        k: v for k, v in hparams.items() if k not in unset_options}


def test_full_ranking_every_n_rounds(tmp_path):
    code, output = _run([*SMALL, '--algorithm=fedncf', '--total_rounds=4',
                         '--eval_protocol=both', '--rounds_per_full_eval=3',
                         f'--root_output_dir={tmp_path}'], tmp_path)
    assert code == 0, output
    with open(tmp_path / 'synthetic_fedncf_seed0' / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    full_rounds = [int(r['round']) for r in rows if r.get('test_full/hr@10')]
    sampled_rounds = [int(r['round']) for r in rows if r.get('test/hr@10')]
    assert full_rounds == [3, 4] and sampled_rounds == [1, 2, 3, 4]


def test_tuned_preset_is_recorded_and_explicit_flags_win(tmp_path):
    from tff_fedrecgel import tasks
    assert tasks.get_task('lastfm_2k').preset('tuned') == {
        'server_lr': 0.01, 'client_fraction': 0.2}
    assert tasks.get_task('synthetic').preset('tuned') == {}
    code, output = _run([*SMALL, '--algorithm=fedncf', '--total_rounds=1', '--preset=tuned',
                         '--server_lr=0.02', f'--root_output_dir={tmp_path}'], tmp_path)
    assert code == 0, output
    hparams = json.loads((tmp_path / 'synthetic_fedncf_seed0' / 'hparams.json').read_text())
    assert hparams['preset'] == 'tuned' and hparams['server_lr'] == 0.02
    # The Python API applies the same preset, explicit values winning.
    from tff_fedrecgel import api
    tuned = api.settings('lastfm_2k', preset='tuned', server_lr=0.02)
    assert (tuned.server_lr, tuned.client_fraction) == (0.02, 0.2)


def test_every_task_preset_names_real_settings():
    from tff_fedrecgel import api, tasks
    for name in tasks.TASK_NAMES:
        for method in ('fedncf', 'fedrecgel'):
            settings = api.settings(name, algorithm=method, preset='tuned')
            for key, value in tasks.get_task(name).preset('tuned').items():
                assert getattr(settings, key) == value, (name, method, key)
    # Amazon-Video's preset changes the users' rebuild too; a flag still wins.
    tuned = api.settings('amazon_video', algorithm='fedncf', preset='tuned',
                         reconstruction_steps=5)
    paper = api.settings('amazon_video', algorithm='fedncf')
    assert (tuned.num_negatives, tuned.reconstruction_steps) == (32, 5)
    assert (paper.num_negatives, paper.reconstruction_steps, paper.update) == (4, 5, 'gradient')


@pytest.mark.parametrize('args, fragment', [
    (['--algorithm=itempop', '--rho_sh=0.1'], 'itempop does not take --rho_sh'),
    (['--algorithm=fedncf', '--rho_sh=0.1'], '--rho_sh must be 0.0 for fedncf'),
    (['--algorithm=central', '--workers=localhost:1'], 'does not take --workers'),
    (['--heldout_users=0.95'], '--heldout_users must be <= 0.9'),
    (['--rounds_per_full_eval=0'], '--rounds_per_full_eval must be >= 1'),
    (['--eval_protocol=topk'], 'eval_protocol'),
])
def test_bad_protocol_flags_are_one_line(tmp_path, args, fragment):
    code, output = _run([*SMALL, *args, f'--root_output_dir={tmp_path}'], tmp_path)
    last = output.strip().splitlines()[-1]
    assert code == 2 and last.startswith('error: ') and fragment in last, output
    assert not list(tmp_path.glob('*/hparams.json'))


def test_tuned_preset_fills_what_the_command_line_leaves():
    from absl import flags
    from tff_fedrecgel.launch import _algorithm_flags as algo
    from tff_fedrecgel.launch import _server_flags  # pylint: disable=unused-import (--server_lr)
    from tff_fedrecgel import tasks

    task = tasks.get_task('lastfm_2k')
    try:
        flags.FLAGS(['train', '--task=lastfm_2k', '--preset=tuned'])
        tuned = algo.settings(task)
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['train', '--task=lastfm_2k', '--preset=tuned', '--server_lr=0.003'])
        explicit = algo.settings(task)
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['train', '--task=lastfm_2k'])
        paper = algo.settings(task)
    finally:
        flags.FLAGS.unparse_flags()
    assert (tuned.server_lr, tuned.client_fraction, tuned.preset) == (0.01, 0.2, 'tuned')
    assert (explicit.server_lr, explicit.client_fraction) == (0.003, 0.2)
    assert (paper.server_lr, paper.client_fraction, paper.preset) == (0.001, 0.1, 'paper')
