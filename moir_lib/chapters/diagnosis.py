"""Chapter 01, "Which distribution should C protect?": Table 1 and Fig. 2 of the paper on the Lab's rows.

:func:`table1` lays out MEMIT batch editing with each C (edit metrics, the preservation tasks, S_e
eq. (se) and S_p eq. (sp), ``+Δ`` over Wiki on the most vulnerable tasks); :func:`headline` is the
chapter's ``summary.json`` headline and :func:`findings` its closing text, written from the measured
numbers: the collapse under C_Wiki, the rescue by other C's, edit quality, the mechanism (the output
distortion of each domain) and the sequential regime. :func:`claims` judges Table 1's Δ's (each C
against C_Wiki on the vulnerable tasks, ``S_p`` and the edit score) by paired 95 % intervals over the
edit-sample seeds, and the closing text states their verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.chapters.lab_tables import (
    COV_LABELS,
    PRES_LABELS,
    baseline_values,
    distortion_table,
    edit_hm_metric,
    fmt,
    halves,
    pm,
    pres_tasks,
    records,
    weak_edits_note,
    wide,
)
from moir_lib.chapters.verdicts import Claim, claim_records, gate, paired
from moir_lib.experiments.rows import NONE, json_value

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "01_diagnosis"
#: Pocket domain of each pocket task (for the per-domain NLL and distortion beside it).
TASK_DOMAIN: dict[str, str] = {"facts": "wiki", "arith": "math", "arith_raw": "math", "prose": "web",
                               "code": "code"}


def table1(rows: pd.DataFrame, n_edits: int, covs: Sequence[str] = ("wiki", "wiki-subset", "oracle", "moir"),
           *, editor: str = "memit", regime: str = "batch", vulnerable: int = 2, with_pm: bool = False
           ) -> tuple[pd.DataFrame, list[str]]:
    """Table 1's layout for one N: edit metrics (ES PS Effi Gen Spec Flu Con) and the preservation tasks,
    one row per C (mean over seeds), plus the pre-edit row; ``+Δ`` over Wiki on the ``vulnerable`` tasks
    that lost most under C_Wiki (relative to their pre-edit score), returned as the second value.

    Columns: ``C``, the metrics, ``Δ <task>`` for the vulnerable tasks, ``S_e``, ``S_p``. ``with_pm``: the
    cells as ``0.62 ± 0.05`` (half the 95 % interval; the Δ's intervals are :func:`claims`').
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
    hm = edit_hm_metric(rows)  # the chapter's edit score, decided on all its rows
    for c in covs:
        if c not in w.index:
            continue
        row = {"C": COV_LABELS.get(c, c), **{names[k]: w.loc[c].get(k, math.nan) for k in names},
               **{t: w.loc[c].get(t, math.nan) for t in tasks}}
        for t in vuln:
            row[f"Δ {t}"] = (w.loc[c, t] - w.loc["wiki", t]) if c != "wiki" else math.nan
        row["S_e"] = w.loc[c].get(hm, math.nan)
        row["S_p"] = w.loc[c].get("S_p", math.nan)
        out.append(row)
    table = pd.DataFrame(out)
    if with_pm and not table.empty:
        both = pd.concat([sel, rows[rows["editor"] == NONE]], ignore_index=True)
        h = halves(both, ["cov"])
        if hm != "S_e":  # the table's S_e column is the chapter's edit score
            h = h.drop(columns=[c for c in ("S_e",) if c in h.columns])
        h = h.rename(columns={**names, hm: "S_e"})
        h.index = [COV_LABELS.get(c, c) for c in h.index]
        cells = [c for c in table.columns if c != "C" and not c.startswith("Δ ")]
        table = pm(table, h.reindex(index=table["C"]).reset_index(drop=True), cells)
    return table, vuln


