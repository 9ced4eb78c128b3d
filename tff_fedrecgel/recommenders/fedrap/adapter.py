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
from tff_fedrecgel.simulation import own_model

class FedRAP(own_model.OwnModelAlgorithm):
    """FedRAP over a population (an `Algorithm` of the driver)."""

    order_salt = 0xFA4A

    def __init__(self, *, config: fedrap.FedRAPConfig = fedrap.DEFAULT_CONFIG, **kwargs):
        """Builds the TFF process.

        Args:
          config: The client work's settings.
          **kwargs: `own_model.OwnModelAlgorithm`'s (`max_group_examples`
            counts example slots).

        Raises:
          ValueError: On inconsistent settings.
        """
        super().__init__(config=config, **kwargs)
        self.process = fedrap.build_fedrap_process(num_items=self.num_items, config=config,
                                                   seed=self.seed)
        self._update = fedrap.make_client_update(self.num_items, config)
        _, self.d0, self._w0, self._b0 = fedrap.initial_weights(self.num_items, config,
                                                                  self.seed)
        self.state = None
        self.w = self.b = self.scale = None
        self.resid = own_model.UserRows(0, config.latent_dim)

    def initialize(self) -> None:
        self.state = self.process.initialize()
        d = self.config.latent_dim
        self.w = np.tile(self._w0, (self.num_users, 1))
        self.b = np.full(self.num_users, self._b0, np.float32)
        self.scale = np.ones(self.num_users, np.float32)
        self.resid = own_model.UserRows(self.num_users, d)
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
                np.random.default_rng([self.seed, round_num, int(users[i]), self.order_salt]))
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
            items = self.resid.items[u]
            if len(items):
                ids = data.local_ids[i]
                pos = np.minimum(np.searchsorted(items, ids), len(items) - 1)
                hit = (items[pos] == ids) & (data.local_mask[i] > 0)
                rows[i, hit] += self.resid.rows[u][pos[hit]]
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
            old_items, old = self.resid.items[u], self.resid.rows[u] * factor[i]
            keep = ~np.isin(old_items, ids)
            items = np.concatenate([old_items[keep], ids])
            order = np.argsort(items, kind='stable')
            self.resid.items[u] = items[order].astype(np.int32)
            self.resid.rows[u] = np.concatenate([old[keep], trained])[order]
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

    def dense_personal(self, user: int) -> np.ndarray:
        """User `user`'s whole D_u, `[num_items, d]` (for checks)."""
        table = self.scale[user] * self.d0
        table[self.resid.items[user]] += self.resid.rows[user]
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

    def stored_models(self, users: np.ndarray):
        return self.w[users], self.b[users], self.scale[users], self.resid.csr(users)

    def scores(self, models) -> np.ndarray:
        return fedrap.user_scores(self.global_weights[0], self.d0, *models)

    def get_state(self) -> collections.OrderedDict:
        indptr, items, rows = self.resid.csr(range(self.num_users))
        return collections.OrderedDict(
            server=own_model.server_arrays(self.state), w=self.w.copy(), b=self.b.copy(),
            scale=self.scale.copy(), resid_indptr=indptr, resid_items=items, resid_rows=rows)

    def restore(self, state) -> None:
        self.state = own_model.server_state(self.process, state['server'])
        self.w = np.array(state['w'], np.float32)
        self.b = np.array(state['b'], np.float32)
        self.scale = np.array(state['scale'], np.float32)
        self.resid.restore(state['resid_indptr'], state['resid_items'], state['resid_rows'])
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
    return FedRAP(config=config, **own_model.build_kwargs(context))
