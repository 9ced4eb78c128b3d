"""Every setting of a run as a tree: one leaf per concern, each setting once.

A `Leaf` is a concern (the data, the model, the method, what a client does,
the server's step, evaluation, privacy, the simulation, the output); each
of its `Setting`s says, in one place, what the setting means, its choices,
its range, whether the task fills it in, and how the tuner searches it. The
defaults stay with the modules whose objects use them (`algorithm_config`,
`sizes`, `tasks`, `run_settings.Settings`), so a library object built
without any settings has the same values.

Derived from this tree, never written again:
- the command-line flags, their types and `--help` groups, and
  docs/FLAGS.md (`launch/_tree_flags.py`, `launch/_flag_groups.py`);
- the range and choice checks of `run_settings.Settings`, and of the
  client work's and the server's configurations (`setting_checks`);
- `Settings`' docstring, which is the API's keyword arguments
  (`api.settings(task, **kwargs)`);
- the settings the tuner can search (`tuning.SEARCHABLE`) and its default
  space (`tuning.SEARCH_SPACE`).
`hparams.json`, TensorBoard's HParams and export's options are the
recorded settings (`Settings.hparams()`), whose names are this tree's.

Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from tff_fedrecgel import recipes
from tff_fedrecgel import sizes
from tff_fedrecgel.evaluation import protocols

# TFF's client sampling seeds numpy's RandomState.
MAX_SEED = 2**32 - 1
# 32-bit signed integers: what TensorFlow's counters and loop bounds hold.
INT32_MAX = 2**31 - 1
# Rounds a run may ask for (a round takes at least milliseconds).
MAX_ROUNDS = 1_000_000
# Local work per user and round: beyond these a round or an evaluation runs
# for hours without changing the model any more.
MAX_LOCAL_EPOCHS = 1_000
MAX_RECONSTRUCTION_STEPS = 10_000
# HR@K past this many items says nothing a user would see.
MAX_TOP_K = 1_000

# The choice lists; `algorithm_config` (the client work and the server) and
# `run_settings` take them from here.
LOCAL_STATES = ('persistent', 'reconstruct')
UPDATE_MODES = ('gradient', 'model_delta')
CLIENT_WEIGHTINGS = ('uniform', 'num_examples')
LOSS_REDUCTIONS = ('chunk_sum', 'mean')
# `tff.learning.optimizers` a server may apply to the averaged update
# (`fedrecgel.build_server_optimizer`); Adam is the authors'.
SERVER_OPTIMIZERS = ('adam', 'yogi', 'adagrad', 'sgdm', 'sgd')
SIMULATIONS = ('auto', 'vectorized', 'per_user')
USER_STATE_STORES = ('memory', 'disk')

_POSITIVE_INT = (1, True, INT32_MAX)
_POSITIVE = (0, False, None)
_RADIUS = (0, True, None)


@dataclasses.dataclass(frozen=True)
class Search:
    """How the tuner searches a setting by default.

    Attributes:
      order: Where the tuner asks for it (a trial's draws follow this order,
        and `update` comes before what only 'model_delta' uses).
      low, high: The range of a number (on a log scale if `log`).
      choices: The choices of a categorical setting (a subset of the
        setting's own).
      log: Search the range on a log scale.
      when: None (always), 'sam' (methods with a free SAM radius),
        'model_delta' (when `update` is 'model_delta') or 'federated' (not
        the central model).
      by_default: In the default space; False: searched only when named
        (`launch/tune.py --space`).
    """

    order: int
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    log: bool = False
    when: str | None = None
    by_default: bool = True


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its name (the flag's, the `hparams.json` key's, the API
    keyword's) and what is known of it.

    Attributes:
      name: The setting.
      help: What it means, in the words of `--help`.
      choices: Its allowed values (a string setting), or None.
      range: `(lowest, lowest allowed itself, highest or None)` of a number.
      entries: `(what each entry is, lowest, highest)` of a list of ints.
      registry: The registry whose names are its choices ('methods':
        `methods.METHODS`, 'tasks': `tasks.TASK_NAMES`), which own them.
      filled: Who fills it in when it is not given, its flag then having no
        default of its own: 'task' (the task and its preset, which the help
        says) or 'run' (the help says how).
      search: How the tuner searches it (None: not searched).
      recorded: A setting of the run's numbers (a `Settings` field, recorded
        in `hparams.json`); False: an option of how the run goes that
        changes no number (where it writes, a cache, worker services, the
        progress display), with its `kind` and `default` here.
      kind: 'int', 'float', 'str' or 'bool' of an unrecorded option.
      default: The default of an unrecorded option.
    """

    name: str
    help: str
    choices: tuple[Any, ...] | None = None
    range: tuple[float, bool, float | None] | None = None
    entries: tuple[str, int, int] | None = None
    registry: str | None = None
    filled: str | None = None
    search: Search | None = None
    recorded: bool = True
    kind: str | None = None
    default: Any = None


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A concern: its name, what it holds, and its settings in `--help` order."""

    name: str
    what: str
    settings: tuple[Setting, ...]


TREE = (
    Leaf('data', 'the dataset and how it is read', (
        Setting('data_dir', 'Folder holding the raw file (for csv: the folder holding '
                'ratings.csv, or the file itself). Not used by synthetic.'),
        Setting('validation', "Also hold out each user's second-latest interaction as "
                'validation (for honest model selection; training then excludes it).'),
        Setting('cache_dir', 'train.py, benchmark.py: reuse (or write) the prepared split '
                'in this folder (as prepare_data.py --output_dir), so that a run, or a '
                'resumed one, skips the preparation. Other commands ignore it.',
                recorded=False, kind='str'),
    )),
    Leaf('model', 'the NeuMF sizes', (
        Setting('gmf_dim', 'Embedding size of the GMF branch (users and items).',
                range=(1, True, sizes.MAX_WIDTH)),
        Setting('mlp_dim', 'Embedding size of the MLP branch (users and items; not '
                "FedMF's).", range=(1, True, sizes.MAX_WIDTH)),
        Setting('mlp_layers', "Widths of the MLP tower's ReLU layers, comma-separated "
                "(not FedMF's).", entries=('width', 1, sizes.MAX_WIDTH)),
    )),
    Leaf('method', 'the task, the algorithm, its preset and SAM radii', (
        Setting('task', 'Dataset task.', registry='tasks', filled='run'),
        Setting('algorithm', 'A method of the registry (`methods.METHODS`).', registry='methods'),
        Setting('rho_sh', 'SAM radius of the global (item) part.', range=_RADIUS,
                filled='task', search=Search(8, 1e-3, 0.5, log=True, when='sam')),
        Setting('rho_ns', 'SAM radius of the local (user) part.', range=_RADIUS,
                filled='task', search=Search(9, 1e-3, 0.5, log=True, when='sam')),
        Setting('seed', 'Seed of initial weights, client sampling and negatives.',
                range=(0, True, MAX_SEED)),
        Setting('preset', "paper: the paper's protocol (docs/ALGORITHM.md); tuned: the "
                "task's own settings chosen on its validation item; auto: chosen for "
                "transfer by the data's history length (five local epochs below "
                f'{recipes.AUTO_LONG_HISTORY:g} interactions per user, one gradient a round '
                'with a faster server above), with the training negatives derived from the '
                f'data and, with --validation, {recipes.AUTO_VALIDATED_ROUNDS} rounds of '
                'federated training, ranked against every item every 1-'
                f'{recipes.AUTO_MAX_FULL_EVERY} rounds by the data\'s size '
                '(docs/RESULTS.md, "Transfer"); or a .json preset file '
                '(launch/tune.py writes one, with the method it tuned, which is then the '
                'default --algorithm). Default: '
                "paper for the paper's datasets, auto for csv and synthetic. Flags given "
                'explicitly win.', filled='run'),
    )),
    Leaf('client', 'what a user does in a round', (
        Setting('local_lr', 'Learning rate of the client Adam on the user embedding.',
                range=_POSITIVE, search=Search(7, 0.01, 1.0, log=True)),
        Setting('num_negatives', "Training negatives per positive in a client's batch.",
                range=(0, True, INT32_MAX), search=Search(6, 1, 32, log=True)),
        Setting('local_state', 'persistent: each user keeps its embedding and Adam state '
                'across rounds; reconstruct: nothing is kept, the embedding is re-derived '
                'every round.', choices=LOCAL_STATES),
        Setting('reconstruction_steps', 'Adam steps of the reconstruct mode and FedRecon.',
                range=(1, True, MAX_RECONSTRUCTION_STEPS)),
        Setting('loss_reduction', "chunk_sum: sum of the mean loss of --chunk_size-example "
                "chunks (the authors'); mean: the plain mean.",
                choices=LOSS_REDUCTIONS),
        Setting('chunk_size', "Examples per chunk of --loss_reduction=chunk_sum (the "
                "authors'), and per minibatch of --update=model_delta.", range=_POSITIVE_INT),
        Setting('update', "gradient: clients upload the SAM gradient (the authors'); "
                'model_delta: clients run --local_epochs of SAM steps and upload the '
                'weight change.', choices=UPDATE_MODES,
                search=Search(3, choices=UPDATE_MODES)),
        Setting('local_epochs', 'model_delta: epochs.', range=(1, True, MAX_LOCAL_EPOCHS),
                search=Search(4, 1, 10, when='model_delta')),
        Setting('client_lr', 'model_delta: client SGD rate.', range=_POSITIVE,
                search=Search(5, 1e-3, 0.3, log=True, when='model_delta')),
        Setting('lr_scale', 'pfedrec, gpfedrec, fedrap: multiplies every learning rate of '
                "the method's own client work (1: its authors' rates); central: multiplies "
                'its Adam rate.', range=_POSITIVE,
                search=Search(6, 0.1, 10.0, log=True)),
    )),
    Leaf('server', 'its step on the aggregated update', (
        Setting('server_lr', 'Server learning rate.', range=_POSITIVE,
                search=Search(1, 1e-4, 0.1, log=True)),
        Setting('server_optimizer', "Server optimizer on the averaged update "
                "(tff.learning.optimizers): adam (the authors'), yogi, adagrad, sgdm "
                '(momentum 0.9) or sgd.', choices=SERVER_OPTIMIZERS,
                search=Search(0, choices=SERVER_OPTIMIZERS[:4])),
        Setting('client_weighting', "Aggregation weights: uniform (the authors') or by "
                'examples.', choices=CLIENT_WEIGHTINGS),
    )),
    Leaf('evaluation', 'protocols, schedule, who is evaluated', (
        Setting('eval_protocol', 'sampled: the held-out item among --eval_negatives sampled '
                "negatives (the paper's; metrics test/...); full: among every item the user "
                'did not train on (test_full/..., with MRR: the protocol to trust); both.',
                choices=protocols.CHOICES),
        Setting('rounds_per_eval', 'Evaluate all users every this many rounds.',
                range=_POSITIVE_INT),
        Setting('rounds_per_full_eval', 'With --eval_protocol=full or both: rank against '
                'every item every this many rounds (default: --rounds_per_eval).',
                range=_POSITIVE_INT),
        Setting('eval_users', 'Evaluate a fixed random sample of this many users (the same '
                'every round, method and seed; held-out users sampled apart) and report '
                "each metric's standard error (<metric>_se); default: every user. Rule: "
                'evaluate everyone while an evaluation costs less than the rounds between '
                'two; past that (hundreds of thousands of users), 10000 bounds the standard '
                'error of HR@10 by 0.005 (docs/PERFORMANCE.md, "Scale").',
                range=_POSITIVE_INT),
        Setting('eval_scoring', 'How full ranking scores the users: batched, 32 users '
                'per matrix product; exact, one user at a time as a device does, 1.3-2x '
                'slower. Both give the same scores, bit for bit on CPUs whose matrix products '
                'sum a row alike whatever their rows, else to float rounding '
                '(docs/PERFORMANCE.md, "Scoring"). NeuMF methods only.',
                choices=protocols.SCORINGS),
        Setting('heldout_users', 'Fraction of users that never train nor are sampled; each '
                'evaluation rebuilds their embedding from their own training data '
                '(--reconstruction_steps Adam steps, global part frozen) and reports them as '
                'heldout/... (and heldout_full/...).', range=(0, True, 0.9)),
        Setting('early_stopping_patience', 'With --validation: stop after this many '
                'evaluations without a better validation HR@10 (full ranking when '
                'evaluated, else sampled).', range=_POSITIVE_INT),
        Setting('sharpness_probe', 'Also measure every round the sharpness L(w + e) - L(w) '
                'of the global and the local part at this SAM radius '
                '(train/probe_sharpness_*), so runs with and without SAM compare at one '
                'radius; costs a second client pass; training is unchanged.',
                range=_POSITIVE),
    )),
    Leaf('evaluation sizes', 'the cut-offs K and the sampled negatives', (
        Setting('top_ks', f'Cut-offs K of HR@K and NDCG@K, comma-separated; must include '
                f'{sizes.SELECT_K} (rounds are selected on HR@{sizes.SELECT_K}).',
                entries=('cut-off', 1, MAX_TOP_K)),
        Setting('eval_negatives', "Sampled protocol: negatives the held-out item is ranked "
                "among (the paper's 99); each user needs that many items it has not "
                'interacted with. Full ranking needs none.', range=_POSITIVE_INT),
    )),
    Leaf('privacy', 'user-level DP and secure aggregation', (
        Setting('dp_noise_multiplier', 'User-level DP of the global update: Gaussian noise '
                'std over the L2 clip (default: no DP; 0 clips without noise). Runs one '
                'user per TFF client.'),
        Setting('dp_clip', "DP: L2 clip of each user's upload; required unless "
                '--dp_adaptive_clip (then the initial clip, default 0.1).'),
        Setting('dp_adaptive_clip', 'DP: adapt the clip to the median upload norm.'),
        Setting('dp_delta', 'DP: the delta of the reported epsilon (default 1/users).'),
        Setting('secure_aggregation', "Sum the uploads with TFF's secure sum (32-bit "
                'quantized; in simulation this exercises the arithmetic only). Runs one '
                'user per TFF client.'),
    )),
    Leaf('simulation', 'rounds, the cohort and how TFF runs them', (
        # Only when named: a 60-minute search over rounds too did worse than
        # one at fixed rounds (docs/RESULTS.md, "Transfer").
        Setting('total_rounds', 'Rounds to run.', range=(1, True, MAX_ROUNDS), filled='task',
                search=Search(10, 50, 300, log=True, when='federated', by_default=False)),
        Setting('client_fraction', 'Fraction of users sampled per round.',
                range=(0, False, 1), filled='task',
                search=Search(2, 0.05, 0.5, log=True, when='federated')),
        Setting('clients_per_round', 'Cohort size; overrides --client_fraction.',
                range=_POSITIVE_INT),
        Setting('simulation', 'per_user: one user per TFF client (the deployable form); '
                'vectorized: several users per TFF client with per-user math vectorized '
                '(same results, much faster); auto: vectorized unless DP or secure '
                "aggregation needs each user's upload apart.", choices=SIMULATIONS),
        Setting('max_group_examples', 'vectorized: padded examples (users x longest batch) '
                'per TFF client.', range=_POSITIVE_INT),
        Setting('workers', 'host:port,... of TFF worker services (launch/start_workers.sh) '
                "to split each round across (default: this process's local TFF worker). "
                'Same results; default aggregator only (docs/WORKERS.md).',
                recorded=False, kind='str'),
        Setting('user_state_store', "Where every user's state (embedding, local Adam) "
                "lives: memory, or disk (memory-mapped in the run's user_states/, read and "
                'written a cohort at a time; checkpoints name a version of it, kept exact '
                'by an undo journal). FedRecGEL methods with persistent local state.',
                choices=USER_STATE_STORES),
    )),
    Leaf('output', 'where the run writes and what it shows', (
        Setting('root_output_dir', 'Root folder of all experiments.', recorded=False,
                kind='str', default='runs'),
        Setting('experiment_name', 'Experiment folder name (default: '
                '<task>_<algorithm>_seed<seed>).', recorded=False, kind='str'),
        Setting('rounds_per_checkpoint', 'Checkpoint every this many rounds (0: never).',
                range=(0, True, INT32_MAX)),
        Setting('progress', 'Show a progress bar.', recorded=False, kind='bool',
                default=True),
    )),
)

SETTINGS = {s.name: s for leaf in TREE for s in leaf.settings}
assert len(SETTINGS) == sum(len(leaf.settings) for leaf in TREE), 'a setting twice'


def leaf(name: str) -> Leaf:
    """The concern `name`.

    Raises:
      KeyError: If there is none.
    """
    for candidate in TREE:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def concern_of(name: str) -> str:
    """The concern a setting belongs to."""
    return next(l.name for l in TREE if any(s.name == name for s in l.settings))


def ranges() -> dict[str, tuple[float, bool, float | None]]:
    """Each numeric setting's `range`."""
    return {s.name: s.range for s in SETTINGS.values() if s.range is not None}


def choices() -> dict[str, tuple[Any, ...]]:
    """Each choice setting's `choices`."""
    return {s.name: s.choices for s in SETTINGS.values() if s.choices is not None}


def int_lists() -> dict[str, tuple[str, int, int]]:
    """Each list setting's `entries`."""
    return {s.name: s.entries for s in SETTINGS.values() if s.entries is not None}


def searched() -> tuple[Setting, ...]:
    """The settings the tuner can search, in its order (`Search.by_default`
    says which it searches unasked)."""
    return tuple(sorted((s for s in SETTINGS.values() if s.search is not None),
                        key=lambda s: s.search.order))


def described(names) -> str:
    """The `Attributes:` block of a docstring for `names`, by concern."""
    lines = []
    for concern in TREE:
        own = [s for s in concern.settings if s.name in names]
        if own:
            lines.append(f'  {concern.name} ({concern.what}):')
            lines += [textwrap.fill(f'{s.name}: {s.help}', 76, initial_indent='    ',
                                    subsequent_indent='      ') for s in own]
    return '\n'.join(lines)
