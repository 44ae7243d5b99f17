"""The uncertainty of every reported number, and the verdicts that follow from it.

Every scored point keeps its per-item scores (:data:`ITEM_COLUMNS`: per edited record its ES/PS/NS
indicators, token accuracies, target probabilities and fluency; per preservation item whether it was
answered; per held-out document its NLL). From them:

* **Rates** (ES, PS, NS, a task's accuracy, a domain's mean NLL, a share): the mean with the standard
  error of the mean, ``s / √n`` (sample standard deviation, ``ddof = 1``; for a 0/1 score
  ``√(p(1-p)/(n-1))``, lm-eval's ``mean_stderr``), :func:`rate`.
* **Composites** (``S_e``, eq. (se); ``S_p``, eq. (sp); Fluency*, a ratio of means; a JSD,
  eq. (jsd-bound)): a seeded percentile bootstrap over items with :func:`scipy.stats.bootstrap`,
  *stratified per constituent*: the items of each constituent (each preservation task, the records of
  each edit-sample seed) are resampled within their own stratum, so a composite's interval reflects the
  sampling of every constituent at its own size (:func:`estimate`, :func:`bootstrap`).
* **Paired differences** (C_Moir against C_Wiki on the same records and items, one seed strategy against
  another): the two points' items are joined on their ids and resampled together, so what both points
  share cancels (:func:`difference`). Across edit-sample seeds the statistic is the mean over seeds of
  the per-seed composite (or difference); :func:`seed_spread` gives the spread over seeds beside it.
* **Verdicts** (:func:`verdict`): *reproduced* when the 95 % interval of a difference excludes 0 in the
  paper's direction and the editability gate holds; *reversed* when it excludes 0 the other way;
  otherwise *not resolved at this sample size*, with the number of items per stratum at which the
  observed difference would resolve (:func:`items_to_resolve`: the interval shrinks as ``1/√n``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moir_lib.evaluation.scores import EDIT_SCORES

__all__ = ["ITEM_COLUMNS", "LEVEL", "N_RESAMPLES", "REPRODUCED", "REVERSED", "UNRESOLVED", "Estimate",
           "bootstrap", "combined_difference", "composite_tables", "difference", "estimate",
           "items_to_resolve", "jsd_difference", "jsd_estimate", "rate", "seed_spread", "statistic",
           "verdict", "verdict_text"]

#: Columns of a point's items table: ``group`` (``edit``, ``preservation``, ``nll``), ``unit`` (``record``,
#: a preservation task's label, a pocket domain), ``item`` (record case id, document id), ``metric``,
#: ``value``; ``key`` and ``n_edits`` name the point as its rows do.
ITEM_COLUMNS: tuple[str, ...] = ("key", "n_edits", "group", "unit", "item", "metric", "value")
#: Coverage of every interval.
LEVEL = 0.95
#: Bootstrap resamples.
N_RESAMPLES = 2000
#: The three verdict words.
REPRODUCED, REVERSED, UNRESOLVED = "reproduced", "reversed", "not resolved at this sample size"
#: Per-record columns behind Fluency* (``fluency_base / fluency``, both mean log-probabilities).
FLUENCY_COLUMNS = ("fluency_base", "fluency")
Z95 = 1.959963984540054  # standard normal quantile of (1 + LEVEL) / 2: a 95 % interval is ±Z95 stderr

#: A statistic over strata: stratum name -> values (``(..., n_items, n_columns)``) -> ``(...)``.
Statistic = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Estimate:
    """A number with its uncertainty: ``value``, the 95 % interval ``[lo, hi]``, the standard error and
    ``n`` (items; summed over strata)."""

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
        return 1 if self.lo > 0 else -1 if self.hi < 0 else 0

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


def rate(values: Sequence[float] | np.ndarray) -> Estimate:
    """Mean of the finite ``values`` with the standard error of the mean and a normal 95 % interval."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN_ESTIMATE
    mean = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan
    return Estimate(mean, mean - Z95 * se, mean + Z95 * se, se, int(x.size))


def share(count: int, n: int) -> Estimate:
    """A share ``count / n`` of 0/1 outcomes (a first-token share, a leakage rate) as :func:`rate` gives
    it for those outcomes: standard error ``√(p(1-p)/(n-1))``."""
    if not 0 <= count <= n:
        raise ValueError(f"a share needs 0 <= count <= n, got {count} of {n}")
    return rate(np.r_[np.ones(count), np.zeros(n - count)])


# ----------------------------------------------------------------------------- composites


