"""FedRAP behind the driver's protocol.

The round is `computation.py`'s TFF process. By default one TFF
client simulates a group of users (vectorized; each user's steps are its
own); `--simulation=per_user` runs one user per client. What a device keeps,
its score function `(w_u, b_u)` and its additive table D_u, the adapter
stores for all users, D_u as `scale_u * D0 + P_u` with P_u only on the items
the user ever trained (never a `[num_items, d]` table per user).

Serving: a training user scores item i as `(C[i] + D_u[i]) . w_u + b_u` with
the current global C; a user that never trained (held out, or new) first
runs one local round from the initial D0 and score function on the current
C and its own items (the settings of the coming round), and is scored with
the result; nothing of it is uploaded.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import personal_batches
from tff_fedrecgel.data import batching
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.recommenders.fedrap import computation as fedrap

# Salt of a user's shuffling stream, apart from the driver's batch draws.
_ORDER_SALT = 0xFA4A


class FedRAP:
    """FedRAP over a population (an `Algorithm` of the driver)."""

    def __init__(self, *, model_config, num_users: int, seed: int = 0,
                 config: fedrap.FedRAPConfig = fedrap.DEFAULT_CONFIG,
                 reconstruction=None, grouped: bool = True,
                 max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES):
        """Builds the TFF process.

        Args:
          model_config: Only `num_items` is used (the driver checks it).
          num_users: Users of the split (every one gets a device state).
          seed: Seed of the initial weights and the local shuffling.
          config: The client work's settings.
          reconstruction: Kept for the driver's protocol (unused: new users
            run a local round instead).
          grouped: Simulate several users per TFF client.
          max_group_examples: With `grouped`, example slots per TFF client
            stay under this unless one user alone exceeds it.

        Raises:
          ValueError: On inconsistent settings.
        """
        if max_group_examples < 1:
            raise ValueError('max_group_examples must be positive')
        self.model_config = model_config
        self.reconstruction = reconstruction
        self.item_scores = None
        self.config = config
        self.num_items = model_config.num_items
        self.num_users = int(num_users)
        self.seed = int(seed)
        self.grouped = grouped
        self.max_group_examples = max_group_examples
        self.process = fedrap.build_fedrap_process(num_items=self.num_items, config=config,
                                                   seed=seed)
        self._update = fedrap.make_client_update(self.num_items, config)
        _, self.d0, self._w0, self._b0 = fedrap.initial_weights(self.num_items, config, seed)
        self.state = None
        self.w = self.b = self.scale = None
        self._items: list[np.ndarray] = []
        self._resid: list[np.ndarray] = []
        self._new_users = {}

    def initialize(self) -> None:
        self.state = self.process.initialize()
        d = self.config.latent_dim
        self.w = np.tile(self._w0, (self.num_users, 1))
        self.b = np.full(self.num_users, self._b0, np.float32)
        self.scale = np.ones(self.num_users, np.float32)
        self._items = [np.zeros(0, np.int32)] * self.num_users
        self._resid = [np.zeros((0, d), np.float32)] * self.num_users
        self._new_users = {}

    @property
    def round_num(self) -> int:
        return int(self.state['round_num'])

    def _pack(self, users, batches, round_num, groups) -> list[tuple[list[int], fedrap.ClientData]]:
        epochs, out = self.config.local_epochs, []
        for g in groups:
            # One minibatch per epoch for groups of short users: no padding to 2048.
            width = max(1, min(self.config.batch_size, max(len(batches[i][0]) for i in g)))
            orders = [personal_batches.epoch_orders(
                len(batches[i][0]), epochs, width,
                np.random.default_rng([self.seed, round_num, int(users[i]), _ORDER_SALT]))
                for i in g]
            out.append((g, fedrap.pack_groups([batches[i] for i in g], orders, width, epochs)))
        return out

    def _client_data(self, users, batches, round_num):
        """The round's TFF clients: (positions in `users`, their data)."""
        if self.grouped:
            lengths = [len(items) * self.config.local_epochs for items, _ in batches]
            groups = batching.group_by_length(lengths, max_examples=self.max_group_examples,
                                              multiple=1)
        else:
            groups = [[i] for i in range(len(users))]
        return self._pack(users, batches, round_num, groups)

    def _device_rows(self, users: np.ndarray, data: fedrap.ClientData) -> np.ndarray:
        """D_u's rows at the group's items, `[G, L, d]`."""
        rows = self.scale[users][:, None, None] * self.d0[data.local_ids]
        for i, u in enumerate(users):
            items = self._items[u]
            if len(items):
                ids = data.local_ids[i]
                pos = np.minimum(np.searchsorted(items, ids), len(items) - 1)
                hit = (items[pos] == ids) & (data.local_mask[i] > 0)
                rows[i, hit] += self._resid[u][pos[hit]]
        return rows

    def _keep(self, users: np.ndarray, data: fedrap.ClientData, new) -> None:
        """Stores the group's new device state (P_u on the union of items)."""
        new_scale = np.asarray(new['scale'], np.float32)
        factor = new_scale / self.scale[users]
        rows = np.asarray(new['rows'], np.float32)
        self.w[users] = np.asarray(new['w'])
        self.b[users] = np.asarray(new['b'])
        for i, u in enumerate(users):
            n = int(data.local_mask[i].sum())
            ids = data.local_ids[i, :n]
            trained = rows[i, :n] - new_scale[i] * self.d0[ids]
            old_items, old = self._items[u], self._resid[u] * factor[i]
            keep = ~np.isin(old_items, ids)
            items = np.concatenate([old_items[keep], ids])
            order = np.argsort(items, kind='stable')
            self._items[u] = items[order].astype(np.int32)
            self._resid[u] = np.concatenate([old[keep], trained])[order]
        self.scale[users] = new_scale

    def _users_struct(self, users: np.ndarray, data: fedrap.ClientData):
        return collections.OrderedDict(w=self.w[users], b=self.b[users],
                                       scale=self.scale[users],
                                       rows=self._device_rows(users, data))

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict[str, float]:
        clients = self._client_data(users, batches, self.round_num + 1)
        users = np.asarray(users, np.int64)
        states = [self._users_struct(users[g], data) for g, data in clients]
        state, new_users, metrics = self.process.next(
            self.state, states, [data.as_struct() for _, data in clients])
        self.state = state
        for (g, data), new in zip(clients, new_users):
            self._keep(users[g], data, new)
        self._new_users = {}
        return {'loss': float(metrics['loss']), 'examples': float(metrics['examples']),
                'local_steps': float(metrics['steps']), 'tff_clients': float(len(clients))}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(self.state['item_table'])]

    def local_tables(self) -> None:
        return None  # Users keep score functions and additive item tables, not embeddings.

    def projector_tables(self) -> dict[str, np.ndarray]:
        """The item tables TensorBoard's projector shows."""
        return {'item': self.global_weights[0]}

    def _csr(self, users: Sequence[int]):
        items = [self._items[u] for u in users]
        indptr = np.concatenate([[0], np.cumsum([len(i) for i in items])]).astype(np.int64)
        d = self.config.latent_dim
        return (indptr, np.concatenate(items) if items else np.zeros(0, np.int32),
                np.concatenate([self._resid[u] for u in users]) if items
                else np.zeros((0, d), np.float32))

    def dense_personal(self, user: int) -> np.ndarray:
        """User `user`'s whole D_u, `[num_items, d]` (for checks)."""
        table = self.scale[user] * self.d0
        table[self._items[user]] += self._resid[user]
        return table

    def fit_new_users(self, users: Sequence[int], batches: Sequence[Batch]):
        """New users' models: one local round from D0 and the initial score
        function on the current C (nothing is uploaded).

        Returns:
          `(w [n, d], b [n], scale [n], resid_csr)` as `fedrap.user_scores`
          takes.
        """
        key = (self.round_num, tuple(int(u) for u in users))
        if key in self._new_users:
            return self._new_users[key]
        users = np.asarray(users, np.int64)
        (_, data), = self._pack(users, list(batches), 0, [list(range(len(users)))])
        n = len(users)
        device = collections.OrderedDict(
            w=np.tile(self._w0, (n, 1)), b=np.full(n, self._b0, np.float32),
            scale=np.ones(n, np.float32), rows=self.d0[data.local_ids])
        hyper = fedrap.round_hyper(self.config, self.round_num)
        out = self._update(tf.constant(self.global_weights[0]),
                           {k: tf.constant(v) for k, v in device.items()},
                           {k: tf.constant(v) for k, v in data.as_struct().items()}, hyper)
        new = out['users']
        scale = new['scale'].numpy()
        rows = new['rows'].numpy()
        lengths = data.local_mask.sum(axis=1).astype(np.int64)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.concatenate([data.local_ids[i, :m] for i, m in enumerate(lengths)])
        resid = np.concatenate([rows[i, :m] - scale[i] * self.d0[data.local_ids[i, :m]]
                                for i, m in enumerate(lengths)])
        self._new_users = {key: (new['w'].numpy(), new['b'].numpy(), scale,
                                 (indptr, items, resid))}
        return self._new_users[key]

    def score_items(self, users: Sequence[int], batches: Sequence[Batch] | None) -> np.ndarray:
        """Every item's score for `users` (the driver's per-user scoring).

        Args:
          users: User indices.
          batches: None for training users (their stored models); for users
            that never trained, their batches (`fit_new_users`).

        Returns:
          float32 `[len(users), num_items]`.
        """
        users = np.asarray(users, np.int64)
        if batches is None:
            w, b, scale, csr = self.w[users], self.b[users], self.scale[users], self._csr(users)
        else:
            w, b, scale, csr = self.fit_new_users(users, batches)
        return fedrap.user_scores(self.global_weights[0], self.d0, w, b, scale, csr)

    def get_state(self) -> collections.OrderedDict:
        indptr, items, rows = self._csr(range(self.num_users))
        return collections.OrderedDict(
            server=[np.asarray(x) for x in tf.nest.flatten(self.state)],
            w=self.w.copy(), b=self.b.copy(), scale=self.scale.copy(), resid_indptr=indptr,
            resid_items=np.asarray(items, np.int32), resid_rows=np.asarray(rows, np.float32))

    def restore(self, state) -> None:
        self.state = tf.nest.pack_sequence_as(self.process.initialize(),
                                              [np.asarray(x) for x in state['server']])
        self.w = np.array(state['w'], np.float32)
        self.b = np.array(state['b'], np.float32)
        self.scale = np.array(state['scale'], np.float32)
        indptr = np.asarray(state['resid_indptr'], np.int64)
        items = np.asarray(state['resid_items'], np.int32)
        rows = np.asarray(state['resid_rows'], np.float32).reshape(-1, self.config.latent_dim)
        self._items = [items[indptr[u]:indptr[u + 1]] for u in range(self.num_users)]
        self._resid = [rows[indptr[u]:indptr[u + 1]] for u in range(self.num_users)]
        self._new_users = {}


def build(method, context) -> FedRAP:
    """FedRAP's algorithm (its `methods.Method.builder`), at its authors'
    settings (`fedrap.DEFAULT_CONFIG`), their rates scaled by `lr_scale`.

    Args:
      method: The `methods.Method`.
      context: The run's `simulation.context.BuildContext`; its
        `work.lr_scale` scales the authors' rates.
    """
    del method
    scale, authors = context.work.lr_scale, fedrap.DEFAULT_CONFIG
    config = dataclasses.replace(authors, score_lr=authors.score_lr * scale,
                                 item_lr=authors.item_lr * scale)
    return FedRAP(
        model_config=context.model_config, num_users=context.split.num_users,
        seed=context.seed, reconstruction=context.work, config=config,
        grouped=context.users_per_client != 1,
        max_group_examples=context.max_group_examples)
