"""Per-client training data: each user is one client (one device).

A client's training positives are its UNIQUE training items: the training
matrix collapses repeated (user, item) rows (LastFM-2K tag assignments,
FilmTrust's few duplicates), as in the reference implementation. Every round
a client builds one local batch: all its positives in a random order, each
followed by ``num_negatives`` items drawn uniformly without replacement from
the items it has no training interaction with.

Randomness: the batch of user ``u`` in round ``r`` depends only on
``numpy.random.default_rng([seed, r, u])``. It does not depend on which other
users are sampled in the round nor on their order. From that generator one
call ``rng.random(P * (1 + K))`` draws everything (``P`` positives, ``K``
negatives each): the first ``P`` floats are sort keys that shuffle the
positives; the rest, ``P`` rows of ``K``, drive Robert Floyd's algorithm for a
uniform ``K``-subset of the ``n = num_items - P`` non-training items (step
``k`` uses ``j = n - K + k``, ``t = floor(u * (j + 1))``, and takes ``j`` if
``t`` is already chosen). The chosen rank ``r`` among non-training items maps
to an item id through a binary search over the user's sorted training items.
All of this is vectorized over the users of a cohort.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tff_fedrecgel import sizes
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.errors import DataError

DEFAULT_NUM_NEGATIVES = sizes.TRAINING_NEGATIVES
# Held-out users depend on the data alone (not on the run's seed), so every
# method and seed on a split is measured on the same unseen users.
HELDOUT_SEED = 0x4E1D

Batch = tuple[np.ndarray, np.ndarray]


def heldout_users_for(num_users: int, fraction: float) -> np.ndarray:
    """The users a run never trains on: a fixed random `fraction` of them.

    Args:
      num_users: The population size.
      fraction: In [0, 1); `round(fraction * num_users)` users.

    Returns:
      Sorted int64 user indices.

    Raises:
      DataError: If `fraction` is outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise DataError(f'the held-out fraction must be in [0, 1), got {fraction}')
    count = int(round(fraction * num_users))
    rng = np.random.default_rng([HELDOUT_SEED, num_users])
    return np.sort(rng.permutation(num_users)[:count]).astype(np.int64)


def user_uniforms(*, seed: int, round_num: int, user: int, length: int) -> np.ndarray:
    """The uniforms `FederatedTrainData.round_batches` draws for one user.

    A user with P positives uses the first ``P * (1 + num_negatives)``: P
    shuffle keys, then ``num_negatives`` per positive. A longer draw starts
    with the same values (one 64-bit output per number), which lets the
    SavedModel carry one table for every new user (`serving`).

    Args:
      seed: Experiment seed.
      round_num: Round number.
      user: User index.
      length: How many.

    Returns:
      float64 `[length]` in [0, 1).
    """
    return np.random.default_rng([int(seed), int(round_num), int(user)]).random(int(length))


