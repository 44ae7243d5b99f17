"""Chapter 05, "Does C_Moir preserve more?": every editor × regime × C × N on the Lab's rows.

The paper's Tables 6-9 (:func:`paper_table`: edit metrics, the edit harmonic mean S_e eq. (se), the
preservation tasks and S_p eq. (sp)), Table 2 (:func:`strategy_ablation`: the seed strategy of C_Moir, eq.
(memoir_estimator)), the last point of every setting for Fig. 6 (:func:`finals`, :func:`task_baseline`), the
chapter's ``summary.json`` headline (:func:`headline`), its closing text (:func:`findings`) and an ipywidgets
explorer of the rows (:func:`explorer`). :func:`claims` judges the chapter's claims as its hierarchy
(:data:`HIERARCHY`, :func:`moir_lib.chapters.verdicts.judge`) on the items of the experiments
:func:`claim_plan` names (C_Moir against C_Wiki per setting at the N fixed in advance, :data:`CLAIM_N`, at two
or more draws of each C; Table 2's rand×1 against bos; the null control, two sets of draws of C_Moir, judged
alone), pooled over edit samples, C draws and organisms, every organism at its own τ / λ;
:func:`per_model_claims` and :func:`neighbour_claims` are the sensitivity checks of the selection; the closing
text states those verdicts and no other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.chapters.lab_tables import (
    base_covs,
    baseline_table,
    baseline_values,
    curves,
    edit_hm_metric,
    edits_take,
    fmt,
    halves,
    json_rows,
    pm,
    pres_tasks,
    scale_note,
    weak_edits_note,
    wide,
    zero_portability,
)
from moir_lib.chapters.verdicts import (
    Arm,
    Claim,
    Hierarchy,
    claims_json,
    gate,
    judge,
    label,
    measure,
    noninferiority_label,
    null_control,
)
from moir_lib.evaluation.inference import NONINFERIORITY_MARGIN
from moir_lib.evaluation.intervals import REPRODUCED
from moir_lib.evaluation.scores import EDIT_SCORES
from moir_lib.experiments.gates import ES_GATE, N_EDITS
from moir_lib.experiments.labs import pooled_frames, with_draws
from moir_lib.experiments.rows import NONE, clean, json_value
from moir_lib.experiments.selection import retune

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "05_editing"


def _mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def strategy_ablation(rows: pd.DataFrame,
                      strategies: Sequence[str] = ("rand1", "rand2", "rand3", "rand4", "bos"), *,
                      editor: str = "memit", regime: str = "batch", edit_metric: str | None = None,
                      with_pm: bool = False) -> pd.DataFrame:
    """Table 2: per seed strategy, S_e and S_p at every N and their averages; Total = Edit Avg + Pres. Avg.

    The experiments are those whose C is ``moir-<strategy>``. Columns ``S_e@N``, ``Edit Avg``, ``S_p@N``,
    ``Pres. Avg``, ``Total``. ``edit_metric``: the chapter's edit score (:func:`edit_hm_metric` of all
    its rows); by default decided on these experiments alone. ``with_pm``: the per-N cells as ``0.62 ± 0.05``
    (display only; the ordering's interval is :func:`claims`' paired Total).
    """
    covs = {f"moir-{s}": s for s in strategies}
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime)
               & base_covs(rows["cov"]).isin(list(covs))]
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
        row: dict[str, Any] = {"strategy": strategy}
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
        hw = pd.DataFrame([{"strategy": covs[c], **{f"{'S_e' if m == hm else 'S_p'}@{n}": h.loc[(c, n), m]
                                                for n in ns for m in (hm, "S_p")
                                                if (c, n) in h.index and m in h.columns}}
                           for c in covs if c in set(w["cov"])])
        cells = [c for c in table.columns if "@" in c]
        table = pm(table.round(6), table[["strategy"]].merge(hw, on="strategy", how="left"), cells)
        table = pm(table, pd.DataFrame(index=table.index), ["Edit Avg", "Pres. Avg", "Total"])
    return table


def _by_point(specs: Sequence[Any]) -> dict[tuple[str, str, str, int], dict[int, Any]]:
    """``(editor, regime, cov, n) -> {edit sample: spec}`` over every scored point of ``specs``."""
    out: dict[tuple[str, str, str, int], dict[int, Any]] = {}
    for s in specs:
        for n in s.points:
            out.setdefault((s.editor, s.regime, s.cov, int(n)), {})[int(s.edit_sample)] = s
    return out


@dataclass(frozen=True)
class ClaimPlan:
    """Where the chapter's C_Moir-against-C_Wiki claims are measured: ``points`` ``(editor, regime, N)``,
    one per setting; ``draws`` of each C; ``draw_specs`` the experiments of both C's at those points at draws
    ``0 … draws − 1``; ``null_specs`` C_Moir's draws ``draws … 2·draws − 1`` at MEMIT batch's point, for the
    null control (:func:`~moir_lib.chapters.verdicts.null_control`)."""

    points: tuple[tuple[str, str, int], ...]
    draws: int
    draw_specs: tuple[Any, ...]
    null_specs: tuple[Any, ...]

    @property
    def specs(self) -> list[Any]:
        """Every run the claims read besides Table 2's."""
        return [*self.draw_specs, *self.null_specs]


