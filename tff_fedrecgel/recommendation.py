"""Recommendations of a trained model, in the data's original ids.

A `TrainedModel` is what a run leaves: the global weights, every user's
stored embedding (None where users keep none: FedRecon, the 'reconstruct'
local state), how a user without a stored embedding rebuilds one, and the
split with its id maps. A user's top-K ranks every item with an original id
by the NeuMF logit (`neumf.score_items`), leaving out the items the user has
in training.

Whose embedding:
* a training user with a stored embedding: that row;
* a training user without one (or a user the run held out of training):
  rebuilt from its training interactions exactly as the simulation rebuilds
  it for evaluation (its batch of round 0,
  `evaluation.reconstruction.reconstruct_local_tables` with the run's
  reconstruction settings);
* a new user: rebuilt the same way from the items given, with negatives drawn
  as for a training user (`FederatedTrainData.round_batch`).
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.data.client_data import DEFAULT_NUM_NEGATIVES
from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.client_data import user_uniforms
from tff_fedrecgel.data.id_maps import IdMap
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.evaluation import reconstruction as rebuilding
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation.driver import EVAL_ROUND

STORED = 'stored'
REBUILT = 'rebuilt'
# A new user's data holds one user: its negatives are drawn as user 0's.
_NEW_USER = 0


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """One recommended item.

    Attributes:
      rank: 1 for the best.
      item_id: The item's original id (int or str).
      score: The model's logit for the user and the item (sigmoid(score) is
        the predicted probability of an interaction; it ranks items for one
        user and is not calibrated across users).
    """

    rank: int
    item_id: Any
    score: float


@dataclasses.dataclass(frozen=True)
class UserEmbedding:
    """A user's embedding tables and where they came from.

    Attributes:
      tables: float32 `[1, dim]` arrays in `NeuMF.local_variables` order.
      source: `STORED` or `REBUILT`.
      seen_items: The item indices the user interacted with (left out of its
        recommendations).
      batch: The `(items, labels)` batch it was rebuilt from, or None.
    """

    tables: list[np.ndarray]
    source: str
    seen_items: np.ndarray
    batch: Batch | None = None


@functools.lru_cache(maxsize=16)
def _scorer(config: neumf.ModelConfig):
    """Scores of every item for a group of users (one compiled trace)."""

    @tf.function(autograph=False, input_signature=[
        neumf.global_weight_specs(config), neumf.local_weight_specs(config, num_users=None)])
    def score(global_weights, local_tables):
        users = tf.shape(local_tables[0])[0]
        items = tf.tile(tf.range(config.num_items)[tf.newaxis, :], [users, 1])
        return neumf.score_items(config, global_weights, local_tables, items)

    return score


class TrainedModel:
    """A trained NeuMF with its users, items and reconstruction settings."""

    def __init__(
        self,
        *,
        model_config: neumf.ModelConfig,
        global_weights: Sequence[np.ndarray],
        split: Split,
        reconstruction: client_update.ClientWorkConfig,
        local_tables: Sequence[np.ndarray] | None = None,
        rebuilt_users: Sequence[int] = (),
        seed: int = 0,
        num_negatives: int = DEFAULT_NUM_NEGATIVES,
    ):
        """Holds a trained model.

        Args:
          model_config: The NeuMF sizes.
          global_weights: Arrays in `NeuMF.global_variables` order.
          split: The split it was trained on (its id maps and training items).
          reconstruction: How a user without a stored embedding rebuilds it
            (`reconstruction_steps`, `local_lr`, the loss).
          local_tables: Every user's stored embedding, `[num_users, dim]`
            arrays, or None when users keep none.
          rebuilt_users: Users whose stored row was never trained (held out
            of training): rebuilt as if they kept none.
          seed: The run's seed (negatives of rebuilt users' batches).
          num_negatives: Training negatives per positive.

        Raises:
          ValueError: On shapes that do not match.
        """
        self.model_config = model_config
        self.global_weights = [np.asarray(w, np.float32) for w in global_weights]
        specs = neumf.global_weight_specs(model_config)
        if [tuple(w.shape) for w in self.global_weights] != [tuple(s.shape) for s in specs]:
            raise ValueError('global_weights do not match the model config')
        if split.num_items != model_config.num_items:
            raise ValueError(f'the model has {model_config.num_items} items, the split '
                             f'{split.num_items}')
        self.split = split
        self.reconstruction = reconstruction
        self.local_tables = None
        if local_tables is not None:
            self.local_tables = [np.asarray(t, np.float32) for t in local_tables]
            expected = [(split.num_users, d) for d in model_config.local_dims]
            if [t.shape for t in self.local_tables] != expected:
                raise ValueError(f'local_tables must be shaped {expected}')
        self.rebuilt_users = frozenset(int(u) for u in rebuilt_users)
        self.seed = int(seed)
        self.num_negatives = int(num_negatives)
        self.users = IdMap(kind='user', size=split.num_users, ids=split.user_ids)
        self.items = IdMap(kind='item', size=split.num_items, ids=split.item_ids)
        self._train_data = FederatedTrainData.from_split(split)

    @classmethod
    def from_simulation(cls, simulation) -> 'TrainedModel':
        """The current model of a `simulation.Simulation` (initialized or restored).

        Raises:
          ValueError: For a method whose users score with models of their own
            (PFedRec, FedRAP): it is evaluated, not served here.
        """
        algorithm = simulation.algorithm
        if getattr(algorithm, 'score_items', None) is not None:
            raise ValueError('this method\'s users score items with models of their own '
                             '(PFedRec, FedRAP): it is trained and evaluated, but recommendations '
                             'and the SavedModel serve NeuMF methods only')
        return cls(model_config=algorithm.model_config,
                   global_weights=simulation.global_weights, split=simulation.split,
                   reconstruction=algorithm.reconstruction,
                   local_tables=algorithm.local_tables(),
                   rebuilt_users=simulation.heldout_users.tolist(), seed=simulation.seed,
                   num_negatives=simulation.num_negatives)

    def keeps_embedding(self, user: int) -> bool:
        """Whether `user` (an index) has a stored, trained embedding."""
        return self.local_tables is not None and int(user) not in self.rebuilt_users

    def _rebuild(self, batch: Batch) -> list[np.ndarray]:
        return self._rebuild_many([batch])

    def _rebuild_many(self, batches: Sequence[Batch]) -> list[np.ndarray]:
        return rebuilding.reconstruct_local_tables(
            self.model_config, self.reconstruction, self.global_weights, batches)

    def user_embedding(self, user_id: Any) -> UserEmbedding:
        """The embedding of a user of the data, by original id.

        Raises:
          UnknownIdError: If the data has no such user.
        """
        user = self.users.index(user_id)
        seen = self._train_data.positives(user)
        if self.keeps_embedding(user):
            return UserEmbedding([t[user:user + 1] for t in self.local_tables], STORED, seen)
        batch = self._train_data.round_batch(user, seed=self.seed, round_num=EVAL_ROUND,
                                             num_negatives=self.num_negatives)
        return UserEmbedding(self._rebuild(batch), REBUILT, seen, batch)

    def embedding_from_items(self, item_ids: Sequence[Any]) -> UserEmbedding:
        """A new user's embedding, rebuilt from the items it interacted with.

        Args:
          item_ids: Original item ids (repeats count once).

        Raises:
          DataError: If none is given, an id is unknown, or too few items
            are left for the negatives.
        """
        if not len(item_ids):
            raise DataError('give at least one item the new user interacted with')
        indices = self.items.indices(item_ids)
        positives = np.asarray(list(dict.fromkeys(indices.tolist())), np.int32)
        one_user = FederatedTrainData(
            num_users=1, num_items=self.split.num_items,
            indptr=np.array([0, len(positives)]), items=positives,
            sorted_items=np.sort(positives))
        batch = one_user.round_batch(_NEW_USER, seed=self.seed, round_num=EVAL_ROUND,
                                     num_negatives=self.num_negatives)
        return UserEmbedding(self._rebuild(batch), REBUILT, positives, batch)

    def all_user_tables(self) -> list[np.ndarray]:
        """Every user's embedding, as `user_embedding` gives it.

        Stored rows where users keep one; the others rebuilt together from
        their round-0 batches
        (`evaluation.reconstruction.reconstruct_local_tables`, as the
        simulation evaluates them).

        Returns:
          float32 `[num_users, dim]` tables in `NeuMF.local_variables` order.
        """
        num_users = self.split.num_users
        if self.local_tables is not None:
            tables = [t.copy() for t in self.local_tables]
            rebuilt = sorted(self.rebuilt_users)
        else:
            tables = [np.zeros((num_users, d), np.float32) for d in self.model_config.local_dims]
            rebuilt = list(range(num_users))
        if rebuilt:
            batches = self._train_data.round_batches(
                rebuilt, seed=self.seed, round_num=EVAL_ROUND, num_negatives=self.num_negatives)
            for table, part in zip(tables, self._rebuild_many(batches)):
                table[rebuilt] = part
        return tables

    def seen_items_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """Every user's training items (left out of its recommendations).

        Returns:
          `(row_splits int64 [num_users + 1], items int32)`: user u's are
          `items[row_splits[u]:row_splits[u + 1]]`.
        """
        return self._train_data.indptr.copy(), self._train_data.items.copy()

    def new_user_uniforms(self, length: int) -> np.ndarray:
        """The uniforms a new user's batch draws from (`embedding_from_items`).

        Args:
          length: How many (a new user with P items uses P * (1 + num_negatives)).

        Returns:
          float64 `[length]`.
        """
        return user_uniforms(seed=self.seed, round_num=EVAL_ROUND, user=_NEW_USER,
                             length=length)

    def scores(self, tables: Sequence[np.ndarray]) -> np.ndarray:
        """Logits of every item for users' embeddings.

        Args:
          tables: `[users, dim]` arrays in `NeuMF.local_variables` order.

        Returns:
          float32 `[users, num_items]`.
        """
        scores = _scorer(self.model_config)(
            [tf.constant(w) for w in self.global_weights],
            [tf.constant(np.asarray(t, np.float32)) for t in tables])
        return scores.numpy()

    def top_k(self, embedding: UserEmbedding, *, k: int = 10,
              exclude: Sequence[Any] | None = None) -> list[Recommendation]:
        """The `k` best items with an original id, the excluded ones left out.

        Ties keep the lower index first.

        Args:
          embedding: The user's embedding.
          k: How many items.
          exclude: Original ids of the items left out (an empty list: none);
            None: the items the user has seen (as the SavedModel's default).

        Raises:
          ValueError: If `k` < 1.
          DataError: On an unknown id in `exclude`.
        """
        if k < 1:
            raise ValueError(f'k must be >= 1, got {k}')
        left_out = (np.asarray(embedding.seen_items, np.int64) if exclude is None
                    else self.items.indices(list(exclude)) if len(exclude)
                    else np.zeros(0, np.int64))
        scores = self.scores(embedding.tables)[0].astype(np.float64)
        allowed = np.zeros(self.split.num_items, bool)
        allowed[:self.items.num_with_id] = True
        allowed[left_out] = False
        candidates = np.flatnonzero(allowed)
        order = candidates[np.lexsort((candidates, -scores[candidates]))][:k]
        return [Recommendation(rank=r + 1, item_id=self.items.original(i),
                               score=float(scores[i])) for r, i in enumerate(order)]

    def recommend(self, user_id: Any = None, *, items: Sequence[Any] | None = None,
                  k: int = 10, exclude: Sequence[Any] | None = None) -> list[Recommendation]:
        """A user's top-`k` items in original ids.

        Args:
          user_id: A user of the data (original id), or None for a new user.
          items: For a new user: the original ids of the items it interacted
            with.
          k: How many items.
          exclude: Original ids left out (`top_k`); None: the seen items.

        Returns:
          Best first.

        Raises:
          DataError: On unknown ids, or neither or both of `user_id` (of the
            data) and `items`.
        """
        if items is not None:
            if user_id is not None and user_id in self.users:
                raise DataError(f'user {user_id!r} is in the data; give its id or the '
                                'items of a new user, not both')
            return self.top_k(self.embedding_from_items(items), k=k, exclude=exclude)
        if user_id is None:
            raise DataError('give a user id, or the items of a new user')
        return self.top_k(self.user_embedding(user_id), k=k, exclude=exclude)
