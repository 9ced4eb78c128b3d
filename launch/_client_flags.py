"""Client flags shared by the entry points (train, export, tune): what a
user does in a round (`settings_tree`'s 'client' leaf)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('client', __name__)
