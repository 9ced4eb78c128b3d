"""TensorFlow's C++ start-up logging, quietened for the CLI and the API.

Imports no TensorFlow: it must run before TensorFlow is first imported.
"""

import os

# 3 also hides the CUDA plugin registration errors TensorFlow prints at import
# on a machine without GPUs (2 keeps them).
QUIET_TF_LOG_LEVEL = '3'


def quiet_tensorflow_logs() -> None:
    """Quietens TensorFlow's C++ logging unless the user set its level.

    Takes effect only before TensorFlow is imported; TFF's worker process,
    started later, inherits it. `TF_CPP_MIN_LOG_LEVEL=0` shows everything.
    """
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', QUIET_TF_LOG_LEVEL)
