"""Leave-one-out ranking evaluation: HR@K and NDCG@K over 100 candidates.

Every user has one row of candidates whose column 0 is its held-out item and
the rest its sampled negatives. Two paths compute the same metrics:

* `evaluate_users`, the fast simulation path: one compiled `tf.function`
  scores all users in batches with `neumf.score_items`.
* `build_federated_evaluation`, the TFF computation a deployment would run:
  each client scores its own candidates with a `NeuMF` Keras model and its
  own embedding; the server only sees the mean of the clients' metrics.

For the 'reconstruct' local-state mode (no stored user embedding), the
embedding is first re-derived from the user's data, for all users at once with
`reconstruct_local_tables` or per client in
`build_federated_reconstruction_evaluation`.
"""

import collections
from collections.abc import Sequence
import functools
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_work
from tff_fedrecgel.models import neumf

TOP_KS = (5, 10, 15, 20)
DEFAULT_BATCH_SIZE = 1024
# Reconstruction keeps activations of every padded example for the gradient;
# this bounds users * padded length per batch (about 4 KB per example).
DEFAULT_MAX_BATCH_EXAMPLES = 1 << 16


def _check_top_ks(top_ks: Sequence[int]) -> tuple[int, ...]:
    top_ks = tuple(int(k) for k in top_ks)
    if not top_ks or any(k < 1 for k in top_ks):
        raise ValueError(f'top_ks must be non-empty positive ints, got {top_ks}')
    return tuple(sorted(set(top_ks)))


def metric_names(top_ks: Sequence[int] = TOP_KS) -> list[str]:
    """Metric keys in output order: 'hr@k', 'ndcg@k' for each k ascending."""
    return [f'{m}@{k}' for k in _check_top_ks(top_ks) for m in ('hr', 'ndcg')]


