"""Algorithm flags shared by the entry points (train, export, benchmark).

The library takes plain arguments; this module turns the flags into them:
`radii(task)` applies the algorithm's fixed radii, `client_work_config` and
`model_config` build the library's configurations.
"""

from __future__ import annotations

from absl import flags

import tasks
from tff_fedrecgel.errors import DataError

ALGORITHMS = ('fedrecgel', 'fedncf', 'sam_global', 'sam_local', 'fedmf', 'fedrecon')
# Radii an algorithm fixes (None: the task's or the flag's).
_FORCED_RADII = {
    'fedncf': (0.0, 0.0),
    'fedmf': (0.0, 0.0),
    'fedrecon': (0.0, 0.0),
    'sam_global': (None, 0.0),
    'sam_local': (0.0, None),
}

TASK = flags.DEFINE_enum('task', None, tasks.TASK_NAMES, 'Dataset task.')
ALGORITHM = flags.DEFINE_enum(
    'algorithm', 'fedrecgel', ALGORITHMS,
    'fedrecgel: SAM with the task radii; fedncf: no SAM; sam_global / '
    'sam_local: SAM on the global or local part only (ablations); fedmf: the '
    'GMF-only model without SAM; fedrecon: TFF\'s Federated Reconstruction '
    '(build_fed_recon) on the same NeuMF, user embeddings rebuilt from zeros '
    'by --reconstruction_steps Adam steps every round, one user per TFF client.')
RHO_SH = flags.DEFINE_float(
    'rho_sh', None, 'SAM radius of the global (item) part (default: task\'s).')
RHO_NS = flags.DEFINE_float(
    'rho_ns', None, 'SAM radius of the local (user) part (default: task\'s).')
LOCAL_LR = flags.DEFINE_float(
    'local_lr', 0.1, 'Learning rate of the client Adam on the user embedding.')
SERVER_LR = flags.DEFINE_float('server_lr', 0.001, 'Server learning rate.')
SERVER_OPTIMIZER = flags.DEFINE_enum(
    'server_optimizer', 'adam', ['adam', 'yogi', 'adagrad', 'sgdm', 'sgd'],
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
    algorithm = ALGORITHM.value
    rho_sh = task.rho_sh if RHO_SH.value is None else RHO_SH.value
    rho_ns = task.rho_ns if RHO_NS.value is None else RHO_NS.value
    forced = _FORCED_RADII.get(algorithm, (None, None))
    for name, holder, value in (('rho_sh', RHO_SH, forced[0]),
                                ('rho_ns', RHO_NS, forced[1])):
        if value is not None and holder.present and holder.value != value:
            raise ValueError(f'--algorithm={algorithm} sets --{name}={value}; '
                             f'drop --{name}={holder.value}')
    rho_sh = rho_sh if forced[0] is None else forced[0]
    rho_ns = rho_ns if forced[1] is None else forced[1]
    return float(rho_sh), float(rho_ns)


def client_work_config(task: tasks.Task):
    """The `ClientWorkConfig` the flags describe (imports TensorFlow)."""
    from tff_fedrecgel.algorithms import ClientWorkConfig  # pylint: disable=g-import-not-at-top

    rho_sh, rho_ns = radii(task)
    if SERVER_LR.value <= 0:
        raise ValueError('--server_lr must be positive')
    return ClientWorkConfig(
        rho_sh=rho_sh, rho_ns=rho_ns, local_lr=LOCAL_LR.value,
        loss_reduction=LOSS_REDUCTION.value, local_state=LOCAL_STATE.value,
        reconstruction_steps=RECONSTRUCTION_STEPS.value, update=UPDATE.value,
        local_epochs=LOCAL_EPOCHS.value, client_lr=CLIENT_LR.value,
        client_weighting=CLIENT_WEIGHTING.value)


def server_optimizer():
    """The `tff.learning.optimizers` optimizer of --server_optimizer.

    Returns:
      None for adam (the library's default server Adam at --server_lr).

    Raises:
      ValueError: If --server_lr is not positive.
    """
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    lr = SERVER_LR.value
    if lr <= 0:
        raise ValueError('--server_lr must be positive')
    builders = {
        'adam': lambda: None,
        'yogi': lambda: tff.learning.optimizers.build_yogi(learning_rate=lr),
        'adagrad': lambda: tff.learning.optimizers.build_adagrad(learning_rate=lr),
        'sgdm': lambda: tff.learning.optimizers.build_sgdm(learning_rate=lr,
                                                          momentum=0.9),
        'sgd': lambda: tff.learning.optimizers.build_sgdm(learning_rate=lr),
    }
    return builders[SERVER_OPTIMIZER.value]()


def model_config(num_items: int):
    """The `ModelConfig` of the algorithm (FedMF: GMF only)."""
    from tff_fedrecgel.models import ModelConfig  # pylint: disable=g-import-not-at-top

    if ALGORITHM.value == 'fedmf':
        return ModelConfig(num_items=num_items, use_mlp=False, mlp_layers=())
    return ModelConfig(num_items=num_items)
