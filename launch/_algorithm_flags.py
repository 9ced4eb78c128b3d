"""Algorithm flags shared by the entry points (train, export).

The library takes plain arguments; this module turns the flags into them:
`settings(task)` is the run's `run_settings.Settings` (the flags given on
the command line over the task's and the preset's defaults), and
`model_config` the model's configuration. The flags are `settings_tree`'s
'method' leaf.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel.launch import _tree_flags
from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import OptionError

FLAGS = _tree_flags.define('method', __name__)
TASK = FLAGS['task']
ALGORITHM = FLAGS['algorithm']
SEED = FLAGS['seed']
PRESET = FLAGS['preset']

# Settings this module sets apart from the flags of their name.
_NOT_FROM_FLAGS = ('task', 'algorithm', 'preset', 'data_dir', 'data_options')


def selected_task() -> tasks.Task:
    """The task named by --task.

    Raises:
      DataError: If --task is missing or unknown.
    """
    if not TASK.value:
        raise DataError(
            f'--task is required; choose one of {", ".join(tasks.TASK_NAMES)}')
    return tasks.get_task(TASK.value)


def selected_algorithm() -> str:
    """The method named by --algorithm; unless given, the one a --preset
    file was tuned for, else fedrecgel.

    Raises:
      DataError: If the preset file is missing or unreadable.
    """
    return run_settings.chosen_algorithm(ALGORITHM.value if ALGORITHM.present else None,
                                         PRESET.value)


def settings(task: tasks.Task, data_profile=None) -> run_settings.Settings:
    """The run's settings: every flag named as a `Settings` field and given on
    the command line, over the task's defaults and its `--preset`.

    Args:
      task: The task.
      data_profile: The data's `recipes.DataProfile`, for presets derived
        from the data (without it they give their data-independent part).

    Raises:
      ValueError: If a value is out of range, or contradicts what the
        algorithm fixes (the message names the flag).
      DataError: If a data flag belongs to another task.
    """
    given = {field.name: flags.FLAGS[field.name].value
             for field in dataclasses.fields(run_settings.Settings)
             if field.name not in _NOT_FROM_FLAGS and field.name in flags.FLAGS
             and flags.FLAGS[field.name].present}
    try:
        return run_settings.settings(
            task.name, algorithm=selected_algorithm(), preset=PRESET.value,
            data_profile=data_profile, data_dir=_data_flags.DATA_DIR.value,
            data_options=_data_flags.task_options(task), **given)
    except run_settings.SettingError as e:
        raise ValueError(e.flag_message()) from None
    except OptionError as e:
        raise ValueError(e.flag_message(_data_flags.flag_of(e.option))) from None


def model_config(run: run_settings.Settings, num_items: int):
    """The `ModelConfig` of a run's settings (FedMF: GMF only)."""
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

    return simulation.model_config_for(methods.get_method(run.algorithm), num_items,
                                       run.model_sizes())
