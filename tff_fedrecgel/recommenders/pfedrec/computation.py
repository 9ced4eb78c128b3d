"""PFedRec (Zhang et al., IJCAI 2023): dual personalization, as TFF computations.

The model is an item embedding table `E [num_items, d]` and a score function
`s(e) = sigmoid(w . e + b)` on an item's embedding; there is no user
embedding. Each user keeps its own score function `(w, b)` on its device
(CLIENTS-placed state, never uploaded) and fine-tunes its own copy of the
item embeddings; the server averages the users' item tables (FedAvg,
unweighted). docs/ALGORITHM.md ("PFedRec") has the round and where the
authors' published code differs from the paper.

  initialize() -> state@SERVER
  next(state@SERVER, scores@CLIENTS, data@CLIENTS)
      -> (state@SERVER, scores@CLIENTS, offsets@CLIENTS, metrics@SERVER)

State: OrderedDict(item_table float32 [num_items, d], round_num int32).
A TFF client holds a group of G users (G = 1 is a device): `scores` is
OrderedDict(w [G, d], b [G]); `data` is `client_data_spec` (each user's
touched items and its minibatches, see `ClientData`). `offsets` [G, L, d]
are each user's fine-tuned item rows minus the received ones: its personal
view of the items, kept on the device for serving. What reaches the server
is the sum of the users' item-table changes, the number of users and the
summed loss.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms.personal_batches import bce_and_grad, client_data_spec


@dataclasses.dataclass(frozen=True)
class PFedRecConfig:
    """PFedRec's client work (this module); defaults are its
    authors' published settings (docs/ALGORITHM.md, "PFedRec").

    Attributes:
      latent_dim: Item embedding size.
      score_lr: SGD learning rate of the personal score function.
      item_lr_eta: The item embedding's SGD learning rate is
        `score_lr * num_items * item_lr_eta` (the authors' scaling).
      batch_size: Examples per local minibatch (the last one may be short).
      local_epochs: Local epochs over the user's round batch.
    """

    latent_dim: int = 32
    score_lr: float = 0.1
    item_lr_eta: float = 80.0
    batch_size: int = 256
    local_epochs: int = 1

    def __post_init__(self):
        for name in ('score_lr', 'item_lr_eta'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('latent_dim', 'batch_size', 'local_epochs'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')

    def item_lr(self, num_items: int) -> float:
        """The item embedding's learning rate for `num_items` items."""
        return self.score_lr * num_items * self.item_lr_eta


DEFAULT_CONFIG = PFedRecConfig()



def score_spec(latent_dim: int) -> collections.OrderedDict:
    """The TF specs of a group's score functions `(w [G, d], b [G])`."""
    return collections.OrderedDict(w=tf.TensorSpec([None, latent_dim], tf.float32),
                                   b=tf.TensorSpec([None], tf.float32))


def initial_weights(num_items: int, config: PFedRecConfig,
                    seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The initial item table and score function (the authors' layers' init).

    The table is N(0, 1) (a torch `Embedding`); `w` and `b` are uniform in
    +-1/sqrt(d) (a torch `Linear`).

    Returns:
      `(item_table [num_items, d], w [d], b)`, float32.
    """
    rng = np.random.default_rng([seed, 0x9FED])
    d = config.latent_dim
    table = rng.standard_normal((num_items, d)).astype(np.float32)
    bound = 1.0 / np.sqrt(d)
    w = rng.uniform(-bound, bound, d).astype(np.float32)
    b = np.float32(rng.uniform(-bound, bound))
    return table, w, float(b)


def make_client_update(num_items: int, config: PFedRecConfig):
    """The users' local round as a `tf.function` over a group of G users.

    Each minibatch, as the authors' code does: one SGD step of the score
    function on the minibatch's mean BCE, then one SGD step of the user's
    item rows on the same loss with the updated score function.

    Args:
      num_items: Rows of the item table.
      config: The client work's settings.

    Returns:
      `update(item_table, scores, data)` -> OrderedDict(scores, offsets
      [G, L, d], delta [num_items, d] (the group's summed table change),
      users (float32, users with data), loss (float32, the sum over users of
      each user's mean loss), examples (float32, every epoch counted)).
    """
    batch = config.batch_size
    score_lr = config.score_lr
    item_lr = config.item_lr(num_items)
    d = config.latent_dim

    @tf.function(input_signature=[tf.TensorSpec([num_items, d], tf.float32),
                                  score_spec(d), client_data_spec()])
    def update(item_table, scores, data):
        local_ids, slots = data['local_ids'], data['slots']
        labels, mask = data['labels'], data['mask']
        groups, num_local = tf.shape(local_ids)[0], tf.shape(local_ids)[1]
        start_rows = tf.gather(item_table, local_ids)  # [G, L, d]
        segment_base = (tf.range(groups) * num_local)[:, tf.newaxis]
        num_batches = (tf.shape(slots)[1] + batch - 1) // batch

        def step(k, w, b, rows, loss_sum):
            cols = tf.range(k * batch, tf.minimum((k + 1) * batch, tf.shape(slots)[1]))
            idx = tf.gather(slots, cols, axis=1)
            y, m = tf.gather(labels, cols, axis=1), tf.gather(mask, cols, axis=1)
            scale = m / tf.maximum(tf.reduce_sum(m, axis=1, keepdims=True), 1.0)
            e = tf.gather(rows, idx, batch_dims=1)  # [G, B, d]
            _, g = bce_and_grad(tf.einsum('gbd,gd->gb', e, w) + b[:, tf.newaxis], y)
            g = g * scale
            w = w - score_lr * tf.einsum('gb,gbd->gd', g, e)
            b = b - score_lr * tf.reduce_sum(g, axis=1)
            loss, g = bce_and_grad(tf.einsum('gbd,gd->gb', e, w) + b[:, tf.newaxis], y)
            grad_e = (g * scale)[:, :, tf.newaxis] * w[:, tf.newaxis, :]
            grad_rows = tf.math.unsorted_segment_sum(
                tf.reshape(grad_e, [-1, d]), tf.reshape(idx + segment_base, [-1]),
                groups * num_local)
            rows = rows - item_lr * tf.reshape(grad_rows, [groups, num_local, d])
            return k + 1, w, b, rows, loss_sum + tf.reduce_sum(loss * m, axis=1)

        _, w, b, rows, loss_sum = tf.while_loop(
            lambda k, *_: k < num_batches, step,
            (tf.constant(0), scores['w'], scores['b'], start_rows,
             tf.zeros([groups], tf.float32)))
        offsets = rows - start_rows
        delta = tf.math.unsorted_segment_sum(
            tf.reshape(offsets, [-1, d]), tf.reshape(local_ids, [-1]), num_items)
        examples = tf.reduce_sum(mask, axis=1)
        has_data = tf.cast(examples > 0, tf.float32)
        return collections.OrderedDict(
            scores=collections.OrderedDict(w=w, b=b), offsets=offsets, delta=delta,
            users=tf.reduce_sum(has_data),
            loss=tf.reduce_sum(loss_sum / tf.maximum(examples, 1.0)),
            examples=tf.reduce_sum(examples))

    return update


def build_pfedrec_process(*, num_items: int, config: PFedRecConfig,
                          seed: int = 0) -> tff.templates.IterativeProcess:
    """PFedRec's round (types in the module docstring).

    The server's new table is the unweighted mean of the participants' item
    tables, computed as the received table plus the mean of their changes
    (rows a user never touched are unchanged in its table). With no user
    holding data the table is kept.

    Args:
      num_items: Rows of the item table.
      config: The client work's settings.
      seed: Seed of the initial table (`initial_weights`).

    Returns:
      A `tff.templates.IterativeProcess`.

    Raises:
      ValueError: If `num_items` is not positive.
    """
    if num_items < 1:
        raise ValueError(f'num_items must be positive, got {num_items}')
    d = config.latent_dim
    table0, _, _ = initial_weights(num_items, config, seed)
    update = make_client_update(num_items, config)
    table_spec = tf.TensorSpec([num_items, d], tf.float32)

    @tff.tensorflow.computation
    def server_init():
        return collections.OrderedDict(item_table=tf.constant(table0),
                                       round_num=tf.constant(0, tf.int32))

    state_type = server_init.type_signature.result
    client_tf = tff.tensorflow.computation(update, table_spec, score_spec(d),
                                           client_data_spec())

    @tff.tensorflow.computation(state_type, table_spec, tf.TensorSpec([], tf.float32))
    def server_update(state, delta_sum, users):
        mean = delta_sum / tf.maximum(users, 1.0)
        return collections.OrderedDict(item_table=state['item_table'] + mean,
                                       round_num=state['round_num'] + 1)

    @tff.tensorflow.computation(tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
    def mean_of(total, count):
        return total / tf.maximum(count, 1.0)

    @tff.federated_computation
    def initialize():
        return tff.federated_eval(server_init, tff.SERVER)

    scores_type = tff.FederatedType(tff.types.tensorflow_to_type(score_spec(d)), tff.CLIENTS)
    data_type = tff.FederatedType(tff.types.tensorflow_to_type(client_data_spec()),
                                  tff.CLIENTS)

    @tff.federated_computation(initialize.type_signature.result, scores_type, data_type)
    def next_fn(state, scores, data):
        table = tff.federated_broadcast(state.item_table)
        out = tff.federated_map(client_tf, (table, scores, data))
        users = tff.federated_sum(out.users)
        new_state = tff.federated_map(
            server_update, (state, tff.federated_sum(out.delta), users))
        metrics = collections.OrderedDict(
            loss=tff.federated_map(mean_of, (tff.federated_sum(out.loss), users)),
            users=users, examples=tff.federated_sum(out.examples))
        return new_state, out.scores, out.offsets, tff.federated_zip(metrics)

    return tff.templates.IterativeProcess(initialize, next_fn)


def user_scores(item_table: np.ndarray, w: np.ndarray, b: np.ndarray,
                offset_csr: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Every item's logit for each user under its personal view.

    Args:
      item_table: float32 `[num_items, d]`, the global table.
      w, b: float32 `[n, d]` and `[n]`: the users' score functions.
      offset_csr: `(indptr [n + 1], items [nnz], rows [nnz, d])`: user i's
        fine-tuned rows minus the global ones (items unique per user).

    Returns:
      float32 `[n, num_items]` (the sigmoid is monotone, so logits rank).
    """
    scores = np.asarray(w, np.float32) @ np.asarray(item_table, np.float32).T
    scores += np.asarray(b, np.float32)[:, None]
    indptr, items, rows = offset_csr
    users = np.repeat(np.arange(len(w)), np.diff(indptr))
    scores[users, items] += np.einsum('nd,nd->n', rows, w[users])
    return scores
