"""Chapter 05, "Does C_Moir preserve more?": every editor × regime × C × N on the Lab's rows.

The paper's Tables 6-9 (:func:`paper_table`: edit metrics, the edit harmonic mean S_e eq. (se), the
preservation tasks and S_p eq. (sp)), Table 2 (:func:`seed_ablation`: the seed strategy of C_Moir,
eq. (memoir_estimator)), the last point of every setting for Fig. 6 (:func:`finals`,
:func:`task_baseline`), the chapter's ``summary.json`` headline (:func:`headline`), its closing text
(:func:`findings`) and an ipywidgets explorer of the rows (:func:`explorer`). :func:`claims` judges the
chapter's claims by paired 95 % intervals on the Lab's items (C_Moir against C_Wiki per setting, Table 2's
rand×1 against bos), and the closing text states those verdicts.
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
    halves,
    pm,
    pres_tasks,
    records,
    weak_edits_note,
    wide,
    zero_portability,
)
from moir_lib.chapters.verdicts import Claim, claim_records, gate, paired, paired_sum
from moir_lib.evaluation.scores import EDIT_SCORES
from moir_lib.experiments.gates import ES_GATE
from moir_lib.experiments.rows import NONE, clean, json_value

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "05_editing"


def _mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def seed_ablation(rows: pd.DataFrame, strategies: Sequence[str] = ("rand1", "rand2", "rand3", "rand4", "bos"),
                  *, editor: str = "memit", regime: str = "batch", edit_metric: str | None = None,
                  with_pm: bool = False) -> pd.DataFrame:
    """Table 2: per seed strategy, S_e and S_p at every N and their averages; Total = Edit Avg + Pres. Avg.

    The runs are those whose C is ``moir-<strategy>``. Columns ``S_e@N``, ``Edit Avg``, ``S_p@N``,
    ``Pres. Avg``, ``Total``. ``edit_metric``: the chapter's edit score (:func:`edit_hm_metric` of all
    its rows); by default decided on these runs alone. ``with_pm``: the per-N cells as ``0.62 ± 0.05``
    (display only; the ordering's interval is :func:`claims`' paired Total).
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
    if with_pm and not table.empty:
        h = halves(sel, ["cov", "n_edits"])
        hw = pd.DataFrame([{"seed": covs[c], **{f"{'S_e' if m == hm else 'S_p'}@{n}": h.loc[(c, n), m]
                                                for n in ns for m in (hm, "S_p")
                                                if (c, n) in h.index and m in h.columns}}
                           for c in covs if c in set(w["cov"])])
        cells = [c for c in table.columns if "@" in c]
        table = pm(table.round(6), table[["seed"]].merge(hw, on="seed", how="left"), cells)
        table = pm(table, pd.DataFrame(index=table.index), ["Edit Avg", "Pres. Avg", "Total"])
    return table


def _by_point(specs: Sequence[Any]) -> dict[tuple[str, str, str, int], dict[int, Any]]:
    """``(editor, regime, cov, n) -> {seed: spec}`` over every scored point of ``specs``."""
    out: dict[tuple[str, str, str, int], dict[int, Any]] = {}
    for s in specs:
        for n in s.points:
            out.setdefault((s.editor, s.regime, s.cov, int(n)), {})[int(s.seed)] = s
    return out


def claims(rows: pd.DataFrame, items: pd.DataFrame, specs: Sequence[Any], ablation_specs: Sequence[Any] = (),
           edit_metric: str = "S_e", ablation_seeds: Sequence[str] = ()) -> list[Claim]:
    """The chapter's claims, each a paired difference on ``items`` over the edit-sample seeds:
    per editor × regime with both C's, ``S_p`` and the edit score of C_Moir minus C_Wiki at the largest N
    where the edits take under both (else the largest N, gate failed); Table 2's Total (mean over N of the
    edit score plus mean over N of ``S_p``) of rand×1 minus bos."""
    points = _by_point(specs)
    out: list[Claim] = []
    settings = dict.fromkeys((e, r) for e, r, _, _ in points)
    for e, r in settings:
        ns = sorted(n for (e2, r2, c, n) in points if (e2, r2, c) == (e, r, "moir")
                    and (e, r, "wiki", n) in points)
        if not ns:
            continue
        def pair(n: int, e: str = e, r: str = r) -> tuple[list[Any], list[Any]]:
            m, w = points[(e, r, "moir", n)], points[(e, r, "wiki", n)]
            seeds = sorted(set(m) & set(w))
            return [m[k] for k in seeds], [w[k] for k in seeds]

        taking = [n for n in ns if gate(rows, pair(n)[0], n) and gate(rows, pair(n)[1], n)]
        n = max(taking) if taking else max(ns)
        moir, wiki = pair(n)
        name = f"{'MEMIT' if e == 'memit' else 'AlphaEdit'} {r}, N = {n}, {len(moir)} seed(s)"
        hm_name = "S_e" if edit_metric == "S_e" else "edit HM"
        out.append(Claim("C_Moir preserves more than C_Wiki", f"S_p Moir − Wiki ({name})",
                         paired(items, moir, wiki, "S_p", n), +1, bool(taking), CHAPTER))
        out.append(Claim("C_Moir does not cost edit quality", f"{hm_name} Moir − Wiki ({name})",
                         paired(items, moir, wiki, edit_metric, n), +1, bool(taking), CHAPTER))
    abl = _by_point(ablation_specs)
    if {"rand1", "bos"} <= set(ablation_seeds) and abl:
        ns = sorted({n for (_, _, c, n) in abl if c == "moir-rand1"} & {n for (_, _, c, n) in abl
                                                                        if c == "moir-bos"})
        terms = []
        for n in ns:
            r1, bos = abl[("memit", "batch", "moir-rand1", n)], abl[("memit", "batch", "moir-bos", n)]
            seeds = sorted(set(r1) & set(bos))
            a, b = [r1[k] for k in seeds], [bos[k] for k in seeds]
            terms += [(1 / len(ns), edit_metric, a, b, n), (1 / len(ns), "S_p", a, b, n)]
        if terms:
            ok = all(gate(rows, list(abl[("memit", "batch", c, n)].values()), n)
                     for n in ns for c in ("moir-rand1", "moir-bos"))
            out.append(Claim("rand×1 seeds a better C_Moir than BOS (Table 2)",
                             f"Total rand×1 − bos (MEMIT batch, N = {', '.join(map(str, ns))})",
                             paired_sum(items, terms), +1, ok, CHAPTER))
    return out


