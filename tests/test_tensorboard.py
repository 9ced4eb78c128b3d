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

import tensorflow as tf
from tensorboard.plugins.hparams import api_pb2

from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_changes
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.program import tensorboard_extras
from tff_fedrecgel.program import tensorboard_hparams

REPO = pathlib.Path(__file__).resolve().parents[1]


def _hparams_summaries(log_dir, tag, parse):
    """(file, parsed content) of every hparams summary `tag` in the folder."""
    from tensorboard.backend.event_processing import event_file_loader
    found = []
    for path in sorted(pathlib.Path(log_dir).glob('events.out.tfevents.*')):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == tag:
                    found.append((path.name, parse(value.metadata.plugin_data.content)))
    return found


def _session_start_infos(log_dir):
    """(file, hparams) of every hparams session summary in the folder."""
    from tensorboard.plugins.hparams import metadata
    return _hparams_summaries(log_dir, metadata.SESSION_START_INFO_TAG,
                              metadata.parse_session_start_info_plugin_data)


def test_session_hparams_shows_changed_settings_first_and_ints_as_text():
    values, shown = tensorboard_hparams.session_hparams(
        {'zeta': 1, 'seed': np.int64(3), 'task': 'filmtrust', 'data_dir': '/d',
         'algorithm': 'fedrecgel', 'rho_sh': 0.1, 'local_lr': run_settings.default('local_lr'),
         'shape': (1, 2), 'validation': np.bool_(True), 'clients_per_round': None})
    # The task's default radius is not 0.1; the default learning rate is kept.
    assert shown == ['algorithm', 'task', 'seed', 'rho_sh', 'validation', 'shape', 'zeta',
                     'data_dir']
    assert list(values) == shown + ['local_lr']
    assert values['seed'] == '3' and values['zeta'] == '1'  # Not 3.0000.
    assert values['validation'] is True and values['rho_sh'] == 0.1
    assert values['shape'] == '(1, 2)'
    assert 'clients_per_round' not in values  # Unset: left out.


def test_changed_settings_compare_with_the_task_defaults():
    hparams = run_settings.settings('synthetic', preset='paper', seed=4).hparams()
    # synthetic's own preset is 'auto'; its radii and rounds are its defaults.
    assert setting_changes.changed_settings(hparams) == ['preset', 'seed']
    hparams.update(rho_sh=0.5, dp_clip=None, secure_aggregation=True)
    assert setting_changes.changed_settings(hparams) == ['preset', 'rho_sh', 'seed',
                                                      'secure_aggregation']


def test_metric_display_names():
    name = tensorboard_hparams.metric_display_name
    assert name('test/hr@10') == 'test HR@10'
    assert name('train/loss') == 'train loss'
    assert name('selected/test/hr@10') == 'HR@10 sampled'
    assert name('selected/test_full/ndcg@10') == 'NDCG@10 full'


def test_scalar_tags_put_counters_and_timings_apart_with_descriptions():
    tag = tensorboard_extras.scalar_tag
    assert tag('train/round_seconds')[0] == 'workload/round_seconds'
    assert tag('eval_seconds')[0] == 'workload/eval_seconds'
    assert tag('train/clients')[0] == 'workload/clients'
    assert tag('train/loss')[0] == 'train/loss'
    assert tag('test_full/mrr')[0] == 'test_full/mrr'
    assert 'top 10' in tag('test/hr@10')[1] and 'sampled negatives' in tag('test/hr@10')[1]
    assert 'every item' in tag('valid_full/ndcg@5')[1]
    assert 'never trained on' in tag('heldout/hr@20')[1]
    assert 'rho_sh' in tag('train/sam_loss_global')[1]
    # TensorBoard orders groups by name: the metric groups come first.
    groups = ['test', 'valid', 'heldout_full', 'train', 'workload']
    assert sorted(groups)[-1] == 'workload'


def test_rewriting_hparams_replaces_the_session(tmp_path):
    first = {'task': 'synthetic', 'total_rounds': 2, 'data_dir': None}
    metrics = {'selected/test/hr@10': 'HR@10'}
    tensorboard_hparams.write_hparams(tmp_path, hparams=first, trial_id='exp',
                                      metrics=metrics)
    tensorboard_hparams.write_hparams(
        tmp_path, hparams={**first, 'total_rounds': 5}, trial_id='exp', metrics=metrics)
    (only,) = _session_start_infos(tmp_path)
    info = only[1]
    assert info.group_name == 'exp'
    assert info.hparams['total_rounds'].string_value == '5'
    assert info.hparams['task'].string_value == 'synthetic'
    assert 'data_dir' not in info.hparams


def _experiment_configs(log_dir):
    """The hparams experiment configs in a log folder's event files."""
    from tensorboard.plugins.hparams import metadata
    return [config for _, config in _hparams_summaries(
        log_dir, metadata.EXPERIMENT_TAG, metadata.parse_experiment_plugin_data)]


