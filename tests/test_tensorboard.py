"""TensorBoard: hparams and projector files, and what a TensorBoard server shows.

The end-to-end test trains a small run with string ids from the command line,
resumes it with more rounds, starts TensorBoard on the run's one log folder
(the README's command) and reads the plugins' HTTP data.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pandas as pd
import portpicker
import pytest

from tff_fedrecgel.data import preprocess
from tff_fedrecgel.program import tensorboard_extras

REPO = pathlib.Path(__file__).resolve().parents[1]


def _session_start_infos(log_dir):
    """(file, hparams) of every hparams session summary in the folder."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.plugins.hparams import metadata
    found = []
    for path in sorted(pathlib.Path(log_dir).glob('events.out.tfevents.*')):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    info = metadata.parse_session_start_info_plugin_data(
                        value.metadata.plugin_data.content)
                    found.append((path.name, info))
    return found


def test_session_hparams_orders_and_drops_unset_values():
    values = tensorboard_extras.session_hparams(
        {'zeta': 1, 'seed': np.int64(3), 'task': 'filmtrust', 'data_dir': None,
         'rho_sh': 0.0, 'shape': (1, 2), 'validation': np.bool_(True)},
        key_hparams=('task', 'algorithm', 'seed', 'rho_sh'))
    assert list(values) == ['task', 'seed', 'rho_sh', 'shape', 'validation', 'zeta']
    assert values['seed'] == 3 and type(values['seed']) is int
    assert values['validation'] is True
    assert values['shape'] == '(1, 2)'
    assert 'None' not in map(str, values.values())


def test_metric_display_names():
    assert tensorboard_extras.metric_display_name('test/hr@10') == 'test HR@10'
    assert tensorboard_extras.metric_display_name('train/loss') == 'train loss'


def test_scalar_tags_put_counters_and_timings_apart_with_descriptions():
    tag = tensorboard_extras.scalar_tag
    assert tag('train/round_seconds')[0] == 'workload/round_seconds'
    assert tag('eval_seconds')[0] == 'workload/eval_seconds'
    assert tag('train/clients')[0] == 'workload/clients'
    assert tag('train/loss')[0] == 'train/loss'
    assert tag('test_full/mrr')[0] == 'test_full/mrr'
    assert 'top 10' in tag('test/hr@10')[1] and '99 sampled' in tag('test/hr@10')[1]
    assert 'every item' in tag('valid_full/ndcg@5')[1]
    assert 'never trained on' in tag('heldout/hr@20')[1]
    assert 'rho_sh' in tag('train/sam_loss_global')[1]
    # TensorBoard orders groups by name: the metric groups come first.
    groups = ['test', 'valid', 'heldout_full', 'train', 'workload']
    assert sorted(groups)[-1] == 'workload'


def test_rewriting_hparams_replaces_the_session(tmp_path):
    first = {'task': 'synthetic', 'total_rounds': 2, 'data_dir': None}
    tensorboard_extras.write_hparams(tmp_path, hparams=first, trial_id='exp',
                                     metric_tags=['test/hr@10'])
    tensorboard_extras.write_hparams(
        tmp_path, hparams={**first, 'total_rounds': 5}, trial_id='exp',
        metric_tags=['test/hr@10'])
    (only,) = _session_start_infos(tmp_path)
    info = only[1]
    assert info.group_name == 'exp'
    assert info.hparams['total_rounds'].number_value == 5
    assert info.hparams['task'].string_value == 'synthetic'
    assert 'data_dir' not in info.hparams


def _tiny_split(item_ids):
    return preprocess.Split(
        num_users=3, num_items=4, num_interactions=8,
        train_users=np.array([0, 0, 0, 1, 2], np.int32),  # user 0 twice on 1.
        train_items=np.array([1, 1, 2, 1, 0], np.int32),
        test_items=np.array([3, 3, 3], np.int32),
        test_negatives=np.zeros((3, 1), np.int32),
        user_ids=np.array([10, 20, 30], np.int64), item_ids=item_ids)


