"""The test of a claim (:mod:`moir_lib.evaluation.inference` on :mod:`moir_lib.evaluation.bootstrap`): exact
tests for 0/1 rates, the floors, the margin, Holm within a family, the gate, organisms, what would resolve
a claim, and the resampler's shared item multiplicities."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from moir_lib.evaluation import calibration as cal
from moir_lib.evaluation.bootstrap import FRAME_COLUMNS, Term, resample
from moir_lib.evaluation.inference import (
    NONINFERIORITY_MARGIN,
    compare,
    holm,
    judge,
    mcnemar_p,
    newcombe_paired,
    sign_flip_p,
)
from moir_lib.evaluation.intervals import REPRODUCED, REVERSED, UNRESOLVED, wilson

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


def test_noninferiority_uses_the_margin():
    """A loss of 0.02 measured tightly is within the margin (reproduced: 'does not cost edit quality'),
    a loss of 0.10 is beyond it (reversed); as a superiority claim the first is reversed."""
    rng = np.random.default_rng(3)
    base = np.broadcast_to(rng.normal(0.6, 0.2, 400), (3, 2, 400))

    def arms(loss: float) -> Term:
        a = base - loss + rng.normal(0, 0.01, (3, 2, 400))
        return Term(_frame(a, group="edit", unit="record", metric="Efficacy"),
                    _frame(base.copy(), group="edit", unit="record", metric="Efficacy"), "Efficacy")

    small = compare(arms(0.02), margin=NONINFERIORITY_MARGIN)
    assert small.null == pytest.approx(-NONINFERIORITY_MARGIN) and small.verdict() == REPRODUCED
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
    (judged,) = judge([compare(big, direction=-1, gate_ok=False)])
    assert judged.verdict == UNRESOLVED and "gate" in judged.sentence()


def test_holm_adjusts_within_the_family_and_decides_the_words():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, np.nan]) == pytest.approx([0.4, 1.0])
    marginal = compare(Term(*_table(20, 9, 1, 20), "facts"))  # McNemar p ≈ 0.021
    assert marginal.p_value < 0.05 and marginal.verdict() == REPRODUCED
    none = compare(Term(*_table(20, 0, 0, 30), "facts"))
    family = judge([marginal, none, none])
    assert family[0].p_holm == pytest.approx(3 * marginal.p_value)
    assert family[0].verdict == UNRESOLVED
    assert family[0].test.estimate.lo > 0  # the interval shown stays the marginal one
    assert "Holm p" in family[0].sentence() and "over 3 claims" in family[0].sentence()
    strong = compare(Term(*_table(20, 30, 0, 0), "facts"))  # step-down: the smaller p pays for the family
    assert [j.verdict for j in judge([marginal, strong])] == [REPRODUCED, REPRODUCED]
    record = json.loads(json.dumps(family[0].record(), allow_nan=False))
    assert record["verdict"] == UNRESOLVED and record["p_holm"] == pytest.approx(3 * marginal.p_value)
    assert record["family"] == 3 and record["lo"] > 0 and record["n_to_resolve"] is not None


# ----------------------------------------------------------------------------- organisms


def _organisms(effects: tuple[float, ...], seed: int) -> Term:
    a, b = cal.simulate(replace(ONE_MODEL, organism_effects=effects), np.random.default_rng(seed))
    return Term(a, b, "S_p")


def test_an_effect_in_every_organism_is_reproduced():
    test = compare(_organisms((0.12, 0.15, 0.18), seed=4))
    assert test.scope == "organisms" and len(test.organisms) == 3
    assert test.verdict() == REPRODUCED
    assert test.agreeing == 3 and all(o.side == 1 for o in test.organisms)
    orgs = np.array([o.estimate.value for o in test.organisms])
    assert test.estimate.value == pytest.approx(orgs.mean())
    # with K = 3 organisms the floor is the t-interval on their means with 2 df (t = 4.30)
    assert test.estimate.hi - test.estimate.lo >= 2 * 4.30 * orgs.std(ddof=1) / math.sqrt(3) - 1e-9
    assert "organisms" in test.parts


def test_an_effect_whose_sign_depends_on_the_organism_is_not_resolved():
    """Each organism resolves its own (opposite) sign; over three organisms the claim does not resolve."""
    test = compare(_organisms((0.15, 0.15, -0.15), seed=5))
    assert [o.side for o in test.organisms] == [1, 1, -1]
    assert test.verdict() == UNRESOLVED
    assert test.agreeing == 2
    (judged,) = judge([test])
    assert "2 of 3 organisms agree in sign and are resolved on their own" in judged.sentence()
    assert test.resolution() is not None and test.resolution().unit_name == "organisms"


def test_one_organism_and_one_cell_say_what_the_verdict_is_about():
    a, b = cal.simulate(replace(ONE_MODEL, effect=0.2), np.random.default_rng(6))
    assert compare(Term(a, b, "S_p")).scope == "model"
    one = [f[(f["sample"] == 0) & (f["draw"] == 0)] for f in (a, b)]
    test = compare(Term(*one, "S_p"))
    assert test.scope == "sample" and "about this one sample" in judge([test])[0].sentence()


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
    """Many items, but the edit samples disagree about the sign: say how many more samples would help."""
    rng = np.random.default_rng(8)
    base = np.broadcast_to(rng.normal(0, 1, 2000), (3, 1, 2000))
    shift = np.array([0.3, -0.1, 0.1])[:, None, None]
    a = base + shift + rng.normal(0, 0.01, (3, 1, 2000))
    test = compare(Term(_frame(a, group="nll", unit="code", metric="nll"),
                        _frame(base.copy(), group="nll", unit="code", metric="nll"), "nll:code"))
    assert test.verdict() == UNRESOLVED
    res = test.resolution()
    assert res.items is None and res.units is not None and res.units > 0 and res.unit_name == "samples"
    assert res.text().startswith("more items cannot help")


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
    assert np.all(same.replicates == 0) and compare(Term(a, a, "S_p")).verdict() == UNRESOLVED


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
    from moir_lib.evaluation.inference import Resolution

    one = Resolution(100, units=1, unit_name="organisms")
    three = Resolution(100, units=3, unit_name="samples")
    assert (one.more(), three.more(), Resolution(100, items=900).more()) == ("1 organism", "3 samples", None)
    assert one.text().endswith("about 1 organism more would")
