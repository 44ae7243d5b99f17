"""Figures of the editing chapters (``notebooks/01_diagnosis``, ``notebooks/05_editing``: Fig. 2, Figs
4-9), fed by :mod:`moir_lib.chapters.lab_tables`: per-domain degradation, harmonic-mean and per-task
curves per C, radar, output distortion, the seed-strategy ablation, and chapter 01's sample budget of C.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.style import PALETTE, _fig, _require, _subplots

#: C variants of the editing chapters (01, 05): Wiki blue, Moir red, oracle green, BOS orange; the
#: wiki-subset baseline a paler blue; the longer random prefixes of the seed-strategy ablation paler reds.
EDIT_C_COLOURS: dict[str, str] = {"wiki": PALETTE["wiki"], "wiki-subset": "#9CC3F0",
                                  "oracle": PALETTE["oracle"], "moir": PALETTE["moir"],
                                  "moir-bos": PALETTE["bos"], "moir-rand1": PALETTE["moir"],
                                  "moir-rand2": "#E08A7E", "moir-rand3": "#EAAEA4", "moir-rand4": "#F2CFC9",
                                  "none": PALETTE["neutral"]}


EDIT_C_NAMES: dict[str, str] = {"wiki": "C_Wiki", "wiki-subset": "C_Wiki (subset only)", "oracle": "C_Oracle",
                                "moir": "C_Moir", "moir-bos": "C_Moir-bos", "none": "pre-edit"}


#: Pocket preservation tasks and the paper benchmark each stands in for, coloured by domain.
EDIT_TASKS: dict[str, tuple[str, str]] = {"facts": ("facts ≈ MMLU", PALETTE["wiki"]),
                                          "prose": ("prose ≈ HellaSwag", "#8E6BB8"),
                                          "code": ("code ≈ HumanEval", "#1FA6B8"),
                                          "arith": ("arith (chat) ≈ GSM8K", "#8C5A3C"),
                                          "arith_raw": ("arith (raw)", "#C49A7A")}


_EDIT_DOMAINS: dict[str, str] = {"wiki": PALETTE["wiki"], "web": "#8E6BB8", "code": "#1FA6B8",
                                 "math": "#8C5A3C", "chat": "#3B3B3B"}


def _edit_c_colour(cov: str) -> str:
    return EDIT_C_COLOURS.get(cov, PALETTE["neutral"])


def _edit_c_name(cov: str) -> str:
    if cov in EDIT_C_NAMES:
        return EDIT_C_NAMES[cov]
    return f"C_Moir-{cov.removeprefix('moir-')}" if cov.startswith("moir-") else cov


def _edit_task_label(task: str) -> str:
    return EDIT_TASKS.get(task, (task, ""))[0]


def _edit_gap(fig: go.Figure, lo: pd.DataFrame, hi: pd.DataFrame, row: int, col: int,
              showlegend: bool) -> None:
    """Shade the band between two curves (Moir and Wiki) on their common x values."""
    merged = lo[["n_edits", "value"]].merge(hi[["n_edits", "value"]], on="n_edits", suffixes=("_a", "_b"))
    merged = merged.dropna().sort_values("n_edits")
    if len(merged) < 2:
        return
    x = list(merged["n_edits"])
    fig.add_trace(go.Scatter(x=x + x[::-1], y=list(merged["value_a"]) + list(merged["value_b"])[::-1],
                             fill="toself", fillcolor="rgba(214,96,77,0.15)", line={"width": 0},
                             hoverinfo="skip", name="gap Moir − Wiki", legendgroup="gap",
                             showlegend=showlegend), row=row, col=col)


def _edit_x(fig: go.Figure, curves: pd.DataFrame) -> None:
    positive = curves.loc[curves["n_edits"] > 0, "n_edits"]
    if len(positive) and positive.max() / max(positive.min(), 1) >= 8:
        fig.update_xaxes(type="log")


def _edit_c_lines(fig: go.Figure, g: pd.DataFrame, covs: Sequence[str], row: int, col: int,
                  marker: dict | None = None) -> None:
    """One line per C of ``g`` (value against ``n_edits``) in subplot (row, col); legend once."""
    for cov in covs:
        c = g[g["cov"] == cov].sort_values("n_edits")
        if c.empty:
            continue
        fig.add_scatter(x=c["n_edits"], y=c["value"], mode="lines+markers", name=_edit_c_name(cov),
                        legendgroup=cov, showlegend=(row == 1 and col == 1),
                        line={"color": _edit_c_colour(cov)}, marker=marker or {}, error_y=_whiskers(c),
                        hovertemplate="N=%{x}: %{y:.3f}<extra>" + _edit_c_name(cov) + "</extra>",
                        row=row, col=col)


def _whiskers(g: pd.DataFrame) -> dict | None:
    """Plotly ``error_y`` of the 95 % intervals in ``g``'s ``lo``/``hi`` columns (None without them)."""
    if not {"lo", "hi"} <= set(g.columns) or g[["lo", "hi"]].isna().all().all():
        return None
    return {"type": "data", "symmetric": False, "array": (g["hi"] - g["value"]).clip(lower=0).tolist(),
            "arrayminus": (g["value"] - g["lo"]).clip(lower=0).tolist(), "thickness": 1, "width": 3}


