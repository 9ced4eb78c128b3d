"""Bad input: one clean line, nothing written, nothing silently wrong.

Two halves:

* a generated matrix of bad command lines (every setting x bad values, bad
  files, flags the task or the method does not take), each run through
  `launch/train.py`'s flag parsing and checks in one process
  (tests/bad_input_harness.py): each must be refused with one line naming
  the flag or the file, without a traceback and without writing anything;
  a few good command lines next to them must pass the same checks;
* the cases that need a training run: checkpoints that know their
  settings and data, runs stopped in their first round, the API.

docs/RELIABILITY.md reports the matrix's counts.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN = REPO / 'launch' / 'train.py'
BASE = ['--progress=false', '--total_rounds=2', '--root_output_dir={root}/out']
SYNTHETIC = ['--task=synthetic', '--num_users=60']


def _command(argv):
    """BASE, the small synthetic data unless the case names another task,
    then the case's flags (absl: the last of a repeated flag wins)."""
    other_task = any(a.startswith('--task=') and a != '--task=synthetic' for a in argv)
    return [*BASE, *([] if other_task else SYNTHETIC), *argv]

# --------------------------------------------------------------------------
# The matrix.

_INT_GENERIC = ['abc', '1.5', '', ' ', '1e3', 'nan', '1' + '0' * 30, '-1' + '0' * 30]
# Per integer flag: values out of its range (below, above).
_INT_RANGES = {
    'total_rounds': ['0', '-1', '1000001'],
    'rounds_per_eval': ['0', '-5', str(2**31)],
    'rounds_per_full_eval': ['0', str(2**31)],
    'eval_users': ['0', '-3', str(2**31)],
    'clients_per_round': ['0', '-1', '61', str(2**31)],
    'reconstruction_steps': ['0', '-1', '10001', str(2**31)],
    'local_epochs': ['0', '-1', '1001', '2147483648'],
    'max_group_examples': ['0', str(2**31)],
    'rounds_per_checkpoint': ['-1', str(2**31)],
    'num_negatives': ['-1', '1000', str(2**31)],
    'seed': ['-1', str(2**32)],
    'data_seed': ['-2', str(2**32)],
    'num_users': ['0', '-1', str(10**9), str(2**31)],
    'num_items': ['0', '9', str(10**8), str(2**31)],
    'gmf_dim': ['0', '-1', '4097'],
    'mlp_dim': ['0', '4097', str(2**31)],
    'chunk_size': ['0', '-1', str(2**31)],
    'eval_negatives': ['0', '-1', str(2**31)],
}
# Per list flag (comma-separated integers): bad lists.
_LIST_CASES = {
    'mlp_layers': ['', '0', 'a', '64,x', '4097', '1.5', '64,,32'],
    'top_ks': ['', '5', '0,10', '10,x', '10,101', '10,1001'],
}
_FLOAT_GENERIC = ['nan', 'inf', '-inf', 'abc', '', '1e400', '-1e400', '1,5']
_FLOAT_RANGES = {
    'rho_sh': ['-0.5', '-1e-300'],
    'rho_ns': ['-0.5'],
    'local_lr': ['0', '-0.1'],
    'server_lr': ['0', '-0.1'],
    'client_lr': ['0', '-0.1'],
    'client_fraction': ['0', '-0.1', '1.5'],
    'sharpness_probe': ['0', '-1'],
    'heldout_users': ['-0.1', '0.95', '1'],
    'dp_noise_multiplier': ['-1', '1e-300', '1e-4', '1e308', '1e10', '1e4'],
    'dp_clip': ['0', '-1', '1e308'],
    'dp_delta': ['0', '1', '-0.1', '2'],
}
# What a float flag needs beside it to be checked at all.
_FLOAT_COMPANIONS = {
    'dp_noise_multiplier': ['--dp_clip=1'],
    'dp_clip': ['--dp_noise_multiplier=1'],
    'dp_delta': ['--dp_noise_multiplier=1', '--dp_clip=1'],
}
_ENUMS = ('task', 'algorithm', 'eval_protocol', 'simulation', 'user_state_store',
          'server_optimizer', 'local_state', 'loss_reduction', 'update', 'client_weighting',
          'preset')
