"""Vectorized client work: one TFF client simulates a group of users.

Each user's computation is exactly that of `client_work` (one user per
client): its own base gradient, its own SAM perturbations normalized by its
own gradient norms, its own Adam step. Only the arithmetic is batched: the
dense global weights get a per-user copy (`[G, ...]`), the item embedding
rows are gathered per position (`[G, L, dim]`), and per-user sums over the
rows a user touched use segment sums over (user, item) keys. The group
uploads the (weighted) mean of its users' SAM gradients with the summed
weight, so the server's weighted mean equals the mean over users of the
one-user-per-client round. This path is for simulation; the one-user client
work stays the reference and the form to deploy.

Supports the persistent local state and the 'gradient' update; the other
modes run one user per client.

Group client state: `local_weights` (`[G, dim]` each), `adam_step` (`[G]`),
`adam_m`, `adam_v`. Group data: `items`, `labels` (`[G, L]`, padded),
`lengths` (`[G]`).
"""

import collections

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import client_work as client_work_lib
from tff_fedrecgel.models import neumf

_BETA_1, _BETA_2 = 0.9, 0.999  # TFF Adam defaults, as the one-user path.


def check_supported(work: client_work_lib.ClientWorkConfig) -> None:
    """Raises ValueError if `work` needs the one-user-per-client path."""
    if work.local_state != 'persistent' or work.update != 'gradient':
        raise ValueError(
            'vectorized client groups support local_state=persistent and '
            f'update=gradient; got {work.local_state}, {work.update}'
        )


def group_state_spec(config: neumf.ModelConfig) -> collections.OrderedDict:
    local = [
        tf.TensorSpec([None, s.shape[1]], tf.float32)
        for s in client_work_lib.local_weight_specs(config)
    ]
    return collections.OrderedDict(
        local_weights=local,
        adam_step=tf.TensorSpec([None], tf.int32),
        adam_m=list(local),
        adam_v=list(local),
    )


def group_data_spec() -> collections.OrderedDict:
    return collections.OrderedDict(
        items=tf.TensorSpec([None, None], tf.int32),
        labels=tf.TensorSpec([None, None], tf.float32),
        lengths=tf.TensorSpec([None], tf.int32),
    )


def padded_example_weights(lengths, max_len, *, loss_reduction, chunk_size):
    """`client_work.example_weights` for every row of a padded batch.

    Returns `[G, max_len]` weights, 0 on padding.
    """
    position = tf.range(max_len)[tf.newaxis, :]
    n = lengths[:, tf.newaxis]
    valid = position < n
    if loss_reduction == 'mean':
        weights = 1.0 / tf.cast(tf.maximum(n, 1), tf.float32)
    else:
        chunk = position // chunk_size
        last = (n - 1) // chunk_size
        sizes = tf.where(tf.equal(chunk, last), n - last * chunk_size, chunk_size)
        weights = 1.0 / tf.cast(tf.maximum(sizes, 1), tf.float32)
    return tf.where(valid, weights * tf.ones_like(tf.cast(position, tf.float32)), 0.0)


def _per_user(scale, tensor):
    """Broadcasts a `[G]` vector against a `[G, ...]` tensor."""
    return tf.reshape(scale, [-1] + [1] * (tensor.shape.rank - 1))


def _per_user_sum_squares(tensor):
    return tf.reduce_sum(tf.reshape(tf.square(tensor), [tf.shape(tensor)[0], -1]), axis=1)


def _per_user_finite(tensor):
    flat = tf.reshape(tensor, [tf.shape(tensor)[0], -1])
    return tf.reduce_all(tf.math.is_finite(flat), axis=1)


def _adam_step(step, weights, m, v, grads, lr):
    """TFF's Adam update with a per-user step count (bias correction per row)."""
    step = step + 1
    t = tf.cast(step, tf.float32)[:, tf.newaxis]
    normalized_lr = lr * tf.sqrt(1.0 - tf.pow(_BETA_2, t)) / (1.0 - tf.pow(_BETA_1, t))
    new_w, new_m, new_v = [], [], []
    for w, a, p, g in zip(weights, m, v, grads):
        a = a + (g - a) * (1.0 - _BETA_1)
        p = p + (tf.square(g) - p) * (1.0 - _BETA_2)
        new_w.append(w - normalized_lr * a / (tf.sqrt(p) + client_work_lib.ADAM_EPSILON))
        new_m.append(a)
        new_v.append(p)
    return step, new_w, new_m, new_v