def edit_domain_degradation(curves: pd.DataFrame, cov: str = "wiki", editor: str = "memit",
                            regime: str = "sequential", tasks: Sequence[str] | None = None,
                            title: str | None = None) -> go.Figure:
    """Fig. 2: per-domain degradation over sequential edits with one C. Left: each preservation task's
    score as a share of its pre-edit score; right: the change of each pocket domain's held-out NLL.

    ``curves``: :func:`moir_lib.chapters.lab_tables.curves` (``editor, regime, cov, n_edits, metric,
    value``, the pre-edit value at ``N = 0``).
    """
    _require(curves, ["editor", "regime", "cov", "n_edits", "metric", "value"], "edit_domain_degradation")
    sel = curves[(curves["editor"] == editor) & (curves["regime"] == regime) & (curves["cov"] == cov)]
    title = title or (f"Differential degradation across domains: {editor.upper()} {regime}, "
                      f"{_edit_c_name(cov)}")
    fig = _subplots(1, 2, title, subplot_titles=("preservation task (share of pre-edit score)",
                                                      "held-out NLL change (nats)"))
    tasks = list(tasks) if tasks is not None else [t for t in EDIT_TASKS if t in set(sel["metric"])]
    for t in tasks:
        g = sel[sel["metric"] == t].sort_values("n_edits")
        base = g.loc[g["n_edits"] == 0, "value"]
        if g.empty or base.empty or not float(base.iloc[0]) > 0:
            continue
        colour = EDIT_TASKS.get(t, (t, PALETTE["neutral"]))[1]
        fig.add_scatter(x=g["n_edits"], y=g["value"] / float(base.iloc[0]), mode="lines+markers",
                        name=_edit_task_label(t),
                        line={"color": colour, "dash": "dot" if t == "arith_raw" else None},
                        customdata=g["value"], hovertemplate="%{x} edits: %{y:.0%} of pre-edit (score "
                        "%{customdata:.3f})<extra>" + t + "</extra>", row=1, col=1)
    for d, colour in _EDIT_DOMAINS.items():
        g = sel[sel["metric"] == f"nll:{d}"].sort_values("n_edits")
        base = g.loc[g["n_edits"] == 0, "value"]
        if g.empty or base.empty:
            continue
        fig.add_scatter(x=g["n_edits"], y=g["value"] - float(base.iloc[0]), mode="lines+markers",
                        name=f"NLL {d}", line={"color": colour, "dash": "dash"},
                        hovertemplate="%{x} edits: ΔNLL %{y:+.3f}<extra>" + d + "</extra>", row=1, col=2)
    fig.update_xaxes(title_text="number of sequential edits")
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%", row=1, col=1)
    fig.update_layout(height=430)
    return fig


