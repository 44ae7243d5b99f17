"""Composite scores of appendix C.3: edit score ``S_e`` (eq. (se)) and preservation score ``S_p`` (eq. (sp)).

Both are harmonic means (HM) of their constituents, which "penalises low outliers more than
the arithmetic mean"::

    S_e = HM(Efficacy, Generalization, Specificity, Fluency*, Portability)        (eq. (se))
    S_p = HM(MMLU, GSM8K, HellaSwag, WinoGrande, ARC-C, HumanEval)              (eq. (sp))

``HM(x_1..x_n) = n / Σ 1/x_i``, and HM = 0 as soon as one ``x_i`` is 0 (the limit). Negative,
NaN and infinite inputs are refused: they are bugs upstream (e.g. a raw, negative mean
log-probability passed where the baseline-normalised Fluency* belongs), not scores.

A constituent that is *not available* (``None``) is never silently dropped: the harmonic mean
of fewer terms is a different quantity. :func:`harmonic_mean` skips ``None`` only with
``skip_none=True`` and logs it; :func:`edit_score` skips only the names in ``allow_missing``
(by default Portability, which CounterFact in the ROME format does not carry) and records
them in the returned :class:`Score`'s ``missing``, so a table can flag the value.

:class:`Score` is a ``float`` (use it anywhere a number goes: ``round``, ``json.dumps``,
pandas) that also carries its ``components`` and ``missing`` names.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "EDIT_METRICS",
    "EDIT_SCORES",
    "PAPER_PRESERVATION_TASKS",
    "Score",
    "edit_score",
    "harmonic_mean",
    "preservation_score",
]

log = logging.getLogger(__name__)

#: The constituents of ``S_e`` (eq. (se)), in the paper's order and spelling.
EDIT_METRICS: tuple[str, ...] = ("Efficacy", "Generalization", "Specificity", "Fluency*", "Portability")
#: The constituents of each edit-score column: ``S_e`` (eq. (se)) and ``S_e_noport``, the same harmonic
#: mean without Portability (used where Portability is zero in most runs).
EDIT_SCORES: dict[str, tuple[str, ...]] = {
    "S_e": EDIT_METRICS,
    "S_e_noport": tuple(m for m in EDIT_METRICS if m != "Portability"),
}

#: The constituents of ``S_p`` (eq. (sp)) for the paper's suite (table 4 metrics: MMLU acc, GSM8K
#: strict-match exact match, HellaSwag acc_norm, WinoGrande acc, ARC-Challenge acc_norm, HumanEval pass@1).
PAPER_PRESERVATION_TASKS: tuple[str, ...] = ("MMLU", "GSM8K", "HellaSwag", "WinoGrande", "ARC-C", "HumanEval")

# accepted spellings of the S_e constituents (case-insensitive) -> canonical name
_EDIT_ALIASES: dict[str, str] = {
    **{name.lower(): name for name in EDIT_METRICS},
    "fluency_star": "Fluency*",
}


class Score(float):
    """A composite score: a ``float`` with the ``components`` it was computed from.

    ``name``: e.g. ``"S_e"``; ``components``: constituent name -> value actually used;
    ``missing``: constituents that were unavailable and skipped (``complete`` is False then).
    """

    name: str
    components: dict[str, float]
    missing: tuple[str, ...]

    def __new__(cls, value: float, *, name: str, components: Mapping[str, float],
                missing: Sequence[str] = ()) -> Score:
        obj = super().__new__(cls, value)
        obj.name = name
        obj.components = dict(components)
        obj.missing = tuple(missing)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_score, (float(self), self.name, self.components, self.missing))

    @property
    def value(self) -> float:
        return float(self)

    @property
    def complete(self) -> bool:
        """True when every constituent was available."""
        return not self.missing

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``summary.json``."""
        return {"name": self.name, "value": float(self), "components": dict(self.components),
                "missing": list(self.missing), "complete": self.complete}

    def __repr__(self) -> str:
        flag = f", missing={list(self.missing)}" if self.missing else ""
        return f"Score({self.name}={float(self):.4f}, components={self.components}{flag})"


def _make_score(value: float, name: str, components: dict[str, float], missing: tuple[str, ...]) -> Score:
    return Score(value, name=name, components=components, missing=missing)


