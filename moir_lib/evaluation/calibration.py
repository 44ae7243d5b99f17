"""Simulations that measure the claim tests of :mod:`moir_lib.evaluation.inference`: coverage, the rate of
false verdicts and power, at the book's own measured noise (:mod:`moir_lib.evaluation.components`), in one
generated place for the tests (which assert on them) and the methods page (which shows them).

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

**The book's noise** (:func:`world`): the organism, edit-sample and C-draw effects are chosen so that
each gives ``S_p`` the standard deviation of the book's measured component (:func:`book_components`, the
repository's components file), at ½, 1 and 2 × those standard deviations (:data:`FACTORS`); the items'
parts come from the item model. :func:`provisional_components` derives components from two figures of a
book whose items were not kept.

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
from moir_lib.evaluation.components import Components
from moir_lib.evaluation.components import estimate as estimate_components
from moir_lib.evaluation.components import load as load_components
from moir_lib.evaluation.inference import INTERVAL_METHOD, assess, compare
from moir_lib.evaluation.intervals import ALPHA, REPRODUCED, REVERSED
from moir_lib.evaluation.power import MINIMAL_EFFECT, Design

__all__ = ["BOOK", "FACTORS", "POWER_DESIGNS", "BeyondReach", "Scenario", "beyond_reach", "book_components",
           "calibration_table", "coverage", "coverage_scenarios", "item_parts", "provisional_components",
           "simulate", "verdict_rate", "world"]

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


#: The book's sample sizes: 50 items per task, 5 tasks, 3 organisms, 1 edit sample and 1 C draw each
#: (:func:`~moir_lib.experiments.labs.cov_draws`; its noise: :func:`world`); the editing chapters'
#: parameter defaults are tested to declare this design.
BOOK = Scenario(organisms=3, samples=1, draws=1)
#: The same as a design (organisms × edit samples × C draws × items per task).
BOOK_DESIGN = Design(BOOK.organisms, BOOK.samples, BOOK.draws, BOOK.items)


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


def _outcomes(sc: Scenario, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One repetition's 0/1 outcomes of arms ``a`` and ``b``, ``(K, S, D, T, n)`` (module docstring)."""
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
    return (u < special.expit(logit_b + cell_a[..., None, None]),
            u < special.expit(logit_b + cell_b[..., None, None]))