#: Where each setting's claims are judged, fixed before any data: in the batch regime at the editability
#: gate's N (:data:`~moir_lib.experiments.gates.N_EDITS`: the N at which the pocket report certifies that
#: the edits take), else at the largest batch; in the sequential regime at the last milestone (the paper's
#: sequential claims are about damage that accumulates edit after edit, so the end of the run is where they
#: are made). The data do not move it: an N whose edits miss the gate there is judged and says so.
CLAIM_N = {"batch": f"the editability gate's N ({N_EDITS}), else the largest batch",
           "sequential": "the last milestone"}

#: The chapter's hierarchy, fixed before any data (:func:`~moir_lib.chapters.verdicts.judge`).
HIERARCHY = Hierarchy(
    CHAPTER,
    f"C_Moir preserves more than C_Wiki (S_p, MEMIT batch at N = {N_EDITS})",
    "the chapter asks whether C_Moir in place of C_Wiki extends what survives editing; MEMIT in the batch "
    "regime is the paper's main setting (its Table 1 and Table 6) and the one setting whose edits the "
    "pocket report certifies to take at that N, so the primary claim is measurable by construction; S_p is "
    "the one score over every task. Where the design holds no MEMIT batch experiments, the first setting of "
    "the plan takes its place",
    "S_p at every other editor × regime; the edit quality of every setting (non-inferiority); Table 2's "
    "Total of rand×1 against BOS",
    "two independent sets of draws of C_Moir, MEMIT batch at the primary's N, judged alone at α")


def claim_n(regime: str, counts: Sequence[int]) -> int:
    """The N a setting's claims are judged at (:data:`CLAIM_N`), among the ``counts`` both C's ran."""
    if not counts:
        raise ValueError(f"no N of the {regime} regime ran under both C_Moir and C_Wiki: nothing to judge")
    if regime == "batch" and N_EDITS in counts:
        return N_EDITS
    return max(counts)


def claim_plan(specs: Sequence[Any], draws: int) -> ClaimPlan:
    """Per editor × regime with both C's in ``specs``, the N its claims compare (:func:`claim_n`, fixed in
    advance); both C's at that N at ``draws`` draws, crossed with the edit samples scored there; and the
    null control's experiments at MEMIT batch's N."""
    if draws < 1:
        raise ValueError(f"cov_draws must be >= 1 (draws of each compared C), got {draws}")
    points = _by_point(specs)
    chosen, draw_specs, null_specs = [], [], []
    for e, r in dict.fromkeys((e, r) for e, r, _, _ in points):
        ns = sorted(n for (e2, r2, c, n) in points
                    if (e2, r2, c) == (e, r, "moir") and (e, r, "wiki", n) in points)
        if not ns:
            continue
        n = claim_n(r, ns)
        chosen.append((e, r, n))
        arms = {c: [spec.at(n) for spec in points[(e, r, c, n)].values()] for c in ("moir", "wiki")}
        draw_specs += with_draws(arms["moir"] + arms["wiki"], range(draws))
        if (e, r) == ("memit", "batch"):
            null_specs = with_draws(arms["moir"], range(draws, 2 * draws))
    return ClaimPlan(tuple(chosen), draws, tuple(draw_specs), tuple(null_specs))


def per_model_plan(plan: ClaimPlan, values: Mapping[str, float]) -> ClaimPlan | None:
    """The sensitivity check of the per-C τ / λ: ``plan``'s points of the editors in ``values`` (editor ->
    the one value for every C, :func:`~moir_lib.experiments.selection.per_model`) with both C's at that
    value (no null control); None when no run of those editors changes (every C got that value)."""
    strength = {"alphaedit": "tau", "memit": "lambda_"}
    specs = tuple(dict.fromkeys(dataclasses.replace(s, **{strength[s.editor]: values[s.editor]})
                                for s in plan.draw_specs if s.editor in values))
    if set(specs) <= set(plan.draw_specs):
        return None
    return ClaimPlan(tuple(p for p in plan.points if p[0] in values), plan.draws, specs, ())


