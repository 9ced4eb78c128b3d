"""What a run shows a reader: metrics.csv's column order and the progress lines."""

import io
import random

import tqdm

from tff_fedrecgel.program import progress
from tff_fedrecgel.program.evaluation_plan import EvaluationPlan
from tff_fedrecgel.program.evaluation_plan import natural_key


def _group(name, metrics):
    return [f'{name}/{m}' for m in metrics]


def test_natural_key_orders_numbers_by_value():
    names = ['hr@10', 'hr@5', 'hr@20', 'hr@15', 'ndcg@5', 'mrr']
    assert sorted(names, key=natural_key) == ['hr@5', 'hr@10', 'hr@15', 'hr@20',
                                              'mrr', 'ndcg@5']


def test_columns_follow_the_groups_then_the_natural_order():
    plan = EvaluationPlan(protocol='both', validation=True, heldout=True)
    sampled = ['hr@5', 'hr@10', 'hr@15', 'hr@20', 'ndcg@5', 'ndcg@10', 'ndcg@15',
               'ndcg@20']
    full = sampled + ['mrr']
    expected = (_group('train', ['clients', 'loss', 'round_seconds'])
                + _group('test', sampled) + _group('valid', sampled)
                + _group('heldout', sampled) + _group('test_full', full)
                + _group('valid_full', full) + _group('heldout_full', full)
                + ['other/x', 'eval_seconds'])
    shuffled = list(expected) * 2  # Repeats (one per row) appear once.
    random.Random(0).shuffle(shuffled)
    assert plan.column_order(shuffled) == expected
    assert plan.group_names()[:3] == ['train', 'test', 'valid']


def test_progress_writes_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    clock = iter([0.0, 10.0, 20.0]).__next__
    bar = progress.PlainProgress(total=4, initial=1, stream=stream, clock=clock)
    bar.set_postfix({'hr@10': '0.9000', 'loss': '0.2500'}, refresh=False)
    bar.update(1)
    bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert '\r' not in text
    assert text.splitlines() == [
        'round 2/4  hr@10=0.9000  loss=0.2500  elapsed 00:10, left 00:20',
        'round 3/4  hr@10=0.9000  loss=0.2500  elapsed 00:20, left 00:10']


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_only():
    assert isinstance(progress.progress_display(total=3, initial=0, enabled=True,
                                                stream=io.StringIO()),
                      progress.PlainProgress)
    bar = progress.progress_display(total=3, initial=0, enabled=True, stream=_Terminal())
    assert isinstance(bar, tqdm.tqdm) and not bar.disable
    bar.close()
    off = progress.progress_display(total=3, initial=0, enabled=False, stream=io.StringIO())
    assert isinstance(off, tqdm.tqdm) and off.disable
