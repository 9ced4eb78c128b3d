"""A search resumes where it stopped: in a fresh checkout from its trials
recorded as JSON, as it would have in its own folder, and after TFF's
worker died under it."""

import dataclasses
import json
import types

import optuna
import pytest

from tests.test_study import _script
from tests.test_tune import _StoppedOnce
from tff_fedrecgel import runtime
from tff_fedrecgel import tuning
from tff_fedrecgel import tuning_study
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.launch import peers_study

_SPLIT = types.SimpleNamespace(valid_items=[0])
_CONFIG = tuning.TuneConfig(task='synthetic', trials=2,
                            space=tuning.search_space(['server_lr', 'num_negatives']),
                            start_from_auto=False)


def _stopped_then_killed(folder, config=_CONFIG):
    """A search whose first trial was stopped by a signal, resumed to its
    trials, then killed inside a third trial (left running)."""
    _StoppedOnce.made = []
    with pytest.raises(runtime.Terminated):
        tuning.run_search(config, root=folder, split=_SPLIT, make_experiment=_StoppedOnce)
    tuning.run_search(config, root=folder, split=_SPLIT, make_experiment=_StoppedOnce)
    study = optuna.load_study(study_name=tuning_study.STUDY_NAME,
                              storage=f'sqlite:///{folder / tuning_study.STUDY_FILE}')
    killed = study.ask()
    killed.suggest_float('server_lr', 1e-4, 1e-1, log=True)
    killed.report(0.5, step=1)


def test_a_recorded_search_resumes_elsewhere_as_in_its_own_folder(tmp_path):
    own, fresh = tmp_path / 'own', tmp_path / 'fresh'
    _stopped_then_killed(own)
    record = json.loads(json.dumps(tuning_study.export_study(own)))  # Through plain JSON.
    states = [(t['state'], t['user_attrs'].get(tuning_study.INTERRUPTED)) for t in record['trials']]
    assert states[0] == states[3] == ('FAIL', True)  # Stopped by a signal; killed.
    assert {s for s, _ in states[1:3]} <= {'COMPLETE', 'PRUNED'}
    assert record['trials'][3]['intermediate_values'] == {'1': 0.5}
    tuning_study.import_study(fresh, record)
    assert not list(fresh.glob('*.part'))
    assert tuning_study.export_study(fresh) == record
    # Both resume alike: the killed trial's settings again, then the same draws.
    more = dataclasses.replace(_CONFIG, trials=4)
    made = {}
    for folder in (own, fresh):
        _StoppedOnce.made = [None]  # Past the first trial: none is stopped.
        result = tuning.run_search(more, root=folder, split=_SPLIT, make_experiment=_StoppedOnce)
        made[folder] = [{k: v for k, v in m.items() if k != 'run_dir'} for m in _StoppedOnce.made[1:]]
        assert [t['trial'] for t in result['trials_this_call']] == [4, 5]
        assert _StoppedOnce.made[1]['run_dir'].name == 'trial_003'  # The killed trial's folder.
        preset = json.loads((folder / tuning.BEST_PRESET).read_text())
        made[folder].append((preset['trial'], preset['settings']))
    assert made[own] == made[fresh]


def test_an_import_never_replaces_a_study(tmp_path):
    _stopped_then_killed(tmp_path / 'own')
    record = tuning_study.export_study(tmp_path / 'own')
    before = (tmp_path / 'own' / tuning_study.STUDY_FILE).read_bytes()
    with pytest.raises(DataError, match='holds a study already'):
        tuning_study.import_study(tmp_path / 'own', record)
    assert (tmp_path / 'own' / tuning_study.STUDY_FILE).read_bytes() == before
    gap = {**record, 'trials': record['trials'][1:]}
    with pytest.raises(DataError, match='skips trial numbers'):
        tuning_study.import_study(tmp_path / 'gap', gap)
    assert not (tmp_path / 'gap' / tuning_study.STUDY_FILE).exists()
    assert tuning_study.export_study(tmp_path / 'none') is None


