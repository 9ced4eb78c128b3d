"""FedRecGEL's client update, written once over a group of users.

A TFF client stands for a group of G users (the simulation's vectorized
clients) or for one user's device (the group of one). Per round each user,
independently of the others in its group (docs/ALGORITHM.md, steps 3-8):

1. starts from its state, or rebuilds its local part (reconstruct mode);
2. takes the SAM gradients of its copy of the global part and of its local
   part, by the Keras SAM optimizer (`optimizers/sam.py`): group 'global' at
   rho_sh, group 'local' at rho_ns, each user a norm segment of its own;
3. steps its local part by its local Adam;
4. uploads the global part's SAM gradient ('gradient') or, after
   `local_epochs` epochs of such steps over minibatches with SGD on its copy
   of the global part, that copy's change ('model_delta').

The group uploads the weighted mean of its users' updates with their summed
weight, so the server's weighted mean over TFF clients is the mean over users
whatever the grouping; a user whose values are not finite is dropped (weight
0, state kept).

What differs between models is only how a group's loss and its SAM
gradients are evaluated: a `UserGroup` says that, for a model whose structure
it knows (`client_update.py`, NeuMF over a padded group) or for any
`tff.learning.models.ReconstructionModel` on its own variables
(`model_client_work.py`, one user).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import dataclasses
from typing import Any, NamedTuple, Protocol

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithms import local_training
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
      local_weights: The local part's tensors (`[G, dim]` tables for a group
        of NeuMF users, the model's local variables' shapes on a device).
      adam_step: int32 `[G]` (a scalar on a device): local Adam steps taken.
      adam_m: The local Adam's first moments, shaped like `local_weights`.
      adam_v: Its second moments.
    """

    local_weights: list
    adam_step: Any
    adam_m: list
    adam_v: list

    __getitem__ = item_or_field


def as_client_state(state) -> ClientState:
    """A `ClientState` from itself or a mapping with its field names."""
    if isinstance(state, ClientState):
        return state
    if hasattr(state, 'keys'):
        return ClientState(**{k: state[k] for k in ClientState._fields})
    return ClientState(*state)


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
      data_type: The type of `client_data`.
      work: The configuration it was built from.
      single_user: Whether this is a one-user device form.
    """

    fn: Callable[..., collections.OrderedDict]
    state_type: tff.Type | None
    data_type: tff.Type
    work: ClientWorkConfig
    single_user: bool


def build_sam_optimizer(work: ClientWorkConfig) -> sam.SharpnessAwareMinimization:
    """The client work's Keras SAM optimizer: 'global' at rho_sh, 'local' at rho_ns.

    With `work.sam_eta`, the global group is adaptive (ASAM).
    """
    return sam.SharpnessAwareMinimization(
        rho={'global': work.rho_sh, 'local': work.rho_ns},
        adaptive_eta=None if work.sam_eta is None else {'global': work.sam_eta})


def asam_scaled(global_shapes) -> dict[str, list[bool]]:
    """Which global tensors ASAM scales: weight matrices and embeddings, not biases."""
    return {'global': [len(shape) >= 2 for shape in global_shapes]}


class Rows(NamedTuple):
    """A copy of some rows of a global table, each row owned by one user."""

    user: tf.Tensor   # int32 [K]: the row's user (its place in the group).
    index: tf.Tensor  # int32 [K]: the row's index in the global table.


class Part(NamedTuple):
    """The slice of the users' batches a loss is taken on."""

    start: Any         # First batch position.
    end: Any           # One past the last.
    weights: tf.Tensor  # float32 [G, end - start]: example weights, 0 on padding.


class UserGroup(Protocol):
    """How a group of users' loss and its SAM gradients are evaluated.

    The point is each user's own copy of the global part, one tensor per
    global weight in its order: `[G, ...]` (a dense copy per user), or `[K,
    ...]` rows of a table (`rows` gives each row's user and table index).
    """

    num_users: tf.Tensor
    lengths: tf.Tensor     # int32 [G]: each user's number of examples.
    max_length: tf.Tensor  # The batches' padded length.
    rows: list             # Per point tensor: a `Rows`, or None for `[G, ...]`.

    def point(self, global_weights: list[tf.Tensor]) -> list[tf.Tensor]:
        """Each user's copy of the global part."""

    def sam(self, optimizer: sam.SharpnessAwareMinimization, point: list[tf.Tensor],
            local: list[tf.Tensor], part: Part) -> sam.SamGradients:
        """Per-user losses `[G]` and SAM gradients of groups 'global' and 'local'."""

    def reconstruct(self, global_weights: list[tf.Tensor], weights: tf.Tensor
                    ) -> tuple[list[tf.Tensor], local_training.AdamState]:
        """The local parts rebuilt from zeros, the global part fixed."""