_BOOLS = ('validation', 'progress', 'csv_header', 'dp_adaptive_clip', 'secure_aggregation')

# Flags each baseline does not take (`methods.Method.takes`), with a value.
_METHOD_FLAGS = {
    'itempop': ['--local_epochs=2', '--client_lr=0.1', '--update=model_delta',
                '--local_state=reconstruct', '--loss_reduction=mean', '--num_negatives=2',
                '--local_lr=0.2', '--server_lr=0.01', '--rho_sh=0.1', '--rho_ns=0.1',
                '--reconstruction_steps=3', '--client_weighting=num_examples',
                '--workers=localhost:1', '--sharpness_probe=0.1', '--server_optimizer=sgd',
                '--user_state_store=disk'],
    'fedrecon': ['--local_epochs=2', '--client_lr=0.1', '--update=model_delta',
                 '--local_state=persistent', '--loss_reduction=chunk_sum',
                 '--client_weighting=num_examples',
                 '--sharpness_probe=0.1', '--server_optimizer=sgd', '--dp_noise_multiplier=1',
                 '--user_state_store=disk'],
    'central': ['--local_epochs=2', '--client_lr=0.1', '--update=model_delta',
                '--server_lr=0.01', '--rho_sh=0.1', '--rho_ns=0.1', '--workers=localhost:1',
                '--secure_aggregation', '--user_state_store=disk'],
    'fedncf': ['--rho_sh=0.1', '--rho_ns=0.1'],
    'fedmf': ['--rho_sh=0.1'],
    'sam_global': ['--rho_ns=0.1'],
    'sam_local': ['--rho_sh=0.1'],
}

_CSV_FILES = {
    'shifted.csv': 'user,item\n' + ''.join(f'{u},{i},{u}\n' for u in range(3) for i in range(6)),
    'short.csv': 'user,item,t\n1,2,3\n1,3\n',
    # 16 users of 8 items each among 128: room for 99 held-out negatives.
    'headed.csv': 'user,item\n' + ''.join(f'{u},{u * 8 + k}\n'
                                         for u in range(16) for k in range(8)),
    'empty.csv': '',
    'only_header.csv': 'user,item\n',
    'blank.csv': '\n\n\n',
    'words.csv': 'user,item,t\n1,2,soon\n',
    'twice.csv': 'user,user\n1,2\n',
    'no_user.csv': 'uid,item\n1,2\n',
    'binary.csv': None,  # Written as bytes below.
    'stars.csv': 'user**item\n' + ''.join(f'{u}**{u * 8 + k}\n'
                                         for u in range(16) for k in range(8)),
}


def _csv_cases(data):
    def csv(name, *more):
        return ['--task=csv', f'--data_dir={data / name}', *more]

    return [
        (csv('shifted.csv'), 'line 2 has 3 fields'),
        (csv('short.csv'), 'line 3 has 2 fields'),
        (csv('headed.csv', '--nocsv_header'), 'looks like a header'),
        (csv('empty.csv'), 'empty'),
        (csv('only_header.csv'), 'no data rows'),
        (csv('blank.csv'), 'empty'),
        (csv('words.csv', '--csv_timestamp_col=t'), "non-numeric timestamp 'soon'"),
        (csv('twice.csv'), 'appears twice'),
        (csv('no_user.csv'), "no user column 'user'"),
        (csv('binary.csv'), 'not a UTF-8 text file'),
        (csv('headed.csv', '--csv_sep=((('), "no user column 'user'"),
        (csv('headed.csv', '--csv_sep=**'), "no user column 'user'"),
        (csv('stars.csv', '--csv_sep=((('), "no user column 'user'"),
        (csv('headed.csv', '--csv_sep='), 'csv_sep'),
        (csv('headed.csv', '--csv_sep="'), 'csv_sep'),
        (csv('headed.csv', '--csv_user_col=nobody'), "no user column 'nobody'"),
        (csv('headed.csv', '--nocsv_header', '--csv_user_col=user'), '0-based column'),
        (csv('headed.csv', '--csv_min_rating=3'), 'csv_min_rating'),
        (csv('headed.csv', '--csv_rating_col=r', '--csv_min_rating=nan'), 'csv_min_rating'),
        (csv('headed.csv', '--csv_rating_col=r', '--csv_min_rating=inf'), 'csv_min_rating'),
        (csv('headed.csv', '--csv_rating_col=r'), "no rating column 'r'"),
        (csv('headed.csv', '--csv_timestamp_col=t'), "no timestamp column 't'"),
        (csv('missing.csv'), 'missing.csv'),
        (csv('headed.csv', '--num_users=5'), '--num_users applies only'),
        (csv('headed.csv', '--data_seed=5'), '--data_seed applies only'),
        (['--task=csv'], 'no data directory'),
        (['--task=csv', f'--data_dir={data / "fifo"}'], 'FIFO'),
        (['--task=csv', '--data_dir=/dev/null'], 'character device'),
        (['--task=csv', '--data_dir=/proc/self/mem'], 'cannot read'),
    ]


