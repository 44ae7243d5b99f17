"""Chapter 05, "Does C_Moir preserve more?": every editor × regime × C × N on the Lab's rows.

The paper's Tables 6-9 (:func:`paper_table`: edit metrics, the edit harmonic mean S_e eq. (se), the
preservation tasks and S_p eq. (sp)), Table 2 (:func:`seed_ablation`: the seed strategy of C_Moir,
eq. (memoir_estimator)), the last point of every setting for Fig. 6 (:func:`finals`,
:func:`task_baseline`), the chapter's ``summary.json`` headline (:func:`headline`), its closing text
(:func:`findings`) and an ipywidgets explorer of the rows (:func:`explorer`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.chapters.lab_tables import (
    baseline_table,
    baseline_values,
    curves,
    edit_hm_metric,
    edits_take,
    fmt,
    pres_tasks,
    records,
    weak_edits_note,
    wide,
    zero_portability,
)
from moir_lib.evaluation.scores import EDIT_SCORES
from moir_lib.experiments.editability import ES_GATE
from moir_lib.experiments.rows import NONE, clean, json_value

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "05_editing"


def _mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def seed_ablation(rows: pd.DataFrame, strategies: Sequence[str] = ("rand1", "rand2", "rand3", "rand4", "bos"),
                  *, editor: str = "memit", regime: str = "batch", edit_metric: str | None = None
                  ) -> pd.DataFrame:
    """Table 2: per seed strategy, S_e and S_p at every N and their averages; Total = Edit Avg + Pres. Avg.

    The runs are those whose C is ``moir-<strategy>``. Columns ``S_e@N``, ``Edit Avg``, ``S_p@N``,
    ``Pres. Avg``, ``Total``. ``edit_metric``: the chapter's edit score (:func:`edit_hm_metric` of all
    its rows); by default decided on these runs alone.
    """
    covs = {f"moir-{s}": s for s in strategies}
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime) & rows["cov"].isin(list(covs))]
    if sel.empty:
        return pd.DataFrame()
    hm = edit_metric or edit_hm_metric(sel)
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
        row["Edit Avg"] = _mean([row[f"S_e@{n}"] for n in ns])
        for n in ns:
            row[f"S_p@{n}"] = g["S_p"].get(n, math.nan) if "S_p" in g else math.nan
        row["Pres. Avg"] = _mean([row[f"S_p@{n}"] for n in ns])
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


def headline(rows: pd.DataFrame, ablation: pd.DataFrame, tables: Mapping[str, pd.DataFrame]
             ) -> dict[str, Any]:
    """``summary.json`` headline of chapter 05 (plain JSON): the baseline, the final point of every setting,
    the C_Moir - C_Wiki gaps, Table 2 (``ablation``) and the paper's Tables 6-9 (``tables``, by setting)."""
    hm = edit_hm_metric(rows)
    head: dict[str, Any] = {"edit_metric": hm, "baseline": records(baseline_table(rows))}
    edited = wide(rows[rows["editor"] != NONE], ["edit", "preservation"])
    last_points = []
    gaps = []
    if not edited.empty:
        for (e, r), g in edited.groupby(["editor", "regime"]):
            n = int(g["n_edits"].max())
            last = g[g["n_edits"] == n].groupby("cov").mean(numeric_only=True)
            for c in last.index:
                last_points.append({"editor": e, "regime": r, "cov": c, "n_edits": n,
                                    "S_e": json_value(last.loc[c].get(hm)),
                                    "S_p": json_value(last.loc[c].get("S_p"))})
            if {"wiki", "moir"} <= set(g["cov"]):
                mean = g.groupby("cov").mean(numeric_only=True)
                gaps.append({"editor": e, "regime": r,
                             "S_p_moir_minus_wiki": json_value(mean.loc["moir"].get("S_p", math.nan)
                                                                - mean.loc["wiki"].get("S_p", math.nan)),
                             "S_e_moir_minus_wiki": json_value(mean.loc["moir"].get(hm, math.nan)
                                                                - mean.loc["wiki"].get(hm, math.nan))})
    head["final"] = last_points
    head["moir_vs_wiki"] = gaps
    if gaps:
        vals = [g["S_p_moir_minus_wiki"] for g in gaps if g["S_p_moir_minus_wiki"] is not None]
        head["mean_S_p_gain_moir_over_wiki"] = json_value(np.nanmean(vals)) if vals else None
    head["seed_ablation"] = records(ablation) if not ablation.empty else []
    if not ablation.empty:
        head["best_seed"] = str(ablation.sort_values("Total", ascending=False)["seed"].iloc[0])
    head["tables"] = {name: table.to_dict("records") for name, table in tables.items()}
    return clean(head)


