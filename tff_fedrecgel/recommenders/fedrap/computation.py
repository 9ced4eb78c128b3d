"""FedRAP (Li et al., ICLR 2024): additive personalization, as TFF computations.

User u scores item i with `sigmoid(w_u . (C[i] + D_u[i]) + b_u)`: `C
[num_items, d]` is the global item table the server averages, `D_u` the
user's own additive item table and `(w_u, b_u)` its score function, both
kept on the device. The local loss of a minibatch is

    BCE - lam * mean((D_u[items] - C[items])^2) + mu * mean(|C[items]|)

(the means over the minibatch's rows, repeats counted, and the d columns),
minimized by SGD with weight decay on every parameter; `lam` and `mu` follow
a curriculum over rounds (`FedRAPConfig.weights`). docs/ALGORITHM.md
("FedRAP") has the round and where the authors' code differs from the paper.

  initialize() -> state@SERVER
  next(state@SERVER, users@CLIENTS, data@CLIENTS)
      -> (state@SERVER, users@CLIENTS, metrics@SERVER)

State: OrderedDict(item_table float32 [num_items, d] (C), round_num int32).
A TFF client holds a group of G users (G = 1 is a device). `users` is
OrderedDict(w [G, d], b [G], scale [G], rows [G, L, d]): the score
functions, and D_u as `scale_u * D0 + (rows D_u has on its own)`, where D0 is
the common initial personal table (every device draws it from the seed);
`rows` are D_u's rows at the round's items. Weight decay only multiplies the
rows a user does not train by a scalar, so `scale` carries them exactly.
`data` is `client_data_spec`. Only the users' C updates reach the server, as
a sum: the summed scale of the untouched rows, the summed trained rows'
changes, the number of users and the summed loss.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import personal_batches


@dataclasses.dataclass(frozen=True)
class FedRAPConfig:
    """FedRAP's client work (this module); each default is the
    default of the named argument of its authors' `train.py`
    (docs/ALGORITHM.md, "FedRAP").

    Attributes:
      latent_dim: Item embedding size (`--latent_dim`).
      score_lr: SGD learning rate of the score function (`--lr_network`).
      item_lr: SGD learning rate of both item parts C and D (`--lr_args`).
      weight_decay: SGD weight decay of every parameter
        (`--l2_regularization`).
      lam: Final weight of the term pushing D apart from C (`--lambda`).
      mu: Final weight of C's L1 term (`--mu`).
      round_decay: Both learning rates' factor per round (`--decay_rate`).
      step_decay: Both learning rates' factor per local step (the authors'
        per-minibatch `ExponentialLR(gamma=0.95)`).
      batch_size: Examples per local minibatch (`--batch_size`).
      local_epochs: Most local epochs per round (`--local_epoch`).
      tol: A user stops its local epochs once its running mean loss changes
        by less than this, relatively (`--tol`).
      curriculum: `tanh` (`--vary_param`): the weights at round r (from 0)
        are `tanh((r - 1) / 10)` times `lam`, `mu` (0 at r = 0); `fixed`:
        `lam`, `mu` from the first round.
    """

    latent_dim: int = 32
    score_lr: float = 0.5
    item_lr: float = 200.0
    weight_decay: float = 1e-4
    lam: float = 0.1
    mu: float = 0.1
    round_decay: float = 0.97
    step_decay: float = 0.95
    batch_size: int = 2048
    local_epochs: int = 10
    tol: float = 1e-4
    curriculum: str = 'tanh'

    def __post_init__(self):
        for name in ('score_lr', 'item_lr', 'round_decay', 'step_decay'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('weight_decay', 'lam', 'mu', 'tol'):
            if not 0 <= getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be non-negative and finite, got '
                                 f'{getattr(self, name)}')
        for name in ('latent_dim', 'batch_size', 'local_epochs'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')
        if self.curriculum not in ('tanh', 'fixed'):
            raise ValueError(f"curriculum must be 'tanh' or 'fixed', got {self.curriculum!r}")

    def weights(self, round_index: int) -> tuple[float, float]:
        """`(lam, mu)` of round `round_index` (from 0)."""
        if self.curriculum == 'fixed':
            return self.lam, self.mu
        factor = math.tanh((round_index - 1) / 10) if round_index > 0 else 0.0
        return factor * self.lam, factor * self.mu

    def learning_rates(self, round_index: int) -> tuple[float, float]:
        """`(score_lr, item_lr)` at the first step of round `round_index`."""
        factor = self.round_decay ** round_index
        return self.score_lr * factor, self.item_lr * factor


DEFAULT_CONFIG = FedRAPConfig()



@dataclasses.dataclass(frozen=True)
class ClientData:
    """One TFF client's round data: G users, T example slots each.

    Attributes:
      local_ids: int32 `[G, L]`: the items each user's examples touch, once
        each (padded with 0).
      local_mask: float32 `[G, L]`: 1 for a real item of `local_ids`.
      slots: int32 `[G, T]`: each example's position in `local_ids`, in
        training order; minibatch k is columns `[k * width, (k + 1) * width)`.
      labels: float32 `[G, T]`.
      mask: float32 `[G, T]`: 1 for a real example.
      epoch_batches: int32 `[G]`: minibatches in each user's epoch.
      width: int32 scalar: examples per minibatch column block.
    """

    local_ids: np.ndarray
    local_mask: np.ndarray
    slots: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    epoch_batches: np.ndarray
    width: np.ndarray

    def as_struct(self) -> collections.OrderedDict:
        return collections.OrderedDict(
            (f.name, getattr(self, f.name)) for f in dataclasses.fields(self))


def client_data_spec() -> collections.OrderedDict:
    """The TF specs of `ClientData.as_struct()` (any G, L, T)."""
    matrix = lambda dtype: tf.TensorSpec([None, None], dtype)
    return collections.OrderedDict(
        local_ids=matrix(tf.int32), local_mask=matrix(tf.float32), slots=matrix(tf.int32),
        labels=matrix(tf.float32), mask=matrix(tf.float32),
        epoch_batches=tf.TensorSpec([None], tf.int32), width=tf.TensorSpec([], tf.int32))


def user_spec(latent_dim: int) -> collections.OrderedDict:
    """The TF specs of a group's device state (module docstring)."""
    return collections.OrderedDict(
        w=tf.TensorSpec([None, latent_dim], tf.float32), b=tf.TensorSpec([None], tf.float32),
        scale=tf.TensorSpec([None], tf.float32),
        rows=tf.TensorSpec([None, None, latent_dim], tf.float32))


