"""The peers study's plan and report: every method beside the floor, the
ceiling and FedRecGEL on the same splits, paired by seed."""

import dataclasses
import shutil

import pandas as pd
import pytest

from tests.test_study import _fake_recipe_run
from tests.test_study import _script
from tff_fedrecgel import run_settings
from tff_fedrecgel.launch import _peers_report
from tff_fedrecgel.launch import peers_study
from tff_fedrecgel.launch import study


def test_the_plan_runs_the_sam_family_with_one_local_training():
    runs = peers_study.peers_plan(datasets=['lastfm_2k'], seeds=1)
    assert {r.method for r in runs} == {*peers_study.FLOORS, *peers_study.PEER_SETTINGS,
                                        peers_study.CONTROL_METHOD}
    assert {'fedsam', 'fedasam', 'fedlesam', 'fedgloss'} <= set(peers_study.PEER_SETTINGS)
    by_method = {r.method: r for r in runs}
    # FedSAM's control: the same local training, no SAM, uploading the change.
    control = by_method[peers_study.CONTROL_METHOD]
    assert control.name == 'lastfm_2k/control_fedncf_seed0'
    assert set(control.extra) == set(by_method['fedsam'].extra) | {'--update=model_delta'}
    extra = dict(f[2:].split('=') for f in control.extra)
    assert run_settings.settings('lastfm_2k', algorithm='fedncf', **{
        k: (v if k in ('server_optimizer', 'update') else float(v) if '.' in v else int(v))
        for k, v in extra.items()}).rho_sh == 0.0
    assert peers_study.CONTROL_METHOD not in {
        r.method for r in peers_study.peers_plan(datasets=['lastfm_2k'], methods=['pfedrec'],
                                                 seeds=1)}
    # FedSAM, FedASAM and FedLESAM differ only in where the perturbation
    # comes from (and their radius).
    local = {f for f in by_method['fedlesam'].extra if not f.startswith('--rho_sh')}
    assert set(by_method['fedsam'].extra) == local == set(by_method['fedasam'].extra)
    for method in ('fedsam', 'fedasam'):  # Settings the method takes.
        extra = dict(f[2:].split('=') for f in by_method[method].extra)
        run_settings.settings('lastfm_2k', algorithm=method,
                              **{k: (v if k == 'server_optimizer' else float(v)
                                     if '.' in v else int(v)) for k, v in extra.items()})


@pytest.fixture(name='studies')
def _studies(tmp_path):
    """A recipe study (floor, ceiling, FedRecGEL) and a peers study on LastFM-2K."""
    recipe = tmp_path / 'recipe'
    peers = tmp_path / 'peers'
    for seed in range(3):
        _fake_recipe_run(recipe, f'lastfm_2k/itempop_seed{seed}', method='itempop', seed=seed,
                         hr=0.6, full_hr=0.10)
        _fake_recipe_run(recipe, f'lastfm_2k/central_seed{seed}', method='central', seed=seed,
                         hr=0.9, full_hr=0.40)
        _fake_recipe_run(recipe, f'lastfm_2k/tuned_fedrecgel_seed{seed}', method='fedrecgel',
                         seed=seed, hr=0.8, full_hr=0.30)
        _fake_recipe_run(peers, f'lastfm_2k/itempop_seed{seed}', method='itempop', seed=seed,
                         hr=0.6, full_hr=0.10)
        # PFedRec 1, 2 and 3 points of full-ranking HR@10 below FedRecGEL.
        _fake_recipe_run(peers, f'lastfm_2k/peer_pfedrec_seed{seed}', method='pfedrec',
                         seed=seed, hr=0.7, full_hr=0.29 - 0.01 * seed)
        # FedSAM 1 point above its control on every seed.
        _fake_recipe_run(peers, f'lastfm_2k/peer_fedsam_seed{seed}', method='fedsam',
                         seed=seed, hr=0.7, full_hr=0.21)
        _fake_recipe_run(peers, f'lastfm_2k/control_fedncf_seed{seed}', method='fedncf',
                         seed=seed, hr=0.7, full_hr=0.20)
    recipe_csv = tmp_path / 'recipe_runs.csv'
    study.collect_recipe(recipe).to_csv(recipe_csv, index=False)
    results = tmp_path / 'RESULTS.md'
    results.write_text(f'# R\n\n{_peers_report.BEGIN}\nold\n{_peers_report.END}\ntail\n')
    return peers, recipe_csv, results