def findings(rows: pd.DataFrame, ablation: pd.DataFrame, model_name: str = "pocket") -> str:
    """The closing text of chapter 05, written from the measured numbers."""
    hm = edit_hm_metric(rows)
    edited = rows[rows["editor"] != NONE]
    if edited.empty:
        return "No edited runs: nothing to compare."
    lines = []
    if hm != "S_e":
        zeros, runs = zero_portability(rows)
        lines.append(f"*Edit score.* Portability is 0 in {zeros} of {runs} edited runs (the two-hop "
                     "probes are hardly ever answered with the new object), which makes S_e = 0 there by "
                     "definition; the curves and tables use the harmonic mean of the other four "
                     "constituents (S_e without Portability) instead, and show Portability beside it.")
    w = wide(edited, ["edit", "preservation"])
    base = baseline_values(rows)
    tasks = pres_tasks(rows)
    verdicts = [_moir_vs_wiki(e, r, g, hm, tasks) for (e, r), g in w.groupby(["editor", "regime"])
                if {"wiki", "moir"} <= set(g["cov"])]
    weak_note = weak_edits_note(edited)
    if weak_note is not None and not any(judged for judged, _ in verdicts):
        lines.append(weak_note)  # no setting has an N where the edits take: nothing is judged
    lines += [text for _, text in verdicts]
    # asymmetry across domains under wiki
    wiki = w[w["cov"] == "wiki"]
    if len(wiki) and base:
        last = wiki[wiki["n_edits"] == wiki["n_edits"].max()].mean(numeric_only=True)
        rel = {t: last.get(t, math.nan) / base[t] for t in tasks if base.get(t) and base[t] > 0}
        rel = {t: v for t, v in rel.items() if math.isfinite(v)}
        if rel:
            worst, best = min(rel, key=rel.get), max(rel, key=rel.get)
            lines.append(f"**Asymmetric collapse.** Under C_Wiki at the largest N, *{worst}* keeps "
                         f"{rel[worst]:.0%} of its pre-edit score and *{best}* {rel[best]:.0%}: the collapse "
                         + ("is asymmetric across domains, as in the paper's radar charts."
                            if rel[best] - rel[worst] > 0.3 else "is not strongly asymmetric here."))
    if not ablation.empty:
        lines.append(_seed_ablation_text(ablation))
    lines.append(f"*Scale.* {model_name}: edit counts of tens to hundreds instead of thousands, preservation "
                 "tasks of the run's `pres_limit` items, one seed unless more were asked for; read "
                 "differences of a few hundredths as noise.")
    return "\n\n".join(lines)


def _seed_ablation_text(ablation: pd.DataFrame) -> str:
    """Table 2's sentence: the best Total, which half of the paper's ordering (rand×1 best, bos last)
    holds, and, where bos is not last, whether preservation or the edit average puts it ahead."""
    by_seed = ablation.set_index("seed")
    total = by_seed["Total"]
    best, worst = total.idxmax(), total.idxmin()
    text = f"**Seed ablation (Table 2).** The best Total is {best} ({fmt(total[best])}); "
    if not {"rand1", "bos"} <= set(total.index):
        return text + "the paper's ordering (rand×1 best, bos last) needs both seeds."
    text += f"rand1 {fmt(total['rand1'])} vs bos {fmt(total['bos'])}. "
    if best == "rand1" and worst == "bos":
        return text + "The paper's ordering (rand×1 best, bos last) holds."
    if worst == "bos":
        return text + (f"bos is last, as in the paper, but {best} rather than rand1 is first (the "
                       "paper's rand×k differ by little; read a few hundredths as noise).")
    text += "The paper's ordering (rand×1 best, bos last) does not hold here: bos is not last. "
    pres, edit = by_seed["Pres. Avg"], by_seed["Edit Avg"]
    if pres.idxmin() == "bos":  # bos is ahead through the edit average alone
        others = pres.drop("bos")
        zero = [s for s in total.index if s != "bos" and total[s] < total["bos"] and edit[s] == 0]
        return text + (f"On preservation alone bos is last (Pres. Avg {fmt(pres['bos'])}, the others "
                       f"{fmt(others.min())}-{fmt(others.max())}); it moves up on the edit average"
                       + (f", where {', '.join(zero)} score{'s' if len(zero) == 1 else ''} 0: S_e is a "
                          "harmonic mean, which one component at 0 zeroes" if zero else "") + ".")
    return text + ("In the pocket world BOS-seeded samples can fall into the chat template that the "
                   "arithmetic test also uses, so C_Moir-bos protects chat arithmetic directly "
                   "(a C protects the distribution it was sampled from).")


