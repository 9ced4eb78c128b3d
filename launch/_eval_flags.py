"""Evaluation flags of launch/train.py: protocols, schedule and who is
evaluated (`settings_tree`'s 'evaluation' leaf). The cut-offs and the
sampled negatives are `_ranking_flags`' (other commands take them too)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('evaluation', __name__)
EVAL_PROTOCOL = FLAGS['eval_protocol']
