"""What is measured at a scored point, as functions of what each measurement needs.

Each function scores the model as it is now and returns ``values`` (``{(group, metric): value}``,
the point's tidy rows) and, where the value is a mean over items, the per-item scores
(:data:`~moir_lib.evaluation.uncertainty.ITEM_COLUMNS` without ``key``/``n_edits``):

* :func:`edit_values` / :func:`record_items` — the CounterFact metrics of the edited records
  (ES/PS/NS, the EasyEdit metrics, Fluency*, Portability, ``S_e`` eq. (se) and ``S_e`` without
  Portability) and, per record, the indicators, token accuracies, target probabilities and both sides of
  Fluency*;
* :func:`preservation` — the preservation suite (the pocket tasks or the paper's, ``S_p`` eq. (sp));
* :func:`domain_nll` — the mean NLL (eq. nll) of held-out documents of every pocket domain;
* :func:`distortion` — ``tr(ΔW C_d ΔWᵀ) / tr(W C_d Wᵀ)`` per pocket domain, averaged over the edit
  layers: how far the edit moves what the layer writes on that domain's keys.

:func:`point_uncertainty` gives a row's ``n``, ``stderr`` and 95 % interval from the point's items.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.rows import EDIT_METRICS
from moir_lib.timings import timed

if TYPE_CHECKING:
    from moir_lib.covariance import CovarianceStats
    from moir_lib.editing.snapshot import WeightSnapshot
    from moir_lib.experiments.specs import EvalSettings

__all__ = ["RECORD_ITEM_METRICS", "distortion", "domain_documents", "domain_nll", "edit_values", "number",
           "point_rows", "point_uncertainty", "preservation", "record_items"]

Values = dict[tuple[str, str], float]

#: The per-record CounterFact columns kept as items (besides ``fluency_base``, ``prob_new``, ``prob_true``).
RECORD_ITEM_METRICS: tuple[str, ...] = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization",
                                        "Specificity", "Portability", "fluency")
#: Rows whose interval is a bootstrap over items (the others: a rate's normal interval).
_COMPOSITES = {("edit", "S_e"), ("edit", "S_e_noport"), ("edit", "Fluency*"), ("preservation", "S_p")}


def edit_values(result: Any) -> Values:
    """The ``edit`` rows of a CounterFact result: :data:`EDIT_METRICS`, ``S_e_noport`` being the harmonic
    mean (eq. (se)) without Portability."""
    from moir_lib.evaluation.scores import EDIT_SCORES, harmonic_mean

    m = result.metrics
    out = {("edit", name): number(m.get(name)) for name in EDIT_METRICS[:-1]}
    four = {k: m.get(k) for k in EDIT_SCORES["S_e_noport"]}
    out[("edit", "S_e_noport")] = (harmonic_mean(four, skip_none=True)
                                  if any(v is not None for v in four.values()) else math.nan)
    return out


def record_items(result: Any, unedited_fluency: Mapping[int, float]) -> pd.DataFrame:
    """Per edited record: the indicators, token accuracies, target probabilities and fluency (edited, and
    ``unedited_fluency[case_id]``: the two sides of Fluency*)."""
    recs = result.per_record
    table = recs[[c for c in RECORD_ITEM_METRICS if c in recs.columns]].copy()
    table["fluency_base"] = [unedited_fluency.get(int(c), math.nan) for c in recs["case_id"]]
    table["prob_new"] = np.exp(-recs["nll_new"].astype(float))
    table["prob_true"] = np.exp(-recs["nll_true"].astype(float))
    table["item"] = recs["case_id"].astype(str)
    long = table.melt(id_vars="item", var_name="metric", value_name="value")
    return long.assign(group="edit", unit="record")


def preservation(model: Any, tokenizer: Any, evaluation: EvalSettings, suite: str, variant: str | None, *,
                 quiet: bool = True) -> tuple[Values, pd.DataFrame | None]:
    """The preservation suite ``suite`` (:func:`~moir_lib.evaluation.preservation.evaluate_preservation`:
    ``evaluation.pres_limit`` items of each task from ``evaluation.pres_offset`` on): every task's score,
    ``arith_raw`` where the pocket suite has it, ``S_p``; and each task's items."""
    from moir_lib.evaluation.preservation import PreservationSettings, evaluate_preservation

    ev = evaluation
    settings = PreservationSettings(suite, limit=ev.pres_limit, offset=ev.pres_offset, data_dir=ev.data_dir,
                                    batch_size=ev.batch_size, allow_code_eval=ev.allow_code_eval)
    with _quiet(quiet):
        res = evaluate_preservation(model, tokenizer, settings, pocket_variant=variant)
    out: Values = {("preservation", label): number(v) for label, v in res.summary["scores"].items()}
    table = res.table
    raw = table[(table["task"] == "pocket_arith_raw") & (table["metric"] == "exact_match")
                & (table["filter"] == "strict-match")]
    if len(raw):
        out[("preservation", "arith_raw")] = number(raw["value"].iloc[0])
    out[("preservation", "S_p")] = number(res.summary["S_p"])
    if res.items is None or not len(res.items):
        return out, None
    pi = res.items
    items = pd.DataFrame({"group": "preservation",
                          "unit": pi["label"].fillna(pi["task"].str.removeprefix("pocket_")),
                          "item": pi["item"].astype(str),
                          "metric": np.where(pi["label"].notna(), "correct", "reported"),
                          "value": pi["value"].astype(float)})
    return out, items


