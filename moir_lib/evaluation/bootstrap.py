"""The multi-level (hierarchical) bootstrap of a comparison's per-item scores.

**Input.** Per-item scores in long frames (:data:`FRAME_COLUMNS`): ``organism`` (a model), ``sample``
(an edit-sample seed), ``draw`` (a draw of C; 0 for an arm without one), ``group`` / ``unit`` / ``item`` /
``metric`` / ``value`` (:mod:`moir_lib.evaluation.composites`). A *cell* is one ``(organism, sample,
draw)``. A :class:`Term` compares arm ``a`` with arm ``b`` (or estimates ``a`` alone) on one metric; the
two arms are paired on the cell and the item: draw ``d`` of one C's arm meets draw ``d`` of the other's,
both random draws, so the pair is a random draw of the pair.

**The statistic.** Per cell: each constituent's mean over its items, the composite (eq. (se), eq. (sp),
a rate …), the difference ``a − b``; per organism the mean over its cells; the mean over organisms;
``Σ_t w_t (…)`` over the terms of a combined statistic (Table 2's Total over several N and both scores).

**One replicate** (:func:`resample`). Organisms are drawn with replacement (K of K); within each drawn
organism its edit samples and, independently, its C draws are drawn with replacement (a crossed design:
Owen's pigeonhole bootstrap); items are drawn with replacement within each ``(group, unit)`` (a task's
items, the edited records, a domain's documents), with ONE multiplicity per item id per replicate applied
everywhere that id appears (every cell, organism, arm and term), so what the arms share cancels and
what the cells share is counted once. The statistic is recomputed with those multiplicities as weights:
one matrix product per unit for all replicates at once (no loop over replicates).

Besides the replicates, :class:`Resampled` carries what the tests of a claim need
(:mod:`moir_lib.evaluation.inference`): each organism's own replicates (its samples and draws redrawn,
items as above), replicates with the items alone redrawn (the item part of the variance), the
stratified leave-one-item-out jackknife (BCa's acceleration) and the per-cell point values (the floors).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moir_lib.evaluation.composites import Composite, bounds, combine, composite, floored
from moir_lib.evaluation.intervals import N_RESAMPLES

__all__ = ["FRAME_COLUMNS", "Degenerate", "Resampled", "Term", "multiplicities", "resample", "with_cell"]

log = logging.getLogger(__name__)

#: Columns of a per-item frame.
FRAME_COLUMNS: tuple[str, ...] = ("organism", "sample", "draw", "group", "unit", "item", "metric", "value")


@dataclass(frozen=True)
class Term:
    """``weight · (metric(a) − scale · metric(b))``, or ``weight · metric(a)`` when ``b`` is None (``scale``
    below 1: a relative non-inferiority margin, ``a`` against a share of ``b``)."""

    a: pd.DataFrame
    b: pd.DataFrame | None
    metric: str
    weight: float = 1.0
    scale: float = 1.0


def with_cell(items: pd.DataFrame, organism: int = 0, sample: int = 0, draw: int = 0) -> pd.DataFrame:
    """``items`` (``group, unit, item, metric, value``) as a per-item frame of the one cell named."""
    return items.assign(organism=organism, sample=sample, draw=draw)


@dataclass
class _Stratum:
    """The items of one ``(group, unit)``: ids and, per block (a column of one arm of one term) and
    cell, their values (``values``: ``(n_items, n_blocks · n_cells)``, NaN where unscored)."""

    key: tuple[str, str]
    ids: np.ndarray
    blocks: np.ndarray
    values: np.ndarray
    scored: np.ndarray


@dataclass
class _Design:
    strata: list[_Stratum]
    organisms: np.ndarray
    shape: tuple[int, int, int]
    comps: list[Composite]
    arms: list[list[list[int]]]  # term -> arm -> block ids in its composite's column order
    weights: np.ndarray
    scales: np.ndarray
    n_blocks: int


def _check(frame: pd.DataFrame, what: str) -> pd.DataFrame:
    missing = [c for c in FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}: a per-item frame has {list(FRAME_COLUMNS)} "
                         f"(add the cell of one point with with_cell(items, organism, sample, draw))")
    return frame


def _key(frame: pd.DataFrame) -> tuple[np.ndarray, pd.Index]:
    """Each row's ``(group, unit, metric)`` factorised: codes and the distinct keys, joined by ``\x1f``."""
    codes, names = [], []
    for c in ("group", "unit", "metric"):
        code, uniques = pd.factorize(frame[c].astype(str))
        codes.append(code)
        names.append(np.asarray(uniques, dtype=object))
    sizes = [max(1, len(n)) for n in names]
    combined = np.ravel_multi_index(codes, sizes) if len(frame) else np.array([], dtype=np.int64)
    code, uniques = pd.factorize(combined)
    parts = np.unravel_index(np.asarray(uniques, dtype=np.int64), sizes)
    keys = ["\x1f".join(str(n[i]) for n, i in zip(names, ix, strict=True)) for ix in zip(*parts, strict=True)]
    return code, pd.Index(keys, dtype=object)


