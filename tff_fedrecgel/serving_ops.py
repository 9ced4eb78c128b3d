"""TensorFlow pieces of the SavedModel (`serving`): ids, a new user's batch, top-K.

They run inside the exported graph, without this project, and reproduce
the library's Python paths: `new_user_batch` is `FederatedTrainData.round_batch`
for the one user of a new user's data (the same uniforms, the same shuffle
and the same negatives), and `top_k` is `TrainedModel.top_k` (ties keep the
lower index first).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def id_table(ids: list[str]) -> tf.lookup.StaticHashTable:
    """Original id (text) -> index, -1 for an unknown id.

    Args:
      ids: The original ids of indices 0..len(ids)-1, as text.

    Returns:
      A lookup table (saved with the module that holds it).
    """
    keys = tf.constant(ids if ids else [''], tf.string)
    values = tf.range(len(ids), dtype=tf.int32) if ids else tf.constant([-1], tf.int32)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, values), default_value=-1)


def lookup(table: tf.lookup.StaticHashTable, ids: tf.Tensor, kind: str) -> tf.Tensor:
    """The indices of original ids; fails naming the unknown ones.

    Args:
      table: From `id_table`.
      ids: string `[n]`.
      kind: 'user' or 'item' (for the message).

    Returns:
      int32 `[n]`.

    Raises:
      tf.errors.InvalidArgumentError: When called, if an id is unknown.
    """
    indices = table.lookup(ids)
    unknown = tf.less(indices, 0)
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(unknown)),
        [f'unknown {kind} ids (not in the data):', tf.boolean_mask(ids, unknown)],
        summarize=10)
    with tf.control_dependencies([check]):
        return tf.identity(indices)


def new_user_batch(positives: tf.Tensor, uniforms: tf.Tensor, *, num_items: int,
                   num_negatives: int) -> tuple[tf.Tensor, tf.Tensor]:
    """A new user's `(items, labels)` batch, as `FederatedTrainData.round_batch`.

    Args:
      positives: int32 `[P]` unique item indices, in the order given.
      uniforms: float64, at least `P * (1 + num_negatives)` values of the
        new user's draw (`client_data.user_uniforms`).
      num_items: Size of the item index space.
      num_negatives: Negatives per positive (k).

    Returns:
      int32 items and float32 labels, `P * (1 + k)` each: every positive
      (label 1, in the order of its shuffle key) followed by k distinct items
      the user does not have (label 0).

    Raises:
      tf.errors.InvalidArgumentError: When called, with no positives or fewer
        than k items left for the negatives.
    """
    k = int(num_negatives)
    count = tf.size(positives)
    left = num_items - count
    checks = [
        tf.debugging.assert_positive(count, message='give at least one item'),
        tf.debugging.assert_greater_equal(
            left, k, message=f'too few items left for {k} negatives per positive'),
    ]
    with tf.control_dependencies(checks):
        count = tf.identity(count)
    order = tf.argsort(uniforms[:count], stable=True)
    shuffled = tf.gather(positives, order)
    if not k:
        return shuffled, tf.ones([count], tf.float32)
    rows = tf.range(count)
    draws = tf.gather(uniforms, count + rows[:, tf.newaxis] * k + tf.range(k)[tf.newaxis, :])
    n = tf.cast(left, tf.int64)
    # Floyd's sampling of k distinct ranks among the n items the user lacks.
    ranks = []
    for step in range(k):
        j = n - k + step
        t = tf.minimum(tf.cast(tf.floor(draws[:, step] * tf.cast(j + 1, tf.float64)),
                               tf.int64), j)
        if ranks:
            taken = tf.reduce_any(tf.equal(tf.stack(ranks, axis=1), t[:, tf.newaxis]), axis=1)
            t = tf.where(taken, j, t)
        ranks.append(t)
    ranks = tf.stack(ranks, axis=1)
    # The r-th item the user lacks is r + #{j : sorted_j - j <= r}.
    sorted_items = tf.sort(tf.cast(positives, tf.int64))
    shifted = sorted_items - tf.range(tf.cast(count, tf.int64))
    below = tf.searchsorted(shifted, tf.reshape(ranks, [-1]), side='right',
                            out_type=tf.int64)
    negatives = tf.reshape(ranks + tf.reshape(below, [-1, k]), [-1, k])
    table = tf.concat([tf.cast(shuffled, tf.int64)[:, tf.newaxis], negatives], axis=1)
    labels = tf.tile(tf.constant([1.0] + [0.0] * k, tf.float32), [count])
    return tf.cast(tf.reshape(table, [-1]), tf.int32), labels


def rows_mask(rows: tf.RaggedTensor, num_items: int) -> tf.Tensor:
    """bool `[U, num_items]`, True at each row's item indices.

    Args:
      rows: int32 ragged `[U, None]` item indices.
      num_items: Size of the item index space.

    Returns:
      The mask.
    """
    where = tf.stack([tf.cast(rows.value_rowids(), tf.int32), rows.values], axis=1)
    counts = tf.scatter_nd(where, tf.ones_like(rows.values), [rows.nrows(tf.int32), num_items])
    return tf.greater(counts, 0)


def top_k(scores: tf.Tensor, excluded: tf.Tensor, has_id: tf.Tensor, item_ids: tf.Tensor,
          k: tf.Tensor) -> dict[str, tf.Tensor]:
    """The `k` best items of each row with an original id, `excluded` left out.

    Args:
      scores: float32 `[U, num_items]`.
      excluded: bool `[U, num_items]`.
      has_id: bool `[num_items]`.
      item_ids: string `[num_items]`.
      k: int32 scalar, >= 1.

    Returns:
      `item_ids` string `[U, k]` and `scores` float32 `[U, k]`, best first;
      a row with fewer than k candidates ends with '' and -inf.

    Raises:
      tf.errors.InvalidArgumentError: When called, if k < 1.
    """
    check = tf.debugging.assert_positive(k, message='k must be >= 1')
    with tf.control_dependencies([check]):
        k = tf.minimum(k, tf.shape(scores)[1])
    allowed = tf.logical_and(has_id[tf.newaxis, :], tf.logical_not(excluded))
    masked = tf.where(allowed, scores, tf.constant(-np.inf, tf.float32))
    top = tf.math.top_k(masked, k=k)  # Ties: the lower index first.
    found = tf.math.is_finite(top.values)
    ids = tf.where(found, tf.gather(item_ids, top.indices), tf.constant('', tf.string))
    return {'item_ids': ids, 'scores': top.values}