def claims(rows: pd.DataFrame, items: pd.DataFrame, specs: Sequence[Any], vulnerable: Sequence[str],
           n_edits: int, covs: Sequence[str] = ("oracle", "moir")) -> list[Claim]:
    """Table 1's Δ's as claims: each C in ``covs`` minus C_Wiki (MEMIT batch at ``n_edits``, paired on the
    same records and items per edit-sample seed) on every vulnerable task and ``S_p`` (the paper: the
    oracle and C_Moir rescue what C_Wiki collapses, direction +1), and on the edit score (the paper: at
    little edit cost; direction +1, so a resolved loss reads *reversed*). The gate: the edits take under
    both C's."""
    from moir_lib.chapters.lab_tables import edit_hm_metric

    hm = edit_hm_metric(rows)
    by = {(s.cov, int(s.seed)): s for s in specs if s.editor == "memit" and s.regime == "batch"
          and s.n_edits == n_edits}
    out: list[Claim] = []
    for c in covs:
        seeds = sorted(k for (cv, k) in by if cv == c and ("wiki", k) in by)
        if not seeds:
            continue
        a, b = [by[(c, k)] for k in seeds], [by[("wiki", k)] for k in seeds]
        ok = gate(rows, a) and gate(rows, b)
        label = COV_LABELS.get(c, c).split(" (")[0]
        where = f"N = {n_edits}, {len(seeds)} seed(s)"
        for t in [*vulnerable, "S_p"]:
            what = f"{PRES_LABELS.get(t, t)} better" if t != "S_p" else "more"
            out.append(Claim(f"C_{label} preserves {what} than C_Wiki", f"Δ {t} {label} − Wiki ({where})",
                             paired(items, a, b, t), +1, ok, CHAPTER))
        out.append(Claim(f"C_{label} keeps the edits' quality", f"Δ {'S_e' if hm == 'S_e' else 'edit HM'} "
                         f"{label} − Wiki ({where})", paired(items, a, b, hm), +1, ok, CHAPTER))
    return out


def headline(t1: pd.DataFrame, vulnerable: Sequence[str], rows: pd.DataFrame, n_edits: int,
             judged: Sequence[Claim] = ()) -> dict[str, Any]:
    """``summary.json`` headline of chapter 01: Table 1 as records, the vulnerable tasks, key numbers and
    the ``claims`` (``judged``: :func:`claims`) with intervals and verdicts."""
    head: dict[str, Any] = {"n_edits": n_edits, "table1": records(t1), "vulnerable": list(vulnerable),
                            "claims": claim_records(judged, CHAPTER)}
    if not t1.empty:
        by = t1.set_index("C")
        for c in ("wiki", "wiki-subset", "oracle", "moir"):
            label = COV_LABELS[c]
            if label in by.index:
                for col in ("ES", "S_p", *vulnerable):
                    if col in by.columns:
                        head[f"{c}_{col}"] = json_value(by.loc[label, col])
    seq = rows[(rows["regime"] == "sequential") & (rows["group"] == "preservation")]
    if len(seq):
        head["sequential_max_n"] = int(seq["n_edits"].max())
    return head


def _verdict(ok: bool) -> str:
    return "reproduces" if ok else "does not reproduce"


