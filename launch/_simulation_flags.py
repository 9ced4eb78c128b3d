"""Simulation flags of launch/train.py: rounds, the cohort, and how TFF
runs the clients (`settings_tree`'s 'simulation' leaf)."""

from __future__ import annotations

from tff_fedrecgel.launch import _tree_flags

FLAGS = _tree_flags.define('simulation', __name__)
CLIENT_FRACTION = FLAGS['client_fraction']
CLIENTS_PER_ROUND = FLAGS['clients_per_round']
WORKERS = FLAGS['workers']
