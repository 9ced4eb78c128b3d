"""Output flags of launch/train.py: where a run writes and how it reports."""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings

ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', 'runs', 'Root folder of all experiments.')
EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None,
    'Experiment folder name (default: <task>_<algorithm>_seed<seed>).')
ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', run_settings.default('rounds_per_checkpoint'),
    'Checkpoint every this many rounds (0: never).')
PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')