def per_model_claims(labs: Sequence[Any], plan: ClaimPlan, own: Sequence[Mapping[str, Sequence[Any]]],
                     edit_metric: str = "S_e") -> list[Claim]:
    """The per-model sensitivity check run and judged as a hierarchy of its own: in every lab of ``labs``
    (one per organism) with its own selections ``own`` (:func:`~moir_lib.experiments.selection.
    organism_strengths`), :func:`per_model_plan` of the plan at that organism's values, the one value per
    editor for every C (:func:`~moir_lib.chapters.strength_tables.per_model_values`); and :func:`claims` on
    them; empty when no run changes in any organism."""
    from moir_lib.chapters.strength_tables import per_model_values

    plans = []
    for mine in own:
        base = dataclasses.replace(plan, draw_specs=tuple(retune(plan.draw_specs, mine)))
        values = per_model_values(mine)
        plans.append((per_model_plan(base, values), base, values))
    if all(again is None for again, _, _ in plans):
        return []
    points = next(again for again, _, _ in plans if again is not None).points
    per_lab = [(again or dataclasses.replace(base, draw_specs=tuple(s for s in base.draw_specs
                                                                    if s.editor in values))).draw_specs
               for again, base, values in plans]
    rows, items = pooled_frames(labs, [list(s) for s in per_lab])
    return claims(rows, items, ClaimPlan(points, plan.draws, (), ()), edit_metric)


def neighbour_claims(labs: Sequence[Any], plan: ClaimPlan, own: Sequence[Mapping[str, Sequence[Any]]]
                     ) -> list[tuple[str, Claim]]:
    """The primary claim (:data:`HIERARCHY`) again with every organism's τ / λ of C_Moir and C_Wiki one
    grid value below and one above its own choice
    (:func:`~moir_lib.chapters.strength_tables.neighbour_claims`); where their signs differ the selection
    decides the claim's sign. Costs both C's × organisms × draws points per side."""
    from moir_lib.chapters.strength_tables import neighbour_claims as again

    first = _primary_point(plan)
    if first is None:
        return []
    e, r, n = first
    moir, wiki = Arm(e, r, "moir", n), Arm(e, r, "wiki", n)
    claim_specs = [s for s in plan.draw_specs if (s.editor, s.regime, s.n_edits) == (e, r, n)]

    def claim_of(rows: pd.DataFrame, items: pd.DataFrame) -> Claim:
        return measure("C_Moir preserves more than C_Wiki", label("S_p", moir, wiki), items,
                       [(1.0, "S_p", moir, wiki)], gate_ok=gate(rows, moir, wiki), chapter=CHAPTER)

    return again(labs, claim_specs, own, ("moir", "wiki"), claim_of)


def _primary_point(plan: ClaimPlan) -> tuple[str, str, int] | None:
    """The setting of the primary claim (:data:`HIERARCHY`): MEMIT batch, else the plan's first."""
    first = plan.points[0] if plan.points else None
    return next((p for p in plan.points if p[:2] == ("memit", "batch")), first)


def ablation_claim_specs(ablation_specs: Iterable[Any], draws: int) -> list[Any]:
    """The experiments of Table 2's claim: rand×1's and bos's experiments of ``ablation_specs`` at ``draws``
    draws of each C."""
    return with_draws([s for s in ablation_specs if s.cov in ("moir-rand1", "moir-bos")], range(draws))


def _table2(rows: pd.DataFrame, items: pd.DataFrame, edit_metric: str) -> Claim | None:
    """Table 2's Total of rand×1 minus bos (mean over the N both scored of the edit score, plus that of
    ``S_p``), MEMIT batch; None when either did not run."""
    batch = rows[(rows["editor"] == "memit") & (rows["regime"] == "batch")]
    base = base_covs(batch["cov"])
    ns = sorted(set(batch.loc[base == "moir-rand1", "n_edits"])
                & set(batch.loc[base == "moir-bos", "n_edits"]))
    if not ns:
        return None
    pairs = [(Arm("memit", "batch", "moir-rand1", n), Arm("memit", "batch", "moir-bos", n)) for n in ns]
    terms = [(1 / len(ns), m, a, b) for a, b in pairs for m in (edit_metric, "S_p")]
    return measure("rand×1 seeds a better C_Moir than BOS (Table 2)",
                   f"Total rand×1 − bos (MEMIT batch, N = {', '.join(map(str, ns))})", items, terms,
                   gate_ok=all(gate(rows, a, b) for a, b in pairs), chapter=CHAPTER)


