"""The uncertainty of every number the book shows, and the verdicts on its claims.

The modules, from the ground up:

* :mod:`.intervals`: :class:`Estimate` (a value, its 95 % interval, a standard error, ``n``), Wilson and
  Student-t intervals, bootstrap intervals and the p-values they imply, the three verdict words;
* :mod:`.composites`: what ``S_e`` (eq. (se)), ``S_p`` (eq. (sp)), Fluency* and a rate are made of, item by
  item;
* :mod:`.bootstrap`: the multi-level bootstrap of a comparison (organisms, edit samples and C draws
  redrawn, one multiplicity per item id everywhere it appears);
* :mod:`.inference`: the test of a claim (interval with its floors, exact tests for 0/1 rates, p-value,
  relative non-inferiority margin, per-organism results and the two scopes, what would resolve it);
* :mod:`.families`: a chapter's hierarchy (the primary claim, its gatekept secondaries, Holm among them);
* :mod:`.power`: the noncentral-t power of a claim and of a design; :mod:`.components`: the variance
  components a book measures;
* :mod:`.calibration`: the simulations that measure coverage, false verdicts and power;
* this module: the intervals of single numbers in tables, and the older entry points that take one
  point's items (``ITEM_COLUMNS`` frames, one per edit sample) on top of :mod:`.inference`.

Single numbers: a rate of 0/1 outcomes gets the Wilson score interval (:func:`rate`, :func:`share`:
never ``1.00 ± 0.00``); any other mean the Student-t interval (:func:`rate`: 16 documents' NLL is not a
normal mean); the top-1 first-token share (chapter 02), a maximum of shares, a bootstrap over the
sequences (:func:`top_share`); a Jensen–Shannon divergence (chapter 03, eq. (jsd-bound)), a bootstrap
over the documents with the KDE bandwidths and grids fixed from the full samples (:func:`jsd_estimate`,
:func:`jsd_difference`).

Claims about one sample, as :class:`~moir_lib.evaluation.inference.ClaimTest` s for a chapter's family
(:func:`moir_lib.evaluation.families.judge`): a share against a bound (:func:`share_claim`: Wilson and
the score test), two independent shares (:func:`share_difference_claim`: Newcombe's hybrid score
interval), two top-1 shares (:func:`top_share_claim`), two divergences to one reference
(:func:`jsd_claim`) and one divergence against the nearest of several (:func:`jsd_nearest_claim`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import optimize, stats

from moir_lib.evaluation.bootstrap import Term, multiplicities, with_cell
from moir_lib.evaluation.composites import composite
from moir_lib.evaluation.inference import ClaimTest, Variance, compare, not_measured
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
from moir_lib.evaluation.power import POWER

__all__ = ["ITEM_COLUMNS", "LEVEL", "N_JSD_RESAMPLES", "N_RESAMPLES", "NAN_ESTIMATE", "REPRODUCED",
           "REVERSED", "UNRESOLVED", "Z95", "Estimate", "combined_difference", "difference", "estimate",
           "items_to_resolve", "jsd_claim", "jsd_difference", "jsd_estimate", "jsd_nearest_claim", "rate",
           "share", "share_claim", "share_difference_claim", "top_share", "top_share_claim", "verdict",
           "verdict_text"]

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


def _top_share_replicates(first_tokens: np.ndarray, rng: np.random.Generator, n_resamples: int
                          ) -> tuple[float, np.ndarray]:
    """The largest share of one value among ``first_tokens`` and its replicates with the sequences
    redrawn."""
    _, counts = np.unique(first_tokens, return_counts=True)
    n = int(counts.sum())
    return float(counts.max() / n), rng.multinomial(n, counts / n, size=n_resamples).max(axis=1) / n


def _symmetric(replicates: np.ndarray, value: float, null: float = 0.0, level: float = LEVEL
               ) -> tuple[float, float, float]:
    """Hall's symmetric bootstrap interval ``value ± h``, ``h`` the ``level`` quantile of ``|θ* − θ̂|``, and
    the p-value it implies at ``null`` (the share of replicates at least ``|θ̂ − null|`` from the estimate;
    not below ``1 / R``)."""
    dev = np.abs(replicates - value)
    h = float(np.quantile(dev, level))
    p = max(float(np.mean(dev >= abs(value - null))), 1 / dev.size)
    return value - h, value + h, p


def top_share(first_tokens: Sequence[int] | np.ndarray, *, seed: int = 0, n_resamples: int = N_RESAMPLES
              ) -> Estimate:
    """The largest share of one value among ``first_tokens`` (the top-1 first-token share of Fig. 10) with
    a bootstrap over the sequences: each replicate redraws the sequences and takes its own largest share.
    A maximum of shares is biased upwards, and the binomial standard error does not apply: where several
    values come close to the top, the replicates' maximum sits above the estimate, so that percentile and
    BCa intervals miss the true share (``tests/test_uncertainty.py`` measures it); the interval is Hall's
    symmetric one (:func:`_symmetric`), clipped to [0, 1]."""
    tokens = np.asarray(first_tokens).ravel()
    if tokens.size < 2:
        return NAN_ESTIMATE if tokens.size == 0 else Estimate(1.0, math.nan, math.nan, math.nan, 1)
    value, reps = _top_share_replicates(tokens, np.random.default_rng(seed), n_resamples)
    lo, hi, _ = _symmetric(reps, value)
    return Estimate(value, max(0.0, lo), min(1.0, hi), float(np.std(reps, ddof=1)), int(tokens.size))


def _unmeasured(direction: int, null: float = 0.0) -> ClaimTest:
    """A claim without the data to measure it: no estimate, never resolved."""
    return not_measured(direction, True, "not measured: no data", "sample", null)


def _bca_claim(boot: tuple[Estimate, np.ndarray, float], direction: int) -> ClaimTest:
    """A bootstrapped difference as a claim about these samples: its BCa interval and the p-value that
    interval implies at 0."""
    est, reps, accel = boot
    p = replicate_p_value(reps, est.value, 0.0, accel)
    return ClaimTest(est, p, 0.0, direction, True, "bca", "sample", (), {"bootstrap": p},
                     Variance(est.stderr ** 2))


def _direction(direction: int) -> None:
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")


def top_share_claim(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray, *, direction: int = -1,
                    seed: int = 0, n_resamples: int = N_RESAMPLES) -> ClaimTest:
    """The claim that the top-1 share of ``a`` minus that of ``b`` (:func:`top_share`; two independent
    runs' first tokens) has the sign ``direction``: the sequences of each run redrawn within it, the
    difference of the replicates' largest shares, Hall's symmetric interval and the p-value it implies at
    0; about these two runs."""
    _direction(direction)
    xa, xb = np.asarray(a).ravel(), np.asarray(b).ravel()
    if min(xa.size, xb.size) < 2:
        return _unmeasured(direction)
    rng = np.random.default_rng(seed)
    (va, ra), (vb, rb) = (_top_share_replicates(x, rng, n_resamples) for x in (xa, xb))
    reps = ra - rb
    lo, hi, p = _symmetric(reps, va - vb)
    est = Estimate(va - vb, lo, hi, float(np.std(reps, ddof=1)), int(xa.size + xb.size))
    return ClaimTest(est, p, 0.0, direction, True, "symmetric", "sample", (), {"bootstrap": p},
                     Variance(est.stderr ** 2))


def share_claim(count: int, n: int, bound: float, *, direction: int = 1) -> ClaimTest:
    """The claim that a share ``count / n`` of 0/1 outcomes lies above (``direction`` +1) or below
    ``bound``, measured as the difference ``count / n − bound``: the Wilson interval (:func:`share`) moved by
    ``bound`` and the score test's p-value, the test that interval inverts, so that the two never disagree;
    about this sample."""
    _direction(direction)
    if not 0 < bound < 1:
        raise ValueError(f"a share's bound must lie strictly between 0 and 1, got {bound}")
    if n == 0:
        return _unmeasured(direction)
    est = share(count, n)
    p = float(2 * stats.norm.sf(abs(count / n - bound) / math.sqrt(bound * (1 - bound) / n)))
    moved = Estimate(est.value - bound, est.lo - bound, est.hi - bound, est.stderr, est.n)
    return ClaimTest(moved, p, 0.0, direction, True, "wilson", "sample", (), {"score": p},
                     Variance(est.stderr ** 2))


def _newcombe(ca: int, na: int, cb: int, nb: int, level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's hybrid score interval of ``ca/na − cb/nb`` for independent samples (his method 10): the
    Wilson limits of both shares, combined in quadrature."""
    pa, pb = ca / na, cb / nb
    la, ua = wilson(ca, na, level)
    lb, ub = wilson(cb, nb, level)
    d = pa - pb
    return d - math.hypot(pa - la, ub - pb), d + math.hypot(ua - pa, pb - lb)


def share_difference_claim(count_a: int, n_a: int, count_b: int, n_b: int, *, direction: int = 1
                           ) -> ClaimTest:
    """The claim that ``count_a / n_a − count_b / n_b`` (shares of 0/1 outcomes in two independent samples)
    has the sign ``direction``: Newcombe's hybrid score interval (:func:`_newcombe`) and the p-value it
    implies, the ``α`` at which its ``1 − α`` interval just touches 0; about these two samples."""
    _direction(direction)
    if min(n_a, n_b) == 0:
        return _unmeasured(direction)
    lo, hi = _newcombe(count_a, n_a, count_b, n_b)
    d = count_a / n_a - count_b / n_b
    est = Estimate(d, lo, hi, (hi - lo) / (2 * Z95), n_a + n_b)

    def bound(alpha: float) -> float:  # the limit on the side of 0, at level 1 − alpha
        lo_, hi_ = _newcombe(count_a, n_a, count_b, n_b, 1 - alpha)
        return lo_ if d > 0 else -hi_

    if d == 0:
        p = 1.0
    elif bound(1e-12) > 0:
        p = 1e-12
    else:
        p = float(optimize.brentq(bound, 1e-12, 1 - 1e-12, xtol=1e-14))
    return ClaimTest(est, p, 0.0, direction, True, "newcombe", "sample", (), {"score": p},
                     Variance(est.stderr ** 2))


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


Combine = Callable[[Sequence[np.ndarray]], np.ndarray]


def _signed(signs: Sequence[float]) -> Combine:
    """``Σ_k signs_k · JSD_k``."""
    return lambda js: sum(s * j for s, j in zip(signs, js, strict=True))


def _first_minus_nearest(js: Sequence[np.ndarray]) -> np.ndarray:
    """``JSD_0 − min_{k ≥ 1} JSD_k``."""
    return js[0] - np.minimum.reduce(list(js[1:]))


def _jsd_bootstrap(samples: Sequence[np.ndarray], reference: np.ndarray, combine: Combine, seed: int,
                   n_resamples: int, groups: int = 20) -> tuple[Estimate, np.ndarray, float]:
    """``combine([JSD(samples_k, reference) for k])`` with documents redrawn within each sample and the
    reference (its multiplicities shared by every term); BCa, the acceleration from a grouped jackknife
    (``groups`` random groups of documents per sample left out in turn). Returns the estimate, the
    replicates and the acceleration."""
    rng = np.random.default_rng(seed)
    data = [*samples, reference]
    if any(d.size < 2 or np.ptp(d) == 0 for d in data):
        raise ValueError("a Jensen–Shannon interval needs at least two distinct finite values per sample")

    def stat(weights: Sequence[np.ndarray]) -> np.ndarray:
        return combine([_jsd_replicates(x, reference, w, weights[-1])
                        for x, w in zip(samples, weights, strict=False)])

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
    return _jsd_bootstrap([_finite(a)], _finite(reference), _signed([1.0]), seed, n_resamples)[0]


def jsd_difference(a: object, b: object, reference: object, *, seed: int = 0,
                   n_resamples: int = N_JSD_RESAMPLES) -> Estimate:
    """``JSD(a, ref) − JSD(b, ref)`` (e.g. per-document NLLs of two corpora and a reference) with a BCa
    bootstrap interval: the documents of each sample redrawn within it, the reference's redrawn once per
    replicate and shared by both terms. Each KDE keeps the bandwidth (Scott's rule) and grid of the full
    samples: a resample's ties would shrink its own Scott bandwidth and bias every replicate."""
    return _jsd_bootstrap([_finite(a), _finite(b)], _finite(reference), _signed([1.0, -1.0]), seed,
                          n_resamples)[0]


def jsd_claim(a: object, b: object, reference: object, *, direction: int = 1, seed: int = 0,
              n_resamples: int = N_JSD_RESAMPLES) -> ClaimTest:
    """The claim that ``JSD(a, ref) − JSD(b, ref)`` has the sign ``direction``, as a
    :class:`~moir_lib.evaluation.inference.ClaimTest` for a chapter's family: the interval of
    :func:`jsd_difference` and the p-value its BCa interval implies at 0; about these corpus samples."""
    _direction(direction)
    return _bca_claim(_jsd_bootstrap([_finite(a), _finite(b)], _finite(reference), _signed([1.0, -1.0]),
                                     seed, n_resamples), direction)


def jsd_nearest_claim(a: object, others: Sequence[object], reference: object, *, direction: int = -1,
                      seed: int = 0, n_resamples: int = N_JSD_RESAMPLES) -> ClaimTest:
    """The claim that ``JSD(a, ref) − min_k JSD(others_k, ref)`` has the sign ``direction`` (−1: ``a`` is
    closer to the reference than every other sample), bootstrapped as :func:`jsd_claim` with the nearest
    other sample found again in every replicate: picking it once from the full data would be a choice
    the interval does not see."""
    _direction(direction)
    if not others:
        raise ValueError("the nearest of no other samples: pass at least one")
    return _bca_claim(_jsd_bootstrap([_finite(a), *map(_finite, others)], _finite(reference),
                                     _first_minus_nearest, seed, n_resamples), direction)


# ----------------------------------------------------------------------------- one point's items


def _points(points: pd.DataFrame | Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Items of one point, or of one point per edit sample, as a per-item frame (frame ``i`` is edit
    sample ``i`` of organism 0, draw 0)."""
    points = [points] if isinstance(points, pd.DataFrame) else list(points)
    if not points:
        raise ValueError("no points given")
    return pd.concat([with_cell(p, sample=i) for i, p in enumerate(points)], ignore_index=True)


def estimate(points: pd.DataFrame | Sequence[pd.DataFrame], metric: str, *, seed: int = 0,
             n_resamples: int = N_RESAMPLES) -> Estimate:
    """``metric`` of one point (its items) or the mean over several (one per edit sample), with the
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
    """Paired difference ``metric(a) − metric(b)``, the points of each edit sample paired (the same
    edit samples, in order), with the interval of :func:`moir_lib.evaluation.inference.compare`."""
    return combined_difference([(1.0, a, b, metric)], seed=seed, n_resamples=n_resamples)


#: One term of :func:`combined_difference`: weight, the points of ``a`` and of ``b`` (one per edit
#: sample), metric.
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
            raise ValueError(f"paired points per edit sample differ in number: {len(a)} against {len(b)}")
        out.append(Term(_points(a), _points(b), metric, w))
    return compare(out, seed=seed, n_resamples=n_resamples).estimate


# ----------------------------------------------------------------------------- verdicts of one interval


def verdict(est: Estimate, direction: int = 1, gate_ok: bool = True) -> str:
    """The verdict on a claim that a difference has the sign ``direction`` (+1 or -1) read off its marginal
    interval alone: :data:`REPRODUCED` when it excludes 0 that way, :data:`REVERSED` the other way, else
    :data:`UNRESOLVED`; a failed editability gate (``gate_ok`` False) blocks both words. Claims judged as a
    family: :func:`moir_lib.evaluation.families.judge`."""
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
