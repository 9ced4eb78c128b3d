"""Presets (`recipes`): the transfer recipe's rule, defaults per task, files."""

import dataclasses
import json

import pytest

from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_changes
from tff_fedrecgel.errors import DataError


def _profile(users, interactions, items=1000):
    return recipes.DataProfile(users=users, items=items, interactions=interactions)


@pytest.mark.parametrize('users, interactions, negatives', [
    (1227, 34889, 11),    # FilmTrust: 28.4 interactions per user.
    (1600, 185650, 4),    # LastFM-2K: 116 per user, at the lower bound.
    (8072, 63836, 32),    # Amazon-Video: 7.9 per user, capped.
    (1000, 19602, 15),    # The generated log of the transfer study: 19.6 per user.
    (100, 1200, 25),      # 12 per user.
])
def test_auto_negatives_follow_the_history_length(users, interactions, negatives):
    assert recipes.auto_negatives(_profile(users, interactions)) == negatives


def test_auto_is_the_default_for_own_data_and_paper_for_the_papers_datasets():
    short, long = _profile(100, 1000), _profile(100, 6000)  # 10 and 60 per user.
    own = run_settings.settings('csv', data_dir='x.csv', data_profile=short)
    assert own.preset == 'auto'
    # Short histories: five local epochs uploading the change, 250 / 10 negatives.
    assert (own.update, own.local_epochs, own.server_lr, own.client_fraction,
            own.num_negatives) == ('model_delta', 5, 0.003, 0.1, 25)
    # Long histories: one gradient a round, a faster server, twice the cohort.
    own = run_settings.settings('csv', data_dir='x.csv', data_profile=long)
    assert (own.update, own.local_epochs, own.server_lr, own.client_fraction,
            own.num_negatives) == ('gradient', 1, 0.01, 0.2, 5)
    paper = run_settings.settings('filmtrust', data_profile=short)
    assert paper.preset == 'paper'
    assert (paper.server_lr, paper.client_fraction, paper.num_negatives) == (0.001, 0.1, 4)
    # Explicit values win; without a profile auto sets nothing (all of it
    # follows the data).
    explicit = run_settings.settings('synthetic', num_negatives=9, server_lr=0.002)
    assert (explicit.server_lr, explicit.client_fraction, explicit.num_negatives,
            explicit.update) == (0.002, 0.1, 9, 'gradient')
    lastfm = recipes.DataProfile(users=1600, items=12454, interactions=185650)
    assert run_settings.settings('lastfm_2k', preset='auto',
                                 data_profile=lastfm).client_fraction == 0.2


def test_the_branch_follows_the_history_length_at_its_threshold():
    below = _profile(100, int(100 * recipes.AUTO_LONG_HISTORY) - 1)
    at = _profile(100, int(100 * recipes.AUTO_LONG_HISTORY))
    assert recipes.auto_recipe(below)['update'] == 'model_delta'
    assert 'update' not in recipes.auto_recipe(at)
    assert recipes.auto_recipe(at)['server_lr'] == 0.01
    assert recipes.auto_recipe(None) == {}


def test_with_a_validation_item_auto_runs_longer_and_says_so():
    plain = _profile(100, 1000)
    validated = recipes.DataProfile(users=100, items=1000, interactions=1000, validated=True)
    assert 'total_rounds' not in recipes.auto_recipe(plain)
    assert recipes.auto_recipe(validated)['total_rounds'] == recipes.AUTO_VALIDATED_ROUNDS
    run = run_settings.settings('synthetic', data_profile=validated, validation=True)
    assert run.total_rounds == recipes.AUTO_VALIDATED_ROUNDS
    assert run_settings.settings('synthetic', data_profile=plain).total_rounds == 100
    for baseline in ('central', 'itempop'):  # A round is an epoch, or counts nothing.
        assert run_settings.settings('synthetic', algorithm=baseline, data_profile=validated,
                                     validation=True).total_rounds == 100
    # An explicit value wins.
    assert run_settings.settings('synthetic', data_profile=validated, validation=True,
                                 total_rounds=7).total_rounds == 7
    line = setting_changes.preset_banner(run, validated)
    assert f'total_rounds 100 -> {recipes.AUTO_VALIDATED_ROUNDS}' in line
    assert f'a validation item: {recipes.AUTO_VALIDATED_ROUNDS} rounds' in line


