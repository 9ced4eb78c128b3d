"""GPFedRec behind the driver's protocol.

The users' local round is `computation.py`'s TFF computation (one
TFF client simulating a group of users, vectorized; each user's steps are
its own); the server's graph step is its `graph_aggregate`. The adapter
keeps what every device keeps (its user embedding, MLP and item table `P_u`,
the tables one dense `[num_users, num_items, d]` float32 array) and what the
server keeps (the global table and the last round's user graph). GPFedRec's
server holds one table per user, so memory grows with users x items
(`memory_bytes`): the targets `T = A^mp_layers P` of the last round's users
are made when the next round starts, in place of their tables when they
all train again (every user every round, the authors' setting), else
beside them.

Serving: a training user scores with its own model (`P_u`, its user
embedding and MLP). A user that never trained first runs one local round
from the initial device state on the current global table, with the global
table as its target, and is scored with the result.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import os

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import personal_batches
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.errors import SettingError
from tff_fedrecgel.recommenders.gpfedrec import computation as gpfedrec
from tff_fedrecgel.simulation import own_model

# The share of this machine's memory the two per-user tables may take.
_MEMORY_SHARE = 0.6
# Bytes of the score MLP's widest activation while scoring.
_SCORE_BYTES = 1 << 27


def memory_bytes(num_users: int, num_items: int, latent_dim: int) -> int:
    """Bytes of the users' tables (a `[num_users, num_items, latent_dim]`
    float32 array; the targets of a partial cohort come beside it)."""
    return 4 * num_users * num_items * latent_dim


def _check_memory(num_users: int, num_items: int, latent_dim: int) -> None:
    # A checkpoint copies every table (TFF's program state manager makes a
    # variable of each), so a run needs twice the tables.
    tables = memory_bytes(num_users, num_items, latent_dim)
    total = _physical_memory()
    if total and 2 * tables > _MEMORY_SHARE * total:
        raise SettingError(
            'algorithm', f'gpfedrec does not fit this machine: it keeps an item table per '
            f'user ({num_users} x {num_items} x {latent_dim} floats = '
            f'{tables / 2**30:.1f} GiB) and a checkpoint copies them, over '
            f'{_MEMORY_SHARE:.0%} of its {total / 2**30:.1f} GiB')


def _physical_memory() -> int:
    try:
        return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):
        return 0


class GPFedRec(own_model.OwnModelAlgorithm):
    """GPFedRec over a population (an `Algorithm` of the driver)."""

    order_salt = 0x6FED

    def __init__(self, *, config: gpfedrec.GPFedRecConfig = gpfedrec.DEFAULT_CONFIG,
                 **kwargs):
        """Builds the TFF computation.

        Args:
          config: The round's settings.
          **kwargs: `own_model.OwnModelAlgorithm`'s.

        Raises:
          SettingError: If the per-user tables do not fit this machine.
          ValueError: On inconsistent settings.
        """
        super().__init__(config=config, **kwargs)
        _check_memory(self.num_users, self.num_items, config.latent_dim)
        self.process = gpfedrec.build_client_process(num_items=self.num_items, config=config)
        self._update = gpfedrec.make_client_update(self.num_items, config)
        self._table0, self._local0 = gpfedrec.initial_weights(self.num_items, config,
                                                              self.seed)
        self.round_num = 0
        self.table = self.tables = self.local = None
        self.graph_users = np.zeros(0, np.int64)  # The last round's users...
        self.propagation = np.zeros((0, 0), np.float32)  # ...and A^mp_layers.

    def initialize(self) -> None:
        self.round_num = 0
        self.table = self._table0.copy()
        shape = (self.num_users, self.num_items, self.config.latent_dim)
        self.tables = np.broadcast_to(self._table0, shape).copy()
        self.graph_users = np.zeros(0, np.int64)
        self.propagation = np.zeros((0, 0), np.float32)
        self.local = collections.OrderedDict(
            (k, np.tile(np.asarray(v)[None], (self.num_users,) + (1,) * np.ndim(v)))
            for k, v in self._local0.items())
        self._new_users = {}

    def _targets(self, users: np.ndarray):
        """The round's target tables: `T = A^mp_layers P` for the last round's
        users, made now (in place of their tables if they all train in this
        round, which rebuilds them); the global table for anyone else (and
        in round 1, the initial table for all, as the authors start).

        Returns:
          `target(u)` -> float32 `[num_items, d]` for a user of the round.
        """
        flat = self.tables.reshape(self.num_users, -1)
        shape = self.tables.shape[1:]
        known = {int(u): i for i, u in enumerate(self.graph_users)}
        if not known:
            return lambda u: self.table
        if np.isin(self.graph_users, users).all():
            gpfedrec.rows_transform(flat, self.graph_users, self.propagation)
            return lambda u: self.tables[u] if int(u) in known else self.table
        apart = gpfedrec.rows_transform(flat, self.graph_users, self.propagation,
                                        out=np.empty((len(known), flat.shape[1]), np.float32))
        return lambda u: (apart[known[int(u)]].reshape(shape) if int(u) in known
                          else self.table)

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict[str, float]:
        return self.run_round(users, batches,
                              self._client_data(users, batches, self.round_num + 1))

    def run_round(self, users: Sequence[int], batches: Sequence[Batch],
                  clients: Sequence[tuple[Sequence[int], personal_batches.ClientData]]) -> dict:
        """One round on given TFF clients (`(positions in users, data)` each)."""
        users = np.asarray(users, np.int64)
        target = self._targets(users)
        targets = [np.stack([target(users[i])[ids] for i, ids in zip(g, data.local_ids)])
                   for g, data in clients]
        local = [collections.OrderedDict((k, v[users[np.asarray(g)]])
                                         for k, v in self.local.items()) for g, _ in clients]
        new_local, uploads, metrics = self.process(
            self.table, targets, local, [data.as_struct() for _, data in clients])
        for (g, data), state, upload in zip(clients, new_local, uploads):
            g = np.asarray(g)
            for k in self.local:
                self.local[k][users[g]] = np.asarray(state[k])
            coef, rows = np.asarray(upload['coef']), np.asarray(upload['rows'])
            for row, i in enumerate(g):
                u, n = users[i], len(np.unique(batches[i][0]))
                # The upload gives the whole table: c G + (1 - c) T off the user's rows.
                table = coef[row] * self.table + (1.0 - coef[row]) * target(u)
                table[data.local_ids[row, :n]] = rows[row, :n]
                self.tables[u] = table
        flat = self.tables.reshape(self.num_users, -1)
        self.graph_users = np.sort(users)
        self.propagation = gpfedrec.propagation(gpfedrec.relation_graph(
            gpfedrec.rows_gram(flat, self.graph_users), self.config), self.config)
        # G = mean_u T_u = (mean of A's rows) . P, without making T.
        weights = self.propagation.mean(axis=0)[None]
        self.table = gpfedrec.rows_transform(
            flat, self.graph_users, weights,
            out=np.empty((1, flat.shape[1]), np.float32)).reshape(self.table.shape)
        self.round_num += 1
        self._new_users = {}
        return {'loss': float(metrics['loss']), 'examples': float(metrics['examples']),
                'tff_clients': float(len(clients))}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [self.table]

    def fit_new_users(self, users: Sequence[int], batches: Sequence[Batch]):
        """New users' models: one local round from the initial device state,
        on the current global table with it as the target (nothing is
        uploaded).

        Returns:
          `(local, tables [n, num_items, d])`.
        """
        key = (self.round_num, tuple(int(u) for u in users))
        if key in self._new_users:
            return self._new_users[key]
        orders = self._new_user_orders(users, batches)
        data = personal_batches.pack_groups(batches, orders, self.config.batch_size)
        n = len(users)
        rows0 = tf.gather(self.table, data.local_ids)
        local = collections.OrderedDict(
            (k, tf.constant(np.tile(np.asarray(v)[None], (n,) + (1,) * np.ndim(v))))
            for k, v in self._local0.items())
        out = self._update(rows0, rows0, local,
                           {k: tf.constant(v) for k, v in data.as_struct().items()})
        rows = out['rows'].numpy()
        tables = np.broadcast_to(self.table, (n,) + self.table.shape).copy()
        for i, (items, _) in enumerate(batches):
            m = len(np.unique(items))
            tables[i][data.local_ids[i, :m]] = rows[i, :m]
        self._new_users = {key: ({k: v.numpy() for k, v in out['locals'].items()}, tables)}
        return self._new_users[key]

    def stored_models(self, users: np.ndarray):
        return {k: v[users] for k, v in self.local.items()}, self.tables, users

    def new_models(self, users: np.ndarray, batches: Sequence[Batch]):
        local, tables = self.fit_new_users(users, batches)
        return local, tables, np.arange(len(users))

    def scores(self, models) -> np.ndarray:
        """Logits under `(MLPs and user embeddings, tables, each user's row
        of the tables)`."""
        local, tables, index = models
        # A few users at a time: the MLP's activations are users x items x width.
        step = max(1, _SCORE_BYTES // (4 * self.num_items * max(self.config.layers)))
        out = np.empty((len(index), self.num_items), np.float32)
        for start in range(0, len(index), step):
            part = slice(start, start + step)
            out[part] = gpfedrec.logits(
                {k: tf.constant(v[part]) for k, v in local.items()},
                tf.constant(local['user'][part]), tf.constant(tables[index[part]]),
                len(self.config.layers) - 1).numpy()
        return out

    def get_state(self) -> collections.OrderedDict:
        """The state; its tables are the live ones (rounds update them in
        place, and a copy would double GPFedRec's memory): save it before the
        next round."""
        return collections.OrderedDict(
            round_num=np.int64(self.round_num), table=self.table,
            tables=list(self.tables), graph_users=self.graph_users,
            propagation=self.propagation, local=[self.local[k] for k in self.local])

    def restore(self, state) -> None:
        self.round_num = int(state['round_num'])
        self.table = np.array(state['table'], np.float32)
        self.tables = np.stack([np.asarray(t, np.float32) for t in state['tables']])
        self.graph_users = np.array(state['graph_users'], np.int64)
        self.propagation = np.array(state['propagation'], np.float32).reshape(
            len(self.graph_users), len(self.graph_users))
        self.local = collections.OrderedDict(
            (k, np.array(v, np.float32)) for k, v in zip(self._local0, state['local']))
        self._new_users = {}


def build(method, context) -> GPFedRec:
    """GPFedRec's algorithm (its `methods.Method.builder`).

    Args:
      method: The `methods.Method`.
      context: The run's `simulation.context.BuildContext`; its
        `work.local_epochs` is the local epochs, `work.lr_scale` scales the
        authors' rates, and the cohort's share of the users sets the user
        embedding's rate.
    """
    del method
    fraction = min(1.0, context.clients_per_round / max(1, len(context.training_users)))
    return GPFedRec(config=gpfedrec.GPFedRecConfig(
        local_epochs=context.work.local_epochs, client_fraction=fraction,
        lr=gpfedrec.DEFAULT_CONFIG.lr * context.work.lr_scale),
        **own_model.build_kwargs(context))
