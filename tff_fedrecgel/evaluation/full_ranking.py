"""Full-ranking evaluation: the held-out item against every candidate item.

A user's candidates are all items except those it interacted with in
training; items held out for validation or test stay candidates, and the
held-out item is the target even when it also appears in training (LastFM-2K
keeps such pairs). Its 0-based rank is the number of other candidates scoring
at least as high (ties count against it, as in the sampled protocol); a NaN
score ranks below everything. `ranking.metrics_from_ranks` turns ranks into HR@K
(equal to Recall@K with one held-out item), NDCG@K and MRR.

Two paths compute the same numbers:

* `evaluate_full`, the fast simulation path, scores all users in blocks.
* `build_federated_full_evaluation`, the TFF computation a deployment would
  run: each client scores the whole item table (it already receives it) with
  its own embedding, excludes its own training items, and only its metrics
  leave the device, averaged by `federated_mean`.

Both score with `_scorer`, one XLA-compiled function per model and number
of users scored together: the first MLP layer splits into a per-user and a
per-item part (the item part computed once per evaluation, or once per
client), GMF is one matrix product over all items, the remaining layers run
as matrix products over blocks of items, and ranking needs only counts of
items beating the target, no sort. The fast path scores 32 users against
each block of 256 items in one matrix product of 8,192 rows; a client
scores itself alone. The per-user products (GMF, the user half of the
first layer with its bias) run one user at a time in both, so a user's
scores depend on who it is scored with, and on the block size, only through
the block products' row count: not at all where the CPU's products sum a
row alike whatever their rows (bit for bit on the AVX-512 machine
measured), by float rounding elsewhere (up to 1e-6 on an AVX2 one; no
LastFM-2K user's rank moved). tests/test_full_ranking.py checks both.
"""

import collections
from collections.abc import Sequence
import functools
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.evaluation import eval_sample
from tff_fedrecgel.evaluation import ranking
from tff_fedrecgel.models import neumf

DEFAULT_USERS_PER_CALL = 256
# [32 x 256 pairs, first width] products: among the fastest of a measured
# sweep (docs/PERFORMANCE.md, "Scoring").
DEFAULT_USERS_PER_STEP = 32
DEFAULT_ITEM_BLOCK = 256
# A device scores one user; its [block, first width] activations stay in cache.
DEVICE_ITEM_BLOCK = 2048


def metric_names(top_ks: Sequence[int] = ranking.TOP_KS) -> list[str]:
    """The full protocol's metric keys: HR@K, NDCG@K for each K, then MRR."""
    return ranking.metric_names(top_ks, mrr=True)


def scoring_flops(config: neumf.ModelConfig, num_users: int) -> int:
    """Floating-point operations of scoring every item for `num_users` users.

    Counted as 2 x the useful multiply-adds of the factored computation: per
    (user, item) pair the GMF dot product, the tower layers after the first
    and the MLP half of the prediction layer; per user and per item once,
    their half of the first tower layer. Elementwise additions and ReLUs are
    not counted.

    Args:
      config: The NeuMF sizes.
      num_users: Users scored.

    Returns:
      The FLOP count.
    """
    per_pair = config.prediction_input_dim
    per_side = 0
    if config.use_mlp:
        widths = list(config.mlp_layers)
        per_pair += sum(a * b for a, b in zip(widths[:-1], widths[1:]))
        per_side = config.mlp_dim * widths[0]
    return 2 * (
        num_users * config.num_items * per_pair
        + (num_users + config.num_items) * per_side
    )


def _item_side(config: neumf.ModelConfig, global_weights) -> list[tf.Tensor]:
    """The global weights as the scorer uses them, item half of layer 1 done.

    Returns:
      A flat list: item_gmf, prediction kernel and bias; with the MLP also
      item_first (`item_mlp @ K[mlp_dim:]`), the user half `K[:mlp_dim]` of the
      first kernel, its bias, then (kernel, bias) of each later tower layer.
    """
    item_gmf, item_mlp, tower, (pred_kernel, pred_bias) = (
        neumf.split_global_weights(config, global_weights)
    )
    side = [item_gmf, pred_kernel, pred_bias]
    if config.use_mlp:
        kernel, bias = tower[0]
        # concat(u, i) @ K = u @ K[:mlp_dim] + i @ K[mlp_dim:].
        side += [tf.matmul(item_mlp, kernel[config.mlp_dim :]),
                 kernel[: config.mlp_dim], bias]
        side += [w for layer in tower[1:] for w in layer]
    return side