def _moir_vs_wiki(editor: str, regime: str, g: pd.DataFrame, hm: str, tasks: Sequence[str]
                  ) -> tuple[bool, str]:
    """``(judged, text)``: one setting's C_Moir against C_Wiki (``g``: its wide rows), judged only at
    the N where the edits take under both C's (mean ES ≥ the editability gate); other N are shown."""
    pair = g[g["cov"].isin(["wiki", "moir"])]
    es_n = (pair.groupby(["n_edits", "cov"])["ES"].mean().unstack().min(axis=1) if "ES" in pair
            else pd.Series(dtype=float))
    taking = [int(n) for n, es in es_n.items() if edits_take(es)]
    mean = (g[g["n_edits"].isin(taking)] if taking else g).groupby("cov").mean(numeric_only=True)
    dp = mean.loc["moir"].get("S_p", math.nan) - mean.loc["wiki"].get("S_p", math.nan)
    de = mean.loc["moir"].get(hm, math.nan) - mean.loc["wiki"].get(hm, math.nan)
    n = max(taking) if taking else int(g["n_edits"].max())
    last = g[g["n_edits"] == n].groupby("cov").mean(numeric_only=True)
    per_task = ", ".join(f"*{t}* {fmt(last.loc['wiki'].get(t), 2)} vs {fmt(last.loc['moir'].get(t), 2)}"
                         for t in tasks if t in last.columns)
    where = (f"At N = {', '.join(map(str, taking))}, where the edits take under both C's (ES ≥ {ES_GATE})"
             if taking else "Averaged over N")
    text = (f"**{'MEMIT' if editor == 'memit' else 'AlphaEdit'}, {regime}.** {where}, C_Moir changes S_p by "
            f"{dp:+.3f} and {'S_e' if hm == 'S_e' else 'the edit HM'} by {de:+.3f} against C_Wiki. "
            f"At N = {n} (Wiki vs Moir): {per_task}. The paper's claim that C_Moir extends preservation "
            "without costing edit quality is ")
    if not taking:
        best = float(es_n.max()) if len(es_n) else math.nan
        return False, text + ("not testable here: its edits miss the editability gate at every N "
                              f"(best mean ES {best:.2f} < {ES_GATE}).")
    text += ("reproduced here." if dp > 0.01 and de > -0.05 else
             "only half reproduced here: preservation improves but edits suffer." if dp > 0.01 else
             "not reproduced here.")
    if de <= -0.05:
        text += _edit_loss(mean, hm)
    missed = {int(k): v for k, v in es_n.items() if int(k) not in taking}
    if missed:
        text += (" Not judged: " + ", ".join(f"N = {k} (ES {v:.2f})" for k, v in missed.items())
                 + ", where the edits miss the gate.")
    return True, text


def _edit_loss(mean: pd.DataFrame, hm: str) -> str:
    """Which constituent of the edit score ``hm`` (S_e, eq. (se), or S_e without Portability) C_Moir
    loses most against C_Wiki (``mean``: rows per C), and why, for Specificity."""
    drops = {m: mean.loc["moir", m] - mean.loc["wiki", m] for m in EDIT_SCORES[hm] if m in mean.columns}
    drops = {m: d for m, d in drops.items() if not math.isnan(d)}
    if not drops:
        return ""
    worst = min(drops, key=drops.__getitem__)
    text = (f" The largest loss is {worst} ({mean.loc['wiki', worst]:.2f} under C_Wiki, "
            f"{mean.loc['moir', worst]:.2f} under C_Moir)")
    if worst != "Specificity":
        return text + "."
    return text + (": the neighbourhood prompts are encyclopedic sentences about other subjects, the "
                   "distribution C_Wiki is sampled from, so C_Wiki shields them from the edit and C_Moir, "
                   "sampled from the model's own generations, less (a C protects the distribution it was "
                   "sampled from).")


def explorer(rows: pd.DataFrame) -> Any:
    """ipywidgets controls (model, editor, regime, view) over the tidy rows, for JupyterLab; a headless
    run (the book) shows the first view as a static figure (:func:`moir_lib.widgets.explorer`). The
    figures come from :mod:`moir_lib.plots`."""
    import ipywidgets as widgets

    from moir_lib import plots
    from moir_lib.widgets import explorer as widget_explorer

    edited = rows[rows["editor"] != NONE]
    model = widgets.Dropdown(options=sorted(set(edited["model"])) or ["-"], description="model")
    editor = widgets.Dropdown(options=sorted(set(edited["editor"])) or ["-"], description="editor")
    regime = widgets.Dropdown(options=["all", *sorted(set(edited["regime"]))], description="regime")
    view = widgets.ToggleButtons(options=["harmonic means", "per task", "radar"], description="view")

    hm = edit_hm_metric(rows)  # one edit score for every view

    def figure() -> Any:
        sel = rows[(rows["model"] == model.value) | (rows["editor"] == NONE)]
        if regime.value != "all":
            sel = sel[(sel["regime"] == regime.value) | (sel["editor"] == NONE)]
        if view.value == "harmonic means":
            return plots.edit_hm_curves(curves(sel), editor.value, hm)
        if view.value == "per task":
            return plots.edit_task_curves(curves(sel), editor.value)
        fin = finals(sel)
        return plots.edit_radar(fin[fin["editor"] == editor.value], task_baseline(sel))

    return widget_explorer([[model, editor, regime], [view]], figure)
