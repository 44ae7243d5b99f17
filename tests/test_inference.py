"""The test of a claim (:mod:`moir_lib.evaluation.inference` on :mod:`moir_lib.evaluation.bootstrap`): exact
tests for 0/1 rates, the floors, the relative margin, the hierarchy of a chapter
(:mod:`moir_lib.evaluation.families`), the gate, organisms and the two scopes, what is not measured, the
range of an interval, what would resolve a claim (:mod:`moir_lib.evaluation.power`), and the resampler's
shared item multiplicities."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from moir_lib.chapters.verdicts import Claim
from moir_lib.evaluation import calibration as cal
from moir_lib.evaluation import power
from moir_lib.evaluation.bootstrap import FRAME_COLUMNS, Term, resample
from moir_lib.evaluation.families import holm, holm_levels, judge
from moir_lib.evaluation.inference import (
    NONINFERIORITY_MARGIN,
    compare,
    mcnemar_p,
    newcombe_paired,
    sign_flip_p,
)
from moir_lib.evaluation.intervals import NOT_MEASURED, REPRODUCED, REVERSED, UNRESOLVED, t_p_value, wilson

#: one organism with three edit samples of two C draws each (organisms, where a test plants them, get the
#: same cells each)
ONE_MODEL = replace(cal.BOOK, organisms=1, samples=3)


def _frame(values: np.ndarray, *, unit: str = "facts", group: str = "preservation", metric: str = "correct",
           organism: int = 0) -> pd.DataFrame:
    """A per-item frame from ``values`` ``(samples, draws, items)``."""
    s, d, n = values.shape
    ss, dd, ii = (x.ravel() for x in np.indices((s, d, n)))
    return pd.DataFrame({"organism": organism, "sample": ss, "draw": dd, "group": group, "unit": unit,
                         "item": [f"{unit}/{i}" for i in ii], "metric": metric, "value": values.ravel()},
                        columns=list(FRAME_COLUMNS))


def _table(n11: int, n10: int, n01: int, n00: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One cell of paired 0/1 outcomes with the given 2 × 2 counts (a right and b right, a only, …)."""
    a = np.r_[np.ones(n11 + n10), np.zeros(n01 + n00)]
    b = np.r_[np.ones(n11), np.zeros(n10), np.ones(n01), np.zeros(n00)]
    return _frame(a[None, None]), _frame(b[None, None])


# ----------------------------------------------------------------------------- 0/1 rates


def test_four_discordant_items_all_one_way_are_not_a_finding():
    """4 of 50 items flip, all in the claimed direction: McNemar's exact p = 2 · 0.5⁴ = 0.125."""
    a, b = _table(20, 4, 0, 26)
    test = compare(Term(a, b, "facts"))
    assert test.method == "newcombe" and test.scope == "sample"
    assert test.p_value == pytest.approx(0.125)
    assert test.estimate.value == pytest.approx(4 / 50)
    assert test.verdict() == UNRESOLVED != REPRODUCED
    strong = compare(Term(*_table(20, 12, 0, 18), "facts"))
    assert strong.p_value == pytest.approx(2 * 0.5 ** 12) and strong.verdict() == REPRODUCED
    assert compare(Term(*_table(20, 0, 12, 18), "facts")).verdict() == REVERSED


def test_sign_flip_is_exact_and_is_mcnemar_with_one_cell():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 4, 9)
    sums = np.array([rng.integers(-c, c + 1) for c in counts])
    m = sums / counts
    flips = np.array(list(itertools.product((-1, 1), repeat=len(m))))
    brute = np.mean(np.abs(flips @ np.abs(m)) >= abs(m.sum()) - 1e-12)
    assert sign_flip_p(sums, counts) == pytest.approx(brute)
    assert sign_flip_p(sums, counts, max_grid=1) == pytest.approx(brute, abs=0.01)  # random flips
    for n10, n01 in [(4, 0), (7, 2), (3, 3), (0, 0)]:
        sums = np.r_[np.ones(n10), -np.ones(n01), np.zeros(5)].astype(int)
        assert sign_flip_p(sums, np.ones_like(sums)) == pytest.approx(mcnemar_p(n10, n01))