def ranking_metrics(
    scores: tf.Tensor, *, top_ks: Sequence[int] = TOP_KS
) -> collections.OrderedDict[str, tf.Tensor]:
    """Per-user HR@K and NDCG@K of the held-out item (column 0).

    The held-out item's 0-based rank is the number of OTHER candidates scoring
    at least as high: ties count against it, as the authors place it last among
    the candidates before taking the top k. A NaN score ranks below everything
    (a diverged model gets no credit).

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
    top_ks = _check_top_ks(top_ks)
    scores = tf.convert_to_tensor(scores)
    if scores.shape.rank is not None and scores.shape.rank != 2:
        raise ValueError(f'scores must be [users, candidates], got {scores.shape}')
    if scores.dtype.is_floating:
        scores = tf.where(
            tf.math.is_nan(scores), tf.constant(-np.inf, scores.dtype), scores
        )
    beats = tf.greater_equal(scores[:, 1:], scores[:, :1])
    rank = tf.reduce_sum(tf.cast(beats, tf.int32), axis=1)
    # float64 so that 1 / log2(rank + 2) is correctly rounded to float32.
    gain = math.log(2.0) / tf.math.log(tf.cast(rank, tf.float64) + 2.0)
    metrics = collections.OrderedDict()
    for k in top_ks:
        hit = tf.less(rank, k)
        metrics[f'hr@{k}'] = tf.cast(hit, tf.float32)
        metrics[f'ndcg@{k}'] = tf.cast(
            tf.where(hit, gain, tf.zeros_like(gain)), tf.float32
        )
    return metrics


def _global_signature(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    return list(client_work.global_weight_specs(config))


def _table_signature(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    return [
        tf.TensorSpec([None, s.shape[1]], tf.float32)
        for s in client_work.local_weight_specs(config)
    ]


@functools.lru_cache(maxsize=32)
def _batch_scorer(config: neumf.ModelConfig, top_ks: tuple[int, ...]):
    """One compiled scorer per (config, top_ks).

    The signature leaves the user and candidate dimensions open, so every
    batch (including a short last one) reuses the single trace.
    """

    @tf.function(
        autograph=False,
        input_signature=[
            _global_signature(config),
            _table_signature(config),
            tf.TensorSpec([None, None], tf.int32),
        ]
    )
    def score(global_weights, local_tables, candidates):
        scores = neumf.score_items(config, global_weights, local_tables, candidates)
        return ranking_metrics(scores, top_ks=top_ks)

    return score


def _check_tables(
    config: neumf.ModelConfig, tables: Sequence[np.ndarray], num_users: int, what: str
) -> list[np.ndarray]:
    specs = client_work.local_weight_specs(config)
    tables = [np.asarray(t, np.float32) for t in tables]
    if len(tables) != len(specs):
        raise ValueError(f'{what}: expected {len(specs)} tables, got {len(tables)}')
    for table, spec in zip(tables, specs):
        if table.shape != (num_users, spec.shape[1]):
            raise ValueError(
                f'{what}: table shape {table.shape}, expected '
                f'{(num_users, spec.shape[1])}'
            )
    return tables


def _global_tensors(config: neumf.ModelConfig, global_weights) -> list[tf.Tensor]:
    specs = client_work.global_weight_specs(config)
    weights = [tf.convert_to_tensor(w, tf.float32) for w in global_weights]
    if len(weights) != len(specs) or any(
        not w.shape.is_compatible_with(s.shape) for w, s in zip(weights, specs)
    ):
        raise ValueError(
            'global_weights do not match the config: got '
            f'{[tuple(w.shape) for w in weights]}, expected '
            f'{[tuple(s.shape) for s in specs]}'
        )
    return weights


def evaluate_users(
    model_config: neumf.ModelConfig,
    global_weights: Sequence[np.ndarray],
    local_tables: Sequence[np.ndarray],
    candidates: np.ndarray,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    top_ks: Sequence[int] = TOP_KS,
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

    Returns:
      OrderedDict of Python floats, the means over users (keys as in
      `ranking_metrics`).

    Raises:
      ValueError: On inconsistent shapes or a non-positive batch size.
    """
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or candidates.shape[0] < 1 or candidates.shape[1] < 1:
        raise ValueError(
            f'candidates must be [users, candidates], got {candidates.shape}'
        )
    if batch_size < 1:
        raise ValueError(f'batch_size must be positive, got {batch_size}')
    num_users = candidates.shape[0]
    tables = _check_tables(model_config, local_tables, num_users, 'local_tables')
    candidates = candidates.astype(np.int32)
    weights = _global_tensors(model_config, global_weights)
    score = _batch_scorer(model_config, _check_top_ks(top_ks))
    totals = collections.OrderedDict((k, 0.0) for k in metric_names(top_ks))
    for start in range(0, num_users, batch_size):
        end = min(start + batch_size, num_users)
        batch = score(weights, [t[start:end] for t in tables], candidates[start:end])
        for key, values in batch.items():
            totals[key] += float(np.sum(values.numpy(), dtype=np.float64))
    return collections.OrderedDict((k, v / num_users) for k, v in totals.items())


def _assign(variables: Sequence[tf.Variable], values: Sequence[tf.Tensor]) -> None:
    for var, value in zip(variables, values):
        var.assign(value)


def _client_metrics(model: neumf.NeuMF, candidates, top_ks) -> list[tf.Tensor]:
    scores = model(candidates)[tf.newaxis, :]
    # A list, not the named dict: TFF turns names into TF scope names, where
    # '@' is invalid; `_named_mean` restores the names on the server.
    return [v[0] for v in ranking_metrics(scores, top_ks=top_ks).values()]


def _named_mean(client_metrics, top_ks):
    """Federated mean of the clients' metric lists, as a named dict @SERVER."""
    means = tff.federated_mean(client_metrics)
    return tff.federated_zip(
        collections.OrderedDict(
            (name, means[i]) for i, name in enumerate(metric_names(top_ks))
        )
    )


def build_federated_evaluation(
    model_config: neumf.ModelConfig, *, top_ks: Sequence[int] = TOP_KS
) -> tff.Computation:
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
    top_ks = _check_top_ks(top_ks)
    global_type = tff.types.tensorflow_to_type(
        client_work.global_weight_specs(model_config)
    )
    local_type = tff.types.tensorflow_to_type(
        client_work.local_weight_specs(model_config)
    )
    candidates_type = tff.TensorType(np.int32, [None])

    @tff.tensorflow.computation(global_type, local_type, candidates_type)
    def client_eval(global_weights, local_weights, candidates):
        model = neumf.NeuMF(model_config)

        # One tf.function, so the assigns are ordered before the forward pass.
        @tf.function(autograph=False)
        def run(global_weights, local_weights, candidates):
            _assign(model.global_variables, global_weights)
            _assign(model.local_variables, local_weights)
            return _client_metrics(model, candidates, top_ks)

        return run(global_weights, local_weights, candidates)

    @tff.federated_computation(
        tff.FederatedType(global_type, tff.SERVER),
        tff.FederatedType(local_type, tff.CLIENTS),
        tff.FederatedType(candidates_type, tff.CLIENTS),
    )
    def evaluate(global_weights, local_weights, candidates):
        metrics = tff.federated_map(
            client_eval,
            (tff.federated_broadcast(global_weights), local_weights, candidates),
        )
        return _named_mean(metrics, top_ks)

    return evaluate


