"""The sampled protocol's metrics as Keras metrics (FedRecon's TFF evaluation).

`tff.learning.algorithms.build_fed_recon_eval` takes Keras metrics; these
rank a batch whose first example is the held-out item with
`ranking.ranking_metrics`, so FedRecon's numbers come from the same rank
arithmetic as every other evaluation path.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_fedrecgel.evaluation import ranking


class RankMetric(tf.keras.metrics.Metric):
    """HR@K or NDCG@K of a batch whose first example is the held-out item.

    Each `update_state` call ranks one batch of candidates (one user), with
    ties counted against the held-out item as `ranking.ranking_metrics`
    does; `result` is the mean over the batches seen. TFF sums the metric's
    variables over clients before finalizing, so the federated result is the
    mean over users, as in the project's other evaluations.

    Args:
      k: The cut-off K.
      kind: 'hr' or 'ndcg'.
      name: The metric's name (default `<kind>_at_<k>`: TFF refuses '@').

    Raises:
      ValueError: On another kind.
    """

    def __init__(self, k: int, kind: str = 'hr', name: str | None = None, **kwargs):
        if kind not in ('hr', 'ndcg'):
            raise ValueError(f"kind must be 'hr' or 'ndcg', got {kind!r}")
        super().__init__(name=name or f'{kind}_at_{k}', **kwargs)
        self.k, self.kind = int(k), kind
        self.total = self.add_weight(name='total', initializer='zeros')
        self.count = self.add_weight(name='count', initializer='zeros')

    def update_state(self, y_true, y_pred, sample_weight=None):
        del y_true, sample_weight  # The held-out item is the first candidate.
        scores = tf.reshape(tf.cast(y_pred, tf.float32), [1, -1])
        value = ranking.ranking_metrics(scores, top_ks=(self.k,))[
            f'{self.kind}@{self.k}']
        self.total.assign_add(tf.reduce_sum(value))
        self.count.assign_add(1.0)

    def result(self):
        return tf.math.divide_no_nan(self.total, self.count)

    def get_config(self):
        return {**super().get_config(), 'k': self.k, 'kind': self.kind}


def rank_metrics(top_ks: Sequence[int] = ranking.TOP_KS) -> list[RankMetric]:
    """HR@K and NDCG@K metrics for each K, named `hr_at_k` and `ndcg_at_k`.

    Args:
      top_ks: Cut-offs K, in the order given.

    Returns:
      The metrics, HR then NDCG for each K.
    """
    return [RankMetric(k, kind) for k in top_ks for kind in ('hr', 'ndcg')]
