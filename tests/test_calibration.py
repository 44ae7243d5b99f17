"""What the claim tests achieve on simulated comparisons (:mod:`moir_lib.evaluation.calibration`): the 95 %
intervals cover the true difference 95 % ± 3 % of the time (and a half-width interval does not), two arms
of one distribution are rarely called different, and the effect the book reports is found at the book's
sample sizes. The methods page shows the same table, from the same functions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moir_lib.evaluation import calibration as cal
from moir_lib.evaluation.inference import INTERVAL_METHOD
from moir_lib.evaluation.intervals import REPRODUCED, REVERSED

#: Repetitions of each simulation (the Monte-Carlo error of a 95 % coverage is about 1.5 %).
REPS = 200


@pytest.mark.parametrize("i", range(len(cal.COVERAGE_SCENARIOS)), ids=["book", "samples", "items"])
def test_intervals_cover_the_true_difference(i):
    """Items shared across 3 edit samples × 2 C draws, a random per-sample effect on the difference, sparse
    disagreement (both arms read one uniform number per item and cell); at ΔS_p = +0.13, and in the
    regimes where the samples' effect or the items' noise dominates (the seeds of the methods page)."""
    sc = list(cal.COVERAGE_SCENARIOS.values())[i]
    table = cal.coverage(sc, REPS, seed=10 * i, methods=(INTERVAL_METHOD,)).set_index("interval")
    assert table.loc[INTERVAL_METHOD, "coverage"] == pytest.approx(0.95, abs=0.03)
    # the check can fail: the same intervals at half their width miss it
    assert abs(table.loc[f"{INTERVAL_METHOD} × 0.5", "coverage"] - 0.95) > 0.03


def test_two_arms_of_one_distribution_are_rarely_called_different():
    rates = cal.verdict_rate(replace(cal.BOOK, exchangeable=True), REPS, seed=1)
    assert rates[REPRODUCED] + rates[REVERSED] <= 0.05 + 0.02


def test_the_book_effect_is_found_at_the_book_sizes():
    """ΔS_p = +0.13 (the smaller of the C_Moir − C_Wiki gains the book reports), 50 items per task,
    5 tasks, 3 organisms of 1 edit sample each, 2 C draws."""
    book = cal.BOOK
    assert (book.items, book.tasks, book.organisms, book.samples, book.draws) == (50, 5, 3, 1, 2)
    rates = cal.verdict_rate(replace(cal.BOOK, effect=0.13), REPS, seed=2)
    assert rates[REPRODUCED] >= 0.80


def test_organisms_that_disagree_need_more_of_them():
    """With a spread of the effect between organisms (logit sd 0.5) three organisms no longer find it
    (t with 2 df on their means) and eight do: the power table of the methods page says which K a claim
    needs."""
    spread = replace(cal.BOOK, effect=0.13, organism_sd=0.5)
    three = cal.verdict_rate(spread, 100, seed=4, n_resamples=500)[REPRODUCED]
    eight = cal.verdict_rate(replace(spread, organisms=8), 100, seed=4, n_resamples=500)[REPRODUCED]
    assert three < 0.80 <= eight


def test_the_planted_effect_is_the_expected_difference():
    """The simulated ΔS_p averages to the planted effect (the truth the coverage is measured against)."""
    import numpy as np

    from moir_lib.evaluation.bootstrap import Term, resample

    rng = np.random.default_rng(3)
    sc = replace(cal.BOOK, effect=0.13, items=400, samples=4)
    values = [resample(Term(*cal.simulate(sc, rng), "S_p"), n_resamples=2).value for _ in range(30)]
    assert np.mean(values) == pytest.approx(0.13, abs=0.01)


def test_calibration_table_lists_every_check():
    table = cal.calibration_table(reps=6, n_resamples=200)
    assert list(table.columns) == ["check", "scenario", "interval", "target", "measured", "reps"]
    # per scenario: three methods and the half-width one
    assert (table["check"] == "coverage of the true ΔS_p").sum() == 4 * len(cal.COVERAGE_SCENARIOS)
    assert {"false verdicts", "power", "power, organisms that disagree"} <= set(table["check"])
    assert (table["check"] == "power, organisms that disagree").sum() == \
        len(cal.POWER_ORGANISMS) * (len(cal.POWER_SPREADS) - 1)
    assert table["measured"].between(0, 1).all()
