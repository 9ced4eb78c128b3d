"""User-level differential privacy and secure aggregation of the global update.

Only the global (item-side) part of the model is ever aggregated: each sampled
user uploads one update of the global weights, and the user embedding stays on
the device in every mode. The aggregators here replace the plain mean of those
uploads (`build_fedrecgel_process(model_aggregator=...)`):

* `build_dp_aggregator`: TFF's `DifferentiallyPrivateFactory` (the DP-FedAvg
  Gaussian mechanism of McMahan et al. 2018): every upload is clipped to an L2
  norm `clip`, the clipped uploads are summed, Gaussian noise of standard
  deviation `noise_multiplier * clip` is added to the sum, and the sum is
  divided by the expected cohort size. One user is one record, so the
  guarantee is user-level.
* `build_secure_aggregator`: the mean with its sum done by TFF's
  `SecureSumFactory`: clients clip every coordinate to a range, quantize it to
  32-bit integers, and the server only learns the integer sum.
* `dp_epsilon`, `PrivacyReport` (in `privacy_accounting.py`, no TensorFlow):
  the (epsilon, delta) of a number of DP rounds, from `dp_accounting`.

TFF's default (native C++) runtime cannot execute the secure-sum intrinsics;
`use_secure_simulation_context` installs a worker of this process that compiles
them to plain sums of the same quantized integers (no masking, no crypto).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, TYPE_CHECKING

from tff_fedrecgel.privacy_accounting import ACCOUNTANTS  # pylint: disable=unused-import
from tff_fedrecgel.privacy_accounting import MAX_NOISE_MULTIPLIER
from tff_fedrecgel.privacy_accounting import MIN_NOISE_MULTIPLIER
from tff_fedrecgel.privacy_accounting import PrivacyReport
from tff_fedrecgel.privacy_accounting import default_delta
from tff_fedrecgel.privacy_accounting import dp_epsilon  # pylint: disable=unused-import
from tff_fedrecgel.run_settings import SettingError

if TYPE_CHECKING:
    import tensorflow_federated as tff

# An L2 clip beyond this lets clip * noise overflow float32 weights.
MAX_CLIP = 1e6
# TFF's secure sum quantizes floats to integers in [0, 2**32 - 1].
SECURE_SUM_BITS = 32
# Adaptive secure-sum range of `tff.learning.secure_aggregator`: start at 50,
# then track twice the 95th percentile of the clients' largest |coordinate|.
_ADAPTIVE_RANGE_INITIAL = 50.0
_ADAPTIVE_RANGE_QUANTILE = 0.95
_ADAPTIVE_RANGE_MULTIPLIER = 2.0
# Integer weights (0 or 1 uniform, or example counts) fit below this.
_MAX_WEIGHT_SUM_INPUT = float(2**20 - 1)


def build_dp_aggregator(
    *,
    noise_multiplier: float,
    clients_per_round: int,
    clip: float | None = None,
    adaptive_clip: bool = False,
    target_unclipped_quantile: float = 0.5,
    clip_learning_rate: float = 0.2,
    clipped_count_stddev: float | None = None,
    secure: bool = False,
) -> tff.aggregators.UnweightedAggregationFactory:
    """Builds the user-level DP mean of the uploads (Gaussian mechanism).

    The result is `(sum_i clip_C(u_i) + N(0, (z C)^2 I)) / clients_per_round`
    with `z = noise_multiplier`. It is an unweighted factory: a dropped
    (non-finite) client contributes a zero update, which keeps the sensitivity
    at `C`.

    With `adaptive_clip`, `C` follows the `target_unclipped_quantile` of the
    upload norms (Andrew et al. 2021), estimated from a noised count of
    unclipped clients. TFF treats `noise_multiplier` as the total of both
    Gaussian mechanisms and raises the update's own multiplier to
    `(z^-2 - (2 * clipped_count_stddev)^-2)^-1/2`, so `dp_epsilon` is called
    with `noise_multiplier` itself in both modes.

    Args:
      noise_multiplier: `z >= 0`; 0 clips without noise (no privacy).
      clients_per_round: The cohort size (the denominator of the mean).
      clip: The L2 clip `C`; required for fixed clipping, the initial clip
        (default 0.1) with `adaptive_clip`.
      adaptive_clip: Adapt the clip to a quantile of the upload norms.
      target_unclipped_quantile: Adaptive: the quantile the clip tracks.
      clip_learning_rate: Adaptive: the geometric update's learning rate.
      clipped_count_stddev: Adaptive: noise of the unclipped count (TFF's
        default `0.05 * clients_per_round`).
      secure: Sum the clipped uploads with `SecureSumFactory` over the range
        `[-C, C]` (fixed clipping only): after L2 clipping every coordinate is
        in that range, so the range clips nothing more.

    Returns:
      A `tff.aggregators.UnweightedAggregationFactory`.

    Raises:
      ValueError: On a negative multiplier, a missing or non-positive clip,
        secure aggregation with an adaptive clip, or adaptive parameters TFF
        rejects (a multiplier too large for the count noise).
    """
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top

    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f'noise_multiplier must be >= 0, got {noise_multiplier}')
    if clients_per_round < 1:
        raise ValueError(f'clients_per_round must be >= 1, got {clients_per_round}')
    if clip is not None and not clip > 0:
        raise ValueError(f'the DP clip must be positive, got {clip}')
    if adaptive_clip:
        if secure:
            # The secure-sum range must bound the clipped upload in advance.
            raise ValueError('secure aggregation with DP needs a fixed clip')
        return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
            noise_multiplier=float(noise_multiplier),
            clients_per_round=float(clients_per_round),
            initial_l2_norm_clip=0.1 if clip is None else float(clip),
            target_unclipped_quantile=target_unclipped_quantile,
            learning_rate=clip_learning_rate,
            clipped_count_stddev=clipped_count_stddev,
        )
    if clip is None:
        raise ValueError('fixed DP clipping needs a clip (or use adaptive clipping)')
    if not secure:
        return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
            noise_multiplier=float(noise_multiplier),
            clients_per_round=float(clients_per_round),
            clip=float(clip),
        )
    # The query of `gaussian_fixed`, with the secure sum as the record sum.
    query = tfp.NormalizedQuery(
        tfp.GaussianSumQuery(
            l2_norm_clip=float(clip), stddev=float(clip * noise_multiplier)
        ),
        denominator=float(clients_per_round),
    )
    _quiet_secure_sum_assert_warnings()
    return tff.aggregators.DifferentiallyPrivateFactory(
        query, record_aggregation_factory=tff.aggregators.SecureSumFactory(float(clip))
    )


def build_secure_aggregator(
    *, bound: float | None = None, weighted: bool = True
) -> tff.aggregators.AggregationFactory:
    """Builds the mean of the uploads with a secure (quantized integer) sum.

    Each client clips every coordinate of its (weighted) upload to
    `[-B, B]` and rounds it to one of `2**32` evenly spaced levels; the
    server receives only the integer sum and maps it back. Per client and
    coordinate the rounding error is at most `B / (2**32 - 1)`
    (`secure_quantization_error`), so the mean differs from the plain mean by
    at most that (plus float32 rounding) as long as no coordinate exceeds `B`.

    Args:
      bound: `B`, a fixed range; None adapts it like
        `tff.learning.secure_aggregator` (start at 50, then twice the 95th
        percentile of the clients' largest |coordinate|, itself estimated
        with secure sums), so a coordinate is clipped only on outliers.
      weighted: A weighted mean (the process's default: dropped clients
        weigh 0) with the weights also summed securely; else an unweighted
        mean (dropped clients count as zero updates).

    Returns:
      A `tff.aggregators` weighted or unweighted factory.

    Raises:
      ValueError: If `bound` is not positive.
    """
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    _quiet_secure_sum_assert_warnings()
    if bound is None:
        value_range = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
            initial_estimate=_ADAPTIVE_RANGE_INITIAL,
            target_quantile=_ADAPTIVE_RANGE_QUANTILE,
            learning_rate=1.0,
            multiplier=_ADAPTIVE_RANGE_MULTIPLIER,
            secure_estimation=True,
        )
    elif not bound > 0:
        raise ValueError(f'the secure-sum bound must be positive, got {bound}')
    else:
        value_range = float(bound)
    value_sum = tff.aggregators.SecureSumFactory(value_range)
    if weighted:
        return tff.aggregators.MeanFactory(
            value_sum_factory=value_sum,
            weight_sum_factory=tff.aggregators.SecureSumFactory(
                upper_bound_threshold=_MAX_WEIGHT_SUM_INPUT, lower_bound_threshold=0.0
            ),
            no_nan_division=True,
        )
    return tff.aggregators.UnweightedMeanFactory(
        value_sum_factory=value_sum,
        count_sum_factory=tff.aggregators.SecureSumFactory(
            upper_bound_threshold=1, lower_bound_threshold=0
        ),
    )


def secure_quantization_error(*, bound: float) -> float:
    """Largest rounding error of one coordinate of one client's secure upload.

    TFF maps `[-B, B]` onto the integers `0 .. 2**32 - 1` and rounds to the
    nearest: a step of `2B / (2**32 - 1)`, half of it at most per value. A sum
    over n clients is off by at most n times this, their mean by this.

    Args:
      bound: The secure-sum range `B`.

    Returns:
      `B / (2**32 - 1)`.
    """
    return bound / (2**SECURE_SUM_BITS - 1)


def use_secure_simulation_context() -> None:
    """Makes TFF's default context able to run the secure-sum intrinsics.

    The native local runtime rejects `federated_secure_sum_bitwidth`; a
    `runtime.LocalRuntime` installed with `secure_sum=True` first compiles
    each secure sum to a plain sum of the quantized integers with range checks
    (TFF's test backend), on a worker that dies with this process. Everything
    else runs as before. Simulation only: nothing is masked or encrypted.
    """
    from tff_fedrecgel import runtime  # pylint: disable=g-import-not-at-top

    runtime.LocalRuntime().install(secure_sum=True)


class _SecureSumAssertFilter(logging.Filter):
    """Drops TensorFlow's "Object was never used" reports of secure-sum asserts.

    TFF's secure-sum quantizer builds a `tf.debugging.assert_less_equal` that
    no op depends on; TensorFlow then logs a false alarm with a traceback
    every time such a graph is collected.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            'Object was never used' in message and 'assert_less_equal' in message
        )