def test_newcombe_interval_is_the_square_and_add_of_wilson_when_pairs_are_uncorrelated():
    """With ``n11·n00 − n10·n01`` between 0 and n/2 the correlation term is 0 (method 10): the interval is
    ``d ∓ √(…)`` of the two Wilson intervals; swapping the arms mirrors it."""
    n11, n10, n01, n00 = 10, 10, 5, 6  # 60 − 50 = 10 ≤ n/2
    n = n11 + n10 + n01 + n00
    pa, pb = (n11 + n10) / n, (n11 + n01) / n
    (la, ua), (lb, ub) = wilson(n11 + n10, n), wilson(n11 + n01, n)
    lo, hi = newcombe_paired(n11, n10, n01, n00)
    assert lo == pytest.approx(pa - pb - math.hypot(pa - la, ub - pb))
    assert hi == pytest.approx(pa - pb + math.hypot(pb - lb, ua - pa))
    assert newcombe_paired(n11, n01, n10, n00) == pytest.approx((-hi, -lo))
    lo, hi = newcombe_paired(40, 6, 1, 3)  # positively correlated pairs: narrower than square-and-add
    (la, ua), (lb, ub) = wilson(46, 50), wilson(41, 50)
    assert hi - lo < math.hypot(0.92 - la, ub - 0.82) + math.hypot(0.82 - lb, ua - 0.92)


def test_the_same_few_items_flipping_in_every_cell_are_not_a_finding():
    """Four items right under a and wrong under b in all 6 cells: the cells agree perfectly, so the interval
    alone could look resolved, but the item-level sign-flip test has p = 2/16 = 0.125."""
    rng = np.random.default_rng(1)
    b = (rng.random((3, 2, 50)) < 0.5).astype(float)
    b[..., :4] = 0.0
    a = b.copy()
    a[..., :4] = 1.0
    test = compare(Term(_frame(a), _frame(b), "facts"))
    assert test.parts["sign-flip"] == pytest.approx(0.125)
    assert test.p_value == max(test.parts.values()) >= 0.125
    assert test.verdict() == UNRESOLVED and test.scope == "model"


# ----------------------------------------------------------------------------- floors, margin, gate, families


def test_interval_is_never_narrower_than_the_cell_t_interval():
    """Items identical in every cell but each cell shifted: the items carry no difference's noise, the
    cells do; the interval is at least the t-interval on the 6 per-cell differences (5 df)."""
    rng = np.random.default_rng(2)
    base = np.broadcast_to(rng.normal(3, 1, 40), (3, 2, 40))
    shift = rng.normal(0.05, 0.04, (3, 2, 1))
    test = compare(Term(_frame(base + shift, group="nll", unit="code", metric="nll"),
                        _frame(base.copy(), group="nll", unit="code", metric="nll"), "nll:code"))
    cells = shift.ravel()
    half = stats.t.ppf(0.975, 5) * cells.std(ddof=1) / math.sqrt(6)
    assert test.estimate.value == pytest.approx(cells.mean())
    assert test.estimate.hi - test.estimate.lo >= 2 * half - 1e-12
    assert "cells" in test.parts


def test_noninferiority_is_relative_to_the_reference_arm():
    """"Does not cost edit quality": a keeps at least 1 − δ of b's score, ``a − (1 − δ) b > 0``. A loss of
    0.02 of 0.6 (3 %) measured tightly is within δ = 10 % (reproduced), a loss of 0.10 (17 %) beyond it
    (reversed); as a superiority claim the first is reversed."""
    rng = np.random.default_rng(3)
    base = np.broadcast_to(rng.normal(0.6, 0.2, 400), (3, 2, 400))

    def arms(loss: float) -> Term:
        a = base - loss + rng.normal(0, 0.01, (3, 2, 400))
        return Term(_frame(a, group="edit", unit="record", metric="Efficacy"),
                    _frame(base.copy(), group="edit", unit="record", metric="Efficacy"), "Efficacy")

    assert NONINFERIORITY_MARGIN == 0.10
    small = compare(arms(0.02), margin=NONINFERIORITY_MARGIN)
    assert small.null == 0 and small.verdict() == REPRODUCED
    assert small.estimate.value == pytest.approx(base.mean() - 0.02 - 0.9 * base.mean(), abs=0.005)
    assert compare(arms(0.02)).verdict() == REVERSED
    assert compare(arms(0.10), margin=NONINFERIORITY_MARGIN).verdict() == REVERSED
    with pytest.raises(ValueError, match="margin"):
        compare(arms(0.0), margin=-0.1)