def _side_specs(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    with tf.Graph().as_default():
        side = _item_side(config, [tf.zeros(s.shape) for s in _global_specs(config)])
        return [tf.TensorSpec(t.shape, t.dtype) for t in side]


@functools.lru_cache(maxsize=32)
def _item_sider(config: neumf.ModelConfig):
    """`_item_side` compiled once per config; both paths call it."""
    return tf.function(
        lambda w: _item_side(config, w), input_signature=[_global_specs(config)],
        jit_compile=True, autograph=False)


@functools.lru_cache(maxsize=32)
def _scorer(config: neumf.ModelConfig, item_block: int, users: int):
    """One compiled scorer of `users` users against every item, per config.

    Type: `(item side, [users, dim] tables) -> [users, num_items]` scores.
    """
    user_specs = [tf.TensorSpec([users, s.shape[1]], tf.float32)
                  for s in neumf.local_weight_specs(config)]

    # Equal blocks: no short tail block (e.g. 2059 items -> 2 x 1030). At
    # least two: XLA folds a lone block's sum into its last product, which
    # rounds apart from a block of several users.
    num_blocks = max(-(-config.num_items // item_block), min(2, config.num_items))
    block = -(-config.num_items // num_blocks)
    gmf_dim = config.gmf_dim

    @tf.function(jit_compile=True, autograph=False,
                 input_signature=[_side_specs(config), user_specs])
    def score(side, user):
        item_gmf, pred_kernel, pred_bias = side[:3]
        # GMF: (u * q_i) . w = q_i . (u * w), one product for every item.
        # Per-user products stay one user each: a product of several users
        # sums in another order, and a user's scores would depend on its step.
        user_gmf = user[0] * tf.transpose(pred_kernel[:gmf_dim])
        scores = tf.concat([tf.transpose(tf.matmul(item_gmf, user_gmf[u:u + 1], transpose_b=True))
                            for u in range(users)], axis=0) + pred_bias
        if not config.use_mlp:
            return scores
        item_first, user_kernel, first_bias = side[3:6]
        later = list(zip(side[6::2], side[7::2]))
        # The bias inside: XLA starts the product's sums from it.
        user_first = tf.concat([tf.matmul(user[1][u:u + 1], user_kernel) + first_bias
                                for u in range(users)], axis=0)
        width = user_first.shape[1]
        blocks = []
        for start in range(0, config.num_items, block):
            items = item_first[start:start + block]
            # Every (user, item) pair of the block as one row.
            hidden = tf.reshape(tf.nn.relu(items[tf.newaxis] + user_first[:, tf.newaxis]),
                                [users * items.shape[0], width])
            for kernel, bias in later:
                hidden = tf.nn.relu(tf.matmul(hidden, kernel) + bias)
            blocks.append(tf.reshape(tf.matmul(hidden, pred_kernel[gmf_dim:]),
                                     [users, items.shape[0]]))
        return scores + tf.concat(blocks, axis=1)

    return score


def _ranks(scores, heldout, pair_rows, pair_items):
    """Rank of each row's held-out item among its non-excluded items.

    Args:
      scores: float32 `[users, num_items]`.
      heldout: int32 `[users]` target items.
      pair_rows, pair_items: int32 `[pairs]` excluded (row, item) pairs,
        unique; a pair whose item is the row's target is ignored.

    Returns:
      int32 `[users]` ranks.
    """
    scores = tf.where(
        tf.math.is_nan(scores), tf.constant(-np.inf, scores.dtype), scores
    )
    target = tf.gather(scores, heldout[:, tf.newaxis], batch_dims=1)
    # Every item at least as high, minus the target itself.
    at_least = tf.reduce_sum(
        tf.cast(tf.greater_equal(scores, target), tf.int32), axis=1
    ) - 1
    pair_scores = tf.gather_nd(scores, tf.stack([pair_rows, pair_items], axis=1))
    pair_beats = tf.logical_and(
        tf.greater_equal(pair_scores, tf.gather(target[:, 0], pair_rows)),
        tf.not_equal(pair_items, tf.gather(heldout, pair_rows)),
    )
    excluded = tf.math.unsorted_segment_sum(
        tf.cast(pair_beats, tf.int32), pair_rows, tf.shape(scores)[0]
    )
    return at_least - excluded


def _global_specs(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    return list(neumf.global_weight_specs(config))


@functools.lru_cache(maxsize=32)
def _block_ranker(config: neumf.ModelConfig, item_block: int, users_per_step: int):
    """Compiled (item side, user block, targets, excluded pairs) -> ranks.

    Open user and pair dimensions: one trace serves every block.
    """
    score = _scorer(config, item_block, users_per_step)
    table_specs = [tf.TensorSpec([None, s.shape[1]], tf.float32)
                   for s in neumf.local_weight_specs(config)]
    vector = tf.TensorSpec([None], tf.int32)

    @tf.function(autograph=False, input_signature=[
        _side_specs(config), table_specs, vector, vector, vector])
    def rank_block(side, user_tables, heldout, pair_rows, pair_items):
        num_users = tf.shape(heldout)[0]
        # Zero rows fill the last step; their scores are dropped.
        fill = -num_users % users_per_step
        steps = [tf.reshape(tf.pad(t, [[0, fill], [0, 0]]), [-1, users_per_step, t.shape[1]])
                 for t in user_tables]
        scores = tf.map_fn(
            lambda rows: score(side, list(rows)), steps,
            fn_output_signature=tf.TensorSpec([users_per_step, config.num_items], tf.float32))
        scores = tf.reshape(scores, [-1, config.num_items])[:num_users]
        return _ranks(scores, heldout, pair_rows, pair_items)

    return rank_block


def _excluded_pairs(train_csr, heldout: np.ndarray, num_items: int):
    """Unique (user, item) training pairs without each user's target, sorted."""
    indptr, items = (np.asarray(a) for a in train_csr)
    num_users = heldout.shape[0]
    if indptr.shape != (num_users + 1,) or indptr[0] != 0 or np.any(
        np.diff(indptr) < 0) or indptr[-1] != items.shape[0] or items.ndim != 1:
        raise ValueError('train_csr: indptr must be [num_users + 1] offsets '
                         'from 0 to len(items), non-decreasing')
    if items.size and (items.min() < 0 or items.max() >= num_items):
        raise ValueError(f'train_csr: items must be in [0, {num_items})')
    users = np.repeat(np.arange(num_users, dtype=np.int64), np.diff(indptr))
    codes = np.unique(users * num_items + items.astype(np.int64))
    users, items = codes // num_items, codes % num_items
    keep = items != heldout[users]
    return users[keep], items[keep].astype(np.int32)


def full_ranks(config: neumf.ModelConfig, global_weights: Sequence[np.ndarray],
               local_tables: Sequence[np.ndarray], heldout_items: np.ndarray,
               train_csr: tuple[np.ndarray, np.ndarray], *,
               users_per_call: int = DEFAULT_USERS_PER_CALL,
               item_block: int = DEFAULT_ITEM_BLOCK,
               users_per_step: int = DEFAULT_USERS_PER_STEP) -> np.ndarray:
    """Every user's 0-based rank of its held-out item under full ranking.

    Args: as `evaluate_full`.

    Returns:
      int32 `[num_users]` ranks.
    """
    if users_per_call < 1 or item_block < 1 or users_per_step < 1:
        raise ValueError('users_per_call, item_block and users_per_step must be positive')
    heldout = np.asarray(heldout_items)
    if heldout.ndim != 1 or heldout.shape[0] < 1:
        raise ValueError(f'heldout_items must be [num_users], got {heldout.shape}')
    num_items = config.num_items
    if heldout.min() < 0 or heldout.max() >= num_items:
        raise ValueError(f'heldout_items must be in [0, {num_items})')
    heldout = heldout.astype(np.int32)
    num_users = heldout.shape[0]
    specs = neumf.local_weight_specs(config)
    tables = [np.asarray(t, np.float32) for t in local_tables]
    if len(tables) != len(specs) or any(
        t.shape != (num_users, s.shape[1]) for t, s in zip(tables, specs)
    ):
        raise ValueError(
            f'local_tables: got {[t.shape for t in tables]}, expected '
            f'{[(num_users, s.shape[1]) for s in specs]}'
        )
    pair_users, pair_items = _excluded_pairs(train_csr, heldout, num_items)
    rank_block = _block_ranker(config, int(item_block), int(users_per_step))
    side = _item_sider(config)(neumf.global_tensors(config, global_weights))
    bounds = np.searchsorted(pair_users, np.arange(num_users + 1))
    ranks = []
    for start in range(0, num_users, users_per_call):
        end = min(start + users_per_call, num_users)
        lo, hi = bounds[start], bounds[end]
        ranks.append(rank_block(
            side, [t[start:end] for t in tables], heldout[start:end],
            (pair_users[lo:hi] - start).astype(np.int32), pair_items[lo:hi],
        ).numpy())
    return np.concatenate(ranks)


def evaluate_full(
    model_config: neumf.ModelConfig,
    global_weights: Sequence[np.ndarray],
    local_tables: Sequence[np.ndarray],
    heldout_items: np.ndarray,
    train_csr: tuple[np.ndarray, np.ndarray],
    *,
    top_ks: Sequence[int] = ranking.TOP_KS,
    users_per_call: int = DEFAULT_USERS_PER_CALL,
    item_block: int = DEFAULT_ITEM_BLOCK,
    users_per_step: int = DEFAULT_USERS_PER_STEP,
    sample_of: int | None = None,
) -> collections.OrderedDict[str, float]:
    """Mean full-ranking metrics of all users.

    Args:
      model_config: The NeuMF sizes.
      global_weights: Arrays in `NeuMF.global_variables` order.
      local_tables: `[num_users, dim]` arrays in `NeuMF.local_variables` order;
        row u is user u's embedding.
      heldout_items: int `[num_users]`, each user's held-out (target) item.
      train_csr: `(indptr, items)`: user u's training items are
        `items[indptr[u]:indptr[u + 1]]` (repeats allowed); they are excluded
        from its candidates, except its target.
      top_ks: Cut-offs K.
      users_per_call: Users per compiled call (bounds memory to a few
        `users_per_call * num_items` arrays).
      item_block: Items per block inside the scorer.
      users_per_step: Users scored together inside the scorer (a matrix
        product has `users_per_step * item_block` rows). Neither changes
        the scores, only the speed.
      sample_of: The users are a random sample of a population of this many
        (`eval_sample`): standard errors are added; None: no errors.

    Returns:
      OrderedDict of Python floats, the means over users (keys as
      `metric_names(top_ks)`), then with `sample_of` their `_se`.

    Raises:
      ValueError: On inconsistent shapes, out-of-range items or non-positive
        block sizes.
    """
    top_ks = ranking.check_top_ks(top_ks)
    ranks = full_ranks(
        model_config, global_weights, local_tables, heldout_items, train_csr,
        users_per_call=users_per_call, item_block=item_block,
        users_per_step=users_per_step)
    metrics = ranking.metrics_from_ranks(ranks, top_ks=top_ks, mrr=True)
    return eval_sample.summarize({k: v.numpy() for k, v in metrics.items()}, sample_of)


def evaluate_item_scores(item_scores: np.ndarray, heldout_items: np.ndarray,
                         train_csr: tuple[np.ndarray, np.ndarray], *,
                         top_ks: Sequence[int] = ranking.TOP_KS,
                         sample_of: int | None = None,
                         ) -> collections.OrderedDict[str, float]:
    """Full-ranking metrics of a model with one score per item (popularity).

    Every user ranks the items by the same scores, so a user's rank is the
    number of items scoring at least as high as its target, less its own
    training items among them (the target itself is never counted).

    Args:
      item_scores: float `[num_items]`.
      heldout_items: int `[num_users]` targets.
      train_csr: `(indptr, items)` of the users' training items.
      top_ks: Cut-offs K.
      sample_of: As for `evaluate_full`.

    Returns:
      OrderedDict of Python floats, the means over users (`metric_names`),
      then with `sample_of` their `_se`.
    """
    scores = np.asarray(item_scores, np.float64)
    scores = np.where(np.isnan(scores), -np.inf, scores)
    targets = np.asarray(heldout_items, np.int64)
    indptr, items = (np.asarray(a, np.int64) for a in train_csr)
    target_scores = scores[targets]
    ordered = np.sort(scores)
    at_least = len(scores) - np.searchsorted(ordered, target_scores, side='left')
    rows = np.repeat(np.arange(len(targets)), np.diff(indptr))
    # A user's training items repeat; count each once, and never the target.
    pairs = np.unique(np.stack([rows, items], axis=1), axis=0) if len(items) else (
        np.zeros((0, 2), np.int64))
    beaten = (scores[pairs[:, 1]] >= target_scores[pairs[:, 0]]) & (
        pairs[:, 1] != targets[pairs[:, 0]])
    excluded = np.bincount(pairs[beaten, 0], minlength=len(targets))
    ranks = at_least - 1 - excluded  # Less the target itself.
    metrics = ranking.metrics_from_ranks(ranks.astype(np.int64), top_ks=top_ks, mrr=True)
    return eval_sample.summarize({k: v.numpy() for k, v in metrics.items()}, sample_of)


def client_data_spec() -> collections.OrderedDict:
    """One client's evaluation data: its target and its training items."""
    return collections.OrderedDict(
        heldout_item=tf.TensorSpec([], tf.int32),
        train_items=tf.TensorSpec([None], tf.int32),
    )


def build_federated_full_evaluation(
    model_config: neumf.ModelConfig,
    *,
    top_ks: Sequence[int] = ranking.TOP_KS,
    item_block: int = DEVICE_ITEM_BLOCK,
) -> tff.Computation:
    """The federated full-ranking evaluation.

    Type: `(global_weights@SERVER, local_weights@CLIENTS, client_data@CLIENTS)
    -> metrics@SERVER`. Each client receives the global weights (the whole
    item tables), scores every item with its own `[1, dim]` embeddings
    (`NeuMF.local_variables` order), excludes its own training items
    (`client_data_spec`: `heldout_item` int32 scalar, `train_items` int32
    `[None]`, repeats allowed) and ranks its held-out item; only its metric
    values leave the device, and the server gets their unweighted
    `federated_mean` (the mean over users), keyed as `metric_names(top_ks)`.

    Args:
      model_config: The NeuMF sizes.
      top_ks: Cut-offs K.
      item_block: Items per matrix product (any value gives the same
        scores as `evaluate_full`).

    Returns:
      A `tff.Computation`.
    """
    top_ks = ranking.check_top_ks(top_ks)
    names = metric_names(top_ks)
    global_type = tff.types.tensorflow_to_type(_global_specs(model_config))
    local_type = tff.types.tensorflow_to_type(
        neumf.local_weight_specs(model_config))
    data_type = tff.types.tensorflow_to_type(client_data_spec())
    score_user = _scorer(model_config, int(item_block), 1)
    item_side = _item_sider(model_config)

    @tff.tensorflow.computation(global_type, local_type, data_type)
    def client_eval(global_weights, local_weights, data):

        @tf.function(autograph=False)
        def run(global_weights, local_weights, heldout, train_items):
            scores = score_user(item_side(global_weights), local_weights)
            train_items, _ = tf.unique(train_items)
            heldout = heldout[tf.newaxis]
            rank = _ranks(scores, heldout, tf.zeros_like(train_items), train_items)
            # A list: '@' is not a valid TF scope name; names return at the server.
            return [v[0] for v in ranking.metrics_from_ranks(rank, top_ks=top_ks, mrr=True).values()]

        return run(global_weights, local_weights, data['heldout_item'],
                   data['train_items'])

    @tff.federated_computation(
        tff.FederatedType(global_type, tff.SERVER),
        tff.FederatedType(local_type, tff.CLIENTS),
        tff.FederatedType(data_type, tff.CLIENTS),
    )
    def evaluate(global_weights, local_weights, client_data):
        metrics = tff.federated_map(
            client_eval,
            (tff.federated_broadcast(global_weights), local_weights, client_data),
        )
        means = tff.federated_mean(metrics)
        return tff.federated_zip(
            collections.OrderedDict((n, means[i]) for i, n in enumerate(names)))

    return evaluate


def ranks_from_scores(scores: np.ndarray, heldout_items: np.ndarray,
                      train_csr: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Full-ranking ranks of users scored by a model of their own (PFedRec, FedRAP).

    Args:
      scores: float `[users, num_items]`, each user's score of every item.
      heldout_items: int `[users]` targets.
      train_csr: `(indptr, items)` of the users' training items (excluded
        from their candidates, except the target).

    Returns:
      int32 `[users]` ranks, as `evaluate_full` counts them.

    Raises:
      ValueError: On inconsistent shapes or out-of-range items.
    """
    scores = np.asarray(scores, np.float32)
    heldout = np.asarray(heldout_items)
    if scores.ndim != 2 or heldout.shape != (scores.shape[0],):
        raise ValueError(f'scores must be [users, num_items] and heldout_items [users], got '
                         f'{scores.shape} and {heldout.shape}')
    if heldout.size and (heldout.min() < 0 or heldout.max() >= scores.shape[1]):
        raise ValueError(f'heldout_items must be in [0, {scores.shape[1]})')
    heldout = heldout.astype(np.int32)
    pair_users, pair_items = _excluded_pairs(train_csr, heldout, scores.shape[1])
    return _ranks(tf.constant(scores), tf.constant(heldout),
                  tf.constant(pair_users.astype(np.int32)), tf.constant(pair_items)).numpy()
