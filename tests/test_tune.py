"""launch/tune.py: a search that resumes after SIGKILL and writes a preset
that launch/train.py reproduces."""

import contextlib
import dataclasses
import io
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from tests.test_train_program import REPO
from tests.test_train_program import _run
from tests.test_train_program import _summary
from tff_fedrecgel import runtime
from tff_fedrecgel import tuning
from tff_fedrecgel import tuning_study
from tff_fedrecgel.errors import DataError

TUNE = os.path.join(REPO, 'launch', 'tune.py')
DATA = ['--task=synthetic', '--num_users=80', '--num_items=400']
# Evaluation sizes given as flags are fixed for every trial and kept in the preset.
SEARCH = [*DATA, '--total_rounds=2', '--space=server_lr,num_negatives', '--seed=0',
          '--top_ks=5,10', '--eval_negatives=49']


def _tune(args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    return subprocess.run([sys.executable, TUNE, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_search_resumes_after_sigkill_and_its_preset_reproduces(tmp_path):
    root = tmp_path / 'search'
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    log = tmp_path / 'first.txt'
    with open(log, 'w') as out:
        proc = subprocess.Popen([sys.executable, TUNE, *SEARCH, '--trials=5', '--noframe',
                                 f'--root_output_dir={root}'], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while 'trial 0: complete' not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
        assert 'trial 0: complete' in log.read_text(), log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The same command resumes: trial 0 is kept, the one cut short is run again.
    result = _tune([*SEARCH, '--trials=3', f'--root_output_dir={root}'])
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record['finished_trials'] == 3
    assert all(t['trial'] > 0 for t in record['trials_this_call'])
    assert record['trials_per_hour'] > 0 and 'trials per hour' in result.stdout
    # The frame: popularity and the central model searched with the same budget.
    assert record['frame']['ceiling']['finished_trials'] == 3
    table = [line for line in result.stdout.splitlines() if line.startswith('| ')]
    assert [line.split(' | ')[0] for line in table[1:]] == [
        '| popularity', f'| central NeuMF (tuned, trial {record["frame"]["ceiling"]["best_trial"]})',
        f'| fedrecgel (tuned, trial {record["best_trial"]})']
    preset = json.loads((root / tuning.BEST_PRESET).read_text())
    assert set(preset['settings']) == {'total_rounds', 'server_lr', 'num_negatives',
                                       'top_ks', 'eval_negatives', 'validation',
                                       'eval_protocol'}
    trial_hparams = json.loads((pathlib.Path(preset['run_dir']) / 'hparams.json').read_text())
    assert trial_hparams['eval_negatives'] == 49 and trial_hparams['top_ks'] == [5, 10]
    # The best trial's folder is an ordinary run; train.py with the preset
    # reproduces its validation metric exactly.
    best_rows = pd.read_csv(os.path.join(preset['run_dir'], 'metrics.csv'))
    code, output = _run([*DATA, f'--preset={root / tuning.BEST_PRESET}', '--progress=false',
                         f'--root_output_dir={tmp_path}', '--experiment_name=again'],
                        tmp_path)
    assert code == 0, output
    assert f'preset {root / tuning.BEST_PRESET}:' in output
    again = pd.read_csv(tmp_path / 'again' / 'metrics.csv')
    assert again['valid_full/ndcg@10'].max() == pytest.approx(preset['value'], abs=1e-12)
    assert list(again['valid_full/ndcg@10']) == pytest.approx(
        list(best_rows['valid_full/ndcg@10']), abs=1e-12)
    assert _summary(output)['rounds'] == 2
    # The folder now holds this search: another one is refused in a line, unchanged.
    study = (root / tuning_study.STUDY_FILE).read_bytes()
    other = [a for a in SEARCH if a != '--total_rounds=2'] + ['--total_rounds=3']
    result = _tune([*other, '--trials=4', f'--root_output_dir={root}'])
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        'holds a search with other settings (total_rounds); resume it with the same ones or '
        'use another tuning folder (--root_output_dir)'), result.stderr
    assert (root / tuning_study.STUDY_FILE).read_bytes() == study
    # A trial's patience is part of what the search is (the frame's ceiling
    # searched apart gives it as a flag).
    result = _tune([*SEARCH, '--early_stopping_patience=3', '--trials=4',
                    f'--root_output_dir={root}'])
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert 'holds a search with other settings (early_stopping_patience)' in result.stderr
    assert (root / tuning_study.STUDY_FILE).read_bytes() == study


@pytest.mark.parametrize('args, message', [
    (['--validation'], 'a search sets --validation itself'),
    (['--algorithm=itempop'], 'the search covers fedrecgel, fedncf'),
    (['--space=warp_speed'], 'unknown search dimension'),
    (['--space=server_lr,+total_rounds'], 'not both'),
    (['--objective=test/hr@10'], 'objective must be a validation metric'),
    (['--objective=valid_full/xyz'], "valid_full has no 'xyz'; choose one of hr@5, ndcg@5"),
    (['--objective=valid/hr@15', '--top_ks=5,10'], "valid has no 'hr@15'"),
    (['--server_lr=-1'], 'server_lr must be > 0'),
    (['--top_ks=10,200'], 'top_ks must be <= 100 each'),
    (['--prune_after=1'], 'prune_after must be in [0, 1)'),
    (['--early_stopping_patience=0'], 'early_stopping_patience must be >= 1'),
])
def test_bad_searches_are_refused_and_write_nothing(tmp_path, args, message):
    root = tmp_path / 'search'
    result = _tune([*DATA, *args, f'--root_output_dir={root}'], timeout=300)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.count('\n') == 1 and not root.exists()


def test_the_space_leaves_out_what_a_method_cannot_use():
    import optuna

    trial = optuna.trial.FixedTrial({'update': 'gradient', 'server_lr': 0.01,
                                     'rho_sh': 0.1, 'rho_ns': 0.1})
    space = tuning.search_space(['update', 'local_epochs', 'server_lr', 'rho_sh', 'rho_ns'])
    assert tuning.suggest_settings(trial, space, 'fedncf') == {
        'update': 'gradient', 'server_lr': 0.01}
    assert tuning.suggest_settings(trial, space, 'sam_local') == {
        'update': 'gradient', 'server_lr': 0.01, 'rho_ns': 0.1}
    # What the banner lists: the dimensions the method may be asked.
    names = lambda algorithm: {d.name for d in tuning.method_space(space, algorithm)}
    assert names('fedncf') == {'update', 'local_epochs', 'server_lr'}
    assert names('fedrecgel') == {'update', 'local_epochs', 'server_lr', 'rho_sh', 'rho_ns'}
    assert names('central') == set()
    with pytest.raises(DataError, match='objective'):
        tuning.TuneConfig(task='synthetic', objective='valid_full')


def test_a_new_search_starts_from_the_auto_recipe():
    from tff_fedrecgel import api
    from tff_fedrecgel import recipes

    split = api.prepare_data('synthetic', validation=True, num_users=80, num_items=400)
    auto = recipes.auto_recipe(recipes.DataProfile.of(split))
    config = tuning.TuneConfig.create('synthetic', fixed={'total_rounds': 2})
    first = tuning.auto_trial(config, split)
    # Every searched setting the recipe sets has its value; the others are the
    # task's (what an untuned `--preset=auto` run uses). The rounds are not
    # searched by default: the search's `total_rounds` holds for every trial.
    assert auto.pop('total_rounds') == recipes.AUTO_VALIDATED_ROUNDS
    assert 'total_rounds' not in first
    assert {k: first[k] for k in auto} == auto
    assert first == {d: getattr(api.settings('synthetic', preset=recipes.AUTO,
                                             data_profile=recipes.DataProfile.of(split)), d)
                     for d in first}
    narrowed = tuning.TuneConfig.create('synthetic', space=['server_lr', 'rho_sh'])
    assert tuning.auto_trial(narrowed, split) == {
        'server_lr': auto['server_lr'], 'rho_sh': api.settings('synthetic').rho_sh}


def test_rounds_are_searched_only_when_named_and_only_for_federated_methods():
    """A 60-minute search over rounds too did worse than one at fixed rounds:
    the default space leaves them to `--total_rounds`; `--space` names or
    adds them, and then a federated trial draws them while the central
    ceiling keeps its epochs."""
    import optuna

    assert 'total_rounds' not in {d.name for d in tuning.SEARCH_SPACE}
    assert 'total_rounds' not in {d.name for d in tuning.TuneConfig.create('synthetic').space}
    space = tuning.TuneConfig.create('synthetic', space=['server_lr', 'total_rounds']).space
    assert [d.name for d in space] == ['server_lr', 'total_rounds']
    # +NAME adds to the default space, in the searchable order.
    added = tuning.search_space(['+total_rounds'])
    assert added == (*tuning.SEARCH_SPACE, space[1])
    rounds = next(d for d in space if d.name == 'total_rounds')
    assert rounds.integer and rounds.federated
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        asked = tuning.suggest_settings(study.ask(), space, 'fedrecgel')
        assert rounds.low <= asked['total_rounds'] <= rounds.high
    assert set(tuning.suggest_settings(study.ask(), space, 'central')) == set()
    with pytest.raises(DataError, match=r'no trial would try: total_rounds \(fixed by its flag\)'):
        tuning.TuneConfig.create('synthetic', space=['total_rounds'], fixed={'total_rounds': 2})
    with pytest.raises(DataError, match=r'total_rounds \(not searched for central\)'):
        tuning.TuneConfig.create('synthetic', algorithm='central', space=['total_rounds'])


def test_the_central_search_asks_its_rebuild_rate_only_when_users_are_held_out():
    names = lambda **fixed: {d.name for d in tuning.TuneConfig.create(
        'synthetic', algorithm='central', fixed=fixed).space if d.name in ('local_lr',
                                                                            'num_negatives')}
    assert names() == {'num_negatives'}
    assert names(heldout_users=0.1) == {'local_lr', 'num_negatives'}
    # Named, it is refused rather than dropped.
    with pytest.raises(DataError, match=r'local_lr \(it serves only held-out users and none '
                                        r'are \(--heldout_users\)\)'):
        tuning.TuneConfig.create('synthetic', algorithm='central', space=['local_lr'])
    # A federated method trains its users' embeddings at that rate: always asked.
    federated = tuning.TuneConfig.create('synthetic', fixed={})
    assert 'local_lr' in {d.name for d in federated.space}


def test_a_radius_of_zero_starts_the_log_search_at_its_low_end():
    """FilmTrust's global radius is 0, which a log-scale search cannot ask:
    the first trial takes the range's low end, the other values as they are."""
    import optuna
    from tff_fedrecgel import api

    split = api.prepare_data('synthetic', validation=True, num_users=80, num_items=400)
    assert api.settings('filmtrust').rho_sh == 0.0
    config = tuning.TuneConfig.create('filmtrust', fixed={'total_rounds': 2})
    first = tuning.auto_trial(config, split)
    low = next(d.low for d in tuning.SEARCH_SPACE if d.name == 'rho_sh')
    assert first["rho_sh"] == low and first['rho_ns'] == api.settings('filmtrust').rho_ns
    trial = optuna.trial.FixedTrial(first)  # What the study's first trial asks.
    assert tuning.suggest_settings(trial, config.space, 'fedrecgel') == first


def test_api_tune_runs_the_same_search(tmp_path):
    from tff_fedrecgel import api
    from tff_fedrecgel import recipes

    record = api.tune('synthetic', root=tmp_path / 'search', trials=1, space=['server_lr'],
                      data_options={'num_users': 80, 'num_items': 400}, total_rounds=1)
    assert record['finished_trials'] == 1 and record['best_trial'] == 0
    # The ceiling searches what the central model takes, with the same budget
    # (its negatives and Adam rate; no users are held out, so not their
    # rebuild rate), ranked every epoch until it stops improving; the table
    # reads the three runs' validation-selected test metrics.
    ceiling = record['frame']['ceiling']
    assert ceiling['finished_trials'] == 1 and ceiling['algorithm'] == 'central'
    assert set(ceiling['best_settings']) == {'total_rounds', 'rounds_per_full_eval',
                                             'early_stopping_patience', 'num_negatives',
                                             'lr_scale', 'validation', 'eval_protocol'}
    # The floor is the popularity the best trial's summary carries (what
    # --algorithm=itempop reaches: test_popularity_floor.py); nothing trains it.
    floor = json.loads((pathlib.Path(record['best_run_dir']) / 'summary.json').read_text())
    popularity = record['table'][2].split(' | ')
    assert popularity[0] == '| popularity'
    assert popularity[1] == f'{floor["popularity"]["test/hr@10"]:.4f}'
    assert popularity[4] == f'{floor["popularity"]["test_full/hr@10"]:.4f}'
    assert not (tmp_path / 'search' / 'floor').exists()
    preset = json.loads((tmp_path / 'search' / tuning.BEST_PRESET).read_text())
    assert set(preset['settings']) == {'total_rounds', 'server_lr', 'validation', 'eval_protocol'}
    # What a study runner waits on: the search reached its trials.
    assert json.loads((tmp_path / 'search' / tuning.PROGRESS).read_text()) == {
        'trials': 1, 'finished_trials': 1, 'done': True, 'best_trial': 0}
    # The one trial is the auto recipe's.
    split = api.prepare_data('synthetic', validation=True, num_users=80, num_items=400)
    auto = recipes.auto_recipe(recipes.DataProfile.of(split))
    assert preset['settings']['server_lr'] == auto['server_lr']
    assert api.settings('synthetic', preset=record['preset_file']).server_lr == (
        preset['settings']['server_lr'])


class _SlowExperiment:
    """A stand-in for `api.experiment` whose rounds take 50 ms each."""

    first_evaluation = 1  # The first round that evaluates.

    def __init__(self, *args, **kwargs):
        pass

    def train(self, on_round_end):
        for round_num in range(1, 41):
            time.sleep(0.05)
            released = ({'valid_full': {'ndcg@10': 0.01 * round_num}}
                        if round_num >= self.first_evaluation else {})
            on_round_end(round_num, released)
        return {'seconds_per_round': 0.05, 'rounds': 40}


class _LateExperiment(_SlowExperiment):
    first_evaluation = 30


def test_a_trial_past_its_wall_clock_limit_is_pruned(tmp_path):
    import types

    split = types.SimpleNamespace(valid_items=[0])
    space = tuning.search_space(['server_lr'])
    # 0.005 minutes is 0.3 s: about six of the 40 rounds.
    limited = tuning.TuneConfig(task='synthetic', trials=2, trial_minutes=0.005, space=space,
                                start_from_auto=False)
    record = tuning.run_search(limited, root=tmp_path / 'limited', split=split,
                               make_experiment=_SlowExperiment)
    trials = record['trials_this_call']
    assert [t['state'] for t in trials] == ['pruned', 'pruned']
    assert all(t['stopped'] == 'wall clock' and t['wall_seconds'] < 1.5 for t in trials)
    assert all(0 < t['value'] < 0.4 for t in trials)
    # A trial stopped before its first evaluation reached no value (not -1).
    late = tuning.run_search(limited, root=tmp_path / 'late', split=split,
                             make_experiment=_LateExperiment)
    assert [t['value'] for t in late['trials_this_call']] == [None, None]
    assert record['completed_trials'] == 0 and 'preset_file' not in record
    # The default limit is a share of the budget; without one, trials finish.
    assert tuning.TuneConfig(task='synthetic', max_minutes=8).trial_limit_minutes == 2
    free = tuning.TuneConfig(task='synthetic', trials=1, space=space, start_from_auto=False)
    assert free.trial_limit_minutes is None
    record = tuning.run_search(free, root=tmp_path / 'free', split=split,
                               make_experiment=_SlowExperiment)
    assert record['trials_this_call'][0]['state'] == 'complete'
    assert record['best_value'] == pytest.approx(0.4)
    with pytest.raises(DataError, match='trial_minutes'):
        tuning.TuneConfig(task='synthetic', trial_minutes=0)


class _CurveExperiment:
    """A stand-in for `api.experiment`: the first three trials lead early
    and stay at 0.5; the fourth starts at 0.1 and reaches 0.9 from round 10."""

    made = 0

    def __init__(self, *args, total_rounds, **kwargs):
        import types

        self.settings = types.SimpleNamespace(total_rounds=total_rounds)
        self.slow = _CurveExperiment.made == 3
        _CurveExperiment.made += 1

    def train(self, on_round_end):
        rounds = self.settings.total_rounds
        for round_num in range(1, rounds + 1):
            value = (0.1 if round_num < 10 else 0.9) if self.slow else 0.5
            on_round_end(round_num, {'valid_full': {'ndcg@10': value}})
        return {'seconds_per_round': 0.0, 'rounds': rounds}


@pytest.mark.parametrize('prune_after,slow_state', [(0.0, 'pruned'), (0.5, 'complete')])
def test_a_slow_starter_lives_through_the_pruning_warm_up(tmp_path, prune_after, slow_state):
    import types

    _CurveExperiment.made = 0
    config = tuning.TuneConfig(task='synthetic', trials=4, space=tuning.search_space(['server_lr']),
                               base={'total_rounds': 20}, start_from_auto=False,
                               prune_after=prune_after)
    record = tuning.run_search(config, root=tmp_path, split=types.SimpleNamespace(valid_items=[0]),
                               make_experiment=_CurveExperiment)
    states = [t['state'] for t in record['trials_this_call']]
    assert states == ['complete'] * 3 + [slow_state]
    assert record['best_value'] == (0.9 if slow_state == 'complete' else 0.5)
    with pytest.raises(DataError, match='prune_after'):
        tuning.TuneConfig(task='synthetic', prune_after=1)


class _FlatExperiment:
    """A stand-in for `api.experiment`: the first trial holds 0.5 every
    round, the later ones 0.1."""

    made = 0

    def __init__(self, *args, total_rounds, **kwargs):
        import types

        self.settings = types.SimpleNamespace(total_rounds=total_rounds)
        self.value = 0.5 if _FlatExperiment.made == 0 else 0.1
        _FlatExperiment.made += 1

    def train(self, on_round_end):
        for round_num in range(1, self.settings.total_rounds + 1):
            on_round_end(round_num, {'valid_full': {'ndcg@10': self.value}})
        return {'seconds_per_round': 0.0, 'rounds': self.settings.total_rounds}


def test_one_completed_trial_is_enough_to_prune_the_ones_below_it(tmp_path):
    """So a search of expensive trials (the first being `auto`'s recipe)
    stops the hopeless ones at their first evaluation."""
    import types

    _FlatExperiment.made = 0
    config = tuning.TuneConfig(task='synthetic', trials=3, space=tuning.search_space(['server_lr']),
                               base={'total_rounds': 20}, start_from_auto=False)
    record = tuning.run_search(config, root=tmp_path, split=types.SimpleNamespace(valid_items=[0]),
                               make_experiment=_FlatExperiment)
    assert [t['state'] for t in record['trials_this_call']] == ['complete', 'pruned', 'pruned']
    assert _FlatExperiment.made == 3 and record['best_trial'] == 0


@pytest.mark.parametrize('objective, base, expected', [
    # Full ranking every 5 rounds: the objective reads those rounds only.
    ('valid_full/ndcg@10', {'rounds_per_full_eval': 5}, {'eval_protocol': 'both', 'rounds_per_eval': 5}),
    # A schedule the user gave wins.
    ('valid_full/ndcg@10', {'rounds_per_full_eval': 5, 'rounds_per_eval': 2},
     {'eval_protocol': 'both', 'rounds_per_eval': 2}),
    ('valid_full/ndcg@10', {}, {'eval_protocol': 'both'}),
    ('valid/hr@10', {'rounds_per_full_eval': 5}, {'eval_protocol': 'sampled'}),
])
def test_trials_evaluate_only_the_rounds_their_objective_reads(tmp_path, objective, base,
                                                               expected):
    """Evaluating each round costs more than a cheap round's training
    (LastFM-2K: 3.5 of 5.7 s), and a full-ranking search reads none of it
    between its full-ranking rounds."""
    import types

    made = []

    class _Recording(_FlatExperiment):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    config = tuning.TuneConfig(task='synthetic', trials=1, space=tuning.search_space(['server_lr']),
                               base={'total_rounds': 2, **base}, objective=objective,
                               start_from_auto=False)
    tuning.run_search(config, root=tmp_path, split=types.SimpleNamespace(valid_items=[0]),
                      make_experiment=_Recording)
    assert {k: made[0].get(k) for k in expected} == expected
    assert ('rounds_per_eval' in made[0]) == ('rounds_per_eval' in expected)


def test_a_trial_stopped_by_a_signal_is_reported_without_optunas_warnings(monkeypatch):
    tuning_study.quiet_optuna()
    tuning_study.quiet_optuna()  # Once is enough: no second filter, no second line.
    shown = io.StringIO()
    handlers = [h for h in logging.getLogger('optuna').handlers
                if type(h) is logging.StreamHandler]  # Optuna's own, to stderr.
    assert handlers
    for handler in handlers:
        monkeypatch.setattr(handler, 'stream', shown)
    log = logging.getLogger('optuna.study._optimize')
    try:
        raise runtime.Terminated(signal.SIGTERM)
    except KeyboardInterrupt:
        log.warning('Trial 3 failed with parameters: {} because of Terminated', exc_info=True)
    log.warning('Trial 3 failed with value None.')
    try:
        raise ValueError('a real error')
    except ValueError:
        log.warning('Trial 4 failed with parameters: {}', exc_info=True)
    # The trial's own line says it was interrupted and runs again.
    assert 'Trial 3' not in shown.getvalue() and 'Traceback' in shown.getvalue()
    assert 'a real error' in shown.getvalue()  # Other errors keep theirs.


class _StoppedOnce:
    """A stand-in for `api.experiment` whose first trial is stopped by SIGTERM."""

    made = []

    def __init__(self, *args, total_rounds=2, **settings):
        import types

        self.settings = types.SimpleNamespace(total_rounds=total_rounds)
        self.values = settings
        _StoppedOnce.made.append(settings)

    def train(self, on_round_end):
        if len(_StoppedOnce.made) == 1:
            raise runtime.Terminated(signal.SIGTERM)
        on_round_end(1, {'valid_full': {'ndcg@10': self.values['server_lr']}})
        return {'seconds_per_round': 0.0, 'rounds': 1}


def test_a_stopped_or_killed_trial_runs_again_with_its_settings_when_resumed(tmp_path):
    import types

    import optuna

    split = types.SimpleNamespace(valid_items=[0])
    config = tuning.TuneConfig(task='synthetic', trials=2, space=tuning.search_space(['server_lr']),
                               start_from_auto=False)
    _StoppedOnce.made = []
    with pytest.raises(runtime.Terminated):
        tuning.run_search(config, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    record = tuning.run_search(config, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    first, again, drawn = _StoppedOnce.made[:3]
    assert again['server_lr'] == first['server_lr']
    assert again['run_dir'] == first['run_dir'] != drawn['run_dir']  # It trains on there.
    assert [t['trial'] for t in record['trials_this_call']] == [1, 2]
    # The resumed call's own draw is new, not the first call's again.
    assert drawn['server_lr'] != first['server_lr']
    study = optuna.load_study(study_name=tuning_study.STUDY_NAME,
                              storage=f'sqlite:///{tmp_path / tuning_study.STUDY_FILE}')
    assert study.trials[0].user_attrs[tuning_study.INTERRUPTED]
    assert study.trials[1].user_attrs[tuning_study.RETRY_OF] == 0
    # A trial a killed search left running runs again too, once.
    killed = study.ask()
    killed.suggest_float('server_lr', 1e-4, 1e-1, log=True)
    more = dataclasses.replace(config, trials=3)
    record = tuning.run_search(more, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    assert _StoppedOnce.made[-1]['server_lr'] == killed.params['server_lr']
    # It named no folder (as trials of older versions): it trains on in its number's.
    assert _StoppedOnce.made[-1]['run_dir'].name == f'trial_{killed.number:03d}'
    assert [t['trial'] for t in record['trials_this_call']] == [4]
    record = tuning.run_search(more, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    assert record['trials_this_call'] == []  # Retried once: nothing queued again.


class _ResumingExperiment:
    """A stand-in for `api.experiment` that keeps its rows in its run folder
    and resumes from a checkpoint two rounds behind them (a run is cut
    between checkpoints, and resuming drops the rows after its checkpoint);
    100 ms a round, its metric 0.9 at round 1 and 0.1 after."""

    starts = []

    def __init__(self, *args, run_dir, total_rounds=100, **kwargs):
        self.run_dir, self.total = pathlib.Path(run_dir), total_rounds

    def train(self, on_round_end):
        path = self.run_dir / 'metrics.csv'
        rows = path.read_text().splitlines() if path.exists() else ['round,valid_full/ndcg@10']
        done = max(0, len(rows) - 3)
        _ResumingExperiment.starts.append((self.run_dir.name, done))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text('\n'.join(rows[:done + 1]) + '\n')
        start = time.perf_counter()
        for round_num in range(done + 1, self.total + 1):
            time.sleep(0.1)
            value = 0.9 if round_num == 1 else 0.1
            with open(path, 'a', encoding='utf-8') as f:
                f.write(f'{round_num},{value}\n')
            on_round_end(round_num, {'valid_full': {'ndcg@10': value}})
        seconds = (time.perf_counter() - start) / (self.total - done)
        return {'seconds_per_round': seconds, 'rounds': self.total}


def test_a_trial_the_budgets_end_cuts_trains_on_from_its_checkpoint_next_call(
        tmp_path, monkeypatch, recwarn):
    """Cut by the call's budget, not by its own limit, a trial is not judged
    by it: the next call resumes its run, and its earlier rounds count."""
    import types

    tuning_study.quiet_optuna()
    shown = io.StringIO()
    for handler in logging.getLogger('optuna').handlers:
        if type(handler) is logging.StreamHandler:  # Optuna's own, to stderr.
            monkeypatch.setattr(handler, 'stream', shown)
    split = types.SimpleNamespace(valid_items=[0])
    config = tuning.TuneConfig(task='synthetic', trials=1, space=tuning.search_space(['server_lr']),
                               base={'total_rounds': 60}, max_minutes=0.05, trial_minutes=10,
                               start_from_auto=False)
    _ResumingExperiment.starts = []
    record = tuning.run_search(config, root=tmp_path, split=split,
                               make_experiment=_ResumingExperiment)
    (cut,) = record['trials_this_call']
    assert (cut['state'], cut['stopped']) == ('interrupted', 'budget')
    assert 'failed' not in shown.getvalue()  # Its own line says it; no Optuna traceback.
    assert record['finished_trials'] == 0 and 'preset_file' not in record
    record = tuning.run_search(dataclasses.replace(config, max_minutes=None), root=tmp_path,
                               split=split, make_experiment=_ResumingExperiment)
    (again,) = record['trials_this_call']
    assert again['state'] == 'complete' and again['trial'] == 1
    (first, _), (resumed, done) = _ResumingExperiment.starts
    assert first == resumed == 'trial_000' and 0 < done < 60
    # Each round is reported once: the rounds after the checkpoint are trained again...
    assert not [w for w in recwarn if 'already reported' in str(w.message)]
    # ...and the overhead is over the rounds this call trained, not all of them.
    assert again['overhead_seconds'] >= 0
    # Its wall time is this call's part only: no rate of trials an hour from it.
    assert again['resumed'] and 'trials_per_hour' not in record
    # Round 1's 0.9 was trained before the cut: it counts only through the folder.
    assert record['best_value'] == 0.9 and again['value'] == 0.9
    assert record['best_run_dir'] == str(tmp_path / 'trials' / 'trial_000')


def test_a_folder_holding_another_search_is_refused_and_kept_as_it_was(tmp_path):
    """A resumed search may change its budget only: other fixed settings
    would mix two configurations and write a preset its trials never ran."""
    import types

    split = types.SimpleNamespace(valid_items=[0])
    config = tuning.TuneConfig(task='synthetic', trials=1, space=tuning.search_space(['server_lr']),
                               base={'total_rounds': 2, 'mlp_layers': (8, 4)},
                               start_from_auto=False)
    _StoppedOnce.made = [None]  # Past the first trial: none is stopped.
    tuning.run_search(config, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    preset = (tmp_path / tuning.BEST_PRESET).read_text()
    study = (tmp_path / tuning_study.STUDY_FILE).read_bytes()
    other = dataclasses.replace(config, base={'total_rounds': 3, 'mlp_layers': (8, 4)})
    with pytest.raises(DataError, match=r'holds a search with other settings \(total_rounds\); '
                                        r'.*another tuning folder \(--root_output_dir\)'):
        tuning.run_search(other, root=tmp_path, split=split, make_experiment=_StoppedOnce)
    with pytest.raises(DataError, match=r'other settings \(space\)'):
        tuning.run_search(dataclasses.replace(config, space=tuning.search_space(['local_lr'])),
                          root=tmp_path, split=split, make_experiment=_StoppedOnce)
    assert (tmp_path / tuning.BEST_PRESET).read_text() == preset
    assert (tmp_path / tuning_study.STUDY_FILE).read_bytes() == study
    # A study from before studies kept their definition is judged by its trials.
    import optuna
    held = optuna.load_study(study_name=tuning_study.STUDY_NAME,
                             storage=f'sqlite:///{tmp_path / tuning_study.STUDY_FILE}')
    held.set_user_attr(tuning_study.DEFINITION, None)
    with pytest.raises(DataError, match=r'other settings \(space\)'):
        tuning_study.check_folder(tmp_path, dataclasses.replace(
            config, space=tuning.search_space(['local_lr'])).definition)
    # A larger budget resumes it.
    record = tuning.run_search(dataclasses.replace(config, trials=2, max_minutes=5), root=tmp_path,
                               split=split, make_experiment=_StoppedOnce)
    assert [t['trial'] for t in record['trials_this_call']] == [1]


def test_a_search_refuses_a_folder_another_search_holds(tmp_path):
    """The API's search locks its folder as the command's does."""
    import types

    from tff_fedrecgel import program

    config = tuning.TuneConfig(task='synthetic', trials=1, space=tuning.search_space(['server_lr']),
                               start_from_auto=False)
    split = types.SimpleNamespace(valid_items=[0])
    with program.lock_experiment(root_output_dir=tmp_path, experiment_name='search'):
        with pytest.raises(program.ExperimentLockedError,
                           match=r'in use by pid .*; wait for that run to end or use another '
                                 r'tuning folder \(--root_output_dir\)'):
            tuning.run_search(config, root=tmp_path / 'search', split=split,
                              make_experiment=_StoppedOnce)
    assert not (tmp_path / 'search' / tuning_study.STUDY_FILE).exists()
