"""Figures of the proof-check chapter (``notebooks/04_g_cancellation``), fed by :mod:`moir_lib.theory`:
Proposition 1's errors, Remark 1's limits (MEMIT as λ → 0⁺, AlphaEdit's τ) and Lemma 2's ratios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.style import PALETTE, _fig, _require


def prop1_error_hist(prop1: pd.DataFrame, error_col: str = "rel_err", floor: float = 1e-17) -> go.Figure:
    """Distribution of log10 relative errors of Proposition 1, one histogram per G rank class.

    ``prop1``: one row per instance with ``g_class`` ("full rank" / "rank-deficient") and
    ``error_col`` (:func:`moir_lib.theory.check_prop1`). Errors below ``floor`` (exact zeros) are
    drawn at ``floor``. The worst error is marked with a dashed line.
    """
    _require(prop1, ["g_class", error_col], "prop1_error_hist")
    colours = {"full rank": PALETTE["wiki"], "rank-deficient": PALETTE["moir"]}
    fig = _fig(
        "Proposition 1: direct KKT solve vs closed form",
        f"log10 relative error ({error_col}, dimensionless)",
        "instances (count)",
        barmode="overlay",
    )
    for cls, sub in prop1.groupby("g_class", sort=True):
        vals = np.log10(np.maximum(sub[error_col].to_numpy(dtype=float), floor))
        fig.add_histogram(
            x=vals,
            name=f"G {cls} (n={len(sub)})",
            marker_color=colours.get(str(cls), PALETTE["neutral"]),
            opacity=0.65,
            nbinsx=40,
        )
    worst = float(np.log10(max(prop1[error_col].max(), floor)))
    fig.add_vline(
        x=worst,
        line_dash="dash",
        line_color=PALETTE["neutral"],
        annotation_text=f"max = 1e{worst:.1f}",
        annotation_position="top left",
    )
    return fig


def memit_limit_loglog(
    curve: pd.DataFrame, slope: float | None = None, intercept: float | None = None
) -> go.Figure:
    """Remark 1 (i): MEMIT's distance to the closed-form limit vs lambda, log-log, with fitted slope.

    ``curve``: rows ``lam``, ``rel_err`` and optionally ``in_fit`` (the asymptotic range used for
    the fit, :func:`moir_lib.theory.memit_limit_curve` / ``fit_loglog``). Without ``slope`` and
    ``intercept`` the line is fitted here by least squares of log10 rel_err on log10 lam over the
    ``in_fit`` rows (all rows if the column is absent).
    """
    _require(curve, ["lam", "rel_err"], "memit_limit_loglog")
    lam, err = curve["lam"].to_numpy(dtype=float), curve["rel_err"].to_numpy(dtype=float)
    in_fit = curve["in_fit"].to_numpy(dtype=bool) if "in_fit" in curve else np.ones(lam.size, bool)
    if slope is None or intercept is None:
        slope, intercept = (float(v) for v in np.polyfit(np.log10(lam[in_fit]), np.log10(err[in_fit]), 1))
    fig = _fig(
        "Remark 1 (i): MEMIT → constrained closed form as λ → 0⁺",
        "λ (penalty weight, dimensionless)",
        "‖ΔW_MEMIT(λ) − ΔW*‖_F / ‖ΔW*‖_F",
    )
    fig.add_scatter(
        x=lam,
        y=err,
        mode="markers+lines",
        name="measured",
        marker_color=PALETTE["wiki"],
        line={"width": 1},
        customdata=in_fit,
        hovertemplate="λ=%{x:.2e}<br>error=%{y:.2e}<br>in fit: %{customdata}<extra></extra>",
    )
    xf = lam[in_fit]
    fig.add_scatter(
        x=xf,
        y=10 ** (intercept + slope * np.log10(xf)),
        mode="lines",
        name=f"fit: slope {slope:.3f}",
        line={"color": PALETTE["moir"], "dash": "dash", "width": 3},
    )
    fig.add_annotation(
        x=math.log10(float(np.median(xf))),
        y=math.log10(float(np.median(err[in_fit]))),
        text=f"error ∝ λ^{slope:.3f}",
        showarrow=True,
        arrowhead=2,
        ax=-60,
        ay=-40,
    )
    fig.update_xaxes(type="log", exponentformat="power")
    fig.update_yaxes(type="log", exponentformat="power")
    return fig


def alphaedit_tau_curve(tau_curve: pd.DataFrame) -> go.Figure:
    """Remark 1 (ii): AlphaEdit's leak ``‖ΔW K0‖/(‖ΔW‖‖K0‖)`` vs the null-space threshold τ.

    ``tau_curve``: rows ``tau``, ``residual``, ``null_dim`` and ``paper_grid`` (bool: τ in the
    paper's grid) from :func:`moir_lib.theory.alphaedit_tau_curve`. Log-log axes; the paper's τ
    values are marked with vertical lines and highlighted points; the kept null-space dimension
    is shown on hover and on a secondary axis.
    """
    _require(tau_curve, ["tau", "residual", "null_dim"], "alphaedit_tau_curve")
    df = tau_curve.sort_values("tau")
    fig = _fig(
        "Remark 1 (ii): AlphaEdit leak into K₀ vs null-space threshold τ",
        "τ (absolute eigenvalue threshold on C, units of C)",
        "‖ΔW K₀‖_F / (‖ΔW‖_F ‖K₀‖_F)",
    )
    fig.add_scatter(
        x=df["tau"],
        y=df["residual"],
        mode="markers+lines",
        name="relative leak",
        marker_color=PALETTE["wiki"],
        customdata=df["null_dim"],
        hovertemplate="τ=%{x:.1e}<br>leak=%{y:.2e}<br>null dim=%{customdata}<extra></extra>",
    )
    fig.add_scatter(
        x=df["tau"],
        y=df["null_dim"],
        mode="lines",
        name="null-space dimension kept",
        yaxis="y2",
        line={"color": PALETTE["neutral"], "dash": "dot", "shape": "hv"},
    )
    if "paper_grid" in df:
        grid = df[df["paper_grid"].astype(bool)]
        fig.add_scatter(
            x=grid["tau"],
            y=grid["residual"],
            mode="markers",
            name="paper's τ grid",
            marker={"color": PALETTE["moir"], "size": 11, "symbol": "diamond"},
        )
        for t in grid["tau"]:
            # shapes take data coordinates on log axes (annotations take log10 ones)
            fig.add_vline(x=float(t), line_dash="dash", line_color=PALETTE["moir"], opacity=0.4)
    fig.update_xaxes(type="log", exponentformat="power")
    fig.update_layout(
        yaxis={"type": "log", "exponentformat": "power"},
        yaxis2={
            "title": "null-space dimension (count)",
            "type": "linear",
            "tickmode": "auto",
            "nticks": 6,
            "rangemode": "tozero",
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
        },
        legend={"x": 0.02, "y": 0.98},
    )
    return fig


_RATIO_LABELS: dict[str, str] = {
    "ratio_tv": "Lemma 2: ‖ΔΣ‖_F / (2M² TV)",
    "ratio_jsd": "eq. (jsd-bound): ‖ΔΣ‖_F / (2√2 M² √JSD), nats",
    "ratio_tv_sharp": "sharp constant: ‖ΔΣ‖_F / (√2 M² TV)",
    "pinsker_nats": "TV / √(2 JSD), nats",
    "pinsker_bits": "TV / √(2 JSD), bits",
    "pinsker_dist": "TV / √(2 JSD), JS distance",
}


def lemma2_ratios(
    lemma2: pd.DataFrame, columns: Sequence[str] = ("ratio_tv", "ratio_jsd"), show_sharp: bool = True
) -> go.Figure:
    """Lemma 2 and eq. (jsd-bound): histograms of (left side)/(right side); the bound is ratio 1.

    ``lemma2``: one row per instance (:func:`moir_lib.theory.lemma2_check`). Every ratio must lie
    left of the solid line at 1. With ``show_sharp`` a dotted line marks 1/√2, the largest value
    the Frobenius ratio can take (see ``lemma2_check``'s docstring).
    """
    _require(lemma2, list(columns), "lemma2_ratios")
    colours = [PALETTE["wiki"], PALETTE["moir"], PALETTE["oracle"], PALETTE["bos"], PALETTE["neutral"]]
    fig = _fig(
        "Lemma 2 and the JSD bound: left side / right side",
        "ratio (dimensionless; the bound holds iff ≤ 1)",
        "instances (count)",
        barmode="overlay",
    )
    for col, colour in zip(columns, colours, strict=False):
        fig.add_histogram(
            x=lemma2[col],
            name=f"{_RATIO_LABELS.get(col, col)} (max {lemma2[col].max():.4f})",
            marker_color=colour,
            opacity=0.6,
            nbinsx=50,
        )
    fig.add_vline(x=1.0, line_color="black", line_width=2, annotation_text="bound", annotation_position="top")
    if show_sharp:
        fig.add_vline(
            x=1 / math.sqrt(2),
            line_color=PALETTE["neutral"],
            line_dash="dot",
            annotation_text="1/√2 (sharp)",
            annotation_position="top left",
        )
    fig.update_layout(legend={"x": 0.02, "y": 0.98})
    return fig
