"""The number-with-uncertainty every table and claim shows, and the interval arithmetic behind it.

* :class:`Estimate`: a value, its 95 % interval ``[lo, hi]``, a standard error and the number of items.
* Small-sample intervals: :func:`wilson` (a rate of 0/1 outcomes: never ``1.00 ± 0.00``) and
  :func:`t_interval` (a mean with a Student-t quantile, e.g. 16 documents' NLL).
* Bootstrap intervals from replicates: :func:`percentile_interval` and :func:`bca_interval` (Efron's
  bias-corrected and accelerated interval; the acceleration from a stratified jackknife,
  :func:`acceleration`), and the two-sided p-value each one implies at a null value
  (:func:`replicate_p_value`): the smallest ``α`` at which the ``1 − α`` interval excludes the null, so an
  interval and its p-value never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["ALPHA", "LEVEL", "NOT_MEASURED", "N_RESAMPLES", "NAN_ESTIMATE", "REPRODUCED", "REVERSED",
           "UNRESOLVED", "Z95",
           "Estimate", "acceleration", "bca_interval", "percentile_interval", "replicate_p_value",
           "t_interval", "t_p_value", "t_quantile", "wilson"]

#: Coverage of every interval.
LEVEL = 0.95
#: The test level that goes with it.
ALPHA = 1 - LEVEL
#: Bootstrap replicates by default.
N_RESAMPLES = 2000
#: The three verdict words.
REPRODUCED, REVERSED, UNRESOLVED = "reproduced", "reversed", "not resolved at this sample size"
#: What a claim reads in place of a verdict when it measured nothing (every cell degenerate, no variation):
#: more of the same data would not resolve it.
NOT_MEASURED = "not measured"
Z95 = 1.959963984540054  # standard normal quantile of (1 + LEVEL) / 2: a 95 % interval is ±Z95 stderr


@dataclass(frozen=True)
class Estimate:
    """A number with its uncertainty: ``value``, the 95 % interval ``[lo, hi]``, the standard error and
    ``n`` (items; for a comparison the unique items behind it)."""

    value: float
    lo: float
    hi: float
    stderr: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def excludes_zero(self) -> int:
        """+1 when the interval lies above 0, -1 below, 0 when it covers 0 (or is undefined)."""
        return self.excludes(0.0)

    def excludes(self, null: float) -> int:
        """+1 when the interval lies above ``null``, -1 below, 0 when it covers it (or is undefined)."""
        return 1 if self.lo > null else -1 if self.hi < null else 0

    def fmt(self, digits: int = 2, signed: bool = False) -> str:
        """``0.62 ± 0.05`` (half the interval's width); ``n/a`` when undefined."""
        if not math.isfinite(self.value):
            return "n/a"
        sign = "+" if signed else ""
        if not math.isfinite(self.half_width):
            return f"{self.value:{sign}.{digits}f}"
        return f"{self.value:{sign}.{digits}f} ± {self.half_width:.{digits}f}"

    def interval(self, digits: int = 2) -> str:
        """``[lo, hi]``."""
        return f"[{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"


NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan, math.nan, 0)


def t_quantile(df: float, level: float = LEVEL) -> float:
    """Student-t quantile of ``(1 + level) / 2`` (``t_{0.975, 2} = 4.30``: three organisms)."""
    return float(stats.t.ppf((1 + level) / 2, df)) if df > 0 else math.inf


