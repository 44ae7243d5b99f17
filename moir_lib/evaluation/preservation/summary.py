"""The preservation result: the tidy table, the headline scores and ``S_p`` (eq. (sp)), the run's
summary and the per-item scores.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.evaluation.preservation.configs import _lm_eval_version
from moir_lib.evaluation.preservation.harness import _number
from moir_lib.evaluation.preservation.suites import SuitePlan
from moir_lib.evaluation.scores import PAPER_PRESERVATION_TASKS, Score, preservation_score
from moir_lib.files import atomic_write, write_json

if TYPE_CHECKING:
    import pandas as pd

    from moir_lib.evaluation.humaneval import HumanEvalResult

log = logging.getLogger(__name__)


#: Columns of the tidy table (one row per task × metric × filter).
TABLE_COLUMNS: tuple[str, ...] = ("suite", "task", "metric", "filter", "value", "stderr", "n", "version",
                                  "in_score", "score_name", "limited", "model_fingerprint")


#: Columns of :attr:`PreservationResult.items`: the task key, its ``S_p`` label (None: reported only), the
#: item id (``<lm-eval task>/<doc_id>``) and its headline score (0/1 for accuracy, exact match, pass@1).
ITEM_COLUMNS: tuple[str, ...] = ("task", "label", "item", "value")


@dataclass
class PreservationResult:
    """A tidy table (one row per task × metric × filter, :data:`TABLE_COLUMNS`) and a summary.

    ``summary``: ``suite``, ``S_p`` (``None`` when the suite ran only partly), ``scores``
    (S_p name -> value), ``limited``/``limit``, ``task_versions``, ``n``, ``git_hash``,
    ``model_fingerprint``, ``lm_eval_version``, settings and ``warnings``.
    """

    table: pd.DataFrame
    summary: dict[str, Any]
    score: Score | None = None
    humaneval: HumanEvalResult | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    items: pd.DataFrame | None = None  # one row per task item: ITEM_COLUMNS of _items

    def save(self, out_dir: str | os.PathLike[str], parameters: Mapping[str, Any] | None = None) -> Path:
        """``summary.json`` (via :func:`moir_lib.results.write_summary`), ``preservation.{parquet,csv}``,
        ``humaneval_records.jsonl`` and ``lm_eval_results.json`` in ``out_dir``; returns the summary path."""
        from moir_lib.results import _jsonable, undefined_as_none, write_summary

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "preservation.parquet", lambda p: self.table.to_parquet(p, index=False))
        atomic_write(out / "preservation.csv", lambda p: self.table.to_csv(p, index=False))
        if self.humaneval is not None:
            with (out / "humaneval_records.jsonl").open("w") as fh:
                for rec in self.humaneval.per_sample:
                    fh.write(json.dumps(rec) + "\n")
        if self.raw:
            raw = _jsonable(undefined_as_none(self.raw))
            write_json(out / "lm_eval_results.json", raw, indent=1, default=str)
        return write_summary(out, "eval", undefined_as_none(self.summary), dict(parameters or {}))


def _headline(plan: SuitePlan, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The headline value per score label; marks each row's ``in_score`` and ``score_name``."""
    by_task = {t.key: t for t in plan.tasks}
    headline: dict[str, float] = {}
    for row in rows:
        t = by_task.get(row["task"])
        row["in_score"] = bool(t and t.label and (row["metric"], row["filter"]) == (t.metric, t.filter))
        row["score_name"] = t.label if row["in_score"] and t is not None else None
        if row["in_score"] and t is not None and t.label is not None:
            headline[t.label] = row["value"]
    return headline


def _suite_score(plan: SuitePlan, headline: dict[str, float]) -> Score | None:
    """``S_p`` (eq. (sp)) when the whole suite ran, else ``None``."""
    if plan.complete:
        expected = PAPER_PRESERVATION_TASKS if plan.suite == "paper" else None
        return preservation_score(headline, expected=expected)
    msg = f"S_p not computed: the {plan.suite} suite ran only {', '.join(t.key for t in plan.tasks)}"
    log.info(msg)
    return None


def _table(rows: list[dict[str, Any]], plan: SuitePlan, limit: int | None, fingerprint: str) -> pd.DataFrame:
    """The tidy result table (:data:`TABLE_COLUMNS`)."""
    import pandas as pd

    table = pd.DataFrame(rows)
    table["suite"] = plan.suite
    table["limited"] = limit is not None
    table["model_fingerprint"] = fingerprint
    table["version"] = table["version"].map(lambda v: None if v is None else str(v))
    return table[list(TABLE_COLUMNS)]


def _summary(plan: SuitePlan, score: Score | None, headline: dict[str, float], *,
             prov: dict[str, dict[str, Any]], fingerprint: str, settings: dict[str, Any], warnings: list[str],
             start: float) -> dict[str, Any]:
    """The run's summary: ``S_p``, headline scores, provenance, settings, warnings and timing (``start``:
    the run's :func:`time.perf_counter`)."""
    from moir_lib.results import git_hash

    return {
        "suite": plan.suite,
        "S_p": float(score) if score is not None else None,
        "scores": headline,
        "limited": plan.limit is not None,
        "limit": plan.limit,
        "offset": plan.offset,
        "tasks": [t.key for t in plan.tasks],
        "metrics": {t.key: t.metric_key for t in plan.tasks},
        "task_versions": prov["versions"],
        "n": prov["n"],
        "num_fewshot": prov["num_fewshot"],
        "sources": prov["sources"],
        "git_hash": git_hash(),
        "model_fingerprint": fingerprint,
        "lm_eval_version": _lm_eval_version(),
        "settings": settings,
        "warnings": warnings,
        "duration_s": round(time.perf_counter() - start, 2),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def _items(plan: SuitePlan, samples: Mapping[str, Sequence[Mapping[str, Any]]],
           humaneval: HumanEvalResult | None) -> pd.DataFrame:
    """Per-item headline scores from lm-eval's logged samples (MMLU: every subject's items) and the
    HumanEval sandbox's per-sample rows."""
    import pandas as pd

    rows = []
    for t in plan.tasks:
        if t.key == "humaneval":
            for i, rec in enumerate(humaneval.per_sample if humaneval is not None else []):
                value = rec.get("passed", rec.get("pass@1"))
                rows.append({"task": t.key, "label": t.label, "item": f"humaneval/{rec.get('task_id', i)}",
                             "value": _number(value)})
            continue
        names = sorted(k for k in samples if k == t.key or (t.key == "mmlu" and k.startswith("mmlu_")))
        for name in names:
            for s in samples[name]:
                if s.get("filter") == t.filter and t.metric in s:
                    rows.append({"task": t.key, "label": t.label, "item": f"{name}/{s['doc_id']}",
                                 "value": _number(s[t.metric])})
    return pd.DataFrame(rows, columns=list(ITEM_COLUMNS))