class FederatedTrainData:
    """Training positives of every user in CSR form, with batch sampling.

    Attributes:
      num_users: Number of users (clients).
      num_items: Size of the item index space.
      indptr: int64 [num_users + 1]; user ``u``'s rows are
        ``indptr[u]:indptr[u + 1]`` of `items` and `sorted_items`.
      items: int32 unique positives per user, in first-occurrence order.
      sorted_items: int32 the same items sorted per user (for exclusion).
    """

    def __init__(self, *, num_users: int, num_items: int, indptr: np.ndarray,
                 items: np.ndarray, sorted_items: np.ndarray) -> None:
        """Builds the container; prefer `from_split`.

        Args:
          num_users: Number of users.
          num_items: Size of the item index space.
          indptr: int64 [num_users + 1] CSR offsets.
          items: int32 unique positives per user (any order within a user).
          sorted_items: int32 the same positives, sorted within each user.

        Raises:
          DataError: If the arrays are inconsistent.
        """
        indptr = np.asarray(indptr, dtype=np.int64)
        if indptr.shape != (num_users + 1,) or indptr[0] != 0 or (
                indptr[-1] != len(items) or len(items) != len(sorted_items)):
            raise DataError('client data: inconsistent CSR arrays')
        self.num_users = int(num_users)
        self.num_items = int(num_items)
        self.indptr = indptr
        self.items = np.asarray(items, dtype=np.int32)
        self.sorted_items = np.asarray(sorted_items, dtype=np.int32)
        counts = np.diff(indptr)
        self._counts = counts
        row_users = np.repeat(np.arange(num_users, dtype=np.int64), counts)
        # a_j = S_j - j is non-decreasing within a user; the r-th non-training
        # item is r + #{j : a_j <= r}. Offsetting each user's block by
        # user * (num_items + 1) lets one searchsorted serve a whole cohort.
        self._stride = self.num_items + 1
        within = (np.arange(len(sorted_items), dtype=np.int64)
                  - indptr[row_users])
        self._shifted = (self.sorted_items.astype(np.int64) - within
                         + row_users * self._stride)

    @classmethod
    def from_split(cls, split: Split) -> 'FederatedTrainData':
        """Collects each user's unique training items from a split.

        Args:
          split: The preprocessed split.

        Returns:
          The client data; positives keep their first-occurrence order.
        """
        num_users, num_items = split.num_users, split.num_items
        codes = (split.train_users.astype(np.int64) * num_items
                 + split.train_items.astype(np.int64))
        unique_codes, first_row = np.unique(codes, return_index=True)
        # unique_codes is sorted by (user, item); reorder by first occurrence
        # and then stably by user for the first-occurrence lists.
        by_first = unique_codes[np.argsort(first_row, kind='stable')]
        by_first = by_first[np.argsort(by_first // num_items, kind='stable')]
        counts = np.bincount(unique_codes // num_items, minlength=num_users)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(num_users=num_users, num_items=num_items, indptr=indptr,
                   items=(by_first % num_items).astype(np.int32),
                   sorted_items=(unique_codes % num_items).astype(np.int32))

    def _check_user(self, user: int) -> int:
        user = int(user)
        if not 0 <= user < self.num_users:
            raise DataError(
                f'client data: user {user} out of range [0, {self.num_users})')
        return user

    def positives(self, user: int) -> np.ndarray:
        """The user's unique training items (first-occurrence order)."""
        user = self._check_user(user)
        return self.items[self.indptr[user]:self.indptr[user + 1]]

    def csr(self, users: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(indptr, items)` of the given users' unique training items, in order.

        Row r holds the items of `users[r]` (for ranking against every item a
        user did not train on).
        """
        users = np.asarray(users, np.int64)
        counts = self._counts[users]
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        starts = np.repeat(self.indptr[users], counts)
        offsets = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1], counts)
        return indptr, self.sorted_items[starts + offsets]

    def num_positives(self, user: int) -> int:
        """Number of unique training items of the user."""
        return int(self._counts[self._check_user(user)])

    def num_examples(self, user: int, *,
                     num_negatives: int = DEFAULT_NUM_NEGATIVES) -> int:
        """Examples in the user's round batch: positives * (1 + negatives)."""
        return self.num_positives(user) * (1 + int(num_negatives))

    def round_batch(self, user: int, *, seed: int, round_num: int,
                    num_negatives: int = DEFAULT_NUM_NEGATIVES) -> Batch:
        """The local batch of one user for one round.

        Args:
          user: User index.
          seed: Experiment seed.
          round_num: Round number.
          num_negatives: Negatives per positive.

        Returns:
          ``(items, labels)``: int32 and float32 arrays of length
          ``P * (1 + num_negatives)``; each positive (label 1) is followed by
          its negatives (label 0).

        Raises:
          DataError: For a bad user or too few non-training items.
        """
        return self.round_batches([user], seed=seed, round_num=round_num,
                                  num_negatives=num_negatives)[0]

    def round_batches(self, users: Sequence[int] | np.ndarray, *, seed: int,
                      round_num: int,
                      num_negatives: int = DEFAULT_NUM_NEGATIVES,
                      ) -> list[Batch]:
        """The local batches of a cohort (see `round_batch`).

        Args:
          users: User indices (any order; repeats allowed).
          seed: Experiment seed.
          round_num: Round number.
          num_negatives: Negatives per positive.

        Returns:
          One ``(items, labels)`` pair per entry of ``users``, in that order.

        Raises:
          DataError: For a bad user or too few non-training items.
        """
        k = int(num_negatives)
        if k < 0:
            raise DataError(f'num_negatives must be >= 0, got {k}')
        users = np.asarray([self._check_user(u) for u in users], dtype=np.int64)
        if not len(users):
            return []
        counts = self._counts[users]
        too_few = (self.num_items - counts) < k
        if too_few.any():
            bad = int(users[np.argmax(too_few)])
            left = self.num_items - int(self._counts[bad])
            raise DataError(
                f'client data: user {bad} has {left} non-training items, '
                f'fewer than num_negatives={k}')
        # The only per-user Python work: one generator and one draw each.
        draws = [user_uniforms(seed=seed, round_num=round_num, user=u, length=int(p) * (1 + k))
                 for u, p in zip(users, counts)]
        total = int(counts.sum())
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        seg = np.repeat(np.arange(len(users)), counts)
        pos_in_user = np.arange(total) - starts[seg]
        row_user = users[seg]
        flat = np.concatenate(draws)
        # Per user the draw is [P shuffle keys | P*K negative uniforms].
        draw_start = np.repeat(starts * (1 + k), counts)
        perm_keys = flat[draw_start + pos_in_user]
        order = np.lexsort((perm_keys, seg))
        positives = self.items[self.indptr[row_user] + pos_in_user][order]

        table = np.empty((total, 1 + k), dtype=np.int32)
        table[:, 0] = positives
        if k:
            neg_idx = (draw_start + counts[seg] + pos_in_user * k)[:, None] + (
                np.arange(k)[None, :])
            uniforms = flat[neg_idx]
            n = (self.num_items - counts[seg]).astype(np.int64)
            ranks = np.empty((total, k), dtype=np.int64)
            for step in range(k):
                j = n - k + step
                t = np.minimum(np.floor(uniforms[:, step] * (j + 1)).astype(
                    np.int64), j)
                taken = (ranks[:, :step] == t[:, None]).any(axis=1)
                ranks[:, step] = np.where(taken, j, t)
            query = ranks + (row_user * self._stride)[:, None]
            below = np.searchsorted(self._shifted, query.ravel(), side='right')
            below = below.reshape(total, k) - self.indptr[row_user][:, None]
            table[:, 1:] = ranks + below
        labels_row = np.zeros(1 + k, dtype=np.float32)
        labels_row[0] = 1.0
        items_flat = table.ravel()
        labels_flat = np.tile(labels_row, total)
        bounds = np.cumsum(counts * (1 + k))[:-1]
        return list(zip(np.split(items_flat, bounds),
                        np.split(labels_flat, bounds)))

    def as_tff_client_data(self, *, seed: int, round_num: int,
                           num_negatives: int = DEFAULT_NUM_NEGATIVES) -> Any:
        """The round's batches as a ``tff.simulation.datasets.ClientData``.

        For users who want TFF's ClientData interface: client ids are the user
        indices as strings and each dataset yields per-example dicts
        ``{'item': int32, 'label': float32}`` (the `round_batch` order; call
        ``.batch()`` as needed). The batches are fixed for ``round_num``, so
        build one per round. The simulation itself feeds these arrays to the
        model as tensors directly, because building ``tf.data`` pipelines
        every round is slow.

        Args:
          seed: Experiment seed.
          round_num: Round number.
          num_negatives: Negatives per positive.

        Returns:
          A ``tff.simulation.datasets.ClientData``.
        """
        # Imported here so that the data pipeline never loads TF/TFF.
        # pylint: disable=g-import-not-at-top
        import tensorflow as tf
        import tensorflow_federated as tff
        # pylint: enable=g-import-not-at-top

        batches = self.round_batches(range(self.num_users), seed=seed,
                                     round_num=round_num,
                                     num_negatives=num_negatives)
        sizes = np.array([len(items) for items, _ in batches], dtype=np.int64)
        offsets = tf.constant(np.concatenate([[0], np.cumsum(sizes)]),
                              dtype=tf.int64)
        all_items = tf.constant(
            np.concatenate([b[0] for b in batches]) if batches else
            np.zeros(0, np.int32), dtype=tf.int32)
        all_labels = tf.constant(
            np.concatenate([b[1] for b in batches]) if batches else
            np.zeros(0, np.float32), dtype=tf.float32)

        def dataset_fn(client_id: Any) -> Any:
            user = tf.strings.to_number(client_id, out_type=tf.int64)
            start, stop = offsets[user], offsets[user + 1]
            return tf.data.Dataset.from_tensor_slices({
                'item': all_items[start:stop],
                'label': all_labels[start:stop],
            })

        return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
            [str(u) for u in range(self.num_users)], dataset_fn)
