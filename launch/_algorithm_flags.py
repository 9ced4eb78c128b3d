"""Algorithm flags shared by the entry points (train, export, benchmark).

The library takes plain arguments; this module turns the flags into them:
`radii(task)` applies the algorithm's fixed radii, `client_work_config` and
`model_config` build the library's configurations.
"""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import methods
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError

TASK = flags.DEFINE_enum('task', None, tasks.TASK_NAMES, 'Dataset task.')
ALGORITHM = flags.DEFINE_enum(
    'algorithm', 'fedrecgel', methods.METHOD_NAMES,
    '; '.join(f'{m.name}: {m.description}' for m in methods.METHODS.values()) + '.')
RHO_SH = flags.DEFINE_float(
    'rho_sh', None, 'SAM radius of the global (item) part (default: task\'s).')
RHO_NS = flags.DEFINE_float(
    'rho_ns', None, 'SAM radius of the local (user) part (default: task\'s).')
LOCAL_LR = flags.DEFINE_float(
    'local_lr', 0.1, 'Learning rate of the client Adam on the user embedding.')
SERVER_LR = flags.DEFINE_float('server_lr', 0.001, 'Server learning rate.')
SERVER_OPTIMIZER = flags.DEFINE_enum(
    'server_optimizer', 'adam', list(methods.SERVER_OPTIMIZERS),
    'Server optimizer on the averaged update (tff.learning.optimizers): adam '
    '(the authors\'), yogi, adagrad, sgdm (momentum 0.9) or sgd.')
NUM_NEGATIVES = flags.DEFINE_integer(
    'num_negatives', 4, 'Training negatives per positive in a client\'s batch.')
LOCAL_STATE = flags.DEFINE_enum(
    'local_state', 'persistent', ['persistent', 'reconstruct'],
    'persistent: each user keeps its embedding and Adam state across rounds; '
    'reconstruct: nothing is kept, the embedding is re-derived every round.')
RECONSTRUCTION_STEPS = flags.DEFINE_integer(
    'reconstruction_steps', 5, 'Adam steps of the reconstruct mode and FedRecon.')
LOSS_REDUCTION = flags.DEFINE_enum(
    'loss_reduction', 'chunk_sum', ['chunk_sum', 'mean'],
    'chunk_sum: sum of the mean loss of 128-example chunks (the authors\'); '
    'mean: the plain mean.')
UPDATE = flags.DEFINE_enum(
    'update', 'gradient', ['gradient', 'model_delta'],
    'gradient: clients upload the SAM gradient (the authors\'); model_delta: '
    'clients run --local_epochs of SAM steps and upload the weight change.')
LOCAL_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'model_delta: epochs.')
CLIENT_LR = flags.DEFINE_float('client_lr', 0.01, 'model_delta: client SGD rate.')
CLIENT_WEIGHTING = flags.DEFINE_enum(
    'client_weighting', 'uniform', ['uniform', 'num_examples'],
    'Aggregation weights: uniform (the authors\') or by examples.')
SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of initial weights, client sampling and negatives.')


def selected_task() -> tasks.Task:
    """The task named by --task.

    Raises:
      DataError: If --task is missing or unknown.
    """
    if not TASK.value:
        raise DataError(
            f'--task is required; choose one of {", ".join(tasks.TASK_NAMES)}')
    return tasks.get_task(TASK.value)


def radii(task: tasks.Task) -> tuple[float, float]:
    """SAM radii from the task, the flags and the algorithm.

    Raises:
      ValueError: If a flag contradicts the radius the algorithm fixes.
    """
    method = methods.get_method(ALGORITHM.value)
    for name, holder, value in (('rho_sh', RHO_SH, method.rho_sh),
                                ('rho_ns', RHO_NS, method.rho_ns)):
        if value is not None and holder.present and holder.value != value:
            raise ValueError(f'--algorithm={method.name} sets --{name}={value}; '
                             f'drop --{name}={holder.value}')
    return method.radii(task.rho_sh if RHO_SH.value is None else RHO_SH.value,
                        task.rho_ns if RHO_NS.value is None else RHO_NS.value)


PRESET = flags.DEFINE_enum(
    'preset', 'paper', ['paper', 'tuned'],
    'paper: SPEC.md\'s protocol; tuned: the task\'s settings chosen on the '
    'validation item (docs/RESULTS.md). Flags given explicitly win.')
_WORK_FIELDS = ('local_lr', 'loss_reduction', 'local_state', 'reconstruction_steps',
                'update', 'local_epochs', 'client_lr', 'client_weighting')


def settings(task: tasks.Task) -> dict:
    """The algorithm settings of the flags, the task's preset filling in what
    the command line does not set (`Task.preset`)."""
    rho_sh, rho_ns = radii(task)
    out = {'algorithm': ALGORITHM.value, 'preset': PRESET.value,
           'rho_sh': rho_sh, 'rho_ns': rho_ns, 'seed': SEED.value}
    for name in _WORK_FIELDS + ('server_lr', 'server_optimizer', 'num_negatives'):
        out[name] = flags.FLAGS[name].value
    for name, value in task.preset(PRESET.value).items():
        if name not in flags.FLAGS or not flags.FLAGS[name].present:
            out[name] = value
    return out


def client_work_config(settings: dict):
    """The `ClientWorkConfig` of `settings()` (imports TensorFlow)."""
    from tff_fedrecgel.algorithms import ClientWorkConfig  # pylint: disable=g-import-not-at-top

    return ClientWorkConfig(rho_sh=settings['rho_sh'], rho_ns=settings['rho_ns'],
                            **{k: settings[k] for k in _WORK_FIELDS})


def model_config(num_items: int):
    """The `ModelConfig` of the algorithm (FedMF: GMF only)."""
    from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

    return simulation.model_config_for(methods.get_method(ALGORITHM.value), num_items)
