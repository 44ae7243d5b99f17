"""The test behind every claim of the book: an interval, a p-value and one verdict word.

A claim is a difference between two arms (:class:`~moir_lib.evaluation.bootstrap.Term`, several for a
combined statistic) and the sign the paper asserts. :func:`compare` measures it:

* **The interval** (:data:`INTERVAL_METHOD`, studentized): ``estimate ± t_df · se`` with the standard error
  of the multi-level bootstrap (:mod:`moir_lib.evaluation.bootstrap`) split into its parts
  (:func:`_spread`): the items' shared part (the replicates with the items alone redrawn) plus the spread
  between the top units (edit samples with one organism, organisms with several), the items' noise
  counted once, with Satterthwaite's df (``U − 1`` where the units dominate). The coverage simulation of
  :mod:`moir_lib.evaluation.calibration` chose it over the bootstrap's own BCa and percentile intervals
  (measured beside it): with items crossed with three edit samples those are too wide where the items
  dominate (the pigeonhole bootstrap counts the item × sample noise three times) and too narrow where the
  samples dominate (three samples redrawn give a short-tailed, ⅔-variance distribution). A bootstrap-t
  interval would need a standard error inside every replicate (``R²`` evaluations).
* **Floors.** The interval is never narrower than the t-interval at the top of the hierarchy: with one
  organism, on its per-cell differences (``cells − 1`` degrees of freedom); with ``K ≥ 2`` organisms, on
  the organism means (``K − 1`` df: ``t_{0.975,2} = 4.30`` at ``K = 3``), which hold their cells'
  spread (a floor on the cells within organisms as well, with one or two cells each, would add a
  t-quantile of 1-3 df and over-cover). The bootstrap cannot know how variable three edit samples or
  three models are. The reported interval is the union of the two.
* **Rates of 0/1 outcomes** (one task's accuracy, an edit rate): with one cell, the exact McNemar test
  and Newcombe's hybrid score interval for paired proportions (his method 10); with several cells the
  interval above, and the verdict also needs the exact item-level sign-flip test of the per-item mean
  differences over cells (:func:`sign_flip_p`; McNemar's exact test when there is one cell).
* **p-values.** Each part implies the two-sided p-value at which it would just touch the null (the
  t-test of the studentized interval and of each floor; for a bootstrap interval,
  :func:`~moir_lib.evaluation.intervals.replicate_p_value`); a claim's p-value is the largest of its parts
  (the union interval excludes the null exactly when every part does; with a sign-flip test beside it, an
  intersection-union test).
* **Non-inferiority** ("does not cost edit quality"): the null is ``−direction · margin``
  (:data:`NONINFERIORITY_MARGIN` in ``S_e``); reproduced when the interval lies above it, reversed when it
  lies below. Superiority: the null is 0.
* **Families** (:func:`judge`): a chapter's claims are one family; Holm's step-down correction of their
  p-values decides the verdict words, while the interval shown stays the marginal 95 % one.
* **Verdicts**: *reproduced* when the Holm-adjusted p-value is below 0.05 and the interval lies on the
  claimed side of the null; *reversed* on the other side; otherwise *not resolved at this sample size*.
  A failed editability gate blocks both words. With one cell the verdict is about that sample, with one
  organism about that model.
* **Per organism**: each organism's own estimate and interval (its samples and draws redrawn, its cells'
  floor) and whether it resolves on its own; "k of K organisms agree in sign and are resolved".
* **What would resolve it** (:class:`Resolution`): unique items at 80 % power,
  ``n · z² V_items / (Δ² − z² V_between)`` with ``z = z_{α/2} + z_{0.8}`` (``n · (z · se_items / Δ)²``
  when nothing varies between cells), or, when the between-sample (between-organism) variance alone keeps
  the interval over the null, the further samples (organisms) that would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from moir_lib.evaluation.bootstrap import Resampled, Term, resample
from moir_lib.evaluation.composites import composite
from moir_lib.evaluation.intervals import (
    ALPHA,
    LEVEL,
    N_RESAMPLES,
    REPRODUCED,
    REVERSED,
    UNRESOLVED,
    Estimate,
    acceleration,
    bca_interval,
    percentile_interval,
    replicate_p_value,
    t_interval,
    t_p_value,
    t_quantile,
    wilson,
)
from moir_lib.evaluation.scores import EDIT_SCORES

__all__ = ["INTERVAL_METHOD", "NONINFERIORITY_MARGIN", "POWER", "ClaimTest", "Judged", "OrganismResult",
           "Resolution", "Variance", "assess", "compare", "holm", "judge", "mcnemar_p", "newcombe_paired",
           "sign_flip_p"]

#: The bootstrap interval of a claim: ``"bca"`` or ``"percentile"`` (chosen by the coverage simulation).
INTERVAL_METHOD = "studentized"
#: Non-inferiority margin in ``S_e`` (eq. (se)): a C "does not cost edit quality" when its ``S_e`` is
#: shown to be at most 0.05 below the other's. Rationale: 0.05 is under half the smallest preservation
#: gain the book reports (ΔS_p ≈ +0.13), so a C that passes pays at most a minor part of what it buys,
#: and it is the resolution at which the paper's tables compare ``S_e`` (two decimals, differences of a few
#: hundredths read as "comparable").
NONINFERIORITY_MARGIN = 0.05
#: Power at which :class:`Resolution` sizes a study.
POWER = 0.8


@dataclass(frozen=True)
class OrganismResult:
    """One organism's own estimate and interval; ``side`` +1 / -1 when that interval alone lies above /
    below the null, 0 when it covers it."""

    organism: int
    estimate: Estimate
    side: int


@dataclass(frozen=True)
class Resolution:
    """What would resolve an unresolved claim at 80 % power: ``items`` (unique items in all, ``n_items``
    today), else ``units`` more ``unit_name`` (samples with one organism, organisms with several);
    neither when both would have to grow."""

    n_items: int
    items: int | None = None
    units: int | None = None
    unit_name: str = "samples"

    def text(self) -> str:
        if self.items is not None:
            return (f"about {self.items} unique items instead of {self.n_items} would resolve a difference "
                    f"of this size")
        if self.units is not None:
            return (f"more items cannot help (the variation between {self.unit_name} alone keeps the "
                    f"interval over the null); about {self.more()} more would")
        return f"neither more items nor more {self.unit_name} alone would resolve it; both would have to grow"

    def more(self) -> str | None:
        """``1 organism``, ``3 samples``: how many more units would resolve it (None: not units)."""
        if self.units is None:
            return None
        return f"{self.units} {self.unit_name.removesuffix('s') if self.units == 1 else self.unit_name}"


@dataclass(frozen=True)
class Variance:
    """What an estimate's variance is made of, to size a study: ``items`` (shrinks as more items are
    scored), ``between`` (shrinks only with more of the ``units`` ``unit_name``: edit samples with one
    organism, organisms with several)."""

    items: float
    between: float = 0.0
    units: int = 0
    unit_name: str = "samples"


@dataclass(frozen=True)
class ClaimTest:
    """A measured claim before its family's correction: the ``estimate`` (marginal 95 % interval, floors
    included; ``n`` the unique items), its two-sided ``p_value`` at ``null``, the claimed ``direction``,
    the editability gate, the interval ``method``, the ``scope`` (``"sample"``, ``"model"``,
    ``"organisms"``), the per-organism results, the parts' p-values and what its variance is made of
    (:meth:`resolution`: what would resolve it)."""

    estimate: Estimate
    p_value: float
    null: float
    direction: int
    gate_ok: bool
    method: str
    scope: str
    organisms: tuple[OrganismResult, ...]
    parts: dict[str, float] = field(default_factory=dict)
    variance: Variance = Variance(math.nan)

    @property
    def agreeing(self) -> int:
        """Organisms that agree in sign with the estimate and are resolved on their own."""
        side = 1 if self.estimate.value > self.null else -1 if self.estimate.value < self.null else 0
        return sum(o.side == side != 0 for o in self.organisms)

    def verdict(self, p: float | None = None, alpha: float = ALPHA) -> str:
        """The verdict word at p-value ``p`` (default the marginal one: a family of one)."""
        p = self.p_value if p is None else p
        side = self.estimate.excludes(self.null)
        if not self.gate_ok or not p < alpha or side == 0:
            return UNRESOLVED
        return REPRODUCED if side == self.direction else REVERSED

    def resolution(self, alpha: float = ALPHA) -> Resolution | None:
        """What would resolve the claim at level ``alpha`` with 80 % power (module docstring); None when it
        resolves at that level, the gate fails or the difference is 0 or undefined."""
        delta2 = (self.estimate.value - self.null) ** 2
        if self.p_value < alpha or not self.gate_ok or not (math.isfinite(delta2) and delta2 > 0):
            return None
        z2 = (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(POWER)) ** 2
        v, n = self.variance, self.estimate.n
        if z2 * v.between < delta2:
            items = math.ceil(n * z2 * v.items / (delta2 - z2 * v.between))
            if items > n or v.between == 0:
                return Resolution(n, items=items, unit_name=v.unit_name)
        if v.units and v.between > 0 and z2 * v.items < delta2:
            total = math.ceil(v.units * z2 * v.between / (delta2 - z2 * v.items))
            return Resolution(n, units=max(1, total - v.units), unit_name=v.unit_name)
        return Resolution(n, unit_name=v.unit_name)


# ----------------------------------------------------------------------------- exact tests for 0/1 rates


def mcnemar_p(n10: int, n01: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pairs (``a`` right ``b`` wrong, and back)."""
    m = n10 + n01
    return 1.0 if m == 0 else float(min(1.0, 2 * stats.binom.cdf(min(n10, n01), m, 0.5)))