def _path_cases(data):
    return [
        (['--data_dir=/tmp'], '--data_dir is not read by synthetic'),
        ([f'--data_dir={data}'], '--data_dir is not read by synthetic'),
        (['--data_dir='], '--data_dir is not read by synthetic'),
        (['--task=filmtrust', f'--data_dir={data / "missing"}'], 'not found'),
        (['--task=filmtrust', f'--data_dir={data / "headed.csv"}'], 'expected a folder'),
        (['--task=filmtrust', f'--data_dir={data / "fifo"}'], 'FIFO'),
        (['--task=filmtrust', f'--data_dir={data / "empty_dir"}'], 'file not found'),
        (['--task=filmtrust', '--data_dir=/dev/null'], 'character device'),
        (['--task=filmtrust', f'--data_dir={data / "ft_empty"}'], 'empty'),
        (['--task=filmtrust', f'--data_dir={data / "ft_bad"}'], 'expected 3 columns'),
        (['--task=lastfm_2k', f'--data_dir={data / "empty_dir"}'], 'file not found'),
        (['--task=amazon_video', f'--data_dir={data / "empty_dir"}'], 'file not found'),
        (['--task=qb_article', f'--data_dir={data / "empty_dir"}'], 'file not found'),
        (['--task=filmtrust'], 'no data directory'),
        (['--task=synthetic', '--csv_sep=;'], '--csv_sep applies only'),
        (['--task=synthetic', '--nocsv_header'], '--csv_header applies only'),
        (['--root_output_dir='], 'must not be empty'),
        (['--root_output_dir= '], 'must not be empty'),
        ([f'--root_output_dir={data / "headed.csv"}'], 'not a folder'),
        ([f'--root_output_dir={data / "headed.csv"}/sub'], 'not a folder'),
        (['--root_output_dir=/proc/none'], 'cannot create output folder'),
        (['--experiment_name='], 'invalid experiment name'),
        (['--experiment_name=.'], 'invalid experiment name'),
        (['--experiment_name=..'], 'invalid experiment name'),
        (['--experiment_name=a/b'], 'invalid experiment name'),
        (['--experiment_name=../x'], 'invalid experiment name'),
        (['--experiment_name= '], 'invalid experiment name'),
        ([f'--flagfile={data / "binary.csv"}'], '--flagfile'),
        ([f'--flagfile={data / "missing"}'], 'missing'),
        (['--workers=x'], '--workers'),
        (['--workers=localhost:'], '--workers'),
        (['--workers=:1'], '--workers'),
        (['--workers=a:b'], '--workers'),
        (['--workers=,'], '--workers'),
        (['--workers=localhost:1,localhost:1'], 'repeated'),
        (['--workers=localhost:1', '--dp_noise_multiplier=1', '--dp_clip=1'], '--workers'),
        (['--clients_per_round=5', '--client_fraction=0.5'], 'not both'),
        (['--dp_clip=1'], '--dp_clip needs --dp_noise_multiplier'),
        (['--dp_delta=0.1'], '--dp_delta needs --dp_noise_multiplier'),
        (['--dp_adaptive_clip'], '--dp_adaptive_clip needs --dp_noise_multiplier'),
        (['--dp_noise_multiplier=1'], '--dp_clip is required'),
        (['--dp_noise_multiplier=1', '--dp_clip=1', '--simulation=vectorized'], 'vectorized'),
        (['--dp_noise_multiplier=1', '--dp_clip=1', '--client_weighting=num_examples'],
         'unweighted'),
        (['--dp_noise_multiplier=1', '--dp_adaptive_clip', '--secure_aggregation'],
         'fixed clip'),
        (['--nosuch=1'], 'nosuch'),
        (['--num_user=5'], 'num_user'),
        (['--local-lr=0.1'], 'local-lr'),
        (['extra'], 'unexpected arguments'),
        (['--task'], 'task'),
        (['--algorithm=fedrecon', '--rho_sh=0.1'], 'rho_sh'),
    ]


