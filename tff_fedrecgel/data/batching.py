"""Packing users' round batches into padded groups and shards (numpy only).

A TFF client of the simulation may stand for a group of users whose batches
are stacked into one padded `[users, length]` array; the reconstruction of
user embeddings for evaluation packs users the same way, and the
multi-worker round splits a cohort's TFF clients into shards. All of these
pack with the functions here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Padded lengths are rounded up to a multiple of this, so rounds repeat a few
# shapes instead of bringing new ones (TFF's worker keeps memory per shape,
# and every new shape retraces the compiled functions).
PAD_MULTIPLE = 64
# A vectorized TFF client's padded size (users x longest batch): large enough
# for throughput, small enough for the worker's memory.
DEFAULT_MAX_GROUP_EXAMPLES = 16384

Batch = tuple[np.ndarray, np.ndarray]


class PaddedBatches(NamedTuple):
    """Users' batches stacked and zero-padded to one length.

    Attributes:
      items: int32 `[users, length]`.
      labels: float32 `[users, length]`.
      lengths: int32 `[users]`, each user's true batch length.
    """

    items: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray


def padded_length(length: int, multiple: int = PAD_MULTIPLE) -> int:
    """The padded length of a group whose longest batch is `length`."""
    return max(1, -(-int(length) // multiple)) * multiple


def pad_batches(batches: Sequence[Batch], *, multiple: int = PAD_MULTIPLE) -> PaddedBatches:
    """Stacks per-user `(items, labels)` batches into one padded group.

    Args:
      batches: One `(items, labels)` pair per user, any lengths.
      multiple: The padded length is a multiple of this.

    Returns:
      The `PaddedBatches`.

    Raises:
      ValueError: If there are no batches or a user's items and labels differ
        in length.
    """
    if not len(batches):
        raise ValueError('a group needs at least one user')
    lengths = np.array([len(i) for i, _ in batches], np.int32)
    width = padded_length(int(lengths.max()), multiple)
    items = np.zeros([len(batches), width], np.int32)
    labels = np.zeros([len(batches), width], np.float32)
    for row, (user_items, user_labels) in enumerate(batches):
        if len(user_items) != len(user_labels):
            raise ValueError(f'user {row}: {len(user_items)} items but '
                             f'{len(user_labels)} labels')
        items[row, :len(user_items)] = user_items
        labels[row, :len(user_labels)] = user_labels
    return PaddedBatches(items, labels, lengths)


def group_by_length(lengths: Sequence[int], *, max_examples: int,
                    max_users: int | None = None,
                    multiple: int = PAD_MULTIPLE) -> list[list[int]]:
    """Splits users into groups of similar length under a padded-size budget.

    Users are taken longest first (ties by index), and a group closes when
    adding the next user would make `users x padded length` exceed
    `max_examples` (a user alone may exceed it) or the group hold more than
    `max_users`. Deterministic.

    Args:
      lengths: Each user's batch length.
      max_examples: Budget of padded examples per group (bounds memory).
      max_users: Optional bound on users per group (1: one user per group).
      multiple: Padding multiple (see `padded_length`).

    Returns:
      Groups of indices into `lengths`, longest users first.

    Raises:
      ValueError: On a non-positive budget or user bound.
    """
    if max_examples < 1 or (max_users is not None and max_users < 1):
        raise ValueError('max_examples and max_users must be positive')
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    groups, current, width = [], [], 0
    for i in order:
        # Longest first: a group's first user sets its padded length.
        length = padded_length(int(lengths[i]), multiple)
        full = max_users is not None and len(current) >= max_users
        if current and (full or width * (len(current) + 1) > max_examples):
            groups.append(current)
            current = []
        if not current:
            width = length
        current.append(i)
    if current:
        groups.append(current)
    return groups


def split_into_shards(costs: Sequence[float], num_shards: int) -> list[list[int]]:
    """Splits clients into at most `num_shards` shards of similar total cost.

    Greedy longest-first assignment; deterministic; shards keep the clients
    in their original order and empty shards are dropped.

    Args:
      costs: Each client's cost (its examples).
      num_shards: How many shards at most.

    Returns:
      Lists of client indices.
    """
    loads = [0.0] * num_shards
    shards = [[] for _ in range(num_shards)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(num_shards), key=lambda s: (loads[s], s))
        shards[target].append(i)
        loads[target] += costs[i]
    return [sorted(s) for s in shards if s]
