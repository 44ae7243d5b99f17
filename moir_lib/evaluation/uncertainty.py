"""The uncertainty of every number the book shows, and the verdicts on its claims.

The modules, from the ground up:

* :mod:`.intervals`: :class:`Estimate` (a value, its 95 % interval, a standard error, ``n``), Wilson and
  Student-t intervals, bootstrap intervals and the p-values they imply, the three verdict words;
* :mod:`.composites`: what ``S_e`` (eq. (se)), ``S_p`` (eq. (sp)), Fluency* and a rate are made of, item by
  item;
* :mod:`.bootstrap`: the multi-level bootstrap of a comparison (organisms, edit samples and C draws
  redrawn, one multiplicity per item id everywhere it appears);
* :mod:`.inference`: the test of a claim (interval with its floors, exact tests for 0/1 rates, p-value,
  non-inferiority margin, Holm within a chapter, per-organism results, what would resolve it);
* :mod:`.calibration`: the simulations that measure coverage, false verdicts and power;
* this module: the intervals of single numbers in tables, and the older entry points that take one
  point's items (``ITEM_COLUMNS`` frames, one per edit-sample seed) on top of :mod:`.inference`.

Single numbers: a rate of 0/1 outcomes gets the Wilson score interval (:func:`rate`, :func:`share`:
never ``1.00 ± 0.00``); any other mean the Student-t interval (:func:`rate`: 16 documents' NLL is not a
normal mean); the top-1 first-token share (chapter 02), a maximum of shares, a bootstrap over the
sequences (:func:`top_share`); a Jensen–Shannon divergence (chapter 03, eq. (jsd-bound)), a bootstrap
over the documents with the KDE bandwidths and grids fixed from the full samples (:func:`jsd_estimate`,
:func:`jsd_difference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from moir_lib.evaluation.bootstrap import Term, multiplicities, with_cell
from moir_lib.evaluation.composites import composite
from moir_lib.evaluation.inference import POWER, ClaimTest, Variance, compare
from moir_lib.evaluation.intervals import (
    ALPHA,
    LEVEL,
    N_RESAMPLES,
    NAN_ESTIMATE,
    REPRODUCED,
    REVERSED,
    UNRESOLVED,
    Z95,
    Estimate,
    acceleration,
    bca_interval,
    replicate_p_value,
    t_interval,
    wilson,
)

__all__ = ["ITEM_COLUMNS", "LEVEL", "N_JSD_RESAMPLES", "N_RESAMPLES", "NAN_ESTIMATE", "REPRODUCED",
           "REVERSED", "UNRESOLVED", "Z95", "Estimate", "combined_difference", "difference", "estimate",
           "items_to_resolve", "jsd_claim", "jsd_difference", "jsd_estimate", "rate", "share", "top_share",
           "verdict", "verdict_text"]

#: Columns of a point's items table: ``group`` (``edit``, ``preservation``, ``nll``), ``unit`` (``record``,
#: a preservation task's label, a pocket domain), ``item`` (record case id, document id), ``metric``,
#: ``value``; ``key`` and ``n_edits`` name the point as its rows do.
ITEM_COLUMNS: tuple[str, ...] = ("key", "n_edits", "group", "unit", "item", "metric", "value")
#: Bootstrap resamples of a Jensen–Shannon interval.
N_JSD_RESAMPLES = 1000


# ----------------------------------------------------------------------------- single numbers


def rate(values: Sequence[float] | np.ndarray) -> Estimate:
    """Mean of the finite ``values`` with the standard error of the mean (``s / √n``): the Wilson interval
    when every value is 0 or 1, else the Student-t interval (``n − 1`` df)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN_ESTIMATE
    mean = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan
    if np.isin(x, (0.0, 1.0)).all():
        return Estimate(mean, *wilson(float(x.sum()), int(x.size)), se, int(x.size))
    return Estimate(mean, *t_interval(mean, se, x.size - 1), se, int(x.size))


def share(count: int, n: int) -> Estimate:
    """A share ``count / n`` of 0/1 outcomes (a leakage rate, one token's share) as :func:`rate` gives it for
    those outcomes: Wilson interval, standard error ``√(p(1-p)/(n-1))``."""
    if not 0 <= count <= n:
        raise ValueError(f"a share needs 0 <= count <= n, got {count} of {n}")
    return rate(np.r_[np.ones(count), np.zeros(n - count)])


