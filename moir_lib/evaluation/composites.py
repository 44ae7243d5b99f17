"""What a reported metric is made of, item by item, so that it can be recomputed under item weights.

A metric is a :class:`Composite` of constituents, each a mean over the items of one unit (a
:class:`Constituent`): ``S_e`` is the harmonic mean (eq. (se)) of Efficacy, Generalization, Specificity,
Fluency* and Portability over the edited records, Fluency* a ratio of two means (``mean(fluency_base) /
mean(fluency)``: the unedited over the edited model's mean log-probability, higher is better, as
:mod:`moir_lib.evaluation.counterfact` orients it); ``S_p`` the harmonic mean (eq. (sp)) of the accuracies
of the preservation tasks in the score (items with metric ``correct``); a single rate or mean
(``Efficacy``, a task label, ``nll:<domain>``) one constituent. :func:`combine` computes the composite
from the constituents' means, vectorised over any leading axes (replicates, cells).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moir_lib.evaluation.scores import EDIT_SCORES

__all__ = ["UNIT_METRICS", "Composite", "Constituent", "bounds", "combine", "composite", "floored"]

#: The per-record columns behind Fluency*: numerator (the unedited model) and denominator (the edited).
FLUENCY_COLUMNS = ("fluency_base", "fluency")
#: Item metrics whose values lie in [0, 1]: 0/1 outcomes (a preservation item answered right, ES, PS, NS)
#: and per-record shares of them (Efficacy, Generalization, Specificity, Portability).
UNIT_METRICS = frozenset({"correct", "ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity",
                          "Portability"})


@dataclass(frozen=True)
class Constituent:
    """The mean of ``metric`` over the items of ``(group, unit)``; with ``denominator`` the ratio of that
    mean to the mean of ``denominator`` over the same unit's items (Fluency*)."""

    name: str
    group: str
    unit: str
    metric: str
    denominator: str | None = None

    @property
    def columns(self) -> tuple[tuple[str, str, str], ...]:
        """The ``(group, unit, metric)`` columns it averages."""
        cols = ((self.group, self.unit, self.metric),)
        return cols + (((self.group, self.unit, self.denominator),) if self.denominator else ())


@dataclass(frozen=True)
class Composite:
    """A metric: its constituents and whether it is their harmonic mean (else it is the one constituent)."""

    name: str
    constituents: tuple[Constituent, ...]
    harmonic: bool

    @property
    def columns(self) -> tuple[tuple[str, str, str], ...]:
        """Every ``(group, unit, metric)`` column read, in :func:`combine`'s order, without repeats."""
        return tuple(dict.fromkeys(c for k in self.constituents for c in k.columns))


def bounds(comp: Composite) -> tuple[float, float]:
    """The range ``comp`` can take: a mean of a :data:`UNIT_METRICS` metric lies in [0, 1], a ratio
    (Fluency*) in [0, ∞), any other mean anywhere; a harmonic mean of ``n`` non-negative parts of which
    ``m`` lie in [0, 1] in ``[0, n / m]`` (``Σ 1/x_i ≥ m``)."""
    unit = [k.metric in UNIT_METRICS and k.denominator is None for k in comp.constituents]
    if comp.harmonic:
        return 0.0, len(unit) / sum(unit) if any(unit) else math.inf
    k = comp.constituents[0]
    return (0.0, 1.0) if unit[0] else (0.0, math.inf) if k.denominator else (-math.inf, math.inf)


def _edit_constituent(name: str) -> Constituent:
    if name == "Fluency*":
        return Constituent(name, "edit", "record", *FLUENCY_COLUMNS)
    return Constituent(name, "edit", "record", name)


