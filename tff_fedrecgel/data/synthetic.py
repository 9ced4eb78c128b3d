"""A small, learnable synthetic interaction log (deterministic given a seed).

Generative model:

- Item popularity is long-tailed: item ``j`` gets Zipf weight
  ``1 / rank_j ** popularity_exponent`` for a random permutation of ranks.
- Each item has latent factors ``v_j ~ N(0, I_d)``; each user a starting
  preference ``a_u ~ N(0, I_d / d)`` and a drift
  ``b_u ~ N(0, drift^2 I_d / d)``.
- Users are heterogeneous and sparse: ``n_u = min_interactions +
  floor(LogNormal)`` with mean ``mean_interactions`` (capped at half the
  items and, when there are more than 104 items, at ``num_items - 100`` to
  leave room for the 99 held-out negatives), so every user survives the
  >= 5 filter.
- A user's ``s``-th interaction (progress ``s / n_u``) picks, without
  replacement, item ``j`` with probability proportional to
  ``popularity_j * exp(<a_u + progress * b_u, v_j> / temperature)``.
- Timestamps increase within a user (a random start plus positive gaps), so
  the latest interaction, the test item, follows the drifted preference.

Rows are returned in global timestamp order, like a log.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import math
import numbers
import os
from typing import Any

import numpy as np
import pandas as pd

from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import OptionError


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic generator (defaults: a 2-minute demo).

    Attributes:
      num_users: Number of users.
      num_items: Number of items.
      latent_dim: Dimension of the latent factors.
      mean_interactions: Mean interactions per user.
      min_interactions: Minimum interactions per user.
      popularity_exponent: Zipf exponent of item popularity.
      temperature: Softmax temperature of the latent score.
      drift: Size of the preference drift over a user's history.
      seed: Seed of ``numpy.random.default_rng``.
    """

    num_users: int = 500
    num_items: int = 400
    latent_dim: int = 8
    mean_interactions: float = 20.0
    min_interactions: int = 5
    popularity_exponent: float = 0.8
    temperature: float = 0.5
    drift: float = 0.5
    seed: int = 0

    def validate(self) -> None:
        """Checks the parameters' types and ranges and the memory they need.

        Raises:
          OptionError: On a parameter of the wrong type or out of range, or
            a size needing more memory than this machine has.
        """
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            integral = field.type == 'int'
            if isinstance(value, bool) or not isinstance(
                    value, numbers.Integral if integral else numbers.Real):
                _refuse(field.name, f'must be {"an integer" if integral else "a number"}, '
                        f'got {value!r}')
            if not integral and not math.isfinite(value):
                _refuse(field.name, f'must be a finite number, got {value!r}')
        _at_least('num_users', self.num_users, 1)
        _at_least('min_interactions', self.min_interactions, 1)
        _at_least('num_items', self.num_items, 2 * self.min_interactions)
        _at_least('latent_dim', self.latent_dim, 1)
        _at_least('seed', self.seed, 0)
        for name in ('num_users', 'num_items', 'latent_dim', 'min_interactions'):
            if getattr(self, name) > MAX_COUNT:
                _refuse(name, f'must be <= {MAX_COUNT}, got {getattr(self, name)!r}')
        if self.seed > MAX_SEED:
            _refuse('seed', f'must be <= {MAX_SEED}, got {self.seed!r}')
        if self.mean_interactions <= self.min_interactions:
            _refuse('mean_interactions', 'must exceed min_interactions, got '
                    f'{self.mean_interactions!r}')
        if self.temperature <= 0:
            _refuse('temperature', f'must be > 0, got {self.temperature!r}')
        need, have = self.memory_estimate(), available_memory()
        if need > have:
            largest = 'num_users' if self.num_users >= self.num_items else 'num_items'
            _refuse(largest, f'={getattr(self, largest)} needs about {_size(need)} of '
                    f'memory (num_users {self.num_users}, num_items {self.num_items}), '
                    f'more than this machine\'s {_size(have)}; lower it')

    def memory_estimate(self) -> int:
        """Bytes a run on this data needs at least (generation, split, model).

        A lower bound of the largest terms, so that sizes that cannot fit
        are refused before anything runs; sizes that pass may still need
        more.
        """
        users, items = self.num_users, self.num_items
        rows = users * min(self.mean_interactions, items / 2)
        # The generator's per-user arrays and one row of picks per user.
        generation = users * (2 * self.latent_dim * 8 + self.mean_interactions * 8)
        # The frame, its sort, the split and the clients' batches.
        data = rows * _BYTES_PER_ROW
        # Embeddings with their optimizer moments; 100 candidates per user.
        model = (users + items) * _BYTES_PER_EMBEDDING + users * 100 * 8
        return int(generation + data + model + items * self.latent_dim * 8)