def claims(rows: pd.DataFrame, items: pd.DataFrame, plan: ClaimPlan, edit_metric: str = "S_e") -> list[Claim]:
    """The chapter's claims as its hierarchy (:data:`HIERARCHY`), on ``items`` (and ``rows``, for the gates)
    of the plan's experiments, pooled over edit samples, C draws and organisms: per point of ``plan``, ``S_p``
    of C_Moir minus C_Wiki (superiority; MEMIT batch's the primary claim) and ``edit_metric`` (relative
    non-inferiority, margin :data:`~moir_lib.evaluation.inference.NONINFERIORITY_MARGIN`); Table 2's Total of
    rand×1 minus bos where both ran; and the null control at MEMIT batch's point, judged alone."""
    first = _primary_point(plan)
    primary, out = None, []
    for e, r, n in plan.points:
        moir, wiki = Arm(e, r, "moir", n), Arm(e, r, "wiki", n)
        ok = gate(rows, moir, wiki)
        sp = measure("C_Moir preserves more than C_Wiki", label("S_p", moir, wiki), items,
                     [(1.0, "S_p", moir, wiki)], gate_ok=ok, chapter=CHAPTER)
        if (e, r, n) == first:
            primary = sp
        else:
            out.append(sp)
        out.append(measure(f"C_Moir does not cost edit quality (keeps {1 - NONINFERIORITY_MARGIN:.0%} of "
                           "C_Wiki's edit score)", noninferiority_label(edit_metric, moir, wiki), items,
                           [(1.0, edit_metric, moir, wiki)], margin=NONINFERIORITY_MARGIN, gate_ok=ok,
                           chapter=CHAPTER))
    table2 = _table2(rows, items, edit_metric)
    out += [table2] if table2 is not None else []
    control = None
    if plan.null_specs:
        n = next(n for e, r, n in plan.points if (e, r) == ("memit", "batch"))
        control = null_control(rows, items, Arm("memit", "batch", "moir", n), plan.draws, chapter=CHAPTER)
    return [] if primary is None else judge(primary, out, control)


def finals(rows: pd.DataFrame) -> pd.DataFrame:
    """The last scored point (largest N) of every ``editor × regime × C``, wide (means over edit samples)."""
    edited = wide(rows[rows["editor"] != NONE], ["edit", "preservation"])
    if edited.empty:
        return edited
    last = edited.groupby(["editor", "regime", "cov"])["n_edits"].transform("max")
    out = edited[edited["n_edits"] == last]
    return out.groupby(["editor", "regime", "cov"], as_index=False).mean(numeric_only=True)


