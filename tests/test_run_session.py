"""`program.open_run`: the one way both front doors take a run's folder.

A run that fails before it trained a round leaves nothing that would refuse
the corrected command; one that trained keeps everything. The API path is
checked end to end (its training fails before round 1).
"""

import json

import pytest

from tff_fedrecgel import program

HPARAMS = {'local_lr': 0.1, 'seed': 0}


class Boom(RuntimeError):
    pass


def _fail_inside(root, name, hparams=HPARAMS, before_failing=None):
    with pytest.raises(Boom):
        with program.open_run(root_output_dir=root, experiment_name=name,
                              hparams=hparams) as paths:
            assert json.loads(paths.hparams.read_text()) == hparams
            if before_failing is not None:
                before_failing(paths)
            raise Boom()


def test_a_new_folder_that_trained_nothing_goes_with_its_parents(tmp_path):
    _fail_inside(tmp_path / 'a' / 'b', 'run')
    assert list(tmp_path.iterdir()) == []
    # The corrected command starts afresh.
    with program.open_run(root_output_dir=tmp_path / 'a' / 'b', experiment_name='run',
                          hparams={**HPARAMS, 'local_lr': 0.2}) as paths:
        assert json.loads(paths.hparams.read_text())['local_lr'] == 0.2
    assert paths.hparams.exists()  # A run that ends well keeps its folder.


def test_a_folder_that_was_there_keeps_what_it_had(tmp_path):
    folder = tmp_path / 'run'
    folder.mkdir()
    (folder / 'notes.txt').write_text('mine')

    def write_outputs(paths):
        paths.tensorboard_run.mkdir(parents=True)
        (paths.tensorboard_run / 'events').write_text('x')
        paths.metrics_csv.write_text('round,loss\n')  # A header, no round.

    _fail_inside(tmp_path, 'run', before_failing=write_outputs)
    assert sorted(p.name for p in folder.iterdir()) == ['notes.txt', 'run.lock']
    assert (folder / 'notes.txt').read_text() == 'mine'


@pytest.mark.parametrize('trained', ['checkpoint', 'metrics_row'])
def test_a_run_that_trained_keeps_its_folder(tmp_path, trained):
    def train_a_round(paths):
        if trained == 'checkpoint':
            (paths.checkpoints / 'program_state_1').mkdir(parents=True)
        else:
            paths.metrics_csv.write_text('round,loss\n1,0.5\n')

    _fail_inside(tmp_path, 'run', before_failing=train_a_round)
    paths = program.ExperimentPaths(tmp_path / 'run')
    assert paths.hparams.exists()
    assert paths.metrics_csv.exists() or program.has_checkpoint(paths)


def test_refusals_write_nothing(tmp_path):
    """Other settings in the folder, or a folder in use: nothing changes."""
    with program.open_run(root_output_dir=tmp_path, experiment_name='run',
                          hparams=HPARAMS) as paths:
        (paths.checkpoints / 'program_state_1').mkdir(parents=True)
        with pytest.raises(program.ExperimentLockedError):
            with program.open_run(root_output_dir=tmp_path, experiment_name='run',
                                  hparams=HPARAMS):
                pass
    listing = sorted(p.name for p in paths.root.iterdir())
    with pytest.raises(ValueError, match=r'other settings \(local_lr\)'):
        with program.open_run(root_output_dir=tmp_path, experiment_name='run',
                              hparams={**HPARAMS, 'local_lr': 0.3}):
            pass
    assert sorted(p.name for p in paths.root.iterdir()) == listing
    assert json.loads(paths.hparams.read_text()) == HPARAMS


def test_the_api_leaves_no_folder_when_training_fails_before_round_one(
        tmp_path, monkeypatch):
    from tff_fedrecgel import api
    from tff_fedrecgel.program import training_program

    def fail(*args, **kwargs):
        raise Boom()

    run_dir = tmp_path / 'runs' / 'x'
    with api.Session():
        experiment = api.experiment('synthetic', run_dir=run_dir,
                                    data_options={'num_users': 40, 'num_items': 200},
                                    total_rounds=1)
        monkeypatch.setattr(training_program, 'run_training', fail)
        with pytest.raises(Boom):
            experiment.train()
        assert not (tmp_path / 'runs').exists()
        monkeypatch.undo()
        summary = experiment.train()
    assert summary['rounds'] == 1 and (run_dir / 'hparams.json').exists()
