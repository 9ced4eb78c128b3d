"""GPFedRec (Zhang et al., KDD 2024): graph-guided personalization.

Each user has a user embedding, a score MLP on `[user embedding, item
embedding]` and its own copy of the item table, all kept on its device. A
round:

1. the server broadcasts the global item table `G`, and sends each user its
   personalized target table `T_u` (round 1: the initial table);
2. the user starts its table from `G`, trains it with its MLP and user
   embedding on its mean BCE plus `reg * mean((P_u - T_u)^2)` (one SGD step
   of all three per minibatch), and uploads its table `P_u`;
3. the server relates the users by the cosine of their flattened tables,
   keeps as neighbors of each user those past `neighborhood_threshold` times
   the graph's mean (each weighted 1/count; a user with none keeps itself),
   and sets `T_u = (A^mp_layers P)_u` and `G = mean_u T_u`.

`build_client_process` is step 2 as a TFF computation over groups of users:

  next(table@SERVER, targets@CLIENTS, locals@CLIENTS, data@CLIENTS)
      -> (locals@CLIENTS, uploads@CLIENTS, metrics@SERVER)

`targets` are `T_u`'s rows at the user's items (`[G, L, d]`): off those rows
every minibatch moves the table by the same affine step toward `T_u`, so a
user's table is exactly `c_u G + (1 - c_u) T_u` there, with one scalar
`c_u`. The upload is `(c_u, the table's rows at the user's items)`: the
server, which sent `G` and `T_u`, rebuilds `P_u` from it, so it learns what
the whole table tells it (which items the user touched included). TFF 0.87
has no intrinsic that gives the server each client's value, so uploads come
out CLIENTS-placed and `graph_aggregate` (step 3, a TensorFlow function on
the server's side) takes them: the tables of a round are over protobuf's
2 GB limit on LastFM-2K. docs/ALGORITHM.md ("GPFedRec") has where the
published code differs from the paper.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import personal_batches


@dataclasses.dataclass(frozen=True)
class GPFedRecConfig:
    """GPFedRec's round (this module); defaults are its authors'
    published settings (their train.py; docs/ALGORITHM.md, "GPFedRec").

    Attributes:
      latent_dim: User and item embedding size.
      layers: Widths of the score MLP on `[user embedding, item embedding]`
        (the first is `2 * latent_dim`).
      lr: SGD learning rate of the MLP.
      lr_eta: The user embedding's rate is `lr * lr_eta / client_fraction -
        lr`, the item table's `lr * num_items * lr_eta - lr` (the authors'
        scaling).
      reg: Weight of the mean squared distance of the user's item table to
        its personalized target.
      batch_size: Examples per local minibatch.
      local_epochs: Local epochs over the user's round batch.
      neighborhood_threshold: A user's neighbors are those whose relation
        passes `neighborhood_threshold` times the graph's mean.
      mp_layers: Message-passing steps on the user graph.
      neighbors: `'similar'` (the paper: the most similar tables) or
        `'distant'` (the published code, which ranks by cosine distance).
      client_fraction: The round's share of users (the user embedding's rate).
    """

    latent_dim: int = 32
    layers: tuple = (64, 32, 16, 8)
    lr: float = 0.1
    lr_eta: float = 80.0
    reg: float = 1.0
    batch_size: int = 256
    local_epochs: int = 1
    neighborhood_threshold: float = 1.0
    mp_layers: int = 1
    neighbors: str = 'similar'
    client_fraction: float = 1.0

    def __post_init__(self):
        for name in ('lr', 'lr_eta', 'neighborhood_threshold'):
            if not 0 < getattr(self, name) < float('inf'):
                raise ValueError(f'{name} must be positive and finite, got '
                                 f'{getattr(self, name)}')
        if not 0 <= self.reg < float('inf'):
            raise ValueError(f'reg must be >= 0 and finite, got {self.reg}')
        if not 0 < self.client_fraction <= 1:
            raise ValueError(f'client_fraction must be in (0, 1], got {self.client_fraction}')
        for name in ('latent_dim', 'batch_size', 'local_epochs', 'mp_layers'):
            if isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
                raise ValueError(f'{name} must be a positive integer, got '
                                 f'{getattr(self, name)}')
        if len(self.layers) < 2 or self.layers[0] != 2 * self.latent_dim:
            raise ValueError(f'layers must start at 2 * latent_dim = {2 * self.latent_dim}, '
                             f'got {self.layers}')
        if self.neighbors not in ('similar', 'distant'):
            raise ValueError(f"neighbors must be 'similar' or 'distant', got {self.neighbors!r}")

    def user_lr(self) -> float:
        """The user embedding's learning rate."""
        return self.lr * self.lr_eta / self.client_fraction - self.lr

    def item_lr(self, num_items: int) -> float:
        """The item table's learning rate for `num_items` items."""
        return self.lr * num_items * self.lr_eta - self.lr


DEFAULT_CONFIG = GPFedRecConfig()



@tf.custom_gradient
def _torch_bce(logit, label):
    """torch's `BCELoss` on `sigmoid(logit)`, with its gradient: logs clamped
    at -100, and a saturated prediction (p (1 - p) under 1e-12) stops
    learning instead of dividing zero by zero."""
    loss, grad = personal_batches.bce_and_grad(logit, label)
    return loss, lambda upstream: (upstream * grad, tf.zeros_like(label))


def local_spec(config: GPFedRecConfig) -> collections.OrderedDict:
    """TF specs of a group's device state: user embedding and MLP, `[G, ...]`."""
    spec = collections.OrderedDict(user=tf.TensorSpec([None, config.latent_dim], tf.float32))
    for i, (a, b) in enumerate(zip(config.layers[:-1], config.layers[1:])):
        spec[f'w{i}'] = tf.TensorSpec([None, a, b], tf.float32)
        spec[f'b{i}'] = tf.TensorSpec([None, b], tf.float32)
    spec['w_out'] = tf.TensorSpec([None, config.layers[-1]], tf.float32)
    spec['b_out'] = tf.TensorSpec([None], tf.float32)
    return spec


def initial_weights(num_items: int, config: GPFedRecConfig, seed: int):
    """The initial item table and one user's device state (the authors'
    torch layers' init: embeddings N(0, 1), linear layers uniform in
    +-1/sqrt(fan_in)); every user starts from the same state.

    Returns:
      `(item_table [num_items, d], local)`, local an OrderedDict of
      `local_spec`'s fields without the leading axis.
    """
    rng = np.random.default_rng([seed, 0x6FED])
    d = config.latent_dim
    table = rng.standard_normal((num_items, d)).astype(np.float32)
    local = collections.OrderedDict(user=rng.standard_normal(d).astype(np.float32))
    for i, (a, b) in enumerate(zip(config.layers[:-1], config.layers[1:])):
        bound = 1.0 / np.sqrt(a)
        local[f'w{i}'] = rng.uniform(-bound, bound, (a, b)).astype(np.float32)
        local[f'b{i}'] = rng.uniform(-bound, bound, b).astype(np.float32)
    bound = 1.0 / np.sqrt(config.layers[-1])
    local['w_out'] = rng.uniform(-bound, bound, config.layers[-1]).astype(np.float32)
    local['b_out'] = np.float32(rng.uniform(-bound, bound))
    return table, local


def logits(local, user, item_rows, num_hidden: int) -> tf.Tensor:
    """The MLP's logits `[G, B]` for item rows `[G, B, d]` (user `[G, d]`)."""
    x = tf.concat([tf.broadcast_to(user[:, tf.newaxis, :], tf.shape(item_rows)), item_rows],
                  axis=-1)
    for i in range(num_hidden):
        x = tf.nn.relu(tf.einsum('gba,gac->gbc', x, local[f'w{i}'])
                       + local[f'b{i}'][:, tf.newaxis, :])
    return tf.einsum('gba,ga->gb', x, local['w_out']) + local['b_out'][:, tf.newaxis]


def make_client_update(num_items: int, config: GPFedRecConfig):
    """The users' local round as a `tf.function` over a group of G users.

    Returns:
      `update(table_rows, targets, locals, data)` with `table_rows` and
      `targets` `[G, L, d]` (the global table's and the target's rows at each
      user's `data['local_ids']`) -> OrderedDict(locals, coef [G] (`c_u`),
      rows [G, L, d] (the user's table there), users, loss, examples).
    """
    batch, d = config.batch_size, config.latent_dim
    lr, user_lr, item_lr = config.lr, config.user_lr(), config.item_lr(num_items)
    # The squared distance's gradient is 2 reg (P - T) / (num_items d): each
    # minibatch takes every row a share `pull` of the way to its target.
    pull = item_lr * 2.0 * config.reg / (num_items * d)
    num_hidden = len(config.layers) - 1
    spec = local_spec(config)
    rows_spec = tf.TensorSpec([None, None, d], tf.float32)

    @tf.function(input_signature=[rows_spec, rows_spec, spec, personal_batches.client_data_spec()])
    def update(table_rows, targets, local, data):
        slots, labels, mask = data['slots'], data['labels'], data['mask']
        groups = tf.shape(slots)[0]
        num_batches = (tf.shape(slots)[1] + batch - 1) // batch

        def step(k, local, rows, coef, loss_sum):
            cols = tf.range(k * batch, tf.minimum((k + 1) * batch, tf.shape(slots)[1]))
            idx = tf.gather(slots, cols, axis=1)
            y, m = tf.gather(labels, cols, axis=1), tf.gather(mask, cols, axis=1)
            count = tf.reduce_sum(m, axis=1)
            live = tf.cast(count > 0, tf.float32)  # Users whose minibatch k exists.
            scale = m / tf.maximum(count, 1.0)[:, tf.newaxis]
            with tf.GradientTape() as tape:
                tape.watch([local, rows])
                bce = _torch_bce(logits(local, local['user'],
                                        tf.gather(rows, idx, batch_dims=1), num_hidden), y)
                loss = tf.reduce_sum(bce * scale)
            grads, grad_rows = tape.gradient(loss, [local, rows])
            grad_rows = tf.convert_to_tensor(grad_rows)

            def moved(name, value):
                rate = user_lr if name == 'user' else lr
                on = tf.reshape(live, [-1] + [1] * (len(value.shape) - 1))
                return value - on * rate * grads[name]

            new_local = collections.OrderedDict((n, moved(n, v)) for n, v in local.items())
            on = live[:, tf.newaxis, tf.newaxis]
            rows = rows - on * (pull * (rows - targets) + item_lr * grad_rows)
            coef = coef * (1.0 - live * pull)
            return k + 1, new_local, rows, coef, loss_sum + tf.reduce_sum(bce * m, axis=1)

        _, local, rows, coef, loss_sum = tf.while_loop(
            lambda k, *_: k < num_batches, step,
            (tf.constant(0), local, table_rows, tf.ones([groups], tf.float32),
             tf.zeros([groups], tf.float32)))
        examples = tf.reduce_sum(mask, axis=1)
        return collections.OrderedDict(
            locals=local, coef=coef, rows=rows,
            users=tf.reduce_sum(tf.cast(examples > 0, tf.float32)),
            loss=tf.reduce_sum(loss_sum / tf.maximum(examples, 1.0)),
            examples=tf.reduce_sum(examples))

    return update


def build_client_process(*, num_items: int, config: GPFedRecConfig):
    """Step 2 of the round as a TFF computation (types in the module docstring).

    Returns:
      A `tff.Computation` `(table@SERVER, targets@CLIENTS, locals@CLIENTS,
      data@CLIENTS) -> (locals@CLIENTS, uploads@CLIENTS, metrics@SERVER)`;
      `uploads` is OrderedDict(coef, rows).

    Raises:
      ValueError: If `num_items` is not positive.
    """
    if num_items < 1:
        raise ValueError(f'num_items must be positive, got {num_items}')
    d = config.latent_dim
    update = make_client_update(num_items, config)
    table_spec = tf.TensorSpec([num_items, d], tf.float32)
    rows_spec = tf.TensorSpec([None, None, d], tf.float32)

    @tff.tensorflow.computation(table_spec, rows_spec, local_spec(config),
                                personal_batches.client_data_spec())
    def client_tf(table, targets, local, data):
        out = update(tf.gather(table, data['local_ids']), targets, local, data)
        return (out['locals'], collections.OrderedDict(coef=out['coef'], rows=out['rows']),
                collections.OrderedDict(users=out['users'], loss=out['loss'],
                                        examples=out['examples']))

    @tff.tensorflow.computation(tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
    def mean_of(total, count):
        return total / tf.maximum(count, 1.0)

    def at_clients(spec):
        return tff.FederatedType(tff.types.tensorflow_to_type(spec), tff.CLIENTS)

    @tff.federated_computation(tff.FederatedType(tff.types.tensorflow_to_type(table_spec),
                                                 tff.SERVER),
                               at_clients(rows_spec), at_clients(local_spec(config)),
                               at_clients(personal_batches.client_data_spec()))
    def next_fn(table, targets, local, data):
        new_local, uploads, out = tff.federated_map(
            client_tf, (tff.federated_broadcast(table), targets, local, data))
        users = tff.federated_sum(out.users)
        metrics = collections.OrderedDict(
            loss=tff.federated_map(mean_of, (tff.federated_sum(out.loss), users)),
            users=users, examples=tff.federated_sum(out.examples))
        return new_local, uploads, tff.federated_zip(metrics)

    return next_fn


# Columns of the users' flattened tables handled at once by the graph step
# (about 256 MB of a round's rows, so no second copy of the tables is made).
_CHUNK_BYTES = 1 << 28


def _chunks(flat: np.ndarray, rows: np.ndarray):
    width = max(1, _CHUNK_BYTES // (4 * max(1, len(rows))))
    for start in range(0, flat.shape[1], width):
        yield slice(start, min(start + width, flat.shape[1]))


def _row_index(rows: np.ndarray) -> slice | np.ndarray:
    """`rows` as a slice when they are consecutive (every user in the round,
    the authors' setting): `flat[slice, cols]` is a view, where an index
    array copies each block, which made the Gram matrix 1.2-2.1x slower
    (`launch/benchmark_gpfedrec.py`)."""
    rows = np.asarray(rows)
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and (np.diff(rows) == 1).all():
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def rows_gram(flat: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`flat[rows] @ flat[rows].T` (float64 `[n, n]`), a column block at a time."""
    gram = np.zeros((len(rows), len(rows)), np.float64)
    index = _row_index(rows)
    for cols in _chunks(flat, rows):
        block = flat[index, cols]
        gram += block @ block.T
    return gram


def relation_graph(gram: np.ndarray, config: GPFedRecConfig) -> np.ndarray:
    """The user-relation graph `A [n, n]` (rows sum to 1) from the Gram
    matrix of the users' flattened tables.

    Each user's neighbors are those whose relation (the cosine, or with
    `neighbors='distant'` the cosine distance) passes `neighborhood_threshold`
    times the mean relation; each gets weight 1/count, and a user with none
    keeps itself.
    """
    norms = np.maximum(np.sqrt(np.maximum(np.diag(gram), 0.0)), 1e-12)
    cosine = gram / norms[:, None] / norms[None, :]
    relation = cosine if config.neighbors == 'similar' else 1.0 - cosine
    linked = relation > relation.mean() * config.neighborhood_threshold
    counts = linked.sum(axis=1)
    lonely = counts == 0
    linked[lonely, lonely.nonzero()[0]] = True
    return (linked / np.maximum(counts, 1)[:, None]).astype(np.float32)


def user_graph(tables: np.ndarray, config: GPFedRecConfig) -> np.ndarray:
    """`relation_graph` of the participants' flattened tables `[n, num_items * d]`."""
    flat = np.asarray(tables, np.float32)
    return relation_graph(rows_gram(flat, np.arange(len(flat))), config)


def propagation(graph: np.ndarray, config: GPFedRecConfig) -> np.ndarray:
    """`A^mp_layers`: each participant's target is this matrix's row times the tables."""
    return np.linalg.matrix_power(graph.astype(np.float64), config.mp_layers).astype(np.float32)


def rows_transform(flat: np.ndarray, rows: np.ndarray, matrix: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
    """`matrix @ flat[rows]`, a column block at a time, into `out` (None:
    back into `flat[rows]`, in place). Unlike the Gram matrix it copies each
    block, consecutive rows too: read in place it measured no faster
    (`launch/benchmark_gpfedrec.py`)."""
    for cols in _chunks(flat, rows):
        result = matrix @ flat[rows, cols]
        if out is None:
            flat[rows, cols] = result
        else:
            out[:, cols] = result
    return flat if out is None else out


def graph_aggregate(tables: np.ndarray, config: GPFedRecConfig):
    """Step 3 on a round's tables, all at once (the adapter runs the same
    steps in place, a block at a time).

    Args:
      tables: float32 `[n, num_items, d]`, the participants' tables `P_u`.
      config: The graph's settings.

    Returns:
      `(targets [n, num_items, d], global_table [num_items, d])`.
    """
    n = tables.shape[0]
    flat = np.ascontiguousarray(tables, np.float32).reshape(n, -1)
    power = propagation(user_graph(flat, config), config)
    targets = rows_transform(flat, np.arange(n), power, out=np.empty_like(flat))
    return targets.reshape(tables.shape), targets.mean(axis=0).reshape(tables.shape[1:])
