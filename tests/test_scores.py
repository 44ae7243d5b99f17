"""Harmonic means of appendix C.3: S_e (eq. (se)) and S_p (eq. (sp)), with their edge cases."""

from __future__ import annotations

import json
import logging
import math
import pickle

import pytest

from moir_lib.evaluation.scores import (
    EDIT_METRICS,
    PAPER_PRESERVATION_TASKS,
    Score,
    edit_score,
    harmonic_mean,
    preservation_score,
)

FULL = {"Efficacy": 0.8, "Generalization": 0.5, "Specificity": 0.4, "Fluency*": 0.95, "Portability": 0.25}


def test_harmonic_mean_by_hand() -> None:
    assert harmonic_mean([1.0, 1.0]) == 1.0
    assert harmonic_mean([0.5]) == 0.5
    assert harmonic_mean([1.0, 0.5]) == pytest.approx(2 / (1 + 2))  # 2 / (1/1 + 1/0.5)
    assert harmonic_mean([0.2, 0.4, 0.8]) == pytest.approx(3 / (5 + 2.5 + 1.25))
    assert harmonic_mean({"a": 0.25, "b": 0.75}) == pytest.approx(2 / (4 + 4 / 3))
    # below the arithmetic mean, and dominated by the low outlier
    assert harmonic_mean([0.9, 0.9, 0.1]) < sum([0.9, 0.9, 0.1]) / 3
    assert harmonic_mean([2.0, 2.0]) == 2.0  # values above 1 are allowed (Fluency* can exceed 1)


def test_harmonic_mean_is_zero_when_any_value_is_zero() -> None:
    assert harmonic_mean([0.9, 0.0, 0.7]) == 0.0
    assert harmonic_mean({"x": 0.0}) == 0.0