def composite(metric: str, items: pd.DataFrame) -> Composite:
    """The :class:`Composite` ``metric`` names, read against ``items`` (the long per-item frame of the
    arms compared, for which constituents exist): ``S_e`` / ``S_e_noport`` (Portability left out where no
    record has it), ``Fluency*``, an edit metric (``ES``, ``Efficacy`` …), ``S_p`` (every preservation
    unit with ``correct`` items), ``<group>:<unit>`` (e.g. ``nll:code``) or a preservation task label."""
    edit = items[items["group"] == "edit"]
    if metric in EDIT_SCORES:
        present = set(edit.loc[edit["value"].notna(), "metric"].unique())
        names = [m for m in EDIT_SCORES[metric] if m != "Portability" or "Portability" in present]
        return Composite(metric, tuple(_edit_constituent(m) for m in names), True)
    if metric == "Fluency*" or metric in set(edit["metric"].unique()):
        return Composite(metric, (_edit_constituent(metric),), False)
    if metric == "S_p":
        pres = items[(items["group"] == "preservation") & (items["metric"] == "correct")]
        tasks = sorted(map(str, pres["unit"].unique()))
        if not tasks:
            raise ValueError("S_p needs preservation items with metric 'correct' (the tasks in the score); "
                             "none found")
        return Composite(metric, tuple(Constituent(t, "preservation", t, "correct") for t in tasks), True)
    group, _, unit = metric.partition(":") if ":" in metric else ("preservation", "", metric)
    sel = (items["group"] == group) & (items["unit"] == unit)
    found = sorted(map(str, items.loc[sel, "metric"].unique()))
    if len(found) != 1:
        pairs = items[["group", "unit"]].drop_duplicates().itertuples(index=False)
        known = sorted(f"{g}:{u}" for g, u in pairs)
        raise ValueError(f"metric {metric!r}: expected one metric in unit {group}:{unit}, found {found}; "
                         f"name S_e, S_e_noport, Fluency*, S_p, an edit metric or one of {known}")
    return Composite(metric, (Constituent(unit, group, unit, found[0]),), False)


def _hm(parts: np.ndarray) -> np.ndarray:
    """Harmonic mean over the last axis; 0 where any part is ≤ 0; NaN parts skipped (NaN if all are)."""
    defined = np.isfinite(parts)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(defined & (parts > 0), 1.0 / parts, 0.0)
        k = defined.sum(axis=-1)
        out = k / inv.sum(axis=-1)
    zero = (defined & (parts <= 0)).any(axis=-1)
    return np.where(zero, 0.0, np.where(k > 0, out, np.nan))


def _parts(comp: Composite, means: np.ndarray) -> np.ndarray:
    """The constituents' values ``(..., len(comp.constituents))``: each a mean or a ratio of means."""
    index = {c: i for i, c in enumerate(comp.columns)}
    parts = []
    for k in comp.constituents:
        cols = k.columns
        with np.errstate(divide="ignore", invalid="ignore"):
            parts.append(means[..., index[cols[0]]] / means[..., index[cols[1]]] if k.denominator
                         else means[..., index[cols[0]]])
    return np.stack(parts, axis=-1)


def combine(comp: Composite, means: np.ndarray) -> np.ndarray:
    """``comp`` from its columns' means (``(..., len(comp.columns))``, in :attr:`Composite.columns`
    order) → ``(...)``: each constituent a mean or a ratio of means, then their harmonic mean (eqs. (se),
    (sp)) or the one constituent."""
    parts = _parts(comp, means)
    return _hm(parts) if comp.harmonic else parts[..., 0]


def floored(comp: Composite, means: np.ndarray) -> np.ndarray:
    """``(...)``: where a harmonic ``comp`` is 0 because a constituent is ≤ 0 (eq. (sp)'s task at 0, S_e's
    Portability at 0): its value there says nothing of the other constituents; False for a single
    constituent, whose 0 is a value like any other."""
    parts = _parts(comp, means)
    if not comp.harmonic:
        return np.zeros(parts.shape[:-1], dtype=bool)
    return (np.isfinite(parts) & (parts <= 0)).any(axis=-1)