def newcombe_paired(n11: int, n10: int, n01: int, n00: int, level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10) for ``p_a − p_b`` of paired 0/1 outcomes, from the
    Wilson intervals of both rates and the correlation of the pairs."""
    n = n11 + n10 + n01 + n00
    pa, pb = (n11 + n10) / n, (n11 + n01) / n
    la, ua = wilson(n11 + n10, n, level)
    lb, ub = wilson(n11 + n01, n, level)
    denom = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    cross = n11 * n00 - n10 * n01
    cross = cross - n / 2 if cross > n / 2 else 0.0 if cross >= 0 else cross
    phi = cross / math.sqrt(denom) if denom > 0 else 0.0
    d = pa - pb
    lo = d - math.sqrt(max(0.0, (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2))
    hi = d + math.sqrt(max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2))
    return max(-1.0, lo), min(1.0, hi)


def sign_flip_p(sums: np.ndarray, counts: np.ndarray, *, max_grid: int = 2_000_000, seed: int = 0) -> float:
    """Exact two-sided sign-flip (randomisation) p-value of ``Σ_i m_i``, ``m_i = sums_i / counts_i`` the
    mean over cells of item ``i``'s difference (integer ``sums`` of 0/1 differences): under the null each
    ``m_i`` is as likely to have the other sign. The distribution of ``Σ ± |m_i|`` is enumerated exactly
    on the grid of ``1 / lcm(counts)``; with one cell per item it is McNemar's exact test. Items scored in
    very different numbers of cells can make that grid longer than ``max_grid``: then 100 000 random
    sign flips (seeded) give ``(1 + hits) / (1 + flips)``."""
    sums, counts = np.asarray(sums, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    keep = (counts > 0) & (sums != 0)
    if not keep.any():
        return 1.0
    scale = math.lcm(*map(int, counts[keep]))
    k = np.abs(sums[keep] * (scale // counts[keep]))
    total = int(k.sum())
    if total > max_grid:
        m, rng = np.abs(sums[keep] / counts[keep]), np.random.default_rng(seed)
        observed = abs(float((sums[keep] / counts[keep]).sum())) - 1e-9
        hits = sum(int(np.sum(np.abs(rng.choice((-1.0, 1.0), size=(10_000, m.size)) @ m) >= observed))
                   for _ in range(10))
        return (1 + hits) / (1 + 100_000)
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for v in map(int, k):  # convolve with ½(δ_{-v} + δ_{+v})
        dist = 0.5 * (np.roll(dist, v) + np.roll(dist, -v))
    observed = abs(int((sums[keep] * (scale // counts[keep])).sum()))
    return float(min(1.0, dist[np.abs(np.arange(-total, total + 1)) >= observed].sum()))


def _paired_rate(terms: Sequence[Term]) -> pd.DataFrame | None:
    """For one term comparing a single 0/1 rate: its paired per-cell, per-item values (``organism, sample,
    draw, item, a, b``); else None."""
    if len(terms) != 1 or terms[0].b is None or terms[0].metric in ("S_p", "Fluency*", *EDIT_SCORES):
        return None
    t = terms[0]
    c = composite(t.metric, pd.concat([f[["group", "unit", "metric", "value"]] for f in (t.a, t.b)]))
    c = c.constituents[0]
    keys = ["organism", "sample", "draw", "item"]
    arms = [f[(f["group"] == c.group) & (f["unit"] == c.unit) & (f["metric"] == c.metric)]
            for f in (t.a, t.b)]
    a, b = (x[keys + ["value"]].assign(item=x["item"].astype(str)) for x in arms)
    pairs = a.merge(b, on=keys, suffixes=("_a", "_b")).dropna()
    if pairs.empty or not np.isin(pairs[["value_a", "value_b"]].to_numpy(), (0.0, 1.0)).all():
        return None
    return pairs.rename(columns={"value_a": "a", "value_b": "b"})


def _rate_one_cell(pairs: pd.DataFrame, direction: int, gate_ok: bool, level: float) -> ClaimTest:
    """McNemar and Newcombe for one cell's paired 0/1 outcomes."""
    a, b = pairs["a"].to_numpy(bool), pairs["b"].to_numpy(bool)
    n11, n10, n01, n00 = (int(np.sum(x)) for x in (a & b, a & ~b, ~a & b, ~a & ~b))
    lo, hi = newcombe_paired(n11, n10, n01, n00, level)
    n = len(pairs)
    z = float(stats.norm.ppf((1 + level) / 2))
    est = Estimate((n10 - n01) / n, lo, hi, (hi - lo) / (2 * z), n)
    p = mcnemar_p(n10, n01)
    org = OrganismResult(int(pairs["organism"].iloc[0]), est, est.excludes(0.0) if p < 1 - level else 0)
    return ClaimTest(est, p, 0.0, direction, gate_ok, "newcombe", "sample", (org,), {"mcnemar": p},
                     Variance(est.stderr ** 2))