def test_the_ledger_keeps_searches_whose_folders_are_gone(tmp_path):
    root, ledger = tmp_path / 'peers', tmp_path / 'docs' / 'searches.json'
    ledger.parent.mkdir()
    assert peers_study.record_searches(root, ledger) == 0 and not ledger.exists()
    def reading(datasets_dir):
        return dataclasses.replace(_CONFIG, base={'data_dir': str(datasets_dir / 'filmtrust')})

    _stopped_then_killed(root / 'filmtrust' / 'search_pfedrec', reading(tmp_path / 'here'))
    assert peers_study.record_searches(root, ledger) == 1
    assert str(tmp_path) not in ledger.read_text()  # No machine's paths.
    (root / 'filmtrust' / 'search_pfedrec' / tuning_study.STUDY_FILE).unlink()
    _stopped_then_killed(root / 'lastfm_2k' / 'search_fedsam')
    assert peers_study.record_searches(root, ledger) == 2
    recorded = peers_study.recorded_searches(ledger)
    assert sorted(recorded) == ['filmtrust/search_pfedrec', 'lastfm_2k/search_fedsam']
    # A search restores into a folder without a study only.
    search = peers_study.Search('filmtrust/search_pfedrec', 'filmtrust', 'pfedrec', 2, 0.1, 5)
    assert search.restore(root, recorded, tmp_path / 'there') == 4
    # It reads the datasets where this runner has them.
    tuning_study.check_folder(root / search.name, reading(tmp_path / 'there').definition)
    with pytest.raises(DataError, match='other settings'):
        tuning_study.check_folder(root / search.name, reading(tmp_path / 'here').definition)
    assert search.restore(root, recorded, tmp_path / 'there') == 0
    other = dataclasses.replace(search, name='filmtrust/search_fedrap', method='fedrap')
    assert other.restore(root, recorded, tmp_path / 'there') == 0


def test_a_fresh_checkout_resumes_the_recorded_search(tmp_path):
    """run_study restores a recorded search before its call (and not with
    --noskip_reported, which runs everything again)."""
    _stopped_then_killed(tmp_path / 'elsewhere')
    ledger = tmp_path / peers_study.SEARCH_LEDGER
    ledger.parent.mkdir()
    ledger.write_text(json.dumps(
        {'filmtrust/search_pfedrec': tuning_study.export_study(tmp_path / 'elsewhere')}))
    (tmp_path / 'data' / 'filmtrust').mkdir(parents=True)
    args = ('--plan=peers', f'--datasets_dir={tmp_path / "data"}', '--datasets=filmtrust',
            '--only=search_pfedrec')
    fresh = tmp_path / 'peers'
    _script('run_study.py', *args, f'--root_output_dir={tmp_path / "again"}',
            '--noskip_reported', cwd=tmp_path)
    assert not (tmp_path / 'again' / 'filmtrust' / 'search_pfedrec' / 'study.db').exists()
    _script('run_study.py', *args, f'--root_output_dir={fresh}', cwd=tmp_path)
    folder = fresh / 'filmtrust' / 'search_pfedrec'
    assert 'resuming from the 4 trials' in (fresh / 'filmtrust' / 'search_pfedrec.log').read_text()
    assert (tuning_study.export_study(folder)['trials']
            == tuning_study.export_study(tmp_path / 'elsewhere')['trials'])


@pytest.mark.parametrize('text', ['{"filmtrust/search_pfedrec": ', '[1]'])
def test_a_broken_ledger_is_refused_in_one_line(tmp_path, text):
    ledger = tmp_path / peers_study.SEARCH_LEDGER
    ledger.parent.mkdir()
    ledger.write_text(text)
    (tmp_path / 'data' / 'filmtrust').mkdir(parents=True)
    result = _script('run_study.py', '--plan=peers', f'--datasets_dir={tmp_path / "data"}',
                     '--datasets=filmtrust', '--only=search_pfedrec',
                     f'--root_output_dir={tmp_path / "peers"}', cwd=tmp_path)
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f'error: {peers_study.SEARCH_LEDGER} is not a search ledger')
    assert line.endswith(f'git checkout -- {peers_study.SEARCH_LEDGER}, or move it away '
                         'to search again')
    assert not (tmp_path / 'peers').exists()


class _WorkerDiesOnce(_StoppedOnce):
    """A stand-in whose first trial loses its worker (a crash of TFF's runtime)."""

    def train(self, on_round_end):
        if len(_StoppedOnce.made) == 1:
            raise runtime.WorkerExitedError('TFF\'s worker process (pid 1) was killed by SIGSEGV')
        return super().train(on_round_end)


def test_a_trial_whose_worker_died_runs_again_when_resumed(tmp_path):
    _StoppedOnce.made = []
    with pytest.raises(runtime.WorkerExitedError):
        tuning.run_search(_CONFIG, root=tmp_path, split=_SPLIT, make_experiment=_WorkerDiesOnce)
    record = tuning.run_search(_CONFIG, root=tmp_path, split=_SPLIT,
                               make_experiment=_WorkerDiesOnce)
    first, again = _StoppedOnce.made[:2]
    assert again == first  # Its settings, in its folder.
    assert record['trials_this_call'][0]['trial'] == 1 and record['finished_trials'] == 2
    study = optuna.load_study(study_name=tuning_study.STUDY_NAME,
                              storage=f'sqlite:///{tmp_path / tuning_study.STUDY_FILE}')
    assert study.trials[1].user_attrs[tuning_study.RETRY_OF] == 0
