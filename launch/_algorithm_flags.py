"""Algorithm flags shared by the entry points (train, export).

The library takes plain arguments; this module turns the flags into them:
`settings(task)` is the run's `run_settings.Settings` (the flags given on
the command line over the task's and the preset's defaults), and
`model_config` the model's configuration. The flags' defaults are the
`Settings` defaults.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import OptionError

_default = run_settings.default

TASK = flags.DEFINE_enum('task', None, tasks.TASK_NAMES, 'Dataset task.')
ALGORITHM = flags.DEFINE_enum(
    'algorithm', _default('algorithm'), methods.METHOD_NAMES,
    '; '.join(f'{m.name}: {m.description}' for m in methods.METHODS.values()) + '.')
RHO_SH = flags.DEFINE_float(
    'rho_sh', None, 'SAM radius of the global (item) part (default: task\'s).')
RHO_NS = flags.DEFINE_float(
    'rho_ns', None, 'SAM radius of the local (user) part (default: task\'s).')
LOCAL_LR = flags.DEFINE_float(
    'local_lr', _default('local_lr'), 'Learning rate of the client Adam on the user embedding.')
SERVER_LR = flags.DEFINE_float('server_lr', _default('server_lr'), 'Server learning rate.')
SERVER_OPTIMIZER = flags.DEFINE_enum(
    'server_optimizer', _default('server_optimizer'), list(methods.SERVER_OPTIMIZERS),
    'Server optimizer on the averaged update (tff.learning.optimizers): adam '
    '(the authors\'), yogi, adagrad, sgdm (momentum 0.9) or sgd.')
NUM_NEGATIVES = flags.DEFINE_integer(
    'num_negatives', _default('num_negatives'),
    'Training negatives per positive in a client\'s batch.')
LOCAL_STATE = flags.DEFINE_enum(
    'local_state', _default('local_state'), list(algorithm_config.LOCAL_STATES),
    'persistent: each user keeps its embedding and Adam state across rounds; '
    'reconstruct: nothing is kept, the embedding is re-derived every round.')
RECONSTRUCTION_STEPS = flags.DEFINE_integer(
    'reconstruction_steps', _default('reconstruction_steps'),
    'Adam steps of the reconstruct mode and FedRecon.')
LOSS_REDUCTION = flags.DEFINE_enum(
    'loss_reduction', _default('loss_reduction'), list(algorithm_config.LOSS_REDUCTIONS),
    f'chunk_sum: sum of the mean loss of {algorithm_config.CLIENT_WORK.chunk_size}-example '
    'chunks (the authors\'); '
    'mean: the plain mean.')
UPDATE = flags.DEFINE_enum(
    'update', _default('update'), list(algorithm_config.UPDATE_MODES),
    'gradient: clients upload the SAM gradient (the authors\'); model_delta: '
    'clients run --local_epochs of SAM steps and upload the weight change.')
LOCAL_EPOCHS = flags.DEFINE_integer(
    'local_epochs', _default('local_epochs'), 'model_delta: epochs.')
CLIENT_LR = flags.DEFINE_float('client_lr', _default('client_lr'), 'model_delta: client SGD rate.')
CLIENT_WEIGHTING = flags.DEFINE_enum(
    'client_weighting', _default('client_weighting'), list(algorithm_config.CLIENT_WEIGHTINGS),
    'Aggregation weights: uniform (the authors\') or by examples.')
SEED = flags.DEFINE_integer(
    'seed', _default('seed'), 'Seed of initial weights, client sampling and negatives.')

PRESET = flags.DEFINE_string(
    'preset', None,
    'paper: the paper\'s protocol (docs/ALGORITHM.md); tuned: the task\'s own '
    'settings chosen on its validation item; auto: one recipe chosen for '
    'transfer, with the training negatives derived from the data '
    '(docs/RESULTS.md, "Transfer"); or a .json preset file (launch/tune.py '
    'writes one). Default: paper for the paper\'s datasets, auto for csv and '
    'synthetic. Flags given explicitly win.')

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
            task.name, algorithm=ALGORITHM.value, preset=PRESET.value,
            data_profile=data_profile, data_dir=_data_flags.DATA_DIR.value,
            data_options=_data_flags.task_options(task), **given)
    except run_settings.SettingError as e:
        raise ValueError(e.flag_message()) from None
    except OptionError as e:
        raise ValueError(e.flag_message(_data_flags.flag_of(e.option))) from None


def model_config(num_items: int):
    """The `ModelConfig` of the algorithm (FedMF: GMF only)."""
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

    return simulation.model_config_for(methods.get_method(ALGORITHM.value), num_items)
