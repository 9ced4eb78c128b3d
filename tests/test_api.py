"""The Python API, recommendations in original ids, and the trained-model export.

Two small synthetic runs are trained once through the API: FedRecGEL (users
keep their embedding) and FedRecon (users keep none: every embedding is
rebuilt). The command lines `launch/recommend.py` and `launch/export.py
--run_dir` run on them as subprocesses, each watched for the TFF worker it
starts (which must be gone when it ends); the exported SavedModel is loaded
by a separate Python process with TensorFlow alone.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import worker_watch

from tff_fedrecgel import api
from tff_fedrecgel.program import training_thread
from tff_fedrecgel import recommendation
from tff_fedrecgel import run_settings
from tff_fedrecgel import simulation
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data.id_maps import IdMap
from tff_fedrecgel.data.id_maps import UnknownIdError
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.models import neumf

REPO = pathlib.Path(__file__).resolve().parents[1]
# A new user's items (original ids of the synthetic data, repeats count once).
NEW_USER_ITEMS = ['3', '17', '3', '40']
DATA = {'num_users': 60}
ATOL = 1e-5


def _train(root, name, **settings):
    with api.Session():
        experiment = api.experiment('synthetic', run_dir=root / name, data_options=DATA,
                                    rounds_per_checkpoint=2, **settings)
        summary = experiment.train()
        return experiment, summary


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """{'fedrecgel': (experiment, summary), 'fedrecon': ...}, trained once."""
    root = tmp_path_factory.mktemp('api_runs')
    return {'fedrecgel': _train(root, 'fedrecgel', total_rounds=3),
            'fedrecon': _train(root, 'fedrecon', algorithm='fedrecon', total_rounds=2)}


# ---------------------------------------------------------------------------
# Settings and ids (no TensorFlow work).


def test_settings_take_the_task_and_method_defaults():
    filmtrust = api.get_task('filmtrust')
    s = api.settings('filmtrust', data_dir='/data/filmtrust')
    assert (s.rho_sh, s.rho_ns) == (filmtrust.rho_sh, filmtrust.rho_ns) == (0.0, 0.02)
    assert (s.total_rounds, s.client_fraction) == (100, 0.1)
    assert api.settings('filmtrust', algorithm='fedncf').rho_ns == 0.0
    assert api.settings('filmtrust', rho_ns=0.5, total_rounds=7).rho_ns == 0.5
    recon = api.settings('synthetic', algorithm='fedrecon')
    assert (recon.local_state, recon.loss_reduction) == ('reconstruct', 'mean')
    with pytest.raises(ValueError, match='rho_ns must be 0.0 for fedncf'):
        api.settings('filmtrust', algorithm='fedncf', rho_ns=0.1)
    with pytest.raises(ValueError, match='unknown setting'):
        api.settings('filmtrust', no_such_setting=1)
    with pytest.raises(ValueError, match='fedrecon does not take local_state'):
        api.settings('synthetic', algorithm='fedrecon', local_state='persistent')
    with pytest.raises(DataError, match='unknown task'):
        api.settings('nope')


@pytest.mark.parametrize('overrides, message', [
    ({'server_lr': 0.0}, 'server_lr must be > 0, got 0.0'),
    ({'seed': -1}, 'seed must be >= 0'),
    ({'seed': 2**32}, 'seed must be <= 4294967295'),
    ({'heldout_users': 0.95}, 'heldout_users must be <= 0.9'),
    ({'client_fraction': float('nan')}, 'client_fraction must be a finite number'),
    ({'rounds_per_checkpoint': -1}, 'rounds_per_checkpoint must be >= 0'),
    ({'eval_protocol': 'topk'}, 'eval_protocol must be one of'),
])
def test_settings_refuse_values_out_of_range(overrides, message):
    with pytest.raises(run_settings.SettingError, match=re.escape(message)):
        api.settings('synthetic', **overrides)


def test_data_options_out_of_range_name_the_option():
    from tff_fedrecgel.errors import OptionError

    with pytest.raises(OptionError, match=re.escape('synthetic: seed must be >= 0, got -2')):
        api.settings('synthetic', data_options={'seed': -2})


def test_cohort_counts_only_the_training_users():
    s = api.settings('synthetic', heldout_users=0.5, client_fraction=0.5)
    assert s.cohort(100) == 25
    assert api.settings('synthetic', clients_per_round=50, heldout_users=0.5).cohort(100) == 50
    with pytest.raises(run_settings.SettingError, match='clients_per_round must be <= 50'):
        api.settings('synthetic', clients_per_round=51, heldout_users=0.5).cohort(100)


def test_hparams_round_trip_and_foreign_settings():
    s = api.settings('synthetic', data_options={'num_users': 30}, seed=3)
    hparams = s.hparams()
    assert hparams['data_num_users'] == 30 and 'data_options' not in hparams
    assert api.Settings.from_hparams(hparams) == (s, [])
    # launch/train.py records unset data options as null. DP settings are
    # settings; a name this version does not know is foreign.
    recorded = dict(hparams, data_num_items=None, some_later_setting=1.0)
    loaded, foreign = api.Settings.from_hparams(recorded)
    assert loaded == s and foreign == ['some_later_setting']
    private = api.settings('synthetic', dp_noise_multiplier=1.0, dp_clip=0.1,
                           total_rounds=3)
    recorded = private.hparams(num_users=100)
    assert recorded['dp_delta'] == 0.01 and 'dp_noise_multiplier' not in s.hparams()
    assert api.Settings.from_hparams(recorded) == (
        dataclasses.replace(private, dp_delta=0.01), [])


def test_id_maps():
    users = IdMap(kind='user', size=3, ids=np.array([7, 42, 1000], np.int64))
    assert users.index('42') == users.index(42) == 1
    assert users.original(2) == 1000 and '8' not in users and 'abc' not in users
    with pytest.raises(UnknownIdError, match="unknown user id '8'"):
        users.index('8')
    items = IdMap(kind='item', size=4, ids=np.array(['a', 'b x'], dtype=object))
    assert items.indices(['b x', 'a']).tolist() == [1, 0]
    assert items.num_with_id == 2 and items.as_strings() == ['a', 'b x', '', '']
    with pytest.raises(UnknownIdError, match="unknown item ids 'c', 'd'"):
        items.indices(['a', 'c', 'd'])
    assert IdMap(kind='user', size=2, ids=None).index('1') == 1


# ---------------------------------------------------------------------------
# Training, checkpoints, evaluation.


def test_train_evaluate_and_load(runs):
    experiment, summary = runs['fedrecgel']
    assert summary['rounds'] == 3 and experiment.round_num == 3
    metrics = experiment.metrics()
    assert metrics.index.tolist() == [1, 2, 3]
    assert metrics['test/hr@10'].iloc[-1] == pytest.approx(summary['final']['hr@10'])
    assert experiment.evaluate() == pytest.approx(summary['final'])
    with api.Session():
        loaded = api.load_run(experiment.paths.root)
        assert loaded.round_num == 3
        assert loaded.settings == experiment.settings
        for a, b in zip(loaded.simulation.global_weights, experiment.simulation.global_weights):
            np.testing.assert_array_equal(a, b)
        assert loaded.evaluate() == pytest.approx(summary['final'])
        assert api.load_run(experiment.paths.root, round_num=2).round_num == 2


def test_a_loaded_run_trains_on(runs, tmp_path):
    experiment, _ = runs['fedrecgel']
    copy = tmp_path / 'copy'
    subprocess.run(['cp', '-r', str(experiment.paths.root), str(copy)], check=True)
    with api.Session():
        loaded = api.load_run(copy)
        summary = loaded.train(total_rounds=4)
    assert summary['rounds'] == 4 and loaded.metrics().index.tolist() == [1, 2, 3, 4]


def test_session_stops_its_worker(tff_runtime):
    with api.Session() as session:
        assert api.Session.current() is session
        experiment_split = api.prepare_data('synthetic', **DATA)
        sim = simulation.build_simulation(
            split=experiment_split, method='fedrecgel',
            work=client_update.ClientWorkConfig(), clients_per_round=2)
        sim.initialize()  # A TFF computation: the session's worker runs it.
        pid = session.worker_pid
        assert pid is not None and pid != tff_runtime.worker_pid
    assert session.worker_pid is None and not session.open
    deadline = time.monotonic() + 10
    while os.path.exists(f'/proc/{pid}') and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f'/proc/{pid}') or worker_watch.alive_since(pid) is None
    assert api.Session.current() is None


# ---------------------------------------------------------------------------
# Recommendations.


def _keras_scores(model, tables):
    """Every item's logit from the Keras NeuMF (one client's model)."""
    keras = neumf.NeuMF(model.model_config)
    for variable, value in zip(keras.global_variables, model.global_weights):
        variable.assign(value)
    for variable, value in zip(keras.local_variables, tables):
        variable.assign(value)
    return keras(np.arange(model.model_config.num_items, dtype=np.int32)).numpy()


def test_top_k_of_a_stored_user(runs):
    experiment, _ = runs['fedrecgel']
    model = experiment.model()
    split = experiment.split
    user_id = split.user_ids[5]
    embedding = model.user_embedding(str(user_id))
    assert embedding.source == recommendation.STORED
    np.testing.assert_array_equal(embedding.tables[0],
                                  experiment.simulation.algorithm.local_tables()[0][5:6])
    seen = set(split.train_items[split.train_users == 5].tolist())
    assert set(embedding.seen_items.tolist()) == seen
    scores = _keras_scores(model, embedding.tables)
    np.testing.assert_allclose(model.scores(embedding.tables)[0], scores, atol=ATOL)
    top = experiment.recommend(user_id, k=10)
    unseen = [i for i in np.argsort(-scores, kind='stable') if i not in seen]
    assert [r.item_id for r in top] == [split.item_ids[i].item() for i in unseen[:10]]
    assert [r.rank for r in top] == list(range(1, 11))


def test_rebuilt_users_match_the_simulation(runs):
    """Users who keep no embedding: the one rebuilt for a recommendation is
    the one the simulation evaluates with; a new user with the same items as
    user 0 gets user 0's embedding."""
    experiment, _ = runs['fedrecon']
    model = experiment.model()
    assert model.local_tables is None
    tables = experiment.simulation.local_tables()  # Rebuilt for every user.
    for user in (0, 7):
        embedding = model.user_embedding(experiment.split.user_ids[user])
        assert embedding.source == recommendation.REBUILT
        for mine, theirs in zip(embedding.tables, tables):
            np.testing.assert_allclose(mine[0], theirs[user], atol=ATOL)
    items = model.items.originals(model._train_data.positives(0))  # pylint: disable=protected-access
    new_user = model.embedding_from_items(items)
    for mine, theirs in zip(new_user.tables, tables):
        np.testing.assert_allclose(mine[0], theirs[0], atol=ATOL)
    top = model.recommend(items=items, k=5)
    assert not set(model.items.indices([r.item_id for r in top])) & set(
        new_user.seen_items.tolist())