def top_share(first_tokens: Sequence[int] | np.ndarray, *, seed: int = 0, n_resamples: int = N_RESAMPLES
              ) -> Estimate:
    """The largest share of one value among ``first_tokens`` (the top-1 first-token share of Fig. 10) with
    a bootstrap over the sequences: each replicate redraws the sequences and takes its own largest share
    (a maximum of shares, biased upwards, to which the binomial standard error does not apply); BCa
    interval, the acceleration from the exact leave-one-sequence-out jackknife."""
    _, counts = np.unique(np.asarray(first_tokens), return_counts=True)
    n = int(counts.sum())
    if n < 2:
        return NAN_ESTIMATE if n == 0 else Estimate(1.0, math.nan, math.nan, math.nan, 1)
    value = float(counts.max() / n)
    reps = np.random.default_rng(seed).multinomial(n, counts / n, size=n_resamples).max(axis=1) / n
    top2 = np.sort(counts)[-2:] if len(counts) > 1 else np.r_[0, counts]
    # leaving out one sequence of value v: the largest count is the top one less one where v is the top
    loo = np.where(counts == counts.max(), np.maximum(counts.max() - 1, top2[0]), counts.max()) / (n - 1)
    a = acceleration([np.repeat(loo, counts)])
    return Estimate(value, *bca_interval(reps, value, a), float(np.std(reps, ddof=1)), n)


def _finite(values: object) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


def _jsd_replicates(x: np.ndarray, ref: np.ndarray, wx: np.ndarray, wref: np.ndarray) -> np.ndarray:
    """``JSD(x, ref)`` under document weights (rows of ``wx``, ``wref``): grid and bandwidths fixed from the
    full samples as :func:`moir_lib.analysis.divergence.jensen_shannon` draws them."""
    from moir_lib.analysis.divergence import common_grid, js_of_densities, kde_on_grid, scott_bandwidth

    grid = common_grid(x, ref)
    return js_of_densities(kde_on_grid(x, grid, scott_bandwidth(x), wx),
                           kde_on_grid(ref, grid, scott_bandwidth(ref), wref))


def _jsd_bootstrap(samples: Sequence[np.ndarray], reference: np.ndarray, signs: Sequence[float], seed: int,
                   n_resamples: int, groups: int = 20) -> tuple[Estimate, np.ndarray, float]:
    """``Σ_k signs_k · JSD(samples_k, reference)`` with documents redrawn within each sample and the
    reference (its multiplicities shared by every term); BCa, the acceleration from a grouped jackknife
    (``groups`` random groups of documents per sample left out in turn). Returns the estimate, the
    replicates and the acceleration."""
    rng = np.random.default_rng(seed)
    data = [*samples, reference]
    if any(d.size < 2 or np.ptp(d) == 0 for d in data):
        raise ValueError("a Jensen–Shannon interval needs at least two distinct finite values per sample")

    def stat(weights: Sequence[np.ndarray]) -> np.ndarray:
        return sum(s * _jsd_replicates(x, reference, w, weights[-1])
                   for s, x, w in zip(signs, samples, weights, strict=False))

    value = float(stat([np.ones((1, d.size)) for d in data])[0])
    reps = stat([multiplicities(rng, d.size, n_resamples) for d in data])
    jack = []
    for h, d in enumerate(data):
        g = min(groups, d.size)
        left_out = np.arange(g)[:, None] == (rng.permutation(d.size) % g)[None, :]
        jack.append(stat([1.0 - left_out if i == h else np.ones((g, e.size)) for i, e in enumerate(data)]))
    a = acceleration(jack)
    return (Estimate(value, *bca_interval(reps, value, a), float(np.std(reps, ddof=1)),
                     int(sum(d.size for d in data))), reps, a)


def jsd_estimate(a: object, reference: object, *, seed: int = 0, n_resamples: int = N_JSD_RESAMPLES
                 ) -> Estimate:
    """``JSD(a, ref)`` (nats, eq. (jsd-bound)) with a bootstrap interval over the documents of both samples
    (:func:`jsd_difference`)."""
    return _jsd_bootstrap([_finite(a)], _finite(reference), [1.0], seed, n_resamples)[0]


def jsd_difference(a: object, b: object, reference: object, *, seed: int = 0,
                   n_resamples: int = N_JSD_RESAMPLES) -> Estimate:
    """``JSD(a, ref) − JSD(b, ref)`` (e.g. per-document NLLs of two corpora and a reference) with a BCa
    bootstrap interval: the documents of each sample redrawn within it, the reference's redrawn once per
    replicate and shared by both terms. Each KDE keeps the bandwidth (Scott's rule) and grid of the full
    samples: a resample's ties would shrink its own Scott bandwidth and bias every replicate."""
    return _jsd_bootstrap([_finite(a), _finite(b)], _finite(reference), [1.0, -1.0], seed, n_resamples)[0]


def jsd_claim(a: object, b: object, reference: object, *, direction: int = 1, seed: int = 0,
              n_resamples: int = N_JSD_RESAMPLES) -> ClaimTest:
    """The claim that ``JSD(a, ref) − JSD(b, ref)`` has the sign ``direction``, as a
    :class:`~moir_lib.evaluation.inference.ClaimTest` for a chapter's family: the interval of
    :func:`jsd_difference` and the p-value its BCa interval implies at 0; about these corpus samples."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    est, reps, accel = _jsd_bootstrap([_finite(a), _finite(b)], _finite(reference), [1.0, -1.0], seed,
                                      n_resamples)
    p = replicate_p_value(reps, est.value, 0.0, accel)
    return ClaimTest(est, p, 0.0, direction, True, "bca", "sample", (), {"bootstrap": p},
                     Variance(est.stderr ** 2))


# ----------------------------------------------------------------------------- one point's items


def _points(points: pd.DataFrame | Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Items of one point, or of one point per edit-sample seed, as a per-item frame (seed ``i`` is edit
    sample ``i`` of organism 0, draw 0)."""
    points = [points] if isinstance(points, pd.DataFrame) else list(points)
    if not points:
        raise ValueError("no points given")
    return pd.concat([with_cell(p, sample=i) for i, p in enumerate(points)], ignore_index=True)


