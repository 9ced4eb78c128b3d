"""Every setting of a run, with the tasks' and the methods' defaults.

`Settings` holds what a run records in `hparams.json` (the names of
`launch/train.py`'s flags); `settings(task, ...)` fills in the task's SAM
radii, rounds, client fraction and preset and what the method fixes, and
checks every value. `launch/train.py` and the Python API (`api.py`) both
build their runs from them; `Settings.from_hparams` reads a recorded run
back. Each value's type and range is checked by `setting_checks`; the
model's and the evaluation's sizes default to `sizes`. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import os
from typing import Any

import numpy as np

from tff_fedrecgel import algorithm_config
from tff_fedrecgel import methods
from tff_fedrecgel import recipes
from tff_fedrecgel import setting_checks
from tff_fedrecgel import settings_tree
from tff_fedrecgel import sizes
from tff_fedrecgel import tasks
from tff_fedrecgel.data import batching
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import SettingError

SIMULATIONS = settings_tree.SIMULATIONS
PRESETS = recipes.PRESETS
# `--eval_protocol`'s choices: the evaluation package's.
EVAL_PROTOCOLS = protocols.CHOICES
USER_STATE_STORES = settings_tree.USER_STATE_STORES
_WORK = algorithm_config.CLIENT_WORK
_SERVER = algorithm_config.SERVER
# Re-exported: the checks and bounds live in setting_checks.
MAX_SEED = setting_checks.MAX_SEED
check_type = setting_checks.check_type
check_range = setting_checks.check_range


def default(name: str) -> Any:
    """The default of a `Settings` field (the flags of the same name use it)."""
    return Settings.__dataclass_fields__[name].default  # pylint: disable=no-member


def recorded_default(name: str) -> Any:
    """What `hparams.json` records for a `Settings` field left at its default
    (lists as lists); None for other names (a run without them had none)."""
    if name not in Settings.__dataclass_fields__:  # pylint: disable=no-member
        return None
    value = default(name)
    return list(value) if isinstance(value, tuple) else value


def task_default(spec: tasks.Task, name: str) -> Any:
    """What a run of task `spec` has for setting `name` when it names no
    preset and no value: the task's own default, else `default(name)`.

    Raises:
      KeyError: If `name` is not a setting.
    """
    if name == 'preset':
        return spec.default_preset
    owned = _task_defaults(spec)
    return owned[name] if name in owned else default(name)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a run (`launch/train.py`'s flags of the same names).

    Build it with `settings(task, ...)`, which fills in the task's defaults.
    The attributes below are `settings_tree`'s, by concern; `data_options`
    holds the task's reader options (synthetic: `num_users`, `num_items`,
    `seed`, ...; csv: `sep`, `user_col`, ...).
    """

    task: str
    algorithm: str = methods.FEDRECGEL
    data_dir: str | None = None
    data_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    validation: bool = False
    preset: str | None = None
    total_rounds: int = tasks.DEFAULT_ROUNDS
    client_fraction: float = tasks.DEFAULT_CLIENT_FRACTION
    clients_per_round: int | None = None
    rho_sh: float = _WORK.rho_sh
    rho_ns: float = _WORK.rho_ns
    local_lr: float = _WORK.local_lr
    server_lr: float = _SERVER.learning_rate
    server_optimizer: str = _SERVER.optimizer
    num_negatives: int = sizes.TRAINING_NEGATIVES
    local_state: str = _WORK.local_state
    reconstruction_steps: int = _WORK.reconstruction_steps
    loss_reduction: str = _WORK.loss_reduction
    update: str = _WORK.update
    local_epochs: int = _WORK.local_epochs
    client_lr: float = _WORK.client_lr
    client_weighting: str = _WORK.client_weighting
    lr_scale: float = _WORK.lr_scale
    eval_protocol: str = protocols.SAMPLED.name
    eval_users: int | None = None
    eval_scoring: str = protocols.DEFAULT_SCORING
    rounds_per_eval: int = 1
    rounds_per_full_eval: int | None = None
    rounds_per_checkpoint: int = 10
    seed: int = 0
    simulation: str = 'auto'
    user_state_store: str = 'memory'
    max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES
    sharpness_probe: float | None = None
    heldout_users: float = 0.0
    early_stopping_patience: int | None = None
    gmf_dim: int = sizes.GMF_DIM
    mlp_dim: int = sizes.MLP_DIM
    mlp_layers: tuple[int, ...] = sizes.MLP_LAYERS
    chunk_size: int = _WORK.chunk_size
    top_ks: tuple[int, ...] = sizes.TOP_KS
    eval_negatives: int = sizes.EVAL_NEGATIVES
    dp_noise_multiplier: float | None = None
    dp_clip: float | None = None
    dp_adaptive_clip: bool = False
    dp_delta: float | None = None
    secure_aggregation: bool = False

    def __post_init__(self):
        for name in ('task', 'algorithm'):
            check_type(name, getattr(self, name), 'str')
        spec = tasks.get_task(self.task)
        methods.get_method(self.algorithm)
        if self.preset is None:
            object.__setattr__(self, 'preset', spec.default_preset)
        if self.preset not in PRESETS and not recipes.is_preset_file(self.preset):
            raise SettingError('preset', f'must be one of {PRESETS} or a .json file',
                               self.preset)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind, optional = setting_checks.field_kind(field)
            if kind is not None and not (optional and value is None) and field.name != 'data_dir':
                check_type(field.name, value, kind)
            check_range(field.name, value)
            setting_checks.check_choice(field.name, value)
        if self.data_dir is not None and (
                not isinstance(self.data_dir, (str, os.PathLike)) or spec.raw_file is None):
            raise SettingError('data_dir', 'must be a folder or file name' if spec.raw_file
                               else f'is not read by {spec.name} (its data is generated)',
                               self.data_dir)
        if not isinstance(self.data_options, Mapping):
            raise SettingError('data_options', 'must be a mapping', self.data_options)
        spec.check_options(self.data_options)
        for name in setting_checks.INT_LISTS:
            object.__setattr__(self, name, setting_checks.int_list(name, getattr(self, name)))
        if sizes.SELECT_K not in self.top_ks:
            raise SettingError('top_ks', f'must include {sizes.SELECT_K} (rounds are selected '
                               f'on HR@{sizes.SELECT_K})', ','.join(map(str, self.top_ks)))
        object.__setattr__(self, 'top_ks', tuple(sorted(set(self.top_ks))))
        if protocols.SAMPLED in protocols.selected(self.eval_protocol) and max(self.top_ks) > self.eval_negatives + 1:
            raise SettingError('top_ks', f'must be <= {self.eval_negatives + 1} each (the '
                               'sampled protocol ranks the item among eval_negatives)',
                               ','.join(map(str, self.top_ks)))
        if self.user_state_store != 'memory' and (
                methods.get_method(self.algorithm).algorithm != methods.FEDRECGEL
                or self.local_state != 'persistent'):
            raise SettingError('user_state_store', f'{self.user_state_store!r} needs a method '
                               'that keeps each user\'s state (the FedRecGEL family, '
                               'local_state=persistent)',
                               f'algorithm {self.algorithm}, local_state {self.local_state}')
        if self.user_state_store == 'disk' and not self.rounds_per_checkpoint:
            raise SettingError('rounds_per_checkpoint', 'must be positive with '
                               'user_state_store=disk (its undo journal is trimmed at '
                               'checkpoints)', self.rounds_per_checkpoint)
        if self.private and self.simulation == 'vectorized':
            # A vectorized client uploads one mean per group of users.
            raise ValueError('DP and secure aggregation act on each user\'s upload; drop '
                             '--simulation=vectorized (auto runs one user per TFF client)')
        if any(getattr(self, name) not in (None, False) for name in PRIVACY_SETTINGS):
            self.privacy()  # A DP setting without DP, or a value out of range, is refused.
        if self.private and not methods.get_method(self.algorithm).private:
            raise SettingError('algorithm', 'does not take DP or secure aggregation',
                               self.algorithm)
        if self.early_stopping_patience and not self.validation:
            raise SettingError('early_stopping_patience', 'needs --validation (it watches '
                               'the validation item)', self.early_stopping_patience)

    def hparams(self, num_users: int | None = None) -> dict[str, Any]:
        """The settings as `hparams.json` records them.

        Args:
          num_users: The population; with it, DP's default delta is recorded
            as the value it takes (1 / users).
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ('data_options', *PRIVACY_SETTINGS)}
        if self.private:
            out.update(self.privacy().hparams(num_users=num_users))
        out['data_dir'] = os.path.abspath(self.data_dir) if self.data_dir else None
        out.update({name: list(getattr(self, name)) for name in setting_checks.INT_LISTS})
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

    @property
    def private(self) -> bool:
        """Whether the run has DP or secure aggregation (each acts on every
        user's upload, so the run has one user per TFF client)."""
        return self.dp_noise_multiplier is not None or self.secure_aggregation

    def privacy(self):
        """The `privacy.PrivacySettings` of these settings, checked.

        Raises:
          SettingError, ValueError: On inconsistent privacy settings.
        """
        from tff_fedrecgel.privacy import PrivacySettings  # pylint: disable=g-import-not-at-top

        given = [f'dp_{n}' for n in ('clip', 'adaptive_clip', 'delta')
                 if getattr(self, f'dp_{n}') not in (None, False)]
        if self.dp_noise_multiplier is None and given:
            raise SettingError(given[0], 'needs --dp_noise_multiplier')
        return PrivacySettings(noise_multiplier=self.dp_noise_multiplier, clip=self.dp_clip,
                               adaptive_clip=self.dp_adaptive_clip, delta=self.dp_delta,
                               secure_aggregation=self.secure_aggregation)

    def checked_privacy(self, num_users: int, clients: int):
        """The run's `PrivacySettings`, checked against its population and
        cohort (no TFF).

        Raises:
          SettingError, ValueError: If DP cannot be accounted for this run,
            or the settings contradict it.
        """
        privacy = self.privacy()
        privacy.check_accounting(clients_per_round=clients, num_users=num_users,
                                 total_rounds=self.total_rounds)
        privacy.check_client_weighting(self.client_weighting)
        privacy.hparams(num_users=num_users)  # Checks the population size.
        return privacy

    def client_work(self):
        """The `ClientWorkConfig` of these settings (same names) and of the method."""
        config = algorithm_config.ClientWorkConfig
        method = methods.get_method(self.algorithm)
        return config(sam_eta=method.sam_eta, global_perturbation=method.global_perturbation,
                      **{f.name: getattr(self, f.name) for f in dataclasses.fields(config)
                         if hasattr(self, f.name)})

    @property
    def split_negatives(self) -> int:
        """Sampled evaluation negatives the split draws (0 under full ranking
        alone: a catalog smaller than `eval_negatives` then works)."""
        sampled = protocols.SAMPLED in protocols.selected(self.eval_protocol)
        return self.eval_negatives if sampled else 0

    def model_sizes(self) -> dict[str, Any]:
        """The `sizes.ModelConfig` fields these settings give (not `num_items`)."""
        return {'gmf_dim': self.gmf_dim, 'mlp_dim': self.mlp_dim, 'mlp_layers': self.mlp_layers}

    def cohort(self, num_users: int) -> int:
        """Users sampled per round: `clients_per_round`, or
        `int(client_fraction * training users)` (at least 1).

        Args:
          num_users: Users of the split (held-out users do not train).

        Raises:
          SettingError: If `clients_per_round` exceeds the training users.
        """
        from tff_fedrecgel.data.client_data import heldout_users_for  # pylint: disable=g-import-not-at-top

        trainers = num_users - len(heldout_users_for(num_users, self.heldout_users))
        if self.clients_per_round is None:
            return max(1, int(self.client_fraction * trainers))
        if self.clients_per_round > trainers:
            raise SettingError('clients_per_round', f'must be <= {trainers} (the training '
                               'users)', self.clients_per_round)
        return self.clients_per_round

    def check_split(self, split) -> int:
        """Checks the settings that depend on the data; returns the cohort.

        A user's training negatives are drawn without repeats from the items
        it did not train on, so `num_negatives` must leave every user that
        many (checked here, before a run writes anything, not in round 1).

        Args:
          split: The loaded `data.Split`.

        Returns:
          `cohort(split.num_users)`.

        Raises:
          SettingError: If the cohort, `num_negatives` or `eval_negatives`
            does not fit the data.
        """
        clients = self.cohort(split.num_users)
        if 'num_negatives' in methods.get_method(self.algorithm).takes:
            rows = np.bincount(split.train_users, minlength=split.num_users)
            room = int(split.num_items - rows.max()) if len(rows) else split.num_items
            if self.num_negatives > room:
                busiest = int(rows.argmax())
                if split.user_ids is not None:
                    busiest = np.asarray(split.user_ids)[busiest].item()
                raise SettingError(
                    'num_negatives', f'must be <= {max(room, 0)} (the items user '
                    f'{busiest!r}, with the most '
                    f'training rows, {int(rows.max())} of {split.num_items} items, did not '
                    'train on)', self.num_negatives)
        drawn = split.test_negatives.shape[1]
        if self.split_negatives and drawn != self.eval_negatives:
            raise SettingError('eval_negatives', f'must be {drawn}, the sampled negatives of '
                               'the split given', self.eval_negatives)
        return clients

    def vectorized(self, one_user_per_client: bool = False) -> bool:
        """Whether TFF clients hold several users ('auto' does unless each
        user's upload must stay apart, as for DP and secure aggregation)."""
        return self.simulation == 'vectorized' or (
            self.simulation == 'auto' and not one_user_per_client)

    def build_simulation(self, split, *, model_aggregator=None, workers: str | None = None):
        """The `simulation.Simulation` of these settings (imports TFF).

        DP and secure aggregation give the global update's aggregator and
        one user per TFF client (each acts on every user's upload).

        Args:
          split: The loaded `data.Split`.
          model_aggregator: The global update's aggregator (None: the
            privacy settings', else the mean).
          workers: `host:port,...` of TFF worker services, or None.

        Returns:
          The simulation, not yet started.

        Raises:
          ValueError: If the cohort exceeds the training users, or the
            privacy settings do not fit the run.
        """
        from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

        clients = self.cohort(split.num_users)
        if model_aggregator is None and self.private:
            model_aggregator, _ = self.checked_privacy(split.num_users, clients).build(
                clients_per_round=clients, num_users=split.num_users)
        return simulation.build_simulation(
            split=split, method=self.algorithm, work=self.client_work(),
            clients_per_round=clients, seed=self.seed,
            server_lr=self.server_lr, server_optimizer=self.server_optimizer,
            num_negatives=self.num_negatives,
            users_per_client=None if self.vectorized(self.private) else 1,
            max_group_examples=self.max_group_examples, model_aggregator=model_aggregator,
            workers=workers, sharpness_probe=self.sharpness_probe,
            heldout_fraction=self.heldout_users, eval_users=self.eval_users,
            model_sizes=self.model_sizes(), top_ks=self.top_ks,
            user_state_store=self.user_state_store, eval_scoring=self.eval_scoring)

    def privacy_report(self, num_users: int):
        """The run's `privacy_accounting.PrivacyReport` (None without DP)."""
        privacy = self.privacy()
        return privacy.report(clients_per_round=self.cohort(num_users),
                              num_users=num_users) if privacy.dp else None


Settings.__doc__ += '\n    Attributes:\n' + '\n'.join(
    '  ' + line for line in settings_tree.described(
        [f.name for f in dataclasses.fields(Settings)]).splitlines()) + '\n'
# The privacy settings: recorded only when the run has DP or secure aggregation.
PRIVACY_SETTINGS = tuple(s.name for s in settings_tree.leaf('privacy').settings)

# Settings a preset may set that count rounds (`methods.Method.round_unit`).
COUNTED_IN_ROUNDS = ('total_rounds', 'rounds_per_full_eval')

# Settings a preset file may not set: they name the run, not its recipe.
NOT_PRESETTABLE = ('task', 'algorithm', 'data_dir', 'data_options', 'preset')


def _task_defaults(spec: tasks.Task) -> dict[str, Any]:
    """The settings whose defaults a task owns (the others are `Settings`')."""
    return {'client_fraction': spec.client_fraction, 'total_rounds': spec.total_rounds,
            'rho_sh': spec.rho_sh, 'rho_ns': spec.rho_ns}


def chosen_algorithm(algorithm: str | None, preset: str | None) -> str:
    """The method a run trains: `algorithm` if given, else the one a preset
    file was tuned for (`recipes.preset_algorithm`), else fedrecgel.

    Raises:
      DataError: If the preset file is missing or unreadable.
    """
    if algorithm is not None:
        return algorithm
    return (preset is not None and recipes.preset_algorithm(preset)) or methods.FEDRECGEL


def settings(task: str, *, algorithm: str | None = None,
             rho_sh: float | None = None, rho_ns: float | None = None,
             total_rounds: int | None = None, client_fraction: float | None = None,
             preset: str | None = None, data_profile: recipes.DataProfile | None = None,
             **overrides: Any) -> Settings:
    """A run's settings: the task's defaults, the preset's, the method's, then
    what is given.

    Args:
      task: A name of `TASK_NAMES`; its SAM radii, rounds and client
        fraction are the defaults (`tasks.get_task(task)` shows them).
      algorithm: A name of `METHOD_NAMES`; radii it fixes (e.g. fedncf: 0)
        win over the task's. None: `chosen_algorithm`'s.
      rho_sh, rho_ns: SAM radii (None: the task's, or the preset's).
      total_rounds, client_fraction: None: the task's (or the preset's).
      preset: A preset of `recipes` (None: the task's `default_preset`); its
        settings fill in what is not given.
      data_profile: The data's `recipes.DataProfile`; presets derived from
        the data (`recipes.needs_data`) need it for their full recipe.
      **overrides: Any other field of `Settings`.

    Returns:
      The settings.

    Raises:
      ValueError: On unknown names, or a radius or setting the method fixes
        given another value.
      DataError: For an unknown task or an unreadable preset file.
    """
    spec = tasks.get_task(task)
    preset = spec.default_preset if preset is None else preset
    algorithm = chosen_algorithm(algorithm, preset)
    method = methods.get_method(algorithm)
    from_preset = spec.preset(preset, data_profile)
    tuned_for = methods.get_method(recipes.preset_algorithm(preset) or methods.FEDRECGEL)
    if tuned_for.round_unit != method.round_unit:
        # A preset's rounds count its own method's unit (e.g. auto's are
        # federated rounds, not the central model's epochs).
        for name in COUNTED_IN_ROUNDS:
            from_preset.pop(name, None)
    refused = sorted(set(from_preset) & set(NOT_PRESETTABLE))
    if refused:
        raise ValueError(f'preset {preset} may not set {", ".join(refused)}')
    for name, given, fixed in (('rho_sh', rho_sh, method.rho_sh),
                               ('rho_ns', rho_ns, method.rho_ns)):
        if given is not None and fixed is not None and given != fixed:
            raise SettingError(name, f'must be {fixed} for {algorithm} (or left out)', given)
    explicit = {'client_fraction': client_fraction, 'total_rounds': total_rounds,
                'rho_sh': rho_sh, 'rho_ns': rho_ns}
    fallback = _task_defaults(spec)
    if method.default_radii is not None:
        fallback.update(rho_sh=method.default_radii[0], rho_ns=method.default_radii[1])
    chosen = {name: (value if value is not None else from_preset.get(name, fallback[name]))
              for name, value in explicit.items()}
    radii = method.radii(chosen['rho_sh'], chosen['rho_ns'])
    preset_rest = {k: v for k, v in from_preset.items() if k not in explicit}
    unused = method.refused(overrides)
    if unused:
        raise ValueError(f'{algorithm} does not take {", ".join(unused)}'
                         + (f' ({method.note})' if method.note else ''))
    # What a preset says of them does not apply to the method either.
    preset_rest = {k: v for k, v in preset_rest.items() if not method.refused([k])}
    overrides = {**overrides, **method.fixes}
    overrides = {**preset_rest, **overrides}
    try:
        return Settings(
            task=spec.name, algorithm=algorithm, preset=preset, rho_sh=radii[0], rho_ns=radii[1],
            total_rounds=chosen['total_rounds'], client_fraction=chosen['client_fraction'],
            **overrides)
    except TypeError as e:
        raise ValueError(f'unknown setting: {e}') from None