def per_user(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Broadcasts a `[G]` vector against a `[G, ...]` tensor."""
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _per_user_finite(values: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(tf.reshape(values, [tf.shape(values)[0], -1])),
                         axis=1)


def _sam_outputs(result: sam.SamGradients):
    return (result.loss, result.perturbed_losses['global'], result.perturbed_losses['local'],
            result.gradients['local'], result.gradients['global'])


def _local_epochs(group: UserGroup, work: ClientWorkConfig, optimizer, point, local, adam):
    """'model_delta': `local_epochs` epochs of SAM steps over minibatches.

    Every user steps through its own chunks of `chunk_size` examples (the
    mean loss of the chunk), moving its copy of the global part by SGD and
    its local part by its Adam; a user with fewer chunks than the group's
    longest sits the remaining steps out.

    Returns:
      `(local, adam, point, metric means [3 x [G]])` after the last step.
    """
    chunk = work.chunk_size
    lengths = group.lengths
    chunks = (lengths + chunk - 1) // chunk
    steps = tf.reduce_max(chunks) * work.local_epochs

    def body(step, local, adam, point, totals):
        before = (local, adam, point, totals)
        c = step % tf.reduce_max(chunks)
        start = c * chunk
        end = tf.minimum(start + chunk, group.max_length)
        size = tf.clip_by_value(lengths - start, 0, chunk)
        active = size > 0
        valid = tf.range(start, end)[tf.newaxis, :] < lengths[:, tf.newaxis]
        weights = tf.where(valid, 1.0 / tf.cast(tf.maximum(size, 1), tf.float32)[:, tf.newaxis],
                           0.0)
        losses, loss_sh, loss_ns, g_local, g_global = _sam_outputs(
            group.sam(optimizer, point, local, Part(start, end, weights)))
        # Inactive users have zero gradients: SGD leaves them; Adam must not step.
        point = [p - work.client_lr * g for p, g in zip(point, g_global)]
        new_adam, new_local = local_training.adam_step(adam, local, g_local, work.local_lr)
        keep = lambda new, old: tf.where(per_user(active, new), new, old)
        adam = tf.nest.map_structure(keep, new_adam, adam)
        local = [keep(n, o) for n, o in zip(new_local, local)]
        totals = [t + tf.where(active, x, 0.0) for t, x in zip(totals, (losses, loss_sh, loss_ns))]
        # The gradients' user axis is unknown when one user's is 1: keep the
        # loop's shapes (the device form traces with [1, ...] state).
        local, adam, point, totals = tf.nest.map_structure(
            lambda new, old: tf.ensure_shape(new, old.shape), (local, adam, point, totals),
            before)
        return step + 1, local, adam, point, totals

    zeros = tf.zeros([group.num_users], tf.float32)
    _, local, adam, point, totals = tf.while_loop(
        lambda step, *_: step < steps, body, (tf.constant(0), local, adam, point, [zeros] * 3))
    taken = tf.cast(tf.maximum(chunks * work.local_epochs, 1), tf.float32)
    return local, adam, point, [t / taken for t in totals]


def _finite_users(group: UserGroup, values, update, new_local) -> tf.Tensor:
    """bool `[G]`: whether all of a user's losses, update and local part are finite."""
    dense = [u for u, rows in zip(update, group.rows) if rows is None]
    checks = ([tf.math.is_finite(x) for x in values]
              + [_per_user_finite(t) for t in dense + list(new_local)]
              + [tf.math.unsorted_segment_min(tf.cast(_per_user_finite(u), tf.int32),
                                              rows.user, group.num_users) > 0
                 for u, rows in zip(update, group.rows) if rows is not None])
    return tf.reduce_all(tf.stack(checks), axis=0)


def _weighted_mean(group: UserGroup, update, like, user_weight, finite, total):
    """The weighted mean over the group's users of each global tensor's update."""
    out = []
    for u, rows, g in zip(update, group.rows, like):
        # NaN * 0 is NaN: dropped users' values are zeroed, not only weighted.
        if rows is None:
            mean = tf.math.divide_no_nan(tf.reduce_sum(
                tf.where(per_user(finite, u), u, 0.0) * per_user(user_weight, u), axis=0), total)
        else:
            row_weight = tf.gather(user_weight, rows.user)[:, tf.newaxis]
            row_finite = tf.gather(finite, rows.user)[:, tf.newaxis]
            mean = tf.math.divide_no_nan(tf.math.unsorted_segment_sum(
                tf.where(row_finite, u, 0.0) * row_weight, rows.index, g.shape[0]), total)
        out.append(tf.reshape(mean, g.shape))
    return out


def group_update(group: UserGroup, work: ClientWorkConfig,
                 optimizer: sam.SharpnessAwareMinimization, global_weights, state
                 ) -> collections.OrderedDict:
    """One round of a group's users (steps 1-4 above).

    Args:
      group: The users, their data and how their loss is evaluated.
      work: What each user does.
      optimizer: The Keras SAM optimizer (`build_sam_optimizer`).
      global_weights: The received global weights.
      state: A `ClientState` with a leading user axis (persistent mode).

    Returns:
      The `ClientUpdate.fn` outputs for the group.
    """
    global_weights = [tf.convert_to_tensor(w) for w in global_weights]
    num_users = group.num_users
    lengths = group.lengths
    weights = local_training.example_weights(
        lengths, group.max_length, loss_reduction=work.loss_reduction,
        chunk_size=work.chunk_size)
    if work.persistent:
        state = tf.nest.map_structure(tf.convert_to_tensor, as_client_state(state))
        local = list(state.local_weights)
        adam = local_training.AdamState(state.adam_step, list(state.adam_m), list(state.adam_v))
    else:
        local, adam = group.reconstruct(global_weights, weights)
    point = group.point(global_weights)
    if work.update == 'gradient':
        losses, loss_sh, loss_ns, g_local, user_update = _sam_outputs(
            group.sam(optimizer, point, local, Part(0, group.max_length, weights)))
        adam, new_local = local_training.adam_step(adam, local, g_local, work.local_lr)
    else:
        new_local, adam, final, (losses, loss_sh, loss_ns) = _local_epochs(
            group, work, optimizer, point, local, adam)
        user_update = [p - f for p, f in zip(point, final)]

    finite = _finite_users(group, (losses, loss_sh, loss_ns), user_update, new_local)
    if work.client_weighting == 'uniform':
        user_weight = tf.ones([num_users], tf.float32)
    else:
        user_weight = tf.cast(lengths, tf.float32)
    user_weight = tf.where(finite, user_weight, 0.0)
    total = tf.reduce_sum(user_weight)
    contributing = tf.reduce_sum(tf.cast(finite, tf.float32))

    def users_mean(values):
        return tf.math.divide_no_nan(tf.reduce_sum(
            tf.where(finite, tf.cast(values, tf.float32), 0.0)), contributing)

    out = collections.OrderedDict(
        update=_weighted_mean(group, user_update, global_weights, user_weight, finite, total),
        weight=total,
        dropped=num_users - tf.reduce_sum(tf.cast(finite, tf.int32)),
        users=num_users)
    if work.persistent:
        keep = lambda new, old: tf.where(per_user(finite, new), new, old)
        out['client_state'] = ClientState(
            [keep(n, o) for n, o in zip(new_local, local)],
            keep(adam.step, state.adam_step),
            [keep(n, o) for n, o in zip(adam.m, state.adam_m)],
            [keep(n, o) for n, o in zip(adam.v, state.adam_v)])
    out['metrics'] = collections.OrderedDict(
        zip(METRIC_NAMES, [users_mean(x) for x in (losses, loss_sh, loss_ns, lengths)]))
    return out


def as_group_of_one(state: ClientState, *, add_axis: bool) -> ClientState:
    """A device's state as the group of one: a `[1]` Adam step (and `[1, ...]` tensors)."""
    state = as_client_state(state)
    expand = (lambda t: tf.convert_to_tensor(t)[tf.newaxis]) if add_axis else (lambda t: t)
    return ClientState([expand(t) for t in state.local_weights],
                       tf.reshape(state.adam_step, [1]),
                       [expand(t) for t in state.adam_m], [expand(t) for t in state.adam_v])


def as_device_state(state: ClientState, *, drop_axis: bool) -> ClientState:
    """The inverse of `as_group_of_one`."""
    shrink = (lambda t: t[0]) if drop_axis else (lambda t: t)
    return ClientState([shrink(t) for t in state.local_weights],
                       tf.reshape(state.adam_step, []),
                       [shrink(t) for t in state.adam_m], [shrink(t) for t in state.adam_v])
