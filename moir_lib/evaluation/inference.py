"""The test behind every claim of the book: an interval, a p-value and what its verdict is about.

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
* **Floors** (:func:`floors`). The interval is never narrower than the t-interval at the top of the
  hierarchy: with one organism, on its per-cell differences (``cells − 1`` degrees of freedom); with
  ``K ≥ 2`` organisms, on the organism means (``K − 1`` df: ``t_{0.975,2} = 4.30`` at ``K = 3``), which
  hold their cells' spread (a floor on the cells within organisms as well, with one or two cells each,
  would add a t-quantile of 1-3 df and over-cover). The bootstrap cannot know how variable three edit
  samples or three models are. The reported interval is the union of the two, **clipped to the range the
  statistic can take** (a difference of two rates or harmonic means in [0, 1] lies in [−1, 1]:
  :func:`~moir_lib.evaluation.bootstrap.statistic_bounds`).
* **Rates of 0/1 outcomes** (one task's accuracy, an edit rate): with one cell, the exact McNemar test
  and Newcombe's hybrid score interval for paired proportions (his method 10); with several cells the
  interval above, and the verdict also needs the exact item-level sign-flip test of the per-item mean
  differences over cells (:func:`sign_flip_p`; McNemar's exact test when there is one cell).
* **p-values.** Each part implies the two-sided p-value at which it would just touch the null (the
  t-test of the studentized interval and of each floor; for a bootstrap interval,
  :func:`~moir_lib.evaluation.intervals.replicate_p_value`); a claim's p-value is the largest of its parts
  (the union interval excludes the null exactly when every part does; with a sign-flip test beside it, an
  intersection-union test); NaN when a part is undefined.
* **Not measured.** A claim none of whose cells can tell the arms apart (both arms' harmonic mean floored
  at 0 by a constituent at 0 in both: :class:`~moir_lib.evaluation.bootstrap.Degenerate`) or whose
  standard error is 0 (nothing varies: no p-value, never ``p = 0``) is *not measured*: no verdict word.
* **Non-inferiority** ("does not cost edit quality", relative): the claim that ``a`` keeps at least
  ``1 − δ`` of ``b``'s score, ``metric(a) − (1 − δ) · metric(b) > 0`` (``δ`` the ``margin``); superiority
  tests ``metric(a) − metric(b)`` against 0.
* **Two scopes.** The claim's own p-value is about the recipe with several organisms (the t on the
  organism means decides), about the model with one, about the sample with one cell (:attr:`scope`). With
  several organisms each one also gets its own estimate, interval and p-value (its samples and draws
  redrawn, its cells' floor), and :attr:`ClaimTest.p_organisms` is the intersection-union test that the
  claim holds in **each of these K organisms**: the largest of their p-values when they all lie on one
  side of the null.
* **Families** (:mod:`moir_lib.evaluation.families`): a chapter's primary claim at α, its secondaries
  gatekept behind it, Holm among them; the verdict words come from the adjusted p-values.
* **What would resolve it** (:meth:`ClaimTest.resolution`, :mod:`moir_lib.evaluation.power`): at the
  level the claim is tested at, the units (organisms; with one organism its cells) from the noncentral t
  where the floor binds, else the unique items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

from moir_lib.evaluation import components as variance_components
from moir_lib.evaluation.bootstrap import Degenerate, Resampled, Term, resample
from moir_lib.evaluation.composites import composite
from moir_lib.evaluation.intervals import (
    ALPHA,
    LEVEL,
    N_RESAMPLES,
    NAN_ESTIMATE,
    NOT_MEASURED,
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
from moir_lib.evaluation.power import Resolution, items_to_resolve, units_to_resolve
from moir_lib.evaluation.scores import EDIT_SCORES

__all__ = ["INTERVAL_METHOD", "NONINFERIORITY_MARGIN", "ClaimTest", "OrganismResult", "Variance", "assess",
           "compare", "floors", "largest", "mcnemar_p", "newcombe_paired", "not_measured", "sign_flip_p"]

#: The bootstrap interval of a claim: ``"bca"`` or ``"percentile"`` (chosen by the coverage simulation).
INTERVAL_METHOD = "studentized"
#: Relative non-inferiority margin on the edit score (eq. (se)): a C "does not cost edit quality" when its
#: score is shown to be at least ``1 − 0.10`` of the other's. Fixed before any measurement, from the book's
#: own definition of edits that take: the editability gate (:data:`~moir_lib.experiments.gates.ES_GATE`
#: = 0.90) tolerates a tenth short of every edit taking, so a C that keeps nine tenths of the other's edit
#: score loses no more than that tolerance. Relative, because an absolute margin is a large loss where the
#: harmonic mean is small and a small one where it is large.
NONINFERIORITY_MARGIN = 0.10


@dataclass(frozen=True)
class OrganismResult:
    """One organism's own estimate, interval and p-value; ``side`` +1 / -1 when that interval alone lies
    above / below the null at α, 0 when it covers it."""

    organism: int
    estimate: Estimate
    side: int
    p_value: float = math.nan


@dataclass(frozen=True)
class Variance:
    """What an estimate's variance is made of, to size a study: ``items`` (``V_items``: shrinks as more
    items are scored), ``between`` (shrinks only with more of the ``units`` ``unit_name``: organisms, or
    one organism's cells), ``unit_sd`` the standard deviation of the units' values and ``shared`` the
    variance every unit shares (the items scored in every cell)."""

    items: float
    between: float = 0.0
    units: int = 0
    unit_name: str = "samples"
    unit_sd: float = math.nan
    shared: float = 0.0


@dataclass(frozen=True)
class ClaimTest:
    """A measured claim before its family's correction: the ``estimate`` (marginal 95 % interval, floors
    included, clipped to the statistic's range; ``n`` the unique items), its two-sided ``p_value`` at
    ``null``, the claimed ``direction``, the editability gate, the interval ``method``, the ``scope``
    (``"sample"``, ``"model"``, ``"recipe"``: what the p-value is about), the per-organism results, the
    parts' p-values, what its variance is made of (:meth:`resolution`), ``note`` (why it is not measured,
    else empty), ``degenerate`` / ``cells``: the scored cells left out as degenerate, of all, and the
    variance ``components`` of its per-cell difference (:mod:`moir_lib.evaluation.components`)."""

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
    note: str = ""
    degenerate: int = 0
    cells: int = 0
    components: variance_components.Components | None = None

    @property
    def measured(self) -> bool:
        return not self.note and math.isfinite(self.estimate.value)

    @property
    def side(self) -> int:
        """+1 / -1 when the estimate lies above / below the null, 0 on it or undefined."""
        v = self.estimate.value
        return 1 if v > self.null else -1 if v < self.null else 0

    @property
    def agreeing(self) -> int:
        """Organisms that agree in sign with the estimate and are resolved on their own at α."""
        return sum(o.side == self.side != 0 for o in self.organisms)

    @property
    def p_organisms(self) -> float:
        """The intersection-union p-value that the claim holds in each of these organisms (two or more):
        the largest of their own p-values when every organism's estimate lies on one side of the null, 1
        when they disagree; NaN with fewer than two organisms or when one is undefined."""
        if len(self.organisms) < 2 or not self.measured:
            return math.nan
        sides = {1 if o.estimate.value > self.null else -1 if o.estimate.value < self.null else 0
                 for o in self.organisms}
        if len(sides) > 1 or 0 in sides:
            return 1.0
        return largest([o.p_value for o in self.organisms])

    def verdict(self, p: float | None = None, alpha: float = ALPHA) -> str:
        """The verdict word at p-value ``p`` (default the marginal one: a family of one); ``not measured``
        where the claim measured nothing."""
        if not self.measured:
            return NOT_MEASURED
        p = self.p_value if p is None else p
        side = self.estimate.excludes(self.null)
        if not self.gate_ok or not p < alpha or side == 0:
            return UNRESOLVED
        return REPRODUCED if side == self.direction else REVERSED

    def verdict_organisms(self, p: float | None = None, alpha: float = ALPHA) -> str:
        """The verdict word about these organisms at the intersection-union p-value ``p`` (default its
        own): reproduced when every organism resolves on the claimed side."""
        if not self.measured:
            return NOT_MEASURED
        p = self.p_organisms if p is None else p
        side = {o.estimate.excludes(self.null) for o in self.organisms}
        if not self.gate_ok or not p < alpha or len(side) != 1 or 0 in side:
            return UNRESOLVED
        return REPRODUCED if side.pop() == self.direction else REVERSED

    def resolution(self, level: float = ALPHA) -> Resolution | None:
        """What would resolve the claim at ``level`` (the level it is tested at) with 80 % power
        (:mod:`moir_lib.evaluation.power`): more units from the noncentral t when a floor decides its
        p-value, else more unique items; None when it resolves at that level, the gate fails or the
        difference is 0 or undefined."""
        delta = self.estimate.value - self.null
        if self.p_value < level or not self.gate_ok or not self.measured or not delta:
            return None
        v, n = self.variance, self.estimate.n
        floor = {"organisms", "cells"} & set(self.parts)
        binding = max(self.parts, key=lambda k: self.parts[k]) if self.parts else ""
        if v.units >= 2 and (binding in floor or v.between > 0):
            units = units_to_resolve(delta, v.unit_sd, v.shared, level)
            if units is not None and units > v.units:
                return Resolution(n, level, units=units, n_units=v.units, unit_name=v.unit_name)
        items = items_to_resolve(delta, n, v.items, max(0.0, v.between), level)
        if items is not None and items > n and binding not in floor:
            return Resolution(n, level, items=items, n_units=v.units, unit_name=v.unit_name)
        return Resolution(n, level, n_units=v.units, unit_name=v.unit_name)


#: A standard error this small against the value (relative to ``1 + |value|``) is rounding, not spread.
_ROUNDING = 1e-9


def _spreads(se: float, value: float) -> bool:
    """Whether ``se`` measures any variation at all (beyond the rounding of ``value``)."""
    return math.isfinite(se) and se > _ROUNDING * (1 + abs(value))


def largest(p_values: Sequence[float]) -> float:
    """The largest p-value; NaN when any is undefined (an intersection-union test needs every part)."""
    p = [float(x) for x in p_values]
    return math.nan if not p or any(not math.isfinite(x) for x in p) else max(p)


def not_measured(direction: int, gate_ok: bool, note: str, scope: str = "model", null: float = 0.0
                 ) -> ClaimTest:
    """The test of a claim that measured nothing (``note`` says why): no estimate, no verdict."""
    return ClaimTest(NAN_ESTIMATE, math.nan, null, direction, gate_ok, "none", scope, (), note=note)


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
    org = OrganismResult(int(pairs["organism"].iloc[0]), est, est.excludes(0.0) if p < 1 - level else 0, p)
    return ClaimTest(est, p, 0.0, direction, gate_ok, "newcombe", "sample", (org,), {"mcnemar": p},
                     Variance(est.stderr ** 2), cells=1)


# ----------------------------------------------------------------------------- the multi-level interval


@dataclass(frozen=True)
class _Spread:
    """The variance of an estimate by components: ``total = V_items − V_E + V_between`` with its
    Satterthwaite ``df``; ``items`` (``V_items``: what more items shrink), ``between`` (``V_between −
    V_E``: what only more units shrink) and ``units`` (``V_between``)."""

    total: float
    df: float
    items: float
    between: float
    units: float = 0.0


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
    return _Spread(total, df, v_items, max(0.0, v_units - v_e), v_units)


def _boot(replicates: np.ndarray, value: float, jackknife: Sequence[np.ndarray] | None, spread: _Spread,
          method: str, null: float, level: float) -> tuple[float, float, float]:
    """``(lo, hi, p)`` of the interval ``method``: ``"studentized"``, ``value ± t_df · √total`` with the
    components' variance and df (:func:`_spread`; a standard error of 0 gives no p-value); or the
    bootstrap's own ``"bca"`` or ``"percentile"`` interval (measured beside it by
    :mod:`moir_lib.evaluation.calibration`)."""
    if method == "studentized":
        se = math.sqrt(spread.total)
        if not _spreads(se, value):
            return value, value, math.nan
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


def floors(res: Resampled) -> dict[str, tuple[float, float]]:
    """The t floors ``name -> (se, df)`` at the top of the hierarchy (module docstring): with ``K ≥ 2``
    organisms the t on their means (``K − 1`` df), with one its cells (:func:`_cell_floor`)."""
    k = res.n_organisms
    if k >= 2:
        return {"organisms": (float(np.std(res.organism_values, ddof=1) / math.sqrt(k)), float(k - 1))}
    return {"cells": _cell_floor(res.cells)}


def _combine(value: float, level: float, null: float, boot: tuple[float, float, float],
             parts_floors: dict[str, tuple[float, float]]) -> tuple[float, float, dict[str, float]]:
    """The union of the bootstrap interval and the floors' t-intervals, and every part's p-value (a floor
    of no width, its units all equal, widens nothing and tests nothing)."""
    lo, hi, p = boot
    parts = {"bootstrap": p}
    for name, (se, df) in parts_floors.items():
        flo, fhi = t_interval(value, se, df, level)
        if math.isfinite(flo) and _spreads(se, value):
            lo, hi = min(lo, flo), max(hi, fhi)
            parts[name] = t_p_value(value, se, df, null)
    return lo, hi, parts


def _clip(lo: float, hi: float, bounds: tuple[float, float]) -> tuple[float, float]:
    return max(lo, bounds[0]), min(hi, bounds[1])


def _sign_flip(pairs: pd.DataFrame) -> float:
    """The sign-flip p-value of paired 0/1 outcomes (``item, a, b`` per cell)."""
    per_item = pairs.assign(d=pairs["a"] - pairs["b"]).groupby("item")["d"].agg(["sum", "count"])
    return sign_flip_p(per_item["sum"].to_numpy(), per_item["count"].to_numpy())


def _organism(res: Resampled, o: int) -> tuple[np.ndarray, float, list[np.ndarray] | None, _Spread]:
    """Organism ``o``'s own replicates, value, jackknife and spread (its edit samples as the units)."""
    spread = _spread(res.sample_values[o], res.sample_item_replicates[:, o],
                     res.organism_item_replicates[:, o])
    jack = None if res.organism_jackknife is None else [j[:, o] for j in res.organism_jackknife]
    return res.organism_replicates[:, o], float(res.organism_values[o]), jack, spread


