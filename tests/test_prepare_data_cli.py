"""End-to-end tests of ``launch/prepare_data.py`` (run as a subprocess)."""

import json
import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.environ.get(
    'FEDRECGEL_DATASETS', os.path.join(os.path.dirname(_REPO), 'shared',
                                       'datasets'))
FILMTRUST_DIR = os.path.join(DATASETS, 'filmtrust')
_SCRIPT = os.path.join('launch', 'prepare_data.py')


def _run(*args, module=False):
    command = [sys.executable]
    command += ['-m', 'tff_fedrecgel.launch.prepare_data'] if module else [_SCRIPT]
    return subprocess.run(command + list(args), cwd=_REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def _last_json(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_usage_error(result, *fragments):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('error: ')
    for fragment in fragments:
        assert fragment in lines[0]


def _filmtrust_dir(tmp_path, text):
    folder = tmp_path / 'ft'
    folder.mkdir()
    (folder / 'filmtrust-ratings.txt').write_text(text)
    return folder


needs_filmtrust = pytest.mark.skipif(
    not os.path.isfile(os.path.join(FILMTRUST_DIR, 'filmtrust-ratings.txt')),
    reason=(f'FilmTrust not found under {FILMTRUST_DIR} '
            '(set FEDRECGEL_DATASETS)'))


@needs_filmtrust
def test_filmtrust_statistics_and_cache(tmp_path):
    out = tmp_path / 'out'
    first = _last_json(_run('--task=filmtrust',
                            f'--data_dir={FILMTRUST_DIR}',
                            f'--output_dir={out}'))
    assert {k: first[k] for k in ('users', 'items', 'interactions',
                                  'train_interactions', 'test_users')} == {
        'users': 1227, 'items': 2059, 'interactions': 34889,
        'train_interactions': 33662, 'test_users': 1227}
    assert first['cached'] is False and first['valid_users'] == 0
    assert first['output_dir'] == str(out)
    assert sorted(os.listdir(out)) == [
        'items.csv', 'meta.json', 'test.csv', 'test_items.npy',
        'test_negatives.npy', 'train.csv', 'train_items.npy',
        'train_users.npy', 'users.csv']
    second = _last_json(_run('--task=filmtrust',
                             f'--data_dir={FILMTRUST_DIR}',
                             f'--output_dir={out}', module=True))
    assert second['cached'] is True
    assert second['users'] == 1227
    third = _last_json(_run('--task=filmtrust',
                            f'--data_dir={FILMTRUST_DIR}',
                            f'--output_dir={out}', '--validation'))
    assert third['cached'] is False and third['valid_users'] == 1227
    assert third['train_interactions'] == 34889 - 2 * 1227


def test_synthetic_run(tmp_path):
    result = _run('--task=synthetic', '--num_users=60', '--num_items=300',
                  '--data_seed=3', f'--output_dir={tmp_path}', module=True)
    record = _last_json(result)
    assert record['users'] == 60 and record['test_users'] == 60
    assert record['train_interactions'] == record['interactions'] - 60
    assert 'synthetic' in result.stdout.splitlines()[0]


def test_csv_run(tmp_path):
    rows = ['uid\tiid\tstars\tts']
    rows += [f'u{u}\ti{u * 14 + k}\t{1 + k % 5}\t{k}'
             for u in range(12) for k in range(14)]
    data = tmp_path / 'log.tsv'
    data.write_text('\n'.join(rows) + '\n')
    record = _last_json(_run(
        '--task=csv', f'--data_dir={data}', '--csv_sep=tab',
        '--csv_user_col=uid', '--csv_item_col=iid', '--csv_timestamp_col=ts',
        '--csv_rating_col=stars', '--csv_min_rating=2',
        f'--output_dir={tmp_path / "out"}'))
    assert record['users'] == 12
    assert record['interactions'] == 12 * 11  # Ratings 1 (k = 0, 5, 10) drop.
    assert record['items'] == 12 * 11


def test_does_not_import_tensorflow():
    code = ('import sys; import tff_fedrecgel.launch.prepare_data, tff_fedrecgel.tasks, tff_fedrecgel.data;'
            "print(any(m.split('.')[0] in ('tensorflow',"
            " 'tensorflow_federated') for m in sys.modules))")
    result = subprocess.run([sys.executable, '-c', code], cwd=_REPO,
                            capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.stdout.strip() == 'False', result.stderr


def test_unknown_dataset(tmp_path):
    _assert_usage_error(_run('--task=movielens', f'--output_dir={tmp_path}'),
                        'unknown task', 'movielens', 'filmtrust')


def test_missing_data_dir(tmp_path):
    missing = tmp_path / 'nowhere'
    _assert_usage_error(
        _run('--task=filmtrust', f'--data_dir={missing}',
             f'--output_dir={tmp_path / "out"}'), str(missing), 'not found')


def test_data_dir_not_given(tmp_path):
    _assert_usage_error(_run('--task=lastfm_2k', f'--output_dir={tmp_path}'),
                        'last-fm-2k-ratings.dat')


def test_missing_file_in_data_dir(tmp_path):
    _assert_usage_error(
        _run('--task=amazon_video', f'--data_dir={tmp_path}',
             f'--output_dir={tmp_path / "out"}'), 'amazon-video-ratings.dat',
        'not found')


def test_empty_file(tmp_path):
    folder = _filmtrust_dir(tmp_path, '')
    _assert_usage_error(
        _run('--task=filmtrust', f'--data_dir={folder}',
             f'--output_dir={tmp_path / "out"}'), 'filmtrust-ratings.txt',
        'empty')


def test_wrong_columns(tmp_path):
    folder = _filmtrust_dir(tmp_path, '1 2 3 9\n1 3 4 9\n')
    _assert_usage_error(
        _run('--task=filmtrust', f'--data_dir={folder}',
             f'--output_dir={tmp_path / "out"}'), 'filmtrust-ratings.txt',
        'expected 3 columns')


def test_csv_missing_column(tmp_path):
    data = tmp_path / 'ratings.csv'
    data.write_text('a,b\n1,2\n')
    _assert_usage_error(
        _run('--task=csv', f'--data_dir={tmp_path}',
             f'--output_dir={tmp_path / "out"}'), str(data), "'user'")


def test_non_numeric_id(tmp_path):
    folder = _filmtrust_dir(tmp_path, '1 2 3\n1 x7 4\n')
    _assert_usage_error(
        _run('--task=filmtrust', f'--data_dir={folder}',
             f'--output_dir={tmp_path / "out"}'), 'filmtrust-ratings.txt',
        "non-numeric item id 'x7' on line 2")


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('x')
    _assert_usage_error(
        _run('--task=synthetic', f'--output_dir={blocker / "out"}'),
        str(blocker / 'out'), 'cannot create')


def test_flag_errors_are_one_line(tmp_path):
    _assert_usage_error(_run('--task=synthetic', '--num_users=many',
                             f'--output_dir={tmp_path}'), '--num_users')
    _assert_usage_error(_run('--no_such_flag'), 'no_such_flag')
    _assert_usage_error(_run('--task=filmtrust', '--data_seed=1',
                             f'--output_dir={tmp_path}'), '--data_seed',
                        'synthetic')
    _assert_usage_error(_run('--task=synthetic'), '--output_dir')
