"""Model and evaluation sizes as settings: embedding sizes, the tower, the
top-K list, the sampled negatives and the chunk size; small catalogs under
full ranking; old runs' hparams.json without them."""

import csv
import json

import pytest

from tests.test_train_program import _run
from tests.test_train_program import _summary
from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_changes
from tff_fedrecgel import sizes
from tff_fedrecgel.errors import SettingError
from tff_fedrecgel.launch import _config_file
from tff_fedrecgel.program import outputs

NEW = ('gmf_dim', 'mlp_dim', 'mlp_layers', 'chunk_size', 'top_ks', 'eval_negatives')


def _csv(path, *, users=40, items=50, per_user=12):
    """A log of `users` users, each with `per_user` of `items` items."""
    rows = [(f'u{u}', f'i{(u * 7 + t) % items}', t)
            for u in range(users) for t in range(per_user)]
    with open(path, 'w', newline='') as f:
        csv.writer(f).writerows([('user', 'item', 'timestamp'), *rows])
    return path


def test_the_paper_sizes_are_the_defaults():
    run = run_settings.settings('synthetic')
    assert (run.gmf_dim, run.mlp_dim, run.mlp_layers) == (32, 128, (128, 64, 32))
    assert run.top_ks == (5, 10, 15, 20) and run.eval_negatives == 99
    assert run.chunk_size == 128 == run.client_work().chunk_size
    config = sizes.ModelConfig(num_items=7)
    assert (config.gmf_dim, config.mlp_dim, config.mlp_layers) == (
        run.gmf_dim, run.mlp_dim, run.mlp_layers)


def test_sizes_are_recorded_and_read_back():
    run = run_settings.settings('synthetic', gmf_dim=8, mlp_dim=16, mlp_layers=['16', '8'],
                                top_ks=[20, 10, 1], chunk_size=32, eval_negatives=30)
    hparams = run.hparams()
    assert {k: hparams[k] for k in NEW} == {
        'gmf_dim': 8, 'mlp_dim': 16, 'mlp_layers': [16, 8], 'chunk_size': 32,
        'top_ks': [1, 10, 20], 'eval_negatives': 30}
    again, foreign = run_settings.Settings.from_hparams(json.loads(json.dumps(hparams)))
    assert again == run and not foreign
    assert run.client_work().chunk_size == 32
    assert set(NEW) <= set(setting_changes.changed_settings(hparams))
    assert not set(NEW) & set(setting_changes.changed_settings(
        run_settings.settings('synthetic').hparams()))


def test_an_old_run_without_the_sizes_reads_and_resumes_with_the_defaults(tmp_path):
    hparams = run_settings.settings('synthetic').hparams()
    old = {k: v for k, v in hparams.items() if k not in NEW}
    run, _ = run_settings.Settings.from_hparams(old)
    assert run == run_settings.settings('synthetic')
    paths = outputs.ExperimentPaths(tmp_path / 'run')
    paths.root.mkdir()
    paths.hparams.write_text(json.dumps(old))
    outputs.check_hparams(paths, hparams)  # Missing = default: the same run.
    with pytest.raises(ValueError, match='other settings .*gmf_dim'):
        outputs.check_hparams(paths, {**hparams, 'gmf_dim': 8})


@pytest.mark.parametrize('given, fragment', [
    ({'mlp_layers': []}, 'non-empty list'),
    ({'mlp_layers': ['64', 'x']}, "'x' is not one"),
    ({'mlp_layers': [0]}, r'in \[1, 4096\] each'),
    ({'top_ks': [5]}, 'must include 10'),
    ({'top_ks': [10, 200]}, 'must be <= 100 each'),
    ({'gmf_dim': 0}, 'must be >= 1'),
    ({'mlp_dim': 5000}, 'must be <= 4096'),
    ({'eval_negatives': 0}, 'must be >= 1'),
    ({'chunk_size': 0}, 'must be >= 1'),
])
def test_bad_sizes_are_refused(given, fragment):
    with pytest.raises(SettingError, match=fragment):
        run_settings.settings('synthetic', **given)


def test_full_ranking_takes_large_cut_offs_and_draws_no_negatives():
    run = run_settings.settings('synthetic', eval_protocol='full', top_ks=[10, 200])
    assert run.top_ks == (10, 200) and run.split_negatives == 0
    assert run_settings.settings('synthetic', eval_protocol='both').split_negatives == 99


def test_the_model_takes_the_sizes():
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

    run = run_settings.settings('synthetic', gmf_dim=4, mlp_dim=6, mlp_layers=[8, 2])
    config = simulation.model_config_for(methods.get_method('fedncf'), 30, run.model_sizes())
    assert (config.table_dims, config.mlp_layers) == ((4, 6), (8, 2))
    gmf = simulation.model_config_for(methods.get_method('fedmf'), 30, run.model_sizes())
    assert gmf.table_dims == (4,) and not gmf.use_mlp


def test_a_settings_file_gives_list_flags_comma_separated():
    hparams = {'task': 'synthetic', 'mlp_layers': [64, 32], 'top_ks': [5, 10]}
    assert _config_file.flags_from_hparams(hparams, ['task', 'mlp_layers', 'top_ks']) == [
        '--task=synthetic', '--mlp_layers=64,32', '--top_ks=5,10']


def test_a_small_catalog_is_refused_under_sampled_ranking_naming_the_user(tmp_path):
    data = _csv(tmp_path / 'ratings.csv')
    code, output = _run(['--task=csv', f'--data_dir={data}', '--csv_timestamp_col=timestamp',
                         f'--root_output_dir={tmp_path / "runs"}'], tmp_path)
    assert code == 2 and len(output.strip().splitlines()) == 1, output
    assert "user 'u0' interacted with 12 of the 50 items, leaving 38 for the 99" in output
    assert '--eval_protocol=full' in output and not (tmp_path / 'runs').exists()


def test_a_small_catalog_trains_under_full_ranking_with_its_own_sizes(tmp_path):
    data = _csv(tmp_path / 'ratings.csv')
    code, output = _run(['--task=csv', f'--data_dir={data}', '--csv_timestamp_col=timestamp',
                         '--eval_protocol=full', '--total_rounds=2', '--progress=false',
                         '--gmf_dim=4', '--mlp_dim=8', '--mlp_layers=8,4', '--top_ks=1,10',
                         '--chunk_size=16', '--experiment_name=small',
                         f'--root_output_dir={tmp_path / "runs"}'], tmp_path)
    assert code == 0, output
    run = tmp_path / 'runs' / 'small'
    hparams = json.loads((run / 'hparams.json').read_text())
    assert {k: hparams[k] for k in NEW} == {
        'gmf_dim': 4, 'mlp_dim': 8, 'mlp_layers': [8, 4], 'chunk_size': 16,
        'top_ks': [1, 10], 'eval_negatives': 99}
    with open(run / 'metrics.csv') as f:
        columns = next(csv.reader(f))
    assert [c for c in columns if c.startswith('test_full/')] == [
        'test_full/hr@1', 'test_full/hr@10', 'test_full/ndcg@1', 'test_full/ndcg@10',
        'test_full/mrr']
    assert 0 <= _summary(output)['best_full_test_full_hr@10'] <= 1