def test_runs_of_a_folder_share_one_config_of_the_settings_that_differ(tmp_path):
    """Three runs started one after another under one root: every run's
    config lists the settings that tell them apart, with every run's metric
    columns; a lone run lists its algorithm."""
    base = {'algorithm': 'fedrecgel', 'task': 'synthetic', 'seed': 1, 'local_lr': 0.01,
            'validation': True, 'data_dir': None}
    sampled = {'selected/test/hr@10': 'HR@10', 'selected/test/ndcg@10': 'NDCG@10'}
    full = {'selected/test_full/hr@10': 'HR@10 full'}
    runs = [('a', base, sampled), ('b', {**base, 'seed': 2}, sampled),
            ('c', {**base, 'seed': 3, 'local_lr': 0.05}, {**sampled, **full})]

    def log_dir(name):
        return tmp_path / name / 'tensorboard' / name

    tensorboard_hparams.write_hparams(log_dir('a'), hparams=base, trial_id='a',
                                      metrics=sampled, runs_folder=tmp_path)
    (alone,) = _experiment_configs(log_dir('a'))
    assert [h.name for h in alone.hparam_infos] == ['algorithm']
    for name, hparams, metrics in runs[1:]:
        tensorboard_hparams.write_hparams(log_dir(name), hparams=hparams, trial_id=name,
                                          metrics=metrics, runs_folder=tmp_path)
    for name, hparams, _ in runs:
        (config,) = _experiment_configs(log_dir(name))
        assert [h.name for h in config.hparam_infos] == ['seed', 'local_lr']
        assert [h.type for h in config.hparam_infos] == [
            api_pb2.DATA_TYPE_STRING, api_pb2.DATA_TYPE_FLOAT64]
        assert [m.name.tag for m in config.metric_infos] == [*sampled, *full]
        (session,) = _session_start_infos(log_dir(name))
        assert session[1].group_name == name  # Each run keeps its own session.
        assert session[1].hparams['seed'].string_value == str(hparams['seed'])


