"""Server flags shared by the entry points (train, export, tune): the
server's step on the aggregated update (`settings_tree`'s 'server' leaf)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('server', __name__)
