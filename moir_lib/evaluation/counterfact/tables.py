"""The CounterFact result: one row per record (ES/PS/NS, Efficacy/Generalization/Specificity,
fluency, Portability) and the aggregates under the paper's names, with ``Fluency*`` and ``S_e``
(eq. (se)).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.data import CounterFactRecord
from moir_lib.evaluation.counterfact.teacher_forcing import TargetScore
from moir_lib.evaluation.scores import EDIT_METRICS, Score, edit_score
from moir_lib.files import atomic_write, write_json

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


#: aggregate metric -> the convention of appendix C.3 it belongs to (for tidy tables).
CONVENTIONS: dict[str, str] = {
    "ES": "ROME/MEMIT", "PS": "ROME/MEMIT", "NS": "ROME/MEMIT",
    **dict.fromkeys(("Efficacy", "Generalization", "Specificity", "Fluency*", "Portability"),
                    "EasyEdit/KnowEdit"),
    "S_e": "composite (eq. (se))",
}


_RECORD_METRICS = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity", "fluency",
                   "Portability", "portability_token_acc")


@dataclass(eq=False)
class CounterFactResult(Mapping[str, Any]):
    """What :func:`evaluate_counterfact` measured; as a mapping, its ``metrics``.

    ``metrics``: aggregates under the paper's names (``ES PS NS Efficacy Generalization
    Specificity Fluency* Portability S_e``; ``None`` = not available) plus counts and flags
    (``n_records``, ``n_<metric>``, ``fluency``, ``fluency_baseline``, ``fluency_normalised``,
    ``fluency_ratio_literal``, ``S_e_missing``, ``portability_source``). ``per_record``: one row per
    record (the same metric columns, NaN where not defined, plus NLLs and counts).
    ``generations``: one row per fluency continuation. ``settings``: how it was measured.
    ``edit_score``: the :class:`~moir_lib.evaluation.scores.Score` behind ``metrics["S_e"]``.
    """

    metrics: dict[str, Any]
    per_record: pd.DataFrame
    generations: pd.DataFrame
    settings: dict[str, Any]
    edit_score: Score | None = field(default=None, repr=False)

    def __getitem__(self, name: str) -> Any:
        return self.metrics[name]

    def __iter__(self) -> Any:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (metrics + settings) for ``summary.json``."""
        return {"metrics": dict(self.metrics), "settings": dict(self.settings)}

    def tidy(self) -> pd.DataFrame:
        """Long table: one row per aggregate metric with its convention and record count."""
        import pandas as pd

        counts = {"Fluency*": "n_fluency"}
        rows = [{"metric": name, "convention": conv, "value": self.metrics.get(name),
                 "n": self.metrics.get(counts.get(name, f"n_{name}"), self.metrics["n_records"])}
                for name, conv in CONVENTIONS.items()]
        return pd.DataFrame(rows)

    def save(self, out_dir: str | os.PathLike[str], prefix: str = "counterfact") -> Path:
        """Write ``<prefix>_metrics.json`` and the per-record and generation tables (parquet)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / f"{prefix}_records.parquet", lambda p: self.per_record.to_parquet(p, index=False))
        atomic_write(out / f"{prefix}_generations.parquet",
                     lambda p: self.generations.to_parquet(p, index=False))
        write_json(out / f"{prefix}_metrics.json", self.to_dict(), indent=1, default=str)
        return out


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def _aggregate(column: Any) -> tuple[float | None, int]:
    vals = [float(v) for v in column if v is not None and not math.isnan(float(v))]
    return (math.fsum(vals) / len(vals) if vals else None), len(vals)


def _record_row(rec: CounterFactRecord, item: dict[str, Any], scores: Sequence[TargetScore],
                flu: list[float]) -> dict[str, Any]:
    """A record's metrics from its pairs' scores and its fluency log-probabilities ``flu``."""
    new = scores[item["rewrite_new"]]
    true = scores[item["rewrite_true"]] if item["rewrite_true"] is not None else None
    para = [(scores[a], scores[b] if b is not None else None) for a, b in item["para"]]
    neigh = [scores[j] for j in item["neigh"]]
    port = [[scores[j] for j in alts] for alts in item["port"]]
    ns = _mean(float(s.all_correct) for s, e in zip(neigh, item["neigh_edited"], strict=True) if not e)
    return {
        "case_id": rec.case_id,
        "subject": rec.subject,
        "source_format": rec.source_format,
        "ES": float(new.nll < true.nll) if true is not None else math.nan,
        "PS": _mean(float(a.nll < b.nll) for a, b in para if b is not None),
        "NS": ns,
        "NS_all": _mean(float(s.all_correct) for s in neigh),
        "Efficacy": new.token_accuracy,
        "Generalization": _mean(a.token_accuracy for a, _ in para),
        "Specificity": ns,
        "fluency": _mean(flu) if flu else math.nan,
        "Portability": _mean(float(any(s.all_correct for s in alts)) for alts in port),
        "portability_token_acc": _mean(max(s.token_accuracy for s in alts) for alts in port),
        "nll_new": new.nll,
        "nll_true": true.nll if true is not None else math.nan,
        "rewrite_all_correct": float(new.all_correct),
        "n_target_new_tokens": len(new.logprobs),
        "n_paraphrases": len(para),
        "n_neighbours": len(neigh),
        "n_neighbours_edited": sum(item["neigh_edited"]),
        "n_fluency_prompts": len(flu),
        "n_portability": len(port),
        "portability_source": item["port_source"],
    }


def _metrics(table: pd.DataFrame, n_records: int, plan: list[dict[str, Any]],
             base_f: float | None) -> tuple[dict[str, Any], Score]:
    """Means over the records where each metric is defined, Fluency* against ``base_f``, and S_e."""
    metrics: dict[str, Any] = {"n_records": n_records}
    for name in _RECORD_METRICS:
        value, n = _aggregate(table[name])
        metrics[name] = value
        metrics[f"n_{name}"] = n
    f = metrics["fluency"]
    metrics["fluency_baseline"] = base_f
    metrics["fluency_normalised"] = base_f is not None and f is not None
    if metrics["fluency_normalised"] and f != 0.0:
        metrics["Fluency*"] = base_f / f
        metrics["fluency_ratio_literal"] = f / base_f
    else:
        if metrics["fluency_normalised"]:
            log.warning("edited fluency is exactly 0 (certain continuations): Fluency* is undefined")
        metrics["Fluency*"] = None
        metrics["fluency_ratio_literal"] = None
    sources = sorted({item["port_source"] for item in plan if item["port_source"]})
    metrics["portability_source"] = ", ".join(sources) if sources else None
    if metrics["Portability"] is None:
        log.info("Portability not available: no pocket two-hop probes given and no portability fields in the "
                 "records")
    score = edit_score(metrics, allow_missing=EDIT_METRICS)
    metrics["S_e"] = float(score)
    metrics["S_e_missing"] = list(score.missing)
    metrics["S_e_complete"] = score.complete
    return metrics, score
