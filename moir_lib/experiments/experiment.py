"""One editing experiment: an editor × regime × C × N on a loaded model, scored on CounterFact at each point.

What one editing experiment is and records (:class:`ExperimentResult`), how its edited records are scored
(:class:`Scorer`), and its parameters; the computation itself is
:func:`moir_lib.experiments.point.compute_experiment`, what the chapters' points
(:meth:`~moir_lib.experiments.lab.Lab.compute`) and ``moir edit`` both call.

* **Regimes** (appendix C.1, :mod:`moir_lib.editing.regimes`): ``batch`` applies the N edits jointly
  (MEMIT eq. (memit-update), AlphaEdit eq. (alphaedit-update)); ``sequential`` applies them in
  batches whose weights and :class:`~moir_lib.editing.state.EditState` persist, scored at every
  milestone and resumable from a checkpoint.
* **Scoring** (:class:`Scorer`): at each scored point, ES/PS/NS, the EasyEdit metrics, Fluency*,
  Portability and ``S_e`` (eq. (se)) of
  :func:`~moir_lib.evaluation.counterfact.evaluate_counterfact`, on up to ``n_eval`` of the records
  edited so far (evenly spaced, so early and late sequential edits both count). Fluency* divides by
  the *unedited* model's fluency on the same records, measured once before any edit.
* **Outputs** (:class:`ExperimentResult`): the points, the milestone metrics, the z statistics per request and
  per batch, ``‖ΔW‖_F`` per layer, timings; with an ``out_dir``, the CounterFact tables are written as
  they are measured (``counterfact_pre_*``, ``counterfact_*`` / ``counterfact_<n>_*``) and
  :meth:`ExperimentResult.save` writes ``summary.json``, ``requests.csv`` and ``milestones.csv``.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.experiments.specs import EvalSettings, ExperimentSpec
from moir_lib.files import atomic_write

if TYPE_CHECKING:
    from moir_lib.data import CounterFactRecord
    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.memit import MemitEditor

    AnyEditor = MemitEditor | AlphaEditEditor
    from moir_lib.editing.templates import TemplateGroups
    from moir_lib.evaluation.counterfact import CounterFactResult
    from moir_lib.models import LoadedModel

__all__ = ["ExperimentResult", "Point", "ScoredPoint", "Scorer"]

log = logging.getLogger(__name__)


def _evenly(n: int, k: int | None) -> list[int]:
    """``k`` indices evenly spaced over ``range(n)`` (all of them when ``k`` is None or ≥ n)."""
    if k is None or k >= n:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})


def _scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, type(None)))}


@dataclass
class Scorer:
    """How edited records are scored: ``evaluation``'s CounterFact settings, the ``portability`` probes
    (a ``portability.json``), and ``unedited_fluency``: the unedited model's fluency per ``case_id`` (the
    denominator of Fluency*), filled by :meth:`unedited` and kept across runs on the same model."""

    evaluation: EvalSettings
    portability: str | None = None
    unedited_fluency: dict[int, float] = field(default_factory=dict)

    def subset(self, edited: Sequence[CounterFactRecord]) -> list[CounterFactRecord]:
        """The records scored of ``edited``: up to ``n_eval``, evenly spaced."""
        return [edited[i] for i in _evenly(len(edited), self.evaluation.n_eval)]

    def _evaluate(self, loaded: LoadedModel, records: Sequence[CounterFactRecord],
                  unedited_fluency: float | None = None, edited: Sequence[CounterFactRecord] = ()
                  ) -> CounterFactResult:
        from moir_lib.evaluation.counterfact import CounterFactSettings, evaluate_counterfact

        ev = self.evaluation
        subjects = {r.subject for r in edited} if ev.neighbours == "unedited" else set()
        settings = CounterFactSettings(batch_size=ev.batch_size, max_gen_tokens=ev.max_gen_tokens,
                                       max_fluency_prompts=ev.fluency_prompts, compute_fluency=ev.fluency)
        return evaluate_counterfact(loaded.model, loaded.tokenizer, records, settings,
                                    unedited_fluency=unedited_fluency, portability=self.portability,
                                    edited_subjects=subjects, progress=False)

    def unedited(self, loaded: LoadedModel, records: Sequence[CounterFactRecord], *, keep: bool = False
                 ) -> CounterFactResult | None:
        """Score the (unedited) model on ``records`` and remember their fluency. Without ``keep`` only
        the records whose fluency is not known yet are scored, and only when Fluency* is measured;
        with ``keep`` all of them, and the result is returned."""
        unique = list({r.case_id: r for r in records}.values())
        if not keep:
            todo = [r for r in unique if r.case_id not in self.unedited_fluency]
            unique = todo if self.evaluation.fluency else []
        if not unique:
            return None
        res = self._evaluate(loaded, unique)
        if self.evaluation.fluency:
            for cid, f in zip(res.per_record["case_id"], res.per_record["fluency"], strict=True):
                self.unedited_fluency[int(cid)] = float(f) if f is not None else math.nan
        return res if keep else None

    def mean_unedited_fluency(self, records: Sequence[CounterFactRecord]) -> float | None:
        """The unedited model's mean fluency over ``records`` (those measured), or None."""
        vals = [self.unedited_fluency.get(r.case_id, math.nan) for r in records]
        vals = [v for v in vals if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else None

    def score(self, loaded: LoadedModel, edited: Sequence[CounterFactRecord]) -> CounterFactResult:
        """The CounterFact metrics of the model as it is now on :meth:`subset` of ``edited`` (NS
        without the neighbours that are among ``edited``, under ``evaluation.neighbours``)."""
        subset = self.subset(edited)
        return self._evaluate(loaded, subset, self.mean_unedited_fluency(subset), edited)


@dataclass
class Point:
    """One scored point: ``n_edits`` edits done, their CounterFact scores (None when not scored),
    the editing seconds since the previous point and the scoring seconds."""

    n_edits: int
    counterfact: CounterFactResult | None
    edit_s: float
    eval_s: float

    def metrics(self) -> dict[str, Any]:
        return _scalars(self.counterfact.metrics) if self.counterfact is not None else {}


@dataclass
class ExperimentResult:
    """What an editing experiment did and measured (see the module doc).

    ``pre``: the unedited model's scores (with ``score_unedited``); ``points``: the points scored by
    this process; ``milestones`` (sequential): ``{"n_edits", **metrics}`` of every milestone, those of
    a resumed checkpoint included; ``edit`` (batch): the z statistics and per-layer solve (λ_eff,
    null-space dimensions); ``per_request``: each request's final z loss; ``parameters``: what the experiment
    was (filled by :meth:`~moir_lib.experiments.lab.Lab.edit`); ``out_dir``: where the tables go.
    """

    spec: ExperimentSpec
    templates: TemplateGroups
    out_dir: Path | None = None
    pre: CounterFactResult | None = field(default=None, init=False)
    points: list[Point] = field(default_factory=list, init=False)
    milestones: list[dict[str, Any]] = field(default_factory=list, init=False)
    edit: dict[str, Any] | None = field(default=None, init=False)
    per_request: list[dict[str, Any]] = field(default_factory=list, init=False)
    weight_change: dict[int, float] = field(default_factory=dict, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)
    resumed_from: int | None = field(default=None, init=False)
    parameters: dict[str, Any] = field(default_factory=dict, init=False)

    def write_table(self, result: CounterFactResult, prefix: str) -> None:
        """``<prefix>_metrics.json`` and its record tables in ``out_dir`` (nothing without one)."""
        if self.out_dir is not None:
            result.save(self.out_dir, prefix=prefix)

    def add(self, point: Point) -> None:
        """Keep ``point`` and write its tables (``counterfact_*``; sequential: ``counterfact_<n>_*``)."""
        self.points.append(point)
        if point.counterfact is not None:
            prefix = "counterfact" if self.spec.regime == "batch" else f"counterfact_{point.n_edits:06d}"
            self.write_table(point.counterfact, prefix)

    def headline(self) -> dict[str, Any]:
        """``summary.json``'s headline: the final metrics, the pre-edit ones, the milestones
        (sequential) or the z statistics (batch), ``‖ΔW‖_F`` per layer and the timings."""
        s = self.spec
        head: dict[str, Any] = {"editor": s.editor, "cov": s.cov, "regime": s.regime, "n_edits": s.n_edits}
        if s.regime == "batch":
            if self.points and self.points[-1].counterfact is not None:
                head.update(self.points[-1].counterfact.metrics)
            head["edit"] = self.edit
        else:
            final = self.milestones[-1] if self.milestones else {}
            head.update({k: v for k, v in final.items() if k not in ("timings", "n_edits")})
            head["milestones"] = self.milestones
            head["resumed_from"] = self.resumed_from
        head["pre_edit"] = _scalars(self.pre.metrics) if self.pre is not None else None
        head["weight_change"] = {str(k): v for k, v in self.weight_change.items()}
        head["timings"] = self.timings
        return head

    def save(self) -> Path:
        """``summary.json`` (:meth:`headline`, :attr:`parameters`), ``requests.csv`` and, sequentially,
        ``milestones.csv`` in ``out_dir``; returns the summary's path."""
        from moir_lib.results import undefined_as_none, write_summary

        if self.out_dir is None:
            raise ValueError("this experiment has no out_dir to save to")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _write_csv(self.out_dir / "requests.csv", self.per_request)
        if self.spec.regime == "sequential":
            _write_csv(self.out_dir / "milestones.csv", self.milestones)
        return write_summary(self.out_dir, "edit", undefined_as_none(self.headline()),
                             undefined_as_none(self.parameters))


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for row in rows for k in row if not isinstance(row[k], (dict, list))))

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


@dataclass
class ScoredPoint:
    """One scored point: ``n_edits``, its ``values`` (``{(group, metric): value}``) and per-item scores."""

    n_edits: int
    values: dict[tuple[str, str], float]
    items: pd.DataFrame

