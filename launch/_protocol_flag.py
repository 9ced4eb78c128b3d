"""`--eval_protocol`, the one evaluation flag export.py takes too.

Listed with the evaluation flags (`_eval_flags`, which re-exports it) in
`--help` and docs/FLAGS.md; its choices are the evaluation package's
(`evaluation.protocols.CHOICES`).
"""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings

EVAL_PROTOCOL = flags.DEFINE_enum(
    'eval_protocol', run_settings.default('eval_protocol'), list(run_settings.EVAL_PROTOCOLS),
    'sampled: the held-out item among --eval_negatives sampled negatives (the paper\'s; '
    'metrics test/...); full: among every item the user did not train on '
    '(test_full/..., with MRR: the protocol to trust); both.',
    # Grouped with the other evaluation flags.
    module_name='tff_fedrecgel.launch._eval_flags')
