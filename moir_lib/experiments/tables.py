"""The paper's tables and the figures' data, computed from tidy rows (pure pandas)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.experiments.rows import NONE

#: Display names of the C variants.
COV_LABELS: dict[str, str] = {"wiki": "Wiki", "wiki-subset": "Wiki subset only",
                              "oracle": "Oracle (pretraining mix)", "moir": "Moir", "moir-bos": "Moir-bos",
                              "none": "pre-edit"}
#: Pocket task -> the paper benchmark it stands in for.
PRES_LABELS: dict[str, str] = {"facts": "MMLU", "arith": "GSM8K", "prose": "HellaSwag", "code": "HumanEval",
                               "arith_raw": "GSM8K (raw format)", "MMLU": "MMLU", "GSM8K": "GSM8K",
                               "HellaSwag": "HellaSwag", "WinoGrande": "WinoGrande", "ARC-C": "ARC-C",
                               "HumanEval": "HumanEval"}
#: Pocket domain of each pocket task (for the per-domain NLL and distortion beside it).
TASK_DOMAIN: dict[str, str] = {"facts": "wiki", "arith": "math", "arith_raw": "math", "prose": "web",
                               "code": "code"}


def wide(rows: pd.DataFrame, groups: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per ``profile × model × editor × regime × C × N × seed × λ × τ``, one column per metric
    (``nll:<domain>``, ``distortion:<domain>``, ``cost:<name>`` for those groups)."""
    if rows.empty:
        return pd.DataFrame()
    r = rows if groups is None else rows[rows["group"].isin(groups)]
    r = r.assign(column=np.where(r["group"].isin(["edit", "preservation"]), r["metric"],
                                 r["group"] + ":" + r["metric"]))
    index = ["profile", "model", "editor", "regime", "cov", "n_edits", "seed"]
    out = r.groupby(index + ["column"], dropna=False)["value"].mean().unstack("column")
    out.columns.name = None
    return out.reset_index()


def pres_tasks(rows: pd.DataFrame) -> list[str]:
    """The preservation tasks present, in the paper's order (pocket: facts, arith, prose, code, arith_raw)."""
    present = set(rows.loc[rows["group"] == "preservation", "metric"]) - {"S_p"}
    order = ["facts", "prose", "code", "arith", "arith_raw", "MMLU", "HellaSwag", "WinoGrande", "ARC-C",
             "HumanEval", "GSM8K"]
    return [t for t in order if t in present] + sorted(present - set(order))


def edit_hm_metric(rows: pd.DataFrame) -> str:
    """``S_e``, unless Portability is 0 for every edited run (then ``S_e`` is 0 by definition and the
    curves would say nothing): ``S_e_noport``, the HM of the other four."""
    port = rows[(rows["metric"] == "Portability") & (rows["editor"] != NONE)]["value"].dropna()
    if len(port) and float(port.max()) == 0.0:
        return "S_e_noport"
    return "S_e"


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


def table1(rows: pd.DataFrame, n_edits: int, covs: Sequence[str] = ("wiki", "wiki-subset", "oracle", "moir"),
           *, editor: str = "memit", regime: str = "batch", vulnerable: int = 2
           ) -> tuple[pd.DataFrame, list[str]]:
    """Table 1's layout for one N: edit metrics (ES PS Effi Gen Spec Flu Con) and the preservation tasks,
    one row per C (mean over seeds), plus the pre-edit row; ``+Δ`` over Wiki on the ``vulnerable`` tasks
    that lost most under C_Wiki (relative to their pre-edit score), returned as the second value.

    Columns: ``C``, the metrics, ``Δ <task>`` for the vulnerable tasks, ``S_e``, ``S_p``.
    """
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime) & (rows["n_edits"] == n_edits)
               & rows["cov"].isin(covs)]
    if sel.empty:
        return pd.DataFrame(), []
    w = wide(sel, ["edit", "preservation"]).groupby("cov").mean(numeric_only=True)
    tasks = pres_tasks(sel)
    base = baseline_values(rows)
    names = {"ES": "ES", "PS": "PS", "Efficacy": "Effi", "Generalization": "Gen", "Specificity": "Spec",
             "Fluency*": "Flu", "Portability": "Con"}
    vuln: list[str] = []
    if "wiki" in w.index:
        drops = {t: (base.get(t, math.nan) - w.loc["wiki", t]) / base[t]
                 for t in tasks if base.get(t) and base[t] > 0 and t in w}
        seen: set[str] = set()
        for t, d in sorted(drops.items(), key=lambda kv: -kv[1]):
            domain = TASK_DOMAIN.get(t, t)
            if d > 0 and domain not in seen and len(vuln) < vulnerable:  # distinct domains
                vuln.append(t)
                seen.add(domain)
    out = []
    if base:
        out.append({"C": COV_LABELS["none"], **{names[k]: base.get(k, math.nan) for k in names},
                    **{t: base.get(t, math.nan) for t in tasks}, "S_e": math.nan,
                    "S_p": base.get("S_p", math.nan)})
    for c in covs:
        if c not in w.index:
            continue
        row = {"C": COV_LABELS.get(c, c), **{names[k]: w.loc[c].get(k, math.nan) for k in names},
               **{t: w.loc[c].get(t, math.nan) for t in tasks}}
        for t in vuln:
            row[f"Δ {t}"] = (w.loc[c, t] - w.loc["wiki", t]) if c != "wiki" else math.nan
        row["S_e"] = w.loc[c].get(edit_hm_metric(sel), math.nan)
        row["S_p"] = w.loc[c].get("S_p", math.nan)
        out.append(row)
    return pd.DataFrame(out), vuln


