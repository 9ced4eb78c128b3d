"""The settings tree is the one statement of every setting: the settings, the
flags, the checks and the tuner's space all come from it."""

import dataclasses
import importlib
import math

from absl import flags
import pytest

from tff_fedrecgel import algorithm_config
from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_checks
from tff_fedrecgel import settings_tree
from tff_fedrecgel import tuning
from tff_fedrecgel.errors import SettingError
from tff_fedrecgel.launch import _flag_groups

# Each concern's flag module (not an entry point: importing one of those
# installs its signal handlers in the test process).
for _module, _, _ in _flag_groups.GROUPS:
    importlib.import_module(f'tff_fedrecgel.launch.{_module}')

_FIELDS = [f.name for f in dataclasses.fields(run_settings.Settings) if f.name != 'data_options']
_RECORDED = [s.name for s in settings_tree.SETTINGS.values() if s.recorded]


def test_every_recorded_setting_is_a_settings_field_and_back():
    assert sorted(_RECORDED) == sorted(_FIELDS)
    for setting in settings_tree.SETTINGS.values():
        if not setting.recorded:
            assert setting.kind in ('int', 'float', 'str', 'bool'), setting.name
        assert setting.help.strip() and '\n' not in setting.help, setting.name


def test_the_flags_are_the_tree():
    """Each setting is a flag of its concern's module (its --help group; the
    entry points adopt those, tests/test_cli_help.py), with the Settings
    default (none where the task fills it in)."""
    groups = {module: name for module, name, _ in _flag_groups.GROUPS}
    for concern in settings_tree.TREE:
        for setting in concern.settings:
            flag = flags.FLAGS[setting.name]
            module = next(m for m, name in groups.items() if name == concern.name)
            defined_in = [f.name for f in flags.FLAGS.get_key_flags_for_module(
                f'tff_fedrecgel.launch.{module}')]
            assert setting.name in defined_in, (setting.name, module)
            if setting.filled:
                assert flag.default is None, setting.name
            elif setting.recorded and setting.entries:
                assert tuple(map(int, flag.default)) == run_settings.default(setting.name)
            elif setting.recorded:
                assert flag.default == run_settings.default(setting.name), setting.name
            else:
                assert flag.default == setting.default, setting.name
            if setting.choices:
                assert list(flag.parser.enum_values) == list(setting.choices)


def test_the_checks_read_the_tree_for_settings_and_configs_alike():
    assert setting_checks.RANGES == settings_tree.ranges()
    assert setting_checks.CHOICES == settings_tree.choices()
    # One rule, one message, whichever object is built.
    for name, value in (('local_lr', 0.0), ('rho_sh', -0.1), ('chunk_size', 0),
                        ('update', 'sometimes'), ('local_lr', math.nan)):
        with pytest.raises(SettingError) as from_settings:
            run_settings.settings('synthetic', **{name: value})
        with pytest.raises(SettingError) as from_config:
            algorithm_config.ClientWorkConfig(**{name: value})
        assert str(from_settings.value) == str(from_config.value)
    with pytest.raises(SettingError, match='server_optimizer must be one of'):
        algorithm_config.ServerConfig(optimizer='lbfgs')
    with pytest.raises(SettingError, match='server_lr must be > 0'):
        algorithm_config.ServerConfig(learning_rate=0.0)


def test_the_tuners_space_is_the_trees_searched_settings():
    names = [d.name for d in tuning.SEARCHABLE]
    assert names == [s.name for s in settings_tree.searched()]
    assert [d.name for d in tuning.SEARCH_SPACE] == [
        s.name for s in settings_tree.searched() if s.search.by_default]
    # `update` is asked before what only model_delta uses.
    assert names.index('update') < names.index('local_epochs')
    for dim in tuning.SEARCHABLE:
        setting = settings_tree.SETTINGS[dim.name]
        if dim.choices is not None:
            assert set(dim.choices) <= set(setting.choices)
            continue
        low, inclusive, high = setting.range
        assert (dim.low >= low if inclusive else dim.low > low), dim.name
        assert high is None or dim.high <= high, dim.name


def test_settings_docstring_lists_every_setting_by_concern():
    doc = run_settings.Settings.__doc__
    for name in _FIELDS:
        assert f'{name}: ' in doc, name
    for concern in settings_tree.TREE:
        if any(s.recorded for s in concern.settings):
            assert f'{concern.name} ({concern.what}):' in doc


def test_privacy_settings_are_settings():
    """DP runs are ordinary settings: recorded, read back and checked."""
    private = run_settings.settings('synthetic', dp_noise_multiplier=1.0, dp_clip=0.5)
    assert private.private and private.privacy().dp
    with pytest.raises(SettingError, match='dp_clip needs --dp_noise_multiplier'):
        run_settings.settings('synthetic', dp_clip=0.5)
    with pytest.raises(SettingError, match='algorithm does not take DP'):
        run_settings.settings('synthetic', algorithm='central', secure_aggregation=True)
    with pytest.raises(ValueError, match='drop --simulation=vectorized'):
        run_settings.settings('synthetic', secure_aggregation=True, simulation='vectorized')
