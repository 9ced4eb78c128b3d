"""The former path of `tff_fedrecgel.evaluation.ranking` (the same module object)."""

import sys

from tff_fedrecgel.evaluation import ranking as _moved

sys.modules[__name__] = _moved
