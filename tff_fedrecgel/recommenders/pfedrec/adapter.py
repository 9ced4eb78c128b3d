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
from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec
from tff_fedrecgel.simulation import own_model
from tff_fedrecgel.data.client_data import Batch

class PFedRec(own_model.OwnModelAlgorithm):
    """PFedRec over a population (an `Algorithm` of the driver)."""

    order_salt = 0x5FED

    def __init__(self, *, config: pfedrec.PFedRecConfig = pfedrec.DEFAULT_CONFIG, **kwargs):
        """Builds the TFF process.

        Args:
          config: The client work's settings.
          **kwargs: `own_model.OwnModelAlgorithm`'s.

        Raises:
          ValueError: On inconsistent settings.
        """
        super().__init__(config=config, **kwargs)
        self.process = pfedrec.build_pfedrec_process(num_items=self.num_items, config=config,
                                                     seed=self.seed)
        self._update = pfedrec.make_client_update(self.num_items, config)
        _, self._w0, self._b0 = pfedrec.initial_weights(self.num_items, config, self.seed)
        self.state = None
        self.w = self.b = None
        self.offsets = own_model.UserRows(0, config.latent_dim)

    def initialize(self) -> None:
        self.state = self.process.initialize()
        self.w = np.tile(self._w0, (self.num_users, 1))
        self.b = np.full(self.num_users, self._b0, np.float32)
        self.offsets = own_model.UserRows(self.num_users, self.config.latent_dim)
        self._new_users = {}

    @property
    def round_num(self) -> int:
        return int(self.state['round_num'])

    def _keep_offsets(self, users, data: personal_batches.ClientData, offsets, batches) -> None:
        for row, user in enumerate(users):
            n = len(np.unique(batches[row][0]))
            self.offsets.keep(user, data.local_ids[row, :n], offsets[row, :n])

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

    def fit_new_users(self, users: Sequence[int], batches: Sequence[Batch]):
        """New users' models: one local round from the initial score function
        on the current global table (nothing is uploaded).

        Returns:
          `(w [n, d], b [n], offset_csr)` as `pfedrec.user_scores` takes.
        """
        key = (self.round_num, tuple(int(u) for u in users))
        if key in self._new_users:
            return self._new_users[key]
        orders = self._new_user_orders(users, batches)
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

    def stored_models(self, users: np.ndarray):
        return self.w[users], self.b[users], self.offsets.csr(users)

    def scores(self, models) -> np.ndarray:
        return pfedrec.user_scores(self.global_weights[0], *models)

    def get_state(self) -> collections.OrderedDict:
        indptr, items, rows = self.offsets.csr(range(self.num_users))
        return collections.OrderedDict(
            server=own_model.server_arrays(self.state), w=self.w.copy(), b=self.b.copy(),
            offset_indptr=indptr, offset_items=items, offset_rows=rows)

    def restore(self, state) -> None:
        self.state = own_model.server_state(self.process, state['server'])
        self.w = np.array(state['w'], np.float32)
        self.b = np.array(state['b'], np.float32)
        self.offsets.restore(state['offset_indptr'], state['offset_items'], state['offset_rows'])
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
    return PFedRec(config=pfedrec.PFedRecConfig(
        local_epochs=context.work.local_epochs,
        score_lr=pfedrec.DEFAULT_CONFIG.score_lr * context.work.lr_scale),
        **own_model.build_kwargs(context))