@pytest.mark.parametrize("bad, match", [
    ([0.5, -0.1], "negative"),
    ([0.5, float("nan")], "NaN"),
    ([0.5, float("inf")], "infinite"),
    ([0.5, "high"], "expected a number"),
    ([0.5, True], "boolean"),
    ([], "no values"),
])
def test_harmonic_mean_refuses_bad_values(bad: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        harmonic_mean(bad)


def test_harmonic_mean_names_the_bad_entry() -> None:
    with pytest.raises(ValueError, match=r"value 'Fluency\*' = -2.1 is negative.*Fluency\*"):
        harmonic_mean({"Efficacy": 0.5, "Fluency*": -2.1})


def test_none_is_skipped_only_when_allowed_and_said(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="skip_none=True"):
        harmonic_mean([0.5, None])
    with caplog.at_level(logging.INFO, logger="moir_lib.evaluation.scores"):
        assert harmonic_mean({"a": 0.5, "b": None, "c": 0.25}, skip_none=True) == pytest.approx(2 / (2 + 4))
    assert "skipped unavailable b" in caplog.text
    with pytest.raises(ValueError, match="all unavailable"):
        harmonic_mean([None, None], skip_none=True)


def test_edit_score_is_eq_se() -> None:
    score = edit_score(FULL)
    expected = 5 / sum(1 / FULL[k] for k in EDIT_METRICS)
    assert isinstance(score, Score) and isinstance(score, float)
    assert score == pytest.approx(expected)
    assert score.name == "S_e" and score.complete and score.missing == ()
    assert score.components == FULL
    # extra keys (counts, raw fluency, ES...) are ignored; names are case-insensitive
    noisy = {k.lower(): v for k, v in FULL.items()} | {"fluency": -3.2, "ES": 1.0, "n_records": 7}
    assert edit_score(noisy) == pytest.approx(expected)
    assert edit_score({**{k: v for k, v in FULL.items() if k != "Fluency*"},
                       "fluency_star": 0.95}) == pytest.approx(expected)


def test_edit_score_without_portability_is_flagged() -> None:
    metrics = {**FULL, "Portability": None}
    score = edit_score(metrics)
    assert score == pytest.approx(4 / sum(1 / FULL[k] for k in EDIT_METRICS[:4]))
    assert not score.complete and score.missing == ("Portability",)
    assert "Portability" not in score.components
    absent = {k: v for k, v in FULL.items() if k != "Portability"}
    assert edit_score(absent).missing == ("Portability",)


def test_edit_score_refuses_other_missing_constituents() -> None:
    with pytest.raises(ValueError, match=r"S_e needs Fluency\*"):
        edit_score({**FULL, "Fluency*": None})
    with pytest.raises(ValueError, match="S_e needs Efficacy, Generalization"):
        edit_score({"Specificity": 0.5, "Fluency*": 1.0, "Portability": 0.5})
    score = edit_score({**FULL, "Fluency*": None, "Portability": None},
                       allow_missing=("Fluency*", "Portability"))
    assert score.missing == ("Fluency*", "Portability")
    with pytest.raises(ValueError, match="unknown S_e constituent"):
        edit_score(FULL, allow_missing=("Portabilty",))


def test_edit_score_refuses_raw_log_probability_fluency() -> None:
    with pytest.raises(ValueError, match="negative.*baseline-normalised Fluency"):
        edit_score({**FULL, "Fluency*": -2.3})
    with pytest.raises(ValueError, match="NaN.*None"):
        edit_score({**FULL, "Specificity": float("nan")})
    with pytest.raises(ValueError, match="different values"):
        edit_score({**FULL, "fluency_star": 0.5})


def test_edit_score_zero_constituent() -> None:
    assert edit_score({**FULL, "Specificity": 0.0}) == 0.0


def test_preservation_score_is_eq_sp() -> None:
    tasks = {"MMLU": 0.6, "GSM8K": 0.75, "HellaSwag": 0.8, "WinoGrande": 0.7, "ARC-C": 0.5, "HumanEval": 0.3}
    score = preservation_score(tasks, expected=PAPER_PRESERVATION_TASKS)
    assert score == pytest.approx(6 / sum(1 / v for v in tasks.values()))
    assert score.name == "S_p" and score.components == tasks and score.complete
    # the pocket suite has other tasks: without `expected` any set is fine
    assert preservation_score({"fact_recall": 0.5, "arith": 0.25}) == pytest.approx(2 / 6)
    assert preservation_score({**tasks, "GSM8K": 0.0}) == 0.0


def test_preservation_score_refusals() -> None:
    tasks = {"MMLU": 0.6, "GSM8K": 0.75, "HellaSwag": 0.8, "WinoGrande": 0.7, "ARC-C": 0.5, "HumanEval": 0.3}
    with pytest.raises(ValueError, match=r"missing \['HumanEval'\]"):
        preservation_score({k: v for k, v in tasks.items() if k != "HumanEval"},
                           expected=PAPER_PRESERVATION_TASKS)
    with pytest.raises(ValueError, match=r"unexpected \['ARC'\]"):
        preservation_score({**{k: v for k, v in tasks.items() if k != "ARC-C"}, "ARC": 0.5},
                           expected=PAPER_PRESERVATION_TASKS)
    with pytest.raises(ValueError, match="percentage"):
        preservation_score({**tasks, "MMLU": 60.0})
    with pytest.raises(ValueError, match="has no score"):
        preservation_score({**tasks, "MMLU": None})
    with pytest.raises(ValueError, match="negative"):
        preservation_score({**tasks, "MMLU": -0.1})
    with pytest.raises(ValueError, match="no task scores"):
        preservation_score({})


def test_score_behaves_as_a_float_and_round_trips() -> None:
    score = edit_score({**FULL, "Portability": None})
    assert round(score, 2) == round(float(score), 2)
    assert json.loads(json.dumps({"S_e": score}))["S_e"] == pytest.approx(float(score))
    back = pickle.loads(pickle.dumps(score))
    assert back == score and back.missing == ("Portability",) and back.components == score.components
    data = score.to_dict()
    assert data["missing"] == ["Portability"] and data["complete"] is False
    assert math.isclose(data["value"], float(score))
    assert "missing=['Portability']" in repr(score)