def _hm(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Harmonic mean over ``parts`` (each ``(...)``); 0 where any part is ≤ 0, NaN parts skipped."""
    stack = np.stack(parts, axis=-1)
    defined = np.isfinite(stack)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(defined, 1.0 / np.where(stack > 0, stack, np.nan), 0.0)
    k = defined.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = k / np.nansum(inv, axis=-1)
    zero = (defined & (stack <= 0)).any(axis=-1)
    return np.where(zero, 0.0, np.where(k > 0, out, np.nan))


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.isfinite(x).sum(axis=axis)
        return np.where(n > 0, np.nansum(x, axis=axis) / np.maximum(n, 1), np.nan)


def composite_tables(items: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    """The strata behind ``metric`` for one point's ``items``: stratum -> items × columns.

    ``S_e`` / ``S_e_noport`` / ``Fluency*`` / an edit rate: one stratum, the records; ``S_p``: one
    stratum per preservation task in the score (items with metric ``correct``; a task reported beside
    the score has ``reported``); a preservation task: its items;
    ``nll:<domain>``: that domain's documents.
    """
    if metric in EDIT_SCORES or metric == "Fluency*" or metric in set(items.loc[items["group"] == "edit",
                                                                                "metric"]):
        cols = (list(EDIT_SCORES[metric]) if metric in EDIT_SCORES else [metric])
        cols = [c for m in cols for c in (FLUENCY_COLUMNS if m == "Fluency*" else (m,))]
        rec = items[(items["group"] == "edit") & items["metric"].isin(cols)]
        if rec.empty:
            return {}
        table = rec.pivot_table(index="item", columns="metric", values="value", aggfunc="first", dropna=False)
        return {"record": table.reindex(columns=cols)}
    if metric == "S_p":
        pres = items[(items["group"] == "preservation") & (items["metric"] == "correct")]
        return {u: g.set_index("item")[["value"]].rename(columns={"value": u})
                for u, g in pres.groupby("unit", sort=True)}
    group, _, unit = metric.partition(":") if ":" in metric else ("preservation", "", metric)
    sel = items[(items["group"] == group) & (items["unit"] == unit)]
    return {unit: sel.set_index("item")[["value"]].rename(columns={"value": unit})} if len(sel) else {}


def statistic(metric: str) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    """The composite ``metric`` computed from the strata of :func:`composite_tables` (vectorised over
    leading axes): means over items per column, Fluency* as ``mean(fluency_base) / mean(fluency)``, the
    harmonic mean for ``S_e`` (eq. (se)) and ``S_p`` (eq. (sp))."""

    def edit(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        x = strata["record"]
        means = _nanmean(x, axis=-2)  # (..., columns)
        cols = [c for m in (EDIT_SCORES.get(metric) or (metric,))
                for c in (FLUENCY_COLUMNS if m == "Fluency*" else (m,))]
        parts, i = [], 0
        for m in (EDIT_SCORES.get(metric) or (metric,)):
            if m == "Fluency*":
                with np.errstate(divide="ignore", invalid="ignore"):
                    parts.append(means[..., i] / means[..., i + 1])
                i += 2
            else:
                parts.append(means[..., i])
                i += 1
        assert i == len(cols)
        return _hm(parts) if metric in EDIT_SCORES else parts[0]

    def pres(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        return _hm([_nanmean(v[..., 0], axis=-1) for _, v in sorted(strata.items())])

    def single(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        (v,) = strata.values()
        return _nanmean(v[..., 0], axis=-1)

    if metric == "S_p":
        return pres
    if metric in EDIT_SCORES or metric == "Fluency*":
        return edit
    return single


def bootstrap(strata: Mapping[str, np.ndarray], stat: Statistic, *, seed: int = 0,
              n_resamples: int = N_RESAMPLES, level: float = LEVEL) -> Estimate:
    """Percentile bootstrap of ``stat`` with the items of each stratum resampled within it.

    ``strata``: name -> ``(n_items, n_columns)`` array (the columns of one item travel together, which
    pairs two points' scores of the same item). ``stat``: :data:`Statistic`. Runs
    :func:`scipy.stats.bootstrap` on item indices (one sample per stratum, ``paired=False``: strata are
    resampled independently), seeded by ``seed``; strata of one item are held fixed.
    """
    from scipy.stats import bootstrap as scipy_bootstrap

    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in strata.items()}
    value = float(stat(arrays))
    n = int(sum(a.shape[0] for a in arrays.values()))
    names = [k for k, a in arrays.items() if a.shape[0] > 1]
    if not names or not math.isfinite(value):
        return Estimate(value, math.nan, math.nan, math.nan, n)

    def resampled(*idx: np.ndarray, axis: int = -1) -> np.ndarray:
        data = dict(arrays)
        for k, i in zip(names, idx, strict=True):
            data[k] = arrays[k][np.asarray(i, dtype=np.intp)]  # (..., n_items, n_columns)
        lead = np.broadcast_shapes(*(np.shape(i)[:-1] for i in idx))
        data = {k: (v if k in names else np.broadcast_to(v, (*lead, *v.shape))) for k, v in data.items()}
        return stat(data)

    samples = tuple(np.arange(arrays[k].shape[0], dtype=np.float64) for k in names)
    res = scipy_bootstrap(samples, resampled, n_resamples=n_resamples, confidence_level=level,
                          method="percentile", vectorized=True, paired=False, batch=200,
                          rng=np.random.default_rng(seed))
    dist = res.bootstrap_distribution
    return Estimate(value, float(res.confidence_interval.low), float(res.confidence_interval.high),
                    float(np.nanstd(dist, ddof=1)), n)


def _seeded(points: Sequence[pd.DataFrame], metric: str, prefix: str = "") -> dict[str, pd.DataFrame]:
    out = {}
    for s, items in enumerate(points):
        for k, t in composite_tables(items, metric).items():
            out[f"{prefix}{s}/{k}"] = t
    return out


def _per_seed(stat: Statistic, n_seeds: int, names: Sequence[str], prefix: str = "") -> Statistic:
    """Mean over seeds of ``stat`` applied to each seed's strata (names ``<prefix><seed>/<stratum>``)."""

    def mean_over_seeds(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = [stat({n.partition("/")[2]: strata[prefix + n] for n in names if n.startswith(f"{s}/")})
                for s in range(n_seeds)]
        return np.mean(np.stack(np.broadcast_arrays(*vals)), axis=0)

    return mean_over_seeds


def estimate(points: pd.DataFrame | Sequence[pd.DataFrame], metric: str, *, seed: int = 0,
             n_resamples: int = N_RESAMPLES) -> Estimate:
    """``metric`` of one point (its items) or the mean over several (one per edit-sample seed) with a
    bootstrap interval stratified per constituent and seed; a rate of one point: :func:`rate`."""
    points = [points] if isinstance(points, pd.DataFrame) else list(points)
    tables = _seeded(points, metric)
    if not tables:
        return NAN_ESTIMATE
    if len(points) == 1 and len(tables) == 1 and metric not in (*EDIT_SCORES, "S_p", "Fluency*"):
        return rate(next(iter(tables.values())).iloc[:, 0].to_numpy())
    stat = _per_seed(statistic(metric), len(points), list(tables))
    return bootstrap({k: t.to_numpy() for k, t in tables.items()}, stat, seed=seed, n_resamples=n_resamples)


def difference(a: pd.DataFrame | Sequence[pd.DataFrame], b: pd.DataFrame | Sequence[pd.DataFrame],
               metric: str, *, seed: int = 0, n_resamples: int = N_RESAMPLES) -> Estimate:
    """Paired difference ``metric(a) - metric(b)``: the two points of each seed (same seeds, in order)
    joined on their item ids within every stratum (items only one of them scored are left out), resampled
    together; over several seeds the mean of the per-seed differences."""
    return combined_difference([(1.0, a, b, metric)], seed=seed, n_resamples=n_resamples)


#: One term of :func:`combined_difference`: weight, the points of ``a`` and of ``b`` (one per seed), metric.
Term = tuple[float, "pd.DataFrame | Sequence[pd.DataFrame]", "pd.DataFrame | Sequence[pd.DataFrame]", str]


def combined_difference(terms: Sequence[Term], *, seed: int = 0, n_resamples: int = N_RESAMPLES) -> Estimate:
    """``Σ_t w_t · (metric_t(a_t) - metric_t(b_t))`` with one joint bootstrap, each term paired as in
    :func:`difference` (e.g. Table 2's Total: the mean over N of ``S_e`` and of ``S_p`` differences)."""
    joined: dict[str, np.ndarray] = {}
    parts: list[tuple[float, Statistic]] = []
    for t, (w, a, b, metric) in enumerate(terms):
        a = [a] if isinstance(a, pd.DataFrame) else list(a)
        b = [b] if isinstance(b, pd.DataFrame) else list(b)
        if len(a) != len(b):
            raise ValueError(f"paired points per seed differ in number: {len(a)} against {len(b)}")
        ta, tb = _seeded(a, metric, f"{t}:"), _seeded(b, metric, f"{t}:")
        names = [k for k in ta if k in tb]
        if not names:
            return NAN_ESTIMATE
        widths = {}
        for k in names:
            joined[k] = ta[k].join(tb[k], how="inner", lsuffix="_a", rsuffix="_b").to_numpy()
            widths[k.partition("/")[2]] = ta[k].shape[1]  # a stratum's columns: the same in every seed
        one = statistic(metric)

        def diff(strata: Mapping[str, np.ndarray], one: Statistic = one, widths: dict = widths) -> np.ndarray:
            return (one({k: v[..., :widths[k]] for k, v in strata.items()})
                    - one({k: v[..., widths[k]:] for k, v in strata.items()}))

        parts.append((w, _per_seed(diff, len(a), [n.partition(":")[2] for n in names], f"{t}:")))

    def total(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        return sum(w * f(strata) for w, f in parts)

    return bootstrap(joined, total, seed=seed, n_resamples=n_resamples)


def seed_spread(values: Sequence[float]) -> float:
    """Standard deviation over edit-sample seeds of a per-seed value (NaN with fewer than two)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


def jsd_difference(a: np.ndarray, b: np.ndarray, reference: np.ndarray,
                   divergence: Callable[[np.ndarray, np.ndarray], float], *, seed: int = 0,
                   n_resamples: int = 300) -> Estimate:
    """``JSD(a, ref) - JSD(b, ref)`` (e.g. per-document NLLs of two corpora and a reference) with a
    bootstrap interval, the documents of each sample resampled within it; the reference is resampled
    once per replicate, shared by both terms. ``divergence``: e.g.
    ``lambda p, q: moir_lib.analysis.divergence.jensen_shannon(p, q).jsd``."""
    strata = {"a": np.asarray(a, float)[:, None], "b": np.asarray(b, float)[:, None],
              "ref": np.asarray(reference, float)[:, None]}
    return bootstrap(strata, _loop(lambda s: divergence(s["a"][:, 0], s["ref"][:, 0])
                                   - divergence(s["b"][:, 0], s["ref"][:, 0])),
                     seed=seed, n_resamples=n_resamples)


def jsd_estimate(a: np.ndarray, reference: np.ndarray, divergence: Callable[[np.ndarray, np.ndarray], float],
                 *, seed: int = 0, n_resamples: int = 300) -> Estimate:
    """``JSD(a, ref)`` with a bootstrap interval over the documents of both samples."""
    strata = {"a": np.asarray(a, float)[:, None], "ref": np.asarray(reference, float)[:, None]}
    return bootstrap(strata, _loop(lambda s: divergence(s["a"][:, 0], s["ref"][:, 0])), seed=seed,
                     n_resamples=n_resamples)


def _loop(scalar: Callable[[Mapping[str, np.ndarray]], float]) -> Statistic:
    """A scalar statistic (one resample at a time) as a vectorised :data:`Statistic`."""

    def stat(strata: Mapping[str, np.ndarray]) -> np.ndarray:
        first = next(iter(strata.values()))
        lead = first.shape[:-2]
        out = np.empty(lead)
        for idx in np.ndindex(*lead):
            out[idx] = scalar({k: v[idx] for k, v in strata.items()})
        return out

    return stat


# ----------------------------------------------------------------------------- verdicts


def verdict(est: Estimate, direction: int = 1, gate_ok: bool = True) -> str:
    """The verdict on a claim that a difference has the sign ``direction`` (+1 or -1): :data:`REPRODUCED`
    when the interval excludes 0 that way and ``gate_ok`` (the editability gate holds), :data:`REVERSED`
    when it excludes 0 the other way, else :data:`UNRESOLVED` (also when the gate fails: a preservation
    gain under edits that do not take is no finding)."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    side = est.excludes_zero() * direction
    if side > 0:
        return REPRODUCED if gate_ok else UNRESOLVED
    return REVERSED if side < 0 else UNRESOLVED


def items_to_resolve(est: Estimate) -> int | None:
    """Items (per stratum, the same multiple of today's) at which an interval of today's width shrunk as
    ``1/√n`` would exclude 0 at the observed difference: ``n · (half-width / |value|)²``; None when the
    interval already excludes 0 or the difference is 0 or undefined."""
    if est.excludes_zero() or not (math.isfinite(est.value) and est.value != 0 and est.n > 0
                                   and math.isfinite(est.half_width)):
        return None
    return int(math.ceil(est.n * (est.half_width / abs(est.value)) ** 2))


def verdict_text(est: Estimate, direction: int = 1, gate_ok: bool = True, digits: int = 3) -> str:
    """``reproduced (+0.120, 95 % CI [+0.05, +0.19])``, with the sample size that would resolve an
    unresolved difference."""
    word = verdict(est, direction, gate_ok)
    text = f"{word} ({est.value:+.{digits}f}, 95 % CI {est.interval(digits)})" if math.isfinite(est.value) \
        else f"{word} (no paired items)"
    if word == UNRESOLVED and gate_ok:
        need = items_to_resolve(est)
        if need is not None:
            text += f"; about {need} items instead of {est.n} would resolve a difference of this size"
    return text
