"""What chapters 01 and 05 share: tables of the Lab's tidy rows (:mod:`moir_lib.experiments.rows`)
and the notes both closing texts write.

Pure pandas on the rows: the wide view (:func:`wide`), the pre-edit scores (Table 5,
:func:`baseline_table`), the curves of Figs. 2, 4, 5, 8, 9 (:func:`curves`), the output distortion
``tr(ΔW C_d ΔWᵀ)/tr(W C_d Wᵀ)`` per domain (:func:`distortion_table`), the edit harmonic mean in use
(:func:`edit_hm_metric`), the tasks the paper finds vulnerable (:func:`vulnerable_tasks`), and the caveat
when the edits miss the editability gate (:func:`weak_edits_note`). Every table is laid out per base C:
the draws of one C (``moir``, ``moir@1``: :func:`~moir_lib.covariance.recipes.parse_name`) are averaged
like its edit samples (:func:`base_covs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.covariance.recipes import parse_name
from moir_lib.experiments.gates import ES_GATE
from moir_lib.experiments.rows import NONE, json_value

#: Display names of the C variants.
COV_LABELS: dict[str, str] = {"wiki": "Wiki", "wiki-subset": "Wiki subset only",
                              "oracle": "Oracle (pretraining mix)", "moir": "Moir", "moir-bos": "Moir-bos",
                              "none": "pre-edit"}
#: Pocket task -> the paper benchmark it stands in for.
PRES_LABELS: dict[str, str] = {"facts": "MMLU", "arith": "GSM8K", "prose": "HellaSwag", "code": "HumanEval",
                               "arith_raw": "GSM8K (raw format)", "MMLU": "MMLU", "GSM8K": "GSM8K",
                               "HellaSwag": "HellaSwag", "WinoGrande": "WinoGrande", "ARC-C": "ARC-C",
                               "HumanEval": "HumanEval"}
#: The benchmarks the paper finds vulnerable to C_Wiki (Section 3: code and mathematics), fixed before any
#: run: a preservation task is vulnerable when it stands in for one of them (:data:`PRES_LABELS`: the
#: pocket tasks ``code`` and ``arith``, the paper suite's HumanEval and GSM8K).
VULNERABLE: tuple[str, ...] = ("HumanEval", "GSM8K")


def vulnerable_tasks(tasks: Sequence[str]) -> list[str]:
    """The tasks of ``tasks`` that stand in for a :data:`VULNERABLE` benchmark, in its order."""
    return [t for bench in VULNERABLE for t in tasks if PRES_LABELS.get(t) == bench]


def base_covs(covs: pd.Series) -> pd.Series:
    """Each C name's base: ``moir@1`` (draw 1 of C_Moir) → ``moir``."""
    return covs.map({c: parse_name(c)[0] for c in covs.unique()})


