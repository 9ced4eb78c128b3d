"""Client flags shared by the entry points (train, export, tune): what a
client does in a round. Their defaults are `algorithm_config.ClientWorkConfig`'s."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import algorithm_config
from tff_fedrecgel import run_settings

_default = run_settings.default

LOCAL_LR = flags.DEFINE_float(
    'local_lr', _default('local_lr'), 'Learning rate of the client Adam on the user embedding.')
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
    'chunk_sum: sum of the mean loss of --chunk_size-example chunks (the authors\'); '
    'mean: the plain mean.')
CHUNK_SIZE = flags.DEFINE_integer(
    'chunk_size', _default('chunk_size'),
    'Examples per chunk of --loss_reduction=chunk_sum (the authors\'), and per '
    'minibatch of --update=model_delta.')
UPDATE = flags.DEFINE_enum(
    'update', _default('update'), list(algorithm_config.UPDATE_MODES),
    'gradient: clients upload the SAM gradient (the authors\'); model_delta: '
    'clients run --local_epochs of SAM steps and upload the weight change.')
LOCAL_EPOCHS = flags.DEFINE_integer(
    'local_epochs', _default('local_epochs'), 'model_delta: epochs.')
CLIENT_LR = flags.DEFINE_float('client_lr', _default('client_lr'), 'model_delta: client SGD rate.')