def test_a_failed_gate_blocks_both_words():
    big = Term(*_table(10, 30, 0, 10), "facts")
    assert compare(big).verdict() == REPRODUCED
    assert compare(big, gate_ok=False).verdict() == UNRESOLVED
    assert compare(big, direction=-1).verdict() == REVERSED
    assert compare(big, direction=-1, gate_ok=False).verdict() == UNRESOLVED
    claim = Claim("c", "m", compare(big, direction=-1, gate_ok=False))
    assert claim.verdict == UNRESOLVED and "gate" in claim.sentence()


def test_the_primary_claim_gates_its_secondaries_and_holm_orders_them():
    """Serial gatekeeping: the primary at α alone; the secondaries only when it resolves, Holm among them,
    each adjusted p ``max(p_primary, p_Holm)``; the level each is held to is its Holm step's."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, np.nan]) == pytest.approx([0.4, 1.0])
    assert holm_levels([0.01, 0.04, 0.03]) == pytest.approx([0.05 / 3, 0.05, 0.025])
    marginal = compare(Term(*_table(20, 9, 1, 20), "facts"))  # McNemar p ≈ 0.021
    strong = compare(Term(*_table(20, 30, 0, 0), "facts"))
    none = compare(Term(*_table(20, 0, 0, 30), "facts"))
    assert marginal.p_value < 0.05 and marginal.verdict() == REPRODUCED
    family = judge(strong, [marginal, none])
    assert [j.role for j in family] == ["primary", "secondary", "secondary"]
    assert family[0].p_adjusted == strong.p_value and family[0].verdict == REPRODUCED
    assert family[1].p_adjusted == pytest.approx(max(strong.p_value, 2 * marginal.p_value))
    assert family[1].verdict == REPRODUCED and family[1].level == pytest.approx(0.025)
    assert family[1].test.estimate.lo > 0  # the interval shown stays the marginal one
    # a primary that does not resolve closes the gate: the secondaries are not tested, whatever their p
    closed = judge(none, [strong, marginal])
    assert closed[0].verdict == UNRESOLVED and not closed[1].tested and not closed[2].tested
    assert all(j.verdict == UNRESOLVED and j.p_adjusted >= none.p_value for j in closed[1:])
    assert strong.verdict() == REPRODUCED, "alone, it resolves"
    assert "not tested: the primary did not resolve" in closed[1].place()
    with_one = judge(marginal, [strong])  # step-down: the primary's p is the floor of the secondaries'
    assert [j.verdict for j in with_one] == [REPRODUCED, REPRODUCED]


def test_a_zero_standard_error_is_no_p_value():
    """Before: ``t_p_value`` returned 0 for ``se = 0``, so a difference that is the same 0.1 on every item
    of every cell (nothing varies, nothing to judge it by) read "reproduced" at p = 0."""
    assert math.isnan(t_p_value(0.1, 0.0, 5)) and math.isnan(t_p_value(0.0, 0.0, 5))
    base = np.broadcast_to(np.random.default_rng(12).normal(3, 1, 40), (3, 2, 40))
    shifted = compare(Term(_frame(base + 0.1, group="nll", unit="code", metric="nll"),
                           _frame(base.copy(), group="nll", unit="code", metric="nll"), "nll:code"))
    assert shifted.estimate.value == pytest.approx(0.1)
    assert not shifted.measured and "no variation" in shifted.note
    assert shifted.verdict() == NOT_MEASURED and math.isnan(shifted.p_value)


def _edit_arms(a_scores: dict[str, float], b_scores: dict[str, float], organisms: int = 3,
               seed: int = 13) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-record edit items of two arms in 3 organisms × 1 sample × 2 draws: each constituent's records
    right with its arm's probability (Fluency* from fluency / fluency_base)."""
    rng = np.random.default_rng(seed)
    frames = []
    for scores in (a_scores, b_scores):
        parts = []
        for o in range(organisms):
            for m, p in scores.items():
                parts.append(_frame((rng.random((1, 2, 100)) < p).astype(float), group="edit", unit="record",
                                    metric=m, organism=o))
            for m, v in (("fluency", -2.0), ("fluency_base", -2.0)):
                parts.append(_frame(np.full((1, 2, 100), v) + rng.normal(0, 0.05, (1, 2, 100)), group="edit",
                                    unit="record", metric=m, organism=o))
        frames.append(pd.concat(parts, ignore_index=True))
    return frames[0], frames[1]


