"""Evaluation flags of launch/train.py: protocols, cut-offs, schedule and
who is evaluated. Their defaults are `run_settings.Settings`' (`sizes`)."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings
from tff_fedrecgel import sizes

EVAL_PROTOCOL = flags.DEFINE_enum(
    'eval_protocol', run_settings.default('eval_protocol'), list(run_settings.EVAL_PROTOCOLS),
    'sampled: the held-out item among --eval_negatives sampled negatives (the paper\'s; '
    'metrics test/...); full: among every item the user did not train on '
    '(test_full/..., with MRR: the protocol to trust); both.')
TOP_KS = flags.DEFINE_list(
    'top_ks', ','.join(map(str, run_settings.default('top_ks'))),
    f'Cut-offs K of HR@K and NDCG@K, comma-separated; must include '
    f'{sizes.SELECT_K} (rounds are selected on HR@{sizes.SELECT_K}).')
EVAL_NEGATIVES = flags.DEFINE_integer(
    'eval_negatives', run_settings.default('eval_negatives'),
    'Sampled protocol: negatives the held-out item is ranked among (the '
    'paper\'s 99); each user needs that many items it has not interacted '
    'with. Full ranking needs none.')
ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', run_settings.default('rounds_per_eval'),
    'Evaluate all users every this many rounds.')
ROUNDS_PER_FULL_EVAL = flags.DEFINE_integer(
    'rounds_per_full_eval', None,
    'With --eval_protocol=full or both: rank against every item every this '
    'many rounds (default: --rounds_per_eval).')
EVAL_USERS = flags.DEFINE_integer(
    'eval_users', None,
    'Evaluate a fixed random sample of this many users (the same every round, '
    'method and seed; held-out users sampled apart) and report each metric\'s '
    'standard error (<metric>_se); default: every user. Rule: evaluate '
    'everyone while an evaluation costs less than the rounds between two; past '
    'that (hundreds of thousands of users), 10000 bounds the standard error of '
    'HR@10 by 0.005 (docs/PERFORMANCE.md, "Scale").')
HELDOUT_USERS = flags.DEFINE_float(
    'heldout_users', run_settings.default('heldout_users'),
    'Fraction of users that never train nor are sampled; each evaluation '
    'rebuilds their embedding from their own training data '
    '(--reconstruction_steps Adam steps, global part frozen) and reports them '
    'as heldout/... (and heldout_full/...).')
EARLY_STOPPING_PATIENCE = flags.DEFINE_integer(
    'early_stopping_patience', None,
    'With --validation: stop after this many evaluations without a better '
    'validation HR@10 (full ranking when evaluated, else sampled).')
SHARPNESS_PROBE = flags.DEFINE_float(
    'sharpness_probe', None,
    'Also measure every round the sharpness L(w + e) - L(w) of the global and '
    'the local part at this SAM radius (train/probe_sharpness_*), so runs with '
    'and without SAM compare at one radius; costs a second client pass; '
    'training is unchanged.')