def _matrix(data):
    """(argv, words the line must hold) of every bad case, and good ones."""
    bad = []
    for name, values in _INT_RANGES.items():
        extra = ['--update=model_delta'] if name == 'local_epochs' else []
        for value in _INT_GENERIC + values:
            bad.append(([*extra, f'--{name}={value}'], name))
    for name, values in _FLOAT_RANGES.items():
        for value in _FLOAT_GENERIC + values:
            bad.append(([*_FLOAT_COMPANIONS.get(name, []), f'--{name}={value}'], name))
    for name, values in _LIST_CASES.items():
        for value in values:
            bad.append(([f'--{name}={value}'], name))
    for name in _ENUMS:
        for value in ('nope', '', ' ', 'NOPE'):
            bad.append(([f'--{name}={value}'], name))
    for name in _BOOLS:
        for value in ('maybe', '2', ''):
            bad.append(([f'--{name}={value}'], name))
    for method, method_flags in _METHOD_FLAGS.items():
        for flag in method_flags:
            bad.append(([f'--algorithm={method}', flag], flag.split('=')[0].lstrip('-')
                        if 'dp_' not in flag and 'secure' not in flag else 'DP'))
    bad += _csv_cases(data) + _path_cases(data)
    good = [
        ([], None), (['--local_epochs=1000', '--update=model_delta'], None),
        (['--reconstruction_steps=10000'], None), (['--num_negatives=245'], None),
        (['--seed=4294967295'], None), (['--dp_noise_multiplier=1000', '--dp_clip=1'], None),
        (['--dp_noise_multiplier=0.001', '--dp_clip=1'], None),
        (['--dp_noise_multiplier=0', '--dp_clip=1'], None),
        (['--task=csv', f'--data_dir={data / "headed.csv"}'], None),
        (['--task=csv', f'--data_dir={data / "stars.csv"}', '--csv_sep=**'], None),
        (['--algorithm=fedrecon'], None), (['--algorithm=itempop'], None),
    ]
    return bad, good


def _write_data(data):
    data.mkdir()
    for name, text in _CSV_FILES.items():
        if text is not None:
            (data / name).write_text(text)
    (data / 'binary.csv').write_bytes(bytes(range(256)) * 4)
    os.mkfifo(data / 'fifo')
    (data / 'empty_dir').mkdir()
    for name, text in (('ft_empty', ''), ('ft_bad', '1 2\n3 4\n')):
        (data / name).mkdir()
        (data / name / 'filmtrust-ratings.txt').write_text(text)


