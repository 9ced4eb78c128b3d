"""The former path of `tff_fedrecgel.evaluation.full_ranking` (the same module object)."""

import sys

from tff_fedrecgel.evaluation import full_ranking as _moved

sys.modules[__name__] = _moved
