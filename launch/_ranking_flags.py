"""Evaluation sizes: the cut-offs K and the sampled protocol's negatives
(`settings_tree`'s 'evaluation sizes' leaf).

Apart from the other evaluation flags because export.py and tune.py take
them too (export records them in its manifest; the tuner's trials evaluate
with them).
"""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('evaluation sizes', __name__)
EVAL_NEGATIVES = FLAGS['eval_negatives']