def test_held_out_items_without_ids_are_never_recommended(runs):
    """Amazon-Video's fixed item count: indices past the id map have no id."""
    experiment, _ = runs['fedrecgel']
    base = experiment.model()
    split = experiment.split
    short = preprocess.Split(**{**split.__dict__, 'item_ids': split.item_ids[:-50]})
    model = recommendation.TrainedModel(
        model_config=base.model_config, global_weights=base.global_weights, split=short,
        reconstruction=base.reconstruction, local_tables=base.local_tables)
    top = model.recommend(split.user_ids[0], k=split.num_items)
    assert max(model.items.indices([r.item_id for r in top])) < split.num_items - 50


def test_recommend_refuses_bad_ids(runs):
    model = runs['fedrecgel'][0].model()
    with pytest.raises(UnknownIdError, match='unknown user id'):
        model.recommend('no such user')
    with pytest.raises(UnknownIdError, match='unknown item id'):
        model.recommend(items=['no such item'])
    with pytest.raises(DataError, match='not both'):
        model.recommend(runs['fedrecgel'][0].split.user_ids[0], items=[1])
    with pytest.raises(DataError, match='give a user id'):
        model.recommend()


# ---------------------------------------------------------------------------
# Command lines: recommend.py, export.py --run_dir.


def _start_cli(script, args, log_path):
    with open(log_path, 'w') as log:
        return subprocess.Popen(
            [sys.executable, str(REPO / 'launch' / f'{script}.py'), *args], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), start_new_session=True)


