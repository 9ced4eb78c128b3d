"""Evaluation flags of launch/train.py: protocols, schedule and who is
evaluated. Their defaults are `run_settings.Settings`'. The cut-offs and
the sampled negatives are `_ranking_flags`' (other commands take them too)."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings

EVAL_PROTOCOL = flags.DEFINE_enum(
    'eval_protocol', run_settings.default('eval_protocol'), list(run_settings.EVAL_PROTOCOLS),
    'sampled: the held-out item among --eval_negatives sampled negatives (the paper\'s; '
    'metrics test/...); full: among every item the user did not train on '
    '(test_full/..., with MRR: the protocol to trust); both.')
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
