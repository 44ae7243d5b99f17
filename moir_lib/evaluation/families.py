"""A chapter's claims judged as a hierarchy fixed in advance: one primary claim, its secondaries behind it.

* **The primary claim** is tested at α = 0.05 alone.
* **The secondary claims** are tested only when the primary resolves (either word: its p-value below α,
  its interval clear of the null and its editability gate passed): a serial gatekeeping procedure,
  Holm's step-down correction among the secondaries (:func:`holm`). The adjusted p-value of a secondary
  is ``max(p_primary, p_Holm)``: below α exactly when the primary's test and Holm both reject it. The
  family-wise error rate stays at α: a false secondary finding needs the primary rejected at α first, and
  within the open gate Holm holds the secondaries to α.
* **The null control** (:func:`judge_control`) is judged alone at α and shown apart: it is a check of the
  procedure, not a claim, so it neither pays for the claims' correction nor makes them pay for it.

Each claim is judged in two scopes (:class:`~moir_lib.evaluation.inference.ClaimTest`): about the recipe
(its own p-value: the t on the organism means decides) and about these K organisms (the
intersection-union test, every organism resolved on its own); the same hierarchy adjusts both. The
verdict words come from the adjusted p-values; the interval shown stays the marginal 95 % one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moir_lib.evaluation.inference import ClaimTest
from moir_lib.evaluation.intervals import ALPHA, NOT_MEASURED, REPRODUCED, REVERSED, UNRESOLVED
from moir_lib.evaluation.power import Resolution

__all__ = ["ROLES", "Judged", "holm", "holm_levels", "judge", "judge_control"]

#: A claim's place: ``primary`` (α), ``secondary`` (gatekept behind the primary, Holm among them),
#: ``control`` (the null control, alone at α).
ROLES = ("primary", "secondary", "control")


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


def holm_levels(p_values: Sequence[float], alpha: float = ALPHA) -> np.ndarray:
    """The level each p-value is held to at its place in Holm's step-down: ``α / (m − j + 1)`` for the
    ``j``-th smallest."""
    p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
    levels = np.empty(len(p))
    for rank, i in enumerate(np.argsort(p, kind="stable")):
        levels[i] = alpha / (len(p) - rank)
    return levels


@dataclass(frozen=True)
class Judged:
    """A claim judged at its place: its ``test``, ``role`` (:data:`ROLES`), the ``p_adjusted`` that decides
    its verdict about the recipe (or the model, with one organism), the ``level`` its own p-value is held
    to there, whether it was ``tested`` (a secondary: whether the primary resolved), the hierarchy's size
    ``family``, the ``verdict``; the same about these organisms (``p_organisms``: the adjusted
    intersection-union p-value, ``verdict_organisms``; NaN and not resolved with fewer than two)."""

    test: ClaimTest
    role: str
    p_adjusted: float
    level: float
    tested: bool
    family: int
    verdict: str
    p_organisms: float = math.nan
    verdict_organisms: str = UNRESOLVED

    def resolution(self) -> Resolution | None:
        """What would resolve the claim at the level it is held to (None when it resolves, is not
        measured or its gate fails)."""
        if self.verdict != UNRESOLVED:
            return None
        return self.test.resolution(self.level)

    def place(self) -> str:
        """``primary, at α = 0.05``, ``secondary, gatekept …, Holm level 0.0071``, ``null control, …``."""
        if self.role == "primary":
            return f"primary, at α = {self.level:g}"
        if self.role == "control":
            return f"null control, alone at α = {self.level:g}"
        gate = "" if self.tested else ", not tested: the primary did not resolve"
        return f"secondary, gatekept behind the primary, Holm level {self.level:.3g}{gate}"


def _secondaries(primary_p: float, tests: Sequence[ClaimTest], p_of, alpha: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The gatekept adjusted p-values ``max(p_primary, p_Holm)`` of ``tests`` (``p_of``: a test's p-value in
    the scope judged) and each one's Holm level."""
    p = [p_of(t) for t in tests]
    gate = primary_p if math.isfinite(primary_p) else 1.0
    return np.maximum(holm(p), gate), holm_levels(p, alpha)


def judge(primary: ClaimTest, secondaries: Sequence[ClaimTest] = (), alpha: float = ALPHA) -> list[Judged]:
    """The hierarchy of one chapter (module docstring): the ``primary`` claim first, then the
    ``secondaries`` in their order, each :class:`Judged` in both scopes."""
    family = 1 + len(secondaries)
    out = [Judged(primary, "primary", primary.p_value, alpha, True, family, primary.verdict(alpha=alpha),
                  primary.p_organisms, primary.verdict_organisms(alpha=alpha))]
    if not secondaries:
        return out
    recipe, levels = _secondaries(primary.p_value, secondaries, lambda t: t.p_value, alpha)
    organisms, _ = _secondaries(primary.p_organisms, secondaries, lambda t: t.p_organisms, alpha)
    opened = out[0].verdict in (REPRODUCED, REVERSED)  # a primary the gate blocks opens nothing
    opened_organisms = out[0].verdict_organisms in (REPRODUCED, REVERSED)
    for t, p, level, po in zip(secondaries, recipe, levels, organisms, strict=True):
        po = float(po) if math.isfinite(t.p_organisms) else math.nan
        closed = NOT_MEASURED if not t.measured else UNRESOLVED
        words = (t.verdict(float(p), alpha) if opened else closed,
                 t.verdict_organisms(po, alpha) if opened_organisms else closed)
        out.append(Judged(t, "secondary", float(p), float(level), opened, family, words[0], po, words[1]))
    return out


def judge_control(test: ClaimTest, alpha: float = ALPHA) -> Judged:
    """The null control judged alone at α (module docstring)."""
    return Judged(test, "control", test.p_value, alpha, True, 1, test.verdict(alpha=alpha), test.p_organisms,
                  test.verdict_organisms(alpha=alpha))
