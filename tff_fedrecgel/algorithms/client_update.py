"""The client update of FedRecGEL: one pure function over a group of users.

`build_client_update` returns a TensorFlow function of (global weights,
client state, client data) with no hidden state. It is written over a
leading user axis: a TFF client may stand for a group of G users (the
simulation's vectorized clients), and one user's device is the group of one
(`single_user=True`, the form that is deployed and exported). Each user's
computation is independent of the others in its group (docs/ALGORITHM.md,
steps 3-8):

1. base pass: the loss on the user's round batch and its gradients;
2. global SAM pass: the gradient of the global part at the point moved by
   rho_sh along the user's own normalized global gradient;
3. local SAM pass: the gradient of the user embedding at the point moved by
   rho_ns along the user's own normalized local gradient;
4. one step of the user's local Adam on the user embedding.

Steps 1-3 are the Keras SAM optimizer's (`optimizers/sam.py`,
`SharpnessAwareMinimization.sam_gradients_at`), with each user of the group a
norm segment of its own. To perturb each user's global part separately, every
user gets its own copy of the dense layers (`[G, ...]`) and of the item
embedding rows it touches (one row per distinct (user, item) pair). The group uploads the weighted
mean of its users' updates with their summed weight, so the server's
weighted mean over TFF clients is the mean over users whatever the grouping.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithm_config import CLIENT_WEIGHTINGS
from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithm_config import LOCAL_STATES
from tff_fedrecgel.algorithm_config import UPDATE_MODES
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf
from tff_fedrecgel.optimizers import sam

METRIC_NAMES = ('loss', 'sam_loss_global', 'sam_loss_local', 'num_examples')


def item_or_field(self, key):
    """`__getitem__` of the typed states: by position, or a field by name.

    By name as well, as in the structures deserialized computations return
    (they carry no Python container type), so code reads both alike.
    """
    return getattr(self, key) if isinstance(key, str) else tuple.__getitem__(self, key)


class ClientState(NamedTuple):
    """What a user keeps between rounds (persistent mode).

    Attributes:
      local_weights: The user embedding tables, `[G, dim]` each (`[1, dim]`
        on a device).
      adam_step: int32 `[G]` (a scalar on a device): local Adam steps taken.
      adam_m: The local Adam's first moments, shaped like `local_weights`.
      adam_v: Its second moments.
    """

    local_weights: list
    adam_step: Any
    adam_m: list
    adam_v: list

    __getitem__ = item_or_field


@dataclasses.dataclass(frozen=True)
class ClientUpdate:
    """A client update function and the TFF types of its arguments.

    Attributes:
      fn: `(global_weights, client_state, client_data) -> OrderedDict` with
        keys `update` (the weighted mean of the users' global updates, in
        `global_weights`' structure), `weight` (their summed weight, 0 for
        dropped users), `dropped` and `users` (int32 counts), `client_state`
        (persistent mode; a dropped user keeps its old state) and `metrics`
        (`METRIC_NAMES`, means over the users that contributed).
        `client_state` is ignored (may be None) in reconstruct mode.
      state_type: The type of `client_state`; None in reconstruct mode.
      data_type: The type of `client_data`: a group's `(items, labels,
        lengths)` (`data.batching.PaddedBatches`), or one user's
        `OrderedDict(items, labels)` (`single_user`).
      work: The configuration it was built from.
      single_user: Whether this is the one-user device form.
    """

    fn: Callable[..., collections.OrderedDict]
    state_type: tff.Type | None
    data_type: tff.Type
    work: ClientWorkConfig
    single_user: bool


def client_state_spec(model_config: neumf.ModelConfig, *, single_user: bool) -> ClientState:
    local = neumf.local_weight_specs(model_config, num_users=1 if single_user else None)
    return ClientState(local_weights=local,
                       adam_step=tf.TensorSpec([] if single_user else [None], tf.int32),
                       adam_m=list(local), adam_v=list(local))


def client_data_spec(*, single_user: bool):
    if single_user:
        return collections.OrderedDict(items=tf.TensorSpec([None], tf.int32),
                                       labels=tf.TensorSpec([None], tf.float32))
    return collections.OrderedDict(items=tf.TensorSpec([None, None], tf.int32),
                                   labels=tf.TensorSpec([None, None], tf.float32),
                                   lengths=tf.TensorSpec([None], tf.int32))


def initial_client_states(model_config: neumf.ModelConfig, *, num_users: int,
                          seed: int) -> ClientState:
    """Every user's starting state: N(0, 0.01^2) embeddings, zero Adam state.

    Args:
      model_config: The model sizes.
      num_users: How many users.
      seed: Seed of the embeddings.

    Returns:
      A `ClientState` of numpy arrays with a leading `[num_users]` axis.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    local = [rng.normal(0.0, neumf.EMBEDDING_STDDEV, (num_users, 1, d)
                        ).astype(np.float32)[:, 0, :] for d in model_config.local_dims]
    return ClientState(local_weights=local, adam_step=np.zeros([num_users], np.int32),
                       adam_m=[np.zeros_like(t) for t in local],
                       adam_v=[np.zeros_like(t) for t in local])


def as_client_state(state) -> ClientState:
    """A `ClientState` from itself or a mapping with its field names."""
    if isinstance(state, ClientState):
        return state
    if hasattr(state, 'keys'):
        return ClientState(**{k: state[k] for k in ClientState._fields})
    return ClientState(*state)


def _per_user(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Broadcasts a `[G]` vector against a `[G, ...]` tensor."""
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _per_user_finite(values: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(tf.reshape(values, [tf.shape(values)[0], -1])),
                         axis=1)


class _Keys(NamedTuple):
    """The distinct (user, item) pairs of a padded batch."""

    position: tf.Tensor  # int32 [G, L]: each batch position's pair.
    user: tf.Tensor      # int32 [K]: the pair's user (row in the group).
    item: tf.Tensor      # int32 [K]: the pair's item.


def _keys(items: tf.Tensor, num_items: int) -> _Keys:
    rows = tf.cast(tf.range(tf.shape(items)[0])[:, tf.newaxis], tf.int64)
    codes = rows * num_items + tf.cast(items, tf.int64)
    unique, position = tf.unique(tf.reshape(codes, [-1]))
    return _Keys(tf.reshape(position, tf.shape(items)),
                 tf.cast(unique // num_items, tf.int32), tf.cast(unique % num_items, tf.int32))


class _Copies(NamedTuple):
    """Each user's own copy of the global part: touched rows and dense layers."""

    rows: list   # [K, dim] per item table.
    dense: list  # [G, ...] per dense weight.


def build_sam_optimizer(work: ClientWorkConfig) -> sam.SharpnessAwareMinimization:
    """The client work's Keras SAM optimizer: 'global' at rho_sh, 'local' at rho_ns."""
    return sam.SharpnessAwareMinimization(rho={'global': work.rho_sh, 'local': work.rho_ns})


def _sam_step(model_config, optimizer, keys, position, local, copies, labels, weights):
    """steps 4-6 (docs/ALGORITHM.md) for every user of the group at once, by the SAM optimizer.

    The point has two groups: 'global' (the users' copies of the item rows,
    then of the dense layers) and 'local' (the user embeddings); each user is
    a segment of its own, so its norm and step are its own.

    Returns:
      `(losses, sam_losses_global, sam_losses_local, local_grads,
      global_grads)`: per-user losses `[G]`, the local part's SAM gradients
      and the global part's as `_Copies`.
    """
    num_tables = len(copies.rows)

    def losses_at(point):
        rows = [tf.gather(r, position) for r in point['global'][:num_tables]]
        return local_training.group_losses(model_config, point['local'], rows,
                                           point['global'][num_tables:], labels, weights)

    # The copied item rows belong to the user of their (user, item) pair; the
    # dense copies and the embeddings are `[G, ...]`.
    segments = sam.NormSegments(
        count=tf.shape(local[0])[0],
        row_ids={'global': [keys.user] * num_tables + [None] * len(copies.dense)})
    result = optimizer.sam_gradients_at(
        losses_at, {'global': list(copies.rows) + list(copies.dense), 'local': list(local)},
        segments=segments)
    sam_global = result.gradients['global']
    return (result.loss, result.perturbed_losses['global'], result.perturbed_losses['local'],
            result.gradients['local'], _Copies(sam_global[:num_tables], sam_global[num_tables:]))


def _local_epochs(model_config, work, optimizer, keys, items, labels, lengths, local, adam,
                  copies):
    """'model_delta': `local_epochs` epochs of SAM steps over minibatches.

    Every user steps through its own chunks of `chunk_size` examples (the
    mean loss of the chunk), moving its copy of the global part by SGD and
    its embedding by its Adam; a user with fewer chunks than the group's
    longest sits the remaining steps out.

    Returns:
      `(local, adam, copies, metric means [3 x [G]])` after the last step.
    """
    chunk = work.chunk_size
    max_len = tf.shape(items)[1]
    chunks = (lengths + chunk - 1) // chunk
    steps = tf.reduce_max(chunks) * work.local_epochs

    def body(step, local, adam, copies, totals):
        c = step % tf.reduce_max(chunks)
        start = c * chunk
        end = tf.minimum(start + chunk, max_len)
        size = tf.clip_by_value(lengths - start, 0, chunk)
        active = size > 0
        valid = tf.range(start, end)[tf.newaxis, :] < lengths[:, tf.newaxis]
        weights = tf.where(valid, 1.0 / tf.cast(tf.maximum(size, 1), tf.float32)[:, tf.newaxis],
                           0.0)
        losses, loss_sh, loss_ns, g_local, g_global = _sam_step(
            model_config, optimizer, keys, keys.position[:, start:end], local, copies,
            labels[:, start:end], weights)
        # Inactive users have zero gradients: SGD leaves them; Adam must not step.
        copies = _Copies([r - work.client_lr * g for r, g in zip(copies.rows, g_global.rows)],
                         [d - work.client_lr * g for d, g in zip(copies.dense, g_global.dense)])
        new_adam, new_local = local_training.adam_step(adam, local, g_local, work.local_lr)
        keep = lambda new, old: tf.where(_per_user(active, new), new, old)
        adam = tf.nest.map_structure(keep, new_adam, adam)
        local = [keep(n, o) for n, o in zip(new_local, local)]
        totals = [t + tf.where(active, x, 0.0) for t, x in zip(totals, (losses, loss_sh, loss_ns))]
        return step + 1, local, adam, copies, totals

    zeros = tf.zeros([tf.shape(items)[0]], tf.float32)
    _, local, adam, copies, totals = tf.while_loop(
        lambda step, *_: step < steps, body,
        (tf.constant(0), local, adam, copies, [zeros] * 3))
    taken = tf.cast(tf.maximum(chunks * work.local_epochs, 1), tf.float32)
    return local, adam, copies, [t / taken for t in totals]


def _group_update(model_config: neumf.ModelConfig, work: ClientWorkConfig):
    num_items = model_config.num_items
    optimizer = build_sam_optimizer(work)

    def update(global_weights, state, data):
        global_weights = [tf.convert_to_tensor(w) for w in global_weights]
        items, labels, lengths = (tf.convert_to_tensor(data[k])
                                  for k in ('items', 'labels', 'lengths'))
        num_users = tf.shape(items)[0]
        weights = local_training.example_weights(
            lengths, tf.shape(items)[1], loss_reduction=work.loss_reduction,
            chunk_size=work.chunk_size)
        if work.persistent:
            state = tf.nest.map_structure(tf.convert_to_tensor, as_client_state(state))
            local = list(state.local_weights)
            adam = local_training.AdamState(state.adam_step, list(state.adam_m),
                                            list(state.adam_v))
        else:
            local, adam = local_training.reconstruct(
                model_config, global_weights, items, labels, weights,
                steps=work.reconstruction_steps, learning_rate=work.local_lr)
        keys = _keys(items, num_items)
        tables, dense = neumf.split_tables(model_config, global_weights)
        copies = _Copies([tf.gather(t, keys.item) for t in tables],
                         [tf.tile(d[tf.newaxis], [num_users] + [1] * d.shape.rank)
                          for d in dense])
        if work.update == 'gradient':
            losses, loss_sh, loss_ns, g_local, user_update = _sam_step(
                model_config, optimizer, keys, keys.position, local, copies, labels, weights)
            adam, new_local = local_training.adam_step(adam, local, g_local, work.local_lr)
        else:
            new_local, adam, final, (losses, loss_sh, loss_ns) = _local_epochs(
                model_config, work, optimizer, keys, items, labels, lengths, local, adam, copies)
            user_update = tf.nest.map_structure(tf.subtract, copies, final)

        finite = tf.reduce_all(tf.stack(
            [tf.math.is_finite(x) for x in (losses, loss_sh, loss_ns)]
            + [_per_user_finite(t) for t in user_update.dense + new_local]
            + [tf.math.unsorted_segment_min(tf.cast(_per_user_finite(r), tf.int32),
                                            keys.user, num_users) > 0
               for r in user_update.rows]), axis=0)
        if work.client_weighting == 'uniform':
            user_weight = tf.ones([num_users], tf.float32)
        else:
            user_weight = tf.cast(lengths, tf.float32)
        user_weight = tf.where(finite, user_weight, 0.0)
        total = tf.reduce_sum(user_weight)
        # NaN * 0 is NaN: dropped users' values are zeroed, not only weighted.
        row_weight = tf.gather(user_weight, keys.user)[:, tf.newaxis]
        row_finite = tf.gather(finite, keys.user)[:, tf.newaxis]
        tables_update = [tf.math.divide_no_nan(tf.math.unsorted_segment_sum(
            tf.where(row_finite, r, 0.0) * row_weight, keys.item, num_items), total)
            for r in user_update.rows]
        dense_update = [tf.math.divide_no_nan(tf.reduce_sum(
            tf.where(_per_user(finite, d), d, 0.0) * _per_user(user_weight, d), axis=0), total)
            for d in user_update.dense]
        contributing = tf.reduce_sum(tf.cast(finite, tf.float32))

        def users_mean(values):
            return tf.math.divide_no_nan(tf.reduce_sum(
                tf.where(finite, tf.cast(values, tf.float32), 0.0)), contributing)

        out = collections.OrderedDict(
            update=[tf.reshape(u, g.shape) for u, g in zip(
                tables_update + dense_update, global_weights)],
            weight=total,
            dropped=num_users - tf.reduce_sum(tf.cast(finite, tf.int32)),
            users=num_users)
        if work.persistent:
            keep = lambda new, old: tf.where(_per_user(finite, new), new, old)
            out['client_state'] = ClientState(
                [keep(n, o) for n, o in zip(new_local, local)],
                keep(adam.step, state.adam_step),
                [keep(n, o) for n, o in zip(adam.m, state.adam_m)],
                [keep(n, o) for n, o in zip(adam.v, state.adam_v)])
        out['metrics'] = collections.OrderedDict(
            zip(METRIC_NAMES, [users_mean(x) for x in (losses, loss_sh, loss_ns, lengths)]))
        return out

    return update


def _single_user(group_update, work: ClientWorkConfig):
    """The device form: one user's state and batch, as the group of one."""

    def update(global_weights, state, data):
        items = tf.convert_to_tensor(data['items'])
        group_data = collections.OrderedDict(
            items=items[tf.newaxis], labels=tf.convert_to_tensor(data['labels'])[tf.newaxis],
            lengths=tf.size(items)[tf.newaxis])
        if work.persistent:
            state = as_client_state(state)
            state = state._replace(adam_step=tf.reshape(state.adam_step, [1]))
        out = group_update(global_weights, state, group_data)
        if work.persistent:
            new = out['client_state']
            out['client_state'] = new._replace(adam_step=tf.reshape(new.adam_step, []))
        return out

    return update


def build_client_update(model_config: neumf.ModelConfig, work: ClientWorkConfig, *,
                        single_user: bool = False) -> ClientUpdate:
    """Builds the client update for a group of users, or for one device.

    Args:
      model_config: The NeuMF sizes.
      work: What each user does.
      single_user: Build the one-user device form: state `[1, dim]` tables
        and a scalar Adam step, data `OrderedDict(items [N], labels [N])`.
        Otherwise a TFF client stands for any number of users: state with a
        leading user axis and padded `(items, labels, lengths)` data.

    Returns:
      A `ClientUpdate`.
    """
    fn = _group_update(model_config, work)
    if single_user:
        fn = _single_user(fn, work)
    state_type = None
    if work.persistent:
        state_type = tff.types.tensorflow_to_type(
            client_state_spec(model_config, single_user=single_user))
    return ClientUpdate(
        fn=fn, state_type=state_type,
        data_type=tff.types.tensorflow_to_type(client_data_spec(single_user=single_user)),
        work=work, single_user=single_user)