def estimate(points: pd.DataFrame | Sequence[pd.DataFrame], metric: str, *, seed: int = 0,
             n_resamples: int = N_RESAMPLES) -> Estimate:
    """``metric`` of one point (its items) or the mean over several (one per edit-sample seed), with the
    interval of :func:`moir_lib.evaluation.inference.compare`; a single rate or mean of one point:
    :func:`rate`."""
    frame = _points(points)
    comp = composite(metric, frame)
    if frame["sample"].nunique() == 1 and not comp.harmonic and not comp.constituents[0].denominator:
        c = comp.constituents[0]
        sel = frame[(frame["group"] == c.group) & (frame["unit"] == c.unit) & (frame["metric"] == c.metric)]
        return rate(sel["value"].to_numpy())
    return compare(Term(frame, None, metric), seed=seed, n_resamples=n_resamples).estimate


def difference(a: pd.DataFrame | Sequence[pd.DataFrame], b: pd.DataFrame | Sequence[pd.DataFrame],
               metric: str, *, seed: int = 0, n_resamples: int = N_RESAMPLES) -> Estimate:
    """Paired difference ``metric(a) − metric(b)``, the points of each seed paired (same seeds, in order),
    with the interval of :func:`moir_lib.evaluation.inference.compare`."""
    return combined_difference([(1.0, a, b, metric)], seed=seed, n_resamples=n_resamples)


#: One term of :func:`combined_difference`: weight, the points of ``a`` and of ``b`` (one per seed), metric.
Points = "pd.DataFrame | Sequence[pd.DataFrame]"
PointTerm = tuple[float, Points, Points, str]


def combined_difference(terms: Sequence[PointTerm], *, seed: int = 0, n_resamples: int = N_RESAMPLES
                        ) -> Estimate:
    """``Σ_t w_t · (metric_t(a_t) − metric_t(b_t))`` in one multi-level bootstrap (e.g. Table 2's Total),
    each term as in :func:`difference`."""
    out = []
    for w, a, b, metric in terms:
        a = [a] if isinstance(a, pd.DataFrame) else list(a)
        b = [b] if isinstance(b, pd.DataFrame) else list(b)
        if len(a) != len(b):
            raise ValueError(f"paired points per seed differ in number: {len(a)} against {len(b)}")
        out.append(Term(_points(a), _points(b), metric, w))
    return compare(out, seed=seed, n_resamples=n_resamples).estimate


# ----------------------------------------------------------------------------- verdicts of one interval


def verdict(est: Estimate, direction: int = 1, gate_ok: bool = True) -> str:
    """The verdict on a claim that a difference has the sign ``direction`` (+1 or -1) read off its marginal
    interval alone: :data:`REPRODUCED` when it excludes 0 that way, :data:`REVERSED` the other way, else
    :data:`UNRESOLVED`; a failed editability gate (``gate_ok`` False) blocks both words. Claims judged as a
    family: :func:`moir_lib.evaluation.inference.judge`."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    side = est.excludes_zero() * direction
    if side == 0 or not gate_ok:
        return UNRESOLVED
    return REPRODUCED if side > 0 else REVERSED


def items_to_resolve(est: Estimate) -> int | None:
    """Unique items at which a difference of this size would resolve at 80 % power, every part of its
    standard error shrinking as ``1/√n``: ``n · ((z_{α/2} + z_{0.8}) · se / |value|)²``; None when the
    interval already excludes 0 or the difference is 0 or undefined."""
    if est.excludes_zero() or not (math.isfinite(est.value) and est.value != 0 and est.n > 0
                                   and math.isfinite(est.stderr)):
        return None
    z = float(stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER))
    return int(math.ceil(est.n * (z * est.stderr / abs(est.value)) ** 2))


def verdict_text(est: Estimate, direction: int = 1, gate_ok: bool = True, digits: int = 3) -> str:
    """``reproduced (+0.120, 95 % CI [+0.05, +0.19])``, with the unique items that would resolve an
    unresolved difference."""
    word = verdict(est, direction, gate_ok)
    text = f"{word} ({est.value:+.{digits}f}, 95 % CI {est.interval(digits)})" if math.isfinite(est.value) \
        else f"{word} (no paired items)"
    if word == UNRESOLVED and gate_ok:
        need = items_to_resolve(est)
        if need is not None:
            text += f"; about {need} unique items instead of {est.n} would resolve a difference of this size"
    return text
