"""Privacy flags of launch/train.py: user-level DP and secure aggregation
(`privacy.PrivacySettings` checks them)."""

from __future__ import annotations

from absl import flags


DP_NOISE_MULTIPLIER = flags.DEFINE_float(
    'dp_noise_multiplier', None,
    'User-level DP of the global update: Gaussian noise std over the L2 clip '
    '(default: no DP; 0 clips without noise). Runs one user per TFF client.')
DP_CLIP = flags.DEFINE_float(
    'dp_clip', None,
    'DP: L2 clip of each user\'s upload; required unless --dp_adaptive_clip '
    '(then the initial clip, default 0.1).')
DP_ADAPTIVE_CLIP = flags.DEFINE_bool(
    'dp_adaptive_clip', False, 'DP: adapt the clip to the median upload norm.')
DP_DELTA = flags.DEFINE_float(
    'dp_delta', None, 'DP: the delta of the reported epsilon (default 1/users).')
SECURE_AGGREGATION = flags.DEFINE_bool(
    'secure_aggregation', False,
    'Sum the uploads with TFF\'s secure sum (32-bit quantized; in simulation '
    'this exercises the arithmetic only). Runs one user per TFF client.')