def test_a_harmonic_mean_floored_at_0_in_both_arms_is_not_measured():
    """Portability 0 under both C's makes both S_e 0 in every cell: before, a margin claim read 0 [0, 0],
    p = 0, "reproduced", though arm a is 0.3 worse on three constituents."""
    good = {"Efficacy": 0.9, "Generalization": 0.8, "Specificity": 0.7, "Portability": 0.0}
    worse = {"Efficacy": 0.6, "Generalization": 0.5, "Specificity": 0.4, "Portability": 0.0}
    a, b = _edit_arms(worse, good)
    test = compare(Term(a, b, "S_e"), margin=NONINFERIORITY_MARGIN)
    assert not test.measured and "0 under both arms" in test.note
    assert test.verdict() == NOT_MEASURED and math.isnan(test.estimate.value)
    assert "not measured" in Claim("c", "S_e", test).sentence()
    # without Portability the same records are measured, and the loss is seen
    assert compare(Term(a, b, "S_e_noport"), margin=NONINFERIORITY_MARGIN).verdict() == REVERSED
    # one organism degenerate (its Portability 0 in both), the others not: left out and counted
    part = {**good, "Portability": 0.5}
    a2, b2 = _edit_arms(part, part, seed=14)
    zero = [f["organism"].eq(0) & f["metric"].eq("Portability") for f in (a2, b2)]
    a2.loc[zero[0], "value"], b2.loc[zero[1], "value"] = 0.0, 0.0
    some = compare(Term(a2, b2, "S_e"))
    assert some.measured and (some.degenerate, some.cells) == (2, 6) and len(some.organisms) == 2


def test_an_interval_stays_in_the_range_of_its_statistic():
    """A difference of two accuracies lies in [−1, 1] and an S_p in [0, 1]; before, three organisms' wide t
    floor gave an upper limit of 1.3 for a difference of accuracies."""
    rng = np.random.default_rng(15)
    parts = {"a": [], "b": []}
    for o, p in enumerate((0.95, 0.6, 0.99)):
        parts["a"].append(_frame((rng.random((1, 2, 60)) < p).astype(float), organism=o))
        parts["b"].append(_frame((rng.random((1, 2, 60)) < 0.05).astype(float), organism=o))
    a, b = (pd.concat(v, ignore_index=True) for v in parts.values())
    test = compare(Term(a, b, "facts"))
    orgs = np.array([o.estimate.value for o in test.organisms])
    unclipped = orgs.mean() + 4.30 * orgs.std(ddof=1) / math.sqrt(3)
    assert unclipped > 1 and test.estimate.hi == 1.0 and test.estimate.lo > -1
    single = compare(Term(a, None, "facts"))
    assert 0 <= single.estimate.lo and single.estimate.hi <= 1


# ----------------------------------------------------------------------------- organisms


def _organisms(effects: tuple[float, ...], seed: int) -> Term:
    a, b = cal.simulate(replace(ONE_MODEL, organism_effects=effects), np.random.default_rng(seed))
    return Term(a, b, "S_p")


def test_an_effect_in_every_organism_is_reproduced():
    test = compare(_organisms((0.12, 0.15, 0.18), seed=4))
    assert test.scope == "recipe" and len(test.organisms) == 3
    assert test.verdict() == REPRODUCED
    assert test.agreeing == 3 and all(o.side == 1 for o in test.organisms)
    orgs = np.array([o.estimate.value for o in test.organisms])
    assert test.estimate.value == pytest.approx(orgs.mean())
    # with K = 3 organisms the floor is the t-interval on their means with 2 df (t = 4.30)
    assert test.estimate.hi - test.estimate.lo >= 2 * 4.30 * orgs.std(ddof=1) / math.sqrt(3) - 1e-9
    assert "organisms" in test.parts


def test_an_effect_whose_sign_depends_on_the_organism_is_not_resolved():
    """Each organism resolves its own (opposite) sign; over three organisms the claim does not resolve,
    about the recipe or about these organisms (the intersection-union test needs one side for all)."""
    test = compare(_organisms((0.15, 0.15, -0.15), seed=5))
    assert [o.side for o in test.organisms] == [1, 1, -1]
    assert test.verdict() == UNRESOLVED
    assert test.agreeing == 2 and test.p_organisms == 1.0 and test.verdict_organisms() == UNRESOLVED
    assert "2 of 3 agree in sign and resolve on their own" in Claim("c", "m", test).sentence()
    assert test.resolution() is not None and test.resolution().unit_name == "organisms"


