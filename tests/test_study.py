"""The reproduction study: its plan, its statistics, and its two scripts."""

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel.launch import peers_study
from tff_fedrecgel.launch import study
import worker_watch

REPO = pathlib.Path(__file__).resolve().parents[1]


def _script(name, *args, cwd=REPO):
    return subprocess.run(
        [sys.executable, str(REPO / 'launch' / name), *args], cwd=cwd,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_plan_is_complete_and_ordered():
    runs = study.study_plan()
    names = [run.name for run in runs]
    assert len(names) == len(set(names))
    per = {}
    for run in runs:
        if not run.name.split('/')[1].startswith(('sweep_', 'probe_', 'long')):
            per.setdefault((run.dataset, run.method, run.validation), []).append(run.seed)
    # Every method, both selections, 5 seeds on FilmTrust and 3 elsewhere;
    # FilmTrust's ablations equal FedNCF / FedRecGEL there: one seed to check.
    for dataset, seeds in (('filmtrust', 5), ('lastfm_2k', 3), ('amazon_video', 3)):
        for method in study.METHODS:
            for validation in (False, True):
                expected = 1 if (dataset == 'filmtrust'
                                 and method in ('sam_global', 'sam_local')) else seeds
                assert per[(dataset, method, validation)] == list(range(expected))
    sweep = [run for run in runs if 'sweep_' in run.name]
    # 8 values x 2 radii, minus the task's point and FedNCF, times 3 seeds.
    assert len(sweep) == 13 * 3
    assert all((run.rho_sh, run.rho_ns) not in ((0.0, 0.02), (0.0, 0.0)) for run in sweep)
    assert {run.rho_sh for run in sweep if run.rho_ns == 0.02} == set(study.SWEEP_GRID) - {0.0}
    probes = [run for run in runs if run.sharpness_probe]
    assert {(r.dataset, r.method) for r in probes} == {
        (d, m) for d in study.DATASETS for m in study.PROBE_METHODS}
    long_runs = [run for run in runs if run.total_rounds]
    assert sorted((r.dataset, r.method, r.seed) for r in long_runs) == sorted(
        ('lastfm_2k', m, s) for m in ('fedrecgel', 'fedncf') for s in range(3))
    assert long_runs[0].flags('d')[-1] == f'--total_rounds={study.LONG_ROUNDS}'
    # The slowest method comes last; FilmTrust's main runs first.
    first_fedrecon = next(i for i, r in enumerate(runs) if r.method == 'fedrecon')
    assert all(r.method == 'fedrecon' for r in runs[first_fedrecon:])
    assert runs[0].name == 'filmtrust/fedrecgel_seed0'


def test_run_flags():
    run = study.Run(name='filmtrust/sweep_rho_sh0.1_seed2', dataset='filmtrust',
                    method='fedrecgel', seed=2, validation=True, rho_sh=0.1, rho_ns=0.02)
    assert run.flags('/data/ft') == [
        '--task=filmtrust', '--data_dir=/data/ft', '--algorithm=fedrecgel', '--seed=2',
        '--validation', '--rho_sh=0.1', '--rho_ns=0.02']
    probe = study.Run(name='x/probe', dataset='lastfm_2k', method='fedncf', seed=0,
                      sharpness_probe=0.05)
    assert probe.flags('d')[-1] == '--sharpness_probe=0.05'


def _fake_run(root, name, *, method, seed, validation=False, hr, ndcg=0.5,
              rho=(0.0, 0.02), probe=None, dataset='filmtrust', rounds=4):
    folder = root / dataset / name
    folder.mkdir(parents=True)
    summary = {'best_round': 3, 'best_test_hr@10': hr, 'best_test_ndcg@10': ndcg,
               'rounds': rounds, 'seconds_per_round': 0.5}
    if validation:
        summary.update({'best_valid_round': 2, 'best_valid_test_hr@10': hr - 0.01,
                        'best_valid_test_ndcg@10': ndcg - 0.01})
    (folder / 'summary.json').write_text(json.dumps(summary))
    (folder / 'hparams.json').write_text(json.dumps({
        'task': dataset, 'algorithm': method, 'seed': seed, 'validation': validation,
        'rho_sh': rho[0], 'rho_ns': rho[1], 'sharpness_probe': probe}))
    frame = pd.DataFrame({'round': range(1, rounds + 1),
                          'test/hr@10': np.linspace(0.1, hr, rounds),
                          'test/ndcg@10': np.linspace(0.05, ndcg, rounds),
                          'train/loss': np.linspace(1, 0.5, rounds)})
    if probe:
        frame['train/probe_sharpness_global'] = np.linspace(0.01, 0.001, rounds)
        frame['train/probe_sharpness_local'] = np.linspace(0.02, 0.002, rounds)
    frame.to_csv(folder / 'metrics.csv', index=False)


@pytest.fixture
def fake_study(tmp_path):
    root = tmp_path / 'study'
    gel = {0: 0.92, 1: 0.91, 2: 0.93}
    ncf = {0: 0.90, 1: 0.91, 2: 0.90}
    for seed in range(3):
        for validation in (False, True):
            suffix = '_valid' if validation else ''
            _fake_run(root, f'fedrecgel{suffix}_seed{seed}', method='fedrecgel', seed=seed,
                      validation=validation, hr=gel[seed])
            _fake_run(root, f'fedncf{suffix}_seed{seed}', method='fedncf', seed=seed,
                      validation=validation, hr=ncf[seed], rho=(0.0, 0.0))
        _fake_run(root, f'sweep_rho_sh0.5_seed{seed}', method='fedrecgel', seed=seed,
                  hr=0.80 + seed * 0.01, rho=(0.5, 0.02))
    _fake_run(root, 'probe_fedrecgel_seed0', method='fedrecgel', seed=0, hr=0.92,
              probe=0.05, rounds=100)
    _fake_run(root, 'probe_fedncf_seed0', method='fedncf', seed=0, hr=0.90,
              rho=(0.0, 0.0), probe=0.05, rounds=100)
    # A long run: the main seed-0 run's 4 rounds, then 196 more.
    _fake_run(root, 'long400_fedrecgel_seed0', method='fedrecgel', seed=0, hr=0.95,
              rounds=200)
    metrics = root / 'filmtrust' / 'long400_fedrecgel_seed0' / 'metrics.csv'
    frame = pd.read_csv(metrics)
    frame.loc[:3, ['test/hr@10', 'test/ndcg@10']] = pd.read_csv(
        root / 'filmtrust' / 'fedrecgel_seed0' / 'metrics.csv')[['test/hr@10', 'test/ndcg@10']]
    frame.to_csv(metrics, index=False)
    # Its FedNCF twin was left as generated: its first rounds differ.
    _fake_run(root, 'long400_fedncf_seed0', method='fedncf', seed=0, hr=0.94,
              rho=(0.0, 0.0), rounds=200)
    return root


def test_tables_from_runs(fake_study):
    runs = study.collect(fake_study)
    assert len(runs) == 19 and runs.sweep.sum() == 3 and runs.probe.sum() == 2
    assert runs.long.sum() == 2
    table = study.method_table(runs, 'filmtrust')
    assert table.loc['fedrecgel', 'test_hr'] == pytest.approx(0.92)
    assert table.loc['fedrecgel', 'test_hr_std'] == pytest.approx(0.01)
    assert table.loc['fedrecgel', 'valid_hr'] == pytest.approx(0.91)
    assert table.loc['fedncf', 'n_test'] == 3 and table.loc['fedncf', 'n_valid'] == 3
    # FilmTrust's SAM-global ablation is FedNCF there (rho_sh = 0).
    assert table.loc['sam_global', 'same_as'] == 'fedncf'
    assert table.loc['sam_global', 'test_hr'] == table.loc['fedncf', 'test_hr']
    assert table.loc['fedrecon', 'n_test'] == 0 and np.isnan(table.loc['fedrecon', 'test_hr'])
    diff = study.paired_differences(runs, 'filmtrust')['test_hr']
    assert diff['n'] == 3
    long_diff = study.paired_differences(runs, 'filmtrust', long=True)['test_hr']
    assert long_diff['n'] == 1 and long_diff['mean'] == pytest.approx(0.01)
    assert diff['mean'] == pytest.approx((0.02 + 0.0 + 0.03) / 3)
    assert diff['std'] == pytest.approx(np.std([0.02, 0.0, 0.03], ddof=1))
    assert (diff['min'], diff['max']) == (pytest.approx(0.0), pytest.approx(0.03))
    sweep = study.sweep_table(runs)
    assert sweep.loc[('rho_sh', 0.5), 'hr'] == pytest.approx(0.81)
    assert sweep.loc[('rho_sh', 0.0), 'hr'] == pytest.approx(0.92)  # The main runs.
    assert sweep.loc[('rho_ns', 0.0), 'hr'] == pytest.approx(np.mean([0.90, 0.91, 0.90]))
    assert sweep.loc[('rho_sh', 1.0), 'n'] == 0


def test_report_script_writes_tables_csv_and_images(fake_study, tmp_path):
    results = tmp_path / 'RESULTS.md'
    results.write_text('# Results\n\nprose\n<!-- study-tables:begin -->\nold\n'
                       '<!-- study-tables:end -->\nmore prose\n')
    images = tmp_path / 'images'
    args = [f'--root_output_dir={fake_study}', f'--results={results}',
            f'--images_dir={images}', f'--runs_csv={tmp_path / "runs.csv"}']
    done = _script('report_study.py', *args)
    assert done.returncode == 0, done.stderr
    text = results.read_text()
    assert text.startswith('# Results\n\nprose\n') and text.endswith('more prose\n')
    assert 'old' not in text
    assert '| FedRecGEL | 0.9200 ± 0.0100 |' in text
    assert '| FilmTrust | best test round | 3 | +0.0167' in text
    assert '| 0.5 | 0.8100 ± 0.0100 |' in text
    late = np.linspace(0.01, 0.001, 100)[50:].mean()  # Rounds 51-100.
    assert f'| FilmTrust | FedRecGEL | {late:.2e} | {2 * late:.2e} | yes |' in text
    long_hr = np.linspace(0.1, 0.95, 200)[[99, 199]]
    assert f'| FilmTrust | FedRecGEL | 0 | {long_hr[0]:.4f} / ' in text
    assert f'| {long_hr[1]:.4f} / ' in text
    assert '| — | — | 0.9500 / 0.5000 (round 3) | yes |' in text
    assert '| — | — | 0.9400 / 0.5000 (round 3) | NO |' in text
    assert '| FilmTrust | best test round of 400 | 1 | +0.0100 [' in text
    assert len(pd.read_csv(tmp_path / 'runs.csv')) == 19
    for name in ('study_hr10.png', 'study_sharpness.png', 'study_sweep.png',
                 'study_long.png'):
        assert (images / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # Running it again gives the same file.
    assert _script('report_study.py', *args).returncode == 0
    assert results.read_text() == text


def test_report_script_errors_are_one_line(fake_study, tmp_path):
    no_markers = tmp_path / 'plain.md'
    no_markers.write_text('# nothing\n')
    for args in ([f'--root_output_dir={tmp_path / "empty"}'],
                 [f'--root_output_dir={fake_study}', f'--results={no_markers}',
                  f'--images_dir={tmp_path}', f'--runs_csv={tmp_path / "r.csv"}']):
        done = _script('report_study.py', *args)
        assert done.returncode == 2
        assert done.stderr.strip().startswith('error: ')
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_runner_lists_and_refuses_bad_flags(tmp_path):
    done = _script('run_study.py', f'--root_output_dir={tmp_path}', '--list',
                   '--noskip_reported')
    assert done.returncode == 0, done.stderr
    total = len(study.study_plan())
    assert done.stdout.strip().splitlines()[-1] == f'0 of {total} runs done'
    for bad in ('--datasets=movielens', '--methods=fedavg', '--parallel=0'):
        done = _script('run_study.py', f'--root_output_dir={tmp_path}', bad)
        assert done.returncode == 2 and done.stderr.startswith('error: '), done.stderr
    # (Every run of the paper plan is in its report: count them as to do.)
    done = _script('run_study.py', f'--root_output_dir={tmp_path}', '--noskip_reported',
                   f'--datasets_dir={tmp_path / "nowhere"}')
    assert done.returncode == 2 and 'no data folder' in done.stderr
    done = _script('run_study.py', f'--root_output_dir={tmp_path}', '--noskip_reported')
    assert done.returncode == 2 and '--datasets_dir is required' in done.stderr


def test_runner_counts_the_runs_its_report_holds_as_done(tmp_path):
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'peers_runs.csv').write_text(
        'name,seed\nfilmtrust/peer_pfedrec_seed0,0\n')
    total = len(peers_study.peers_plan(datasets=['filmtrust'], root=tmp_path / 'runs'))
    args = ('--plan=peers', '--datasets=filmtrust', f'--root_output_dir={tmp_path / "runs"}',
            '--list')
    done = _script('run_study.py', *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines if 'peer_pfedrec_seed0' in line] == ['reported']
    assert lines[-1] == f'1 of {total} runs done'
    done = _script('run_study.py', *args, '--noskip_reported', cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1] == f'0 of {total} runs done'


def test_runner_skips_a_run_another_runner_holds(tmp_path):
    """A locked run log means another runner trains it: this one skips it."""
    datasets = tmp_path / 'data'
    (datasets / 'filmtrust').mkdir(parents=True)
    root = tmp_path / 'study'
    (root / 'filmtrust').mkdir(parents=True)
    with open(root / 'filmtrust' / 'fedmf_seed3.log', 'a') as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = _script('run_study.py', f'--root_output_dir={root}',
                       f'--datasets_dir={datasets}', '--datasets=filmtrust',
                       '--only=fedmf_seed3', '--noskip_reported')
    assert done.returncode == 0, done.stderr
    assert 'filmtrust/fedmf_seed3: skipped' in done.stdout
    assert 'study: 0 runs in' in done.stdout and '; 1 skipped' in done.stdout
    assert not (root / 'filmtrust' / 'fedmf_seed3').exists()


def test_sigterm_stops_the_runner_its_runs_and_its_queue(tmp_path):
    """SIGTERM to a runner with runs queued: the running one stops at a
    checkpoint, no queued one starts, nothing is left running."""
    data = tmp_path / 'data' / 'filmtrust'
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = [f'{u} {i} {rng.integers(1, 9) / 2}' for u in range(1, 41)
             for i in rng.choice(np.arange(1, 201), 12, replace=False)]
    (data / 'filmtrust-ratings.txt').write_text('\n'.join(lines) + '\n')
    root = tmp_path / 'study'
    runner = subprocess.Popen(
        [sys.executable, str(REPO / 'launch' / 'run_study.py'), f'--root_output_dir={root}',
         f'--datasets_dir={tmp_path / "data"}', '--datasets=filmtrust', '--only=fedmf_seed',
         '--noskip_reported',
         '--parallel=1'],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    first_log = root / 'filmtrust' / 'fedmf_seed0.log'
    workers, runs = {}, set()
    try:
        deadline = time.monotonic() + 120
        # Signal once the first run trains (it has printed where it writes).
        while 'outputs:' not in (first_log.read_text() if first_log.exists() else ''):
            assert runner.poll() is None and time.monotonic() < deadline, runner.communicate()
            runs.update(worker_watch.descendants(runner.pid, recursive=False))
            worker_watch.note_workers(runner.pid, workers, recursive=True)
            time.sleep(0.05)
        runs.update(worker_watch.descendants(runner.pid, recursive=False))
        os.kill(runner.pid, signal.SIGTERM)
        out, err = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 143, err
    assert err.strip().splitlines()[-1] == (
        'terminated (SIGTERM): stopped; run the same command to resume'), err
    assert 'study: stopped; 1 running run(s) stopped' in out
    assert 'terminated (SIGTERM): stopped' in first_log.read_text()
    assert sorted(p.name for p in (root / 'filmtrust').glob('*.log')) == ['fedmf_seed0.log']
    assert runs and not [pid for pid in runs if worker_watch.alive_since(pid)]
    assert not worker_watch.workers_left(workers)


def test_a_call_past_its_time_is_stopped_as_a_stopped_runner_stops_it(tmp_path):
    """A search's --peer_search_minutes: the runner sends SIGTERM (the child
    saves and exits) and reports the call as paused, not failed."""
    child = ('import signal, sys, time\n'
             'signal.signal(signal.SIGTERM, lambda *_: (print("saved", flush=True), '
             'sys.exit(143)))\n'
             'print("started", flush=True)\n'
             'time.sleep(60)\n')
    probe = ('import sys, time\n'
             'from tff_fedrecgel.launch import run_study\n'
             f'log = open({str(tmp_path / "call.log")!r}, "w")\n'
             'start = time.monotonic()\n'
             f'code = run_study._Children().call([sys.executable, "-c", {child!r}], log, '
             'timeout=2)\n'
             'print(code == run_study._PAUSED, round(time.monotonic() - start))\n')
    done = subprocess.run([sys.executable, '-c', probe], cwd=REPO, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    paused, seconds = done.stdout.split()
    assert paused == 'True' and int(seconds) < 30
    assert (tmp_path / 'call.log').read_text().split() == ['started', 'saved']


# --- the recipe study --------------------------------------------------------


def test_recipe_plan_runs_floor_ceiling_and_recipe():
    runs = study.recipe_plan()
    names = {run.name for run in runs}
    assert len(names) == len(runs)
    for dataset in study.DATASETS:
        for seed in range(study.BASELINE_SEEDS):
            assert f'{dataset}/itempop_seed{seed}' in names
            assert f'{dataset}/central_seed{seed}' in names
        for seed in range(study.RECIPE_SEEDS):
            assert f'{dataset}/tuned_fedrecgel_seed{seed}' in names
    # The paper's protocol only where the tuned preset differs from it.
    assert 'lastfm_2k/paper_fedncf_seed0' in names
    assert 'filmtrust/paper_fedncf_seed0' not in names
    tuned = next(r for r in runs if r.name == 'lastfm_2k/tuned_fedrecgel_seed0')
    assert tuned.flags('d')[-5:] == ['--validation', '--preset=tuned', '--heldout_users=0.1',
                                     '--eval_protocol=both', '--rounds_per_full_eval=10']
    assert runs[0].method in ('itempop', 'central')


def _fake_recipe_run(root, name, *, method, seed, hr, full_hr, heldout=0.3):
    folder = root / name.split('/')[0] / name.split('/')[1]
    folder.mkdir(parents=True)
    selections = {}
    for selection in study.RECIPE_SELECTIONS:
        full = selection.endswith('_full')
        record = {'round': 3}
        for group in (('test_full', 'heldout_full') if full else ('test', 'heldout')):
            value = (full_hr if full else hr) * (1 if group.startswith('test') else heldout)
            record.update({f'{group}/hr@10': value, f'{group}/ndcg@10': value / 2})
            if full:
                record[f'{group}/mrr'] = value / 3
        selections[selection] = record
    summary = {'rounds': 4, 'seconds_per_round': 1.0, 'selections': selections}
    (folder / 'summary.json').write_text(json.dumps(summary))
    (folder / 'hparams.json').write_text(json.dumps({
        'task': name.split('/')[0], 'algorithm': method, 'seed': seed,
        'rho_sh': 0.01, 'rho_ns': 0.01}))
    pd.DataFrame({'round': range(1, 5), 'test/hr@10': np.linspace(0.1, hr, 4),
                  'test_full/hr@10': [np.nan, np.nan, full_hr / 2, full_hr]}).to_csv(
                      folder / 'metrics.csv', index=False)


def test_recipe_report_tables_gap_closure_and_figure(tmp_path):
    from tff_fedrecgel.launch import _recipe_report
    root = tmp_path / 'recipe'
    for seed in range(2):
        _fake_recipe_run(root, f'lastfm_2k/itempop_seed{seed}', method='itempop', seed=seed,
                         hr=0.6, full_hr=0.05)
        _fake_recipe_run(root, f'lastfm_2k/central_seed{seed}', method='central', seed=seed,
                         hr=0.9, full_hr=0.30)
        for kind, bump in (('paper', 0.0), ('tuned', 0.2)):
            for method, extra in (('fedncf', 0.0), ('fedrecgel', 0.01 * (seed + 1))):
                _fake_recipe_run(root, f'lastfm_2k/{kind}_{method}_seed{seed}',
                                 method=method, seed=seed, hr=0.65 + bump + extra,
                                 full_hr=0.1 + bump / 2)
    runs = study.collect_recipe(root)
    assert set(runs.kind) == {'itempop', 'central', 'paper', 'tuned'}
    # (0.85 - 0.6) / (0.9 - 0.6) for tuned FedNCF, on the validation selection.
    assert _recipe_report.gap_closure(runs, 'lastfm_2k', 'tuned', 'fedncf') == (
        pytest.approx(0.25 / 0.3))
    block = _recipe_report.tables_block(runs)
    assert block.startswith(_recipe_report.BEGIN) and block.endswith(_recipe_report.END)
    assert '| FedRecGEL, tuned preset |' in block and '| 0.83 |' in block
    # Paired: FedRecGEL is 1 and 2 points up on the two seeds.
    assert '+1.50 ± 0.71 (2/2 up)' in block
    assert _recipe_report.plot(root, runs, tmp_path / 'images') == ['recipe_hr10.png']
    assert (tmp_path / 'images' / 'recipe_hr10.png').stat().st_size > 1000


def test_recipe_report_adds_runs_to_a_report_whose_folders_are_gone(tmp_path):
    from tff_fedrecgel.launch import _recipe_report
    old, new = tmp_path / 'old', tmp_path / 'new'
    for seed in range(2):
        for method, hr in (('itempop', 0.6), ('central', 0.9)):
            _fake_recipe_run(old, f'lastfm_2k/{method}_seed{seed}', method=method, seed=seed,
                             hr=hr, full_hr=0.1)
        _fake_recipe_run(old, f'lastfm_2k/tuned_fedncf_seed{seed}', method='fedncf',
                         seed=seed, hr=0.8, full_hr=0.2)
    _fake_recipe_run(new, 'lastfm_2k/tuned_fedncf_seed2', method='fedncf', seed=2,
                     hr=0.86, full_hr=0.2)
    results = tmp_path / 'RESULTS.md'
    results.write_text(f'# Results\n{_recipe_report.BEGIN}\n{_recipe_report.END}\n')
    runs_csv, images = tmp_path / 'runs.csv', tmp_path / 'images'
    args = [f'--results={results}', f'--images_dir={images}', f'--runs_csv={runs_csv}',
            '--plan=recipe']
    done = _script('report_study.py', f'--root_output_dir={old}', *args)
    assert done.returncode == 0, done.stderr
    figure = (images / 'recipe_hr10.png').read_bytes()
    assert '| FedNCF, tuned preset | 0.8000 ± 0.0000 |' in results.read_text()

    done = _script('report_study.py', f'--root_output_dir={new}', '--keep_reported_runs',
                   *args)
    assert done.returncode == 0, done.stderr
    assert '6 rows kept' in done.stdout
    assert len(pd.read_csv(runs_csv)) == 7
    # Mean of 0.80, 0.80, 0.86 over three seeds; the figure is redrawn from
    # the one folder present (its central line from the kept rows).
    assert '| FedNCF, tuned preset | 0.8200 ± 0.0346 |' in results.read_text()
    assert (images / 'recipe_hr10.png').read_bytes() != figure

    # Without the flag only the runs on disk are reported.
    done = _script('report_study.py', f'--root_output_dir={new}', *args)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(runs_csv)) == 1


def test_spec_protocol_table_frames_every_paper_method():
    from tff_fedrecgel.launch import _recipe_report

    def base(name, method, hr):
        valid = '_valid_' in name
        return {'name': name, 'dataset': name.split('/')[0], 'method': method,
                'kind': study.recipe_kind(name), 'seed': 0,
                'test:test/hr@10': np.nan if valid else hr + 0.01,
                'test:test/ndcg@10': np.nan if valid else hr / 2,
                'valid:test/hr@10': hr if valid else np.nan,
                'valid:test/ndcg@10': hr / 2 if valid else np.nan}
    runs = pd.DataFrame([
        base('lastfm_2k/paperbase_itempop_seed0', 'itempop', 0.60),
        base('lastfm_2k/paperbase_itempop_valid_seed0', 'itempop', 0.60),
        base('lastfm_2k/paperbase_central_seed0', 'central', 0.80),
        base('lastfm_2k/paperbase_central_valid_seed0', 'central', 0.80),
        base('lastfm_2k/splitfix_fedrecgel_valid_seed0', 'fedrecgel', 0.65)])
    previous = pd.DataFrame([
        {'dataset': 'lastfm_2k', 'method': method, 'validation': validation,
         'sweep': False, 'probe': False, 'long': False, 'test_hr': 0.7, 'test_ndcg': 0.4,
         'valid_hr': 0.70, 'valid_ndcg': 0.4}
        for method in ('fedrecgel', 'fedmf') for validation in (False, True)])
    text = '\n'.join(_recipe_report.paper_protocol_lines(runs, previous))
    assert '| LastFM-2K | popularity (floor) | 0.6100 / 0.3000 | 0.6000 / 0.3000 | — |' in text
    # The rerun on the fixed split stands for FedRecGEL; FedMF comes from the
    # paper study; gap closed = (0.65 - 0.6) / (0.8 - 0.6) and (0.7 - 0.6) / 0.2.
    assert '| LastFM-2K | FedRecGEL (tie rule fixed) | — / — | 0.6500 / 0.3250 | 0.25 |' in text
    assert '| LastFM-2K | FedMF | 0.7000 / 0.4000 | 0.7000 / 0.4000 | 0.50 |' in text
    assert text.count('| FedRecGEL') == 1 and 'Amazon-Video' not in text


def test_the_readme_results_are_the_recipe_runs_table():
    """The README's table is generated from docs/recipe_runs.csv, as written."""
    from tff_fedrecgel.launch import _recipe_report
    block = _recipe_report.readme_block(pd.read_csv(REPO / 'docs' / 'recipe_runs.csv'))
    assert block.count('\n| ') >= 4  # A header and a row per dataset.
    assert block in (REPO / 'README.md').read_text()
