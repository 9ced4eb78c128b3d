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
import math

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


@dataclasses.dataclass(frozen=True)
class PFedRecConfig:
    """PFedRec's client work (`algorithms/pfedrec.py`); defaults are its
    authors' published settings (docs/ALGORITHM.md, "PFedRec").

    Attributes:
      latent_dim: Item embedding size.
      score_lr: SGD learning rate of the personal score function.
      item_lr_eta: The item embedding's SGD learning rate is
        `score_lr * num_items * item_lr_eta` (the authors' scaling).
      batch_size: Examples per local minibatch (the last one may be short).
      local_epochs: Local epochs over the user's round batch.
    """

    latent_dim: int = 32
    score_lr: float = 0.1
    item_lr_eta: float = 80.0
    batch_size: int = 256
    local_epochs: int = 1

    def __post_init__(self):
        for name in ('score_lr', 'item_lr_eta'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('latent_dim', 'batch_size', 'local_epochs'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')

    def item_lr(self, num_items: int) -> float:
        """The item embedding's learning rate for `num_items` items."""
        return self.score_lr * num_items * self.item_lr_eta


PFEDREC = PFedRecConfig()


@dataclasses.dataclass(frozen=True)
class GPFedRecConfig:
    """GPFedRec's round (`algorithms/gpfedrec.py`); defaults are its authors'
    published settings (their train.py; docs/ALGORITHM.md, "GPFedRec").

    Attributes:
      latent_dim: User and item embedding size.
      layers: Widths of the score MLP on `[user embedding, item embedding]`
        (the first is `2 * latent_dim`).
      lr: SGD learning rate of the MLP.
      lr_eta: The user embedding's rate is `lr * lr_eta / client_fraction -
        lr`, the item table's `lr * num_items * lr_eta - lr` (the authors'
        scaling).
      reg: Weight of the mean squared distance of the user's item table to
        its personalized target.
      batch_size: Examples per local minibatch.
      local_epochs: Local epochs over the user's round batch.
      neighborhood_threshold: A user's neighbors are those whose relation
        passes `neighborhood_threshold` times the graph's mean.
      mp_layers: Message-passing steps on the user graph.
      neighbors: `'similar'` (the paper: the most similar tables) or
        `'distant'` (the published code, which ranks by cosine distance).
      client_fraction: The round's share of users (the user embedding's rate).
    """

    latent_dim: int = 32
    layers: tuple = (64, 32, 16, 8)
    lr: float = 0.1
    lr_eta: float = 80.0
    reg: float = 1.0
    batch_size: int = 256
    local_epochs: int = 1
    neighborhood_threshold: float = 1.0
    mp_layers: int = 1
    neighbors: str = 'similar'
    client_fraction: float = 1.0

    def __post_init__(self):
        for name in ('lr', 'lr_eta', 'neighborhood_threshold'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        if not 0 <= self.reg < float('inf'):
            raise ValueError(f'reg must be >= 0 and finite, got {self.reg}')
        if not 0 < self.client_fraction <= 1:
            raise ValueError(f'client_fraction must be in (0, 1], got {self.client_fraction}')
        for name in ('latent_dim', 'batch_size', 'local_epochs', 'mp_layers'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')
        if len(self.layers) < 2 or self.layers[0] != 2 * self.latent_dim:
            raise ValueError(f'layers must start at 2 * latent_dim = {2 * self.latent_dim}, '
                             f'got {self.layers}')
        if self.neighbors not in ('similar', 'distant'):
            raise ValueError(f"neighbors must be 'similar' or 'distant', got {self.neighbors!r}")

    def user_lr(self) -> float:
        """The user embedding's learning rate."""
        return self.lr * self.lr_eta / self.client_fraction - self.lr

    def item_lr(self, num_items: int) -> float:
        """The item table's learning rate for `num_items` items."""
        return self.lr * num_items * self.lr_eta - self.lr


GPFEDREC = GPFedRecConfig()


@dataclasses.dataclass(frozen=True)
class FedRAPConfig:
    """FedRAP's client work (`algorithms/fedrap.py`); each default is the
    default of the named argument of its authors' `train.py`
    (docs/ALGORITHM.md, "FedRAP").

    Attributes:
      latent_dim: Item embedding size (`--latent_dim`).
      score_lr: SGD learning rate of the score function (`--lr_network`).
      item_lr: SGD learning rate of both item parts C and D (`--lr_args`).
      weight_decay: SGD weight decay of every parameter
        (`--l2_regularization`).
      lam: Final weight of the term pushing D apart from C (`--lambda`).
      mu: Final weight of C's L1 term (`--mu`).
      round_decay: Both learning rates' factor per round (`--decay_rate`).
      step_decay: Both learning rates' factor per local step (the authors'
        per-minibatch `ExponentialLR(gamma=0.95)`).
      batch_size: Examples per local minibatch (`--batch_size`).
      local_epochs: Most local epochs per round (`--local_epoch`).
      tol: A user stops its local epochs once its running mean loss changes
        by less than this, relatively (`--tol`).
      curriculum: `tanh` (`--vary_param`): the weights at round r (from 0)
        are `tanh((r - 1) / 10)` times `lam`, `mu` (0 at r = 0); `fixed`:
        `lam`, `mu` from the first round.
    """

    latent_dim: int = 32
    score_lr: float = 0.5
    item_lr: float = 200.0
    weight_decay: float = 1e-4
    lam: float = 0.1
    mu: float = 0.1
    round_decay: float = 0.97
    step_decay: float = 0.95
    batch_size: int = 2048
    local_epochs: int = 10
    tol: float = 1e-4
    curriculum: str = 'tanh'

    def __post_init__(self):
        for name in ('score_lr', 'item_lr', 'round_decay', 'step_decay'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('weight_decay', 'lam', 'mu', 'tol'):
            if not 0 <= getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be non-negative and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('latent_dim', 'batch_size', 'local_epochs'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')
        if self.curriculum not in ('tanh', 'fixed'):
            raise ValueError(f"curriculum must be 'tanh' or 'fixed', got {self.curriculum!r}")

    def weights(self, round_index: int) -> tuple[float, float]:
        """`(lam, mu)` of round `round_index` (from 0)."""
        if self.curriculum == 'fixed':
            return self.lam, self.mu
        factor = math.tanh((round_index - 1) / 10) if round_index > 0 else 0.0
        return factor * self.lam, factor * self.mu

    def learning_rates(self, round_index: int) -> tuple[float, float]:
        """`(score_lr, item_lr)` at the first step of round `round_index`."""
        factor = self.round_decay ** round_index
        return self.score_lr * factor, self.item_lr * factor


FEDRAP = FedRAPConfig()