def test_about_these_organisms_every_one_must_resolve():
    """The intersection-union p-value is the largest of the organisms' own when they share a side."""
    test = compare(_organisms((0.15, 0.17, 0.2), seed=16))
    ps = [o.p_value for o in test.organisms]
    assert test.p_organisms == pytest.approx(max(ps))
    every = max(ps) < 0.05 and all(o.side == 1 for o in test.organisms)
    assert test.verdict_organisms() == (REPRODUCED if every else UNRESOLVED)
    (primary,) = judge(test)
    assert primary.p_organisms == test.p_organisms and primary.verdict_organisms == test.verdict_organisms()


def test_one_organism_and_one_cell_say_what_the_verdict_is_about():
    a, b = cal.simulate(replace(ONE_MODEL, effect=0.2), np.random.default_rng(6))
    assert compare(Term(a, b, "S_p")).scope == "model"
    one = [f[(f["sample"] == 0) & (f["draw"] == 0)] for f in (a, b)]
    test = compare(Term(*one, "S_p"))
    assert test.scope == "sample" and "about this one sample" in Claim("c", "m", test).sentence()


# ----------------------------------------------------------------------------- what would resolve it


def test_items_to_resolve_count_unique_items_at_80_percent_power():
    """No variation between cells: the interval is the items' alone, and the items that would resolve a
    difference of this size at 80 % power are n · ((z_.975 + z_.8) · se_items / Δ)²."""
    rng = np.random.default_rng(7)
    base = np.broadcast_to(rng.normal(0, 1, 30), (3, 2, 30))
    diff = np.broadcast_to(rng.normal(0.05, 0.4, 30), (3, 2, 30))
    term = Term(_frame(base + diff, group="nll", unit="code", metric="nll"),
                _frame(base.copy(), group="nll", unit="code", metric="nll"), "nll:code")
    test = compare(term)
    assert test.verdict() == UNRESOLVED
    se = math.sqrt(np.var(resample(term).item_replicates, ddof=1))
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert test.resolution().items == math.ceil(30 * (z * se / test.estimate.value) ** 2)
    assert test.resolution().items > 30 and "unique items" in test.resolution().text()


def test_more_items_cannot_help_when_the_samples_disagree():
    """Many items, but the edit samples disagree about the sign: say how many cells (samples × draws) in
    all would help, from the noncentral t."""
    rng = np.random.default_rng(8)
    base = np.broadcast_to(rng.normal(0, 1, 2000), (3, 1, 2000))
    shift = np.array([0.3, -0.1, 0.1])[:, None, None]
    a = base + shift + rng.normal(0, 0.01, (3, 1, 2000))
    test = compare(Term(_frame(a, group="nll", unit="code", metric="nll"),
                        _frame(base.copy(), group="nll", unit="code", metric="nll"), "nll:code"))
    assert test.verdict() == UNRESOLVED
    res = test.resolution()
    assert res.items is None and res.units is not None and res.units > 3
    assert res.unit_name.startswith("cells") and res.text().startswith("more items cannot help")
    v = test.variance
    assert res.units == power.units_to_resolve(test.estimate.value, v.unit_sd, v.shared, 0.05)


def test_the_power_of_the_t_on_unit_means_is_the_noncentral_t():
    """Against a simulation of the t-test itself (20 000 studies), and the organisms that resolve a claim at
    a lower level (its Holm step) are more."""
    rng = np.random.default_rng(17)
    for delta, sd, k in ((0.15, 0.1, 3), (0.15, 0.1, 6), (0.1, 0.2, 8)):
        x = rng.normal(delta, sd, (20_000, k))
        t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(k))
        simulated = float(np.mean(np.abs(t) > stats.t.ppf(0.975, k - 1)))
        assert power.t_power(delta, sd, k, 0.05) == pytest.approx(simulated, abs=0.01)
    assert power.units_to_resolve(0.15, 0.1, 0.0, 0.05 / 8) > power.units_to_resolve(0.15, 0.1, 0.0, 0.05)
    # the normal approximation with a clamp said "1 organism more" for a K = 3 claim at t = 3.5; the
    # noncentral t at that difference needs more
    sd = 0.15 * math.sqrt(3) / 3.5
    assert power.units_to_resolve(0.15, sd, 0.0, 0.05) >= 5


# ----------------------------------------------------------------------------- the resampler