def wide(rows: pd.DataFrame, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per ``profile × model × editor × regime × C × N × edit sample``, one column per metric
    (``nll:<domain>``, ``distortion:<domain>``, ``cost:<name>`` for those groups): the mean over the C's
    draws (``C`` its base name, :func:`base_covs`)."""
    if rows.empty:
        return pd.DataFrame()
    r = rows if groups is None else rows[rows["group"].isin(groups)]
    r = r.assign(cov=base_covs(r["cov"]),
                 column=np.where(r["group"].isin(["edit", "preservation"]), r["metric"],
                                 r["group"] + ":" + r["metric"]))
    index = ["profile", "model", "editor", "regime", "cov", "n_edits", "edit_sample"]
    out = r.groupby(index + ["column"], dropna=False)["value"].mean().unstack("column")
    out.columns.name = None
    return out.reset_index()


def pres_tasks(rows: pd.DataFrame) -> list[str]:
    """The preservation tasks present, in the paper's order (pocket: facts, arith, prose, code, arith_raw)."""
    present = set(rows.loc[rows["group"] == "preservation", "metric"]) - {"S_p"}
    order = ["facts", "prose", "code", "arith", "arith_raw", "MMLU", "HellaSwag", "WinoGrande", "ARC-C",
             "HumanEval", "GSM8K"]
    return [t for t in order if t in present] + sorted(present - set(order))


def zero_portability(rows: pd.DataFrame) -> tuple[int, int]:
    """``(points with Portability 0, edited points with a Portability)``."""
    port = rows[(rows["metric"] == "Portability") & (rows["editor"] != NONE)]["value"].dropna()
    return int((port == 0.0).sum()), len(port)


def edit_hm_metric(rows: pd.DataFrame) -> str:
    """``S_e`` (eq. (se)), unless Portability is 0 in at least half of the edited points: then ``S_e`` is 0
    in most cells by definition and its curves say nothing, so ``S_e_noport``, the HM of the other
    four, is the chapter's edit score. Decide it once per chapter, on all its rows."""
    zeros, edited = zero_portability(rows)
    return "S_e_noport" if edited and 2 * zeros >= edited else "S_e"


def baseline_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Table 5: the pre-edit preservation scores (one row per model), with S_p and the NLLs."""
    base = rows[rows["editor"] == NONE]
    if base.empty:
        return pd.DataFrame()
    w = wide(base, ["preservation", "nll"])
    cols = ["profile", "model"] + pres_tasks(base) + [c for c in ("S_p",) if c in w] + \
        sorted(c for c in w if c.startswith("nll:"))
    return w[cols].reset_index(drop=True)


def baseline_values(rows: pd.DataFrame) -> dict[str, float]:
    """The pre-edit value of every metric (``<group>:<metric>`` beyond edit and preservation)."""
    base = rows[(rows["editor"] == NONE)]
    return {(m if g in ("edit", "preservation") else f"{g}:{m}"): v
            for g, m, v in zip(base["group"], base["metric"], base["value"], strict=True)}


def curves(rows: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Long table for the curve figures: ``editor, regime, cov, n_edits, group, metric, value`` (mean over
    edit samples and C draws) and ``lo``, ``hi`` (the rows' 95 % intervals, averaged over edit samples);
    ``nll``/``distortion``/``cost`` metrics are named ``<group>:<metric>``; the pre-edit value sits at
    ``N = 0`` for the preservation and NLL metrics of every editor × regime × C present."""
    edited = rows[rows["editor"] != NONE]
    edited = edited.assign(cov=base_covs(edited["cov"]),
                           metric=np.where(edited["group"].isin(["edit", "preservation"]), edited["metric"],
                                           edited["group"] + ":" + edited["metric"]))
    if metrics is not None:
        edited = edited[edited["metric"].isin(set(metrics))]
    keys = ["editor", "regime", "cov", "n_edits", "group", "metric"]
    bounds = [c for c in ("lo", "hi") if c in edited.columns]  # per-edit-sample 95 % intervals, averaged
    out = edited.groupby(keys, as_index=False)[["value", *bounds]].mean()
    base = rows[(rows["editor"] == NONE) & rows["group"].isin(["preservation", "nll"])]
    base = base.assign(metric=np.where(base["group"] == "preservation", base["metric"],
                                       base["group"] + ":" + base["metric"]))
    base = base.groupby(["group", "metric"], as_index=False)["value"].mean()
    extra = [{"editor": e, "regime": r, "cov": c, "n_edits": 0, "group": b.group, "metric": b.metric,
              "value": b.value}
             for (e, r, c), g in out.groupby(["editor", "regime", "cov"]) for b in base.itertuples()
             if b.metric in set(g["metric"])]
    if extra:
        out = pd.concat([pd.DataFrame(extra), out], ignore_index=True)
    return out.sort_values(["editor", "regime", "cov", "metric", "n_edits"]).reset_index(drop=True)


def distortion_table(rows: pd.DataFrame, n_edits: int | None = None, editor: str = "memit",
                     regime: str = "batch") -> pd.DataFrame:
    """Distortion ``tr(ΔW C_d ΔWᵀ)/tr(W C_d Wᵀ)`` per base C (rows; mean over edit samples and
    draws) and pocket domain (columns) at ``n_edits`` (default: the largest N of that editor × regime)."""
    sel = rows[(rows["group"] == "distortion") & (rows["editor"] == editor) & (rows["regime"] == regime)]
    if sel.empty:
        return pd.DataFrame()
    n = n_edits if n_edits is not None else int(sel["n_edits"].max())
    sel = sel[sel["n_edits"] == n]
    out = sel.assign(cov=base_covs(sel["cov"])).pivot_table(index="cov", columns="metric", values="value",
                                                             aggfunc="mean")
    out.columns.name = None
    return out.reset_index()


def wide_pm(rows: pd.DataFrame, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`wide`'s layout holding each cell's half 95 % interval (``(hi - lo) / 2``; over several edit
    samples the per-sample half-widths combined as ``√Σh²/k``, the half-width of a mean of independent
    edit samples)."""
    if rows.empty or "lo" not in rows.columns:
        return pd.DataFrame()
    r = rows.assign(value=((rows["hi"] - rows["lo"]) / 2) ** 2)
    sq = wide(r, groups)
    index = ["profile", "model", "editor", "regime", "cov", "n_edits", "edit_sample"]
    cols = [c for c in sq.columns if c not in index]
    return sq.assign(**{c: np.sqrt(sq[c]) for c in cols})


def halves(rows: pd.DataFrame, by: Sequence[str], groups: Sequence[str] = ("edit", "preservation")
           ) -> pd.DataFrame:
    """Half 95 % intervals of the means over edit samples of :func:`wide`, grouped ``by`` (e.g. ``["cov"]``):
    ``√Σh²/k`` of the ``k`` edit samples' half-widths; indexed by ``by``, one column per metric."""
    hw = wide_pm(rows, groups)
    if hw.empty:
        return pd.DataFrame()
    index = ("profile", "model", "editor", "regime", "cov", "n_edits", "edit_sample")
    cols = [c for c in hw.columns if c not in index]
    sq = (hw[cols] ** 2).assign(**{b: hw[b] for b in by}).groupby(list(by))
    return np.sqrt(sq.sum(min_count=1)).div(sq.size(), axis=0)


def pm(values: pd.DataFrame, halves: pd.DataFrame, columns: Sequence[str], digits: int = 2) -> pd.DataFrame:
    """``values`` with ``columns`` as ``0.62 ± 0.05`` strings (``halves``: the same layout of half-widths;
    a missing half-width shows the value alone)."""
    out = values.copy().astype({c: object for c in columns if c in values.columns})
    for c in columns:
        if c not in values.columns:
            continue
        h = halves[c] if c in halves.columns else pd.Series(np.nan, index=values.index)
        out[c] = [("–" if not math.isfinite(float(v)) else
                   f"{float(v):.{digits}f} ± {float(e):.{digits}f}" if math.isfinite(float(e)) else
                   f"{float(v):.{digits}f}") for v, e in zip(values[c], h.reindex(values.index), strict=True)]
    return out


def styled(frame: pd.DataFrame, caption: str | None = None, digits: int = 3) -> Any:
    """A table for the book: numbers to ``digits`` places, missing values as "–", no index."""
    sty = frame.style.format(precision=digits, na_rep="–").hide(axis="index")
    return sty.set_caption(caption) if caption else sty


def fmt(x: Any, digits: int = 3) -> str:
    """A number to ``digits`` places for the closing texts; "n/a" when missing or not finite."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if not math.isfinite(v) else f"{v:.{digits}f}"


def json_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as ``summary.json`` JSON rows (NaN as None, numpy scalars as Python numbers)."""
    return [{str(k): json_value(v) for k, v in r.items()} for r in frame.to_dict("records")]


def edits_take(es: float) -> bool:
    """Whether a mean ES meets the editability gate (:data:`~moir_lib.experiments.gates.ES_GATE`):
    only then may a chapter call a claim about preservation *reproduced*."""
    return bool(es >= ES_GATE)


def weak_edits_note(edited: pd.DataFrame) -> str | None:
    """A caveat when the edits do not meet the editability gate (mean ES over the edited rows below
    :data:`~moir_lib.experiments.gates.ES_GATE`), else None."""
    es = edited.loc[edited["metric"] == "ES", "value"].mean()
    if not math.isfinite(es) or edits_take(es):
        return None
    if es < 0.25:
        return (f"**The edits mostly fail.** Mean ES over the edited runs is {es:.2f}, under one edit in "
                f"four (the editability gate asks ≥ {ES_GATE}), so every comparison here is between C's "
                "under weak edits: a C keeps the model intact partly because it barely changes it, and no "
                "claim is called reproduced.")
    return (f"**The edits take only in part.** Mean ES over the edited runs is {es:.2f}, below the "
            f"editability gate ({ES_GATE}): preservation is compared between C's that let different shares "
            "of the edits through, so no claim is called reproduced.")


def scale_note(model_name: str, what: str, organisms: Sequence[int], judged: bool) -> str:
    """The closing texts' *Scale.* note: ``what`` the run is against the paper, and what its verdicts are
    about: this one model, or the ``organisms`` they pool (the first is the one the tables show)."""
    text = f"*Scale.* {model_name}: {what}; "
    if not judged:
        return text + "without per-item scores there is no interval, and nothing is judged."
    if len(organisms) == 1:
        return text + ("the verdicts are about this one model (one training run of its recipe): another "
                       "training run could disagree.")
    k = len(organisms)
    return text + (f"the verdicts pool {k} organisms of the recipe, each editing at the τ / λ its own "
                   "validation split chose: about the recipe the t on their means decides, about these "
                   f"{k} organisms every one must resolve on its own; the tables and figures show organism "
                   f"{organisms[0]}.")