def test_auto_ranks_against_every_item_as_often_as_the_data_s_size_allows():
    def validated(users, items):
        return recipes.DataProfile(users=users, items=items, interactions=20 * users,
                                   validated=True)
    small, mid, large = validated(1000, 1000), validated(1600, 12454), validated(8072, 11830)
    assert [recipes.auto_full_every(p) for p in (small, mid, large)] == [
        1, 10, recipes.AUTO_MAX_FULL_EVERY]
    assert 'rounds_per_full_eval' not in recipes.auto_recipe(small)
    assert recipes.auto_recipe(mid)['rounds_per_full_eval'] == 10
    assert 'rounds_per_full_eval' not in recipes.auto_recipe(
        dataclasses.replace(mid, validated=False))
    run = run_settings.settings('synthetic', data_profile=mid, validation=True,
                                eval_protocol='both')
    assert run.rounds_per_full_eval == 10
    assert 'ranked against every item every 10' in setting_changes.preset_banner(run, mid)
    # An explicit value wins; the central model's epochs keep theirs.
    assert run_settings.settings('synthetic', data_profile=mid, validation=True,
                                 rounds_per_full_eval=5).rounds_per_full_eval == 5
    assert run_settings.settings('synthetic', algorithm='central', data_profile=mid,
                                 validation=True).rounds_per_full_eval is None


def test_a_preset_file_s_rounds_apply_only_in_its_own_unit(tmp_path):
    def tuned(algorithm, rounds):
        path = tmp_path / f'{algorithm}.json'
        path.write_text(json.dumps({'algorithm': algorithm,
                                    'settings': {'total_rounds': rounds}}))
        return str(path)
    federated, central = tuned('fedrecgel', 300), tuned('central', 20)
    assert run_settings.settings('synthetic', preset=federated).total_rounds == 300
    assert run_settings.settings('synthetic', algorithm='fedncf',
                                 preset=federated).total_rounds == 300
    assert run_settings.settings('synthetic', preset=central).total_rounds == 20
    # Federated rounds are not epochs, nor epochs rounds: the task's instead.
    assert run_settings.settings('synthetic', algorithm='central',
                                 preset=federated).total_rounds == 100
    assert run_settings.settings('synthetic', algorithm='fedrecgel',
                                 preset=central).total_rounds == 100


def test_the_profile_of_a_split_says_whether_it_holds_validation_items():
    from tff_fedrecgel import tasks
    spec = tasks.get_task('synthetic')
    options = dict(num_users=60, num_items=300)
    assert not recipes.DataProfile.of(spec.load_split(**options)).validated
    assert recipes.DataProfile.of(spec.load_split(validation=True, **options)).validated


def test_the_banner_names_every_setting_the_preset_changed():
    profile = _profile(100, 6000)  # 60 per user: the gradient branch.
    auto = run_settings.settings('synthetic', data_profile=profile, client_fraction=0.5)
    line = setting_changes.preset_banner(auto, profile)
    assert 'server_lr 0.001 -> 0.01' in line and 'num_negatives 4 -> 5' in line
    assert 'client_fraction' not in line  # Given explicitly: not the preset's.
    assert '60.0 interactions per user >= 50; negatives 300 / 60.0' in line
    short = _profile(100, 1000)
    line = setting_changes.preset_banner(run_settings.settings('synthetic', data_profile=short),
                                      short)
    for part in ('update gradient -> model_delta', 'local_epochs 1 -> 5',
                 'server_lr 0.001 -> 0.003', 'num_negatives 4 -> 25',
                 '10.0 interactions per user < 50'):
        assert part in line
    amazon = run_settings.settings('amazon_video', preset='tuned')
    line = setting_changes.preset_banner(amazon, None)
    for part in ('update gradient -> model_delta', 'local_epochs 1 -> 5',
                 'num_negatives 4 -> 32', 'server_lr 0.001 -> 0.003'):
        assert part in line
    assert '--preset=auto learns' in setting_changes.preset_banner(
        run_settings.settings('filmtrust'), None)