def _organisms(res: Resampled, method: str, null: float, level: float,
               rate_pairs: pd.DataFrame | None) -> tuple[OrganismResult, ...]:
    out = []
    for o, org in enumerate(res.organisms):
        reps, value, jack, spread = _organism(res, o)
        boot = _boot(reps, value, jack, spread, method, null, level)
        lo, hi, parts = _combine(value, level, null, boot, {"cells": _cell_floor(res.cells[o:o + 1])})
        if rate_pairs is not None:
            parts["sign-flip"] = _sign_flip(rate_pairs[rate_pairs["organism"] == org])
        est = Estimate(value, *_clip(lo, hi, res.bounds), math.sqrt(spread.total), res.n_items)
        p = largest(list(parts.values()))
        out.append(OrganismResult(int(org), est, est.excludes(null) if p < 1 - level else 0, p))
    return tuple(out)


def compare(terms: Term | Sequence[Term], *, direction: int = 1, margin: float = 0.0, gate_ok: bool = True,
            seed: int = 0, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
            method: str = INTERVAL_METHOD) -> ClaimTest:
    """Test the claim that ``Σ_t w_t (metric_t(a_t) − metric_t(b_t))`` has the sign ``direction``; with
    ``margin`` ``δ > 0`` (one term comparing two arms) the non-inferiority claim that ``a`` keeps at least
    ``1 − δ`` of ``b``: ``metric(a) − (1 − δ) metric(b)`` above 0 (module docstring); ``gate_ok``: the
    edits take where it is measured. One term with ``b`` None estimates ``metric(a)``. Not measured
    (:func:`not_measured`) when every cell is degenerate."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1) (the tolerated relative loss), got {margin}")
    terms = [terms] if isinstance(terms, Term) else list(terms)
    if margin:
        if len(terms) != 1 or terms[0].b is None:
            raise ValueError("a non-inferiority margin compares one term's two arms")
        terms = [replace(terms[0], scale=1 - margin)]
    pairs = _paired_rate(terms) if margin == 0 else None
    if pairs is not None and len(pairs[["organism", "sample", "draw"]].drop_duplicates()) == 1:
        return _rate_one_cell(pairs, direction, gate_ok, level)
    try:
        res = resample(terms, seed=seed, n_resamples=n_resamples, jackknife=method == "bca")
    except Degenerate as exc:
        return not_measured(direction, gate_ok, f"not measured: {exc}")
    return assess(res, direction=direction, gate_ok=gate_ok, level=level, method=method, rate_pairs=pairs)


def assess(res: Resampled, *, direction: int = 1, gate_ok: bool = True, level: float = LEVEL,
           method: str = INTERVAL_METHOD, rate_pairs: pd.DataFrame | None = None) -> ClaimTest:
    """The :class:`ClaimTest` of a resampled statistic against 0 (:func:`compare` after the resampling;
    several interval methods can be read off one resampling). ``rate_pairs``: paired 0/1 outcomes (``item,
    a, b`` per cell) whose sign-flip test the verdict also needs."""
    null = 0.0
    k = res.n_organisms
    if k >= 2:
        spread = _spread(res.organism_values, res.organism_item_replicates, res.item_replicates)
        unit_values = res.organism_values
    else:
        spread = _organism(res, 0)[3]
        unit_values = res.cells[np.isfinite(res.cells)]
    boot = _boot(res.replicates, res.value, res.jackknife, spread, method, null, level)
    lo, hi, parts = _combine(res.value, level, null, boot, floors(res))
    if rate_pairs is not None:
        parts["sign-flip"] = _sign_flip(rate_pairs)
    est = Estimate(res.value, *_clip(lo, hi, res.bounds), math.sqrt(spread.total), res.n_items)
    scope = "sample" if int(res.n_cells.sum()) == 1 else "model" if k == 1 else "recipe"
    units = len(unit_values)
    unit_sd = float(np.std(unit_values, ddof=1)) if units >= 2 else math.nan
    shared = max(0.0, spread.total - unit_sd ** 2 / units) if units >= 2 else spread.total
    variance = Variance(spread.items, spread.between, units, "organisms" if k >= 2 else
                        "cells (edit samples × C draws)", unit_sd, shared)
    p = largest(list(parts.values()))
    note = "" if math.isfinite(p) or not math.isfinite(res.value) else \
        "not measured: no variation (a standard error of 0 supports no p-value)"
    return ClaimTest(est, p, null, direction, gate_ok, method, scope,
                     _organisms(res, method, null, level, rate_pairs), parts, variance, note,
                     res.degenerate, res.scored, variance_components.estimate(res))