def build_group_update_fn(config: neumf.ModelConfig, work: client_work_lib.ClientWorkConfig):
    """Returns the vectorized client update, a pure function of its inputs.

    Args:
      config: The NeuMF sizes.
      work: What each user does (persistent state, 'gradient' update).

    Returns:
      A function `(global_weights, group_state, group_data) -> OrderedDict`
      with the keys of `client_work.build_client_update_fn`'s result, where
      `users` is the group size, `dropped` counts users with non-finite
      results (their state is kept, their update excluded), `weight` is the
      summed weight of the contributing users and `update` their weighted
      mean, and `metrics` are means over the contributing users.

    Raises:
      ValueError: If `work` needs the one-user-per-client path.
    """
    check_supported(work)
    num_items = config.num_items
    eps = 1e-12
    static_zero = lambda rho: isinstance(rho, (int, float)) and rho == 0

    def group_update(global_weights, state, data):
        global_weights = [tf.convert_to_tensor(w) for w in global_weights]
        state = tf.nest.map_structure(tf.convert_to_tensor, state)
        items, labels, lengths = (
            tf.convert_to_tensor(data[k]) for k in ('items', 'labels', 'lengths'))
        num_users = tf.shape(items)[0]
        max_len = tf.shape(items)[1]
        weights = padded_example_weights(
            lengths, max_len, loss_reduction=work.loss_reduction, chunk_size=work.chunk_size
        )
        item_gmf, item_mlp, tower, prediction = neumf.split_global_weights(config, global_weights)
        dense = [t for pair in tower for t in pair] + list(prediction)
        tiled = [tf.tile(d[tf.newaxis], [num_users] + [1] * d.shape.rank) for d in dense]
        tables = [item_gmf] + ([item_mlp] if config.use_mlp else [])
        gathered = [tf.gather(t, items) for t in tables]
        local = list(state['local_weights'])

        def user_losses(local, gathered, dense):
            tower = [(dense[2 * i], dense[2 * i + 1]) for i in range(len(dense) // 2 - 1)]
            user_gmf = tf.broadcast_to(local[0][:, tf.newaxis, :], tf.shape(gathered[0]))
            user_mlp = None
            if config.use_mlp:
                user_mlp = tf.broadcast_to(local[1][:, tf.newaxis, :], tf.shape(gathered[1]))
            logits = neumf.neumf_logits(
                user_gmf, user_mlp, gathered[0],
                gathered[1] if config.use_mlp else None, tower, (dense[-2], dense[-1]),
            )
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
            return tf.reduce_sum(losses * weights, axis=1)

        def gradients(local, gathered, dense):
            with tf.GradientTape() as tape:
                tape.watch([local, gathered, dense])
                losses = user_losses(local, gathered, dense)
                total = tf.reduce_sum(losses)
            grads = tape.gradient(total, [local, gathered, dense])
            return losses, grads

        # Base pass: per-user gradients (each user's own rows and dense copy).
        losses, (g_local, g_gathered, g_dense) = gradients(local, gathered, tiled)

        # Per (user, item) rows: a user's gradient of a table row sums over
        # the positions where the user has that item.
        keys = tf.cast(tf.range(num_users)[:, tf.newaxis], tf.int64) * num_items + tf.cast(
            items, tf.int64
        )
        unique_keys, position = tf.unique(tf.reshape(keys, [-1]))
        key_user = tf.cast(unique_keys // num_items, tf.int32)
        num_keys = tf.size(unique_keys)

        def rows_of(g):
            return tf.math.unsorted_segment_sum(
                tf.reshape(g, [-1, g.shape[-1]]), position, num_keys
            )

        if static_zero(work.rho_sh):
            sam_loss_sh, sam_gathered, sam_dense = losses, g_gathered, g_dense
        else:
            rows = [rows_of(g) for g in g_gathered]
            squares = tf.add_n(
                [tf.math.unsorted_segment_sum(tf.reduce_sum(tf.square(r), 1), key_user, num_users)
                 for r in rows]
                + [_per_user_sum_squares(g) for g in g_dense]
            )
            scale = work.rho_sh / (tf.sqrt(squares) + eps)
            shape = tf.shape(items)
            perturbed_gathered = [
                x + _per_user(scale, x) * tf.reshape(
                    tf.gather(r, position), tf.concat([shape, [r.shape[-1]]], 0))
                for x, r in zip(gathered, rows)
            ]
            perturbed_dense = [x + _per_user(scale, x) * g for x, g in zip(tiled, g_dense)]
            sam_loss_sh, (_, sam_gathered, sam_dense) = gradients(
                local, perturbed_gathered, perturbed_dense
            )

        if static_zero(work.rho_ns):
            sam_loss_ns, sam_local = losses, g_local
        else:
            norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g), axis=1) for g in g_local]))
            scale = work.rho_ns / (norm + eps)
            perturbed_local = [x + scale[:, tf.newaxis] * g for x, g in zip(local, g_local)]
            sam_loss_ns, (sam_local, _, _) = gradients(perturbed_local, gathered, tiled)

        step, new_local, new_m, new_v = _adam_step(
            state['adam_step'], local, state['adam_m'], state['adam_v'], sam_local, work.local_lr
        )

        finite = tf.reduce_all(
            tf.stack(
                [tf.math.is_finite(losses), tf.math.is_finite(sam_loss_sh),
                 tf.math.is_finite(sam_loss_ns)]
                + [_per_user_finite(t) for t in sam_gathered + sam_dense + new_local]
            ),
            axis=0,
        )
        if work.client_weighting == 'uniform':
            user_weight = tf.ones([num_users], tf.float32)
        else:
            user_weight = tf.cast(lengths, tf.float32)
        user_weight = tf.where(finite, user_weight, 0.0)
        total_weight = tf.reduce_sum(user_weight)

        def weighted_mean(per_user):
            clean = tf.where(_per_user(finite, per_user) & tf.ones_like(per_user, tf.bool),
                             per_user, 0.0)
            return tf.math.divide_no_nan(
                tf.reduce_sum(clean * _per_user(user_weight, clean), axis=0), total_weight)

        table_updates = []
        flat_items = tf.reshape(items, [-1])
        for g in sam_gathered:
            clean = tf.where(
                _per_user(finite, g) & tf.ones_like(g, tf.bool), g, 0.0) * _per_user(user_weight, g)
            summed = tf.math.unsorted_segment_sum(
                tf.reshape(clean, [-1, g.shape[-1]]), flat_items, num_items)
            table_updates.append(tf.math.divide_no_nan(summed, total_weight))
        dense_updates = [tf.reshape(weighted_mean(g), d.shape) for g, d in zip(sam_dense, dense)]

        def keep_finite(new, old):
            return tf.where(_per_user(finite, new) & tf.ones_like(new, tf.bool), new, old)

        new_state = collections.OrderedDict(
            local_weights=[keep_finite(n, o) for n, o in zip(new_local, local)],
            adam_step=tf.where(finite, step, state['adam_step']),
            adam_m=[keep_finite(n, o) for n, o in zip(new_m, state['adam_m'])],
            adam_v=[keep_finite(n, o) for n, o in zip(new_v, state['adam_v'])],
        )
        contributing = tf.reduce_sum(tf.cast(finite, tf.float32))

        def users_mean(values):
            return tf.math.divide_no_nan(
                tf.reduce_sum(tf.where(finite, tf.cast(values, tf.float32), 0.0)), contributing)

        return collections.OrderedDict(
            update=table_updates + dense_updates,
            weight=total_weight,
            dropped=num_users - tf.reduce_sum(tf.cast(finite, tf.int32)),
            users=num_users,
            client_state=new_state,
            metrics=collections.OrderedDict(
                loss=users_mean(losses),
                sam_loss_global=users_mean(sam_loss_sh),
                sam_loss_local=users_mean(sam_loss_ns),
                num_examples=users_mean(lengths),
            ),
        )

    return group_update


# Padded lengths are rounded up to a multiple of this, so rounds repeat a few
# shapes instead of bringing new ones (TFF's worker keeps memory per shape).
PAD_MULTIPLE = 64


def padded_length(length: int) -> int:
    """The padded batch length of a group whose longest batch is `length`."""
    return max(1, -(-length // PAD_MULTIPLE)) * PAD_MULTIPLE


def pad_batches(batches) -> collections.OrderedDict:
    """Stacks per-user `(items, labels)` batches into one group's padded data."""
    lengths = np.array([len(i) for i, _ in batches], np.int32)
    max_len = padded_length(int(lengths.max()))
    items = np.zeros([len(batches), max_len], np.int32)
    labels = np.zeros([len(batches), max_len], np.float32)
    for row, (i, l) in enumerate(batches):
        items[row, : len(i)] = i
        labels[row, : len(l)] = l
    return collections.OrderedDict(items=items, labels=labels, lengths=lengths)
