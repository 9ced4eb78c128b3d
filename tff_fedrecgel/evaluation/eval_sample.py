"""Evaluation on a fixed sample of users, with standard errors.

When a population is too large to evaluate every round, `--eval_users=N`
evaluates N of its users drawn once from a seed of their own: the sample
depends only on the population (its size), never on the round, the method
or the run's seed, so every run on the same split compares the same users.

A metric's mean over the sample estimates its mean over the population;
its standard error is that of a mean of a simple random sample drawn
without replacement, ``sqrt((1 - n / N) * s^2 / n)`` with ``s^2`` the
sample variance of the per-user values (0 when the sample is everyone).

Rule (docs/PERFORMANCE.md, "Scale"): evaluate everyone (the default) while
an evaluation costs less than the rounds between two of them; past that, a
sample of 10,000 users bounds the standard error of HR@10 by
``sqrt(0.25 / 10000) = 0.005``.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import numpy as np

# Seed of the evaluation sample (users of the population of this size).
EVAL_SAMPLE_SEED = 20_240_930
# Suffix of a metric's standard error in released metrics and the summary.
STDERR_SUFFIX = '_se'


def sample_positions(population: int, count: int | None) -> np.ndarray | None:
    """Which members of a population of `population` users are evaluated.

    Args:
      population: Users of the population (e.g. the training users).
      count: Users to evaluate; None, or at least `population`: everyone.

    Returns:
      Sorted int64 positions into the population, or None for everyone.
    """
    if count is None or count >= population:
        return None
    rng = np.random.default_rng([EVAL_SAMPLE_SEED, population])
    return np.sort(rng.choice(population, size=count, replace=False)).astype(np.int64)


def add_standard_errors(means: Mapping[str, float], mean_squares: Mapping[str, float],
                        count: int, population: int) -> collections.OrderedDict:
    """The means followed by the standard error of each (`<name>_se`).

    Args:
      means: Per-metric means over the `count` evaluated users.
      mean_squares: Per-metric means of the squared per-user values.
      count: Users evaluated (n).
      population: Users the sample was drawn from (N >= n).

    Returns:
      OrderedDict of floats: `means`, then `<name>_se` for each name.
    """
    out = collections.OrderedDict((k, float(v)) for k, v in means.items())
    correction = max(0.0, 1.0 - count / population) if population else 0.0
    for name, mean in means.items():
        if count < 2:
            out[name + STDERR_SUFFIX] = float('nan')
            continue
        variance = max(0.0, (mean_squares[name] - mean * mean) * count / (count - 1))
        out[name + STDERR_SUFFIX] = float(np.sqrt(correction * variance / count))
    return out


def summarize(values: Mapping[str, np.ndarray], population: int | None
              ) -> collections.OrderedDict:
    """Means of per-user metric values, with standard errors for a sample.

    Args:
      values: Per-metric arrays of per-user values (one entry per user).
      population: Users the evaluated ones were sampled from, or None when
        they are the whole population (no standard errors).

    Returns:
      OrderedDict of floats: the means, then (for a sample) `<name>_se`.
    """
    means = collections.OrderedDict(
        (k, float(np.mean(v, dtype=np.float64))) for k, v in values.items())
    if population is None:
        return means
    squares = {k: float(np.mean(np.square(np.asarray(v, np.float64)))) for k, v in values.items()}
    count = len(next(iter(values.values()))) if values else 0
    return add_standard_errors(means, squares, count, population)