# ----------------------------------------------------------------------------- the multi-level interval


@dataclass(frozen=True)
class _Spread:
    """The variance of an estimate by components: ``total = V_items − V_E + V_between`` with its
    Satterthwaite ``df``; ``items`` (``V_items``: what more items shrink) and ``between`` (``V_between −
    V_E``: what only more units shrink)."""

    total: float
    df: float
    items: float
    between: float


def _spread(unit_values: np.ndarray, unit_items: np.ndarray, items: np.ndarray) -> _Spread:
    """Variance components of a mean over units (edit samples, or organisms), items crossed with them.

    ``unit_values`` ``(U,)``: each unit's estimate; ``unit_items`` ``(R, U)`` and ``items`` ``(R,)``: the
    units' and the estimate's replicates with the items alone redrawn. ``V_items = var(items)`` holds the
    items' shared effect ``A`` and their unit-specific noise ``B / U``; the spread of the units' values,
    ``V_between = s²_U / U``, holds the units' own effect ``τ² / U`` and again ``B / U``, which the
    units' item variances ``A + B`` give: ``V_E = (mean_u var(unit_items) − V_items) / (U − 1)``. So
    ``total = V_items − V_E + V_between`` counts every part once; its df are ``V_between``'s ``U − 1``
    weighted by Satterthwaite (the item parts' df taken as infinite)."""
    ok = np.isfinite(unit_values)
    v_items = float(np.nanvar(items, ddof=1))
    u = int(ok.sum())
    if u < 2:
        return _Spread(v_items, math.inf, v_items, 0.0)
    v_units = float(np.var(unit_values[ok], ddof=1) / u)
    v_e = max(0.0, (float(np.mean(np.nanvar(unit_items[:, ok], axis=0, ddof=1))) - v_items) / (u - 1))
    total = max(0.0, v_items - v_e) + v_units
    df = math.inf if v_units == 0 else total ** 2 * (u - 1) / v_units ** 2
    return _Spread(total, df, v_items, max(0.0, v_units - v_e))


