"""The power of a claim's test, and the sample that would resolve a claim: from the noncentral t.

A claim about the recipe is decided by the t-test on its ``U`` unit means (the organisms; with one
organism its cells: :mod:`moir_lib.evaluation.inference`'s floor, ``U − 1`` degrees of freedom) together
with the studentized interval, whose variance adds what every unit shares (the items scored in every
cell). Against a true difference ``Δ``, with the units' standard deviation ``σ_U`` and the shared
variance ``A``:

* the t on the unit means rejects at level ``α`` with probability ``P(|T| > t_{1−α/2, U−1})``, ``T``
  noncentral t with ``U − 1`` df and noncentrality ``Δ √U / σ_U`` (:func:`t_power`); when ``A > 0`` the
  numerator also carries ``A``, which widens the statistic by ``r = √(1 + A U / σ_U²)`` against the
  denominator: the critical value is read at ``t / r`` with noncentrality ``Δ / √(σ_U²/U + A)``;
* the studentized interval rejects with probability about ``Φ(Δ / se − z_{1−α/2})``, ``se² = σ_U²/U + A``;
* a claim resolves when both do: :func:`claim_power` is the smaller of the two (they move together).

:func:`units_to_resolve` is the smallest ``U`` with :data:`POWER` at the level the claim is tested at (its
place in its chapter's hierarchy: :mod:`moir_lib.evaluation.families`), :func:`items_to_resolve` the unique
items that would do it when the units do not vary; :class:`Resolution` says which, in words.
:meth:`Components.power <moir_lib.evaluation.components.Components.power>` is the power of a design
(organisms × edit samples × C draws × items per task) from variance components
(:mod:`moir_lib.evaluation.components`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from moir_lib.evaluation.intervals import ALPHA

__all__ = ["MAX_UNITS", "MINIMAL_EFFECT", "POWER", "Design", "Resolution", "claim_power", "items_to_resolve",
           "t_power", "units_to_resolve"]

#: Power at which a study is sized.
POWER = 0.8
#: The most units :func:`units_to_resolve` considers (beyond it: "more than …").
MAX_UNITS = 200
#: The smallest preservation gain the editing chapters' designs must find, stated before any data:
#: ``ΔS_p = 0.15``, about the gains of the paper's Table 1 (+.10 HumanEval, +.13 GSM8K for the oracle).
MINIMAL_EFFECT = 0.15


def t_power(delta: float, sd: float, units: int, level: float = ALPHA, inflation: float = 1.0) -> float:
    """Two-sided power of the t-test on ``units`` unit means of standard deviation ``sd`` (``units − 1``
    df) against a true difference ``delta``, at ``level``: the noncentral t. ``inflation``: the ratio
    ``r ≥ 1`` of the numerator's standard error to the one the t estimates (module docstring)."""
    if units < 2 or not (sd > 0 and math.isfinite(sd) and math.isfinite(delta)):
        return math.nan
    df = units - 1
    crit = float(stats.t.ppf(1 - level / 2, df)) / inflation
    ncp = abs(delta) * math.sqrt(units) / (sd * inflation)
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))


def claim_power(delta: float, unit_sd: float, units: int, shared: float = 0.0, level: float = ALPHA) -> float:
    """Power of a claim's test (module docstring): the smaller of the t on the ``units`` unit means (their
    standard deviation ``unit_sd``) and the studentized interval's test, whose variance adds the
    ``shared`` variance of what every unit shares."""
    shared = max(0.0, shared)
    if units < 2 or not unit_sd > 0:
        return math.nan
    inflation = math.sqrt(1 + shared * units / unit_sd ** 2)
    floor = t_power(delta, unit_sd, units, level, inflation)
    se = math.sqrt(unit_sd ** 2 / units + shared)
    studentized = float(stats.norm.cdf(abs(delta) / se - stats.norm.ppf(1 - level / 2)))
    return min(floor, studentized)


def units_to_resolve(delta: float, unit_sd: float, shared: float = 0.0, level: float = ALPHA,
                     power: float = POWER) -> int | None:
    """The smallest number of units (≥ 2) at which :func:`claim_power` reaches ``power``; None when more
    units alone cannot (the ``shared`` part keeps it below) or it takes more than :data:`MAX_UNITS`."""
    if not (unit_sd > 0 and math.isfinite(delta) and delta != 0):
        return None
    z = stats.norm.ppf(1 - level / 2) + stats.norm.ppf(power)
    if delta ** 2 <= z ** 2 * max(0.0, shared):
        return None
    for u in range(2, MAX_UNITS + 1):
        if claim_power(delta, unit_sd, u, shared, level) >= power:
            return u
    return None


def items_to_resolve(delta: float, n_items: int, v_items: float, v_between: float = 0.0,
                     level: float = ALPHA, power: float = POWER) -> int | None:
    """Unique items at which a difference ``delta`` would resolve at ``level`` with ``power`` when only
    the items' variance ``v_items`` (at ``n_items``) shrinks: ``n · z² V_items / (Δ² − z² V_between)``,
    ``z = z_{1−level/2} + z_power`` (the items' part has many degrees of freedom); None when the
    between-unit variance alone keeps it unresolved."""
    z2 = (stats.norm.ppf(1 - level / 2) + stats.norm.ppf(power)) ** 2
    if not (math.isfinite(delta) and delta != 0) or z2 * v_between >= delta ** 2:
        return None
    return math.ceil(n_items * z2 * v_items / (delta ** 2 - z2 * v_between))


@dataclass(frozen=True)
class Resolution:
    """What would resolve an unresolved claim at its level with 80 % power: ``items`` (unique items in all,
    ``n_items`` today), else ``units`` ``unit_name`` in all (``n_units`` today: organisms, or edit samples
    with one organism); neither when both would have to grow. ``level``: the level it is tested at."""

    n_items: int
    level: float = ALPHA
    items: int | None = None
    units: int | None = None
    n_units: int = 0
    unit_name: str = "samples"

    def text(self) -> str:
        at = f" at its level {self.level:.3g}"
        if self.items is not None:
            return (f"about {self.items} unique items instead of {self.n_items} would resolve a difference "
                    f"of this size{at} with {POWER:.0%} power")
        if self.units is not None:
            return (f"more items cannot help (the variation between {self.unit_name} keeps the interval over "
                    f"the null); {self.units} {self.unit_name} in all instead of {self.n_units} would "
                    f"resolve a difference of this size{at} with {POWER:.0%} power (noncentral t)")
        return (f"neither more items nor more {self.unit_name} alone would resolve it{at}; both would have "
                "to grow")

    def more(self) -> str | None:
        """``3 organisms more``: how many more units would resolve it (None: not units)."""
        if self.units is None:
            return None
        k = self.units - self.n_units
        name = self.unit_name.removesuffix("s") if k == 1 else self.unit_name
        return f"{k} {name} more ({self.units} in all)"


@dataclass(frozen=True)
class Design:
    """A design of the editing chapters' claims: ``organisms`` × ``samples`` (edit samples each) × ``draws``
    (of each C) × ``items`` per preservation task."""

    organisms: int
    samples: int = 1
    draws: int = 2
    items: int = 50

    @property
    def cells(self) -> int:
        """Scored cells per compared setting: what a chapter's claims cost, in points."""
        return self.organisms * self.samples * self.draws

    def text(self) -> str:
        return f"{self.organisms} × {self.samples} × {self.draws} × {self.items}"