def test_the_report_frames_each_method_and_pairs_it_with_fedrecgel(studies, tmp_path):
    peers, recipe_csv, results = studies
    peers_csv = tmp_path / 'peers_runs.csv'
    args = ['--plan=peers', f'--root_output_dir={peers}', f'--runs_csv={recipe_csv}',
            f'--results={results}', f'--peers_csv={peers_csv}']
    done = _script('report_study.py', *args)
    assert done.returncode == 0, done.stderr
    text = results.read_text()
    assert 'old' not in text and text.endswith('tail\n')
    block = text.split(_peers_report.BEGIN)[1].split(_peers_report.END)[0]
    rows = {line.split(' | ')[0][2:]: line for line in block.splitlines()
            if line.startswith('| ')}
    assert {'popularity (floor)', 'central NeuMF (ceiling)', 'FedRecGEL, tuned preset',
            'PFedRec, authors\' settings'} <= set(rows)
    # (0.28 - 0.10) / (0.40 - 0.10) of the gap, full ranking, seed means.
    assert '| 0.60 | 1.00 | 3 |' in rows['PFedRec, authors\' settings']
    assert '| 0.67 |' in rows['FedRecGEL, tuned preset']
    # Paired: +1, +2, +3 points; standard error 1 / sqrt(3).
    paired = next(line for line in block.splitlines() if line.startswith('| LastFM-2K | PFedRec'))
    assert '| +2.00 ± 0.58 |' in paired and paired.endswith('| 3 |')
    control = next(line for line in block.splitlines()
                   if line.startswith('| LastFM-2K | FedSAM − FedNCF'))
    assert '| +1.00 ± 0.00 |' in control and control.endswith('| 3 |')
    assert 'FedNCF, FedLESAM\'s local training, no SAM' in block
    assert len(pd.read_csv(peers_csv)) == 12
    # With the folders gone, the kept rows give the same tables.
    shutil.rmtree(peers)
    results.write_text(f'{_peers_report.BEGIN}\n{_peers_report.END}\n')
    assert _script('report_study.py', *args).returncode == 0
    assert block in results.read_text()


def test_a_broken_search_ledger_is_refused_before_anything_is_written(studies, tmp_path):
    peers, recipe_csv, results = studies
    before = results.read_text()
    ledger = tmp_path / 'searches.json'
    ledger.write_text('{"lastfm_2k/search_fedsam": ')
    done = _script('report_study.py', '--plan=peers', f'--root_output_dir={peers}',
                   f'--runs_csv={recipe_csv}', f'--results={results}',
                   f'--peers_csv={tmp_path / "peers_runs.csv"}', f'--peers_searches={ledger}')
    assert done.returncode != 0
    assert done.stderr.count('\n') == 1 and 'is not a search ledger' in done.stderr
    assert results.read_text() == before and not (tmp_path / 'peers_runs.csv').exists()


def test_no_runs_is_one_line(tmp_path):
    done = _script('report_study.py', '--plan=peers', f'--root_output_dir={tmp_path / "none"}',
                   f'--peers_csv={tmp_path / "none.csv"}')
    assert done.returncode != 0 and 'no finished runs' in done.stderr
    assert done.stderr.count('\n') == 1


def test_no_gap_is_closed_where_the_ceiling_does_not_beat_popularity(studies):
    peers, recipe_csv, _ = studies
    recipe = pd.read_csv(recipe_csv)
    central = recipe.method == 'central'
    recipe.loc[central, 'valid_full:test_full/hr@10'] = 0.05  # Below popularity's 0.10.
    runs = _peers_report.combine(study.collect_recipe(peers), recipe)
    rows = [line for line in _peers_report.dataset_table(runs, 'lastfm_2k')
            if line.startswith('| ') and 'seeds' not in line]
    assert rows and all(line.split(' | ')[-3] == '—' for line in rows)


