"""What the recommenders with models of their own share behind the driver.

PFedRec, GPFedRec and FedRAP (`tff_fedrecgel/recommenders/`) keep a model
per user instead of a user embedding: the driver scores their users through
`score_items`, they have no local embedding table, TensorBoard's projector
shows their global item table, and a round's users are packed into TFF
clients by `personal_batches.client_groups`. `OwnModelAlgorithm` holds that
once; `build_kwargs` is what each one's `build` takes from the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import personal_batches
from tff_fedrecgel.data import batching
from tff_fedrecgel.data.client_data import Batch


class OwnModelAlgorithm:
    """The shared part of an `Algorithm` whose users score with their own
    models. A subclass sets `order_salt` (its users' shuffling stream, apart
    from the driver's batch draws) and `global_weights`."""

    order_salt = 0
    global_weights: list[np.ndarray]

    def __init__(self, *, model_config, num_users: int, config: Any, seed: int = 0,
                 reconstruction=None, grouped: bool = True,
                 max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES):
        """Keeps the run's sizes and settings.

        Args:
          model_config: Only `num_items` is used (the driver checks it).
          num_users: Users of the split (every one gets a device state).
          config: The method's own configuration (its computation's
            dataclass, with `local_epochs` and `batch_size`).
          seed: Seed of the initial weights and the local shuffling.
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
        self._new_users = {}  # (round, users) -> the fitted models of new users.

    def _client_data(self, users: Sequence[int], batches: Sequence[Batch],
                     round_num: int) -> list[tuple[list[int], personal_batches.ClientData]]:
        """The round's TFF clients: (positions in `users`, their data)."""
        return personal_batches.client_groups(
            users, batches, self.config, seed=self.seed, round_num=round_num,
            salt=self.order_salt, grouped=self.grouped,
            max_group_examples=self.max_group_examples)

    def _new_user_orders(self, users: Sequence[int], batches: Sequence[Batch]):
        """New users' training orders (their one local round, as round 0)."""
        return personal_batches.user_orders(users, batches, self.config, seed=self.seed,
                                            round_num=0, salt=self.order_salt)

    def score_items(self, users: Sequence[int], batches: Sequence[Batch] | None) -> np.ndarray:
        """Every item's score (a logit) for `users` under their own models (the
        driver's per-user scoring).

        Args:
          users: User indices.
          batches: None for training users (their stored models); for users
            that never trained, their batches (`new_models`).

        Returns:
          float32 `[len(users), num_items]`.
        """
        users = np.asarray(users, np.int64)
        if batches is None:
            return self.scores(self.stored_models(users))
        return self.scores(self.new_models(users, batches))

    def stored_models(self, users: np.ndarray) -> Any:
        """Training users' models, as `scores` takes them."""
        raise NotImplementedError

    def new_models(self, users: np.ndarray, batches: Sequence[Batch]) -> Any:
        """Models of users that never trained (one local round from the
        initial state, nothing uploaded), as `scores` takes them."""
        return self.fit_new_users(users, batches)

    def scores(self, models: Any) -> np.ndarray:
        """Every item's score under `models`, float32 `[users, num_items]`."""
        raise NotImplementedError

    def local_tables(self) -> None:
        return None  # Users score with models of their own, not embeddings.

    def projector_tables(self) -> dict[str, np.ndarray]:
        """The item tables TensorBoard's projector shows."""
        return {'item': self.global_weights[0]}


class UserRows:
    """Each user's own rows of some items (PFedRec's item offsets, FedRAP's
    additive rows), kept per user and read or checkpointed as CSR."""

    def __init__(self, num_users: int, width: int):
        self.width = width
        self.items = [np.zeros(0, np.int32)] * num_users
        self.rows = [np.zeros((0, width), np.float32)] * num_users

    def keep(self, user: int, items: np.ndarray, rows: np.ndarray) -> None:
        self.items[user] = np.array(items, np.int32)
        self.rows[user] = np.asarray(rows, np.float32)

    def csr(self, users: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(indptr [n + 1], items [nnz], rows [nnz, width])` of `users`."""
        items = [self.items[u] for u in users]
        indptr = np.concatenate([[0], np.cumsum([len(i) for i in items])]).astype(np.int64)
        if not items:
            return indptr, np.zeros(0, np.int32), np.zeros((0, self.width), np.float32)
        # One copy of the rows: a checkpoint of FedRAP's holds GiBs of them.
        return (indptr, np.concatenate(items).astype(np.int32, copy=False),
                np.concatenate([self.rows[u] for u in users], dtype=np.float32))

    def restore(self, indptr, items, rows) -> None:
        """Back from every user's `csr`."""
        indptr = np.asarray(indptr, np.int64)
        items = np.asarray(items, np.int32)
        rows = np.asarray(rows, np.float32).reshape(-1, self.width)
        # Copies, not views: a view would keep the whole loaded array alive
        # beside every user's retrained rows.
        self.items = [items[indptr[u]:indptr[u + 1]].copy() for u in range(len(indptr) - 1)]
        self.rows = [rows[indptr[u]:indptr[u + 1]].copy() for u in range(len(indptr) - 1)]


def server_arrays(state) -> list[np.ndarray]:
    """A TFF process's server state as a checkpoint's arrays."""
    return [np.asarray(x) for x in tf.nest.flatten(state)]


def server_state(process, arrays) -> Any:
    """`server_arrays` back into `process`'s state structure."""
    return tf.nest.pack_sequence_as(process.initialize(), [np.asarray(x) for x in arrays])


def build_kwargs(context) -> dict[str, Any]:
    """`OwnModelAlgorithm`'s arguments from a run's
    `simulation.context.BuildContext`."""
    return dict(model_config=context.model_config, num_users=context.split.num_users,
                seed=context.seed, reconstruction=context.work,
                grouped=context.users_per_client != 1,
                max_group_examples=context.max_group_examples)