def test_one_multiplicity_per_item_everywhere_it_appears():
    """The same term twice at half weight is the term once (the item multiplicities are shared by the two
    terms, replicate by replicate); an arm against itself has no spread at all."""
    a, b = cal.simulate(replace(ONE_MODEL, effect=0.1), np.random.default_rng(9))
    once = resample(Term(a, b, "S_p"), seed=3, n_resamples=300)
    twice = resample([Term(a, b, "S_p", 0.5), Term(a, b, "S_p", 0.5)], seed=3, n_resamples=300)
    assert twice.value == pytest.approx(once.value)
    assert twice.replicates == pytest.approx(once.replicates)
    same = resample(Term(a, a, "S_p"), n_resamples=300)
    assert np.all(same.replicates == 0) and compare(Term(a, a, "S_p")).verdict() == NOT_MEASURED


def test_items_only_one_arm_scored_are_left_out_of_the_pair():
    a, b = _frame(np.ones((1, 1, 30))), _frame(np.zeros((1, 1, 30)))
    extra = _frame(np.ones((1, 1, 5))).assign(item=[f"extra/{i}" for i in range(5)])
    test = compare(Term(pd.concat([a, extra.assign(value=0.0)]), b, "facts"))
    assert test.estimate.value == pytest.approx(1.0) and test.estimate.n == 30


def test_single_arm_estimate_is_the_composite():
    a, _ = cal.simulate(ONE_MODEL, np.random.default_rng(10))
    test = compare(Term(a, None, "S_p"))
    acc = a.groupby(["sample", "draw", "unit"])["value"].mean().unstack()  # per cell, per task
    assert test.estimate.value == pytest.approx((acc.shape[1] / (1 / acc).sum(axis=1)).mean())
    assert test.estimate.lo < test.estimate.value < test.estimate.hi


def test_missing_cell_columns_say_what_to_add():
    items = _frame(np.ones((1, 1, 5))).drop(columns=["organism", "sample", "draw"])
    with pytest.raises(ValueError, match="with_cell"):
        compare(Term(items, None, "facts"))
    with pytest.raises(ValueError, match="S_p"):
        compare(Term(_frame(np.ones((1, 1, 5))), None, "nonexistent"))


def test_a_claim_at_typical_sizes_computes_quickly():
    """3 organisms × 3 samples × 2 draws × 400 records, S_e, 2000 replicates (the measured time is printed;
    the bound leaves room for a loaded machine)."""
    rng = np.random.default_rng(11)

    def arm(shift: float) -> pd.DataFrame:
        parts = []
        for o in range(3):
            for m, p in (("Efficacy", 0.8), ("Generalization", 0.6), ("Specificity", 0.5)):
                parts.append(_frame((rng.random((3, 2, 400)) < p + shift).astype(float), group="edit",
                                    unit="record", metric=m, organism=o))
            for m in ("fluency", "fluency_base"):
                parts.append(_frame(rng.normal(-2, 0.1, (3, 2, 400)), group="edit", unit="record", metric=m,
                                    organism=o))
        return pd.concat(parts, ignore_index=True)

    a, b = arm(0.05), arm(0.0)
    compare(Term(a, b, "S_e"), n_resamples=50)
    start = time.perf_counter()
    test = compare(Term(a, b, "S_e"))
    took = time.perf_counter() - start
    print(f"S_e claim, 3 × 3 × 2 cells × 400 records, 2000 replicates: {took:.2f} s")
    assert math.isfinite(test.estimate.value) and took < 5.0


def test_what_would_resolve_a_claim_counts_its_units_in_words():
    from moir_lib.evaluation.power import Resolution

    one = Resolution(100, units=4, n_units=3, unit_name="organisms")
    three = Resolution(100, units=6, n_units=3, unit_name="samples")
    assert (one.more(), three.more(), Resolution(100, items=900).more()) == (
        "1 organism more (4 in all)", "3 samples more (6 in all)", None)
    assert "4 organisms in all instead of 3" in one.text() and "noncentral t" in one.text()


def test_a_primary_blocked_by_the_editability_gate_opens_no_secondary():
    strong = compare(Term(*_table(20, 30, 0, 0), "facts"))
    blocked = compare(Term(*_table(20, 30, 0, 0), "facts"), gate_ok=False)
    family = judge(blocked, [strong])
    assert blocked.p_value < 0.05 and family[0].verdict == UNRESOLVED
    assert not family[1].tested and family[1].verdict == UNRESOLVED