def _quiet_secure_sum_assert_warnings() -> None:
    logger = logging.getLogger('tensorflow')
    if not any(isinstance(f, _SecureSumAssertFilter) for f in logger.filters):
        logger.addFilter(_SecureSumAssertFilter())


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """The privacy of a run: user-level DP and/or secure aggregation.

    Both act on each user's upload, so a run with either needs one user per
    TFF client (`needs_one_user_per_client`).

    Attributes:
      noise_multiplier: DP's Gaussian noise std over the L2 clip; None: no DP
        (0 clips without noise).
      clip: DP's L2 clip of each upload; required for fixed clipping, the
        initial clip (default 0.1) with `adaptive_clip`.
      adaptive_clip: Adapt the clip to the median upload norm.
      delta: The delta of the reported epsilon (None: 1 / users).
      secure_aggregation: Sum the uploads with TFF's secure sum.

    Raises:
      ValueError: On inconsistent settings.
    """

    noise_multiplier: float | None = None
    clip: float | None = None
    adaptive_clip: bool = False
    delta: float | None = None
    secure_aggregation: bool = False

    def __post_init__(self):
        dp_only = [name for name, value in (('clip', self.clip), ('delta', self.delta),
                                            ('adaptive_clip', self.adaptive_clip or None))
                   if value is not None]
        if self.noise_multiplier is None:
            if dp_only:
                raise ValueError(f'{", ".join(dp_only)} needs a DP noise multiplier')
            return
        z = self.noise_multiplier
        if not _is_number(z) or not math.isfinite(z):
            raise SettingError('dp_noise_multiplier', 'must be a finite number', z)
        if z != 0 and not MIN_NOISE_MULTIPLIER <= z <= MAX_NOISE_MULTIPLIER:
            raise SettingError(
                'dp_noise_multiplier', f'must be 0 or in [{MIN_NOISE_MULTIPLIER:g}, '
                f'{MAX_NOISE_MULTIPLIER:g}] (what the DP accountant bounds)', z)
        if self.clip is None and not self.adaptive_clip:
            raise SettingError('dp_clip', 'is required with a noise multiplier (unless '
                               'dp_adaptive_clip)')
        if self.clip is not None and not (_is_number(self.clip) and 0 < self.clip <= MAX_CLIP):
            raise SettingError('dp_clip', f'must be a finite positive number <= {MAX_CLIP:g}',
                               self.clip)
        if self.adaptive_clip and self.secure_aggregation:
            raise ValueError('secure aggregation with DP needs a fixed clip, not an '
                             'adaptive one')
        if self.delta is not None and not (_is_number(self.delta) and 0 < self.delta < 1):
            raise SettingError('dp_delta', 'must be in (0, 1)', self.delta)

    def check_accounting(self, *, clients_per_round: int, num_users: int,
                         total_rounds: int) -> None:
        """Checks that the accountant bounds epsilon for this run (no TFF).

        Raises:
          SettingError: If dp_accounting cannot account the run's rounds at
            its sampling probability.
        """
        if not self.dp:
            return
        report = self.report(clients_per_round=clients_per_round, num_users=num_users)
        for rounds in (1, total_rounds):
            try:
                report.epsilon(rounds)
            except (ArithmeticError, ValueError) as e:
                reason = ' '.join(str(e).split())[:80] or type(e).__name__
                raise SettingError(
                    'dp_noise_multiplier', f'cannot be accounted over {rounds} rounds at '
                    f'sampling probability {report.sampling_probability:.3g} '
                    f'(dp_accounting: {reason})', self.noise_multiplier) from None

    @property
    def dp(self) -> bool:
        return self.noise_multiplier is not None

    @property
    def needs_one_user_per_client(self) -> bool:
        return self.dp or self.secure_aggregation

    def check_client_weighting(self, client_weighting: str) -> None:
        """User-level DP averages users unweighted.

        Raises:
          ValueError: If DP is on and the weighting is not uniform.
        """
        if self.dp and client_weighting != 'uniform':
            raise ValueError('user-level DP averages users unweighted; use uniform '
                             'client weighting')

    def hparams(self, *, num_users: int) -> dict[str, Any]:
        """The settings to record with a run (empty when both are off)."""
        if not self.needs_one_user_per_client:
            return {}
        out = {'secure_aggregation': self.secure_aggregation}
        if self.dp:
            out.update(dp_noise_multiplier=self.noise_multiplier, dp_clip=self.clip,
                       dp_adaptive_clip=self.adaptive_clip,
                       dp_delta=self.delta or default_delta(num_users=num_users))
        return out

    def build(self, *, clients_per_round: int, num_users: int
              ) -> tuple[tff.aggregators.AggregationFactory | None, PrivacyReport | None]:
        """The model aggregator and the `PrivacyReport` of these settings.

        With secure aggregation, TFF's context must run secure sums
        (`runtime.LocalRuntime.install(secure_sum=True)`, or
        `use_secure_simulation_context`).

        Args:
          clients_per_round: The cohort size.
          num_users: The population size.

        Returns:
          `(aggregator, report)`: `(None, None)` for the plain mean; the
          report is None without DP.
        """
        if not self.needs_one_user_per_client:
            return None, None
        if not self.dp:
            return build_secure_aggregator(), None
        aggregator = build_dp_aggregator(
            noise_multiplier=self.noise_multiplier, clients_per_round=clients_per_round,
            clip=self.clip, adaptive_clip=self.adaptive_clip, secure=self.secure_aggregation)
        return aggregator, self.report(clients_per_round=clients_per_round, num_users=num_users)

    def report(self, *, clients_per_round: int, num_users: int) -> PrivacyReport:
        """The accounting of these DP settings for a cohort and population."""
        return PrivacyReport(
            noise_multiplier=self.noise_multiplier,
            sampling_probability=clients_per_round / num_users,
            delta=self.delta or default_delta(num_users=num_users), clip=self.clip,
            adaptive_clip=self.adaptive_clip)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
