"""Confidence intervals and verdicts for the benchmark's ratios (pure Python: no TensorFlow).

A ratio of two variants is estimated from paired segments: in each round every
variant runs one short segment, so round `i` gives one log-ratio
`log(variant_i / baseline_i)` of per-step times measured seconds apart. The
machine's slow drifts hit both members of a pair alike and cancel in the
log-ratio. The estimate is the geometric mean of the paired ratios and its
interval is Student's t-interval on the mean log-ratio, mapped back through
`exp`. A goal gets a verdict only when its interval lies wholly on one side of
the target.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

MET, MISSED, UNDECIDED, REPORTED, NOT_RUN = "met", "missed", "undecided", "reported", "not run"


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate and its confidence interval.

    Attributes:
        estimate: The point estimate (a ratio, or a median).
        low: The interval's lower end (None with fewer than 2 samples).
        high: The interval's upper end (None with fewer than 2 samples).
        samples: How many samples (rounds, or values) it rests on.
        confidence: The interval's confidence level, e.g. 0.95.
    """

    estimate: float
    low: float | None
    high: float | None
    samples: int
    confidence: float

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the interval (False when there is no interval)."""
        return self.low is not None and self.high is not None and self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | int | None]:
        """The fields as a dict (for the JSON)."""
        return dataclasses.asdict(self)


def _check_confidence(confidence: float) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(
            f"Invalid value for argument `confidence`. Received: confidence={confidence!r}. "
            "Expected a number strictly between 0 and 1, e.g. 0.95."
        )


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """The cumulative distribution function of Student's t with `df` degrees of freedom."""
    tail = 0.5 * _regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(probability: float, df: int) -> float:
    """The `probability` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if probability < 0.5:
        return -t_quantile(1.0 - probability, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < probability:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if t_cdf(middle, df) < probability else (low, middle)
    return 0.5 * (low + high)


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
) -> Interval | None:
    """The ratio of two paired series and its t-interval on the log scale.

    Args:
        numerator: Per-step times of the variant, one per round.
        denominator: Per-step times of the baseline, from the same rounds.
        confidence: The interval's confidence level.

    Returns:
        The geometric mean of the paired ratios with its interval (no
        interval with one pair), or None without a usable pair.

    Raises:
        ValueError: the series differ in length, or `confidence` is not in (0, 1).
    """
    _check_confidence(confidence)
    if len(numerator) != len(denominator):
        raise ValueError(
            f"Invalid value for argument `denominator`. Received {len(denominator)} values for "
            f"{len(numerator)} numerator values. Expected one per round, paired."
        )
    logs = [math.log(a / b) for a, b in zip(numerator, denominator, strict=True) if a > 0 and b > 0]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Interval(math.exp(mean), None, None, 1, confidence)
    half = t_quantile(0.5 + confidence / 2.0, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs), confidence)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """The median of `values` and a distribution-free interval for it (from order statistics).

    The interval is `[x_(j), x_(n+1-j)]` of the sorted values with the largest
    `j` whose binomial coverage is at least `confidence`; with too few values
    for any such `j` there is no interval.

    Args:
        values: Independent measurements, e.g. the durations of checkpoint saves.
        confidence: The interval's confidence level.

    Returns:
        The median and its interval, or None without values.
    """
    _check_confidence(confidence)
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    low = high = None
    for j in range(n // 2, 0, -1):
        # P(x_(j) <= median <= x_(n+1-j)) = 1 - 2 P(Binomial(n, 1/2) <= j - 1)
        coverage = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0**n
        if coverage >= confidence:
            low, high = ordered[j - 1], ordered[n - j]
            break
    return Interval(statistics.median(ordered), low, high, n, confidence)


def verdict(interval: Interval | None, limit: float | None, strict: bool = False) -> str:
    """Whether an interval meets an upper limit: `met`, `missed` or `undecided`.

    Args:
        interval: The measured interval (None when the comparison did not run).
        limit: The largest allowed value; None for a comparison that is only
            reported.
        strict: The value must be strictly below `limit`.

    Returns:
        `"met"` when the whole interval satisfies the limit, `"missed"` when
        none of it does, `"undecided"` when it straddles the limit (or has no
        interval), `"reported"` without a limit, `"not run"` without an interval.
    """
    if interval is None:
        return NOT_RUN
    if limit is None:
        return REPORTED
    if interval.low is None or interval.high is None:
        return UNDECIDED
    if interval.high < limit or (not strict and interval.high == limit):
        return MET
    if interval.low > limit or (strict and interval.low == limit):
        return MISSED
    return UNDECIDED