def curves(rows: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Long table for the curve figures: ``editor, regime, cov, n_edits, group, metric, value`` (mean over
    seeds; ``nll``/``distortion``/``cost`` metrics named ``<group>:<metric>``), with the pre-edit value at
    ``N = 0`` for the preservation and NLL metrics of every editor × regime × C present."""
    edited = rows[rows["editor"] != NONE]
    edited = edited.assign(metric=np.where(edited["group"].isin(["edit", "preservation"]), edited["metric"],
                                           edited["group"] + ":" + edited["metric"]))
    if metrics is not None:
        edited = edited[edited["metric"].isin(set(metrics))]
    keys = ["editor", "regime", "cov", "n_edits", "group", "metric"]
    out = edited.groupby(keys, as_index=False)["value"].mean()
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
    """Distortion ``tr(ΔW C_d ΔWᵀ)/tr(W C_d Wᵀ)`` per C (rows) and pocket domain (columns) at ``n_edits``
    (default: the largest N of that editor × regime)."""
    sel = rows[(rows["group"] == "distortion") & (rows["editor"] == editor) & (rows["regime"] == regime)]
    if sel.empty:
        return pd.DataFrame()
    n = n_edits if n_edits is not None else int(sel["n_edits"].max())
    sel = sel[sel["n_edits"] == n]
    out = sel.pivot_table(index="cov", columns="metric", values="value", aggfunc="mean")
    out.columns.name = None
    return out.reset_index()


def seed_ablation(rows: pd.DataFrame, strategies: Sequence[str] = ("rand1", "rand2", "rand3", "rand4", "bos"),
                  *, editor: str = "memit", regime: str = "batch") -> pd.DataFrame:
    """Table 2: per seed strategy, S_e and S_p at every N and their averages; Total = Edit Avg + Pres. Avg.

    The runs are those whose C is ``moir-<strategy>``. Columns ``S_e@N``, ``Edit Avg``, ``S_p@N``,
    ``Pres. Avg``, ``Total``.
    """
    covs = {f"moir-{s}": s for s in strategies}
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime) & rows["cov"].isin(list(covs))]
    if sel.empty:
        return pd.DataFrame()
    hm = edit_hm_metric(sel)
    w = wide(sel, ["edit", "preservation"]).groupby(["cov", "n_edits"]).mean(numeric_only=True).reset_index()
    ns = sorted(w["n_edits"].unique())
    out = []
    for cov, strategy in covs.items():
        g = w[w["cov"] == cov].set_index("n_edits")
        if g.empty:
            continue
        row: dict[str, Any] = {"seed": strategy}
        for n in ns:
            row[f"S_e@{n}"] = g[hm].get(n, math.nan) if hm in g else math.nan
        row["Edit Avg"] = float(np.nanmean([row[f"S_e@{n}"] for n in ns]))
        for n in ns:
            row[f"S_p@{n}"] = g["S_p"].get(n, math.nan) if "S_p" in g else math.nan
        row["Pres. Avg"] = float(np.nanmean([row[f"S_p@{n}"] for n in ns]))
        row["Total"] = row["Edit Avg"] + row["Pres. Avg"]
        out.append(row)
    table = pd.DataFrame(out)
    table.attrs["edit_metric"] = hm
    return table



def finals(rows: pd.DataFrame) -> pd.DataFrame:
    """The last scored point (largest N) of every ``editor × regime × C``, wide (means over seeds)."""
    edited = wide(rows[rows["editor"] != NONE], ["edit", "preservation"])
    if edited.empty:
        return edited
    last = edited.groupby(["editor", "regime", "cov"])["n_edits"].transform("max")
    out = edited[edited["n_edits"] == last]
    return out.groupby(["editor", "regime", "cov"], as_index=False).mean(numeric_only=True)


def paper_table(rows: pd.DataFrame, editor: str, regime: str) -> pd.DataFrame:
    """Tables 6-9: one row per ``N × C`` of a setting with Eff, Gen, Spec, Flu, Port, the edit HM, the
    preservation tasks and S_p (means over seeds)."""
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime)]
    if sel.empty:
        return pd.DataFrame()
    w = wide(sel, ["edit", "preservation"]).groupby(["n_edits", "cov"]).mean(numeric_only=True).reset_index()
    hm = edit_hm_metric(rows)
    names = {"Efficacy": "Eff", "Generalization": "Gen", "Specificity": "Spec", "Fluency*": "Flu",
             "Portability": "Port", hm: "HM (edit)"}
    cols = ["n_edits", "cov"] + [k for k in names if k in w] + pres_tasks(sel)
    cols += ["S_p"] if "S_p" in w else []
    out = w[cols].rename(columns={**names, "n_edits": "N", "cov": "C"})
    return out.sort_values(["N", "C"]).reset_index(drop=True)


def task_baseline(rows: pd.DataFrame) -> dict[str, float]:
    """Pre-edit preservation score per task (means over the baseline rows)."""
    base = rows[(rows["editor"] == NONE) & (rows["group"] == "preservation")]
    return {m: float(v) for m, v in base.groupby("metric")["value"].mean().items()}


def styled(frame: pd.DataFrame, caption: str | None = None, digits: int = 3) -> Any:
    """A table for the book: numbers to ``digits`` places, missing values as "–", no index."""
    sty = frame.style.format(precision=digits, na_rep="–").hide(axis="index")
    return sty.set_caption(caption) if caption else sty