def _checked(value: Any, label: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{label}: expected a number, got the boolean {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label}: expected a number, got {value!r}") from None
    if math.isnan(x):
        raise ValueError(f"{label} is NaN: a metric that could not be computed must be None (not available), "
                         f"not NaN")
    if math.isinf(x):
        raise ValueError(f"{label} is infinite; a harmonic mean needs finite, non-negative values")
    if x < 0:
        raise ValueError(f"{label} = {x} is negative; a harmonic mean needs non-negative values "
                         f"(a raw mean log-probability? pass the baseline-normalised Fluency* instead)")
    return x


def harmonic_mean(values: Iterable[float | None] | Mapping[str, float | None], *,
                  skip_none: bool = False) -> float:
    """``n / Σ 1/x_i`` of non-negative finite values; 0 when any value is 0.

    ``values``: numbers, or a mapping name -> number (names appear in error messages).
    ``None`` marks an unavailable value: it raises ``ValueError`` unless ``skip_none=True``,
    which computes the HM over the others and logs which were skipped. Raises ``ValueError``
    for NaN, infinities, negatives, or nothing left to average.
    """
    items = list(values.items()) if isinstance(values, Mapping) else list(enumerate(values))
    kept: list[float] = []
    skipped: list[str] = []
    for key, value in items:
        label = f"value {key!r}" if isinstance(key, str) else f"value #{key}"
        if value is None:
            if not skip_none:
                raise ValueError(f"{label} is None (not available); pass skip_none=True to take the harmonic "
                                 f"mean of the others, and report that it was skipped")
            skipped.append(str(key))
            continue
        kept.append(_checked(value, label))
    if skipped:
        log.info("harmonic mean over %d value(s); skipped unavailable %s", len(kept), ", ".join(skipped))
    if not kept:
        raise ValueError("harmonic mean of no values" + (f" (all unavailable: {', '.join(skipped)})"
                                                          if skipped else ""))
    if any(x == 0.0 for x in kept):
        return 0.0
    return len(kept) / math.fsum(1.0 / x for x in kept)


def edit_score(metrics: Mapping[str, float | None], *,
               allow_missing: Iterable[str] = ("Portability",)) -> Score:
    """``S_e = HM(Efficacy, Generalization, Specificity, Fluency*, Portability)`` (eq. (se)).

    ``metrics``: a mapping with those keys (case-insensitive; ``fluency_star`` is accepted
    for ``Fluency*``; other keys are ignored, so a full metrics dict can be passed). Fluency*
    is the baseline-normalised fluency (see :mod:`moir_lib.evaluation.counterfact`), never the
    raw negative log-probability. A constituent that is absent or ``None`` is skipped only
    when named in ``allow_missing`` (default: Portability, unavailable for ROME-format
    CounterFact) and is then listed in the result's ``missing``; otherwise ``ValueError``.
    """
    allowed = {_canonical(name) for name in allow_missing}
    found: dict[str, float | None] = {}
    for key, value in metrics.items():
        name = _EDIT_ALIASES.get(str(key).lower())
        if name is None:
            continue
        if name in found and found[name] is not None and value is not None and found[name] != value:
            raise ValueError(f"{name} given twice with different values ({found[name]} and {value})")
        if found.get(name) is None:
            found[name] = value
    missing = [name for name in EDIT_METRICS if found.get(name) is None]
    refused = [name for name in missing if name not in allowed]
    if refused:
        raise ValueError(f"S_e needs {', '.join(refused)} (got {sorted(map(str, metrics))}); a constituent "
                         f"may be skipped only through allow_missing, e.g. allow_missing=('Portability',)")
    components = {name: _checked(found[name], name) for name in EDIT_METRICS if found.get(name) is not None}
    if missing:
        log.info("S_e computed without %s (not available); flagged in Score.missing", ", ".join(missing))
    value = harmonic_mean(components)
    return Score(value, name="S_e", components=components, missing=missing)


def preservation_score(task_scores: Mapping[str, float | None], *,
                       expected: Sequence[str] | None = None) -> Score:
    """``S_p = HM(MMLU, GSM8K, HellaSwag, WinoGrande, ARC-C, HumanEval)`` (eq. (sp)).

    ``task_scores``: task name -> raw accuracy in [0, 1] (the paper's six, or the pocket
    suite's tasks). ``expected``: the task names that must all be present, e.g.
    :data:`PAPER_PRESERVATION_TASKS`; then any other key is an error too (a typo should not
    pass unseen). Every score must be a number in [0, 1]; ``None`` is refused (a task that did
    not run has no score, and S_p over fewer tasks is not eq. (sp)).
    """
    if not task_scores:
        raise ValueError("S_p of no task scores")
    if expected is not None:
        absent = [t for t in expected if t not in task_scores]
        extra = [t for t in task_scores if t not in expected]
        if absent or extra:
            raise ValueError(f"S_p task scores do not match the expected tasks {list(expected)}: "
                             f"missing {absent}, unexpected {extra}")
    components: dict[str, float] = {}
    for task, value in task_scores.items():
        if value is None:
            raise ValueError(f"task {task!r} has no score (None); run it, or leave the task out of the suite "
                             f"explicitly")
        x = _checked(value, f"task {task!r}")
        if x > 1.0:
            raise ValueError(f"task {task!r} = {x} is not an accuracy in [0, 1] (a percentage? divide by "
                             f"100)")
        components[str(task)] = x
    return Score(harmonic_mean(components), name="S_p", components=components)


def _canonical(name: str) -> str:
    canonical = _EDIT_ALIASES.get(str(name).lower())
    if canonical is None:
        raise ValueError(f"unknown S_e constituent {name!r}: choose from {', '.join(EDIT_METRICS)}")
    return canonical
