"""The chapters' claims, judged by the engine of :mod:`moir_lib.evaluation.inference`.

A :class:`Claim` is one sentence of the paper a chapter tests, the label of the pocket measurement behind
it, its :class:`~moir_lib.evaluation.inference.ClaimTest` (the multi-level bootstrap of
:mod:`moir_lib.evaluation.bootstrap`: organisms, edit samples and C draws redrawn, one multiplicity per
item id; the studentized interval with its floors; the relative margin of a non-inferiority claim), once
judged its :class:`~moir_lib.evaluation.families.Judged` (:func:`judge`: the chapter's
:class:`Hierarchy`, fixed before any data: the primary claim at α, the secondaries gatekept behind it,
Holm among them; the null control alone), what it generalises over (:class:`Scope`) and the power of its
test against the minimal effect stated for its kind (:data:`MINIMAL_EFFECTS`) at the level it is held
to, from the book's variance components (:mod:`moir_lib.evaluation.components`). Its verdict is one of
three words, in two scopes (about the recipe, about these organisms): *reproduced*, *reversed*, *not
resolved at this sample size*; a failed editability gate blocks both words, and a claim that measured
nothing (every cell degenerate, or no variation) is *not measured*.

Claims are functions of per-item frames (:meth:`moir_lib.experiments.lab.Lab.frames`, several organisms'
frames concatenated), never of a Lab: an :class:`Arm` selects the items of one setting pooled over its
edit samples, C draws and organisms; the two arms of a comparison are paired by cell ``(organism, sample,
draw)`` and item (:func:`measure`). A claim's ``id`` hashes its label with the keys of the points it reads,
so a measurement two chapters judge is one row of the book's claims table
(:func:`moir_lib.book.claims_table`). :func:`null_control` compares two disjoint sets of draws of one C:
nothing differs but the draws, so its verdict must read *not resolved*.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd

from moir_lib.chapters.lab_tables import COV_LABELS, edits_take
from moir_lib.covariance.recipes import parse_name
from moir_lib.evaluation import components as variance_components
from moir_lib.evaluation import families, inference
from moir_lib.evaluation.bootstrap import Term, resample
from moir_lib.evaluation.families import Judged
from moir_lib.evaluation.inference import NONINFERIORITY_MARGIN, ClaimTest
from moir_lib.evaluation.intervals import NOT_MEASURED, UNRESOLVED, Estimate
from moir_lib.evaluation.power import MINIMAL_EFFECT, Design

__all__ = ["MINIMAL_EFFECTS", "NOT_MEASURED", "NULL_CLAIM", "Arm", "Claim", "Hierarchy", "Scope",
           "claims_frame", "claims_json", "gate", "judge", "label", "measure", "noninferiority_label",
           "null_control", "short_of_gate", "with_sensitivity"]

#: The sentence of the null control: what it must *not* find.
NULL_CLAIM = "Null control: two independent sets of draws of one C differ"
#: The effect each kind of claim's power is computed against, fixed before any data: ``ΔS_p`` and a
#: task's accuracy 0.15 (:data:`~moir_lib.evaluation.power.MINIMAL_EFFECT`, about the paper's Table 1
#: gains); Table 2's Total the same (its two halves each a mean over N); an edit score's non-inferiority
#: no loss at all (its statistic is then the margin's share of the reference arm's score).
MINIMAL_EFFECTS: dict[str, float] = {"S_p": MINIMAL_EFFECT, "task": MINIMAL_EFFECT, "total": MINIMAL_EFFECT,
                                     "edit": 0.0}
_EDITORS = {"memit": "MEMIT", "alphaedit": "AlphaEdit"}
_CELL = ["organism", "sample", "draw"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Scope:
    """What a claim generalises over: its unique ``items``, the edit ``samples``, the C ``draws`` and the
    ``organisms`` of the cells both arms scored."""

    items: int
    samples: int
    draws: int
    organisms: int

    def text(self) -> str:
        """``100 items · 3 edit samples · 2 C draws · 1 organism``."""
        return " · ".join([_plural(self.items, "item"), _plural(self.samples, "edit sample"),
                           _plural(self.draws, "C draw"), _plural(self.organisms, "organism")])


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: the items (or rows) of ``editor × regime × C × N`` pooled over every edit
    sample, C draw and organism scored. ``cov`` is a base name (``moir`` holds ``moir@1``:
    :func:`~moir_lib.covariance.recipes.parse_name`); ``draws``: only those draws, renumbered 0, 1, … in
    that order, so that two disjoint sets of draws of one C pair draw by draw (None: every draw as it is)."""

    editor: str
    regime: str
    cov: str
    n_edits: int
    draws: tuple[int, ...] | None = None

    @property
    def setting(self) -> str:
        """``MEMIT batch, N = 100``."""
        return f"{_EDITORS.get(self.editor, self.editor)} {self.regime}, N = {self.n_edits}"

    @property
    def name(self) -> str:
        """``Moir``, or ``Moir [draws 2-3]`` for a set of draws."""
        label = COV_LABELS.get(self.cov, self.cov).split(" (")[0]
        if self.draws is None:
            return label
        span = f"{self.draws[0]}-{self.draws[-1]}" if len(self.draws) > 1 else f"{self.draws[0]}"
        return f"{label} [draw{'s' if len(self.draws) > 1 else ''} {span}]"

    def select(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``frame`` (items or tidy rows labelled with their point's columns) in this arm, with
        ``draw`` read off each C's name (renumbered when ``draws`` is given)."""
        names = {c: parse_name(c) for c in frame["cov"].unique()}
        base = frame["cov"].map({c: b for c, (b, _) in names.items()})
        draw = frame["cov"].map({c: d for c, (_, d) in names.items()})
        keep = ((frame["editor"] == self.editor) & (frame["regime"] == self.regime)
                & (frame["n_edits"] == self.n_edits) & (base == self.cov))
        if self.draws is not None:
            keep &= draw.isin(self.draws)
            draw = draw.map({d: i for i, d in enumerate(self.draws)})
        return frame[keep].assign(draw=draw[keep].astype(int))


def label(metric: str, a: Arm, b: Arm) -> str:
    """The measured label of ``metric(a) − metric(b)``: ``S_p Moir − Wiki (MEMIT batch, N = 100)`` (one
    measurement, one label, whichever chapter judges it)."""
    return f"{metric} {a.name} − {b.name} ({a.setting})"


def gate(rows: pd.DataFrame, *arms: Arm) -> bool:
    """Whether the edits take in every arm: the mean ES over its rows meets the editability gate
    (:func:`~moir_lib.chapters.lab_tables.edits_take`)."""
    es = [arm.select(rows[rows["metric"] == "ES"])["value"].mean() for arm in arms]
    return bool(arms) and all(math.isfinite(v) and edits_take(v) for v in es)


@dataclass(frozen=True)
class Hierarchy:
    """A chapter's claims ordered before any data (:mod:`moir_lib.evaluation.families`): the ``primary``
    claim (the paper's sentence, tested at α), why it is the primary (``reason``) and which claims follow it
    as ``secondaries``; ``control``: the null control the chapter judges alone, if any."""

    chapter: str
    primary: str
    reason: str
    secondaries: str
    control: str = ""


@dataclass(frozen=True)
class Claim:
    """One tested claim: ``claim`` (the paper's sentence), ``measured`` (the label of the measurement,
    e.g. ``S_p Moir − Wiki (MEMIT batch, N = 100)``), its ``test`` before the hierarchy, ``chapter``, what it
    generalises over (``scope``), its ``id`` (:func:`measure`), ``judged`` once its chapter's hierarchy is
    judged (:func:`judge`), ``control`` for the null control, its ``kind`` (``S_p``, ``task``, ``edit``,
    ``total``, ``control``; empty for a claim about one model's samples), ``power``: of its test against
    :data:`MINIMAL_EFFECTS` at its level (NaN where none is stated), for a relative non-inferiority
    claim the ``reference`` arm's score, and ``sensitivity``: the claim at other operating points
    ``(which, estimate)`` (:func:`with_sensitivity`); ``short_edits``: where one organism's own edits miss
    the editability gate that the arms' pooled mean clears (:func:`short_of_gate`)."""

    claim: str
    measured: str
    test: ClaimTest
    chapter: str = ""
    scope: Scope | None = None
    id: str = ""
    judged: Judged | None = None
    control: bool = False
    kind: str = ""
    power: float = math.nan
    reference: float = math.nan
    sensitivity: tuple[tuple[str, Estimate], ...] = ()
    short_edits: tuple[tuple[str, int, float], ...] = ()

    @property
    def result(self) -> Judged:
        """The judged claim: its hierarchy's (:func:`judge`), else as a primary of its own."""
        if self.judged is not None:
            return self.judged
        return families.judge(self.test)[0]

    @property
    def verdict(self) -> str:
        return self.result.verdict

    @property
    def estimate(self) -> Estimate:
        return self.test.estimate

    @property
    def role(self) -> str:
        return self.result.role

    def interval(self) -> str:
        """Which interval the claim shows: ``studentized ∪ t on 3 organism means (2 df)``, …"""
        t = self.test
        floor = {"organisms": f" ∪ t on {len(t.organisms)} organism means ({len(t.organisms) - 1} df)",
                 "cells": " ∪ t on the cells"}
        return t.method + "".join(text for name, text in floor.items() if name in t.parts)

    def _about(self) -> str:
        t, r = self.test, self.result
        if t.scope == "sample":
            return "about this one sample"
        if t.scope == "model":
            return "about this one model"
        k = len(t.organisms)
        po = "n/a" if not math.isfinite(r.p_organisms) else f"{r.p_organisms:.3g}"
        return (f"about the recipe (t on the {k} organism means); in each of these {k} organisms: "
                f"{r.verdict_organisms} (intersection-union, adjusted p = {po}; {t.agreeing} of {k} agree in "
                "sign and resolve on their own at α)")

    def sentence(self, digits: int = 3) -> str:
        """``S_p Moir − Wiki (…): reproduced (+0.120, 95 % CI […]; p = …, adjusted p = … (primary, at α =
        0.05); about the recipe …; power …)``, with what it generalises over; for the null control, what its
        verdict must read."""
        t, r, e = self.test, self.result, self.estimate
        if not t.measured:
            why = t.note.removeprefix("not measured: ") or "no paired items"
            text = f"{self.measured}: {NOT_MEASURED} ({why})"
        else:
            text = (f"{self.measured}: {r.verdict} ({e.value:+.{digits}f}, 95 % CI {e.interval(digits)} "
                    f"({self.interval()}); p = {t.p_value:.3g}, adjusted p = {r.p_adjusted:.3g} "
                    f"({r.place()}); {self._about()}")
            if math.isfinite(self.power):
                text += f"; power {self.power:.2f} {self._power_against()}"
            if t.degenerate:
                text += (f"; {t.degenerate} of {t.cells} cells left out: both arms' harmonic mean is 0 there "
                         "(a constituent at 0 in both)")
            text += ")"
            if not t.gate_ok:
                text += (" — the edits miss the editability gate here, so nothing is called reproduced or "
                         "reversed")
            elif r.resolution() is not None:
                text += "; " + r.resolution().text()
            if self.short_edits:
                text += " — edits miss the editability gate in " + ", ".join(
                    f"organism {o} ({name}, ES {es:.2f})" for name, o, es in self.short_edits) + \
                    ": there preservation is read at edits that did not take"
        if self.scope is not None:
            text += f" [{self.scope.text()}]"
        if self.control:
            text += (" — a null control, which must read not resolved" if self.verdict == UNRESOLVED else
                     " — a null control, not measured here" if self.verdict == NOT_MEASURED else
                     f" — a null control reads {self.verdict}: nothing differs but the draws of C, so the "
                     "intervals of this comparison are too narrow")
        return text

    def _power_against(self) -> str:
        if self.kind == "edit":
            return "when C costs no edit quality at all"
        return f"against a difference of {MINIMAL_EFFECTS.get(self.kind, math.nan):g}"

    def record(self) -> dict[str, Any]:
        """Plain JSON for ``summary.json``'s ``claims``: the estimate and interval (and which interval), the
        p-values (marginal, adjusted, the level held to), the place in the hierarchy, the verdicts of both
        scopes, what would resolve it, the power, the variance components, the claim, its label, chapter,
        id, what it generalises over and whether it is the null control."""
        t, e, r = self.test, self.test.estimate, self.result
        res = r.resolution()
        scope = None if self.scope is None else {"items": self.scope.items, "samples": self.scope.samples,
                                                 "draws": self.scope.draws, "organisms": self.scope.organisms}
        return {"id": self.id, "chapter": self.chapter, "claim": self.claim, "measured": self.measured,
                "control": self.control, "generalises": scope, "kind": self.kind,
                "value": _number(e.value), "lo": _number(e.lo), "hi": _number(e.hi),
                "stderr": _number(e.stderr), "n": int(e.n), "null": t.null, "direction": t.direction,
                "gate_ok": bool(t.gate_ok), "method": t.method, "interval": self.interval(), "scope": t.scope,
                "p": _number(t.p_value), "p_adjusted": _number(r.p_adjusted), "level": r.level,
                "role": r.role, "tested": r.tested, "family": r.family, "verdict": r.verdict,
                "measured_ok": t.measured, "note": t.note, "degenerate": t.degenerate, "cells": t.cells,
                "organisms": len(t.organisms), "agreeing": t.agreeing,
                "p_organisms": _number(r.p_organisms), "verdict_organisms": r.verdict_organisms,
                "organism_values": [_number(o.estimate.value) for o in t.organisms],
                "power": _number(self.power), "minimal_effect": MINIMAL_EFFECTS.get(self.kind),
                "n_to_resolve": None if res is None else res.items,
                "more_units": None if res is None else res.more(),
                "components": None if t.components is None else asdict(t.components),
                "short_edits": [{"arm": name, "organism": o, "ES": es} for name, o, es in self.short_edits],
                "sensitivity": [{"which": which, "value": _number(est.value), "lo": _number(est.lo),
                                 "hi": _number(est.hi)} for which, est in self.sensitivity],
                "parts": {k: _number(v) for k, v in t.parts.items()}}


def short_of_gate(items: pd.DataFrame, arms: Sequence[Arm]) -> tuple[tuple[str, int, float], ...]:
    """``(arm, organism, mean ES)`` wherever one organism's own edits in one of ``arms`` miss the
    editability gate (:func:`~moir_lib.chapters.lab_tables.edits_take`, on the per-record ES of ``items``),
    which :func:`gate` reads pooled over the organisms."""
    if "metric" not in items.columns:
        return ()
    es = items[items["metric"] == "ES"]
    return tuple((arm.name, int(o), float(v)) for arm in dict.fromkeys(arms)
                 for o, v in arm.select(es).groupby("organism")["value"].mean().items()
                 if not edits_take(float(v)))


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _cells(frame: pd.DataFrame) -> set[tuple[int, int, int]]:
    return set(frame[_CELL].drop_duplicates().itertuples(index=False, name=None))


def _paired(a: pd.DataFrame, b: pd.DataFrame, weight: float, metric: str) -> Term:
    """The term ``weight · (metric(a) − metric(b))`` on the cells both arms scored."""
    both = pd.MultiIndex.from_tuples(sorted(_cells(a) & _cells(b)), names=_CELL)
    a, b = (f[pd.MultiIndex.from_frame(f[_CELL]).isin(both)] for f in (a, b))
    return Term(a, b, metric, weight)


def _claim_id(measured: str, terms: Sequence[Term]) -> str:
    """A stable hash of the label and the keys of the points each arm of each term reads."""
    parts = [measured] + [[t.metric, t.weight] + [sorted(map(str, set(f["key"]))) for f in (t.a, t.b)]
                          for t in terms]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def _kind(terms: Sequence[tuple[float, str, Arm, Arm]], margin: float, control: bool) -> str:
    if control:
        return "control"
    if len(terms) > 1:
        return "total"
    metric = terms[0][1]
    return "S_p" if metric == "S_p" else "edit" if margin or metric.startswith("S_e") else "task"


def measure(claim: str, measured: str, items: pd.DataFrame, terms: Sequence[tuple[float, str, Arm, Arm]], *,
            margin: float = 0.0, gate_ok: bool = True, chapter: str = "", control: bool = False) -> Claim:
    """The claim that ``Σ w · (metric(a) − metric(b))`` over ``terms`` ``(w, metric, a, b)`` (a metric:
    ``S_e`` eq. (se), ``S_p`` eq. (sp), one task's accuracy, …: :mod:`moir_lib.evaluation.composites`) is
    positive (``margin`` ``δ > 0``: non-inferiority, ``a`` keeps at least ``1 − δ`` of ``b``), measured on
    ``items`` with :func:`~moir_lib.evaluation.inference.compare` (its bootstrap seeded 0): each arm's items
    pooled over its edit samples, C draws and organisms, paired with the other arm's by cell and item (the
    cells only one arm scored left out). Not measured where the arms of a term share no cell, or where every
    cell is degenerate. Its ``id`` hashes ``measured`` with the keys of the points paired, so the same
    measurement has the same id in every chapter."""
    built = [_paired(a.select(items), b.select(items), w, metric) for w, metric, a, b in terms]
    if not built or any(t.a.empty for t in built):
        test = inference.not_measured(1, gate_ok, "not measured: the arms share no scored cell")
    else:
        test = inference.compare(built, margin=margin, gate_ok=gate_ok)
    cells = set().union(*(_cells(t.a) for t in built))
    scope = Scope(int(test.estimate.n), len({s for _, s, _ in cells}), len({d for _, _, d in cells}),
                  len({o for o, _, _ in cells}))
    reference = math.nan
    if margin and test.measured:
        reference = resample(Term(built[0].b, None, built[0].metric), n_resamples=2).value
    return Claim(claim, measured, test, chapter, scope, _claim_id(measured, built), control=control,
                 kind=_kind(terms, margin, control), reference=reference,
                 short_edits=short_of_gate(items, [arm for _, _, a, b in terms for arm in (a, b)]))


def noninferiority_label(metric: str, a: Arm, b: Arm, margin: float = NONINFERIORITY_MARGIN) -> str:
    """``S_e Moir − 0.9 × Wiki (MEMIT batch, N = 100)``: the statistic of a relative non-inferiority claim."""
    return f"{metric} {a.name} − {1 - margin:g} × {b.name} ({a.setting})"


def null_control(rows: pd.DataFrame, items: pd.DataFrame, arm: Arm, draws: int, metric: str = "S_p",
                 chapter: str = "") -> Claim:
    """The null control of :func:`measure`: ``metric`` of draws ``draws … 2·draws − 1`` of ``arm``'s C
    against draws ``0 … draws − 1`` of the same recipe, draw ``draws + d`` paired with draw ``d``, on the same
    edit samples and items. Both sets are independent draws of one C, so the difference is zero in
    expectation: tested two-sided (``direction`` +1, either resolved word is a false finding) and alone at
    α (:func:`judge`), its verdict must read *not resolved*."""
    a = replace(arm, draws=tuple(range(draws, 2 * draws)))
    b = replace(arm, draws=tuple(range(draws)))
    return measure(NULL_CLAIM, label(metric, a, b), items, [(1.0, metric, a, b)],
                   gate_ok=gate(rows, a, b), chapter=chapter, control=True)


def _power(claim: Claim, level: float,
           components: dict[str, variance_components.Components] | None) -> float:
    """The power of ``claim``'s test at ``level`` against its kind's minimal effect, from ``components``
    (of its kind) at its own design (organisms × edit samples × C draws × items per task)."""
    c = (components or {}).get(claim.kind)
    minimal = MINIMAL_EFFECTS.get(claim.kind)
    if c is None or minimal is None or claim.scope is None or not claim.test.measured:
        return math.nan
    if claim.kind == "edit":  # no loss: the statistic's mean is the margin's share of the reference
        minimal = NONINFERIORITY_MARGIN * claim.reference
    items = claim.test.components.items if claim.test.components is not None else c.items
    design = Design(claim.scope.organisms, claim.scope.samples, claim.scope.draws, items)
    return c.power(design, minimal, level)


def judge(primary: Claim, secondaries: Sequence[Claim] = (), control: Claim | None = None,
          components: dict[str, variance_components.Components] | None = None) -> list[Claim]:
    """One chapter's claims judged as its hierarchy (:mod:`moir_lib.evaluation.families`): the ``primary``
    at α, the ``secondaries`` gatekept behind it with Holm among them, the null ``control`` alone at α;
    each with the power of its test at its level (``components``: the book's, by kind, by default the
    repository's file, :func:`moir_lib.evaluation.components.load`). Returned in that order."""
    if components is None:
        components = _book_components()
    judged = families.judge(primary.test, [c.test for c in secondaries])
    out = [replace(c, judged=j, power=_power(c, j.level, components))
           for c, j in zip([primary, *secondaries], judged, strict=True)]
    if control is not None:
        j = families.judge_control(control.test)
        out.append(replace(control, judged=j, power=math.nan))
    return out


def with_sensitivity(judged: Sequence[Claim], rows: Sequence[tuple[str, Claim]]) -> list[Claim]:
    """``judged`` with its primary claim (the first) carrying ``rows``: the same claim measured at other
    operating points (:func:`moir_lib.chapters.strength_tables.neighbour_claims`), for its record and the
    claims table."""
    if not judged:
        return []
    first = replace(judged[0], sensitivity=tuple((which, c.estimate) for which, c in rows))
    return [first, *judged[1:]]


def _book_components() -> dict[str, variance_components.Components]:
    """The repository's variance components by kind ({} when the file is missing: no power shown)."""
    try:
        return variance_components.load()[0]
    except ValueError:
        return {}


def claims_frame(claims: Sequence[Claim], digits: int = 3) -> pd.DataFrame:
    """One row per claim: ``label`` (what is measured), ``claim``, ``role``, ``value``, ``lo``, ``hi``,
    ``difference`` (``+0.12 ± 0.07``), ``verdict`` (about the recipe, or the model), ``p``, ``p_adjusted``,
    ``organisms`` (the verdict about these organisms), ``power`` and ``scope`` (what it generalises over)."""
    cols = ["label", "claim", "role", "value", "lo", "hi", "difference", "verdict", "p", "p_adjusted",
            "organisms", "power", "scope"]
    return pd.DataFrame([{"label": c.measured, "claim": c.claim, "role": c.role, "value": c.estimate.value,
                          "lo": c.estimate.lo, "hi": c.estimate.hi,
                          "difference": (c.estimate.fmt(digits, signed=True) if c.test.measured
                                         else NOT_MEASURED),
                          "verdict": c.verdict, "p": c.test.p_value, "p_adjusted": c.result.p_adjusted,
                          "organisms": c.result.verdict_organisms if len(c.test.organisms) > 1 else "",
                          "power": c.power, "scope": c.scope.text() if c.scope else ""} for c in claims],
                        columns=cols)


def claims_json(claims: Sequence[Claim], chapter: str) -> list[dict[str, Any]]:
    """The claims as ``summary.json`` JSON objects, each naming ``chapter``."""
    return [replace(c, chapter=c.chapter or chapter).record() for c in claims]