def paper_table(rows: pd.DataFrame, editor: str, regime: str, with_pm: bool = False) -> pd.DataFrame:
    """Tables 6-9: one row per ``N × C`` of a setting with Eff, Gen, Spec, Flu, Port, the edit HM, the
    preservation tasks and S_p (means over edit samples); ``with_pm``: cells as ``0.62 ± 0.05`` (half the 95 %
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
    head: dict[str, Any] = {"edit_metric": hm, "baseline": json_rows(baseline_table(rows)),
                            "claims": claims_json(judged, CHAPTER)}
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
    head["strategy_ablation"] = json_rows(ablation) if not ablation.empty else []
    if not ablation.empty:
        head["best_strategy"] = str(ablation.sort_values("Total", ascending=False)["strategy"].iloc[0])
    head["tables"] = {name: table.to_dict("records") for name, table in tables.items()}
    return clean(head)


def findings(rows: pd.DataFrame, ablation: pd.DataFrame, model_name: str = "pocket",
             judged: Sequence[Claim] = (), organisms: Sequence[int] = (0,)) -> str:
    """The closing text of chapter 05, written from the measured numbers; its only verdict words are those
    of ``judged`` (:func:`claims`: reproduced / reversed / not resolved at this sample size), the null
    control's among them. ``organisms``: those the claims pool, the first the one the tables show."""
    hm = edit_hm_metric(rows)
    edited = rows[rows["editor"] != NONE]
    if edited.empty:
        return "No edited experiments: nothing to compare."
    lines = []
    if hm != "S_e":
        zeros, n_points = zero_portability(rows)
        lines.append(f"*Edit score.* Portability is 0 in {zeros} of {n_points} edited points (the two-hop "
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
        lines.append(weak_note)  # no setting has an N where the edits take: no verdict word is said
    lines += [text for _, text in verdicts]
    # asymmetry across domains under wiki
    wiki = w[w["cov"] == "wiki"]
    if len(wiki) and base:
        last = wiki[wiki["n_edits"] == wiki["n_edits"].max()].mean(numeric_only=True)
        rel = {t: last.get(t, math.nan) / base[t] for t in tasks if base.get(t) and base[t] > 0}
        rel = {t: v for t, v in rel.items() if math.isfinite(v)}
        worst, best = (min(rel, key=rel.get), max(rel, key=rel.get)) if rel else (None, None)
        if worst != best:
            lines.append(f"**Collapse across domains.** Under C_Wiki at the largest N, *{worst}* keeps "
                         f"{rel[worst]:.0%} of its pre-edit score and *{best}* {rel[best]:.0%} (the paper's "
                         "radar charts: code and mathematics fall furthest).")
    if not ablation.empty:
        lines.append(_strategy_ablation_text(ablation))
        table2 = [c for c in judged if c.claim.endswith("(Table 2)")]
        if table2:
            lines.append("Judged by its interval: " + table2[0].sentence() + ".")
    control = [c for c in judged if c.control]
    if control:
        lines.append("**Null control.** Two independent sets of draws of C_Moir (the same recipe, other "
                     "generation seeds), compared like C_Moir and C_Wiki and judged alone at α, apart from "
                     "the claims: " + control[0].sentence() + ".")
    claims_only = [c for c in judged if not c.control]
    if claims_only:
        lines.append(f"The chapter's {len(claims_only)} claims form its hierarchy, fixed before the data: "
                     f"{claims_only[0].measured} is the primary claim, tested at α = 0.05; the others are "
                     "tested only once it resolves, Holm-corrected among them. Each interval pools the edit "
                     "samples, the draws of each C and the organisms, an item shared by them drawn once per "
                     "bootstrap replicate.")
    lines.append(scale_note(model_name, "edit counts of tens to hundreds instead of thousands", organisms,
                            bool(judged)))
    return "\n\n".join(lines)


def _strategy_ablation_text(ablation: pd.DataFrame) -> str:
    """Table 2's sentence on its point estimates: the best Total, which half of the paper's ordering
    (rand×1 best, bos last) they follow, and, where bos is not last, whether preservation or the edit
    average puts it ahead (the verdict is the Total claim's, :func:`claims`)."""
    by_strategy = ablation.set_index("strategy")
    total = by_strategy["Total"]
    best, worst = total.idxmax(), total.idxmin()
    text = f"**Seed ablation (Table 2).** The best Total is {best} ({fmt(total[best])}); "
    if not {"rand1", "bos"} <= set(total.index):
        return text + "the paper's ordering (rand×1 best, bos last) needs both strategies."
    text += f"rand1 {fmt(total['rand1'])} vs bos {fmt(total['bos'])}. "
    if best == "rand1" and worst == "bos":
        return text + "The point estimates follow the paper's ordering (rand×1 best, bos last)."
    if worst == "bos":
        return text + (f"By the point estimates bos is last, as in the paper, but {best} rather than rand1 "
                       "is first (the paper's rand×k differ by little).")
    text += ("The point estimates do not follow the paper's ordering (rand×1 best, bos last): bos is not "
             "last. ")
    pres, edit = by_strategy["Pres. Avg"], by_strategy["Edit Avg"]
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
    """``(testable, text)``: one setting's C_Moir against C_Wiki (``g``: its wide rows): the differences of
    the means at the N where the edits take under both C's (mean ES ≥ the editability gate; other N are
    named), and the verdicts of the setting's claims in ``judged`` (no verdict without them); the
    constituent of the edit score C_Moir loses most when its non-inferiority is not shown."""
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
    setting = f"({'MEMIT' if editor == 'memit' else 'AlphaEdit'} {regime}, N = "
    mine = [c for c in judged if setting in c.measured and not c.control]
    if mine:
        text += (f"judged at the N fixed before the data ({CLAIM_N[regime]}) by its intervals: "
                 + "; ".join(c.sentence() for c in mine) + ".")
    else:
        text += "not judged here (no per-item scores)."
    edit = [c for c in mine if c.claim.startswith("C_Moir does not cost edit quality")]
    if edit and edit[0].verdict != REPRODUCED and de < 0:
        text += _edit_loss(mean, hm)
    missed = {int(k): v for k, v in es_n.items() if int(k) not in taking}
    if missed:
        at = ", ".join(f"N = {k} (ES {v:.2f})" for k, v in missed.items())
        text += (f" The edits miss the gate at {at}"
                 + ": a claim judged there reads neither reproduced nor reversed.")
    return bool(taking), text


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