def simulate(sc: Scenario, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One repetition: the per-item frames of arms ``a`` and ``b`` (``S_p``'s ``correct`` items)."""
    correct_a, correct_b = _outcomes(sc, rng)
    k, s, d, t, n = correct_a.shape
    o, sm, dr, task, item = (x.ravel() for x in np.indices((k, s, d, t, n)))
    labels = np.array([f"task{j}" for j in range(t)])
    base = pd.DataFrame({"organism": o, "sample": sm, "draw": dr, "group": "preservation",
                         "unit": labels[task], "metric": "correct",
                         "item": np.char.add(np.char.add(labels[task], "/"), item.astype(str))})
    return tuple(base.assign(value=c.ravel().astype(float)) for c in (correct_a, correct_b))


def _organism_mean_variance(sc: Scenario, organisms: int = 40, reps: int = 30, seed: int = 0) -> float:
    """The variance between organism means of the per-cell ``ΔS_p`` that ``sc`` realizes (its design with
    ``organisms`` organisms; their spread excludes what every cell shares), averaged over ``reps`` draws of
    the items (seeded: the same numbers for every scale of the effects)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        a, b = _outcomes(replace(sc, organisms=organisms, organism_effects=None), rng)
        with np.errstate(divide="ignore"):  # a task at 0: the harmonic mean's limit, 0
            cells = _hm(a.mean(axis=-1)) - _hm(b.mean(axis=-1))  # (K, S, D)
        out.append(np.var(cells.mean(axis=(1, 2)), ddof=1))
    return float(np.mean(out))


def coverage(sc: Scenario, reps: int = 200, *, seed: int = 0, n_resamples: int = 1000,
             methods: Sequence[str] = ("studentized", "bca", "percentile"), shrink: float = 0.5
             ) -> pd.DataFrame:
    """Coverage of the true ``ΔS_p`` (the planted effect: the recipe's expected difference, over
    organisms, samples, draws and items) by each interval ``method`` over ``reps`` repetitions, and by the
    chosen method's interval with its half-widths scaled by ``shrink`` (a deliberately too narrow
    interval, which a sound check must reject). Columns: ``interval, coverage, mean_width, reps``."""
    if len(set(sc.effects)) > 1:
        raise ValueError("coverage is defined here for organisms drawn around one planted effect: give "
                         "organism_sd, not organism_effects")
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
                 direction: int = 1, alpha: float = ALPHA) -> dict[str, float]:
    """Shares of ``reps`` repetitions whose ``ΔS_p`` claim (``direction``) is called reproduced and
    reversed when tested at ``alpha`` (a chapter's primary claim: :mod:`moir_lib.evaluation.families`)."""
    rng = np.random.default_rng(seed)
    words = []
    for r in range(reps):
        a, b = simulate(sc, rng)
        words.append(compare(Term(a, b, "S_p"), direction=direction, seed=seed + r,
                             n_resamples=n_resamples).verdict(alpha=alpha))
    return {REPRODUCED: words.count(REPRODUCED) / reps, REVERSED: words.count(REVERSED) / reps}


# ----------------------------------------------------------------------------- the book's own noise


_NESTED = 16  # Gauss-Hermite nodes per random effect of the nested quadrature (:func:`_realized`)


def _realized(logit_sds: tuple[float, float, float], shift: float, tasks: int, accuracy: tuple[float, float],
              item_sd: float) -> np.ndarray:
    """The variances of ``S_p`` that nested logit effects ``(organism, sample, draw)`` of these standard
    deviations give around ``shift``: ``Var_u E_{v,w}``, ``E_u Var_v E_w`` and ``E_{u,v} Var_w`` (the
    components :mod:`moir_lib.evaluation.components` estimates), by quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(_NESTED)
    weights = weights / weights.sum()
    mu = _task_means(tasks, accuracy, item_sd)
    su, sv, sw = logit_sds
    x = shift + su * nodes[:, None, None] + sv * nodes[None, :, None] + sw * nodes[None, None, :]
    sp = _hm(_accuracy(mu + x[..., None], item_sd))  # (u, v, w)

    def var(values: np.ndarray, axis: int) -> np.ndarray:
        mean = np.tensordot(values, weights, axes=([axis], [0]))
        return np.tensordot(values ** 2, weights, axes=([axis], [0])) - mean ** 2

    over_w = np.tensordot(sp, weights, axes=([2], [0]))  # (u, v)
    over_vw = over_w @ weights  # (u,)
    organism = float(weights @ over_vw ** 2 - (weights @ over_vw) ** 2)
    sample = float(weights @ var(over_w, 1))
    draw = float(weights @ (var(sp, 2) @ weights))
    return np.maximum(np.array([organism, sample, draw]), 0.0)


class BeyondReach(ValueError):
    """Components the item model cannot realize (:func:`_logit_sds`): the table names the scenario, unrun."""


def _logit_sds(targets: tuple[float, float, float], shift: float, tasks: int, accuracy: tuple[float, float],
               item_sd: float) -> tuple[float, float, float]:
    """The logit standard deviations whose nested effects give ``S_p`` the target variances
    ``(organism, sample, draw)`` (:func:`_realized`): each scaled by the square root of its target over
    what it realizes, until all agree (the effects combine nonlinearly, so they are solved together)."""
    want = np.asarray(targets, dtype=float)
    sds = np.where(want > 0, 1.0, 0.0)
    for _ in range(200):
        got = _realized(tuple(sds), shift, tasks, accuracy, item_sd)
        if np.all(np.abs(got - want) <= 1e-3 * want.sum() + 1e-12):
            return tuple(float(x) for x in sds)
        ratio = np.where(got > 0, np.sqrt(np.where(want > 0, want, 0) / np.maximum(got, 1e-300)), 1.0)
        sds = np.clip(sds * ratio ** 0.7, 0.0, 8.0)
    raise BeyondReach(f"S_p component variances {targets} are beyond the simulated world's reach: an S_p in "
                      "[0, 1] on one arm cannot spread that much (logit effects capped at 8)")


@lru_cache(maxsize=64)
def world(components: Components, *, factor: float = 1.0, effect: float = MINIMAL_EFFECT,
          design: Design | None = None, exchangeable: bool = False, tasks: int = 5) -> Scenario:
    """The simulated comparison at the variance ``components`` of a per-cell ``ΔS_p`` (their standard
    deviations times ``factor``): ``design``'s organisms, edit samples, C draws and items per task (by
    default the book's, :data:`BOOK_DESIGN`), the organism, edit-sample and C-draw effects on arm a's
    logit solved together so that the nested effects give ``S_p`` each component's variance at the
    planted ``effect`` (:func:`_logit_sds`); ``exchangeable``: both arms draw effects of their own (each
    half the difference's variance), nothing planted. The items' parts come from the item model itself
    (:func:`simulate`); a components' part that was not told apart (None) is held in the level above.
    The nested quadrature reads the population's accuracies; the harmonic mean of 50 items' accuracies
    responds a little less, so one scale on every effect, found by simulation, brings the spread of the
    organism means to the components' (:func:`_organism_mean_variance`). Cached: it is deterministic."""
    design = design or BOOK_DESIGN
    base = Scenario(organisms=design.organisms, samples=design.samples, draws=design.draws, tasks=tasks,
                    items=design.items, effect=0.0 if exchangeable else effect, exchangeable=exchangeable)
    t = components.truncated()
    split = 2.0 if exchangeable else 1.0
    targets = tuple(factor ** 2 * v / split for v in (t.organism, t.sample or 0.0, t.draw))
    shift = 0.0 if exchangeable else _shift(base.effect, tasks, base.accuracy, base.item_sd, 0.0)
    for _ in range(3):  # the shift that plants the effect depends on the effects' spread, and back
        su, sv, sw = _logit_sds(targets, shift, tasks, base.accuracy, base.item_sd)
        if exchangeable:
            break
        spread = math.sqrt(su ** 2 + sv ** 2 + sw ** 2)
        shift = _shift(base.effect, tasks, base.accuracy, base.item_sd, spread)
    sc = replace(base, organism_sd=su, sample_sd=sv, draw_sd=sw)
    # the harmonic mean of 50 items' accuracies per task responds a little less than the population's:
    # one scale on every effect brings the organism means' spread (less the items' own) to the target
    want = (targets[0] + targets[1] / design.samples + targets[2] / design.draws) * split
    if want <= 0:
        return sc
    items = _organism_mean_variance(replace(sc, organism_sd=0.0, sample_sd=0.0, draw_sd=0.0))

    def gap(scale: float) -> float:
        scaled = replace(sc, organism_sd=su * scale, sample_sd=sv * scale, draw_sd=sw * scale)
        return _organism_mean_variance(scaled) - items - want

    lo, hi = 0.5, 2.0
    if gap(lo) > 0 or gap(hi) < 0:
        return sc
    scale = optimize.brentq(gap, lo, hi, xtol=1e-3)
    return replace(sc, organism_sd=su * scale, sample_sd=sv * scale, draw_sd=sw * scale)


def book_components(kind: str = "S_p") -> Components:
    """The book's measured components of ``kind`` (the repository's components file,
    :data:`~moir_lib.evaluation.components.COMPONENTS_FILE`)."""
    types, _ = load_components()
    if kind not in types:
        raise ValueError(f"the components file holds no {kind!r} claims (it has {sorted(types)}): measure "
                         "them with `moir components RUN_DIR`")
    return types[kind]


def item_parts(sc: Scenario, reps: int = 40, *, seed: int = 0, n_resamples: int = 400
               ) -> tuple[float, float]:
    """The items' parts ``(shared, cell)`` of the simulated world ``sc`` (its random effects set to 0): the
    mean of :func:`~moir_lib.evaluation.components.estimate` over ``reps`` repetitions."""
    quiet = replace(sc, organism_sd=0.0, sample_sd=0.0, draw_sd=0.0)
    rng = np.random.default_rng(seed)
    parts = [estimate_components(resample(Term(*simulate(quiet, rng), "S_p"), seed=seed + r,
                                          n_resamples=n_resamples)) for r in range(reps)]
    return float(np.mean([p.shared for p in parts])), float(np.mean([p.cell for p in parts]))

#: The design of the book whose two figures :func:`provisional_components` reads by default.
PROVISIONAL_DESIGN = Design(3, 1, 2, 50)


def provisional_components(null_sd: float = 0.095, organism_mean_sd: float = 0.10, *,
                           design: Design = PROVISIONAL_DESIGN) -> Components:
    """Components of ``ΔS_p`` derived from two figures of a book whose items were not kept: ``null_sd``,
    the standard deviation of the null control's organism means (two sets of ``D`` draws of one C, paired
    draw by draw), and ``organism_mean_sd``, that of the claims' organism means.

    A null control's per-cell difference holds two draws of one C and the cell's item noise and nothing
    else: variance ``2 w₁ + b``, ``w₁`` one C's draw variance; a comparison of two C's holds one draw of
    each, ``w = 2 w₁`` too (their draw variances taken alike). Its organism means average ``D`` cells, so
    ``w + b = D · null_sd²``; the claims' organism means add the organisms' own part,
    ``u = organism_mean_sd² − null_sd²``. The items' parts come from the simulated item model at
    ``design``'s sizes (:func:`item_parts`; by default :data:`PROVISIONAL_DESIGN`, 2 draws of each C):
    ``b`` there, ``w`` the rest."""
    shared, cell = item_parts(Scenario(organisms=design.organisms, samples=design.samples,
                                       draws=design.draws, items=design.items, effect=MINIMAL_EFFECT))
    within = design.draws * null_sd ** 2
    return Components(max(0.0, organism_mean_sd ** 2 - null_sd ** 2), None, max(0.0, within - cell), shared,
                      min(cell, within), design.items, 0)


def _components_or_default(components: Components | None) -> Components:
    return book_components() if components is None else components


#: The scale factors on the book's standard deviations the simulations run at.
FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0)
#: The designs whose power the table simulates: the book's, and the designs of equal or nearby compute.
POWER_DESIGNS: tuple[Design, ...] = (BOOK_DESIGN, Design(3, 1, 2, 50), Design(6, 1, 1, 50))


def _scenarios(c: Components) -> dict[str, Scenario | None]:
    """Every coverage scenario, None where the item model cannot realize it (:class:`BeyondReach`)."""
    out: dict[str, Scenario | None] = {}
    for f in FACTORS:
        name = f"book components × {f:g}, ΔS_p = +{MINIMAL_EFFECT:g}"
        try:
            out[name] = world(c, factor=f)
        except BeyondReach:
            out[name] = None
    out["book components, ΔS_p = 0"] = world(c, effect=0.0)
    out[f"no organism, sample or draw effect (the items dominate), ΔS_p = +{MINIMAL_EFFECT:g}"] = \
        replace(BOOK, effect=MINIMAL_EFFECT, sample_sd=0.0)
    return out


def coverage_scenarios(components: Components | None = None) -> dict[str, Scenario]:
    """The coverage scenarios of :func:`calibration_table`: the book's design at its components (and at ½
    and 2 × their standard deviations) with ``ΔS_p`` the minimal effect, at ``ΔS_p = 0``, and with no
    random effect at all (the items' noise dominating); less those :func:`beyond_reach`."""
    return {k: v for k, v in _scenarios(_components_or_default(components)).items() if v is not None}


def beyond_reach(components: Components | None = None) -> list[str]:
    """The coverage scenarios the item model cannot realize at these components (:class:`BeyondReach`)."""
    return [k for k, v in _scenarios(_components_or_default(components)).items() if v is None]


def calibration_table(reps: int = 200, *, seed: int = 0, n_resamples: int = 1000,
                      components: Components | None = None) -> pd.DataFrame:
    """What the claim tests achieve at the book's design (3 organisms × 1 edit sample × 1 C draw × 50
    items per task) and its measured components (:func:`book_components`; at ½ and 2 × their standard
    deviations): coverage of the 95 % intervals in each of :func:`coverage_scenarios` (each method, and a
    half-width interval that must fail), the rate of false verdicts when both arms are drawn from one
    distribution (:attr:`Scenario.exchangeable`), and the power of a primary claim (at α) against the
    minimal effect ``ΔS_p = 0.15`` in :data:`POWER_DESIGNS`, beside the noncentral t's prediction
    (:meth:`~moir_lib.evaluation.components.Components.power`). Columns: ``check, scenario, interval, target,
    measured, reps``."""
    c = _components_or_default(components)
    rows = []
    scenarios = _scenarios(c)
    for i, (name, sc) in enumerate((k, v) for k, v in scenarios.items() if v is not None):
        cov = coverage(sc, reps, seed=seed + 10 * i, n_resamples=n_resamples)
        rows += [{"check": "coverage of the true ΔS_p", "scenario": name, "interval": r.interval,
                  "target": "0.95 ± 0.03" if "×" not in r.interval else "must miss 0.95 ± 0.03",
                  "measured": r.coverage, "reps": reps} for r in cov.itertuples()]
    rows += [{"check": "coverage of the true ΔS_p", "scenario": name, "interval": "—",
              "target": "not simulated: beyond the item model's reach", "measured": float("nan"), "reps": 0}
             for name, sc in scenarios.items() if sc is None]
    for i, f in enumerate(FACTORS):
        null = verdict_rate(world(c, factor=f, exchangeable=True), reps, seed=seed + 1 + i,
                            n_resamples=n_resamples)
        rows.append({"check": "false verdicts", "scenario": f"book components × {f:g}, both arms from one "
                     "distribution", "interval": INTERVAL_METHOD, "target": "≤ 0.05 ± 0.02",
                     "measured": null[REPRODUCED] + null[REVERSED], "reps": reps})
    for i, design in enumerate(POWER_DESIGNS):
        power = verdict_rate(world(c, design=design), reps, seed=seed + 5 + i, n_resamples=n_resamples)
        predicted = c.power(design, MINIMAL_EFFECT, ALPHA)
        rows.append({"check": "power of a primary claim",
                     "scenario": f"{design.text()} (organisms × samples × draws × items), ΔS_p = "
                                 f"+{MINIMAL_EFFECT:g}", "interval": INTERVAL_METHOD,
                     "target": f"noncentral t: {predicted:.2f}", "measured": power[REPRODUCED], "reps": reps})
    return pd.DataFrame(rows)