def hyper_spec() -> collections.OrderedDict:
    """The round's settings the server sends: learning rates, `lam`, `mu`."""
    scalar = tf.TensorSpec([], tf.float32)
    return collections.OrderedDict(score_lr=scalar, item_lr=scalar, lam=scalar, mu=scalar)


def round_hyper(config: FedRAPConfig, round_index) -> collections.OrderedDict:
    """`hyper_spec` values of round `round_index` (from 0), in TF."""
    r = tf.cast(round_index, tf.float32)
    factor = config.round_decay ** r
    if config.curriculum == 'fixed':
        ramp = tf.constant(1.0)
    else:
        ramp = tf.where(r > 0, tf.tanh((r - 1.0) / 10.0), 0.0)
    return collections.OrderedDict(
        score_lr=tf.constant(config.score_lr, tf.float32) * factor,
        item_lr=tf.constant(config.item_lr, tf.float32) * factor,
        lam=ramp * config.lam, mu=ramp * config.mu)


def initial_weights(num_items: int, config: FedRAPConfig,
                    seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The initial C, D0 and score function (the authors' layers' init).

    C and D0 are N(0, 1) (torch `Embedding`s); `w`, `b` uniform in
    +-1/sqrt(d) (a torch `Linear`).

    Returns:
      `(C [num_items, d], D0 [num_items, d], w [d], b)`, float32.
    """
    rng = np.random.default_rng([seed, 0xFE4A])
    d = config.latent_dim
    c0 = rng.standard_normal((num_items, d)).astype(np.float32)
    d0 = rng.standard_normal((num_items, d)).astype(np.float32)
    bound = 1.0 / np.sqrt(d)
    w = rng.uniform(-bound, bound, d).astype(np.float32)
    return c0, d0, w, float(np.float32(rng.uniform(-bound, bound)))


def batch_loss_grads(e_d, e_c, w, b, y, m, lam, mu):
    """A minibatch's loss and gradients for a group (no weight decay).

    Args:
      e_d, e_c: float32 `[G, B, d]`: the examples' D and C rows.
      w, b: `[G, d]`, `[G]`: the score functions.
      y, m: `[G, B]`: labels and the real-example mask.
      lam, mu: The regularizers' weights.

    Returns:
      `(loss [G], grad_d [G, B, d], grad_c [G, B, d], grad_w [G, d], grad_b
      [G])`: the per-user minibatch loss and its gradients (per example row
      for D and C, to be summed by item).
    """
    d = tf.cast(tf.shape(e_d)[2], tf.float32)
    count = tf.maximum(tf.reduce_sum(m, axis=1, keepdims=True), 1.0)  # [G, 1]
    e = e_d + e_c
    bce, g = personal_batches.bce_and_grad(tf.einsum('gbd,gd->gb', e, w) + b[:, tf.newaxis], y)
    g = g * m / count
    diff = (e_d - e_c) * m[:, :, tf.newaxis]
    cell = (count * d)[:, :, tf.newaxis]  # The regularizers' mean is over B x d cells.
    loss = (tf.reduce_sum(bce * m, axis=1) / count[:, 0]
            - lam * tf.reduce_sum(diff ** 2, axis=[1, 2]) / (count[:, 0] * d)
            + mu * tf.reduce_sum(tf.abs(e_c) * m[:, :, tf.newaxis], axis=[1, 2])
            / (count[:, 0] * d))
    g_e = g[:, :, tf.newaxis] * w[:, tf.newaxis, :]
    grad_d = g_e - lam * 2.0 * diff / cell
    grad_c = g_e + lam * 2.0 * diff / cell + mu * tf.sign(e_c) * m[:, :, tf.newaxis] / cell
    return (loss, grad_d, grad_c, tf.einsum('gb,gbd->gd', g, e), tf.reduce_sum(g, axis=1))


def make_client_update(num_items: int, config: FedRAPConfig):
    """The users' local round as a `tf.function` over a group of G users.

    Each user runs up to `local_epochs` epochs of SGD steps (the learning
    rates times `step_decay` after every step) and stops early once its
    running mean loss changes relatively by less than `tol` at an epoch's end.

    Args:
      num_items: Rows of C.
      config: The client work's settings.

    Returns:
      `update(c_table, users, data, hyper)` -> OrderedDict(users (the new
      device state), scale_sum (float32: the users' factors of C's untouched
      rows), delta (float32 `[num_items, d]`: the users' summed C minus
      `scale * c_table`, nonzero on trained rows only), users_with_data,
      loss (the sum over users of each one's mean loss), examples, steps).
    """
    d = config.latent_dim
    wd, step_decay, tol = config.weight_decay, config.step_decay, config.tol

    @tf.function(input_signature=[tf.TensorSpec([num_items, d], tf.float32), user_spec(d),
                                  client_data_spec(), hyper_spec()])
    def update(c_table, users, data, hyper):
        local_ids, local_mask = data['local_ids'], data['local_mask']
        slots, labels, mask = data['slots'], data['labels'], data['mask']
        width, epoch_batches = data['width'], data['epoch_batches']
        groups, num_local = tf.shape(local_ids)[0], tf.shape(local_ids)[1]
        c_start = tf.gather(c_table, local_ids)  # [G, L, d]
        segment_base = (tf.range(groups) * num_local)[:, tf.newaxis]
        num_batches = (tf.shape(slots)[1] + width - 1) // width
        lam, mu = hyper['lam'], hyper['mu']

        def segment(x, idx):
            out = tf.math.unsorted_segment_sum(tf.reshape(x, [-1, d]),
                                               tf.reshape(idx + segment_base, [-1]),
                                               groups * num_local)
            return tf.reshape(out, [groups, num_local, d])

        def step(k, v):
            cols = tf.range(k * width, tf.minimum((k + 1) * width, tf.shape(slots)[1]))
            idx = tf.gather(slots, cols, axis=1)
            y, m = tf.gather(labels, cols, axis=1), tf.gather(mask, cols, axis=1)
            n = tf.reduce_sum(m, axis=1)
            on = v['active'] * tf.cast(n > 0, tf.float32)  # Users stepping now.
            decay = step_decay ** v['steps']
            lr_s, lr_i = hyper['score_lr'] * decay * on, hyper['item_lr'] * decay * on
            loss, g_d, g_c, g_w, g_b = batch_loss_grads(
                tf.gather(v['rd'], idx, batch_dims=1), tf.gather(v['rc'], idx, batch_dims=1),
                v['w'], v['b'], y, m, lam, mu)
            col = lambda x: x[:, tf.newaxis, tf.newaxis]
            new = dict(v)
            new['rd'] = v['rd'] - col(lr_i) * (segment(g_d, idx) + wd * v['rd'])
            new['rc'] = v['rc'] - col(lr_i) * (segment(g_c, idx) + wd * v['rc'])
            new['w'] = v['w'] - lr_s[:, tf.newaxis] * (g_w + wd * v['w'])
            new['b'] = v['b'] - lr_s * (g_b + wd * v['b'])
            new['scale'] = v['scale'] * (1.0 - lr_i * wd)
            new['steps'] = v['steps'] + on
            new['loss_sum'] = v['loss_sum'] + on * loss * n
            new['count'] = v['count'] + on * n
            # At an epoch's end, the authors' stopping rule on the running mean.
            # tf.equal, not ==: inside TFF's graph == compares the objects.
            ends = on * tf.cast(tf.equal(tf.math.floormod(k + 1, tf.maximum(epoch_batches, 1)),
                                         0), tf.float32)
            mean = new['loss_sum'] / tf.maximum(new['count'], 1.0)
            stop = tf.logical_and(
                v['epochs'] > 0,
                tf.abs(mean - v['last']) < tol * tf.abs(v['last']))
            new['active'] = v['active'] * (1.0 - ends * tf.cast(stop, tf.float32))
            new['last'] = tf.where(ends > 0, mean, v['last'])
            new['epochs'] = v['epochs'] + ends
            return k + 1, new

        zeros = tf.zeros([groups], tf.float32)
        start = dict(rd=users['rows'], rc=c_start, w=users['w'], b=users['b'],
                     scale=tf.ones([groups]), steps=zeros, loss_sum=zeros, count=zeros,
                     active=tf.ones([groups]), last=zeros, epochs=zeros)
        _, v = tf.while_loop(lambda k, _: k < num_batches, step, (tf.constant(0), start))
        s = v['scale']
        has_data = tf.cast(v['count'] > 0, tf.float32)
        # Padded rows are left out: C_u = s_u * C + (trained rows - s_u * C).
        change = (v['rc'] - s[:, tf.newaxis, tf.newaxis] * c_start) * local_mask[:, :, tf.newaxis]
        delta = tf.math.unsorted_segment_sum(
            tf.reshape(change * has_data[:, tf.newaxis, tf.newaxis], [-1, d]),
            tf.reshape(local_ids, [-1]), num_items)
        new_users = collections.OrderedDict(w=v['w'], b=v['b'], scale=users['scale'] * s,
                                            rows=v['rd'])
        return collections.OrderedDict(
            users=new_users, scale_sum=tf.reduce_sum(s * has_data), delta=delta,
            users_with_data=tf.reduce_sum(has_data),
            loss=tf.reduce_sum(v['loss_sum'] / tf.maximum(v['count'], 1.0)),
            examples=tf.reduce_sum(v['count']), steps=tf.reduce_sum(v['steps']))

    return update


def build_fedrap_process(*, num_items: int, config: FedRAPConfig,
                         seed: int = 0) -> tff.templates.IterativeProcess:
    """FedRAP's round (types in the module docstring).

    Distributor: C and the round's settings (`round_hyper`) are broadcast.
    Client work: `make_client_update`. Aggregator: sums of the users' C
    updates. Finalizer: C becomes the unweighted mean of the participants'
    C tables, `(scale_sum * C + delta_sum) / users`; with no user holding
    data C is kept.

    Args:
      num_items: Rows of C.
      config: The client work's settings.
      seed: Seed of the initial weights (`initial_weights`).

    Returns:
      A `tff.templates.IterativeProcess`.

    Raises:
      ValueError: If `num_items` is not positive.
    """
    if num_items < 1:
        raise ValueError(f'num_items must be positive, got {num_items}')
    d = config.latent_dim
    c0, _, _, _ = initial_weights(num_items, config, seed)
    update = make_client_update(num_items, config)
    table_spec = tf.TensorSpec([num_items, d], tf.float32)
    scalar = tf.TensorSpec([], tf.float32)

    @tff.tensorflow.computation
    def server_init():
        return collections.OrderedDict(item_table=tf.constant(c0),
                                       round_num=tf.constant(0, tf.int32))

    state_type = server_init.type_signature.result

    @tff.tensorflow.computation(state_type)
    def distributor(state):
        return round_hyper(config, state['round_num'])

    client_tf = tff.tensorflow.computation(update, table_spec, user_spec(d),
                                           client_data_spec(), hyper_spec())

    @tff.tensorflow.computation(state_type, scalar, table_spec, scalar)
    def finalizer(state, scale_sum, delta_sum, users):
        mean = (scale_sum * state['item_table'] + delta_sum) / tf.maximum(users, 1.0)
        table = tf.where(users > 0, mean, state['item_table'])
        return collections.OrderedDict(item_table=table, round_num=state['round_num'] + 1)

    @tff.tensorflow.computation(scalar, scalar)
    def mean_of(total, count):
        return total / tf.maximum(count, 1.0)

    @tff.federated_computation
    def initialize():
        return tff.federated_eval(server_init, tff.SERVER)

    users_type = tff.FederatedType(tff.types.tensorflow_to_type(user_spec(d)), tff.CLIENTS)
    data_type = tff.FederatedType(tff.types.tensorflow_to_type(client_data_spec()),
                                  tff.CLIENTS)

    @tff.federated_computation(initialize.type_signature.result, users_type, data_type)
    def next_fn(state, users, data):
        table = tff.federated_broadcast(state.item_table)
        hyper = tff.federated_broadcast(tff.federated_map(distributor, state))
        out = tff.federated_map(client_tf, (table, users, data, hyper))
        count = tff.federated_sum(out.users_with_data)
        new_state = tff.federated_map(finalizer, (
            state, tff.federated_sum(out.scale_sum), tff.federated_sum(out.delta), count))
        metrics = collections.OrderedDict(
            loss=tff.federated_map(mean_of, (tff.federated_sum(out.loss), count)),
            users=count, examples=tff.federated_sum(out.examples),
            steps=tff.federated_sum(out.steps))
        return new_state, out.users, tff.federated_zip(metrics)

    return tff.templates.IterativeProcess(initialize, next_fn)


def pack_groups(batches, orders, width: int, epochs: int) -> ClientData:
    """One TFF client's `ClientData` from its users' batches.

    Args:
      batches: Each user's `(items, labels)`.
      orders: Each user's `personal_batches.epoch_orders(len, epochs, width, rng)`.
      width: Minibatch width the orders are padded to.
      epochs: Local epochs in the orders.

    Returns:
      The group's `ClientData`.
    """
    base = personal_batches.pack_groups(batches, orders, width)
    lengths = np.asarray([len(np.unique(items)) for items, _ in batches])
    local_mask = (np.arange(base.local_ids.shape[1])[None, :] < lengths[:, None])
    epoch_batches = np.asarray([len(o) // (epochs * width) for o in orders], np.int32)
    return ClientData(base.local_ids, local_mask.astype(np.float32), base.slots, base.labels,
                      base.mask, epoch_batches, np.int32(width))


def user_scores(c_table, d0, w, b, scale, resid_csr) -> np.ndarray:
    """Every item's logit for each user: `(C + scale_u D0 + P_u) . w_u + b_u`.

    Args:
      c_table, d0: float32 `[num_items, d]`: C and the initial D0.
      w, b, scale: `[n, d]`, `[n]`, `[n]`: the users' score functions and
        D0 factors.
      resid_csr: `(indptr [n + 1], items [nnz], rows [nnz, d])`: each user's
        own rows P_u (items unique per user).

    Returns:
      float32 `[n, num_items]` (the sigmoid is monotone, so logits rank).
    """
    w = np.asarray(w, np.float32)
    out = w @ np.asarray(c_table, np.float32).T
    out += np.asarray(scale, np.float32)[:, None] * (w @ np.asarray(d0, np.float32).T)
    out += np.asarray(b, np.float32)[:, None]
    indptr, items, rows = resid_csr
    owner = np.repeat(np.arange(len(w)), np.diff(indptr))
    np.add.at(out, (owner, items), np.einsum('nd,nd->n', rows, w[owner]))
    return out