def _wait_cli(procs, timeout=240):
    """Waits for every program, noting the TFF workers each starts.

    Returns:
      One dict (pid -> start time) of workers per program.
    """
    workers = [{} for _ in procs]
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        for proc, seen in zip(procs, workers):
            worker_watch.note_workers(proc.pid, seen)
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise AssertionError(f'{proc.args} did not end in {timeout} s')
    return workers


def _run_cli(script, args, tmp_path, timeout=60):
    """Runs launch/<script>.py; returns (exit code, output, workers seen)."""
    log_path = tmp_path / f'{script}.log'
    proc = _start_cli(script, args, log_path)
    workers = _wait_cli([proc], timeout)[0]
    return proc.returncode, log_path.read_text(), workers


@pytest.fixture(scope='module')
def fedrecon_cli(runs, tmp_path_factory):
    """recommend.py (a user, and a new user's --items) and export.py
    --run_dir on the FedRecon run, side by side.

    FedRecon keeps no user embedding: restoring it and rebuilding embeddings
    run TFF computations, so each program starts a TFF worker, which must
    not outlive it. Returns {script: (exit code, output, workers seen)} and
    the export folder.
    """
    experiment, _ = runs['fedrecon']
    root = tmp_path_factory.mktemp('fedrecon_cli')
    user_id = experiment.split.user_ids[7]
    commands = {
        'recommend': [f'--run_dir={experiment.paths.root}', f'--user={user_id}', '--k=5'],
        'recommend_items': [f'--run_dir={experiment.paths.root}',
                            f'--items={",".join(NEW_USER_ITEMS)}', '--k=5'],
        'recommend_none': [f'--run_dir={experiment.paths.root}', f'--user={user_id}', '--k=5',
                           '--exclude=none'],
        'export': [f'--run_dir={experiment.paths.root}', f'--output_dir={root / "export"}'],
    }
    procs = {name: _start_cli(name.split('_')[0], args, root / f'{name}.log')
             for name, args in commands.items()}
    workers = _wait_cli(list(procs.values()))
    results = {name: (proc.returncode, (root / f'{name}.log').read_text(), seen)
               for (name, proc), seen in zip(procs.items(), workers)}
    return results, root / 'export'