def _catalogue(keys: Sequence[tuple[np.ndarray, pd.Index, np.ndarray]]) -> pd.DataFrame:
    """The distinct ``(group, unit, metric)`` of factorised frames (``codes, uniques, values``), ``value``
    1 where one is scored, else NaN."""
    parts = []
    for codes, uniques, values in keys:
        scored = np.bincount(codes, weights=np.isfinite(values), minlength=len(uniques)) > 0
        part = pd.DataFrame([str(u).split("\x1f") for u in uniques], columns=["group", "unit", "metric"])
        parts.append(part.assign(value=np.where(scored, 1.0, np.nan)))
    return pd.concat(parts, ignore_index=True)


def _rows(terms: Sequence[Term]) -> tuple[dict[str, np.ndarray], list[Composite], list[list[list[int]]],
                                          list[tuple[str, str]]]:
    """Every value the terms read (``organism, sample, draw, item, value, block`` arrays), each tagged with
    its block (one column of one arm of one term); the terms' composites, blocks, and each block's
    ``(group, unit)``."""
    parts, comps, arms, strata = [], [], [], []
    for t, term in enumerate(terms):
        frames = [_check(term.a, f"term {t} arm a")] + ([] if term.b is None else [_check(term.b, f"term {t} "
                                                                                           f"arm b")])
        keys = [(*_key(f), f["value"].to_numpy(np.float64)) for f in frames]
        comp = composite(term.metric, _catalogue(keys))
        comps.append(comp)
        arms.append([])
        wanted = pd.Index(["\x1f".join(c) for c in comp.columns])
        sides = []
        for frame, (codes, uniques, values) in zip(frames, keys, strict=True):
            code = wanted.get_indexer(uniques)[codes]
            keep = (code >= 0) & np.isfinite(values)
            sides.append({**{c: frame[c].to_numpy()[keep] for c in ("organism", "sample", "draw", "item")},
                          "value": values[keep], "block": code[keep]})
        for side in _paired(sides):
            arms[-1].append(list(range(len(strata), len(strata) + len(wanted))))
            parts.append({**side, "block": side["block"] + len(strata)})
            strata += [(g, u) for g, u, _ in comp.columns]
    rows = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    rows["item"] = rows["item"].astype(str).astype(object)
    return rows, comps, arms, strata


