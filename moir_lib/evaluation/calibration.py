"""Simulations that measure the claim tests of :mod:`moir_lib.evaluation.inference`: coverage, the rate of
false verdicts and power, in one generated place for the tests (which assert on them) and the methods
page (which shows them).

**The simulated world** (:class:`Scenario`, :func:`simulate`): two arms (two C's) scored on the same
preservation items (``tasks × items``) in every cell (organism × edit sample × C draw). Item ``i`` of
task ``t`` has a difficulty ``θ_i ~ N(0, item_sd²)`` on the logit scale; within a cell both arms read one
uniform number per item (the same edit, the same item: most items are right or wrong under both arms,
the disagreement is sparse); arm ``b`` answers right when it is below ``σ(μ_t + θ_i)``, arm ``a`` when
it is below ``σ(μ_t + θ_i + Δ + u_o + v_os + w_od)``, with random organism, sample and draw effects. The
items are the same ids in every cell, so they are shared across samples and draws. ``Δ`` is solved so
that the expected ``ΔS_p`` (over items and the random effects, by quadrature) equals the planted
``effect``: the true difference that the intervals must cover. With ``exchangeable`` arms, arm ``b``
draws random effects of its own and nothing is planted: both arms come from one distribution.

:func:`coverage`, :func:`verdict_rate` and :func:`calibration_table` run repetitions of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import optimize, special

from moir_lib.evaluation.bootstrap import Term, resample
from moir_lib.evaluation.inference import INTERVAL_METHOD, assess, compare
from moir_lib.evaluation.intervals import REPRODUCED, REVERSED

__all__ = ["BOOK", "COVERAGE_SCENARIOS", "POWER_ORGANISMS", "POWER_SPREADS", "Scenario", "calibration_table",
           "coverage", "simulate", "verdict_rate"]

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(64)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()  # expectations over a standard normal


@dataclass(frozen=True)
class Scenario:
    """A simulated comparison (module docstring). ``effect``: the planted expected ``ΔS_p`` of arm a over
    arm b; ``organism_effects``: one planted ``ΔS_p`` per organism instead (their count is the number of
    organisms); ``accuracy``: the range of arm b's task accuracies; the ``*_sd``: random effects on the
    logit of arm a (item difficulty: ``item_sd``); ``exchangeable``: arm b draws random effects of its own
    too and nothing is planted, so that both arms come from one distribution."""

    organisms: int = 1
    samples: int = 3
    draws: int = 2
    tasks: int = 5
    items: int = 50
    effect: float = 0.0
    organism_effects: tuple[float, ...] | None = None
    accuracy: tuple[float, float] = (0.45, 0.75)
    item_sd: float = 2.0
    sample_sd: float = 0.2
    draw_sd: float = 0.0
    organism_sd: float = 0.0
    exchangeable: bool = False

    @property
    def effects(self) -> tuple[float, ...]:
        return self.organism_effects or (self.effect,) * self.organisms


#: The book's sample sizes: 50 items per task, 5 tasks, 3 organisms, 1 edit sample each, 2 C draws.
BOOK = Scenario(organisms=3, samples=1)
#: The organisms and the spreads of the effect between them (logit sd) of the power table: how many
#: organisms a claim of the book's size needs when the organisms disagree more than their samples do.
POWER_ORGANISMS: tuple[int, ...] = (3, 5, 8)
POWER_SPREADS: tuple[float, ...] = (0.0, 0.25, 0.5)


def _accuracy(mu: np.ndarray, sd: float) -> np.ndarray:
    """``E σ(μ + θ)`` over ``θ ~ N(0, sd²)`` (the item population's accuracy), elementwise in ``mu``."""
    return special.expit(np.asarray(mu)[..., None] + sd * _NODES) @ _WEIGHTS


@lru_cache(maxsize=64)
def _task_means(tasks: int, accuracy: tuple[float, float], item_sd: float) -> np.ndarray:
    targets = np.linspace(*accuracy, tasks)
    return np.array([optimize.brentq(lambda m, p=p: float(_accuracy(m, item_sd)) - p, -20, 20)
                     for p in targets])


def _hm(x: np.ndarray) -> np.ndarray:
    return x.shape[-1] / (1 / x).sum(axis=-1)


@lru_cache(maxsize=256)
def _shift(effect: float, tasks: int, accuracy: tuple[float, float], item_sd: float, spread: float) -> float:
    """The logit shift ``Δ`` of arm a whose expected ``ΔS_p`` is ``effect`` when the shift varies by
    ``N(0, spread²)`` between cells."""
    mu = _task_means(tasks, accuracy, item_sd)
    base = float(_hm(_accuracy(mu, item_sd)))

    def gap(delta: float) -> float:
        acc = _accuracy(mu[None, :] + delta + spread * _NODES[:, None], item_sd)  # (nodes, tasks)
        return float(_hm(acc) @ _WEIGHTS) - base - effect

    return optimize.brentq(gap, -15, 15)


def simulate(sc: Scenario, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One repetition: the per-item frames of arms ``a`` and ``b`` (``S_p``'s ``correct`` items)."""
    effects = sc.effects
    k, s, d, t, n = len(effects), sc.samples, sc.draws, sc.tasks, sc.items
    if sc.exchangeable and any(effects):
        raise ValueError("an exchangeable scenario plants no effect: set effect = 0")
    spread = math.sqrt(sc.sample_sd ** 2 + sc.draw_sd ** 2 + sc.organism_sd ** 2)
    shifts = np.array([0.0 if sc.exchangeable else _shift(e, t, sc.accuracy, sc.item_sd, spread)
                       for e in effects])
    mu = _task_means(t, sc.accuracy, sc.item_sd)
    logit_b = mu[:, None] + rng.normal(0, sc.item_sd, (t, n))  # (T, n)

    def effect() -> np.ndarray:  # (K, S, D) random effects of one arm
        return (rng.normal(0, sc.organism_sd, (k, 1, 1)) + rng.normal(0, sc.sample_sd, (k, s, 1))
                + rng.normal(0, sc.draw_sd, (k, 1, d)))

    cell_a = shifts[:, None, None] + effect()
    cell_b = effect() if sc.exchangeable else np.zeros_like(cell_a)
    u = rng.random((k, s, d, t, n))
    correct_b = u < special.expit(logit_b + cell_b[..., None, None])
    correct_a = u < special.expit(logit_b + cell_a[..., None, None])
    o, sm, dr, task, item = (x.ravel() for x in np.indices((k, s, d, t, n)))
    labels = np.array([f"task{j}" for j in range(t)])
    base = pd.DataFrame({"organism": o, "sample": sm, "draw": dr, "group": "preservation",
                         "unit": labels[task], "metric": "correct",
                         "item": np.char.add(np.char.add(labels[task], "/"), item.astype(str))})
    return tuple(base.assign(value=c.ravel().astype(float)) for c in (correct_a, correct_b))


def coverage(sc: Scenario, reps: int = 200, *, seed: int = 0, n_resamples: int = 1000,
             methods: Sequence[str] = ("studentized", "bca", "percentile"), shrink: float = 0.5
             ) -> pd.DataFrame:
    """Coverage of the true ``ΔS_p`` (the planted effect) by each interval ``method`` over ``reps``
    repetitions, and by the chosen method's interval with its half-widths scaled by ``shrink`` (a
    deliberately too narrow interval, which a sound check must reject). Columns: ``interval, coverage,
    mean_width, reps``."""
    if sc.organism_sd or len(set(sc.effects)) > 1:
        raise ValueError("coverage is defined here for organisms sharing one effect (organism_sd = 0)")
    rng = np.random.default_rng(seed)
    hits: dict[str, list[tuple[bool, float]]] = {m: [] for m in (*methods, f"{INTERVAL_METHOD} × {shrink}")}
    for r in range(reps):
        a, b = simulate(sc, rng)
        res = resample(Term(a, b, "S_p"), seed=seed + r, n_resamples=n_resamples, jackknife="bca" in methods)
        for m in methods:
            e = assess(res, method=m).estimate
            hits[m].append((e.lo <= sc.effect <= e.hi, e.hi - e.lo))
        e = assess(res, method=INTERVAL_METHOD).estimate
        lo, hi = e.value - shrink * (e.value - e.lo), e.value + shrink * (e.hi - e.value)
        hits[f"{INTERVAL_METHOD} × {shrink}"].append((lo <= sc.effect <= hi, hi - lo))
    return pd.DataFrame([{"interval": m, "coverage": float(np.mean([h for h, _ in v])),
                          "mean_width": float(np.mean([w for _, w in v])), "reps": reps}
                         for m, v in hits.items()])


def verdict_rate(sc: Scenario, reps: int = 200, *, seed: int = 0, n_resamples: int = 1000,
                 direction: int = 1) -> dict[str, float]:
    """Shares of ``reps`` repetitions whose ``ΔS_p`` claim (``direction``, a family of one) is called
    reproduced and reversed."""
    rng = np.random.default_rng(seed)
    words = []
    for r in range(reps):
        a, b = simulate(sc, rng)
        words.append(compare(Term(a, b, "S_p"), direction=direction, seed=seed + r,
                             n_resamples=n_resamples).verdict())
    return {REPRODUCED: words.count(REPRODUCED) / reps, REVERSED: words.count(REVERSED) / reps}


#: The coverage scenarios of :func:`calibration_table`: the book's, and the two regimes that decide between
#: the intervals (the samples' effect dominating, the items' noise dominating).
COVERAGE_SCENARIOS: dict[str, Scenario] = {
    "book sizes, ΔS_p = +0.13": replace(BOOK, effect=0.13),
    "book sizes, ΔS_p = 0 (the cells' effect dominates)": BOOK,
    "book sizes, ΔS_p = +0.13, no cell effect (the items dominate)":
        replace(BOOK, effect=0.13, sample_sd=0.0),
}


def calibration_table(reps: int = 200, *, seed: int = 0, n_resamples: int = 1000) -> pd.DataFrame:
    """What the claim tests achieve at the book's sample sizes (:data:`BOOK`): coverage of the 95 %
    intervals in each of :data:`COVERAGE_SCENARIOS` (each method, and a half-width interval that must
    fail), the rate of false verdicts when both arms are drawn from one distribution
    (:attr:`Scenario.exchangeable`), and the power for ``ΔS_p = +0.13`` (the smaller effect the book
    reports for C_Moir − C_Wiki). Columns: ``check, scenario, interval, target, measured, reps``."""
    rows = []
    for i, (name, sc) in enumerate(COVERAGE_SCENARIOS.items()):
        cov = coverage(sc, reps, seed=seed + 10 * i, n_resamples=n_resamples)
        rows += [{"check": "coverage of the true ΔS_p", "scenario": name, "interval": r.interval,
                  "target": "0.95 ± 0.03" if "×" not in r.interval else "must miss 0.95 ± 0.03",
                  "measured": r.coverage, "reps": reps} for r in cov.itertuples()]
    null = verdict_rate(replace(BOOK, exchangeable=True), reps, seed=seed + 1, n_resamples=n_resamples)
    rows.append({"check": "false verdicts", "scenario": "book sizes, both arms from one distribution",
                 "interval": INTERVAL_METHOD, "target": "≤ 0.05 ± 0.02",
                 "measured": null[REPRODUCED] + null[REVERSED], "reps": reps})
    power = verdict_rate(replace(BOOK, effect=0.13), reps, seed=seed + 2, n_resamples=n_resamples)
    rows.append({"check": "power", "scenario": "book sizes, ΔS_p = +0.13", "interval": INTERVAL_METHOD,
                 "target": "≥ 0.80", "measured": power[REPRODUCED], "reps": reps})
    for i, (k, spread) in enumerate((k, s) for s in POWER_SPREADS[1:] for k in POWER_ORGANISMS):
        sc = replace(BOOK, effect=0.13, organisms=k, organism_sd=spread)
        power = verdict_rate(sc, reps, seed=seed + 3 + i, n_resamples=n_resamples)
        rows.append({"check": "power, organisms that disagree",
                     "scenario": f"{k} organisms, ΔS_p = +0.13, organism effect sd {spread:g} (logit)",
                     "interval": INTERVAL_METHOD, "target": "≥ 0.80", "measured": power[REPRODUCED],
                     "reps": reps})
    return pd.DataFrame(rows)