def test_recommend_cli_prints_original_ids(runs, fedrecon_cli):
    experiment, _ = runs['fedrecon']
    code, output, workers = fedrecon_cli[0]['recommend']
    assert code == 0, output
    lines = output.strip().splitlines()
    assert 'user 7 (rebuilt embedding' in lines[-7]
    assert lines[-6].split() == ['rank', 'item_id', 'score']
    expected = experiment.recommend(experiment.split.user_ids[7], k=5)
    printed = [line.split() for line in lines[-5:]]
    assert [int(p[1]) for p in printed] == [r.item_id for r in expected]
    np.testing.assert_allclose([float(p[2]) for p in printed],
                               [r.score for r in expected], atol=1e-4)
    assert workers, 'the check below needs a worker to have run'
    assert not worker_watch.workers_left(workers)


@pytest.mark.parametrize('args, fragment', [
    (['--run_dir={missing}', '--user=1'], 'run folder not found'),
    (['--run_dir={empty}', '--user=1'], 'no checkpoint yet'),
    (['--run_dir={run}', '--user=no-such-user'], "unknown user id 'no-such-user'"),
    (['--run_dir={run}', '--items=1,no-such-item'], "unknown item id 'no-such-item'"),
    (['--run_dir={run}'], 'give --user=ID'),
])
def test_recommend_cli_bad_input_is_one_line(runs, tmp_path, args, fragment):
    empty = tmp_path / 'empty'
    (empty / 'checkpoints').mkdir(parents=True)
    (empty / 'hparams.json').write_text(json.dumps(runs['fedrecgel'][0].settings.hparams()))
    paths = {'missing': tmp_path / 'missing', 'empty': empty,
             'run': runs['fedrecgel'][0].paths.root}
    code, output, workers = _run_cli(
        'recommend', [a.format(**paths) for a in args], tmp_path, timeout=60)
    assert code == 2, output
    assert output.startswith('error: ') and fragment in output
    assert len(output.strip().splitlines()) == 1 and not workers