# Below this many bytes per row and per user or item embedding no run fits.
_BYTES_PER_ROW = 64
_BYTES_PER_EMBEDDING = 32 * 4 * 3
# Ids are int32 in the split; the seed is numpy's.
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**32 - 1


def available_memory() -> int:
    """Physical memory of this machine in bytes (very large if unknown)."""
    try:
        return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, AttributeError):
        return 2**62


def _size(num_bytes: float) -> str:
    for unit in ('B', 'KB', 'MB', 'GB', 'TB', 'PB'):
        if num_bytes < 1024 or unit == 'PB':
            return f'{num_bytes:.1f} {unit}'
        num_bytes /= 1024
    return f'{num_bytes:.1f} PB'


def _refuse(option: str, problem: str):
    raise OptionError('synthetic', option, problem)


def _at_least(option: str, value, low) -> None:
    if value < low:
        _refuse(option, f'must be >= {low}, got {value!r}')


def check_options(options: Mapping[str, Any]) -> None:
    """Checks synthetic data options (`SyntheticConfig` fields).

    Raises:
      OptionError: As `SyntheticConfig.validate`.
    """
    try:
        config = dataclasses.replace(SyntheticConfig(), **options)
    except TypeError as e:
        raise DataError(f'synthetic: {e}') from None
    config.validate()


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticTruth:
    """The hidden parameters that generated a synthetic log.

    User and item indices here are the raw ids of the generated frame.

    Attributes:
      user_start: float64 [num_users, d] starting preferences.
      user_drift: float64 [num_users, d] preference drift over the history.
      item_factors: float64 [num_items, d].
      item_log_popularity: float64 [num_items], log of normalized popularity.
      temperature: Softmax temperature.
    """

    user_start: np.ndarray
    user_drift: np.ndarray
    item_factors: np.ndarray
    item_log_popularity: np.ndarray
    temperature: float

    def logits(self, users: np.ndarray, items: np.ndarray, *,
               progress: float = 1.0) -> np.ndarray:
        """Log-odds of the generator for user/item pairs (broadcasting).

        Args:
          users: Raw user ids, e.g. shape [U, 1].
          items: Raw item ids, e.g. shape [U, C].
          progress: Position in the user's history (1.0 = the end).

        Returns:
          ``log popularity + <a_u + progress * b_u, v_j> / temperature``.
        """
        users = np.asarray(users)
        items = np.asarray(items)
        prefs = self.user_start[users] + progress * self.user_drift[users]
        score = np.einsum('...d,...d->...', prefs, self.item_factors[items])
        return self.item_log_popularity[items] + score / self.temperature


# Largest users x items block drawn at once (float64 logits: 128 MB).
_BLOCK_ENTRIES = 1 << 24
# Above this many users x items, the one-pass approximate draw is used.
_EXACT_LIMIT = 1 << 26