def domain_documents(tokenizer: Any, n: int, seed: int, variant: str | None = None
                     ) -> dict[str, list[list[int]]]:
    """``n`` held-out (validation) documents of every pocket domain of ``variant``'s world, tokenized."""
    from moir_lib.analysis.nll import tokenize_documents
    from moir_lib.documents import load_corpus, pocket_corpus
    from moir_lib.pocket import DOMAINS

    return {d: tokenize_documents(tokenizer, list(load_corpus(pocket_corpus(d, variant), n=n, seed=seed,
                                                              split="validation")))
            for d in DOMAINS}


def domain_nll(model: Any, tokenizer: Any, docs: Mapping[str, list[list[int]]]
               ) -> tuple[Values, list[pd.DataFrame]]:
    """The mean NLL (eq. nll) of each domain's documents, and each document's NLL."""
    from moir_lib.analysis.nll import NLLSettings, document_nll

    out: Values = {}
    items = []
    for d, doc in docs.items():
        frame = document_nll(model, tokenizer, doc, d, NLLSettings(batch_size=16), progress=False)
        out[("nll", d)] = float(np.nanmean(frame["nll"]))
        items.append(pd.DataFrame({"group": "nll", "unit": d, "metric": "nll",
                                   "item": [str(i) for i in range(len(frame))],
                                   "value": frame["nll"].astype(float).to_numpy()}))
    return out, items


@timed("distortion")
def distortion(snapshot: WeightSnapshot, covs: Mapping[str, CovarianceStats], layers: Sequence[int]
               ) -> Values:
    """:func:`output_distortion` per domain (``covs``: domain -> C_d), averaged over ``layers``, of the
    current weights against ``snapshot``'s originals."""
    import torch

    out: Values = {}
    for d, C in covs.items():
        vals = [output_distortion(snapshot.original[layer].detach().to("cpu", torch.float64),
                                  snapshot.delta(layer).to("cpu"), C.mean(layer))
                for layer in layers]
        out[("distortion", d)] = float(np.mean(vals))
    return out


def point_uncertainty(items: pd.DataFrame, group: str, metric: str, value: float = 0.0) -> dict[str, float]:
    """``n``, ``stderr``, ``lo``, ``hi`` of one row (its ``value``) from its point's items: a rate's Wilson
    or t interval, a composite's (``S_e``, ``S_e_noport``, ``Fluency*``, ``S_p``) seeded bootstrap
    (:mod:`moir_lib.evaluation.uncertainty`); NaN where the row has no value or no items (distortion,
    cost, a composite whose constituents were not scored item by item)."""
    from moir_lib.evaluation import uncertainty as unc

    nan = {"n": math.nan, "stderr": math.nan, "lo": math.nan, "hi": math.nan}
    if items.empty or group not in ("edit", "preservation", "nll") or not math.isfinite(value):
        return nan
    if (group, metric) in _COMPOSITES:
        from moir_lib.evaluation.composites import composite

        scored = set(items[["group", "unit", "metric"]].itertuples(index=False, name=None))
        if not set(composite(metric, items).columns) <= scored:  # a constituent without per-item scores
            return nan
        est = unc.estimate(items, metric)
    elif group == "edit":
        sel = items[(items["group"] == "edit") & (items["metric"] == metric)]
        est = unc.rate(sel["value"].to_numpy()) if len(sel) else None
    else:
        sel = items[(items["group"] == group) & (items["unit"] == metric)]
        est = unc.rate(sel["value"].to_numpy()) if len(sel) else None
    if est is None or est.n == 0:
        return nan
    return {"n": float(est.n), "stderr": est.stderr, "lo": est.lo, "hi": est.hi}


def point_rows(spec: Any, n: int, key: str, settings: Mapping[str, Any], values: Values, items: pd.DataFrame
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One scored point of ``spec`` at ``n`` edits as tidy rows (each with :func:`point_uncertainty` and
    the digest of its group's items, :func:`~moir_lib.experiments.rows.items_digest`) and items, both
    keyed by ``key``; ``settings``: the editor's λ / τ."""
    from moir_lib.evaluation.uncertainty import ITEM_COLUMNS
    from moir_lib.experiments.rows import ROW_COLUMNS, empty_items, items_digest

    items = items.assign(key=key, n_edits=int(n))[list(ITEM_COLUMNS)] if len(items) else empty_items()
    digests = {str(g): items_digest(part) for g, part in items.groupby("group")}
    base = {"editor": spec.editor, "regime": spec.regime, "cov": spec.cov, "n_edits": int(n),
            "edit_sample": int(spec.edit_sample), "lambda": float(settings.get("lambda", math.nan)),
            "tau": float(settings.get("tau", math.nan)), "key": key}
    rows = pd.DataFrame([{**base, "group": g, "metric": m, "value": number(v),
                          **point_uncertainty(items, g, m, number(v)), "items_digest": digests.get(g, "")}
                         for (g, m), v in values.items()], columns=list(ROW_COLUMNS))
    return rows, items


def number(v: Any) -> float:
    """``v`` as a finite float, NaN for None, non-numbers and infinities."""
    if v is None:
        return math.nan
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x if math.isfinite(x) else math.nan


@contextlib.contextmanager
def _quiet(enabled: bool = True) -> Iterator[None]:
    """lm-eval's per-task warnings and progress bars off (they would fill every notebook cell)."""
    if not enabled:
        yield
        return
    import io
    import logging

    loggers = [logging.getLogger(n) for n in ("lm_eval", "lm-eval", "datasets", "evaluate")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
