"""The former path of `tff_fedrecgel.evaluation.eval_sample` (the same module object)."""

import sys

from tff_fedrecgel.evaluation import eval_sample as _moved

sys.modules[__name__] = _moved
