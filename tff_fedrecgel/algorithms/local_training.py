"""What a user does to its own embedding: loss, local Adam, reconstruction.

Everything here works on a group of users at once, with a leading user axis:
a user's embedding tables are `[G, dim]` and its round batch is one row of a
padded `[G, L]` batch (`data.batching.pad_batches`) with its true length in
`lengths`. A single user is the group of one. The client update
(`client_update.py`), the evaluation of users whose embedding is rebuilt
rather than stored, and held-out users all use these functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tff_fedrecgel.algorithm_config import LOSS_REDUCTIONS
from tff_fedrecgel.models import neumf

# The local Adam's hyperparameters (TFF's `build_adam` defaults; epsilon as
# in the authors' framework, added to sqrt(v)).
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999
ADAM_EPSILON = 1e-8


def example_weights(lengths: tf.Tensor, max_len: tf.Tensor, *, loss_reduction: str,
                    chunk_size: int) -> tf.Tensor:
    """Per-example loss weights that give each user's configured reduction.

    'chunk_sum' (the authors' loss): example i of a user sits in chunk
    i // chunk_size and weighs 1 / len(that chunk), so the weighted sum is the
    sum of the chunks' mean losses. 'mean': every example weighs 1 / n.

    Args:
      lengths: int `[G]`, each user's batch length.
      max_len: The padded length L.
      loss_reduction: One of `LOSS_REDUCTIONS`.
      chunk_size: The chunk length.

    Returns:
      float32 `[G, L]` weights, 0 on padding.
    """
    position = tf.range(max_len)[tf.newaxis, :]
    n = tf.cast(lengths, tf.int32)[:, tf.newaxis]
    if loss_reduction == 'mean':
        weights = 1.0 / tf.cast(tf.maximum(n, 1), tf.float32) * tf.ones_like(
            tf.cast(position, tf.float32))
    else:
        chunk = position // chunk_size
        last = (n - 1) // chunk_size
        # tf.equal, not ==: inside TFF graphs == on tensors is Python identity.
        sizes = tf.where(tf.equal(chunk, last), n - last * chunk_size, chunk_size)
        weights = 1.0 / tf.cast(tf.maximum(sizes, 1), tf.float32)
    return tf.where(position < n, weights, 0.0)


def group_losses(model_config: neumf.ModelConfig, local: Sequence[tf.Tensor],
                 item_rows: Sequence[tf.Tensor], dense: Sequence[tf.Tensor],
                 labels: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """Each user's weighted binary cross-entropy on its batch.

    Args:
      model_config: The NeuMF sizes.
      local: The users' embedding tables, `[G, dim]` each.
      item_rows: The item embedding rows at each batch position, `[G, L, dim]`
        per item table.
      dense: The tower and prediction weights (`neumf.dense_weights`), shared
        or one copy per user (leading `[G]`).
      labels: float32 `[G, L]`.
      weights: float32 `[G, L]` (`example_weights`).

    Returns:
      float32 `[G]`, the sum over each user's examples of weight x BCE.
    """
    logits = neumf.user_item_logits(model_config, local, item_rows, dense)
    losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(losses * weights, axis=1)


class AdamState(NamedTuple):
    """Each user's local Adam state.

    Attributes:
      step: int32 `[G]`, steps taken so far (bias correction is per user).
      m: First moments, shaped like the embedding tables.
      v: Second moments, shaped like the embedding tables.
    """

    step: tf.Tensor
    m: list
    v: list


def initial_adam_state(local: Sequence[tf.Tensor]) -> AdamState:
    """Zero Adam state for embedding tables `[G, dim]`."""
    return AdamState(step=tf.zeros([tf.shape(local[0])[0]], tf.int32),
                     m=[tf.zeros_like(t) for t in local],
                     v=[tf.zeros_like(t) for t in local])


def adam_step(state: AdamState, local: Sequence[tf.Tensor],
              grads: Sequence[tf.Tensor], learning_rate: float
              ) -> tuple[AdamState, list[tf.Tensor]]:
    """One step of TFF's Adam (`tff.learning.optimizers.build_adam`) per user.

    Args:
      state: The users' Adam state (a scalar step: one model's variables,
        any shapes).
      local: The embedding tables, `[G, dim]` each.
      grads: Their gradients.
      learning_rate: The local learning rate.

    Returns:
      `(new_state, new_local)`.
    """
    step = state.step + 1
    t = tf.cast(step, tf.float32)
    lr = learning_rate * tf.sqrt(1.0 - tf.pow(ADAM_BETA_2, t)) / (
        1.0 - tf.pow(ADAM_BETA_1, t))
    new_local, new_m, new_v = [], [], []
    for w, m, v, g in zip(local, state.m, state.v, grads):
        m = m + (g - m) * (1.0 - ADAM_BETA_1)
        v = v + (tf.square(g) - v) * (1.0 - ADAM_BETA_2)
        # One rate per user (`[G]` steps), or one for all (a scalar step).
        rate = lr if lr.shape.rank == 0 else tf.reshape(lr, [-1] + [1] * (w.shape.rank - 1))
        new_local.append(w - rate * m / (tf.sqrt(v) + ADAM_EPSILON))
        new_m.append(m)
        new_v.append(v)
    return AdamState(step, new_m, new_v), new_local


def reconstruct(model_config: neumf.ModelConfig, global_weights: Sequence[tf.Tensor],
                items: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor, *,
                steps: int, learning_rate: float
                ) -> tuple[list[tf.Tensor], AdamState]:
    """Rebuilds users' embeddings from their batches, the global part fixed.

    From zeros, `steps` local Adam steps on each user's loss. The loss of the
    group is the sum of the users' losses: each user's gradient reaches only
    its own row and Adam is elementwise, so this equals rebuilding every user
    alone.

    Args:
      model_config: The NeuMF sizes.
      global_weights: The global weights in `NeuMF.global_variables` order.
      items: int32 `[G, L]` (padded).
      labels: float32 `[G, L]`.
      weights: float32 `[G, L]`, 0 on padding (`example_weights`).
      steps: Adam steps (>= 1).
      learning_rate: The local learning rate.

    Returns:
      `(local, adam_state)`: the tables `[G, dim]` in `NeuMF.local_variables`
      order and the Adam state after the last step.
    """
    tables, dense = neumf.split_tables(model_config, global_weights)
    rows = [tf.gather(t, items) for t in tables]
    num_users = tf.shape(items)[0]
    local = [tf.zeros([num_users, d], tf.float32) for d in model_config.local_dims]
    state = initial_adam_state(local)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            tape.watch(local)
            loss = tf.reduce_sum(
                group_losses(model_config, local, rows, dense, labels, weights))
        grads = tape.gradient(loss, local)
        state, local = adam_step(state, local, grads, learning_rate)
    return local, state