def test_projector_labels_items_by_original_id(tmp_path):
    split = _tiny_split(np.array(['a\tb', 'song 1', 'c'], dtype=object))
    gmf = np.arange(8, dtype=np.float32).reshape(4, 2)
    mlp = np.ones((4, 3), np.float32)
    tensorboard_extras.write_item_projector(
        tmp_path, item_tables={'item_gmf': gmf, 'item_mlp': mlp}, split=split)
    labels = pd.read_csv(tmp_path / 'projector' / 'items.tsv', sep='\t',
                         dtype=str, keep_default_na=False)
    assert labels['item'].tolist() == ['a b', 'song 1', 'c', '#3']
    assert labels['train_users'].astype(int).tolist() == [1, 2, 1, 0]
    np.testing.assert_allclose(
        np.loadtxt(tmp_path / 'projector' / 'item_gmf.tsv', delimiter='\t'), gmf)
    config = (tmp_path / 'projector_config.pbtxt').read_text()
    assert config.count('embeddings {') == 2
    assert 'tensor_path: "projector/item_mlp.tsv"' in config


def test_projector_refuses_a_table_of_another_size(tmp_path):
    with pytest.raises(ValueError, match='item_gmf'):
        tensorboard_extras.write_item_projector(
            tmp_path, item_tables={'item_gmf': np.zeros((3, 2))},
            split=_tiny_split(None))


# End to end: train, resume, TensorBoard --------------------------------------


def _train(args, log_path):
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / 'launch' / 'train.py'), *args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
            start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # With TFF's worker.
            except ProcessLookupError:
                pass
            proc.wait()
    output = log_path.read_text()
    assert proc.returncode == 0, output
    return output


