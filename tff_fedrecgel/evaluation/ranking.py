"""Leave-one-out ranking metrics: HR@K and NDCG@K of a held-out item.

A user's held-out item gets a 0-based rank among its candidates; ties count
against it (the authors place it last among equal scores before taking the
top k), and a NaN score ranks below everything (a diverged model gets no
credit). Every evaluation path (the batched one, the TFF federated ones and
FedRecon's Keras metrics) turns ranks into metrics here.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import math

import numpy as np
import tensorflow as tf

from tff_fedrecgel.evaluation import protocols

TOP_KS = protocols.TOP_KS
# Re-exported: the names are the protocols' (no TensorFlow there).
check_top_ks = protocols.check_top_ks
metric_names = protocols.metric_names


def metrics_from_ranks(ranks: tf.Tensor, *, top_ks: Sequence[int] = TOP_KS,
                       mrr: bool = False) -> collections.OrderedDict[str, tf.Tensor]:
    """Per-user ranking metrics from the held-out item's 0-based rank.

    HR@K = [rank < K] (Recall@K with one held-out item); NDCG@K =
    1 / log2(rank + 2) if rank < K, else 0; MRR = 1 / (rank + 1).

    Args:
      ranks: Integer `[num_users]` ranks (the number of other candidates
        scoring at least as high as the held-out item).
      top_ks: Cut-offs K.
      mrr: Whether to include 'mrr' (the full-ranking protocol reports it).

    Returns:
      OrderedDict of float32 `[num_users]` tensors, keys as `metric_names`.

    Raises:
      ValueError: If `ranks` is not integer or not rank 1, or `top_ks` is
        invalid.
    """
    top_ks = check_top_ks(top_ks)
    ranks = tf.convert_to_tensor(ranks)
    if not ranks.dtype.is_integer:
        raise ValueError(f'ranks must be integers, got {ranks.dtype.name}')
    if ranks.shape.rank is not None and ranks.shape.rank != 1:
        raise ValueError(f'ranks must be [num_users], got {ranks.shape}')
    # float64 so that the reciprocals are correctly rounded to float32.
    rank = tf.cast(ranks, tf.float64)
    gain = math.log(2.0) / tf.math.log(rank + 2.0)
    metrics = collections.OrderedDict()
    for k in top_ks:
        hit = tf.less(ranks, k)
        metrics[f'hr@{k}'] = tf.cast(hit, tf.float32)
        metrics[f'ndcg@{k}'] = tf.cast(tf.where(hit, gain, tf.zeros_like(gain)), tf.float32)
    if mrr:
        metrics['mrr'] = tf.cast(1.0 / (rank + 1.0), tf.float32)
    return metrics


def ranking_metrics(scores: tf.Tensor, *, top_ks: Sequence[int] = TOP_KS
                    ) -> collections.OrderedDict[str, tf.Tensor]:
    """Per-user HR@K and NDCG@K of the held-out item (column 0 of `scores`).

    The held-out item's rank is the number of OTHER candidates scoring at
    least as high.

    Args:
      scores: `[num_users, num_candidates]` scores; column 0 is the held-out
        item.
      top_ks: Cut-offs K.

    Returns:
      OrderedDict of float32 `[num_users]` tensors, keys 'hr@k' then 'ndcg@k'
      for each k ascending.

    Raises:
      ValueError: If `scores` is not rank 2 or `top_ks` is invalid.
    """
    top_ks = check_top_ks(top_ks)
    scores = tf.convert_to_tensor(scores)
    if scores.shape.rank is not None and scores.shape.rank != 2:
        raise ValueError(f'scores must be [users, candidates], got {scores.shape}')
    if scores.dtype.is_floating:
        scores = tf.where(tf.math.is_nan(scores), tf.constant(-np.inf, scores.dtype), scores)
    rank = tf.reduce_sum(tf.cast(tf.greater_equal(scores[:, 1:], scores[:, :1]), tf.int32),
                         axis=1)
    return metrics_from_ranks(rank, top_ks=top_ks)