def test_presets_apply_to_every_method():
    profile = _profile(100, 1000)
    for method in ('fedncf', 'fedmf', 'itempop', 'central', 'fedrecon'):
        run_settings.settings('synthetic', algorithm=method, data_profile=profile)
    # FedRecon drops what it has no use for (Amazon-Video's model_delta).
    fedrecon = run_settings.settings('amazon_video', algorithm='fedrecon', preset='tuned')
    assert fedrecon.update == 'gradient' and fedrecon.server_lr == 0.003


def test_a_preset_file_fills_in_settings(tmp_path):
    path = tmp_path / 'best.json'
    path.write_text(json.dumps({'settings': {'server_lr': 0.02, 'rho_ns': 0.3,
                                             'total_rounds': 7}}))
    run = run_settings.settings('synthetic', preset=str(path), total_rounds=9)
    assert (run.server_lr, run.rho_ns, run.total_rounds, run.preset) == (
        0.02, 0.3, 9, str(path))
    fedncf = run_settings.settings('synthetic', algorithm='fedncf', preset=str(path))
    assert (fedncf.rho_sh, fedncf.rho_ns) == (0.0, 0.0)



def test_the_banner_of_a_preset_file_shows_settings_whose_default_is_none(tmp_path):
    # The tuner's best_preset.json sets rounds_per_full_eval, whose default is None.
    path = tmp_path / 'best.json'
    path.write_text(json.dumps({'settings': {'rounds_per_full_eval': 5, 'server_lr': 0.02}}))
    run = run_settings.settings('synthetic', preset=str(path))
    line = setting_changes.preset_banner(run, None)
    assert 'rounds_per_full_eval None -> 5' in line and 'server_lr 0.001 -> 0.02' in line


def test_a_tuned_preset_runs_the_method_it_was_tuned_for_unless_another_is_given(tmp_path):
    # As launch/tune.py writes it: the method beside the settings.
    path = tmp_path / 'best_preset.json'
    path.write_text(json.dumps({'settings': {'rho_sh': 0.2, 'server_lr': 0.02},
                                'algorithm': 'fedgloss', 'task': 'synthetic'}))
    run = run_settings.settings('synthetic', preset=str(path))
    assert (run.algorithm, run.rho_sh, run.server_lr) == ('fedgloss', 0.2, 0.02)
    assert 'tuned for fedgloss, ' in setting_changes.preset_banner(run, None)
    other = run_settings.settings('synthetic', algorithm='fedncf', preset=str(path))
    assert (other.algorithm, other.rho_sh, other.server_lr) == ('fedncf', 0.0, 0.02)
    assert 'tuned for fedgloss, run as fedncf' in setting_changes.preset_banner(other, None)
    assert recipes.preset_algorithm(recipes.AUTO) is None


@pytest.mark.parametrize('content, message', [
    (None, 'preset file not found'),
    ('{"algorithm": "fedncf"}', 'may not set algorithm'),
    ('{not json', 'not a readable JSON preset'),
    ('[1, 2]', 'holds a JSON object'),
    ('{"task": "csv"}', 'may not set task'),
    ('{"server_lr": -1}', 'server_lr must be > 0'),
])
def test_bad_preset_files_are_refused(tmp_path, content, message):
    path = tmp_path / 'p.json'
    if content is not None:
        path.write_text(content)
    with pytest.raises((DataError, ValueError), match=message):
        run_settings.settings('synthetic', preset=str(path))


def test_unknown_presets_are_refused():
    with pytest.raises(DataError, match="unknown preset 'fast'"):
        run_settings.settings('synthetic', preset='fast')
    with pytest.raises(run_settings.SettingError, match='preset must be one of'):
        run_settings.Settings(task='synthetic', preset='fast')
