"""The chapters' claims, judged by paired 95 % intervals (:mod:`moir_lib.evaluation.uncertainty`).

A :class:`Claim` is one sentence of the paper a chapter tests, the pocket measurement behind it (a paired
difference with its interval), the direction the paper asserts and whether the editability gate holds;
its verdict is one of three words: *reproduced*, *reversed*, *not resolved at this sample size*.
:func:`paired` measures a difference between two settings of the Lab on their shared records and items,
per edit-sample seed, from the items of :meth:`moir_lib.experiments.lab.Lab.frames`;
:func:`claims_frame` lays claims out for a table or the forest plot
(:func:`moir_lib.plots.claims_forest`); :func:`claim_records` is what a chapter's ``summary.json`` keeps,
from which :func:`moir_lib.book.claims_table` writes the book's claims table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from moir_lib.evaluation import uncertainty as unc
from moir_lib.experiments.rows import NONE, json_value


@dataclass(frozen=True)
class Claim:
    """One tested claim: ``claim`` (the paper's sentence), ``measured`` (what the difference is, e.g.
    ``S_p(C_Moir) − S_p(C_Wiki), MEMIT batch, N = 100``), ``estimate`` (the paired difference),
    ``direction`` (+1: the paper says it is positive), ``gate_ok`` (the edits take where it is measured),
    ``chapter`` (its page)."""

    claim: str
    measured: str
    estimate: unc.Estimate
    direction: int = 1
    gate_ok: bool = True
    chapter: str = ""

    @property
    def verdict(self) -> str:
        return unc.verdict(self.estimate, self.direction, self.gate_ok)

    def sentence(self, digits: int = 3) -> str:
        """``S_p(C_Moir) − S_p(C_Wiki): +0.120, 95 % CI [+0.05, +0.19]: reproduced``, with the gate's
        failure or the sample size that would resolve it."""
        text = f"{self.measured}: " + unc.verdict_text(self.estimate, self.direction, self.gate_ok, digits)
        if not self.gate_ok:
            text += " — the edits miss the editability gate here, so nothing is called reproduced"
        return text

    def record(self) -> dict[str, Any]:
        """Plain JSON for ``summary.json``'s ``claims``."""
        e = self.estimate
        return {"chapter": self.chapter, "claim": self.claim, "measured": self.measured,
                "value": json_value(e.value), "lo": json_value(e.lo), "hi": json_value(e.hi),
                "stderr": json_value(e.stderr), "n": int(e.n), "direction": self.direction,
                "gate_ok": bool(self.gate_ok), "verdict": self.verdict,
                "n_to_resolve": unc.items_to_resolve(e) if self.verdict == unc.UNRESOLVED else None}


def point_items(items: pd.DataFrame, spec: Any, n: int | None = None) -> pd.DataFrame:
    """The per-item scores of the point ``spec`` at ``n`` edits (default ``spec.n_edits``) in ``items``
    (items labelled with their point's columns, :meth:`moir_lib.experiments.lab.Lab.frames`)."""
    n = spec.n_edits if n is None else n
    sel = ((items["editor"] == spec.editor) & (items["regime"] == spec.regime) & (items["cov"] == spec.cov)
           & (items["seed"] == spec.seed) & (items["n_edits"] == n))
    return items[sel]


def paired(items: pd.DataFrame, a: Sequence[Any], b: Sequence[Any], metric: str, n: int | None = None
           ) -> unc.Estimate:
    """``metric(a) − metric(b)`` on ``items``: ``a`` and ``b`` are :class:`RunSpec` s, one per edit-sample
    seed in the same order (same seed, same records), scored at ``n`` edits (default each spec's
    ``n_edits``)."""
    return paired_sum(items, [(1.0, metric, a, b, n)])


def paired_sum(items: pd.DataFrame,
               terms: Sequence[tuple[float, str, Sequence[Any], Sequence[Any], int | None]]) -> unc.Estimate:
    """``Σ w · (metric(a) − metric(b))`` over ``terms`` ``(w, metric, a, b, n)`` (each as in :func:`paired`)
    in one bootstrap, e.g. Table 2's Total: the means over N of the edit score and of ``S_p``."""
    parts = []
    for w, metric, a, b, n in terms:
        if len(a) != len(b) or any(x.seed != y.seed for x, y in zip(a, b, strict=True)):
            raise ValueError("paired settings need the same edit-sample seeds in the same order")
        side_a = [point_items(items, s, n)[list(unc.ITEM_COLUMNS)] for s in a]
        side_b = [point_items(items, s, n)[list(unc.ITEM_COLUMNS)] for s in b]
        if not a or any(p.empty for p in side_a + side_b):
            return unc.NAN_ESTIMATE
        parts.append((w, side_a, side_b, metric))
    return unc.combined_difference(parts)


def gate(rows: pd.DataFrame, specs: Sequence[Any], n: int | None = None) -> bool:
    """Whether the edits take (mean ES over ``specs`` at ``n`` ≥ the editability gate)."""
    from moir_lib.chapters.lab_tables import edits_take

    sel = rows[(rows["metric"] == "ES") & (rows["editor"] != NONE)]
    keep = pd.Series(False, index=sel.index)
    for s in specs:
        k = s.n_edits if n is None else n
        keep |= ((sel["editor"] == s.editor) & (sel["regime"] == s.regime) & (sel["cov"] == s.cov)
                 & (sel["seed"] == s.seed) & (sel["n_edits"] == k))
    es = sel.loc[keep, "value"].mean()
    return bool(math.isfinite(es) and edits_take(es))


def claims_frame(claims: Sequence[Claim], digits: int = 3) -> pd.DataFrame:
    """One row per claim: ``label`` (what is measured), ``value``, ``lo``, ``hi``, ``difference``
    (``+0.12 ± 0.07``), ``verdict``."""
    return pd.DataFrame([{"label": c.measured, "claim": c.claim, "value": c.estimate.value,
                          "lo": c.estimate.lo, "hi": c.estimate.hi,
                          "difference": c.estimate.fmt(digits, signed=True), "verdict": c.verdict}
                         for c in claims])


def claim_records(claims: Sequence[Claim], chapter: str) -> list[dict[str, Any]]:
    """The claims as ``summary.json`` records, each naming ``chapter``."""
    return [replace(c, chapter=c.chapter or chapter).record() for c in claims]