def wilson(count: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a rate ``count / n`` of 0/1 outcomes (stays inside [0, 1], never of zero
    width at 0 or 1)."""
    if n <= 0:
        return math.nan, math.nan
    z = float(stats.norm.ppf((1 + level) / 2))
    p = count / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if count == 0 else max(0.0, centre - half)), (1.0 if count == n else min(1.0, centre + half))


def t_interval(mean: float, se: float, df: float, level: float = LEVEL) -> tuple[float, float]:
    """``mean ± t_{df} · se``; NaN when undefined (``df < 1`` or no standard error; ``se == 0`` gives the
    point, an interval of no width)."""
    if not (df >= 1 and math.isfinite(se) and math.isfinite(mean)):
        return math.nan, math.nan
    h = t_quantile(df, level) * se
    return mean - h, mean + h


def t_p_value(mean: float, se: float, df: float, null: float = 0.0) -> float:
    """Two-sided t-test p-value of ``mean`` against ``null``; NaN when undefined, and when ``se == 0``: a
    standard error of 0 measures no variation, so it supports no p-value (never ``p = 0``)."""
    if not (df >= 1 and math.isfinite(se) and se > 0 and math.isfinite(mean)):
        return math.nan
    return float(2 * stats.t.sf(abs(mean - null) / se, df))


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The ``(1 ± level) / 2`` quantiles of the finite replicates."""
    r = replicates[np.isfinite(replicates)]
    if r.size < 2:
        return math.nan, math.nan
    lo, hi = np.quantile(r, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def acceleration(jackknife: Sequence[np.ndarray]) -> float:
    """BCa acceleration ``a = Σ U³ / (6 (Σ U²)^{3/2})`` from a stratified jackknife: one array of
    leave-one-out values per stratum, ``U_i = (n_h − 1)(mean_h − θ_(i))``; 0 when undefined."""
    parts = []
    for values in jackknife:
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v)]
        if v.size > 1:
            parts.append((v.size - 1) * (v.mean() - v))
    if not parts:
        return 0.0
    u = np.concatenate(parts)
    s2 = float((u ** 2).sum())
    return float((u ** 3).sum() / (6 * s2 ** 1.5)) if s2 > 0 else 0.0


def _bias(replicates: np.ndarray, value: float) -> float:
    """BCa's ``z0 = Φ⁻¹(P*(θ* < θ̂))`` (ties count half), the share clipped inside ``(0, 1)``."""
    r = replicates[np.isfinite(replicates)]
    share = (np.sum(r < value) + 0.5 * np.sum(r == value)) / r.size
    return float(stats.norm.ppf(np.clip(share, 0.5 / r.size, 1 - 0.5 / r.size)))


def bca_interval(replicates: np.ndarray, value: float, accel: float, level: float = LEVEL
                 ) -> tuple[float, float]:
    """Efron's BCa interval: the replicates' quantiles at ``Φ(z0 + (z0 + z)/(1 − a(z0 + z)))`` for
    ``z = Φ⁻¹((1 ± level)/2)``, ``z0`` the median bias of the replicates, ``a`` :func:`acceleration`."""
    r = replicates[np.isfinite(replicates)]
    if r.size < 2 or not math.isfinite(value):
        return math.nan, math.nan
    z0 = _bias(r, value)
    z = stats.norm.ppf([(1 - level) / 2, (1 + level) / 2])
    levels = stats.norm.cdf(z0 + (z0 + z) / (1 - accel * (z0 + z)))
    lo, hi = np.quantile(r, np.clip(levels, 0, 1))
    return float(lo), float(hi)


def replicate_p_value(replicates: np.ndarray, value: float, null: float = 0.0, accel: float | None = None
                      ) -> float:
    """Two-sided p-value at ``null`` implied by the percentile interval (``accel`` None) or the BCa
    interval (``accel`` a number): the smallest ``α`` whose ``1 − α`` interval excludes ``null``. It cannot
    go below ``1 / R`` for ``R`` replicates."""
    r = replicates[np.isfinite(replicates)]
    if r.size < 2 or not math.isfinite(value):
        return math.nan
    share = (np.sum(r < null) + 0.5 * np.sum(r == null)) / r.size
    share = float(np.clip(share, 0.5 / r.size, 1 - 0.5 / r.size))
    if accel is None:
        tail = share
    else:  # invert zq = z0 + (z0 + za) / (1 − a (z0 + za)) for the level za whose bound sits at the null
        z0, zq = _bias(r, value), float(stats.norm.ppf(share))
        u = (zq - z0) / (1 + accel * (zq - z0))
        tail = float(stats.norm.cdf(u - z0))
    return float(min(1.0, 2 * min(tail, 1 - tail)))
