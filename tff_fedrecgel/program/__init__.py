"""The training program: outputs, checkpoints and the round loop.

`run_training` (and TensorFlow with it) is imported on first use, so entry
points can lock and check an experiment folder before the slow imports.
"""

from tff_fedrecgel.program.outputs import ExperimentLock
from tff_fedrecgel.program.outputs import ExperimentLockedError
from tff_fedrecgel.program.outputs import ExperimentPaths
from tff_fedrecgel.program.outputs import check_experiment_name
from tff_fedrecgel.program.outputs import check_not_in_use
from tff_fedrecgel.program.outputs import check_output_root
from tff_fedrecgel.program.outputs import has_checkpoint
from tff_fedrecgel.program.outputs import check_hparams
from tff_fedrecgel.program.outputs import lock_experiment
from tff_fedrecgel.program.outputs import prepare_experiment
from tff_fedrecgel.program.session import open_run


def __getattr__(name):
    if name in ('run_training', 'TrainingStoppedError'):
        from tff_fedrecgel.program import training_program  # pylint: disable=g-import-not-at-top

        return getattr(training_program, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