def _local_adam(work: client_work.ClientWorkConfig):
    return tff.learning.optimizers.build_adam(
        learning_rate=work.local_lr, epsilon=client_work.ADAM_EPSILON
    )


def _adam_state(optimizer, config: neumf.ModelConfig, weights: Sequence[tf.Tensor]):
    """Zero Adam state for `weights`, hyperparameters as tensors.

    Tensors as in the client work, so the step's bias correction is computed
    in float32 exactly as there.
    """
    state = tf.nest.map_structure(
        tf.convert_to_tensor,
        optimizer.initialize(client_work.local_weight_specs(config)),
    )
    state['accumulator'] = [tf.zeros_like(w) for w in weights]
    state['preconditioner'] = [tf.zeros_like(w) for w in weights]
    return state


@functools.lru_cache(maxsize=32)
def _batch_reconstructor(
    config: neumf.ModelConfig, work: client_work.ClientWorkConfig
):
    """One compiled batched reconstruction per (config, work)."""
    dims = [s.shape[1] for s in client_work.local_weight_specs(config)]

    @tf.function(
        autograph=False,
        input_signature=[
            _global_signature(config),
            tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([None, None], tf.float32),
            tf.TensorSpec([None, None], tf.float32),
        ]
    )
    def reconstruct(global_weights, items, labels, weights):
        num_users = tf.shape(items)[0]
        tables = [tf.zeros([num_users, d], tf.float32) for d in dims]
        adam = _local_adam(work)
        state = _adam_state(adam, config, tables)
        for _ in range(work.reconstruction_steps):
            with tf.GradientTape() as tape:
                tape.watch(tables)
                logits = neumf.score_items(config, global_weights, tables, items)
                # Padding has weight 0; row u's gradient is user u's alone.
                loss = client_work.weighted_bce(logits, labels, weights)
            grads = tape.gradient(loss, tables)
            grads = [tf.reshape(g, tf.shape(t)) for g, t in zip(grads, tables)]
            state, tables = adam.next(state, tables, grads)
            tables = list(tables)
        return tables

    return reconstruct


def _check_batches(batches) -> list[tuple[np.ndarray, np.ndarray]]:
    checked = []
    for u, (items, labels) in enumerate(batches):
        items = np.asarray(items, np.int32).reshape(-1)
        labels = np.asarray(labels, np.float32).reshape(-1)
        if items.shape != labels.shape:
            raise ValueError(f'user {u}: {items.size} items but {labels.size} labels')
        checked.append((items, labels))
    if not checked:
        raise ValueError('batches is empty')
    return checked