def finals(rows: pd.DataFrame) -> pd.DataFrame:
    """The last scored point (largest N) of every ``editor × regime × C``, wide (means over seeds)."""
    edited = wide(rows[rows["editor"] != NONE], ["edit", "preservation"])
    if edited.empty:
        return edited
    last = edited.groupby(["editor", "regime", "cov"])["n_edits"].transform("max")
    out = edited[edited["n_edits"] == last]
    return out.groupby(["editor", "regime", "cov"], as_index=False).mean(numeric_only=True)


def paper_table(rows: pd.DataFrame, editor: str, regime: str, with_pm: bool = False) -> pd.DataFrame:
    """Tables 6-9: one row per ``N × C`` of a setting with Eff, Gen, Spec, Flu, Port, the edit HM, the
    preservation tasks and S_p (means over seeds); ``with_pm``: cells as ``0.62 ± 0.05`` (half the 95 %
    interval, :func:`~moir_lib.chapters.lab_tables.halves`)."""
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
    if with_pm:
        h = halves(sel, ["n_edits", "cov"]).reset_index()
        h = h.reindex(columns=cols).rename(columns={**names, "n_edits": "N", "cov": "C"})
        out = pm(out, out[["N", "C"]].merge(h, on=["N", "C"], how="left"),
                 [c for c in out.columns if c not in ("N", "C")])
    return out.sort_values(["N", "C"]).reset_index(drop=True)


def task_baseline(rows: pd.DataFrame) -> dict[str, float]:
    """Pre-edit preservation score per task (means over the baseline rows)."""
    base = rows[(rows["editor"] == NONE) & (rows["group"] == "preservation")]
    return {m: float(v) for m, v in base.groupby("metric")["value"].mean().items()}


def headline(rows: pd.DataFrame, ablation: pd.DataFrame, tables: Mapping[str, pd.DataFrame],
             judged: Sequence[Claim] = ()) -> dict[str, Any]:
    """``summary.json`` headline of chapter 05 (plain JSON): the baseline, the final point of every setting,
    the C_Moir - C_Wiki gaps, Table 2 (``ablation``), the paper's Tables 6-9 (``tables``, by setting) and
    the ``claims`` with their intervals and verdicts (``judged``: :func:`claims`)."""
    hm = edit_hm_metric(rows)
    head: dict[str, Any] = {"edit_metric": hm, "baseline": records(baseline_table(rows)),
                            "claims": claim_records(judged, CHAPTER)}
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


def findings(rows: pd.DataFrame, ablation: pd.DataFrame, model_name: str = "pocket",
             judged: Sequence[Claim] = ()) -> str:
    """The closing text of chapter 05, written from the measured numbers; with ``judged`` (:func:`claims`)
    its verdicts are the paired intervals' (reproduced / reversed / not resolved at this sample size)."""
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
    verdicts = [_moir_vs_wiki(e, r, g, hm, tasks, judged) for (e, r), g in w.groupby(["editor", "regime"])
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
        table2 = [c for c in judged if c.claim.endswith("(Table 2)")]
        if table2:
            lines.append("Judged by the paired interval: " + table2[0].sentence() + ".")
    n_items = {c.estimate.n for c in judged if c.estimate.n}
    lines.append(f"*Scale.* {model_name}: edit counts of tens to hundreds instead of thousands; "
                 + ("every verdict above rests on a paired 95 % interval over the shared records and items "
                    f"({min(n_items)}-{max(n_items)} per comparison, bootstrap stratified per task and seed)."
                    if n_items else "no per-item scores, so no interval: read differences of a few "
                    "hundredths as noise."))
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


def _moir_vs_wiki(editor: str, regime: str, g: pd.DataFrame, hm: str, tasks: Sequence[str],
                  judged: Sequence[Claim] = ()) -> tuple[bool, str]:
    """``(judged, text)``: one setting's C_Moir against C_Wiki (``g``: its wide rows), judged only at
    the N where the edits take under both C's (mean ES ≥ the editability gate); other N are shown. With
    the setting's paired claims in ``judged``, the verdict is theirs."""
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
    label = f"{'MEMIT' if editor == 'memit' else 'AlphaEdit'} {regime},"
    mine = [c for c in judged if label in c.measured]
    if mine:
        text += ("judged by paired 95 % intervals: " + "; ".join(c.sentence() for c in mine) + ".")
    else:
        text += ("reproduced here (point estimates only)." if dp > 0.01 and de > -0.05 else
                 "only half reproduced here (point estimates only): preservation improves but edits suffer."
                 if dp > 0.01 else "not reproduced here (point estimates only).")
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
