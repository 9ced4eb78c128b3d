"""Output flags of launch/train.py: where a run writes and how it reports
(`settings_tree`'s 'output' leaf)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('output', __name__)
ROOT_OUTPUT_DIR = FLAGS['root_output_dir']
EXPERIMENT_NAME = FLAGS['experiment_name']
PROGRESS = FLAGS['progress']