def test_index_command_joins_nested_folders_and_refuses_an_empty_one(tmp_path):
    for dataset, lr in (('filmtrust', 0.01), ('lastfm', 0.05)):
        tensorboard_hparams.write_hparams(
            tmp_path / dataset / 'run' / 'tensorboard' / 'run',
            hparams={'algorithm': 'fedrecgel', 'task': 'synthetic', 'local_lr': lr},
            trial_id=f'{dataset}_run', metrics={'selected/test/hr@10': 'HR@10'},
            runs_folder=tmp_path / dataset)
    command = [sys.executable, str(REPO / 'launch' / 'tensorboard_index.py')]
    done = subprocess.run([*command, f'--logdir={tmp_path}'], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith('setting columns: local_lr')
    (config,) = _experiment_configs(tmp_path / 'lastfm' / 'run' / 'tensorboard' / 'run')
    assert [h.name for h in config.hparam_infos] == ['local_lr']
    (tmp_path / 'empty').mkdir()
    refused = subprocess.run([*command, f'--logdir={tmp_path / "empty"}'],
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f'error: {tmp_path / "empty"}: no run logs below it (no dashboard.json; runs '
        'write one when they start)']


def test_settings_table_marks_what_the_run_changed():
    table = tensorboard_hparams.settings_table(
        {'algorithm': 'fedrecgel', 'task': 'synthetic', 'seed': 4, 'local_lr':
         run_settings.default('local_lr')})
    lines = table.splitlines()
    assert lines[:2] == ['| setting | value | |', '|---|---|---|']
    assert '| seed | 4 | changed |' in lines
    assert '| algorithm | fedrecgel |  |' in lines  # What the run is, not a change.
    assert f'| local_lr | {run_settings.default("local_lr")} |  |' in lines


def test_rewriting_selected_metrics_keeps_one_value_a_tag(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator
    tensorboard_hparams.write_selected(
        tmp_path, selected={'selected/test/hr@10': (2, 0.25, 'at round 2')})
    tensorboard_hparams.write_selected(
        tmp_path, selected={'selected/test/hr@10': (5, 0.5, 'at round 5')})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    (event,) = accumulator.Tensors('selected/test/hr@10')
    assert event.step == 5
    assert float(tf.make_ndarray(event.tensor_proto)) == 0.5


def test_popularity_deciles_share_ties_and_span_one_to_ten():
    deciles = tensorboard_extras.popularity_deciles(np.array([5, 0, 0, 9, 5, 1, 2, 3, 4, 7]))
    assert deciles.tolist() == [7, 1, 1, 10, 7, 3, 4, 5, 6, 9]
    assert tensorboard_extras.popularity_deciles(np.zeros(4, int)).tolist() == [1] * 4


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
    # 1 + floor(10 * share of items less popular).
    assert labels['popularity_decile'].astype(int).tolist() == [3, 8, 3, 1]
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
        summary = json.loads((root / 'listening_test' / 'summary.json').read_text())
        yield {'url': url, 'log_dir': log_dir, 'first': first,
               'rows': rows, 'groups': groups, 'summary': summary}
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
    assert {'scalars', 'hparams', 'projector', 'custom_scalars'} <= active


def test_hparams_dashboard_is_readable_and_current(served_run):
    experiment = json.loads(_get(f'{served_run["url"]}/data/plugin/hparams/experiment',
                                 {'experimentName': ''}))
    # A lone run: one setting column, so the metric columns fit beside it.
    assert [h['name'] for h in experiment['hparamInfos']] == ['algorithm']
    assert [m['name']['tag'] for m in experiment['metricInfos']] == [
        'selected/test/hr@10', 'selected/test/ndcg@10']
    assert experiment['metricInfos'][0]['displayName'] == 'HR@10 sampled'
    # Every setting is in the TEXT dashboard, the changed ones marked.
    (text,) = json.loads(_get(f'{served_run["url"]}/data/plugin/text/text'
                              '?run=listening_test&tag=settings'))
    assert '<td>total_rounds</td>' in text['text'] and 'changed' in text['text']
    (group,) = served_run['groups']['sessionGroups']
    assert group['name'] == 'listening_test'
    hparams = group['hparams']
    assert hparams['task'] == 'csv' and hparams['total_rounds'] == '3'  # Resumed.
    assert hparams['seed'] == '0'  # An integer, not 0.0000.
    assert 'None' not in map(str, hparams.values())
    assert 'clients_per_round' not in hparams  # Unset: left out.
    # The metrics at the round chosen on the validation item, as the summary.
    headline = served_run['summary']['headline']
    assert headline['selection'] == 'valid'
    values = {m['name']['tag']: (m['trainingStep'], m['value'])
              for m in group['metricValues']}
    assert values == {
        'selected/test/hr@10': (headline['round'], pytest.approx(headline['test/hr@10'])),
        'selected/test/ndcg@10': (headline['round'],
                                  pytest.approx(headline['test/ndcg@10']))}


def test_selected_metrics_show_once_after_the_resume(served_run):
    scalars = json.loads(_get(
        f'{served_run["url"]}/data/plugin/scalars/scalars?run=listening_test'
        '&tag=selected/test/hr@10'))
    assert [point[1] for point in scalars] == [served_run['summary']['headline']['round']]


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
    assert lines[0] == 'item\tindex\ttrain_users\tpopularity_decile'
    labels = [line.split('\t')[0] for line in lines[1:]]
    assert labels == items  # Original ids, in index (sorted id) order.
    popularity = [int(line.split('\t')[2]) for line in lines[1:]]
    assert sum(popularity) > 0 and max(popularity) <= 40
    deciles = [int(line.split('\t')[3]) for line in lines[1:]]
    assert deciles == tensorboard_extras.popularity_deciles(np.array(popularity)).tolist()
    assert max(deciles) == 10 and min(deciles) == 1


def test_scalars_are_one_named_run_with_described_tags(served_run):
    tags = json.loads(_get(f'{served_run["url"]}/data/plugin/scalars/tags'))
    assert list(tags) == ['listening_test']
    run = tags['listening_test']
    assert {'train/loss', 'test/hr@10', 'valid/ndcg@20', 'workload/eval_seconds',
            'workload/round_seconds', 'workload/clients'} <= set(run)
    assert not {'eval_seconds', 'train/clients', 'train/round_seconds'} & set(run)
    assert all(info['description'].strip() for info in run.values()), run


def test_the_test_curves_stand_beside_popularity_on_the_same_split(served_run):
    url = served_run['url']
    layout = json.loads(_get(f'{url}/data/plugin/custom_scalars/layout'))
    (category,) = layout['category']
    charts = {c['title']: c['multiline']['tag'] for c in category['chart']}
    assert charts == {
        f'test/{m} against item popularity (sampled protocol)':
            [f'^(test/{m}|popularity/test/{m})$'] for m in ('hr@10', 'ndcg@10')}
    floor = served_run['summary']['popularity']['test/hr@10']
    points = json.loads(_get(f'{url}/data/plugin/scalars/scalars?run=listening_test'
                             '&tag=popularity/test/hr@10'))
    # A flat line over the rounds of the first call (1-2) and the resume (3).
    assert [p[1] for p in points] == [1, 2, 3]
    assert [p[2] for p in points] == [pytest.approx(floor)] * 3
    curve = json.loads(_get(f'{url}/data/plugin/scalars/scalars?run=listening_test'
                            '&tag=test/hr@10'))
    assert [p[1] for p in curve] == [1, 2, 3]
