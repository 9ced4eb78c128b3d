"""Model flags shared by the entry points (train, export, tune): the NeuMF
sizes (`settings_tree`'s 'model' leaf; defaults the paper's, `sizes`)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('model', __name__)