def _g(x: Any) -> str:
    """Two significant digits (for ratios spanning orders of magnitude)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if not math.isfinite(v) else f"{v:.2g}"


def _collapse(by: pd.DataFrame, base: dict[str, float], tasks: Sequence[str], n_edits: int) -> str | None:
    """Finding 1: which tasks collapse under C_Wiki (shares of their pre-edit scores)."""
    wiki = COV_LABELS["wiki"]
    rel = {t: by.loc[wiki, t] / base[t] for t in tasks if base.get(t) and base[t] > 0 and t in by.columns}
    rel = {t: v for t, v in rel.items() if math.isfinite(v)}
    if not rel:
        return None
    held = [t for t, v in rel.items() if v >= 0.8]
    fell = [t for t, v in rel.items() if v < 0.5]
    asym = bool(held and fell)
    shares = ", ".join(f"*{t}* ({PRES_LABELS.get(t, t)}) {fmt(base[t], 2)} → {fmt(by.loc[wiki, t], 2)} "
                       f"({rel[t]:.0%})" for t in sorted(rel, key=rel.get))
    text = (f"**Collapse under C_Wiki.** After {n_edits} MEMIT edits the tasks keep these shares of "
            f"their pre-edit scores: {shares}. ")
    if asym:
        text += (f"The collapse is asymmetric, as in the paper: {', '.join(fell)} fall below half while "
                 f"{', '.join(held)} hold.")
    elif fell:
        text += (f"{', '.join(fell)} fall below half, but no task keeps 80 % of its score (the paper's "
                 "encyclopedic tasks do): here the damage reaches every domain.")
    elif held:
        text += "No task falls below half of its score: no collapse to read at this N."
    else:
        text += "Every task keeps between half and 80 % of its score: the damage is even across domains."
    for t, label in (("code", "HumanEval"), ("arith", "GSM8K")):
        if t in rel and rel[t] >= 0.8:
            text += (f" Unlike the paper's {label}, *{t}* does not collapse here (its pre-edit score is "
                     f"{fmt(base[t], 2)}).")
    ceiling = [t for t in rel if base[t] >= 0.95]
    if ceiling:
        values = ", ".join(fmt(base[t], 2) for t in ceiling)
        verb = "starts" if len(ceiling) == 1 else "start"
        text += (f" {', '.join(ceiling)} {verb} at the ceiling ({values}): too easy to register damage "
                 f"at this scale.")
    return text


def _rescue(by: pd.DataFrame, vulnerable: Sequence[str]) -> list[str]:
    """Finding 2: the oracle, the wiki subset and Moir against Wiki on the vulnerable tasks."""
    wiki, oracle, moir = (COV_LABELS[c] for c in ("wiki", "oracle", "moir"))
    subset = COV_LABELS["wiki-subset"]
    if not vulnerable:
        return []
    lines = []
    deltas = {}
    for label in (subset, oracle, moir):
        if label in by.index:
            deltas[label] = {t: by.loc[label, t] - by.loc[wiki, t] for t in vulnerable}
    if deltas:
        lines.append("**+Δ over Wiki on the most vulnerable tasks** (" + ", ".join(vulnerable) + "): "
                     + "; ".join(f"{k} " + ", ".join(f"{t} {v:+.2f}" for t, v in d.items())
                                 for k, d in deltas.items()) + ".")
    if oracle in deltas:
        gain = float(np.nanmean(list(deltas[oracle].values())))
        cost = by.loc[oracle].get("ES", math.nan) - by.loc[wiki].get("ES", math.nan)
        lines.append(f"The paper's oracle lifts its vulnerable domains by +.10 (HumanEval) and +.13 "
                     f"(GSM8K) at a small edit cost. Here the pocket oracle gains {gain:+.2f} on average "
                     f"at an ES change of {cost:+.2f}: the pocket world {_verdict(gain > 0.02)} the "
                     f"oracle's rescue.")
    if subset in deltas:
        gap = float(np.nanmean([abs(v) for v in deltas[subset].values()]))
        lines.append(f"The wiki-subset C (an independent sample of the same encyclopedic stream) stays "
                     f"within {gap:.2f} of Wiki on those tasks: "
                     + ("as in the paper, the kind of data, not the particular source, decides what "
                        "collapses." if gap < 0.1 else
                        "more than sampling noise, unlike the paper's conclusion."))
    if moir in deltas and oracle in deltas:
        gm = float(np.nanmean(list(deltas[moir].values())))
        go_ = float(np.nanmean(list(deltas[oracle].values())))
        sp_m, sp_o = by.loc[moir].get("S_p", math.nan), by.loc[oracle].get("S_p", math.nan)
        lines.append(f"C_Moir, built without any training data, gains {gm:+.2f} on the vulnerable tasks "
                     f"against the oracle's {go_:+.2f} (S_p {fmt(sp_m)} vs {fmt(sp_o)}): "
                     + ("competitive with the oracle, as the paper reports."
                        if gm >= go_ - 0.1 else "behind the oracle here."))
    return lines


def _edit_quality(by: pd.DataFrame) -> str | None:
    """Finding 3: the edits themselves (ES per C, portability)."""
    if "ES" not in by.columns:
        return None
    labels = [COV_LABELS[c] for c in ("wiki", "wiki-subset", "oracle", "moir")]
    es = {lab: by.loc[lab, "ES"] for lab in labels if lab in by.index}
    text = ("**Edit quality.** ES: " + ", ".join(f"{k} {fmt(v, 2)}" for k, v in es.items())
            + " (the paper's Wiki row: .96). ")
    if max(es.values()) < 0.6:
        text += ("The edits take only partly on the pocket model at this N, so every C is compared at a "
                 "low efficacy. ")
    con = by["Con"].drop(COV_LABELS["none"], errors="ignore") if "Con" in by.columns else None
    if con is not None and con.fillna(0).max() == 0:
        text += "Con (portability) is 0 for every C: the two-hop probes never follow the new fact. "
    text += ("A C that protects more directions leaves fewer for the edit: compare preservation at "
             "matched efficacy (λ per C) before crediting one.")
    return text


def _mechanism(rows: pd.DataFrame, n_edits: int) -> str | None:
    """Finding 4: the relative change of each domain's ``down_proj`` output (the distortion table)."""
    dist = distortion_table(rows, n_edits)
    if dist.empty:
        return None
    d = dist.set_index("cov")
    parts = [f"{COV_LABELS[c]} " + ", ".join(f"{x} {_g(d.loc[c, x])}" for x in d.columns)
             for c in ("wiki", "oracle", "moir") if c in d.index]
    own = [c for c in ("wiki",) if c in d.index and "wiki" in d.columns
           and d.loc[c, "wiki"] == d.loc[c].min()]
    return ("**Mechanism.** The relative change of the edited layers' output on each domain's keys, "
            "tr(ΔW C_d ΔWᵀ)/tr(W C_d Wᵀ): " + "; ".join(parts) + ". "
            + ("C_Wiki moves the encyclopedic outputs least and the others by far more; "
               if own else "")
            + "the tasks that collapse are those whose domain's outputs move most: *a C protects "
              "the distribution it was sampled from*.")