def _interaction_counts(config: SyntheticConfig,
                        rng: np.random.Generator) -> np.ndarray:
    extra_mean = config.mean_interactions - config.min_interactions
    sigma = 1.0
    # So that E[LogNormal] = extra_mean.
    mu = np.log(extra_mean) - sigma ** 2 / 2
    extra = np.floor(rng.lognormal(mu, sigma, size=config.num_users))
    cap = config.num_items // 2
    # Leave room for the 99 held-out negatives whenever the catalogue allows.
    if config.num_items - 100 >= config.min_interactions:
        cap = min(cap, config.num_items - 100)
    cap = max(config.min_interactions, cap)
    return np.minimum(config.min_interactions + extra.astype(np.int64), cap)


def _draw_exact(config, rng, counts, start, drift, items_v, log_pop):
    """Sequential draws: step t uses the user's preference at t / count."""
    u, i = len(counts), len(log_pop)
    picks = np.empty((u, int(counts.max())), dtype=np.int64)
    # Users in blocks, so memory stays bounded for large populations (a
    # small population is one block).
    block = max(1, _BLOCK_ENTRIES // i)
    for lo in range(0, u, block):
        hi = min(u, lo + block)
        chosen = np.zeros((hi - lo, i), dtype=bool)
        block_counts = counts[lo:hi]
        for step in range(int(block_counts.max())):
            active = np.flatnonzero(block_counts > step)
            progress = (step / block_counts[active])[:, None]
            prefs = start[lo + active] + progress * drift[lo + active]
            logits = log_pop + prefs @ items_v.T / config.temperature
            # Gumbel-max: one categorical draw per active user, no repeats.
            logits = logits + rng.gumbel(size=logits.shape)
            logits[chosen[active]] = -np.inf
            pick = np.argmax(logits, axis=1)
            picks[lo + active, step] = pick
            chosen[active, pick] = True

    return picks


def _draw_large(config, rng, counts, start, drift, items_v, log_pop):
    """One-pass draws for large populations (users x items over the limit).

    Each user's candidates are proposed by popularity (``4 n_u + 64`` of
    them); Gumbel-top-k on the latent score (at the user's mid-sequence
    preference) picks its items among the distinct ones, so choices still
    follow popularity x exp(score / T); the picks are then ordered along the
    user's drift, so later interactions lean the way the preference moves.
    A user whose proposals hold fewer distinct items than it needs gets
    fewer interactions (never below the minimum in practice). Users are
    drawn in chunks of about `_BLOCK_ENTRIES / 16` proposals, each a flat
    run of every user's own proposals (no padding), all sorts vectorized.

    Returns:
      ``(items, counts)``: every user's items in order, users one after the
      other, and the number of items of each user.
    """
    u = len(counts)
    cdf = np.cumsum(np.exp(log_pop))
    cdf /= cdf[-1]
    widths = 4 * counts + 64
    budget = _BLOCK_ENTRIES // 16
    ends = np.cumsum(widths)
    chosen_parts, new_counts = [], np.zeros(u, dtype=np.int64)
    lo = 0
    while lo < u:
        # Users lo..hi-1: at least one, proposals within the budget.
        hi = max(lo + 1, int(np.searchsorted(ends, ends[lo] - widths[lo] + budget, 'right')))
        hi = min(hi, u)
        width = widths[lo:hi]
        rows = np.repeat(np.arange(hi - lo), width)
        candidates = np.minimum(np.searchsorted(cdf, rng.random(len(rows))), len(cdf) - 1)
        prefs = start[lo:hi] + 0.5 * drift[lo:hi]
        keys = np.einsum('nd,nd->n', prefs[rows], items_v[candidates]) / config.temperature
        keys += rng.gumbel(size=len(keys))
        # One copy of each (user, candidate): its first proposal.
        order = np.lexsort((candidates, rows))
        rows, candidates, keys = rows[order], candidates[order], keys[order]
        first = np.r_[True, (rows[1:] != rows[:-1]) | (candidates[1:] != candidates[:-1])]
        rows, candidates, keys = rows[first], candidates[first], keys[first]
        # Each user's best `need` distinct candidates (largest keys first).
        order = np.lexsort((-keys, rows))
        rows, candidates = rows[order], candidates[order]
        distinct = np.bincount(rows, minlength=hi - lo)
        starts = np.cumsum(distinct) - distinct
        rank = np.arange(len(rows)) - starts[rows]
        take = rank < counts[lo:hi][rows]
        rows, candidates = rows[take], candidates[take]
        # Along the drift: later interactions lean the way preferences move.
        along = np.einsum('nd,nd->n', items_v[candidates], drift[lo:hi][rows])
        order = np.lexsort((along, rows))
        chosen_parts.append(candidates[order])
        new_counts[lo:hi] = np.bincount(rows, minlength=hi - lo)
        lo = hi
    return np.concatenate(chosen_parts), new_counts


def generate_synthetic_with_truth(
        config: SyntheticConfig | None = None,
        **kwargs) -> tuple[pd.DataFrame, SyntheticTruth]:
    """Generates a synthetic log and returns its hidden parameters too.

    Args:
      config: Parameters; fields may also be given as keyword arguments
        (which override ``config``).
      **kwargs: `SyntheticConfig` fields.

    Returns:
      ``(frame, truth)``; ``frame`` has the raw schema ``user``, ``item``,
      ``timestamp`` (int ids, int64 timestamps).

    Raises:
      DataError: On bad parameters.
    """
    try:
        config = dataclasses.replace(config or SyntheticConfig(), **kwargs)
    except TypeError as e:
        raise DataError(f'synthetic: {e}') from None
    config.validate()
    rng = np.random.default_rng(config.seed)
    u, i, d = config.num_users, config.num_items, config.latent_dim

    ranks = rng.permutation(i) + 1
    popularity = ranks.astype(np.float64) ** -config.popularity_exponent
    log_pop = np.log(popularity / popularity.sum())
    items_v = rng.normal(size=(i, d))
    start = rng.normal(scale=1 / np.sqrt(d), size=(u, d))
    drift = rng.normal(scale=config.drift / np.sqrt(d), size=(u, d))
    counts = _interaction_counts(config, rng)

    if u * i <= _EXACT_LIMIT:
        picks = _draw_exact(config, rng, counts, start, drift, items_v, log_pop)
        items = picks[np.arange(picks.shape[1])[None, :] < counts[:, None]]
        del picks
    else:
        items, counts = _draw_large(config, rng, counts, start, drift, items_v, log_pop)

    users = np.repeat(np.arange(u, dtype=np.int64), counts)
    gaps = rng.geometric(1 / 3600, size=len(users)).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    gaps[first] = rng.integers(0, 10_000_000, size=u)  # Each user's start time.
    timestamps = np.cumsum(gaps)
    timestamps -= np.repeat(timestamps[first] - gaps[first], counts)
    # Log order: by timestamp, then user (a stable sort, as pandas' would).
    order = np.lexsort((users, timestamps))
    frame = pd.DataFrame({'user': users[order], 'item': items[order],
                          'timestamp': timestamps[order]})
    del order
    truth = SyntheticTruth(user_start=start, user_drift=drift,
                           item_factors=items_v, item_log_popularity=log_pop,
                           temperature=config.temperature)
    return frame, truth


def generate_synthetic(config: SyntheticConfig | None = None,
                       **kwargs) -> pd.DataFrame:
    """Generates a synthetic log (see the module docstring).

    Args:
      config: Parameters; fields may also be given as keyword arguments.
      **kwargs: `SyntheticConfig` fields, e.g. ``num_users=500, seed=0``.

    Returns:
      A frame with ``user``, ``item``, ``timestamp``.

    Raises:
      DataError: On bad parameters.
    """
    return generate_synthetic_with_truth(config, **kwargs)[0]