def _paired(sides: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Two arms kept to the values both scored (same cell, column and item); one arm as it is."""
    if len(sides) == 1:
        return sides
    codes, sizes = [], []
    for c in ("block", "organism", "sample", "draw", "item"):
        both = np.concatenate([np.asarray(s[c]) for s in sides])
        code, uniques = pd.factorize(both.astype(str) if c == "item" else both)
        codes.append(code)
        sizes.append(max(1, len(uniques)))
    key = np.ravel_multi_index(codes, sizes) if len(codes[0]) else np.array([], dtype=np.int64)
    n0 = len(sides[0]["value"])
    keep = [np.isin(key[:n0], key[n0:]), np.isin(key[n0:], key[:n0])]
    return [{c: v[k] for c, v in s.items()} for s, k in zip(sides, keep, strict=True)]


def _slots(organism: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The rank of each ``level`` value among its organism's distinct values."""
    levels, code = np.unique(level, return_inverse=True)
    pairs, inverse = np.unique(organism * len(levels) + code, return_inverse=True)
    first = np.searchsorted(pairs // len(levels), pairs // len(levels), side="left")
    return (np.arange(len(pairs)) - first)[inverse]


def _pack(terms: Sequence[Term]) -> _Design:
    rows, comps, arms, block_strata = _rows(terms)
    if not len(rows["value"]):
        raise ValueError("no scored items for the metrics compared: check the metric names and the frames")
    organisms, o = np.unique(rows["organism"], return_inverse=True)
    s, d = _slots(o, rows["sample"].astype(np.int64)), _slots(o, rows["draw"].astype(np.int64))
    shape = (len(organisms), int(s.max()) + 1, int(d.max()) + 1)
    n_cells = int(np.prod(shape))
    cell = np.ravel_multi_index((o, s, d), shape)
    keys = sorted(set(block_strata))
    stratum_of = np.array([keys.index(k) for k in block_strata])[rows["block"]]
    strata = []
    for h, key in enumerate(keys):
        sel = stratum_of == h
        if not sel.any():
            continue
        item, ids = pd.factorize(rows["item"][sel], sort=True)
        blk, blocks = pd.factorize(rows["block"][sel], sort=True)
        values = np.full((len(ids), len(blocks) * n_cells), np.nan)
        values[item, blk * n_cells + cell[sel]] = rows["value"][sel]
        scored = np.isfinite(values)
        strata.append(_Stratum(key, np.asarray(ids, dtype=object), np.asarray(blocks),
                               np.where(scored, values, 0.0), scored.astype(np.float64)))
    return _Design(strata, organisms, shape, comps, arms, np.array([t.weight for t in terms], float),
                   np.array([t.scale for t in terms], float), len(block_strata))


def _cell_values(design: _Design, weights: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate, term and cell the composite difference under item ``weights`` (one ``(R, n_items)``
    matrix per stratum) → ``(R, T, O, S, D)``, NaN where a cell is not scored; and where both arms' harmonic
    composite is floored at 0 by a constituent at 0 (:func:`~moir_lib.evaluation.composites.floored`),
    the same shape."""
    r = weights[0].shape[0]
    n_cells = int(np.prod(design.shape))
    means = np.full((r, design.n_blocks, n_cells), np.nan)
    for st, w in zip(design.strata, weights, strict=True):
        num, den = w @ st.values, w @ st.scored
        with np.errstate(invalid="ignore", divide="ignore"):
            means[:, st.blocks] = np.where(den > 0, num / den, np.nan).reshape(r, len(st.blocks), n_cells)
    out = np.empty((r, len(design.comps), n_cells))
    both_floored = np.zeros(out.shape, dtype=bool)
    for t, (comp, arms) in enumerate(zip(design.comps, design.arms, strict=True)):
        arm_means = [np.moveaxis(means[:, blocks], 1, -1) for blocks in arms]
        vals = [combine(comp, m) for m in arm_means]
        out[:, t] = vals[0] - design.scales[t] * vals[1] if len(vals) == 2 else vals[0]
        if len(vals) == 2:
            both_floored[:, t] = floored(comp, arm_means[0]) & floored(comp, arm_means[1])
    shape = (r, len(design.comps), *design.shape)
    return out.reshape(shape), both_floored.reshape(shape)


def _organism_means(x: np.ndarray, valid: np.ndarray, samples: np.ndarray, draws: np.ndarray,
                    weights: np.ndarray) -> np.ndarray:
    """``Σ_t w_t`` (mean over the weighted cells of each organism slot): ``x`` ``(R, T, K, S, D)``,
    ``valid`` the same or broadcastable, ``samples`` ``(R, K, S)`` and ``draws`` ``(R, K, D)`` the cell
    multiplicities → ``(R, K)``."""
    ok = valid & np.isfinite(x)
    cw = samples[:, None, :, :, None] * draws[:, None, :, None, :]  # (R, 1, K, S, D)
    num = (np.where(ok, x, 0.0) * cw).sum(axis=(-2, -1))
    den = (ok * cw).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_term = np.where(den > 0, num / den, np.nan)  # (R, T, K)
    return np.einsum("t,rtk->rk", weights, per_term)


def _sample_means(x: np.ndarray, valid: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``Σ_t w_t`` (mean over the scored draws of each edit sample): ``x`` ``(R, T, O, S, D)`` →
    ``(R, O, S)``, NaN where a term has no scored draw."""
    ok = valid & np.isfinite(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_term = np.where(ok, x, 0.0).sum(axis=-1) / ok.sum(axis=-1)
    return np.einsum("t,rtos->ros", weights, per_term)


def multiplicities(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    """``(r, n)`` multiplicities: ``n`` items drawn with replacement from ``n``, per replicate."""
    idx = rng.integers(0, n, size=(r, n)) + (np.arange(r) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=r * n).reshape(r, n).astype(np.float64)


def _jackknife_weights(design: _Design) -> list[np.ndarray]:
    """Leave-one-item-out weights of every stratum, stacked: ``Σ_h n_h`` rows, the rows of stratum ``h``
    leaving out one of its items each (``1 − I``), every other stratum whole."""
    sizes = [len(st.ids) for st in design.strata]
    offsets = np.cumsum([0, *sizes])
    out = []
    for h, n in enumerate(sizes):
        w = np.ones((offsets[-1], n))
        w[offsets[h]:offsets[h + 1]] -= np.eye(n)
        out.append(w)
    return out


def _level_counts(rng: np.random.Generator, slots: Sequence[np.ndarray], picks: np.ndarray, size: int
                  ) -> np.ndarray:
    """``(R, K, size)`` multiplicities: for the organism each slot picked, its valid positions (``slots``)
    drawn with replacement."""
    out = np.zeros((*picks.shape, size))
    for o, idx in enumerate(slots):
        draw = np.zeros_like(out)
        draw[..., idx] = rng.multinomial(len(idx), np.full(len(idx), 1 / len(idx)), size=picks.shape)
        out = np.where((picks == o)[..., None], draw, out)
    return out


@dataclass(frozen=True)
class Resampled:
    """A statistic and its multi-level bootstrap (see the module docstring).

    ``value``: the estimate; ``replicates`` ``(R,)``; ``organisms`` the organism ids kept (those where
    every term has a scored cell); ``organism_values`` ``(O,)`` and ``organism_replicates`` ``(R, O)``
    each organism's own (its samples and draws redrawn), ``organism_item_replicates`` ``(R, O)`` with the
    items alone redrawn; ``sample_values`` ``(O, S)`` and ``sample_item_replicates`` ``(R, O, S)`` the
    same per edit sample (mean over its draws; NaN where a sample is missing); ``jackknife`` (when asked
    for, else None): per stratum the leave-one-item-out values, overall ``(n_h,)`` and per organism
    ``(n_h, O)``; ``cells``
    ``(O, S, D)`` the per-cell values (``Σ_t w_t`` difference; NaN where a term is not scored or is
    degenerate) and ``cell_item_replicates`` ``(R, O, S, D)`` the same with the items alone redrawn;
    ``degenerate`` the scored cells left out because a term compares two harmonic composites floored at 0
    (a constituent at 0 under both arms), of ``scored`` scored cells in all; ``strata`` the ``(group,
    unit)`` keys, with ``n_items`` unique items in all; ``bounds`` the range the statistic can take
    (:func:`statistic_bounds`)."""

    value: float
    replicates: np.ndarray
    organisms: np.ndarray
    organism_values: np.ndarray
    organism_replicates: np.ndarray
    organism_item_replicates: np.ndarray
    sample_values: np.ndarray
    sample_item_replicates: np.ndarray
    jackknife: tuple[np.ndarray, ...] | None
    organism_jackknife: tuple[np.ndarray, ...] | None
    cells: np.ndarray
    cell_item_replicates: np.ndarray
    degenerate: int
    scored: int
    strata: tuple[tuple[str, str], ...]
    n_items: int
    bounds: tuple[float, float] = (-math.inf, math.inf)

    @property
    def n_organisms(self) -> int:
        return len(self.organisms)

    @property
    def n_cells(self) -> np.ndarray:
        """Scored cells per organism."""
        return np.isfinite(self.cells).sum(axis=(1, 2))

    @property
    def item_replicates(self) -> np.ndarray:
        """``(R,)``: the statistic with the items alone redrawn."""
        return self.organism_item_replicates.mean(axis=1)


class Degenerate(ValueError):
    """Every cell of a term compares two harmonic composites floored at 0 by a constituent at 0: nothing
    is measured (:func:`resample`)."""


def statistic_bounds(design: _Design) -> tuple[float, float]:
    """The range of ``Σ_t w_t (metric_t(a) − scale_t · metric_t(b))`` from each composite's
    (:func:`~moir_lib.evaluation.composites.bounds`): a difference of two rates lies in [−1, 1]."""
    lo = hi = 0.0
    for comp, arms, w, scale in zip(design.comps, design.arms, design.weights, design.scales, strict=True):
        a_lo, a_hi = bounds(comp)
        t_lo, t_hi = (a_lo - scale * a_hi, a_hi - scale * a_lo) if len(arms) == 2 else (a_lo, a_hi)
        t_lo, t_hi = sorted((w * t_lo, w * t_hi)) if w else (0.0, 0.0)
        lo, hi = lo + t_lo, hi + t_hi
    return lo, hi


def _keep_organisms(design: _Design, point: np.ndarray, degenerate: np.ndarray) -> np.ndarray:
    """Organisms where every term has a scored cell that is not degenerate (a warning names the others)."""
    keep = np.isfinite(point).any(axis=(2, 3)).all(axis=0)
    if not keep.any():
        if degenerate.any():
            names = sorted({design.comps[t].name for t in np.flatnonzero(degenerate.any(axis=(1, 2, 3)))})
            verb = "is" if len(names) == 1 else "are"
            raise Degenerate(f"{' and '.join(names)} {verb} 0 under both arms in every cell (a constituent "
                             "at 0 in both): the harmonic mean cannot tell the arms apart there")
        raise ValueError("no organism has a cell scored in every term (arms a and b share no cell)")
    if not keep.all():
        log.warning("organisms %s left out: a term has no scored cell there that is not degenerate (both "
                    "arms' harmonic mean floored at 0)", list(design.organisms[~keep]))
    return keep


def resample(terms: Term | Sequence[Term], *, seed: int = 0, n_resamples: int = N_RESAMPLES,
             jackknife: bool = False) -> Resampled:
    """The multi-level bootstrap of ``Σ_t w_t (metric_t(a_t) − metric_t(b_t))`` (module docstring), seeded,
    ``n_resamples`` replicates, vectorised over replicates; ``jackknife``: also the leave-one-item-out
    values (a BCa interval's acceleration)."""
    terms = [terms] if isinstance(terms, Term) else list(terms)
    design = _pack(terms)
    rng = np.random.default_rng(seed)
    ones = [np.ones((1, len(s.ids))) for s in design.strata]
    point, both_floored = (v[0] for v in _cell_values(design, ones))
    degenerate = both_floored & np.isfinite(point)  # (T, O, S, D)
    scored = np.isfinite(point).all(axis=0)
    point = np.where(degenerate, np.nan, point)
    keep = _keep_organisms(design, point, degenerate)
    every, point, k = point, point[:, keep], int(keep.sum())  # every organism (aggregate keeps), the kept
    valid = np.isfinite(point)
    s_slots = [np.flatnonzero(valid[:, o].any(axis=(0, 2))) for o in range(k)]
    d_slots = [np.flatnonzero(valid[:, o].any(axis=(0, 1))) for o in range(k)]
    _, n_s, n_d = design.shape
    ones_s = np.stack([np.isin(np.arange(n_s), i) for i in s_slots]).astype(float)[None]  # (1, K, S)
    ones_d = np.stack([np.isin(np.arange(n_d), i) for i in d_slots]).astype(float)[None]

    def aggregate(x: np.ndarray, picks: np.ndarray | None = None, samples: np.ndarray = ones_s,
                  draws: np.ndarray = ones_d) -> np.ndarray:
        x, ok = x[:, :, keep], valid[None]
        if picks is not None:
            x = np.take_along_axis(x, picks[:, None, :, None, None], axis=2)
            ok = np.take_along_axis(np.broadcast_to(ok, (len(picks), *valid.shape)),
                                    picks[:, None, :, None, None], axis=2)
        return _organism_means(x, ok, samples, draws, design.weights)

    def per_sample(x: np.ndarray) -> np.ndarray:
        return _sample_means(x[:, :, keep], valid, design.weights)

    organism_values = aggregate(every[None])[0]
    weights = [multiplicities(rng, len(s.ids), n_resamples) for s in design.strata]
    x = np.where(degenerate[None], np.nan, _cell_values(design, weights)[0])
    picks = rng.integers(0, k, size=(n_resamples, k))
    own = np.broadcast_to(np.arange(k), (n_resamples, k))
    replicates = aggregate(x, picks, _level_counts(rng, s_slots, picks, n_s),
                           _level_counts(rng, d_slots, picks, n_d)).mean(axis=1)
    organism_replicates = aggregate(x, None, _level_counts(rng, s_slots, own, n_s),
                                    _level_counts(rng, d_slots, own, n_d))
    jack = None
    if jackknife:
        jack_x = np.where(degenerate[None], np.nan, _cell_values(design, _jackknife_weights(design))[0])
        jack = np.split(aggregate(jack_x), np.cumsum([len(st.ids) for st in design.strata])[:-1])
    cells = np.einsum("t,tosd->osd", design.weights, point)
    cell_items = np.einsum("t,rtosd->rosd", design.weights, x[:, :, keep])
    return Resampled(float(organism_values.mean()), replicates, design.organisms[keep], organism_values,
                     organism_replicates, aggregate(x), per_sample(every[None])[0], per_sample(x),
                     None if jack is None else tuple(j.mean(axis=1) for j in jack),
                     None if jack is None else tuple(jack), cells, cell_items,
                     int((degenerate.any(axis=0) & scored).sum()), int(scored.sum()),
                     tuple(s.key for s in design.strata), int(sum(len(s.ids) for s in design.strata)),
                     statistic_bounds(design))
