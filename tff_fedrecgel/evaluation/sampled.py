"""The sampled protocol on NeuMF users: a batched path and TFF's.

Every user has one row of candidates whose column 0 is its held-out item and
the rest its sampled negatives (`ranking.py` turns scores into HR@K and
NDCG@K). Two paths compute the same metrics:

* `evaluate_users`, the fast simulation path: one compiled `tf.function`
  scores all users in batches with `neumf.score_items`.
* `build_federated_evaluation`, the TFF computation a deployment would run:
  each client scores its own candidates with its own embedding; the server
  only sees the mean of the clients' metrics.

Users without a stored embedding first rebuild it (`reconstruction.py`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.evaluation import eval_sample
from tff_fedrecgel.evaluation import ranking
from tff_fedrecgel.models import neumf

DEFAULT_BATCH_SIZE = 1024


def _table_signature(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    return neumf.local_weight_specs(config, num_users=None)


@functools.lru_cache(maxsize=32)
def _batch_scorer(config: neumf.ModelConfig, top_ks: tuple[int, ...]):
    """One compiled scorer per (config, top_ks).

    The signature leaves the user and candidate dimensions open, so every
    batch (including a short last one) reuses the single trace.
    """

    @tf.function(autograph=False, input_signature=[
        neumf.global_weight_specs(config), _table_signature(config),
        tf.TensorSpec([None, None], tf.int32)])
    def score(global_weights, local_tables, candidates):
        scores = neumf.score_items(config, global_weights, local_tables, candidates)
        return ranking.ranking_metrics(scores, top_ks=top_ks)

    return score


def _check_tables(config: neumf.ModelConfig, tables: Sequence[np.ndarray],
                  num_users: int) -> list[np.ndarray]:
    tables = [np.asarray(t, np.float32) for t in tables]
    expected = [(num_users, d) for d in config.local_dims]
    if [t.shape for t in tables] != expected:
        raise ValueError(f'local_tables: table shapes {[t.shape for t in tables]}, '
                         f'expected {expected}')
    return tables


def evaluate_users(
    model_config: neumf.ModelConfig,
    global_weights: Sequence[np.ndarray],
    local_tables: Sequence[np.ndarray],
    candidates: np.ndarray,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    top_ks: Sequence[int] = ranking.TOP_KS,
    sample_of: int | None = None,
) -> collections.OrderedDict[str, float]:
    """Mean ranking metrics of all users, scored in batches of users.

    Args:
      model_config: The NeuMF sizes.
      global_weights: Arrays in `NeuMF.global_variables` order.
      local_tables: `[num_users, dim]` arrays in `NeuMF.local_variables` order;
        row u is user u's embedding.
      candidates: int `[num_users, num_candidates]`; column 0 is the held-out
        item.
      batch_size: Users scored per call (bounds memory).
      top_ks: Cut-offs K.
      sample_of: The users are a random sample of a population of this many
        (`eval_sample`): standard errors are added; None: no errors.

    Returns:
      OrderedDict of Python floats, the means over users (keys as in
      `ranking.metric_names`), then with `sample_of` each one's standard
      error (`<key>_se`).

    Raises:
      ValueError: On inconsistent shapes or a non-positive batch size.
    """
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or candidates.shape[0] < 1 or candidates.shape[1] < 1:
        raise ValueError(f'candidates must be [users, candidates], got {candidates.shape}')
    if batch_size < 1:
        raise ValueError(f'batch_size must be positive, got {batch_size}')
    num_users = candidates.shape[0]
    tables = _check_tables(model_config, local_tables, num_users)
    candidates = candidates.astype(np.int32)
    weights = neumf.global_tensors(model_config, global_weights)
    score = _batch_scorer(model_config, ranking.check_top_ks(top_ks))
    totals = collections.OrderedDict((k, 0.0) for k in ranking.metric_names(top_ks))
    squares = dict.fromkeys(totals, 0.0)
    for start in range(0, num_users, batch_size):
        end = min(start + batch_size, num_users)
        batch = score(weights, [t[start:end] for t in tables], candidates[start:end])
        for key, values in batch.items():
            values = values.numpy()
            totals[key] += float(np.sum(values, dtype=np.float64))
            if sample_of is not None:
                squares[key] += float(np.sum(np.square(values, dtype=np.float64)))
    means = collections.OrderedDict((k, v / num_users) for k, v in totals.items())
    if sample_of is None:
        return means
    return eval_sample.add_standard_errors(
        means, {k: v / num_users for k, v in squares.items()}, num_users, sample_of)


def evaluate_item_scores(item_scores: np.ndarray, candidates: np.ndarray, *,
                         top_ks: Sequence[int] = ranking.TOP_KS,
                         sample_of: int | None = None,
                         ) -> collections.OrderedDict[str, float]:
    """Mean HR@K / NDCG@K of ranking every user's candidates by item scores.

    For models with one score per item, the same for every user (item
    popularity); ties count against the held-out item, as for NeuMF.

    Args:
      item_scores: float `[num_items]`.
      candidates: int `[num_users, num_candidates]`; column 0 is the held-out
        item.
      top_ks: Cut-offs K.
      sample_of: As for `evaluate_users`.

    Returns:
      OrderedDict of Python floats, keys as `ranking.metric_names(top_ks)`
      (and their `_se` with `sample_of`).

    Raises:
      ValueError: On a candidate outside the scores or bad shapes.
    """
    scores = np.asarray(item_scores, np.float64)
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or scores.ndim != 1:
        raise ValueError('item_scores must be [num_items] and candidates 2-D')
    if candidates.size and (candidates.min() < 0 or candidates.max() >= len(scores)):
        raise ValueError('candidates hold item ids outside the scores')
    per_user = ranking.ranking_metrics(scores[candidates], top_ks=top_ks)
    return eval_sample.summarize({k: v.numpy() for k, v in per_user.items()}, sample_of)


def client_metrics(model_config, global_weights, local_weights, candidates, top_ks):
    """One device's sampled metrics, a list in `ranking.metric_names` order.

    Args:
      model_config: The NeuMF sizes.
      global_weights: Tensors in `NeuMF.global_variables` order.
      local_weights: The device's `[1, dim]` embeddings.
      candidates: int32 `[C]`, the held-out item first.
      top_ks: Cut-offs K.

    Returns:
      A list of scalar float32 tensors.
    """
    scores = neumf.score_items(model_config, global_weights, local_weights,
                               candidates[tf.newaxis, :])
    # A list, not the named dict: TFF turns names into TF scope names, where
    # '@' is invalid; `named_mean` restores the names on the server.
    return [v[0] for v in ranking.ranking_metrics(scores, top_ks=top_ks).values()]


def named_mean(values, top_ks):
    """Federated mean of the clients' metric lists, as a named dict @SERVER.

    Args:
      values: The clients' `client_metrics` lists @CLIENTS.
      top_ks: Cut-offs K (the names).

    Returns:
      OrderedDict of the means @SERVER, keyed as `ranking.metric_names`.
    """
    means = tff.federated_mean(values)
    return tff.federated_zip(collections.OrderedDict(
        (name, means[i]) for i, name in enumerate(ranking.metric_names(top_ks))))


def build_federated_evaluation(model_config: neumf.ModelConfig, *,
                               top_ks: Sequence[int] = ranking.TOP_KS) -> tff.Computation:
    """The federated evaluation: each client ranks its own candidates.

    Type: `(global_weights@SERVER, local_weights@CLIENTS, candidates@CLIENTS)
    -> metrics@SERVER`, where `local_weights` is the client's list of `[1, dim]`
    embeddings (`NeuMF.local_variables` order), `candidates` its int32 `[C]`
    candidates with the held-out item first, and `metrics` the unweighted
    `federated_mean` of the clients' HR/NDCG values.

    Args:
      model_config: The NeuMF sizes.
      top_ks: Cut-offs K.

    Returns:
      A `tff.Computation`.
    """
    top_ks = ranking.check_top_ks(top_ks)
    global_type = tff.types.tensorflow_to_type(neumf.global_weight_specs(model_config))
    local_type = tff.types.tensorflow_to_type(neumf.local_weight_specs(model_config))
    candidates_type = tff.TensorType(np.int32, [None])

    @tff.tensorflow.computation(global_type, local_type, candidates_type)
    def client_eval(global_weights, local_weights, candidates):
        return client_metrics(model_config, global_weights, local_weights, candidates,
                               top_ks)

    @tff.federated_computation(
        tff.FederatedType(global_type, tff.SERVER),
        tff.FederatedType(local_type, tff.CLIENTS),
        tff.FederatedType(candidates_type, tff.CLIENTS))
    def evaluate(global_weights, local_weights, candidates):
        metrics = tff.federated_map(
            client_eval, (tff.federated_broadcast(global_weights), local_weights, candidates))
        return named_mean(metrics, top_ks)

    return evaluate