def edit_hm_curves(curves: pd.DataFrame, editor: str = "memit", edit_metric: str = "S_e",
                   covs: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Figs. 4/8: edit HM (top) and preservation HM ``S_p`` (bottom) against the number of edits, batch
    (left) and sequential (right), one line per C; the band between C_Moir and C_Wiki is shaded."""
    _require(curves, ["editor", "regime", "cov", "n_edits", "metric", "value"], "edit_hm_curves")
    sel = curves[curves["editor"] == editor]
    regimes = [r for r in ("batch", "sequential") if r in set(sel["regime"])] or ["batch"]
    covs = list(covs) if covs is not None else list(dict.fromkeys(sel["cov"]))
    edit_name = "S_e" if edit_metric == "S_e" else "S_e without Portability"
    name = "MEMIT" if editor == "memit" else "AlphaEdit"
    fig = _subplots(2, len(regimes), title or f"{name}: edit and preservation harmonic means",
                         shared_xaxes=True, vertical_spacing=0.08,
                         subplot_titles=[f"{r}: {x}" for x in (edit_name, "S_p") for r in regimes])
    for j, regime in enumerate(regimes, start=1):
        for i, metric in enumerate((edit_metric, "S_p"), start=1):
            g = sel[(sel["regime"] == regime) & (sel["metric"] == metric)]
            if metric == edit_metric:
                g = g[g["n_edits"] > 0]
            _edit_c_lines(fig, g, covs, i, j)
            if metric == "S_p" and {"wiki", "moir"} <= set(g["cov"]):
                _edit_gap(fig, g[g["cov"] == "moir"], g[g["cov"] == "wiki"], i, j, showlegend=(j == 1))
    _edit_x(fig, sel)
    fig.update_xaxes(title_text="number of edits", row=2)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(height=560)
    return fig


def edit_task_curves(curves: pd.DataFrame, editor: str = "memit", tasks: Sequence[str] | None = None,
                     covs: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Figs. 5/9: per-task preservation against the number of edits; rows are regimes, columns tasks,
    one line per C and the C_Moir − C_Wiki band shaded. The pre-edit score is the point at N = 0."""
    _require(curves, ["editor", "regime", "cov", "n_edits", "metric", "value"], "edit_task_curves")
    sel = curves[curves["editor"] == editor]
    regimes = [r for r in ("batch", "sequential") if r in set(sel["regime"])] or ["batch"]
    tasks = list(tasks) if tasks is not None else [t for t in EDIT_TASKS if t in set(sel["metric"])]
    covs = list(covs) if covs is not None else list(dict.fromkeys(sel["cov"]))
    fig = _subplots(len(regimes), max(len(tasks), 1), title or f"Per-task preservation under "
                         f"{'MEMIT' if editor == 'memit' else 'AlphaEdit'}", shared_yaxes=True,
                         horizontal_spacing=0.03, vertical_spacing=0.12,
                         subplot_titles=[f"{r}: {_edit_task_label(t)}" for r in regimes for t in tasks])
    for i, regime in enumerate(regimes, start=1):
        for j, task in enumerate(tasks, start=1):
            g = sel[(sel["regime"] == regime) & (sel["metric"] == task)]
            _edit_c_lines(fig, g, covs, i, j, marker={"size": 5})
            if {"wiki", "moir"} <= set(g["cov"]):
                _edit_gap(fig, g[g["cov"] == "moir"], g[g["cov"] == "wiki"], i, j,
                          showlegend=(i == 1 and j == 1))
    fig.update_xaxes(title_text="edits", row=len(regimes))
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(height=300 * len(regimes) + 120)
    return fig


def edit_radar(final: pd.DataFrame, baseline: dict[str, float] | None = None,
               tasks: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Fig. 6: per-task preservation as a radar chart, one polar panel per setting (editor × regime at
    its largest N), one polygon per C and the pre-edit polygon dashed.

    ``final``: one row per ``editor, regime, cov`` with a column per task (e.g.
    :func:`moir_lib.chapters.lab_tables.wide` at the last N); ``baseline``: task -> pre-edit score.
    """
    _require(final, ["editor", "regime", "cov"], "edit_radar")
    tasks = list(tasks) if tasks is not None else [t for t in EDIT_TASKS if t in final.columns]
    settings = list(dict.fromkeys(zip(final["editor"], final["regime"], strict=True)))
    n = max(len(settings), 1)
    names = [f"{'MEMIT' if e == 'memit' else 'AlphaEdit'} {r}" for e, r in settings]
    fig = _subplots(1, n, title or "Where the preservation gap lives: per-task scores after editing",
                         specs=[[{"type": "polar"}] * n], subplot_titles=names)
    theta = [_edit_task_label(t) for t in tasks] + [_edit_task_label(tasks[0])] if tasks else []
    for j, (e, r) in enumerate(settings, start=1):
        if baseline:
            vals = [baseline.get(t, np.nan) for t in tasks]
            fig.add_trace(go.Scatterpolar(r=vals + vals[:1], theta=theta, name="pre-edit", legendgroup="none",
                                          showlegend=(j == 1),
                                          line={"color": PALETTE["neutral"], "dash": "dash"}), row=1, col=j)
        g = final[(final["editor"] == e) & (final["regime"] == r)]
        for _, row in g.iterrows():
            vals = [float(row.get(t, np.nan)) for t in tasks]
            n_label = f" (N={int(row['n_edits'])})" if "n_edits" in row else ""
            fig.add_trace(go.Scatterpolar(r=vals + vals[:1], theta=theta, name=_edit_c_name(row["cov"]),
                                          legendgroup=row["cov"], showlegend=(j == 1), fill="toself",
                                          opacity=0.55,
                                          line={"color": _edit_c_colour(row["cov"])},
                                          hovertemplate="%{theta}: %{r:.3f}<extra>" + _edit_c_name(row["cov"])
                                          + n_label + "</extra>"), row=1, col=j)
    fig.update_polars(radialaxis={"range": [0, 1], "tickvals": [0.25, 0.5, 0.75, 1.0]})
    fig.update_layout(height=440, margin={"t": 110})
    return fig


def edit_distortion_bars(distortion: pd.DataFrame, title: str | None = None) -> go.Figure:
    """The mechanism: the relative change ``tr(ΔW C_d ΔWᵀ)/tr(W C_d Wᵀ)`` of ``down_proj``'s output on each
    pocket domain's keys (log scale), one bar group per domain, one bar per C.

    ``distortion``: :func:`moir_lib.chapters.lab_tables.distortion_table` (``cov`` and one column per domain).
    """
    _require(distortion, ["cov"], "edit_distortion_bars")
    domains = [d for d in _EDIT_DOMAINS if d in distortion.columns]
    fig = _fig(title or "Which domain's outputs does each C let the edit move?", "domain of the keys",
               "tr(ΔW C_d ΔWᵀ) / tr(W C_d Wᵀ)", barmode="group")
    for _, row in distortion.iterrows():
        fig.add_bar(x=domains, y=[row[d] for d in domains], name=_edit_c_name(row["cov"]),
                    marker_color=_edit_c_colour(row["cov"]),
                    hovertemplate="%{x}: %{y:.3g}<extra>" + _edit_c_name(row["cov"]) + "</extra>")
    fig.update_yaxes(type="log")
    return fig


def edit_strategy_ablation(ablation: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Table 2 as curves: edit HM (left) and S_p (right) against N for each seed strategy of C_Moir.

    ``ablation``: :func:`moir_lib.chapters.editing.strategy_ablation` (``strategy``, ``S_e@N``...,
    ``S_p@N``...).
    """
    _require(ablation, ["strategy"], "edit_strategy_ablation")
    fig = _subplots(1, 2, title or "Seed strategy of the self-generated C (MEMIT batch)",
                         subplot_titles=("edit HM", "S_p"))
    for col, prefix in ((1, "S_e@"), (2, "S_p@")):
        cols = [c for c in ablation.columns if c.startswith(prefix)]
        ns = [int(c.removeprefix(prefix)) for c in cols]
        for _, row in ablation.iterrows():
            cov = f"moir-{row['strategy']}"
            fig.add_scatter(x=ns, y=[row[c] for c in cols], mode="lines+markers", name=str(row["strategy"]),
                            legendgroup=cov, showlegend=(col == 1), line={"color": _edit_c_colour(cov)},
                            hovertemplate="N=%{x}: %{y:.3f}<extra>" + str(row["strategy"]) + "</extra>",
                            row=1, col=col)
    fig.update_xaxes(title_text="number of edits")
    fig.update_layout(height=400)
    return fig


def budget_curve(intervals: pd.DataFrame, tolerance: float | None = None) -> go.Figure:
    """The sample budget of C (chapter 01; :func:`moir_lib.experiments.budget_curve.intervals`): against the
    prefix's key vectors per key dimension (log scale), the relative change of MEMIT's (solid) and
    AlphaEdit's (dashed) update from the whole C's (left) and the gap of the top-k subspaces AlphaEdit
    protects (right), one colour per C, whiskers the 95 % interval over the C draws; ``tolerance``: a
    dotted line at the ΔW change deemed enough."""
    _require(intervals, ["cov", "metric", "keys_per_dim", "value", "lo", "hi"], "budget_curve")
    fig = _subplots(1, 2, "How far the editors' updates move with fewer samples behind C",
                    subplot_titles=("‖ΔW − ΔW_full‖ / ‖ΔW_full‖", "top-k subspace gap (mean sin²)"))
    panels = {1: (("memit_dW", "MEMIT", "solid"), ("alphaedit_dW", "AlphaEdit", "dash")),
              2: (("gap", "subspace", "dot"),)}
    for col, measures in panels.items():
        for cov in sorted(intervals["cov"].unique()):
            for metric, name, dash in measures:
                g = intervals[(intervals["cov"] == cov) & (intervals["metric"] == metric)]
                g = g.sort_values("keys_per_dim")
                if g.empty:
                    continue
                err = {"type": "data", "symmetric": False, "array": list((g["hi"] - g["value"]).fillna(0)),
                       "arrayminus": list((g["value"] - g["lo"]).fillna(0)), "visible": True}
                fig.add_trace(go.Scatter(x=list(g["keys_per_dim"]), y=list(g["value"]), error_y=err,
                                         mode="lines+markers", name=f"{_edit_c_name(cov)}: {name}",
                                         line={"color": _edit_c_colour(cov), "dash": dash},
                                         text=list(g["fraction"]),
                                         hovertemplate="prefix %{text}: %{y:.3f}<extra></extra>"),
                              row=1, col=col)
    if tolerance is not None:
        fig.add_hline(y=tolerance, line={"color": PALETTE["neutral"], "dash": "dot"}, row=1, col=1)
    fig.update_xaxes(type="log", title_text="key vectors per key dimension")
    fig.update_yaxes(rangemode="tozero")
    return fig
