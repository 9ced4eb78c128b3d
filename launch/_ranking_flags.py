"""Evaluation sizes: the cut-offs K and the sampled protocol's negatives.

Apart from the other evaluation flags because export.py and tune.py take
them too (export records them in its manifest; the tuner's trials evaluate
with them). Their defaults are `run_settings.Settings`' (`sizes`).
"""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings
from tff_fedrecgel import sizes

TOP_KS = flags.DEFINE_list(
    'top_ks', ','.join(map(str, run_settings.default('top_ks'))),
    f'Cut-offs K of HR@K and NDCG@K, comma-separated; must include '
    f'{sizes.SELECT_K} (rounds are selected on HR@{sizes.SELECT_K}).')
EVAL_NEGATIVES = flags.DEFINE_integer(
    'eval_negatives', run_settings.default('eval_negatives'),
    'Sampled protocol: negatives the held-out item is ranked among (the '
    'paper\'s 99); each user needs that many items it has not interacted '
    'with. Full ranking needs none.')
