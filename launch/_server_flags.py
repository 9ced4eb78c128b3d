"""Server flags shared by the entry points (train, export, tune): the
server's step on the aggregated update. Their defaults are
`algorithm_config.ServerConfig`'s."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import algorithm_config
from tff_fedrecgel import methods
from tff_fedrecgel import run_settings

_default = run_settings.default

SERVER_LR = flags.DEFINE_float('server_lr', _default('server_lr'), 'Server learning rate.')
SERVER_OPTIMIZER = flags.DEFINE_enum(
    'server_optimizer', _default('server_optimizer'), list(methods.SERVER_OPTIMIZERS),
    'Server optimizer on the averaged update (tff.learning.optimizers): adam '
    '(the authors\'), yogi, adagrad, sgdm (momentum 0.9) or sgd.')
CLIENT_WEIGHTING = flags.DEFINE_enum(
    'client_weighting', _default('client_weighting'), list(algorithm_config.CLIENT_WEIGHTINGS),
    'Aggregation weights: uniform (the authors\') or by examples.')
