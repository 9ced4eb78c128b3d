"""The local-epoch data layout the peer recommenders share, and their loss.

PFedRec, GPFedRec and FedRAP each train a user for local epochs of shuffled
minibatches over its round batch, on the items that batch touches only. A
TFF client carries a group of G users as one `ClientData` (each user's
touched items and its examples as positions into them); `pack_groups`
builds it, `epoch_orders` and `user_orders` draw the orders, and
`client_groups` splits a round's users into TFF clients. `bce_and_grad` is
the loss the three share (torch's BCE on a probability). Each recommender's
own package (`tff_fedrecgel/recommenders/`) holds the rest.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import dataclasses

import numpy as np
import tensorflow as tf

from tff_fedrecgel.data import batching

# torch.nn.BCELoss on a probability (the authors' loss): logs clamped at
# -100, the gradient's denominator p (1 - p) at 1e-12.
_LOG_FLOOR = -100.0
_GRAD_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class ClientData:
    """One TFF client's round data: G users, each padded to T examples.

    Attributes:
      local_ids: int32 `[G, L]`: the items each user's examples touch, once
        each (padded with 0).
      slots: int32 `[G, T]`: each example's position in its user's
        `local_ids`, in training order; minibatch k is columns
        `[k * batch_size, (k + 1) * batch_size)` (padded with 0).
      labels: float32 `[G, T]`.
      mask: float32 `[G, T]`: 1 for a real example.
    """

    local_ids: np.ndarray
    slots: np.ndarray
    labels: np.ndarray
    mask: np.ndarray

    def as_struct(self) -> collections.OrderedDict:
        return collections.OrderedDict(local_ids=self.local_ids, slots=self.slots,
                                       labels=self.labels, mask=self.mask)


def client_data_spec() -> collections.OrderedDict:
    """The TF specs of `ClientData.as_struct()` (any G, L, T)."""
    return collections.OrderedDict(
        local_ids=tf.TensorSpec([None, None], tf.int32),
        slots=tf.TensorSpec([None, None], tf.int32),
        labels=tf.TensorSpec([None, None], tf.float32),
        mask=tf.TensorSpec([None, None], tf.float32))


def bce_and_grad(logits: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-example BCE of sigmoid(logits) and its gradient in the logits."""
    p = tf.sigmoid(logits)
    loss = -(labels * tf.maximum(tf.math.log(p), _LOG_FLOOR)
             + (1.0 - labels) * tf.maximum(tf.math.log(1.0 - p), _LOG_FLOOR))
    pq = p * (1.0 - p)
    return loss, (p - labels) / tf.maximum(pq, _GRAD_EPS) * pq


def pack_groups(batches: Sequence[tuple[np.ndarray, np.ndarray]], orders: Sequence[np.ndarray],
                batch_size: int) -> ClientData:
    """One TFF client's `ClientData` from its users' batches.

    Args:
      batches: Each user's `(items, labels)`.
      orders: Each user's training order: indices into its batch, one epoch
        after another, each epoch padded with -1 to a multiple of
        `batch_size` (so minibatches never straddle epochs).
      batch_size: Examples per minibatch.

    Returns:
      The group's `ClientData`.
    """
    uniques = [np.unique(items, return_inverse=True) for items, _ in batches]
    width_l = max(1, max(len(u) for u, _ in uniques))
    width_t = max(batch_size, max(len(o) for o in orders))
    g = len(batches)
    local_ids = np.zeros((g, width_l), np.int32)
    slots = np.zeros((g, width_t), np.int32)
    labels = np.zeros((g, width_t), np.float32)
    mask = np.zeros((g, width_t), np.float32)
    for i, ((_, y), (ids, inverse), order) in enumerate(zip(batches, uniques, orders)):
        local_ids[i, :len(ids)] = ids
        real = order >= 0
        slots[i, :len(order)][real] = inverse[order[real]]
        labels[i, :len(order)][real] = y[order[real]]
        mask[i, :len(order)][real] = 1.0
    return ClientData(local_ids, slots, labels, mask)


def epoch_orders(length: int, epochs: int, batch_size: int,
                 rng: np.random.Generator) -> np.ndarray:
    """A user's training order: a fresh permutation each epoch (the authors'
    shuffled loader), each epoch padded with -1 to whole minibatches."""
    padded = -(-length // batch_size) * batch_size
    out = np.full(epochs * padded, -1, np.int64)
    for e in range(epochs):
        out[e * padded:e * padded + length] = rng.permutation(length)
    return out


def user_orders(users: Sequence[int], batches: Sequence[tuple[np.ndarray, np.ndarray]], config,
                *, seed: int, round_num: int, salt: int) -> list[np.ndarray]:
    """Each user's training order for the round (`epoch_orders`), from
    `default_rng([seed, round_num, user, salt])`.

    Args:
      config: Has `local_epochs` and `batch_size`.
    """
    return [epoch_orders(len(items), config.local_epochs, config.batch_size,
                         np.random.default_rng([seed, round_num, int(u), salt]))
            for u, (items, _) in zip(users, batches)]


def client_groups(users: Sequence[int], batches: Sequence[tuple[np.ndarray, np.ndarray]],
                  config, *, seed: int, round_num: int, salt: int, grouped: bool,
                  max_group_examples: int) -> list[tuple[list[int], ClientData]]:
    """A round's TFF clients: each a list of positions in `users` and their
    packed `ClientData` (one user per client unless `grouped`).

    Args:
      config: Has `local_epochs` and `batch_size`.
    """
    orders = user_orders(users, batches, config, seed=seed, round_num=round_num, salt=salt)
    if grouped:
        groups = batching.group_by_length([len(o) for o in orders],
                                          max_examples=max_group_examples, multiple=1)
    else:
        groups = [[i] for i in range(len(users))]
    return [(g, pack_groups([batches[i] for i in g], [orders[i] for i in g], config.batch_size))
            for g in groups]