def _boot(replicates: np.ndarray, value: float, jackknife: Sequence[np.ndarray] | None, spread: _Spread,
          method: str, null: float, level: float) -> tuple[float, float, float]:
    """``(lo, hi, p)`` of the interval ``method``: ``"studentized"``, ``value ± t_df · √total`` with the
    components' variance and df (:func:`_spread`); or the bootstrap's own ``"bca"`` or ``"percentile"``
    interval (measured beside it by :mod:`moir_lib.evaluation.calibration`)."""
    if method == "studentized":
        se = math.sqrt(spread.total)
        if not se > 0:
            return value, value, 1.0 if value == null else 0.0
        h = t_quantile(spread.df, level) * se
        return value - h, value + h, t_p_value(value, se, spread.df, null)
    if method == "percentile":
        return (*percentile_interval(replicates, level), replicate_p_value(replicates, value, null))
    if method != "bca":
        raise ValueError(f"interval method {method!r}: choose 'studentized', 'bca' or 'percentile'")
    if jackknife is None:
        raise ValueError("the BCa interval needs the jackknife: resample(..., jackknife=True)")
    a = acceleration(jackknife)
    return (*bca_interval(replicates, value, a, level), replicate_p_value(replicates, value, null, a))


def _cell_floor(cells: np.ndarray) -> tuple[float, float]:
    """``(se, df)`` of the mean over organisms of their per-cell means (``cells``: ``(O, S, D)``):
    within-organism variances, Satterthwaite's df; NaN where an organism has a single cell."""
    per = [c[np.isfinite(c)] for c in cells]
    if any(len(c) < 2 for c in per):
        return math.nan, math.nan
    k = len(per)
    v = np.array([c.var(ddof=1) / len(c) / k ** 2 for c in per])
    dfs = np.array([len(c) - 1 for c in per], dtype=float)
    if v.sum() == 0:
        return 0.0, float(dfs.sum())
    return float(math.sqrt(v.sum())), float(v.sum() ** 2 / np.sum(v ** 2 / dfs))