def _sequential(rows: pd.DataFrame, base: dict[str, float], tasks: Sequence[str]) -> str | None:
    """Finding 5: the preservation tasks after the last sequential edit with C_Wiki (Fig. 2)."""
    seq = rows[(rows["regime"] == "sequential") & (rows["group"] == "preservation") & (rows["cov"] == "wiki")]
    if not len(seq):
        return None
    n_max = int(seq["n_edits"].max())
    last = seq[seq["n_edits"] == n_max].groupby("metric")["value"].mean()
    parts = [f"*{t}* {fmt(base.get(t), 2)} → {fmt(last.get(t), 2)}" for t in tasks if t in last]
    zero = [t for t in tasks if t in last and base.get(t) and last[t] == 0]
    return (f"**Sequential editing (Fig. 2).** After {n_max} sequential edits with C_Wiki: "
            + ", ".join(parts) + "."
            + (f" {', '.join(zero)} reach zero: the damage compounds edit after edit." if zero else ""))


def findings(t1: pd.DataFrame, vulnerable: Sequence[str], rows: pd.DataFrame, n_edits: int,
             model_name: str = "pocket", judged: Sequence[Claim] = ()) -> str:
    """The closing text of chapter 01, written from the measured numbers: a caveat when the edits do
    not take, one paragraph per finding (collapse under C_Wiki, the rescue by other C's, edit quality,
    the mechanism, the sequential regime), then the scale of the run."""
    if t1.empty:
        return "No batch results: nothing to compare."
    by = t1.set_index("C")
    base = baseline_values(rows)
    tasks = pres_tasks(rows)
    if COV_LABELS["wiki"] not in by.index:
        return "C_Wiki did not run: Table 1 has no reference row."
    paragraphs = [weak_edits_note(rows[rows["editor"] != NONE]), _collapse(by, base, tasks, n_edits),
                  *_rescue(by, vulnerable), _edit_quality(by), _mechanism(rows, n_edits),
                  _sequential(rows, base, tasks)]
    lines = [text for text in paragraphs if text]
    if judged:
        lines.append("**Verdicts (paired 95 % intervals over the shared records and items).** "
                     + "; ".join(c.sentence() for c in judged) + ".")
    lines.append(f"*Scale.* {model_name} is a small model of a synthetic world, edited {n_edits} times "
                 "where the paper edits 2,000 facts into 7-8B models; "
                 + ("the verdicts above say which differences the run's sample sizes resolve."
                    if judged else "without per-item scores there is no interval: read differences of a "
                    "few hundredths as noise."))
    return "\n\n".join(lines)