@pytest.fixture(scope='module')
def matrix(tmp_path_factory):
    """The cases and their outcomes (`bad_input_harness`)."""
    base = tmp_path_factory.mktemp('matrix')
    data, root, cwd = base / 'data', base / 'root', base / 'cwd'
    _write_data(data)
    root.mkdir()
    cwd.mkdir()
    bad, good = _matrix(data)
    cases = [_command(argv) for argv, _ in bad + good]
    proc = subprocess.run(
        [sys.executable, str(REPO / 'tests' / 'bad_input_harness.py')],
        input=json.dumps(cases), capture_output=True, text=True, cwd=cwd, timeout=400,
        env=dict(os.environ, BAD_INPUT_ROOT=str(root), TF_CPP_MIN_LOG_LEVEL='3'),
        check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    return bad, good, outcomes[:len(bad)], outcomes[len(bad):]


def _counts(bad, outcomes):
    clean = sum(o['outcome'] == 'refused' and o['lines'] == 1 and not o['written']
                and words in o['message'] for (_, words), o in zip(bad, outcomes))
    return {'tried': len(bad), 'one clean line': clean,
            'tracebacks': sum(o['outcome'] == 'traceback' for o in outcomes),
            'wrongly accepted': sum(o['outcome'] == 'accepted' for o in outcomes),
            'refusals that wrote files': sum(o['outcome'] == 'refused' and bool(o['written'])
                                             for o in outcomes)}


def test_every_bad_input_is_one_clean_line(matrix):
    """At least 400 bad inputs: each refused with one line naming the flag or
    file, none a traceback, none accepted, none writing anything."""
    bad, _, outcomes, _ = matrix
    counts = _counts(bad, outcomes)
    print('bad-input matrix:', json.dumps(counts))
    wrong = [(argv, words, o) for (argv, words), o in zip(bad, outcomes)
             if not (o['outcome'] == 'refused' and o['lines'] == 1 and not o['written']
                     and words in o['message'])]
    assert not wrong, '\n'.join(map(str, wrong[:20]))
    assert counts['tried'] >= 400 and counts['one clean line'] == counts['tried'], counts


def test_good_inputs_pass_the_same_checks(matrix):
    """Values at the edge of each range pass: the checks refuse what is bad,
    not everything."""
    _, good, _, outcomes = matrix
    wrong = [(argv, o) for (argv, _), o in zip(good, outcomes) if o['outcome'] != 'accepted']
    assert not wrong, wrong


# --------------------------------------------------------------------------
# Cases that need a run.

_SMALL_RUN = ['--task=synthetic', '--num_users=60', '--progress=false',
              '--rounds_per_checkpoint=1']


def _train(args, cwd, timeout=300):
    proc = subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    return proc.returncode, proc.stdout + proc.stderr


def _last_line(output):
    return output.strip().splitlines()[-1]


def _simulation(num_users=40, seed=0):
    from tff_fedrecgel import api

    split = api.prepare_data('synthetic', num_users=num_users, num_items=300, seed=seed)
    return api.settings('synthetic', clients_per_round=5).build_simulation(split)


def _run(simulation, folder, hparams, total_rounds):
    from tff_fedrecgel import program

    with program.lock_experiment(root_output_dir=folder.parent,
                                 experiment_name=folder.name) as paths:
        if not program.has_checkpoint(paths):  # As launch/train.py and the API.
            program.prepare_experiment(root_output_dir=folder.parent,
                                       experiment_name=folder.name, hparams=hparams)
        return program.run_training(simulation, paths=paths, total_rounds=total_rounds,
                                    rounds_per_checkpoint=1, hparams=hparams,
                                    progress=False)


def test_checkpoint_knows_its_settings(tmp_path, capfd):
    """With hparams.json deleted, a changed rate is refused by the
    checkpoint's own record (naming the setting, writing no hparams.json),
    and the run's own settings resume with hparams.json rebuilt."""
    from tff_fedrecgel.program import run_record

    simulation, folder = _simulation(), tmp_path / 'run'
    hparams = {'task': 'synthetic', 'local_lr': 0.1, 'total_rounds': 2}
    _run(simulation, folder, hparams, 2)
    (folder / 'hparams.json').unlink()
    with pytest.raises(run_record.RunRecordError,
                       match=r'round 2 belongs to another run: local_lr \(0.1 in the '
                       r'checkpoint, 0.2 now\)'):
        _run(simulation, folder, {**hparams, 'local_lr': 0.2}, 3)
    assert not (folder / 'hparams.json').exists()
    summary = _run(simulation, folder, {**hparams, 'total_rounds': 3}, 3)
    assert summary['rounds'] == 3
    assert json.loads((folder / 'hparams.json').read_text())['total_rounds'] == 3
    assert 'rebuilt from the checkpoint of round 2' in capfd.readouterr().err


def test_checkpoint_knows_its_data(tmp_path):
    """Other data of the same shape (another generator seed) is refused."""
    from tff_fedrecgel.program import run_record

    folder, hparams = tmp_path / 'run', {'task': 'synthetic'}
    _run(_simulation(seed=0), folder, hparams, 1)
    with pytest.raises(run_record.RunRecordError, match='belongs to another run: the data'):
        _run(_simulation(seed=1), folder, hparams, 2)


def test_csv_file_replaced_is_other_data(tmp_path):
    """The fingerprint follows the file's contents, not its name or shape."""
    from tff_fedrecgel import api
    from tff_fedrecgel.data import split_io
    from tff_fedrecgel.data.synthetic import generate_synthetic

    frame = generate_synthetic(num_users=60, seed=0)
    data = tmp_path / 'ratings.csv'

    def fingerprint():
        return split_io.split_fingerprint(api.prepare_data(
            'csv', data_dir=data, timestamp_col='timestamp'))

    frame.to_csv(data, index=False)
    first = fingerprint()
    assert fingerprint() == first
    frame.assign(item=(frame['item'] * 7 + 3) % 400).to_csv(data, index=False)
    assert fingerprint() != first


def test_run_stopped_in_its_first_round_leaves_no_folder(tmp_path):
    """Weights non-finite in round 1 (a radius of 1e308): one line, and no
    folder (nor the parents it created) to refuse the corrected command."""
    root = tmp_path / 'a' / 'b'
    code, output = _train([*_SMALL_RUN, '--total_rounds=2', '--rho_sh=1e308',
                           f'--root_output_dir={root}'], tmp_path)
    assert code == 2, output
    assert _last_line(output).startswith('error: round 1:'), output
    assert not (tmp_path / 'a').exists()


def test_prepare_data_checks_before_creating_its_folder(tmp_path):
    data = tmp_path / 'r.csv'
    data.write_text('user,item\n1,2,3\n')
    proc = subprocess.run(
        [sys.executable, str(REPO / 'launch' / 'prepare_data.py'), '--task=csv',
         f'--data_dir={data}', f'--output_dir={tmp_path / "out"}'],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and 'line 2 has 3 fields' in proc.stderr, proc.stderr
    assert not (tmp_path / 'out').exists()


def test_busy_folder_is_said_before_anything_is_loaded(tmp_path):
    """The probe refuses a held folder and creates nothing for a new one."""
    from tff_fedrecgel import program

    with program.lock_experiment(root_output_dir=tmp_path, experiment_name='run'):
        with pytest.raises(program.ExperimentLockedError, match='in use by pid'):
            program.check_not_in_use(root_output_dir=tmp_path, experiment_name='run')
    program.check_not_in_use(root_output_dir=tmp_path, experiment_name='run')
    program.check_not_in_use(root_output_dir=tmp_path / 'new', experiment_name='run')
    assert not (tmp_path / 'new').exists()


@pytest.mark.parametrize('setting, value, words', [
    ('seed', 1.5, 'seed must be an integer'),
    ('total_rounds', '3', 'total_rounds must be an integer'),
    ('validation', 1, 'validation must be a bool'),
    ('rho_sh', '0.5', 'rho_sh must be a number'),
    ('client_fraction', '0.5', 'client_fraction must be a number'),
    ('local_epochs', 2**31, 'local_epochs must be <= 1000'),
    ('data_dir', 'somewhere', 'data_dir is not read by synthetic'),
])
def test_api_refuses_wrong_types_naming_the_setting(setting, value, words):
    from tff_fedrecgel import api
    from tff_fedrecgel.errors import SettingError

    with pytest.raises(SettingError, match=words):
        api.settings('synthetic', **{setting: value})


def test_api_data_options_are_checked_with_the_settings():
    from tff_fedrecgel import api
    from tff_fedrecgel.errors import OptionError

    with pytest.raises(OptionError, match='num_users must be an integer'):
        api.settings('synthetic', data_options={'num_users': '5'})
    with pytest.raises(OptionError, match='num_users=1000000000 needs about'):
        api.settings('synthetic', data_options={'num_users': 10**9})
    with pytest.raises(OptionError, match='sep must be a non-empty string'):
        api.settings('csv', data_dir='x.csv', data_options={'sep': ''})


def test_api_error_after_building_prints_nothing_at_exit(tmp_path):
    """An experiment built (TFF imported), then an error: the traceback of
    that error and nothing after it (no `Exception ignored in ...`)."""
    code = ('from tff_fedrecgel import api\n'
            f'api.experiment("synthetic", run_dir={str(tmp_path / "run")!r}, '
            'data_options={"num_users": 60})\n'
            'raise SystemExit("stopped here")\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=REPO, timeout=300, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert proc.returncode == 1 and proc.stderr.strip() == 'stopped here', proc.stderr
    assert not (tmp_path / 'run').exists()
