"""FedRecGEL's client update for NeuMF: a group of users at once.

`build_client_update` returns a TensorFlow function of (global weights,
client state, client data) with no hidden state. It is written over a
leading user axis: a TFF client may stand for a group of G users (the
simulation's vectorized clients), and one user's device is the group of one
(`single_user=True`, the form that is deployed and exported). The steps of
the update are `client_steps.group_update`'s, shared with every model; what
this module adds is how NeuMF evaluates a group's loss (`_NeuMFGroup`): to
perturb each user's global part separately, every user gets its own copy of
the dense layers (`[G, ...]`) and of the item embedding rows it touches (one
row per distinct (user, item) pair), and the Keras SAM optimizer runs on
those tensors (`sam_gradients_at`) with each user a norm segment of its own.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithms import client_steps
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf
from tff_fedrecgel.optimizers import sam

METRIC_NAMES = client_steps.METRIC_NAMES
ClientState = client_steps.ClientState
ClientUpdate = client_steps.ClientUpdate
as_client_state = client_steps.as_client_state
build_sam_optimizer = client_steps.build_sam_optimizer


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


def initial_embedding_chunks(model_config: neumf.ModelConfig, *, num_users: int, seed: int,
                             chunk_rows: int | None = None):
    """Every user's starting embeddings, N(0, 0.01^2), table by table in
    chunks of rows (the same numbers whatever the chunk size).

    Args:
      model_config: The model sizes.
      num_users: How many users.
      seed: Seed of the embeddings.
      chunk_rows: Rows per chunk (None: a table at once).

    Yields:
      `(table, first_row, rows)`: float32 `[rows, dim]` of local table `table`.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    step = chunk_rows or max(num_users, 1)
    for table, dim in enumerate(model_config.local_dims):
        for start in range(0, num_users, step):
            rows = min(step, num_users - start)
            yield table, start, rng.normal(0.0, neumf.EMBEDDING_STDDEV, (rows, 1, dim)
                                           ).astype(np.float32)[:, 0, :]


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
    local = [np.empty((num_users, d), np.float32) for d in model_config.local_dims]
    for table, start, rows in initial_embedding_chunks(model_config, num_users=num_users,
                                                       seed=seed):
        local[table][start:start + len(rows)] = rows
    return ClientState(local_weights=local, adam_step=np.zeros([num_users], np.int32),
                       adam_m=[np.zeros_like(t) for t in local],
                       adam_v=[np.zeros_like(t) for t in local])


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


class _NeuMFGroup:
    """A padded group of NeuMF users (`client_steps.UserGroup`).

    The point is each user's copy of the item rows it touches (then of the
    dense layers); the copied rows belong to the user of their (user, item)
    pair, the dense copies and the embeddings are `[G, ...]`.
    """

    def __init__(self, model_config: neumf.ModelConfig, work: ClientWorkConfig, data):
        self._config = model_config
        self._work = work
        self._items, self._labels, self.lengths = (
            tf.convert_to_tensor(data[k]) for k in ('items', 'labels', 'lengths'))
        self.num_users = tf.shape(self._items)[0]
        self.max_length = tf.shape(self._items)[1]
        self._keys = _keys(self._items, model_config.num_items)
        self._num_tables = len(model_config.table_dims)
        specs = neumf.global_weight_specs(model_config)
        num_dense = len(specs) - self._num_tables
        self._scaled = client_steps.asam_scaled([s.shape for s in specs])
        self.rows = ([client_steps.Rows(self._keys.user, self._keys.item)] * self._num_tables
                     + [None] * num_dense)

    def point(self, global_weights):
        tables, dense = neumf.split_tables(self._config, global_weights)
        return ([tf.gather(t, self._keys.item) for t in tables]
                + [tf.tile(d[tf.newaxis], [self.num_users] + [1] * d.shape.rank)
                   for d in dense])

    def sam(self, optimizer, point, local, part):
        num_tables = self._num_tables
        position = self._keys.position[:, part.start:part.end]
        labels = self._labels[:, part.start:part.end]

        def losses_at(at):
            rows = [tf.gather(r, position) for r in at['global'][:num_tables]]
            return local_training.group_losses(self._config, at['local'], rows,
                                               at['global'][num_tables:], labels, part.weights)

        segments = sam.NormSegments(count=self.num_users, row_ids={
            'global': [r.user if r is not None else None for r in self.rows]})
        return optimizer.sam_gradients_at(
            losses_at, {'global': list(point), 'local': list(local)}, segments=segments,
            scaled=self._scaled)

    def reconstruct(self, global_weights, weights):
        return local_training.reconstruct(
            self._config, global_weights, self._items, self._labels, weights,
            steps=self._work.reconstruction_steps, learning_rate=self._work.local_lr)


# Public names for the client works built on the same group (`global_perturbation`).
NeuMFGroup = _NeuMFGroup


def _group_update(model_config: neumf.ModelConfig, work: ClientWorkConfig):
    optimizer = build_sam_optimizer(work)

    def update(global_weights, state, data):
        return client_steps.group_update(_NeuMFGroup(model_config, work, data), work,
                                         optimizer, global_weights, state)

    return update


def _single_user(group_update, work: ClientWorkConfig):
    """The device form: one user's state and batch, as the group of one."""

    def update(global_weights, state, data):
        items = tf.convert_to_tensor(data['items'])
        group_data = collections.OrderedDict(
            items=items[tf.newaxis], labels=tf.convert_to_tensor(data['labels'])[tf.newaxis],
            lengths=tf.size(items)[tf.newaxis])
        if work.persistent:
            state = client_steps.as_group_of_one(state, add_axis=False)
        out = group_update(global_weights, state, group_data)
        if work.persistent:
            out['client_state'] = client_steps.as_device_state(out['client_state'],
                                                               drop_axis=False)
        return out

    return update


single_user_form = _single_user


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