def _get(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


@pytest.fixture(scope='module')
def served_run(tmp_path_factory):
    """A resumed 2 + 1 round run on string ids, served by TensorBoard."""
    root = tmp_path_factory.mktemp('tensorboard')
    rng = np.random.default_rng(0)
    rows = [(f'listener-{u}', f'song-{i}', t) for u in range(40)
            for t, i in enumerate(rng.choice(300, 8 + u % 5, replace=False))]
    pd.DataFrame(rows, columns=['user', 'item', 'ts']).to_csv(
        root / 'log.csv', index=False)
    args = ['--task=csv', f'--data_dir={root / "log.csv"}',
            '--csv_timestamp_col=ts', '--validation', '--progress=false',
            f'--root_output_dir={root}', '--experiment_name=listening_test']
    first = _train([*args, '--total_rounds=2'], root / 'first.txt')
    resumed = _train([*args, '--total_rounds=3'], root / 'resumed.txt')
    assert 'resuming from the checkpoint of round 2' in resumed
    log_dir = root / 'listening_test' / 'tensorboard'

    port = portpicker.pick_unused_port()
    server = subprocess.Popen(
        [sys.executable, '-m', 'tensorboard.main', f'--logdir={log_dir}',
         f'--port={port}', '--host=127.0.0.1', '--load_fast=false'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL)
    url = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                groups = json.loads(_get(
                    f'{url}/data/plugin/hparams/session_groups',
                    {'experimentName': '', 'startIndex': 0, 'sliceSize': 10,
                     'allowedStatuses': ['STATUS_UNKNOWN']}))
                if groups.get('sessionGroups'):
                    break
            except OSError:
                pass
            assert server.poll() is None, 'TensorBoard exited'
            assert time.monotonic() < deadline, 'TensorBoard served no data'
            time.sleep(1)
        yield {'url': url, 'log_dir': log_dir, 'first': first,
               'rows': rows, 'groups': groups}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_run_prints_the_tensorboard_command_of_its_environment(served_run,
                                                              monkeypatch):
    from tff_fedrecgel.launch import _entry  # pylint: disable=g-import-not-at-top
    monkeypatch.chdir(REPO)  # Where the run was started.
    expected = _entry.tensorboard_command(served_run['log_dir'])
    assert f'view the curves: {expected}' in served_run['first'].splitlines()
    program = expected.split(' --logdir ')[0].split()[0]
    # This environment's tensorboard (or python), not one found on PATH.
    assert os.path.dirname(os.path.abspath(program)) == os.path.dirname(
        os.path.abspath(sys.executable))


def test_every_plugin_is_active_from_the_one_logdir(served_run):
    # The projector decides in a background thread whether it has data.
    deadline = time.monotonic() + 60
    while True:
        listing = json.loads(_get(f'{served_run["url"]}/data/plugins_listing'))
        active = {name for name, info in listing.items() if info['enabled']}
        if 'projector' in active or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {'scalars', 'hparams', 'projector'} <= active


def test_hparams_dashboard_is_readable_and_current(served_run):
    experiment = json.loads(_get(f'{served_run["url"]}/data/plugin/hparams/experiment',
                                 {'experimentName': ''}))
    names = [h['name'] for h in experiment['hparamInfos']]
    # The dashboard shows the first five by default.
    assert names[:5] == ['task', 'algorithm', 'seed', 'rho_sh', 'rho_ns']
    assert [m['name']['tag'] for m in experiment['metricInfos']] == [
        'test/hr@10', 'test/ndcg@10', 'valid/hr@10', 'valid/ndcg@10', 'train/loss']
    assert experiment['metricInfos'][0]['displayName'] == 'test HR@10'
    (group,) = served_run['groups']['sessionGroups']
    assert group['name'] == 'listening_test'
    hparams = group['hparams']
    assert hparams['task'] == 'csv' and hparams['total_rounds'] == 3  # Resumed.
    assert 'None' not in map(str, hparams.values())
    assert 'clients_per_round' not in hparams  # Unset: left out.
    steps = {m['name']['tag']: m['trainingStep'] for m in group['metricValues']}
    assert steps == {'test/hr@10': 3, 'test/ndcg@10': 3, 'valid/hr@10': 3,
                     'valid/ndcg@10': 3, 'train/loss': 3}


def test_projector_shows_both_item_tables_with_original_ids(served_run):
    url = served_run['url']
    # The run is named after the experiment, not '.'.
    assert json.loads(_get(f'{url}/data/plugin/projector/runs')) == ['listening_test']
    info = json.loads(_get(f'{url}/data/plugin/projector/info?run=listening_test'))
    items = sorted({item for _, item, _ in served_run['rows']},
                   key=lambda s: s)
    shapes = {e['tensorName']: e['tensorShape'] for e in info['embeddings']}
    assert shapes == {'item_gmf': [len(items), 32], 'item_mlp': [len(items), 128]}
    for name in shapes:
        tensor = np.frombuffer(_get(
            f'{url}/data/plugin/projector/tensor?run=listening_test&name={name}'), np.float32)
        assert tensor.size == len(items) * shapes[name][1]
        assert np.isfinite(tensor).all() and tensor.std() > 0
    metadata = _get(f'{url}/data/plugin/projector/metadata?run=listening_test&name=item_gmf')
    lines = metadata.decode().splitlines()
    assert lines[0] == 'item\tindex\ttrain_users'
    labels = [line.split('\t')[0] for line in lines[1:]]
    assert labels == items  # Original ids, in index (sorted id) order.
    popularity = [int(line.split('\t')[2]) for line in lines[1:]]
    assert sum(popularity) > 0 and max(popularity) <= 40


def test_scalars_are_one_named_run_with_described_tags(served_run):
    tags = json.loads(_get(f'{served_run["url"]}/data/plugin/scalars/tags'))
    assert list(tags) == ['listening_test']
    run = tags['listening_test']
    assert {'train/loss', 'test/hr@10', 'valid/ndcg@20', 'workload/eval_seconds',
            'workload/round_seconds', 'workload/clients'} <= set(run)
    assert not {'eval_seconds', 'train/clients', 'train/round_seconds'} & set(run)
    assert all(info['description'].strip() for info in run.values()), run