def test_exported_model_prints_what_recommend_prints_in_another_process(
        runs, fedrecon_cli, tmp_path):
    """launch/export.py --run_dir (no worker left), then plain
    `tf.saved_model.load` in a separate process: the very lines
    launch/recommend.py prints, for a user of the data and a new user."""
    code, output, workers = fedrecon_cli[0]['export']
    out = fedrecon_cli[1]
    assert code == 0, output
    assert json.loads(output.strip().splitlines()[-1])['round'] == 2
    assert workers and not worker_watch.workers_left(workers)
    assert (out / 'model.json').exists() and (out / 'items.csv').exists()
    asked = {'user': str(runs['fedrecon'][0].split.user_ids[7]), 'k': 5,
             'items': NEW_USER_ITEMS}
    result = subprocess.run(
        [sys.executable, '-I', str(REPO / 'tests' / 'saved_model_lines.py'),
         str(out / 'saved_model'), json.dumps(asked)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded['loaded_project']
    for script, key in (('recommend', 'user'), ('recommend_items', 'new_user'),
                        ('recommend_none', 'user_none')):
        code, printed, _ = fedrecon_cli[0][script]
        assert code == 0, printed
        assert printed.strip().splitlines()[-6:] == loaded[key]


def test_in_process_export_of_stored_embeddings(runs, tmp_path):
    """Experiment.export of users who keep their embedding: the stored rows,
    the same scores and top-K, `exclude` and unknown ids."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    experiment, _ = runs['fedrecgel']
    info = experiment.export(tmp_path / 'export')
    assert info['metadata']['round'] == 3 and info['user_embeddings'] == 'stored'
    loaded = tf.saved_model.load(str(tmp_path / 'export' / 'saved_model'))
    model = experiment.model()
    tables = model.local_tables
    user_ids = [str(u) for u in experiment.split.user_ids[:4]]
    np.testing.assert_array_equal(loaded.user_embedding(user_ids)['embedding'].numpy(),
                                  np.concatenate(tables, axis=1)[:4])
    scores = loaded.signatures['score'](embedding=np.concatenate(tables, axis=1)[:4])
    np.testing.assert_allclose(scores['scores'].numpy(), model.scores(
        [t[:4] for t in tables]), atol=ATOL)
    top = loaded.signatures['recommend'](user_ids=tf.constant(user_ids), k=tf.constant(7))
    for row, user_id in zip(top['item_ids'].numpy(), user_ids):
        assert [i.decode() for i in row] == [str(r.item_id)
                                            for r in model.recommend(user_id, k=7)]
    # `exclude` replaces the seen items: with none, each user's best item.
    everything = loaded.recommend(user_ids, 1, exclude=tf.constant([], tf.string))
    best = model.scores([t[:4] for t in tables]).argmax(axis=1)
    assert [i.decode() for i in everything['item_ids'].numpy()[:, 0]] == [
        str(i) for i in model.items.originals(best)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r'unknown user ids[\s\S]*nope'):
        loaded.recommend(['nope'], 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r'unknown item ids[\s\S]*nope'):
        loaded.recommend_for_items(['nope'], 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match='k must be >= 1'):
        loaded.recommend(user_ids, 0)


def test_training_beside_a_running_event_loop():
    """In a Jupyter kernel the main thread runs an asyncio loop: training then
    runs in a thread with the caller's TFF context, and an interrupt stops it
    at a round's end."""
    import asyncio  # pylint: disable=g-import-not-at-top
    import signal  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    def where(check_stop):
        check_stop()
        return threading.current_thread(), tff.framework.get_context_stack().current

    def until_stopped(check_stop):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        while True:  # Rounds, each ending with the check.
            time.sleep(0.05)
            check_stop()

    async def in_loop(run):
        return training_thread.run_here_or_in_thread(run)  # pylint: disable=protected-access

    loop = asyncio.new_event_loop()
    try:
        thread, context = loop.run_until_complete(in_loop(where))
        assert thread is not threading.main_thread()
        assert context is tff.framework.get_context_stack().current
        with pytest.raises(KeyboardInterrupt, match='train\\(\\) again resumes'):
            loop.run_until_complete(in_loop(until_stopped))
    finally:
        loop.close()
    assert training_thread.run_here_or_in_thread(where)[0] is threading.main_thread()  # pylint: disable=protected-access


@pytest.mark.parametrize('preset', [None, '1'])
def test_importing_the_api_quietens_tensorflow_unless_set(preset):
    """`from tff_fedrecgel import api` hides TensorFlow's start-up noise (CUDA
    plugin registration on a machine without GPUs) unless the user chose a
    log level."""
    env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
    if preset is not None:
        env['TF_CPP_MIN_LOG_LEVEL'] = preset
    code = ('import os\nfrom tff_fedrecgel import api\n'
            'print(os.environ["TF_CPP_MIN_LOG_LEVEL"])\n'
            'import tensorflow as tf\ntf.constant(1.0) + 1.0\n')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            timeout=180, check=False, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (preset or '3')
    if preset is None:
        assert 'Unable to register' not in result.stderr
        assert 'tensorflow/' not in result.stderr, result.stderr
