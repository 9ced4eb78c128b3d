"""PFedRec behind the driver's protocol.

The round is `computation.py`'s TFF process. By default one TFF
client simulates a group of users (vectorized; the same round as one user
per client, each user's steps being its own); `--simulation=per_user` runs
one user per client. Every user's score function `(w, b)` and its personal
view of the items (its fine-tuned rows minus the global rows it received,
`offsets`) are what a device keeps; the adapter stores them for all users.

Serving: a training user scores item i as `(E[i] + offset_u[i]) . w_u + b_u`
with the current global table E; a user that never trained (held out, or
new) first runs one local round, the global table and the initial score
function fine-tuned on its own items, and is scored with the result.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import personal_batches
from tff_fedrecgel.data import batching
from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec
from tff_fedrecgel.data.client_data import Batch

# Salt of a user's shuffling stream, apart from the driver's batch draws.
_ORDER_SALT = 0x5FED


class PFedRec:
    """PFedRec over a population (an `Algorithm` of the driver)."""

    def __init__(self, *, model_config, num_users: int, seed: int = 0,
                 config: pfedrec.PFedRecConfig = pfedrec.DEFAULT_CONFIG,
                 reconstruction=None, grouped: bool = True,
                 max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES):
        """Builds the TFF process.

        Args:
          model_config: Only `num_items` is used (the driver checks it).
          num_users: Users of the split (every one gets a score function).
          seed: Seed of the initial weights and the local shuffling.
          config: The client work's settings.
          reconstruction: Kept for the driver's protocol (unused: new users
            run a local round instead).
          grouped: Simulate several users per TFF client.
          max_group_examples: With `grouped`, examples per TFF client stay
            under this unless one user alone exceeds it.

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
        self.process = pfedrec.build_pfedrec_process(num_items=self.num_items, config=config,
                                                     seed=seed)
        self._update = pfedrec.make_client_update(self.num_items, config)
        _, self._w0, self._b0 = pfedrec.initial_weights(self.num_items, config, seed)
        self.state = None
        self.w = self.b = None
        self._offset_items: list[np.ndarray] = []
        self._offset_rows: list[np.ndarray] = []
        self._new_users = {}  # (round, users) -> fitted models of new users.

    def initialize(self) -> None:
        self.state = self.process.initialize()
        self.w = np.tile(self._w0, (self.num_users, 1))
        self.b = np.full(self.num_users, self._b0, np.float32)
        d = self.config.latent_dim
        self._offset_items = [np.zeros(0, np.int32)] * self.num_users
        self._offset_rows = [np.zeros((0, d), np.float32)] * self.num_users
        self._new_users = {}

    @property
    def round_num(self) -> int:
        return int(self.state['round_num'])

    def _client_data(self, users: Sequence[int], batches: Sequence[Batch],
                     round_num: int) -> list[tuple[list[int], personal_batches.ClientData]]:
        """The round's TFF clients: (positions in `users`, their data)."""
        return personal_batches.client_groups(
            users, batches, self.config, seed=self.seed, round_num=round_num, salt=_ORDER_SALT,
            grouped=self.grouped, max_group_examples=self.max_group_examples)

    def _keep_offsets(self, users, data: personal_batches.ClientData, offsets, batches) -> None:
        for row, user in enumerate(users):
            n = len(np.unique(batches[row][0]))
            self._offset_items[user] = data.local_ids[row, :n].copy()
            self._offset_rows[user] = np.asarray(offsets[row, :n], np.float32)

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict[str, float]:
        clients = self._client_data(users, batches, self.round_num + 1)
        users = np.asarray(users)
        scores = [collections.OrderedDict(w=self.w[users[g]], b=self.b[users[g]])
                  for g, _ in clients]
        state, new_scores, offsets, metrics = self.process.next(
            self.state, scores, [data.as_struct() for _, data in clients])
        self.state = state
        for (g, data), s, off in zip(clients, new_scores, offsets):
            self.w[users[g]] = np.asarray(s['w'])
            self.b[users[g]] = np.asarray(s['b'])
            self._keep_offsets(users[g], data, np.asarray(off), [batches[i] for i in g])
        self._new_users = {}
        return {'loss': float(metrics['loss']), 'examples': float(metrics['examples']),
                'tff_clients': float(len(clients))}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(self.state['item_table'])]

    def local_tables(self) -> None:
        return None  # Users keep score functions and item offsets, not embeddings.

    def projector_tables(self) -> dict[str, np.ndarray]:
        """The item tables TensorBoard's projector shows."""
        return {'item': self.global_weights[0]}

    def _offset_csr(self, users: Sequence[int]):
        items = [self._offset_items[u] for u in users]
        indptr = np.concatenate([[0], np.cumsum([len(i) for i in items])]).astype(np.int64)
        d = self.config.latent_dim
        rows = [self._offset_rows[u] for u in users]
        return (indptr, np.concatenate(items) if items else np.zeros(0, np.int32),
                np.concatenate(rows) if rows else np.zeros((0, d), np.float32))

    def fit_new_users(self, users: Sequence[int], batches: Sequence[Batch]):
        """New users' models: one local round from the initial score function
        on the current global table (nothing is uploaded).

        Returns:
          `(w [n, d], b [n], offset_csr)` as `pfedrec.user_scores` takes.
        """
        key = (self.round_num, tuple(int(u) for u in users))
        if key in self._new_users:
            return self._new_users[key]
        orders = personal_batches.user_orders(users, batches, self.config, seed=self.seed,
                                              round_num=0, salt=_ORDER_SALT)
        data = personal_batches.pack_groups(batches, orders, self.config.batch_size)
        n = len(users)
        out = self._update(
            tf.constant(self.global_weights[0]),
            collections.OrderedDict(w=tf.constant(np.tile(self._w0, (n, 1))),
                                    b=tf.constant(np.full(n, self._b0, np.float32))),
            {k: tf.constant(v) for k, v in data.as_struct().items()})
        offsets = out['offsets'].numpy()
        lengths = [len(np.unique(items)) for items, _ in batches]
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.concatenate([data.local_ids[i, :m] for i, m in enumerate(lengths)])
        rows = np.concatenate([offsets[i, :m] for i, m in enumerate(lengths)])
        self._new_users = {key: (out['scores']['w'].numpy(), out['scores']['b'].numpy(),
                                 (indptr, items, rows))}
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
            w, b, csr = self.w[users], self.b[users], self._offset_csr(users)
        else:
            w, b, csr = self.fit_new_users(users, batches)
        return pfedrec.user_scores(self.global_weights[0], w, b, csr)

    def get_state(self) -> collections.OrderedDict:
        indptr, items, rows = self._offset_csr(range(self.num_users))
        return collections.OrderedDict(
            server=[np.asarray(x) for x in tf.nest.flatten(self.state)],
            w=self.w.copy(), b=self.b.copy(), offset_indptr=indptr,
            offset_items=np.asarray(items, np.int32), offset_rows=np.asarray(rows, np.float32))

    def restore(self, state) -> None:
        self.state = tf.nest.pack_sequence_as(self.process.initialize(),
                                              [np.asarray(x) for x in state['server']])
        self.w = np.array(state['w'], np.float32)
        self.b = np.array(state['b'], np.float32)
        indptr = np.asarray(state['offset_indptr'], np.int64)
        items = np.asarray(state['offset_items'], np.int32)
        rows = np.asarray(state['offset_rows'], np.float32).reshape(-1, self.config.latent_dim)
        self._offset_items = [items[indptr[u]:indptr[u + 1]] for u in range(self.num_users)]
        self._offset_rows = [rows[indptr[u]:indptr[u + 1]] for u in range(self.num_users)]
        self._new_users = {}


def build(method, context) -> PFedRec:
    """PFedRec's algorithm (its `methods.Method.builder`).

    Args:
      method: The `methods.Method`.
      context: The run's `simulation.context.BuildContext`; its
        `work.local_epochs` is the local epochs, `work.lr_scale` scales the
        authors' rates.
    """
    del method
    return PFedRec(
        model_config=context.model_config, num_users=context.split.num_users,
        seed=context.seed, reconstruction=context.work,
        config=pfedrec.PFedRecConfig(
            local_epochs=context.work.local_epochs,
            score_lr=pfedrec.DEFAULT_CONFIG.score_lr * context.work.lr_scale),
        grouped=context.users_per_client != 1,
        max_group_examples=context.max_group_examples)
