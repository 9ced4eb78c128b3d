"""The privacy accounting of user-level DP runs (imports no TensorFlow).

`dp_epsilon` is the (epsilon, delta) of a number of rounds of the
subsampled Gaussian mechanism, from `dp_accounting`; `PrivacyReport` holds
what a run reports per round and in its summary. `privacy.py` builds the
aggregators and re-exports these.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

ACCOUNTANTS = ('rdp', 'pld')
# Noise multipliers dp_accounting bounds (0: no noise, epsilon infinite);
# below it overflows, above its divergences round below zero. A run's own
# rounds and sampling: `PrivacySettings.check_accounting`.
MIN_NOISE_MULTIPLIER = 1e-3
MAX_NOISE_MULTIPLIER = 1e3


def dp_epsilon(
    *,
    noise_multiplier: float,
    sampling_probability: float,
    rounds: int,
    delta: float,
    accountant: str = 'rdp',
) -> float:
    """Epsilon of `rounds` rounds of the subsampled Gaussian mechanism at `delta`.

    Each round is accounted as a Poisson-subsampled Gaussian mechanism
    (`PoissonSampledDpEvent(q, GaussianDpEvent(z))`, add-or-remove-one-user
    neighbours). The simulation samples a fixed-size cohort uniformly without
    replacement; accounting it as Poisson sampling with
    `q = clients_per_round / num_users` is the standard approximation (as in
    DP-FedAvg and TFF's tutorials), not an exact bound for that scheme.
    With adaptive clipping pass the total `noise_multiplier` given to
    `build_dp_aggregator` (TFF splits it between the update and the count).

    Args:
      noise_multiplier: `z`, noise standard deviation over the L2 clip.
      sampling_probability: `q` in (0, 1], the chance a user is in a round.
      rounds: Rounds run so far (>= 0).
      delta: The target delta in (0, 1), usually `1 / num_users`.
      accountant: 'rdp' (Renyi DP, Mironov 2017; fast, slightly loose) or
        'pld' (privacy loss distributions; tighter, slower).

    Returns:
      Epsilon: 0 for no rounds, infinity without noise.

    Raises:
      ValueError: On out-of-range arguments or an unknown accountant.
    """
    if noise_multiplier < 0:
        raise ValueError(f'noise_multiplier must be >= 0, got {noise_multiplier}')
    if not 0 < sampling_probability <= 1:
        raise ValueError(
            f'sampling_probability must be in (0, 1], got {sampling_probability}'
        )
    if rounds < 0:
        raise ValueError(f'rounds must be >= 0, got {rounds}')
    if not 0 < delta < 1:
        raise ValueError(f'delta must be in (0, 1), got {delta}')
    if accountant not in ACCOUNTANTS:
        raise ValueError(f'accountant must be one of {ACCOUNTANTS}, got {accountant!r}')
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import dp_accounting  # pylint: disable=g-import-not-at-top

    if accountant == 'rdp':
        ledger = dp_accounting.rdp.RdpAccountant()
    else:
        ledger = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(
        sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier)
    )
    ledger.compose(event, int(rounds))
    return float(ledger.get_epsilon(delta))


def default_delta(*, num_users: int) -> float:
    """The usual delta for user-level DP: one over the number of users.

    Args:
      num_users: The population size.

    Returns:
      `1 / num_users`.

    Raises:
      ValueError: With fewer than 2 users.
    """
    if num_users < 2:
        raise ValueError(f'delta = 1/num_users needs at least 2 users, got {num_users}')
    return 1.0 / num_users


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """Epsilon per round and the summary fields of a DP run.

    Attributes:
      noise_multiplier: The total noise multiplier `z`.
      sampling_probability: `clients_per_round / num_users`.
      delta: The delta epsilon is reported at.
      clip: The fixed L2 clip, or the initial clip when `adaptive_clip`.
      adaptive_clip: Whether the clip adapts (its value per round is the
        `train/aggregation/dp_query_metrics/clip` metric).
      accountant: See `dp_epsilon`.
    """

    noise_multiplier: float
    sampling_probability: float
    delta: float
    clip: float | None
    adaptive_clip: bool = False
    accountant: str = 'rdp'

    def epsilon(self, rounds: int) -> float:
        """Epsilon after `rounds` rounds."""
        return dp_epsilon(
            noise_multiplier=self.noise_multiplier,
            sampling_probability=self.sampling_probability,
            rounds=rounds,
            delta=self.delta,
            accountant=self.accountant,
        )

    def round_metrics(self, round_num: int) -> dict[str, float]:
        """Training metrics to release with round `round_num`."""
        return {'dp_epsilon': self.epsilon(round_num)}

    def summary(self, rounds: int) -> dict[str, Any]:
        """Summary fields after `rounds` rounds."""
        return {
            'dp_epsilon': self.epsilon(rounds),
            'dp_delta': self.delta,
            'dp_noise_multiplier': self.noise_multiplier,
            'dp_clip': self.clip,
            'dp_adaptive_clip': self.adaptive_clip,
            'dp_accountant': self.accountant,
        }
