"""The chapters' claims, judged by the engine of :mod:`moir_lib.evaluation.inference`.

A :class:`Claim` is one sentence of the paper a chapter tests, the label of the pocket measurement behind
it, its :class:`~moir_lib.evaluation.inference.ClaimTest` (the multi-level bootstrap of
:mod:`moir_lib.evaluation.bootstrap`: organisms, edit samples and C draws redrawn, one multiplicity per
item id; the studentized interval with its floors; the margin of a non-inferiority claim), once judged its
:class:`~moir_lib.evaluation.inference.Judged` (Holm's correction within the chapter's family,
:func:`judge`), and what it generalises over (:class:`Scope`). Its verdict is one of three words:
*reproduced*, *reversed*, *not resolved at this sample size*; a failed editability gate blocks both
words.

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
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from moir_lib.chapters.lab_tables import COV_LABELS, edits_take
from moir_lib.covariance.recipes import parse_name
from moir_lib.evaluation import inference
from moir_lib.evaluation.bootstrap import Term
from moir_lib.evaluation.inference import ClaimTest, Judged
from moir_lib.evaluation.intervals import NAN_ESTIMATE, UNRESOLVED, Estimate

__all__ = ["NULL_CLAIM", "Arm", "Claim", "Scope", "claim_records", "claims_frame", "gate", "judge", "label",
           "measure", "null_control"]

#: The sentence of the null control: what it must *not* find.
NULL_CLAIM = "Null control: two independent sets of draws of one C differ"
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
class Claim:
    """One tested claim: ``claim`` (the paper's sentence), ``measured`` (the label of the measurement,
    e.g. ``S_p Moir − Wiki (MEMIT batch, N = 100)``), its ``test`` before the family's correction,
    ``chapter``, what it generalises over (``scope``), its ``id`` (:func:`measure`), ``judged`` once its
    family is judged (:func:`judge`) and ``control`` for the null control."""

    claim: str
    measured: str
    test: ClaimTest
    chapter: str = ""
    scope: Scope | None = None
    id: str = ""
    judged: Judged | None = None
    control: bool = False

    @property
    def result(self) -> Judged:
        """The judged claim: its family's (:func:`judge`), else as a family of one."""
        if self.judged is not None:
            return self.judged
        return Judged(self.test, self.test.p_value, 1, self.test.verdict())

    @property
    def verdict(self) -> str:
        return self.result.verdict

    @property
    def estimate(self) -> Estimate:
        return self.test.estimate

    def sentence(self, digits: int = 3) -> str:
        """``S_p Moir − Wiki (…): reproduced (+0.120, 95 % CI […]; p = …, Holm p = … over 4 claims; …)``, with
        what it generalises over; for the null control, what its verdict must read."""
        text = f"{self.measured}: {self.result.sentence(digits)}"
        if self.scope is not None:
            text += f" [{self.scope.text()}]"
        if self.control:
            text += (" — a null control, which must read not resolved" if self.verdict == UNRESOLVED else
                     f" — a null control reads {self.verdict}: nothing differs but the draws of C, so the "
                     "intervals of this comparison are too narrow")
        return text

    def record(self) -> dict[str, Any]:
        """Plain JSON for ``summary.json``'s ``claims``: :meth:`Judged.record`'s fields with the claim, its
        label, chapter, id, scope and whether it is the null control."""
        scope = None if self.scope is None else {"items": self.scope.items, "samples": self.scope.samples,
                                                 "draws": self.scope.draws, "organisms": self.scope.organisms}
        return {"id": self.id, "chapter": self.chapter, "claim": self.claim, "measured": self.measured,
                "control": self.control, "generalises": scope, **self.result.record()}


def _unmeasured(direction: int, margin: float, gate_ok: bool) -> ClaimTest:
    """The test of a claim whose arms share no scored cell: not measured, not resolved."""
    null = -direction * margin if margin else 0.0
    return ClaimTest(NAN_ESTIMATE, math.nan, null, direction, gate_ok, "none", "model", ())


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


