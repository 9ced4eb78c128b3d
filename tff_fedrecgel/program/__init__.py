"""The training program: outputs, checkpoints and the round loop."""

from tff_fedrecgel.program.outputs import ExperimentPaths
from tff_fedrecgel.program.outputs import prepare_experiment
from tff_fedrecgel.program.training_program import run_training
