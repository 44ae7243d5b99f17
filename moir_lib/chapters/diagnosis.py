"""Chapter 01, "Which distribution should C protect?": Table 1 and Fig. 2 of the paper on the Lab's rows.

:func:`table1` lays out MEMIT batch editing with each C (edit metrics, the preservation tasks, S_e
eq. (se) and S_p eq. (sp), ``+Δ`` over Wiki on the vulnerable tasks, fixed in advance:
:func:`~moir_lib.chapters.lab_tables.vulnerable_tasks`); :func:`headline` is the chapter's ``summary.json``
headline and :func:`findings` its closing text, written from the measured numbers: the collapse under
C_Wiki, the rescue by other C's, edit quality, the mechanism (the output distortion of each domain) and
the sequential regime. The section "How many samples does C need?" reads the prefixes of the chapter's
C's: :func:`budget_table`, :func:`budget_scores`, :func:`budget_text` (and :func:`budget_headline`) on the
curve of :mod:`moir_lib.experiments.budget_curve`. :func:`claims` judges Table 1's Δ's (each C against
C_Wiki on the vulnerable tasks and ``S_p``, superiority; on the edit score, relative non-inferiority) as the
chapter's hierarchy (:data:`HIERARCHY`, :func:`moir_lib.chapters.verdicts.judge`: the oracle's S_p gain
the primary claim), pooled over edit samples, C draws and organisms; the closing text states their
verdicts and no other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.chapters.lab_tables import (
    COV_LABELS,
    PRES_LABELS,
    base_covs,
    baseline_values,
    distortion_table,
    edit_hm_metric,
    fmt,
    halves,
    json_rows,
    pm,
    pres_tasks,
    scale_note,
    vulnerable_tasks,
    weak_edits_note,
    wide,
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
)
from moir_lib.evaluation.inference import NONINFERIORITY_MARGIN
from moir_lib.experiments.labs import with_draws
from moir_lib.experiments.rows import NONE, json_value

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "01_diagnosis"
#: The C's whose Δ over C_Wiki the chapter judges (the paper's oracle, and C_Moir).
CLAIM_COVS: tuple[str, ...] = ("oracle", "moir")
#: Pocket domain of each pocket task (for the per-domain NLL and distortion beside it).
TASK_DOMAIN: dict[str, str] = {"facts": "wiki", "arith": "math", "arith_raw": "math", "prose": "web",
                               "code": "code"}
_NAMES = {"ES": "ES", "PS": "PS", "Efficacy": "Effi", "Generalization": "Gen", "Specificity": "Spec",
          "Fluency*": "Flu", "Portability": "Con"}


def table1(rows: pd.DataFrame, n_edits: int, covs: Sequence[str] = ("wiki", "wiki-subset", "oracle", "moir"),
           *, editor: str = "memit", regime: str = "batch", with_pm: bool = False) -> pd.DataFrame:
    """Table 1's layout for one N: edit metrics (ES PS Effi Gen Spec Flu Con) and the preservation tasks,
    one row per C (mean over edit samples and C draws), plus the pre-edit row; ``Δ <task>`` over Wiki on
    the vulnerable tasks (:func:`~moir_lib.chapters.lab_tables.vulnerable_tasks`, fixed in advance).

    Columns: ``C``, the metrics, ``Δ <task>``, ``S_e``, ``S_p``. ``with_pm``: the cells as ``0.62 ± 0.05``
    (half the 95 % interval; the Δ's intervals are :func:`claims`').
    """
    sel = rows[(rows["editor"] == editor) & (rows["regime"] == regime) & (rows["n_edits"] == n_edits)
               & base_covs(rows["cov"]).isin(covs)]
    if sel.empty:
        return pd.DataFrame()
    w = wide(sel, ["edit", "preservation"]).groupby("cov").mean(numeric_only=True)
    tasks = pres_tasks(sel)
    base = baseline_values(rows)
    vuln = [t for t in vulnerable_tasks(tasks) if "wiki" in w.index]
    out = []
    if base:
        out.append({"C": COV_LABELS["none"], **{_NAMES[k]: base.get(k, math.nan) for k in _NAMES},
                    **{t: base.get(t, math.nan) for t in tasks}, "S_e": math.nan,
                    "S_p": base.get("S_p", math.nan)})
    hm = edit_hm_metric(rows)  # the chapter's edit score, decided on all its rows
    for c in covs:
        if c not in w.index:
            continue
        row = {"C": COV_LABELS.get(c, c), **{_NAMES[k]: w.loc[c].get(k, math.nan) for k in _NAMES},
               **{t: w.loc[c].get(t, math.nan) for t in tasks}}
        for t in vuln:
            row[f"Δ {t}"] = (w.loc[c, t] - w.loc["wiki", t]) if c != "wiki" else math.nan
        row["S_e"] = w.loc[c].get(hm, math.nan)
        row["S_p"] = w.loc[c].get("S_p", math.nan)
        out.append(row)
    table = pd.DataFrame(out)
    if with_pm and not table.empty:
        both = pd.concat([sel.assign(cov=base_covs(sel["cov"])), rows[rows["editor"] == NONE]],
                         ignore_index=True)
        h = halves(both, ["cov"])
        if hm != "S_e":  # the table's S_e column is the chapter's edit score
            h = h.drop(columns=[c for c in ("S_e",) if c in h.columns])
        h = h.rename(columns={**_NAMES, hm: "S_e"})
        h.index = [COV_LABELS.get(c, c) for c in h.index]
        cells = [c for c in table.columns if c != "C" and not c.startswith("Δ ")]
        table = pm(table, h.reindex(index=table["C"]).reset_index(drop=True), cells)
    return table


def claim_specs(specs: Iterable[Any], draws: int) -> list[Any]:
    """The experiments :func:`claims` reads: those of ``specs`` with C_Wiki and the :data:`CLAIM_COVS`, each
    at draws ``0 … draws − 1`` of its C (:func:`~moir_lib.experiments.labs.with_draws`)."""
    return with_draws([s for s in specs if s.cov in ("wiki", *CLAIM_COVS)], range(draws))


def _label(metric: str, cov: str, n_edits: int) -> str:
    """The measured label of a Δ over C_Wiki, MEMIT batch (:func:`~moir_lib.chapters.verdicts.label`)."""
    return label(metric, Arm("memit", "batch", cov, n_edits), Arm("memit", "batch", "wiki", n_edits))


#: The chapter's hierarchy, fixed before any data (:func:`~moir_lib.chapters.verdicts.judge`).
HIERARCHY = Hierarchy(
    CHAPTER,
    "C_Oracle preserves more than C_Wiki (S_p, MEMIT batch at the chapter's N)",
    "the chapter asks whether the distribution C is estimated from decides what survives an edit; the "
    "oracle, a C of the pretraining mixture itself, is the paper's test of that (Table 1), and S_p is the "
    "one score over every task, so one test carries the question instead of one per task. Where the "
    "profile defines no oracle, C_Moir's S_p gain over C_Wiki takes its place",
    "the oracle's gains on each vulnerable task and its edit quality (non-inferiority); C_Moir's gains on "
    "S_p and each vulnerable task and its edit quality")


def claims(rows: pd.DataFrame, items: pd.DataFrame, n_edits: int, covs: Sequence[str] = CLAIM_COVS, *,
           edit_metric: str = "S_e") -> list[Claim]:
    """Table 1's Δ's as the chapter's hierarchy (:data:`HIERARCHY`): each C of ``covs`` minus C_Wiki, MEMIT
    batch at ``n_edits``, paired on the same records and items in every cell ``(organism, edit sample, C
    draw)`` of ``items`` (``rows``: their tidy rows, for the gate). On every vulnerable task and ``S_p`` (the
    paper: the oracle and C_Moir rescue what C_Wiki collapses; superiority, direction +1) and on
    ``edit_metric`` (the paper: at little edit cost; relative non-inferiority, margin
    :data:`~moir_lib.evaluation.inference.NONINFERIORITY_MARGIN`). The primary: the first C of ``covs``'s
    S_p gain (the oracle's); the rest its secondaries. The gate: the edits take under both C's; a failed
    gate blocks both verdict words. A C without items (not defined for the profile) is left out."""
    wiki = Arm("memit", "batch", "wiki", n_edits)
    tasks = vulnerable_tasks(pres_tasks(rows))
    out: list[Claim] = []
    primary: Claim | None = None
    for c in covs:
        arm = Arm("memit", "batch", c, n_edits)
        if arm.select(items).empty:
            continue
        ok = gate(rows, arm, wiki)
        for t in ["S_p", *tasks]:
            what = f"{PRES_LABELS.get(t, t)} better" if t != "S_p" else "more"
            claim = measure(f"C_{arm.name} preserves {what} than C_Wiki", _label(t, c, n_edits), items,
                            [(1.0, t, arm, wiki)], gate_ok=ok, chapter=CHAPTER)
            if primary is None and t == "S_p":
                primary = claim
            else:
                out.append(claim)
        keeps = f"keeps {1 - NONINFERIORITY_MARGIN:.0%} of C_Wiki's edit score"
        out.append(measure(f"C_{arm.name} does not cost edit quality ({keeps})",
                           noninferiority_label(edit_metric, arm, wiki), items,
                           [(1.0, edit_metric, arm, wiki)], margin=NONINFERIORITY_MARGIN, gate_ok=ok,
                           chapter=CHAPTER))
    return [] if primary is None else judge(primary, out)


def neighbour_claims(labs: Sequence[Any], specs: Sequence[Any], own: Sequence[Any], n_edits: int,
                     covs: Sequence[str]) -> list[tuple[str, Claim]]:
    """The primary claim (:data:`HIERARCHY`: the S_p gain over C_Wiki of the first of :data:`CLAIM_COVS` in
    ``covs``) again with every organism's λ of that C and C_Wiki one grid value below and one above its own
    choice (:func:`~moir_lib.chapters.strength_tables.neighbour_claims`; ``specs``: the claims' experiments,
    ``own``: each organism's selections); where their signs differ the selection decides the claim's sign.
    Costs both C's × organisms × draws × edit samples points per side."""
    from moir_lib.chapters.strength_tables import neighbour_claims as again

    cov = next((c for c in CLAIM_COVS if c in covs), None)
    if cov is None:
        return []
    arm, wiki = Arm("memit", "batch", cov, n_edits), Arm("memit", "batch", "wiki", n_edits)
    claim_specs = [s for s in specs if s.editor == "memit" and s.regime == "batch" and s.n_edits == n_edits
            and s.cov.split("@")[0] in (cov, "wiki")]

    def claim_of(rows: pd.DataFrame, items: pd.DataFrame) -> Claim:
        return measure(f"C_{arm.name} preserves more than C_Wiki", _label("S_p", cov, n_edits), items,
                       [(1.0, "S_p", arm, wiki)], gate_ok=gate(rows, arm, wiki), chapter=CHAPTER)

    return again(labs, claim_specs, own, (cov, "wiki"), claim_of)


def headline(t1: pd.DataFrame, rows: pd.DataFrame, n_edits: int, judged: Sequence[Claim] = ()
             ) -> dict[str, Any]:
    """``summary.json`` headline of chapter 01: Table 1 as JSON rows, the vulnerable tasks, key numbers and
    the ``claims`` (``judged``: :func:`claims`) with intervals and verdicts."""
    vulnerable = vulnerable_tasks(pres_tasks(rows))
    head: dict[str, Any] = {"n_edits": n_edits, "table1": json_rows(t1), "vulnerable": vulnerable,
                            "claims": claims_json(judged, CHAPTER)}
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
    for t in vulnerable_tasks(list(rel)):
        if rel[t] >= 0.8:
            text += (f" Unlike the paper's {PRES_LABELS[t]}, *{t}* does not collapse here (its pre-edit "
                     f"score is {fmt(base[t], 2)}).")
    ceiling = [t for t in rel if base[t] >= 0.95]
    if ceiling:
        values = ", ".join(fmt(base[t], 2) for t in ceiling)
        verb = "starts" if len(ceiling) == 1 else "start"
        text += (f" {', '.join(ceiling)} {verb} at the ceiling ({values}): too easy to register damage "
                 f"at this scale.")
    return text


def _words(judged: Sequence[Claim], labels: dict[str, str]) -> str:
    """``code reproduced, arith not resolved at this sample size``: the verdicts of the claims labelled
    ``labels`` (name -> measured label); empty when none was judged."""
    by = {c.measured: c.verdict for c in judged}
    return ", ".join(f"{name} {by[measured]}" for name, measured in labels.items() if measured in by)


def _rescue(by: pd.DataFrame, vulnerable: Sequence[str], n_edits: int, judged: Sequence[Claim]) -> list[str]:
    """Finding 2: the oracle, the wiki subset and Moir against Wiki on the vulnerable tasks (the
    differences of the means; words only from the judged claims)."""
    wiki, oracle, moir = (COV_LABELS[c] for c in ("wiki", "oracle", "moir"))
    subset = COV_LABELS["wiki-subset"]
    if not vulnerable:
        return []
    lines = []
    deltas = {}
    for row in (subset, oracle, moir):
        if row in by.index:
            deltas[row] = {t: by.loc[row, t] - by.loc[wiki, t] for t in vulnerable}
    if deltas:
        lines.append("**+Δ over Wiki on the vulnerable tasks** (" + ", ".join(vulnerable) + ", fixed in "
                     "advance: the paper's code and mathematics): "
                     + "; ".join(f"{k} " + ", ".join(f"{t} {v:+.2f}" for t, v in d.items())
                                 for k, d in deltas.items()) + ".")
    if oracle in deltas:
        gain = float(np.nanmean(list(deltas[oracle].values())))
        cost = by.loc[oracle].get("ES", math.nan) - by.loc[wiki].get("ES", math.nan)
        words = _words(judged, {t: _label(t, "oracle", n_edits) for t in vulnerable})
        lines.append(f"The paper's oracle lifts its vulnerable domains by +.10 (HumanEval) and +.13 "
                     f"(GSM8K) at a small edit cost. Here the pocket oracle gains {gain:+.2f} on average "
                     f"at an ES change of {cost:+.2f}"
                     + (f"; judged by their intervals, its rescue is {words}." if words else "."))
    if subset in deltas:
        gap = float(np.nanmean([abs(v) for v in deltas[subset].values()]))
        lines.append(f"The wiki-subset C (an independent sample of the same encyclopedic stream) differs "
                     f"from Wiki by {gap:.2f} on average on those tasks (no claim is judged on it; the "
                     "paper reads its closeness as the kind of data, not the source, deciding what "
                     "collapses).")
    if moir in deltas and oracle in deltas:
        gm = float(np.nanmean(list(deltas[moir].values())))
        go_ = float(np.nanmean(list(deltas[oracle].values())))
        sp_m, sp_o = by.loc[moir].get("S_p", math.nan), by.loc[oracle].get("S_p", math.nan)
        words = _words(judged, {t: _label(t, "moir", n_edits) for t in [*vulnerable, "S_p"]})
        lines.append(f"C_Moir, built without any training data, gains {gm:+.2f} on the vulnerable tasks "
                     f"against the oracle's {go_:+.2f} (S_p {fmt(sp_m)} vs {fmt(sp_o)})"
                     + (f"; judged against C_Wiki by their intervals: {words}." if words else "."))
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
    seq = rows[(rows["regime"] == "sequential") & (rows["group"] == "preservation")
               & (base_covs(rows["cov"]) == "wiki")]
    if not len(seq):
        return None
    n_max = int(seq["n_edits"].max())
    last = seq[seq["n_edits"] == n_max].groupby("metric")["value"].mean()
    parts = [f"*{t}* {fmt(base.get(t), 2)} → {fmt(last.get(t), 2)}" for t in tasks if t in last]
    zero = [t for t in tasks if t in last and base.get(t) and last[t] == 0]
    return (f"**Sequential editing (Fig. 2).** After {n_max} sequential edits with C_Wiki: "
            + ", ".join(parts) + "."
            + (f" {', '.join(zero)} reach zero: the damage compounds edit after edit." if zero else ""))


def findings(t1: pd.DataFrame, rows: pd.DataFrame, n_edits: int, model_name: str = "pocket",
             judged: Sequence[Claim] = (), organisms: Sequence[int] = (0,)) -> str:
    """The closing text of chapter 01, written from the measured numbers: a caveat when the edits do
    not take, one paragraph per finding (collapse under C_Wiki, the rescue by other C's, edit quality,
    the mechanism, the sequential regime), the verdicts of the judged claims (the only verdict words it
    says), then the scale of the run. ``organisms``: the organisms the claims pool, the first the one the
    tables and figures show."""
    if t1.empty:
        return "No batch results: nothing to compare."
    by = t1.set_index("C")
    base = baseline_values(rows)
    tasks = pres_tasks(rows)
    if COV_LABELS["wiki"] not in by.index:
        return "C_Wiki did not run: Table 1 has no reference row."
    paragraphs = [weak_edits_note(rows[rows["editor"] != NONE]), _collapse(by, base, tasks, n_edits),
                  *_rescue(by, vulnerable_tasks(tasks), n_edits, judged), _edit_quality(by),
                  _mechanism(rows, n_edits), _sequential(rows, base, tasks)]
    lines = [text for text in paragraphs if text]
    if judged:
        lines.append(f"**Verdicts** (the chapter's hierarchy of {len(judged)} claims, fixed before the data: "
                     f"{judged[0].measured} is the primary claim, tested at α = 0.05; the others are tested "
                     "only once it resolves, Holm-corrected among them; each a paired difference over the "
                     "shared records and items, its interval pooled over the edit samples, the draws of each "
                     "C and the organisms): " + "; ".join(c.sentence() for c in judged) + ".")
    lines.append(scale_note(model_name, f"a small model of a synthetic world, edited {n_edits} times where "
                            "the paper edits 2,000 facts into 7-8B models", organisms, bool(judged)))
    return "\n\n".join(lines)


# ----------------------------------------------------------------------------- how many samples does C need?

#: The C's whose sample budget the chapter measures (each one pass: a corpus, a generation).
BUDGET_COVS: tuple[str, ...] = ("wiki", "moir")
#: The editors' update measures of the curve.
BUDGET_DW: dict[str, str] = {"memit": "memit_dW", "alphaedit": "alphaedit_dW"}
_BUDGET_NAMES = {"memit": "MEMIT", "alphaedit": "AlphaEdit"}


def budget_covs(covs: Sequence[str], fractions: Sequence[str]) -> list[str]:
    """The C's of ``covs`` whose sample budget the chapter measures (:data:`BUDGET_COVS`); none without
    prefix ``fractions`` (no budget section)."""
    return [c for c in BUDGET_COVS if c in covs] if fractions else []


def _interval(value: float, lo: float, hi: float, digits: int = 3) -> str:
    if not math.isfinite(value):
        return "–"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def budget_table(intervals: pd.DataFrame) -> pd.DataFrame:
    """The budget curve as a table (:func:`moir_lib.experiments.budget_curve.intervals`): one row per C and
    prefix, its size in key vectors per key dimension and each measure as ``value [lo, hi]`` (95 % over the C
    draws), the null-space dimensions of the prefix and of the whole ``C``."""
    if intervals.empty:
        return pd.DataFrame()
    cols = {"memit_dW": "MEMIT ΔW change", "alphaedit_dW": "AlphaEdit ΔW change", "gap": "subspace gap",
            "max_angle_deg": "largest angle (°)", "null_dim": "null space",
            "null_dim_full": "null space (full)"}
    out = []
    for (cov, fraction), g in intervals.groupby(["cov", "fraction"], sort=False):
        by = g.set_index("metric")
        row = {"C": COV_LABELS.get(cov, cov), "prefix": fraction,
               "keys/dim": float(g["keys_per_dim"].mean()),
               "documents": int(round(float(g["documents"].mean()))), "draws": int(g["cells"].max())}
        for metric, column in cols.items():
            if metric in by.index:
                r = by.loc[metric]
                digits = 1 if metric in ("max_angle_deg", "null_dim", "null_dim_full") else 3
                row[column] = _interval(float(r["value"]), float(r["lo"]), float(r["hi"]), digits)
        out.append(row)
    return pd.DataFrame(out).sort_values(["C", "keys/dim"]).reset_index(drop=True)


def budget_needs(intervals: pd.DataFrame, tolerance: float, covs: Sequence[str] = BUDGET_COVS
                 ) -> dict[str, dict[str, float | None]]:
    """Editor -> C -> the smallest prefix size (key vectors per key dimension) from which the upper end of
    the editor's ΔW change stays within ``tolerance`` (:func:`moir_lib.covariance.budget.needed`); ``None``
    when no prefix does."""
    from moir_lib.covariance.budget import needed

    out: dict[str, dict[str, float | None]] = {}
    for editor, metric in BUDGET_DW.items():
        for cov in covs:
            sel = intervals[(intervals["cov"] == cov) & (intervals["metric"] == metric)]
            if len(sel):
                out.setdefault(editor, {})[cov] = needed(sel.fillna({"hi": math.inf}), tolerance)
    return out


def budget_specs(covs: Sequence[str], fractions: Sequence[str], n_edits: int, edit_sample: int,
                 lambdas: Mapping[str, float], taus: Mapping[str, float]) -> list[Any]:
    """The scored points of the budget: MEMIT and AlphaEdit batch edits with each prefix ``fractions`` of
    each C (its whole C's λ / τ, the same records and z as the whole's), and with the whole; none without
    ``fractions``."""
    from moir_lib.covariance.recipes import prefix_name
    from moir_lib.experiments.specs import ExperimentSpec

    out = []
    for cov in covs if fractions else ():
        for name in (cov, *(prefix_name(cov, f) for f in fractions)):
            out += [ExperimentSpec("memit", "batch", name, n_edits, edit_sample=edit_sample,
                            lambda_=lambdas.get(cov)),
                    ExperimentSpec("alphaedit", "batch", name, n_edits, edit_sample=edit_sample,
                                   tau=taus.get(cov))]
    return out


def budget_scores(rows: pd.DataFrame, items: pd.DataFrame, specs: Sequence[Any], *, edit_metric: str = "S_e"
                  ) -> pd.DataFrame:
    """S_e and S_p of the scored points ``specs`` (:func:`budget_specs`) with their 95 % intervals, and the
    paired difference of each prefix's point from the whole C's (the same records, z and items: the
    multi-level bootstrap of :func:`moir_lib.evaluation.inference.compare`)."""
    from moir_lib.covariance.recipes import split_prefix
    from moir_lib.evaluation.bootstrap import Term
    from moir_lib.evaluation.inference import compare

    out = []
    for spec in specs:
        recipe, fraction = split_prefix(spec.cov)
        arm = Arm(spec.editor, "batch", spec.cov, spec.n_edits)
        whole = Arm(spec.editor, "batch", recipe, spec.n_edits)
        row: dict[str, Any] = {"editor": _BUDGET_NAMES[spec.editor], "C": COV_LABELS.get(recipe, recipe),
                               "prefix": fraction or "whole"}
        for metric, column, group in ((edit_metric, "S_e", "edit"), ("S_p", "S_p", "preservation")):
            r = arm.select(rows)
            r = r[(r["metric"] == metric) & (r["group"] == group)]
            row[column] = _interval(*(float(r[c].mean()) if len(r) else math.nan
                                      for c in ("value", "lo", "hi")))
            if fraction is not None:
                a, b = arm.select(items), whole.select(items)
                if len(a) and len(b):
                    est = compare(Term(a, b, metric)).estimate
                    row[f"Δ{column} vs whole"] = _interval(est.value, est.lo, est.hi)
        out.append(row)
    return pd.DataFrame(out)


def _budget_words(needs: Mapping[str, float | None], largest: Mapping[str, float]) -> str:
    parts = []
    for cov in BUDGET_COVS:
        if cov not in needs:
            continue
        x = needs[cov]
        parts.append(f"{x:,.0f} with {COV_LABELS[cov]}" if x is not None
                     else f"more than {largest[cov]:,.0f} with {COV_LABELS[cov]}")
    return " and ".join(parts)


def budget_text(intervals: pd.DataFrame, tolerance: float, pipeline: Any, *, d: int,
                model_name: str = "pocket", halves: Mapping[str, Any] | None = None) -> str:
    """The budget section's closing words, from the measured curve (``intervals``) and the GPU rows of the
    benchmark log (``pipeline``: :func:`moir_lib.benchlog.pipeline`): how many key vectors per key
    dimension each editor needs (:func:`budget_needs`: its ΔW change's upper 95 % bound within
    ``tolerance`` from that prefix on), and what the per-model pipeline at C_Moir's budget would take on
    that GPU for a model of the log's shapes; ``halves``: C -> the split-half
    :class:`~moir_lib.covariance.convergence.Agreement` of the whole C."""
    if intervals.empty:
        return "No budget curve: no prefix was measured."
    needs = budget_needs(intervals, tolerance)
    largest = intervals.groupby("cov")["keys_per_dim"].max().to_dict()
    cells = int(intervals["cells"].max())
    words = "; ".join(f"{_BUDGET_NAMES[e]} {_budget_words(n, largest)}" for e, n in needs.items())
    moir = [n["moir"] for n in needs.values() if n.get("moir") is not None]
    budget = max(moir) if moir and len(moir) == sum("moir" in n for n in needs.values()) else None
    paper = pipeline.paper()
    text = (f"**The sample budget.** On the {model_name} model (d = {d}), each editor's update stays "
            f"within {tolerance * 100:g} % of the full-sample one (the upper end of its 95 % interval over "
            f"{cells} draws of C) from these many key vectors per key dimension: {words}.")
    if budget is not None:
        at = pipeline.at(budget)
        text += (f" At C_Moir's larger budget, {budget:,.0f} per dimension, a model of the log's shapes "
                 f"(d = {pipeline.d:,}) would generate {at['samples']:,.0f} samples of "
                 f"{pipeline.tokens_per_sample} tokens, and its per-model pipeline on one {pipeline.machine} "
                 f"would take {at['total_min']:.1f} min (self-generation at {pipeline.generation_tps:,.0f} "
                 f"tokens/s, then C at {pipeline.c_tps:,.0f} tokens/s: the {pipeline.machine} rows of "
                 f"benchmarks/README.md) instead of {paper['total_min']:.0f} min for the paper's "
                 f"{pipeline.paper_samples:,} samples.")
    else:
        text += (" With C_Moir some editor does not settle within the prefixes measured: its budget lies "
                 "between the largest prefix and the full sample, or beyond; no shorter pipeline is "
                 "projected.")
    for cov, agreement in (halves or {}).items():
        text += (f" The whole {COV_LABELS.get(cov, cov)} against its own halves: split-half gap "
                 f"{agreement.gap:.4f} (largest angle {agreement.worst.max_angle_deg:.1f}°).")
    text += (" Sizes per key dimension assume the budget scales with d, the premise the curve on a real "
             "checkpoint (benchmarks/budget.py) checks on another model.")
    return text


def budget_headline(intervals: pd.DataFrame, tolerance: float, pipeline: Any) -> dict[str, Any]:
    """``summary.json``'s ``budget``: the curve (as JSON rows), each editor's needs per C
    (:func:`budget_needs`), and the pipeline at C_Moir's budget and at the paper's."""
    needs = budget_needs(intervals, tolerance) if not intervals.empty else {}
    moir = [n.get("moir") for n in needs.values()]
    at = pipeline.at(max(moir)) if moir and all(x is not None for x in moir) else None
    return {"budget": {"tolerance": tolerance, "needs": needs, "curve": json_rows(intervals),
                       "pipeline": {"machine": pipeline.machine, "d": pipeline.d, "at_budget": at,
                                    "paper": pipeline.paper(), "rows": [r.cite() for r in pipeline.sources]}}}