def _combine(value: float, level: float, null: float, boot: tuple[float, float, float],
             floors: dict[str, tuple[float, float]]) -> tuple[float, float, dict[str, float]]:
    """The union of the bootstrap interval and the floors' t-intervals, and every part's p-value."""
    lo, hi, p = boot
    parts = {"bootstrap": p}
    for name, (se, df) in floors.items():
        flo, fhi = t_interval(value, se, df, level)
        if math.isfinite(flo):
            lo, hi = min(lo, flo), max(hi, fhi)
            parts[name] = t_p_value(value, se, df, null)
    return lo, hi, parts


def _organism(res: Resampled, o: int) -> tuple[np.ndarray, float, list[np.ndarray] | None, _Spread]:
    """Organism ``o``'s own replicates, value, jackknife and spread (its edit samples as the units)."""
    spread = _spread(res.sample_values[o], res.sample_item_replicates[:, o],
                     res.organism_item_replicates[:, o])
    jack = None if res.organism_jackknife is None else [j[:, o] for j in res.organism_jackknife]
    return res.organism_replicates[:, o], float(res.organism_values[o]), jack, spread


def _organisms(res: Resampled, method: str, null: float, level: float) -> tuple[OrganismResult, ...]:
    out = []
    for o, org in enumerate(res.organisms):
        reps, value, jack, spread = _organism(res, o)
        boot = _boot(reps, value, jack, spread, method, null, level)
        lo, hi, parts = _combine(value, level, null, boot, {"cells": _cell_floor(res.cells[o:o + 1])})
        est = Estimate(value, lo, hi, math.sqrt(spread.total), res.n_items)
        p = max(parts.values())
        out.append(OrganismResult(int(org), est, est.excludes(null) if p < 1 - level else 0))
    return tuple(out)


