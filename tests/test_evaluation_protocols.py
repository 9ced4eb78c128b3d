"""The evaluation package: protocols as objects, one choice list, old paths."""

import subprocess
import sys

from absl import flags
import numpy as np
import pytest

from tff_fedrecgel import run_settings
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.program import evaluation_plan


def test_one_choice_list_everywhere():
    """--eval_protocol's choices are the package's in settings, flags, plan."""
    from tff_fedrecgel.launch import _eval_flags  # pylint: disable=g-import-not-at-top

    assert protocols.CHOICES == ('sampled', 'full', 'both')
    assert run_settings.EVAL_PROTOCOLS is protocols.CHOICES
    assert evaluation_plan.PROTOCOLS is protocols.CHOICES
    flag = flags.FLAGS[_eval_flags.EVAL_PROTOCOL.name]
    assert tuple(flag.parser.enum_values) == protocols.CHOICES
    with pytest.raises(ValueError, match='eval_protocol must be one of'):
        run_settings.settings('synthetic', eval_protocol='topk')
    with pytest.raises(ValueError, match='must be one of'):
        evaluation_plan.EvaluationPlan(protocol='topk')


def test_each_protocol_knows_its_names_and_groups():
    assert protocols.SAMPLED.metric_names((5, 10)) == ['hr@5', 'ndcg@5', 'hr@10', 'ndcg@10']
    assert protocols.FULL.metric_names((10,)) == ['hr@10', 'ndcg@10', 'mrr']
    for protocol in protocols.PROTOCOLS.values():
        for base in ('test', 'valid', 'heldout'):
            assert protocols.of_group(protocol.group(base)) is protocol
        assert protocols.get(protocol.name) is protocol
    assert protocols.selected('both') == (protocols.SAMPLED, protocols.FULL)
    with pytest.raises(ValueError, match='protocol must be one of sampled, full'):
        protocols.get('topk')
    plan = evaluation_plan.EvaluationPlan(protocol='both', validation=True)
    assert plan.group_names() == ['train', 'test', 'valid', 'test_full', 'valid_full']
    assert plan.metric_names('full')[-1] == 'mrr'


def test_protocols_import_no_tensorflow():
    code = ('import sys; from tff_fedrecgel.evaluation import protocols; '
            'from tff_fedrecgel import run_settings; '
            'from tff_fedrecgel.program import evaluation_plan; '
            'print("tensorflow" in sys.modules)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == 'False'


def test_former_module_paths_are_the_package_modules():
    # pylint: disable=g-import-not-at-top
    import tff_fedrecgel.full_ranking
    from tff_fedrecgel import eval_sample, evaluation, full_ranking, ranking
    from tff_fedrecgel.evaluation import full_ranking as moved_full
    from tff_fedrecgel.evaluation import sampled
    from tff_fedrecgel.ranking import metrics_from_ranks
    # pylint: enable=g-import-not-at-top

    assert full_ranking is moved_full is tff_fedrecgel.full_ranking
    assert ranking is evaluation.ranking and eval_sample is evaluation.eval_sample
    assert metrics_from_ranks is evaluation.ranking.metrics_from_ranks
    assert evaluation.evaluate_users is sampled.evaluate_users
    assert evaluation.reconstruct_local_tables is evaluation.reconstruction.reconstruct_local_tables
    with pytest.raises(AttributeError):
        evaluation.no_such_name  # pylint: disable=pointless-statement


@pytest.mark.parametrize('protocol', list(protocols.PROTOCOLS.values()), ids=str)
def test_a_protocol_ranks_alike_on_every_path(protocol):
    """Shared item scores rank the same through `evaluate_item_scores` and
    through per-user scores (`user_metrics`), ties included."""
    rng = np.random.default_rng(0)
    num_users, num_items = 30, 50
    item_scores = rng.integers(0, 8, size=num_items).astype(np.float32)  # Ties.
    candidates = np.stack([rng.permutation(num_items)[:20] for _ in range(num_users)])
    lengths = rng.integers(1, 6, size=num_users)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = rng.integers(0, num_items, size=indptr[-1]).astype(np.int32)
    held_out = candidates if protocol is protocols.SAMPLED else (candidates[:, 0],
                                                                   (indptr, items))
    shared = protocol.evaluate_item_scores(item_scores, held_out, top_ks=(1, 5, 10))
    per_user = protocol.user_metrics(np.tile(item_scores, (num_users, 1)), held_out,
                                     top_ks=(1, 5, 10))
    assert list(shared) == list(per_user) == protocol.metric_names((1, 5, 10))
    for key, values in per_user.items():
        assert np.mean(np.asarray(values), dtype=np.float64) == pytest.approx(shared[key])


def test_fedrecon_ranks_with_the_package():
    # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import fedrecon
    from tff_fedrecgel.evaluation import keras_metrics
    # pylint: enable=g-import-not-at-top

    assert fedrecon.RankMetric is keras_metrics.RankMetric
    names = [m.name for m in protocols.SAMPLED.keras_metrics((5, 10))]
    assert names == ['hr_at_5', 'ndcg_at_5', 'hr_at_10', 'ndcg_at_10']
