"""Simulation flags of launch/train.py: rounds, the cohort, and how TFF
runs the clients."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings

TOTAL_ROUNDS = flags.DEFINE_integer(
    'total_rounds', None, 'Rounds to run (default: the task\'s, 100).')
CLIENT_FRACTION = flags.DEFINE_float(
    'client_fraction', None,
    'Fraction of users sampled per round (default: the task\'s, 0.1).')
CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', None, 'Cohort size; overrides --client_fraction.')
SIMULATION = flags.DEFINE_enum(
    'simulation', run_settings.default('simulation'), list(run_settings.SIMULATIONS),
    'per_user: one user per TFF client (the deployable form); vectorized: '
    'several users per TFF client with per-user math vectorized (same '
    'results, much faster); auto: vectorized unless DP or secure aggregation '
    'needs each user\'s upload apart.')
MAX_GROUP_EXAMPLES = flags.DEFINE_integer(
    'max_group_examples', run_settings.default('max_group_examples'),
    'vectorized: padded examples (users x longest batch) per TFF client.')
WORKERS = flags.DEFINE_string(
    'workers', None,
    'host:port,... of TFF worker services (launch/start_workers.sh) to split '
    'each round across (default: this process\'s local TFF worker). Same '
    'results; default aggregator only (docs/WORKERS.md).')
USER_STATE_STORE = flags.DEFINE_enum(
    'user_state_store', run_settings.default('user_state_store'),
    list(run_settings.USER_STATE_STORES),
    'Where every user\'s state (embedding, local Adam) lives: memory, or disk '
    '(memory-mapped in the run\'s user_states/, read and written a cohort at a '
    'time; checkpoints name a version of it, kept exact by an undo journal). '
    'FedRecGEL methods with persistent local state.')
