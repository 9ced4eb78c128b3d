"""Every setting of a run, with the tasks' and the methods' defaults.

`Settings` holds what `launch/train.py` records in `hparams.json` (the same
names and values as its flags); `settings(task, ...)` fills in the task's
SAM radii, rounds and client fraction and what the method fixes. The Python
API (`api.py`) builds its runs from them and reads recorded runs back with
`Settings.from_hparams`. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import os
from typing import Any

from tff_fedrecgel import methods
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError

SIMULATIONS = ('auto', 'vectorized', 'per_user')
PRESETS = ('paper', 'tuned')
EVAL_PROTOCOLS = ('sampled', 'full', 'both')


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a run (`launch/train.py`'s flags of the same names).

    Build it with `settings(task, ...)`, which fills in the task's defaults.

    Attributes:
      task: A name of `TASK_NAMES`.
      algorithm: A name of `METHOD_NAMES`.
      data_dir: Folder of the raw file (None for synthetic data).
      data_options: Reader options of the task (synthetic: `num_users`,
        `num_items`, `seed`, ...; csv: `sep`, `user_col`, ...).
      validation: Hold out each user's second-latest interaction too.
      total_rounds, client_fraction: Rounds to run; fraction of users per
        round.
      clients_per_round: Cohort size (overrides `client_fraction`).
      rho_sh, rho_ns: SAM radii of the global and the local part.
      preset: 'paper' (SPEC.md's protocol) or 'tuned' (the task's settings
        chosen on the validation item; `settings` fills them in).
      local_lr: Client Adam on the user embedding.
      server_lr, server_optimizer: The server optimizer and its rate.
      num_negatives: Training negatives per positive.
      local_state: 'persistent' or 'reconstruct'.
      reconstruction_steps: Adam steps of a reconstruction.
      loss_reduction: 'chunk_sum' or 'mean'.
      update: 'gradient' or 'model_delta' (then `local_epochs`, `client_lr`).
      client_weighting: 'uniform' or 'num_examples'.
      eval_protocol: 'sampled', 'full' or 'both'.
      rounds_per_eval, rounds_per_full_eval, rounds_per_checkpoint:
        Evaluation intervals (sampled; full ranking, None: as sampled) and
        the checkpoint interval (0: no checkpoints).
      seed: Initial weights, client sampling and negatives.
      simulation: 'auto', 'vectorized' or 'per_user'.
      max_group_examples: Padded examples per TFF client (vectorized).
      sharpness_probe: Radius of the sharpness probe, or None.
      heldout_users: Fraction of users never trained on nor sampled.
    """

    task: str
    algorithm: str = methods.FEDRECGEL
    data_dir: str | None = None
    data_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    validation: bool = False
    preset: str = 'paper'
    total_rounds: int = 100
    client_fraction: float = 0.1
    clients_per_round: int | None = None
    rho_sh: float = 0.0
    rho_ns: float = 0.0
    local_lr: float = 0.1
    server_lr: float = 0.001
    server_optimizer: str = 'adam'
    num_negatives: int = 4
    local_state: str = 'persistent'
    reconstruction_steps: int = 5
    loss_reduction: str = 'chunk_sum'
    update: str = 'gradient'
    local_epochs: int = 1
    client_lr: float = 0.01
    client_weighting: str = 'uniform'
    eval_protocol: str = 'sampled'
    rounds_per_eval: int = 1
    rounds_per_full_eval: int | None = None
    rounds_per_checkpoint: int = 10
    seed: int = 0
    simulation: str = 'auto'
    max_group_examples: int = 16384
    sharpness_probe: float | None = None
    heldout_users: float = 0.0

    def __post_init__(self):
        tasks.get_task(self.task)
        methods.get_method(self.algorithm)
        for name, allowed in (('simulation', SIMULATIONS), ('preset', PRESETS),
                              ('eval_protocol', EVAL_PROTOCOLS),
                              ('server_optimizer', tuple(methods.SERVER_OPTIMIZERS))):
            if getattr(self, name) not in allowed:
                raise ValueError(f'{name} must be one of {allowed}, got '
                                 f'{getattr(self, name)!r}')
        if not 0.0 <= self.heldout_users <= 0.9:
            raise ValueError(f'heldout_users must be in [0, 0.9], got {self.heldout_users}')

    def hparams(self) -> dict[str, Any]:
        """The settings as `hparams.json` records them (as launch/train.py)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != 'data_options'}
        out['data_dir'] = os.path.abspath(self.data_dir) if self.data_dir else None
        out.update({f'data_{k}': v for k, v in sorted(self.data_options.items())})
        return out

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> tuple['Settings', list[str]]:
        """The settings of a recorded run.

        Args:
          hparams: A run's `hparams.json`.

        Returns:
          `(settings, foreign)`: `foreign` names the recorded settings that
          are set but unknown here (e.g. differential privacy): the model
          loads, but the API does not train it further.

        Raises:
          DataError: If the task or a setting is invalid.
        """
        task = tasks.get_task(hparams.get('task'))
        names = {f.name for f in dataclasses.fields(cls)} - {'data_options'}
        values = {k: hparams[k] for k in names if k in hparams}
        options = {k[5:]: v for k, v in hparams.items()
                   if k.startswith('data_') and k[5:] in task.option_names and v is not None}
        foreign = sorted(k for k, v in hparams.items()
                         if k not in names and not k.startswith('data_')
                         and v not in (None, False))
        try:
            return cls(data_options=options, **values), foreign
        except (TypeError, ValueError) as e:
            raise DataError(f'unusable recorded settings: {e}') from None

    def client_work(self):
        """The `algorithms.ClientWorkConfig` of these settings."""
        from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top

        return client_update.ClientWorkConfig(
            rho_sh=self.rho_sh, rho_ns=self.rho_ns, local_lr=self.local_lr,
            loss_reduction=self.loss_reduction, local_state=self.local_state,
            reconstruction_steps=self.reconstruction_steps, update=self.update,
            local_epochs=self.local_epochs, client_lr=self.client_lr,
            client_weighting=self.client_weighting)


# What FedRecon (TFF's build_fed_recon) fixes, as launch/train.py records it.
_FEDRECON_FIXED = {'local_state': 'reconstruct', 'loss_reduction': 'mean'}
_FEDRECON_UNUSED = ('update', 'local_epochs', 'client_lr', 'client_weighting',
                    'sharpness_probe')


def settings(task: str, *, algorithm: str = methods.FEDRECGEL,
             rho_sh: float | None = None, rho_ns: float | None = None,
             total_rounds: int | None = None, client_fraction: float | None = None,
             preset: str = 'paper', **overrides: Any) -> Settings:
    """A run's settings: the task's defaults, the method's, then `overrides`.

    Args:
      task: A name of `TASK_NAMES`; its SAM radii, rounds and client
        fraction are the defaults (`tasks.get_task(task)` shows them).
      algorithm: A name of `METHOD_NAMES`; radii it fixes (e.g. fedncf: 0)
        win over the task's.
      rho_sh, rho_ns: SAM radii (None: the task's).
      total_rounds, client_fraction: None: the task's (or the preset's).
      preset: 'paper' or 'tuned': the task's tuned settings
        (`Task.tuned`) fill in what is not given.
      **overrides: Any other field of `Settings`.

    Returns:
      The settings.

    Raises:
      ValueError: On unknown names, or a radius or setting the method fixes
        given another value.
      DataError: For an unknown task.
    """
    spec = tasks.get_task(task)
    method = methods.get_method(algorithm)
    given = {'client_fraction': client_fraction, 'total_rounds': total_rounds}
    for name, value in spec.preset(preset).items():
        if name in given and given[name] is None:
            given[name] = value
        elif name not in given:
            overrides.setdefault(name, value)
    total_rounds, client_fraction = given['total_rounds'], given['client_fraction']
    for name, given, fixed in (('rho_sh', rho_sh, method.rho_sh),
                               ('rho_ns', rho_ns, method.rho_ns)):
        if given is not None and fixed is not None and given != fixed:
            raise ValueError(f'{algorithm} sets {name}={fixed}; drop {name}={given}')
    radii = method.radii(spec.rho_sh if rho_sh is None else rho_sh,
                         spec.rho_ns if rho_ns is None else rho_ns)
    if method.algorithm == methods.FEDRECON:
        unused = [k for k in (*_FEDRECON_UNUSED, *_FEDRECON_FIXED) if k in overrides]
        if unused:
            raise ValueError(f'fedrecon does not take {", ".join(unused)} (TFF\'s '
                             'FedRecon: mean loss, no user state)')
        overrides = {**overrides, **_FEDRECON_FIXED}
    try:
        return Settings(
            task=spec.name, algorithm=algorithm, preset=preset, rho_sh=radii[0], rho_ns=radii[1],
            total_rounds=spec.total_rounds if total_rounds is None else total_rounds,
            client_fraction=(spec.client_fraction if client_fraction is None
                             else client_fraction), **overrides)
    except TypeError as e:
        raise ValueError(f'unknown setting: {e}') from None


def cohort_size(*, num_users: int, heldout_users: float, client_fraction: float,
                clients_per_round: int | None) -> int:
    """Users sampled per round: given, or `int(client_fraction * trainers)`.

    Args:
      num_users: Users of the split.
      heldout_users: Fraction of them held out of training.
      client_fraction: Fraction of the training users per round.
      clients_per_round: The cohort size, if given.

    Returns:
      The cohort size (at least 1).

    Raises:
      ValueError: If `clients_per_round` exceeds the training users.
    """
    from tff_fedrecgel.data.client_data import heldout_users_for  # pylint: disable=g-import-not-at-top

    trainers = num_users - len(heldout_users_for(num_users, heldout_users))
    if clients_per_round is None:
        return max(1, int(client_fraction * trainers))
    if clients_per_round > trainers:
        raise ValueError(f'--clients_per_round must be <= {trainers} (the training '
                         f'users), got {clients_per_round}')
    return clients_per_round