def test_the_plan_searches_every_method_with_the_same_budget(tmp_path):
    """The equal-tuning half: one search per method (same trials, rounds and
    split settings), each method's seeds at its search's preset."""
    plan = peers_study.peers_plan(datasets=['filmtrust'], seeds=2, root=tmp_path,
                                  search_trials=7, search_minutes=30)
    searches = [r for r in plan if isinstance(r, peers_study.Search)]
    assert {s.method for s in searches} == set(peers_study.SEARCHED)
    assert {'fedrecgel', 'fedncf', 'pfedrec', 'gpfedrec', 'fedrap'} <= set(peers_study.SEARCHED)
    flags = {tuple(f for f in s.flags('/data') if not f.startswith('--algorithm'))
             for s in searches}
    assert len(flags) == 1  # The same search for every method.
    assert {'--trials=7', '--noframe', '--heldout_users=0.1',
            '--total_rounds=100'} <= set(next(iter(flags)))  # FilmTrust's rounds, not searched.
    # A call's time limit is the runner's, not tune.py's (whose --max_minutes
    # would also cut trials on the wall clock and count them).
    assert not any(f.startswith(('--max_minutes', '--trial_minutes'))
                   for f in next(iter(flags)))
    assert all(s.max_minutes == 30 for s in searches)
    names = [r.name for r in plan]
    for search in searches:
        seeded = [r for r in plan if peers_study.search_of(r, plan) is search]
        assert [r.seed for r in seeded] == [0, 1]
        assert all(r.preset == str(tmp_path / search.name / 'best_preset.json')
                   and f'--preset={r.preset}' in r.flags('/data') for r in seeded)
        assert all(names.index(search.name) < names.index(r.name) for r in seeded)
    # Searched once its trials are reached and its preset is written.
    search = searches[0]
    assert not search.finished(tmp_path)
    (tmp_path / search.name).mkdir(parents=True)
    (tmp_path / search.name / 'search.json').write_text('{"finished_trials": 6}')
    (tmp_path / search.name / 'best_preset.json').write_text('{}')
    assert not search.finished(tmp_path)
    (tmp_path / search.name / 'search.json').write_text('{"finished_trials": 7}')
    assert search.finished(tmp_path)
    # A larger budget than the search.json's is not finished.
    assert not dataclasses.replace(search, trials=8).finished(tmp_path)


def test_a_searched_run_waits_for_its_search(tmp_path):
    (tmp_path / 'data' / 'filmtrust').mkdir(parents=True)
    root = tmp_path / 'peers'
    done = _script('run_study.py', '--plan=peers', f'--datasets_dir={tmp_path / "data"}',
                   f'--root_output_dir={root}', '--datasets=filmtrust',
                   '--only=searched_pfedrec_seed0', '--noskip_reported')
    assert done.returncode == 0, done.stderr
    assert 'searched_pfedrec_seed0: waiting: its search has not reached its trials' in done.stdout
    assert not list(root.rglob('*.log'))  # Nothing ran.


def test_the_report_compares_the_searched_methods(studies):
    peers, recipe_csv, _ = studies
    for seed in range(2):
        _fake_recipe_run(peers, f'lastfm_2k/searched_fedrecgel_seed{seed}', method='fedrecgel',
                         seed=seed, hr=0.8, full_hr=0.31)
        _fake_recipe_run(peers, f'lastfm_2k/searched_pfedrec_seed{seed}', method='pfedrec',
                         seed=seed, hr=0.8, full_hr=0.30 - 0.02 * seed)
    runs = _peers_report.combine(study.collect_recipe(peers), pd.read_csv(recipe_csv))
    table = _peers_report.dataset_table(runs, 'lastfm_2k')
    assert any(line.startswith('| PFedRec, searched (equal tuning) |') for line in table)
    lines = _peers_report.paired_lines(runs)
    start = next(i for i, line in enumerate(lines) if line.startswith('### At equal tuning'))
    paired = [line for line in lines[start:] if line.startswith('| LastFM-2K |')]
    # +1 and +3 points: mean 2, standard error 1.
    assert paired == [next(line for line in paired if '| PFedRec |' in line)]
    assert '| +2.00 ± 1.00 |' in paired[0] and paired[0].endswith('| 2 |')
