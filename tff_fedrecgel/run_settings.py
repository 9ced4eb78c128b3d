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
from tff_fedrecgel import sizes
from tff_fedrecgel import tasks
from tff_fedrecgel.data import batching
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import SettingError

SIMULATIONS = ('auto', 'vectorized', 'per_user')
PRESETS = recipes.PRESETS
# `--eval_protocol`'s choices: the evaluation package's.
EVAL_PROTOCOLS = protocols.CHOICES
USER_STATE_STORES = ('memory', 'disk')
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


def changed_settings(hparams: Mapping[str, Any]) -> list[str]:
    """The recorded settings a run changed from its task's defaults.

    A `Settings` field counts when its value differs from `task_default`
    (whatever changed it: a flag, a preset or the method); a recorded name
    that is not a field (a reader option ``data_*``, a privacy setting)
    counts when it is set (neither None nor False).

    Args:
      hparams: A run's `hparams.json` (with its `task`).

    Returns:
      The changed names, in the order of `hparams`.

    Raises:
      DataError: If the task is unknown.
    """
    spec = tasks.get_task(hparams.get('task'))
    fields = {f.name for f in dataclasses.fields(Settings)} - {'task', 'data_options'}
    changed = []
    for name, value in hparams.items():
        if name in fields:
            if (tuple(value) if isinstance(value, list) else value) != task_default(spec, name):
                changed.append(name)
        elif name != 'task' and value is not None and value is not False:
            changed.append(name)
    return changed


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
      preset: The preset `settings` filled in (`recipes`): 'paper', 'tuned'
        (the task's own), 'auto' (chosen for transfer) or a ``.json`` file;
        None: the task's `default_preset`.
      local_lr: Client Adam on the user embedding.
      server_lr, server_optimizer: The server optimizer and its rate.
      num_negatives: Training negatives per positive.
      local_state: 'persistent' or 'reconstruct'.
      reconstruction_steps: Adam steps of a reconstruction.
      loss_reduction: 'chunk_sum' or 'mean'.
      update: 'gradient' or 'model_delta' (then `local_epochs`, `client_lr`).
      client_weighting: 'uniform' or 'num_examples'.
      eval_protocol: A name of `EVAL_PROTOCOLS`: 'sampled', 'full' or 'both'.
      eval_users: Evaluate a fixed random sample of this many users (the
        same every round, method and seed) and report standard errors;
        None: every user (`eval_sample`).
      rounds_per_eval, rounds_per_full_eval, rounds_per_checkpoint:
        Evaluation intervals (sampled; full ranking, None: as sampled) and
        the checkpoint interval (0: no checkpoints).
      seed: Initial weights, client sampling and negatives.
      simulation: 'auto', 'vectorized' or 'per_user'.
      user_state_store: Where every user's state (embedding, local Adam)
        lives: 'memory', or 'disk' (memory-mapped in the run's
        `user_states/`, read and written a cohort at a time; checkpoints
        name a version of it, kept exact by an undo journal). FedRecGEL
        methods with persistent local state.
      max_group_examples: Padded examples per TFF client (vectorized).
      sharpness_probe: Radius of the sharpness probe, or None.
      heldout_users: Fraction of users never trained on nor sampled.
      early_stopping_patience: With `validation`, stop after this many
        evaluations without a better validation round (None: never).
      gmf_dim, mlp_dim, mlp_layers: The NeuMF sizes (`sizes.ModelConfig`).
      chunk_size: Examples per chunk of 'chunk_sum' (and per minibatch of
        'model_delta').
      top_ks: Cut-offs K of HR@K and NDCG@K (with `sizes.SELECT_K`).
      eval_negatives: Sampled negatives the held-out item is ranked among
        (the sampled protocol; full ranking needs none).
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
    eval_protocol: str = protocols.SAMPLED.name
    eval_users: int | None = None
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
        for name, allowed in (('simulation', SIMULATIONS),
                              ('eval_protocol', EVAL_PROTOCOLS),
                              ('user_state_store', USER_STATE_STORES),
                              ('server_optimizer', tuple(methods.SERVER_OPTIMIZERS))):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f'must be one of {allowed}', getattr(self, name))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind, optional = setting_checks.field_kind(field)
            if kind is not None and not (optional and value is None) and field.name != 'data_dir':
                check_type(field.name, value, kind)
            check_range(field.name, value)
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
        if self.early_stopping_patience and not self.validation:
            raise SettingError('early_stopping_patience', 'needs --validation (it watches '
                               'the validation item)', self.early_stopping_patience)

    def hparams(self) -> dict[str, Any]:
        """The settings as `hparams.json` records them (as launch/train.py)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != 'data_options'}
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

    def build_simulation(self, split, *, one_user_per_client: bool = False,
                         model_aggregator=None, workers: str | None = None):
        """The `simulation.Simulation` of these settings (imports TFF).

        Args:
          split: The loaded `data.Split`.
          one_user_per_client: Run one user per TFF client whatever
            `simulation` says (DP and secure aggregation act on each upload).
          model_aggregator: The global update's aggregator (None: mean).
          workers: `host:port,...` of TFF worker services, or None.

        Returns:
          The simulation, not yet started.

        Raises:
          ValueError: If the cohort exceeds the training users.
        """
        from tff_fedrecgel import simulation  # pylint: disable=g-import-not-at-top

        return simulation.build_simulation(
            split=split, method=self.algorithm, work=self.client_work(),
            clients_per_round=self.cohort(split.num_users), seed=self.seed,
            server_lr=self.server_lr, server_optimizer=self.server_optimizer,
            num_negatives=self.num_negatives,
            users_per_client=None if self.vectorized(one_user_per_client) else 1,
            max_group_examples=self.max_group_examples, model_aggregator=model_aggregator,
            workers=workers, sharpness_probe=self.sharpness_probe,
            heldout_fraction=self.heldout_users, eval_users=self.eval_users,
            model_sizes=self.model_sizes(), top_ks=self.top_ks,
            user_state_store=self.user_state_store)


# Settings a preset file may not set: they name the run, not its recipe.
NOT_PRESETTABLE = ('task', 'algorithm', 'data_dir', 'data_options', 'preset')


def _task_defaults(spec: tasks.Task) -> dict[str, Any]:
    """The settings whose defaults a task owns (the others are `Settings`')."""
    return {'client_fraction': spec.client_fraction, 'total_rounds': spec.total_rounds,
            'rho_sh': spec.rho_sh, 'rho_ns': spec.rho_ns}


def settings(task: str, *, algorithm: str = methods.FEDRECGEL,
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
        win over the task's.
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
    method = methods.get_method(algorithm)
    preset = spec.default_preset if preset is None else preset
    from_preset = spec.preset(preset, data_profile)
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



def preset_banner(run: Settings, data_profile: recipes.DataProfile | None) -> str:
    """One line saying which preset a run uses and every setting it changed.

    Args:
      run: The run's settings.
      data_profile: The data's profile (as given to `settings`).
    """
    spec = tasks.get_task(run.task)
    if run.preset == recipes.PAPER:
        return ('preset paper: the paper\'s protocol, which ranks near item popularity '
                '(docs/RESULTS.md); --preset=auto learns')
    changed = []
    for name, value in spec.preset(run.preset, data_profile).items():
        before = task_default(spec, name)
        if getattr(run, name, None) == value and value != before:
            changed.append(f'{name} {before:g} -> {value:g}' if isinstance(value, (int, float))
                           and not isinstance(value, bool) else f'{name} {before} -> {value}')
    line = f'preset {run.preset}: ' + (', '.join(changed) or 'changes nothing here')
    if run.preset == recipes.AUTO and data_profile is not None:
        line += f' ({recipes.describe_auto(data_profile)})'
    return line
