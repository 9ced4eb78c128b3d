"""What a client and the server do in a round: the one owner of those
settings' defaults.

`ClientWorkConfig` is the client work's configuration and `ServerConfig`
the server optimizer's; the run settings (`run_settings.Settings`), the
flags, the algorithms' builders and the export take their defaults from
here. Their choices and ranges are `settings_tree`'s, checked by the same
rules as the run settings'. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses

from tff_fedrecgel import setting_checks
from tff_fedrecgel.settings_tree import CLIENT_WEIGHTINGS
from tff_fedrecgel.settings_tree import LOCAL_STATES
from tff_fedrecgel.settings_tree import LOSS_REDUCTIONS
from tff_fedrecgel.settings_tree import SERVER_OPTIMIZERS
from tff_fedrecgel.settings_tree import UPDATE_MODES

# Where the global part's SAM perturbation comes from (docs/ALGORITHM.md):
# 'local' the client's own gradient (SAM), 'global_change' the last global
# model change the server sends (FedLESAM), 'server' the server's SAM step on
# what it broadcasts, the clients training without SAM (FedGloSS). A method
# fixes it (`methods.Method.global_perturbation`); it is not a setting.
GLOBAL_PERTURBATIONS = ('local', 'global_change', 'server')


@dataclasses.dataclass(frozen=True)
class ClientWorkConfig:
    """What one client does in a round.

    Attributes:
      rho_sh: SAM radius of the global (shared) part; 0 skips its pass.
      rho_ns: SAM radius of the local part (the user embedding); 0 skips it.
      local_lr: Learning rate of the client's Adam on its user embedding.
      loss_reduction: 'chunk_sum' sums the mean BCE of consecutive chunks of
        `chunk_size` examples (the authors' loss); 'mean' is the plain mean.
      chunk_size: Chunk length for 'chunk_sum' (and minibatch size for
        'model_delta').
      local_state: 'persistent' keeps the user embedding and its Adam state on
        the client across rounds; 'reconstruct' keeps nothing and rebuilds the
        embedding each round from zeros by `reconstruction_steps` Adam steps on
        the client's round batch, the global part fixed.
      reconstruction_steps: Adam steps of a reconstruction (the 'reconstruct'
        mode, and users whose embedding is rebuilt for evaluation).
      update: 'gradient' uploads the SAM gradient of the global part at the
        received point (the authors' algorithm); 'model_delta' runs
        `local_epochs` epochs of SAM steps over minibatches, moving the global
        part by SGD with `client_lr`, and uploads received minus final weights.
      local_epochs: Epochs of the 'model_delta' mode.
      client_lr: SGD learning rate of the global part in 'model_delta' mode.
      client_weighting: 'uniform' (the authors' unweighted mean) or
        'num_examples'.
      lr_scale: Multiplies every learning rate of a recommender with a round
        of its own (PFedRec, GPFedRec, FedRAP; 1: its authors' rates) and
        the central model's Adam rate, so that the tuner can search them as
        it searches the others'.
      sam_eta: ASAM's eta for the global part (its perturbation scaled by
        `|w| + eta` on the weight matrices and embeddings); None: plain SAM.
      global_perturbation: One of `GLOBAL_PERTURBATIONS`: 'local' (SAM on the
        client's gradient), 'global_change' (FedLESAM: the global part moved
        by rho_sh along the last global model change, one backward pass a
        step) or 'server' (FedGloSS: rho_sh is the server's radius, the
        clients train without SAM).
    """

    rho_sh: float = 0.0
    rho_ns: float = 0.0
    local_lr: float = 0.1
    loss_reduction: str = 'chunk_sum'
    chunk_size: int = 128
    local_state: str = 'persistent'
    reconstruction_steps: int = 5
    update: str = 'gradient'
    local_epochs: int = 1
    client_lr: float = 0.01
    client_weighting: str = 'uniform'
    lr_scale: float = 1.0
    sam_eta: float | None = None
    global_perturbation: str = 'local'

    def __post_init__(self):
        setting_checks.check_config(self)  # The settings' own rules.
        if self.global_perturbation not in GLOBAL_PERTURBATIONS:
            raise ValueError(f'global_perturbation must be one of {GLOBAL_PERTURBATIONS}, '
                             f'got {self.global_perturbation!r}')
        if self.sam_eta is not None and not 0 <= self.sam_eta < float('inf'):
            raise ValueError(f'sam_eta must be >= 0 and finite, got {self.sam_eta}')
        if self.global_perturbation != 'local' and (
                self.update != 'model_delta' or self.rho_ns != 0 or self.sam_eta is not None):
            raise ValueError(f'global_perturbation={self.global_perturbation!r} needs '
                             "update='model_delta', rho_ns=0 and no sam_eta")

    @property
    def persistent(self) -> bool:
        return self.local_state == 'persistent'


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """The server's step on the aggregated update.

    Attributes:
      learning_rate: The server optimizer's learning rate (the paper's 0.001).
      optimizer: One of `SERVER_OPTIMIZERS`.
    """

    learning_rate: float = 0.001
    optimizer: str = 'adam'

    def __post_init__(self):
        # The run settings of these names: their rules, and their messages.
        setting_checks.check_range('server_lr', self.learning_rate)
        setting_checks.check_choice('server_optimizer', self.optimizer)


CLIENT_WORK = ClientWorkConfig()
SERVER = ServerConfig()