def measure(claim: str, measured: str, items: pd.DataFrame, terms: Sequence[tuple[float, str, Arm, Arm]], *,
            direction: int = 1, margin: float = 0.0, gate_ok: bool = True, chapter: str = "",
            control: bool = False, seed: int = 0) -> Claim:
    """The claim that ``Σ w · (metric(a) − metric(b))`` over ``terms`` ``(w, metric, a, b)`` (a metric:
    ``S_e`` eq. (se), ``S_p`` eq. (sp), one task's accuracy, …: :mod:`moir_lib.evaluation.composites`) has
    the sign ``direction`` (``margin > 0``: non-inferiority, not below ``−margin``), measured on ``items``
    with :func:`~moir_lib.evaluation.inference.compare`: each arm's items pooled over its edit samples, C
    draws and organisms, paired with the other arm's by cell and item (the cells only one arm scored left
    out).
    Not measured (NaN, not resolved) where the arms of a term share no cell. Its ``id`` hashes ``measured``
    with the keys of the points paired, so the same measurement has the same id in every chapter."""
    built = [_paired(a.select(items), b.select(items), w, metric) for w, metric, a, b in terms]
    if not built or any(t.a.empty for t in built):
        test = _unmeasured(direction, margin, gate_ok)
    else:
        test = inference.compare(built, direction=direction, margin=margin, gate_ok=gate_ok, seed=seed)
    cells = set().union(*(_cells(t.a) for t in built))
    scope = Scope(int(test.estimate.n), len({s for _, s, _ in cells}), len({d for _, _, d in cells}),
                  len({o for o, _, _ in cells}))
    return Claim(claim, measured, test, chapter, scope, _claim_id(measured, built), control=control)


def null_control(rows: pd.DataFrame, items: pd.DataFrame, arm: Arm, draws: int, metric: str = "S_p",
                 chapter: str = "") -> Claim:
    """The null control of :func:`measure`: ``metric`` of draws ``draws … 2·draws − 1`` of ``arm``'s C
    against draws ``0 … draws − 1`` of the same recipe, draw ``draws + d`` paired with draw ``d``, on the same
    edit samples and items. Both sets are independent draws of one C, so the difference is zero in
    expectation: tested two-sided (``direction`` +1, either resolved word is a false finding), its verdict
    must read *not resolved*."""
    a = replace(arm, draws=tuple(range(draws, 2 * draws)))
    b = replace(arm, draws=tuple(range(draws)))
    return measure(NULL_CLAIM, label(metric, a, b), items, [(1.0, metric, a, b)],
                   gate_ok=gate(rows, a, b), chapter=chapter, control=True)


def judge(claims: Sequence[Claim]) -> list[Claim]:
    """One chapter's claims judged as a family: Holm's correction of their p-values decides each verdict
    word (:func:`moir_lib.evaluation.inference.judge`); the intervals stay the marginal 95 % ones."""
    judged = inference.judge([c.test for c in claims])
    return [replace(c, judged=j) for c, j in zip(claims, judged, strict=True)]


def claims_frame(claims: Sequence[Claim], digits: int = 3) -> pd.DataFrame:
    """One row per claim: ``label`` (what is measured), ``claim``, ``value``, ``lo``, ``hi``, ``difference``
    (``+0.12 ± 0.07``), ``verdict``, ``p_holm`` and ``scope`` (what it generalises over)."""
    return pd.DataFrame([{"label": c.measured, "claim": c.claim, "value": c.estimate.value,
                          "lo": c.estimate.lo, "hi": c.estimate.hi,
                          "difference": c.estimate.fmt(digits, signed=True), "verdict": c.verdict,
                          "p_holm": c.result.p_holm,
                          "scope": c.scope.text() if c.scope else ""} for c in claims],
                        columns=["label", "claim", "value", "lo", "hi", "difference", "verdict", "p_holm",
                                 "scope"])


def claim_records(claims: Sequence[Claim], chapter: str) -> list[dict[str, Any]]:
    """The claims as ``summary.json`` records, each naming ``chapter``."""
    return [replace(c, chapter=c.chapter or chapter).record() for c in claims]