def compare(terms: Term | Sequence[Term], *, direction: int = 1, margin: float = 0.0, gate_ok: bool = True,
            seed: int = 0, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
            method: str = INTERVAL_METHOD) -> ClaimTest:
    """Test the claim that ``Σ_t w_t (metric_t(a_t) − metric_t(b_t))`` has the sign ``direction``
    (``margin > 0``: that it is not worse than ``−margin`` in that direction: non-inferiority), per the
    module docstring; ``gate_ok``: the edits take where it is measured. One term with ``b`` None
    estimates ``metric(a)``."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if margin < 0:
        raise ValueError(f"margin must be ≥ 0 (the tolerated loss), got {margin}")
    terms = [terms] if isinstance(terms, Term) else list(terms)
    pairs = _paired_rate(terms) if margin == 0 else None
    if pairs is not None and len(pairs[["organism", "sample", "draw"]].drop_duplicates()) == 1:
        return _rate_one_cell(pairs, direction, gate_ok, level)
    res = resample(terms, seed=seed, n_resamples=n_resamples, jackknife=method == "bca")
    return assess(res, direction=direction, margin=margin,
                  gate_ok=gate_ok, level=level, method=method, rate_pairs=pairs)


def assess(res: Resampled, *, direction: int = 1, margin: float = 0.0, gate_ok: bool = True,
           level: float = LEVEL, method: str = INTERVAL_METHOD, rate_pairs: pd.DataFrame | None = None
           ) -> ClaimTest:
    """The :class:`ClaimTest` of a resampled statistic (:func:`compare` after the resampling; several
    interval methods can be read off one resampling). ``rate_pairs``: paired 0/1 outcomes (``item, a,
    b`` per cell) whose sign-flip test the verdict also needs."""
    null = -direction * margin if margin else 0.0
    k = res.n_organisms
    if k >= 2:  # the floor at the top of the hierarchy: the organism means hold their cells' spread
        floors = {"organisms": (float(np.std(res.organism_values, ddof=1) / math.sqrt(k)), float(k - 1))}
        spread = _spread(res.organism_values, res.organism_item_replicates, res.item_replicates)
    else:
        floors = {"cells": _cell_floor(res.cells)}
        spread = _organism(res, 0)[3]
    boot = _boot(res.replicates, res.value, res.jackknife, spread, method, null, level)
    lo, hi, parts = _combine(res.value, level, null, boot, floors)
    if rate_pairs is not None:
        per_item = rate_pairs.assign(d=rate_pairs["a"] - rate_pairs["b"]).groupby("item")["d"].agg(["sum",
                                                                                                    "count"])
        parts["sign-flip"] = sign_flip_p(per_item["sum"].to_numpy(), per_item["count"].to_numpy())
    est = Estimate(res.value, lo, hi, math.sqrt(spread.total), res.n_items)
    scope = "sample" if int(res.n_cells.sum()) == 1 else "model" if k == 1 else "organisms"
    units = k if k >= 2 else int(np.isfinite(res.sample_values[0]).sum())
    return ClaimTest(est, max(parts.values()), null, direction, gate_ok, method, scope,
                     _organisms(res, method, null, level), parts,
                     Variance(spread.items, spread.between, units, "organisms" if k >= 2 else "samples"))


# ----------------------------------------------------------------------------- families


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN counts as 1): the ``i``-th smallest is
    ``max_{j ≤ i} min(1, (m − j + 1) p_(j))``."""
    p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
    m = len(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(np.argsort(p, kind="stable")):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Judged:
    """A claim judged within its family: its test, the Holm-adjusted p-value, the family's size and the
    verdict word."""

    test: ClaimTest
    p_holm: float
    family: int
    verdict: str

    def resolution(self, alpha: float = ALPHA) -> Resolution | None:
        """What would resolve the claim within its family: at the level its own p-value must reach under
        Holm's correction, ``alpha · p / p_holm``."""
        t = self.test
        level = alpha * t.p_value / self.p_holm if self.p_holm > 0 else alpha
        return t.resolution(level) if self.verdict == UNRESOLVED else None

    def record(self) -> dict[str, object]:
        """Plain JSON for a ``summary.json``: the estimate and interval, p-values, verdict, scope, the
        organisms that agree, and what would resolve it."""
        t, e, num = self.test, self.test.estimate, _number
        res = self.resolution() or Resolution(e.n)
        return {"value": num(e.value), "lo": num(e.lo), "hi": num(e.hi), "stderr": num(e.stderr),
                "n": int(e.n), "null": t.null, "direction": t.direction, "gate_ok": bool(t.gate_ok),
                "method": t.method, "scope": t.scope, "p": num(t.p_value), "p_holm": num(self.p_holm),
                "family": self.family, "verdict": self.verdict, "organisms": len(t.organisms),
                "agreeing": t.agreeing, "n_to_resolve": res.items,
                "more_units": res.more(),
                "parts": {k: num(v) for k, v in t.parts.items()}}

    def sentence(self, digits: int = 3) -> str:
        """``reproduced (+0.120, 95 % CI [+0.050, +0.190]; p = 0.001, Holm p = 0.004 over 4 claims; …)``."""
        t, e = self.test, self.test.estimate
        if not math.isfinite(e.value):
            return f"{self.verdict} (not measured)"
        text = (f"{self.verdict} ({e.value:+.{digits}f}, 95 % CI {e.interval(digits)}; p = {t.p_value:.3g}, "
                f"Holm p = {self.p_holm:.3g} over {self.family} claim{'s' if self.family > 1 else ''}")
        if t.null != 0:
            text += f"; margin {abs(t.null):g}"
        text += {"sample": "; about this one sample", "model": "; about this one model"}.get(
            t.scope, f"; {t.agreeing} of {len(t.organisms)} organisms agree in sign and are resolved on "
                     f"their own")
        text += ")"
        if not t.gate_ok:
            text += " — the edits miss the editability gate here, so nothing is called reproduced or reversed"
        elif self.resolution() is not None:
            text += "; " + self.resolution().text()
        return text


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def judge(tests: Sequence[ClaimTest], alpha: float = ALPHA) -> list[Judged]:
    """One family's verdicts: Holm's correction of the marginal p-values decides each word; the intervals
    stay the marginal 95 % ones."""
    adjusted = holm([t.p_value for t in tests])
    return [Judged(t, float(p), len(tests), t.verdict(float(p), alpha)) for t, p in zip(tests, adjusted,
                                                                                           strict=True)]