def reconstruct_local_tables(
    model_config: neumf.ModelConfig,
    work: client_work.ClientWorkConfig,
    global_weights: Sequence[np.ndarray],
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    max_batch_examples: int = DEFAULT_MAX_BATCH_EXAMPLES,
) -> list[np.ndarray]:
    """Every user's embedding as the client work's 'reconstruct' mode derives it.

    From zeros, `work.reconstruction_steps` steps of TFF Adam (`work.local_lr`,
    epsilon 1e-8) on the user's loss (`client_work.example_weights` and
    `weighted_bce`) with the global weights fixed. All users of a batch go in
    one padded `[users, max_len]` problem whose loss is the sum of the users'
    losses: each user's gradient reaches only its own row and Adam is
    elementwise, so this equals reconstructing every user separately. Users
    are grouped by length to keep padding small.

    Args:
      model_config: The NeuMF sizes.
      work: The client work config (`local_lr`, `reconstruction_steps`,
        `loss_reduction`, `chunk_size` are used).
      global_weights: Arrays in `NeuMF.global_variables` order.
      batches: One `(items, labels)` pair per user, any lengths.
      max_batch_examples: Bound on users * padded length per batch (memory).

    Returns:
      `[num_users, dim]` float32 tables in `NeuMF.local_variables` order.

    Raises:
      ValueError: On mismatched items/labels, no users, or bad weights.
    """
    if work.reconstruction_steps < 1:
        raise ValueError('reconstruction needs work.reconstruction_steps >= 1')
    batches = _check_batches(batches)
    weights_in = _global_tensors(model_config, global_weights)
    reconstruct = _batch_reconstructor(model_config, work)
    lengths = np.array([items.size for items, _ in batches])
    # The client work's own weights, computed once per distinct length.
    example_weights = {
        n: client_work.example_weights(
            tf.constant(n, tf.int32),
            loss_reduction=work.loss_reduction,
            chunk_size=work.chunk_size,
        ).numpy()
        for n in np.unique(lengths).tolist()
    }
    dims = [s.shape[1] for s in client_work.local_weight_specs(model_config)]
    tables = [np.zeros((len(batches), d), np.float32) for d in dims]
    order = np.argsort(lengths, kind='stable')
    start = 0
    while start < len(order):
        # Ascending lengths: the last user of a group sets the padded length.
        end = start + 1
        while end < len(order) and (end + 1 - start) * max(
            lengths[order[end]], 1
        ) <= max_batch_examples:
            end += 1
        users = order[start:end]
        width = max(int(lengths[users[-1]]), 1)
        items = np.zeros((len(users), width), np.int32)
        labels = np.zeros((len(users), width), np.float32)
        weights = np.zeros((len(users), width), np.float32)
        for row, u in enumerate(users):
            n = lengths[u]
            items[row, :n], labels[row, :n] = batches[u]
            weights[row, :n] = example_weights[n]
        result = reconstruct(weights_in, items, labels, weights)
        for table, part in zip(tables, result):
            table[users] = part.numpy()
        start = end
    return tables


def build_federated_reconstruction_evaluation(
    model_config: neumf.ModelConfig,
    work: client_work.ClientWorkConfig,
    *,
    top_ks: Sequence[int] = TOP_KS,
) -> tff.Computation:
    """Federated evaluation for the 'reconstruct' mode.

    Type: `(global_weights@SERVER, data@CLIENTS) -> metrics@SERVER`, where
    `data` is OrderedDict(items=int32[N], labels=float32[N], candidates=
    int32[C]): each client reconstructs its embedding from `(items, labels)`
    as the client work does, then ranks its candidates. `metrics` is the
    unweighted `federated_mean` of the clients' HR/NDCG values.

    Args:
      model_config: The NeuMF sizes.
      work: The client work config (see `reconstruct_local_tables`).
      top_ks: Cut-offs K.

    Returns:
      A `tff.Computation`.

    Raises:
      ValueError: If `work.reconstruction_steps < 1` or `top_ks` is invalid.
    """
    if work.reconstruction_steps < 1:
        raise ValueError('reconstruction needs work.reconstruction_steps >= 1')
    top_ks = _check_top_ks(top_ks)
    global_type = tff.types.tensorflow_to_type(
        client_work.global_weight_specs(model_config)
    )
    data_spec = client_work.client_data_spec()
    data_spec['candidates'] = tf.TensorSpec([None], tf.int32)
    data_type = tff.types.tensorflow_to_type(data_spec)

    @tff.tensorflow.computation(global_type, data_type)
    def client_eval(global_weights, data):
        model = neumf.NeuMF(model_config)

        @tf.function(autograph=False)
        def run(global_weights, items, labels, candidates):
            _assign(model.global_variables, global_weights)
            weights = client_work.example_weights(
                tf.size(items),
                loss_reduction=work.loss_reduction,
                chunk_size=work.chunk_size,
            )
            client_work.reconstruct_local(
                model,
                lambda: client_work.weighted_bce(model(items), labels, weights),
                work,
            )
            return _client_metrics(model, candidates, top_ks)

        return run(
            global_weights, data['items'], data['labels'], data['candidates']
        )

    @tff.federated_computation(
        tff.FederatedType(global_type, tff.SERVER),
        tff.FederatedType(data_type, tff.CLIENTS),
    )
    def evaluate(global_weights, data):
        metrics = tff.federated_map(
            client_eval, (tff.federated_broadcast(global_weights), data)
        )
        return _named_mean(metrics, top_ks)

    return evaluate
