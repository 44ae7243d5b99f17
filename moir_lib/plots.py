"""Every figure of the book; plots read tidy tables, never live models.

Each function takes one or more tidy tables (``pandas.DataFrame``, one row per observation, as
written by the library and the notebooks) and returns a ``plotly.graph_objects.Figure``. Colours
come from the single :data:`PALETTE`. :func:`setup_notebook` makes figures render offline (the
notebook renderer embeds plotly.js, so the built HTML book needs no internet).

Proof-check chapter (``notebooks/04_g_cancellation``), fed by :mod:`moir_lib.theory`:
:func:`prop1_error_hist`, :func:`memit_limit_loglog`, :func:`alphaedit_tau_curve`,
:func:`lemma2_ratios`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

PALETTE: dict[str, str] = {
    "wiki": "#4A90E2",  # Wikipedia-estimated C (blue)
    "moir": "#D6604D",  # self-generated C (red)
    "oracle": "#43A247",  # pretraining-mixture oracle C (green)
    "bos": "#D9822B",  # BOS-seeded self-generation (orange)
    "neutral": "#7F7F7F",  # references, bounds, grids (grey)
}

TEMPLATE_NAME = "moir"


def _template() -> go.layout.Template:
    base = pio.templates["plotly_white"]
    t = go.layout.Template(base)
    t.layout.font = {"family": "Helvetica, Arial, sans-serif", "size": 13}
    t.layout.colorway = [PALETTE[k] for k in ("wiki", "moir", "oracle", "bos", "neutral")]
    t.layout.title = {"x": 0.02, "xanchor": "left"}
    t.layout.margin = {"l": 70, "r": 30, "t": 70, "b": 60}
    t.layout.legend = {"bgcolor": "rgba(255,255,255,0.7)"}
    return t


def setup_notebook() -> None:
    """Offline rendering (``plotly_mimetype+notebook``) and the book's template as the default."""
    pio.templates[TEMPLATE_NAME] = _template()
    pio.templates.default = TEMPLATE_NAME
    pio.renderers.default = "plotly_mimetype+notebook"


def _fig(title: str, x_title: str, y_title: str, **layout: object) -> go.Figure:
    if TEMPLATE_NAME not in pio.templates:
        pio.templates[TEMPLATE_NAME] = _template()
    fig = go.Figure()
    fig.update_layout(template=TEMPLATE_NAME, title=title, xaxis_title=x_title, yaxis_title=y_title, **layout)
    return fig


def _require(df: pd.DataFrame, cols: Sequence[str], who: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{who}: table lacks columns {missing}; it has {list(df.columns)}")


# ---------------------------------------------------------------------------------------------
# proof-check chapter
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# causal tracing
# ---------------------------------------------------------------------------------------------


def tracing_heatmap(aligned: pd.DataFrame, labels: Sequence[str] | None = None,
                    title: str | None = None) -> go.Figure:
    """Appendix C.4: mean indirect effect per (layer, aligned position), ROME's purple heat map.

    ``aligned``: one row per (layer, slot) with ``layer``, ``slot`` (column order), ``label``,
    ``ie`` and optionally ``n`` (prompts averaged), as :func:`moir_lib.tracing.aligned_table`
    writes it. ``labels``: every slot's label in order (``tracing.SLOT_LABELS``), so slots no
    prompt reaches show as gaps; default, the slots present. Dotted lines separate the
    positions before, on and after the subject.
    """
    _require(aligned, ["layer", "slot", "label", "ie"], "tracing_heatmap")
    if aligned.empty:
        fig = _fig(title or "Causal trace: indirect effect of restoring one hidden state",
                   "aligned token position (relative to the subject)", "layer (restored residual output)")
        fig.add_annotation(text="no valid prompt: nothing to average", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
        return fig
    aligned = aligned.astype({"layer": int, "slot": int, "ie": float})
    if labels is not None:
        slots = pd.DataFrame({"slot": range(len(labels)), "label": list(labels)})
    else:
        slots = aligned.drop_duplicates("slot").sort_values("slot")[["slot", "label"]]
    layers = sorted(aligned["layer"].unique())
    z = aligned.pivot(index="layer", columns="slot", values="ie").reindex(index=layers, columns=slots["slot"])
    n = (aligned.pivot(index="layer", columns="slot", values="n").reindex(index=layers, columns=slots["slot"])
         if "n" in aligned else z * np.nan)
    fig = _fig(title or "Causal trace: indirect effect of restoring one hidden state",
               "aligned token position (relative to the subject)", "layer (restored residual output)")
    fig.add_heatmap(
        z=z.to_numpy(dtype=float), x=list(slots["label"]), y=layers, colorscale="Purples",
        colorbar={"title": "IE"}, customdata=n.to_numpy(dtype=float),
        hovertemplate="%{x}, layer %{y}<br>IE=%{z:.3f}<br>prompts=%{customdata}<extra></extra>",
    )
    labels = list(slots["label"])
    subject = [i for i, lab in enumerate(labels) if "subject" in str(lab)]
    if subject:
        for x in (subject[0] - 0.5, subject[-1] + 0.5):
            fig.add_vline(x=x, line_dash="dot", line_color=PALETTE["neutral"])
    fig.update_yaxes(dtick=1 if len(layers) <= 16 else None)
    fig.update_xaxes(tickangle=-45)
    return fig


def tracing_layer_curve(curve: pd.DataFrame, window: Sequence[int], profile_layers: Sequence[int] = (),
                        last_token: pd.DataFrame | None = None, title: str | None = None) -> go.Figure:
    """Appendix C.4: indirect effect at the last subject token per layer, the chosen window shaded.

    ``curve``: rows ``layer``, ``ie`` and optionally ``sem`` (standard error over prompts, drawn as
    a band); ``window``: the selected contiguous edit layers (shaded green); ``profile_layers``:
    the profile's current ``edit_layers``, outlined when they differ from the window;
    ``last_token``: optionally the same curve at the prompt's last token (grey, dotted).
    """
    _require(curve, ["layer", "ie"], "tracing_layer_curve")
    df = curve.sort_values("layer")
    fig = _fig(title or "Indirect effect at the last subject token",
               "layer (restored residual output)", "mean indirect effect (fraction of P_clean − P_corrupted)")
    if window:
        fig.add_vrect(x0=min(window) - 0.5, x1=max(window) + 0.5, fillcolor=PALETTE["oracle"], opacity=0.18,
                      line_width=0, annotation_text=f"window {min(window)}–{max(window)}",
                      annotation_position="top left")
    if profile_layers and sorted(profile_layers) != sorted(window):
        fig.add_vrect(x0=min(profile_layers) - 0.5, x1=max(profile_layers) + 0.5, fillcolor="rgba(0,0,0,0)",
                      line={"color": PALETTE["neutral"], "dash": "dash", "width": 2},
                      annotation_text="profile", annotation_position="bottom left")
    if "sem" in df:
        x = df["layer"].to_numpy(dtype=float)
        lo = (df["ie"] - df["sem"].fillna(0)).to_numpy(dtype=float)
        hi = (df["ie"] + df["sem"].fillna(0)).to_numpy(dtype=float)
        fig.add_scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]), fill="toself",
                        fillcolor="rgba(74,144,226,0.2)", line={"width": 0}, mode="lines", hoverinfo="skip",
                        name="± 1 s.e.m. over prompts")
    if last_token is not None:
        _require(last_token, ["layer", "ie"], "tracing_layer_curve")
        late = last_token.sort_values("layer")
        fig.add_scatter(x=late["layer"], y=late["ie"], mode="lines+markers", name="IE, last prompt token",
                        line={"color": PALETTE["neutral"], "dash": "dot", "width": 2},
                        hovertemplate="layer %{x}<br>IE=%{y:.3f} (last token)<extra></extra>")
    fig.add_scatter(x=df["layer"], y=df["ie"], mode="lines+markers", name="IE, last subject token",
                    line={"color": PALETTE["wiki"], "width": 3},
                    hovertemplate="layer %{x}<br>IE=%{y:.3f}<extra></extra>")
    fig.add_hline(y=0, line_color=PALETTE["neutral"], line_width=1)
    if df["ie"].isna().all():
        fig.add_annotation(text="no valid prompt: nothing to average", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    fig.update_xaxes(dtick=1 if len(df) <= 16 else None)
    fig.update_layout(legend={"orientation": "h", "x": 1, "y": 1.02, "xanchor": "right", "yanchor": "bottom"})
    return fig


# ---------------------------------------------------------------------------------------------
# self-generation
# ---------------------------------------------------------------------------------------------

#: Seed strategies: BOS orange, rand×1 Moir red, longer random prefixes in paler reds (the paper's Table 2).
STRATEGY_COLOURS: dict[str, str] = {"bos": PALETTE["bos"], "rand1": PALETTE["moir"], "rand2": "#E08A7E",
                                    "rand3": "#EAAEA4", "rand4": "#F2CFC9"}
#: Domains and corpora beyond the four palette roles (web, code, math, chat, prose, other).
DOMAIN_COLOURS: dict[str, str] = {"wiki": PALETTE["wiki"], "web": "#8E6BB8", "prose": "#8E6BB8",
                                  "code": "#1FA6B8", "math": "#8C5A3C", "chat": "#3B3B3B",
                                  "post-training": "#3B3B3B", "other": "#C9C9C9"}


def _strategy_colour(strategy: str) -> str:
    return STRATEGY_COLOURS.get(strategy, PALETTE["neutral"])


def _subplots(rows: int, cols: int, title: str, **kwargs: object) -> go.Figure:
    from plotly.subplots import make_subplots

    if TEMPLATE_NAME not in pio.templates:
        pio.templates[TEMPLATE_NAME] = _template()
    fig = make_subplots(rows=rows, cols=cols, **kwargs)
    fig.update_layout(template=TEMPLATE_NAME, title=title)
    return fig


def _token_label(token: object) -> str:
    """A token or word as a visible label: newlines ⏎, tabs ⇥, leading/trailing spaces ␣, empty ∅."""
    text = str(token)
    if text == "":
        return "∅"
    text = text.replace("\n", "⏎").replace("\t", "⇥")
    stripped = text.strip(" ")
    lead, trail = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
    return "␣" * lead + stripped + "␣" * trail if stripped else "␣" * len(text)


def first_token_bars(first_tokens: pd.DataFrame, strategies: Sequence[str] = ("bos", "rand1"),
                     k: int = 10, title: str | None = None) -> go.Figure:
    """Fig. 10 analogue: the ``k`` most frequent first generated tokens per seed strategy, one panel each.

    ``first_tokens``: ``strategy, rank, token, share`` (:func:`moir_lib.analysis.selfgen.first_tokens`).
    Bars are shares of the strategy's samples with their 95 % intervals (``stderr`` column, when given);
    the x axes are shared, so a collapse shows as one long bar.
    """
    _require(first_tokens, ["strategy", "rank", "token", "share"], "first_token_bars")
    shown = [s for s in strategies if s in set(first_tokens["strategy"])]
    if not shown:
        raise ValueError(f"first_token_bars: none of {list(strategies)} in the table")
    fig = _subplots(1, len(shown), title or "First generated token: share of samples (Fig. 10)",
                    subplot_titles=shown, shared_xaxes=True, horizontal_spacing=0.12)
    for i, strategy in enumerate(shown, 1):
        df = first_tokens[first_tokens["strategy"] == strategy].sort_values("rank").head(k)
        fig.add_bar(x=df["share"], y=[f"{r}. {_token_label(t)}" for r, t in zip(df["rank"], df["token"],
                                                                                strict=True)],
                    error_x=_stderr_whiskers(df.get("stderr")),
                    orientation="h", marker_color=_strategy_colour(strategy), name=strategy, showlegend=False,
                    hovertemplate="%{y}: %{x:.1%}<extra>" + strategy + "</extra>", row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i)
        fig.update_xaxes(tickformat=".0%", title_text="share of samples", row=1, col=i)
    fig.update_layout(height=max(320, 60 + 26 * k))
    return fig


def first_words_bars(first_words: pd.DataFrame, strategies: Sequence[str] = ("bos", "rand1"), k: int = 5,
                     title: str | None = None) -> go.Figure:
    """Fig. 10 analogue: the top-``k`` words at each of the first generated positions, one row of panels
    per seed strategy (``first_words``: ``strategy, position, rank, word, share``)."""
    _require(first_words, ["strategy", "position", "rank", "word", "share"], "first_words_bars")
    shown = [s for s in strategies if s in set(first_words["strategy"])]
    if not shown:
        raise ValueError(f"first_words_bars: none of {list(strategies)} in the table")
    positions = sorted(first_words["position"].unique())
    fig = _subplots(len(shown), len(positions), title or "First generated words by position (Fig. 10)",
                    subplot_titles=[f"{s}: word {p}" for s in shown for p in positions], shared_xaxes=True,
                    horizontal_spacing=0.08, vertical_spacing=0.12)
    for r, strategy in enumerate(shown, 1):
        for c, pos in enumerate(positions, 1):
            df = first_words.query("strategy == @strategy and position == @pos").sort_values("rank").head(k)
            fig.add_bar(x=df["share"], y=[_token_label(w) for w in df["word"]], orientation="h",
                        marker_color=_strategy_colour(strategy), showlegend=False,
                        hovertemplate="%{y}: %{x:.1%}<extra>" + f"{strategy}, word {pos}" + "</extra>",
                        row=r, col=c)
            fig.update_yaxes(autorange="reversed", row=r, col=c)
            fig.update_xaxes(tickformat=".0%", row=r, col=c)
    fig.update_layout(height=max(360, 80 + 40 * k * len(shown)))
    return fig


def seed_strategy_shares(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Collapse by seed strategy: the top-1 first-token share and the shares of samples that open with /
    contain a chat tag, one bar per strategy (``table``: :func:`moir_lib.analysis.selfgen.strategy_table`),
    with 95 % whiskers where the table has the shares' standard errors."""
    _require(table, ["strategy", "top1_share", "starts_with_tag", "chat_share"], "seed_strategy_shares")
    metrics = {"top1_share": "top-1 first token", "starts_with_tag": "opens with a chat tag",
               "chat_share": "contains a chat tag"}
    fig = _fig(title or "How much of each seed strategy is trapped", "", "share of samples",
               barmode="group")
    errors = {"top1_share": "top1_stderr", "starts_with_tag": "starts_stderr", "chat_share": "chat_stderr"}
    for _, row in table.iterrows():
        stderr = pd.Series([row.get(errors[m], np.nan) for m in metrics], dtype=float)
        fig.add_bar(x=list(metrics.values()), y=[row[m] for m in metrics], name=row["strategy"],
                    marker_color=_strategy_colour(row["strategy"]), error_y=_stderr_whiskers(stderr),
                    hovertemplate="%{x}: %{y:.1%}<extra>" + row["strategy"] + "</extra>")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    return fig


def domain_mix_bars(mixes: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Domain mix of each strategy's samples as stacked horizontal bars (``mixes``: ``strategy, domain,
    share``; :func:`moir_lib.analysis.selfgen.domain_mixes`)."""
    _require(mixes, ["strategy", "domain", "share"], "domain_mix_bars")
    strategies = list(dict.fromkeys(mixes["strategy"]))
    fig = _fig(title or "What the samples are about (heuristic domain classifier)", "share of samples", "",
               barmode="stack")
    for domain in dict.fromkeys(mixes["domain"]):
        df = mixes[mixes["domain"] == domain].set_index("strategy").reindex(strategies)
        fig.add_bar(y=strategies, x=df["share"], name=domain, orientation="h",
                    marker_color=DOMAIN_COLOURS.get(domain, PALETTE["neutral"]),
                    hovertemplate="%{y}: %{x:.1%}<extra>" + domain + "</extra>")
    fig.update_xaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(300, 120 + 45 * len(strategies)),
                      legend={"orientation": "h", "x": 0, "y": -0.2})
    return fig


# ---------------------------------------------------------------------------------------------
# NLL / JSD / C diagnostics
# ---------------------------------------------------------------------------------------------

#: Corpora of the NLL figure: Moir red, Moir-bos orange, wiki blue, the other domains as above.
CORPUS_COLOURS: dict[str, str] = {"moir": PALETTE["moir"], "moir-bos": PALETTE["bos"],
                                  "wiki": PALETTE["wiki"], "web": DOMAIN_COLOURS["web"],
                                  "code": DOMAIN_COLOURS["code"], "math": DOMAIN_COLOURS["math"]}
#: The compared covariances (Fig. 7): the palette's four roles.
C_COLOURS: dict[str, str] = {"C_Wiki": PALETTE["wiki"], "C_Moir": PALETTE["moir"],
                             "C_Moir-bos": PALETTE["bos"], "C_Oracle": PALETTE["oracle"]}
#: The two reference distributions: black, dotted (pretraining) and solid (post-training), as in Fig. 3.
REFERENCE_STYLES: dict[str, dict[str, object]] = {"pretraining": {"color": "#111111", "dash": "dot"},
                                                  "post-training": {"color": "#111111", "dash": "solid"}}


def nll_distributions(nll: pd.DataFrame, corpora: Sequence[str] | None = None, points: int = 512,
                      title: str | None = None) -> go.Figure:
    """Fig. 3 / Fig. 11a: per-document NLL densities (Gaussian KDE, Scott bandwidth, on one grid over the
    pooled P0.5-P99.5 of the shown values), the references in black (pretraining dotted, post-training
    solid).

    ``nll``: ``corpus, nll`` (:func:`moir_lib.analysis.alignment.nll_table`); ``corpora``: which to draw
    besides the references (default all).
    """
    from scipy.stats import gaussian_kde

    _require(nll, ["corpus", "nll"], "nll_distributions")
    names = list(dict.fromkeys(nll["corpus"]))
    wanted = corpora if corpora is not None else names
    shown = [c for c in wanted if c in names and c not in REFERENCE_STYLES]
    shown += [r for r in REFERENCE_STYLES if r in names]
    data = nll[nll["corpus"].isin(shown)]
    values = data["nll"].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if values.size < 2:
        raise ValueError("nll_distributions: need at least two finite NLL values")
    lo, hi = np.percentile(values, [0.5, 99.5])
    grid = np.linspace(lo, hi, points)
    fig = _fig(title or "Per-document NLL under the model (eq. (nll))", "NLL (nats per token)", "density")
    for name in shown:
        v = data.loc[data["corpus"] == name, "nll"].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if v.size < 2 or np.ptp(v) == 0:
            continue
        density = gaussian_kde(v, bw_method="scott")(grid)
        style = REFERENCE_STYLES.get(name)
        line = ({"color": style["color"], "dash": style["dash"], "width": 2.5} if style else
                {"color": CORPUS_COLOURS.get(name, PALETTE["neutral"]), "width": 2})
        fig.add_scatter(x=grid, y=density, mode="lines", name=f"{name} (n={v.size})", line=line,
                        hovertemplate="NLL %{x:.2f}: %{y:.3f}<extra>" + name + "</extra>")
    return fig


def jsd_bars(jsd: pd.DataFrame, value: str = "jsd", title: str | None = None) -> go.Figure:
    """Fig. 11b as bars: each corpus's Jensen–Shannon ``value`` (``jsd``: divergence, or ``distance``)
    against the pretraining (dotted outline) and post-training (solid) references, closest to
    post-training on top (``jsd``: :func:`moir_lib.analysis.alignment.jsd` rows)."""
    _require(jsd, ["corpus", "reference", value], "jsd_bars")
    post = jsd[jsd["reference"] == "post-training"].sort_values(value)
    order = list(post["corpus"]) + [c for c in dict.fromkeys(jsd["corpus"]) if c not in set(post["corpus"])]
    label = "Jensen–Shannon divergence (nats)" if value == "jsd" else f"Jensen–Shannon {value}"
    fig = _fig(title or "Distance of each corpus to the references (Fig. 11b)", label, "", barmode="group")
    for ref in ("pretraining", "post-training"):
        df = jsd[jsd["reference"] == ref].set_index("corpus").reindex(order)
        colours = [CORPUS_COLOURS.get(c, PALETTE["neutral"]) for c in order]
        solid = ref == "post-training"
        fig.add_bar(y=order, x=df[value], orientation="h", name=f"vs {ref}",
                    marker={"color": colours if solid else "rgba(255,255,255,0)",
                            "line": {"color": colours, "width": 2},
                            "pattern": {"shape": "" if solid else "."}},
                    hovertemplate="%{y}: %{x:.4f}<extra>vs " + ref + "</extra>")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(320, 100 + 50 * len(order)))
    return fig


def c_spectra(spectrum: pd.DataFrame, points: int | None = None, title: str | None = None) -> go.Figure:
    """Eigen-spectra of the compared C's: the share of the trace per eigenvalue (log scale) against its
    index, one panel per layer (``spectrum``: :class:`moir_lib.covariance.Diagnosis` ``spectrum``)."""
    _require(spectrum, ["name", "layer", "index", "share"], "c_spectra")
    layers = sorted(spectrum["layer"].unique(), key=lambda x: (x is None, x))
    fig = _subplots(1, len(layers), title or "Eigen-spectra of C (share of the trace)",
                    subplot_titles=[f"layer {layer}" for layer in layers], shared_yaxes=True)
    for c, layer in enumerate(layers, 1):
        for name in dict.fromkeys(spectrum["name"]):
            df = spectrum[(spectrum["name"] == name) & (spectrum["layer"] == layer)].sort_values("index")
            if points is not None:
                df = df.head(points)
            df = df[df["share"] > 0]
            fig.add_scatter(x=df["index"] + 1, y=df["share"], mode="lines", name=name, legendgroup=name,
                            showlegend=c == 1,
                            line={"color": C_COLOURS.get(name, PALETTE["neutral"]), "width": 2},
                            hovertemplate="λ_%{x}: %{y:.2e}<extra>" + name + "</extra>", row=1, col=c)
        fig.update_xaxes(type="log", title_text="eigenvalue index", row=1, col=c)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text="λᵢ / tr C", row=1, col=1)
    return fig


def principal_angles_heatmap(angles: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Mean cosine of the principal angles between the top-k eigenspaces of each pair of C's, averaged
    over layers (1: the same subspace; ``angles``: :func:`moir_lib.analysis.alignment.angle_summary`)."""
    _require(angles, ["a", "b", "mean_cos"], "principal_angles_heatmap")
    names = list(dict.fromkeys(list(angles["a"]) + list(angles["b"])))
    mean = angles.groupby(["a", "b"])["mean_cos"].mean()
    z = np.eye(len(names))
    for (a, b), v in mean.items():
        i, j = names.index(a), names.index(b)
        z[i, j] = z[j, i] = v
    k = f" (k = {int(angles['k'].iloc[0])})" if "k" in angles and len(angles) else ""
    fig = _fig(title or f"Do the C's protect the same directions? Mean cos of principal angles{k}", "", "")
    fig.add_heatmap(z=z, x=names, y=names, zmin=0, zmax=1, colorscale="Greys", colorbar={"title": "mean cos"},
                    text=np.round(z, 2), texttemplate="%{text}",
                    hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>")
    fig.update_yaxes(autorange="reversed", scaleanchor="x")
    fig.update_layout(height=480)
    return fig


def coverage_bars(coverage: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Fig. 7 ("knowledge coverage"): the share of each domain's key energy inside each C's top-k
    eigenspace, averaged over layers, grouped by domain; the dashed line is a random k-dimensional subspace
    (``k/d``). ``coverage``: :class:`moir_lib.covariance.Diagnosis` ``coverage`` (``name, domain, layer, k,
    coverage, random``)."""
    _require(coverage, ["name", "domain", "coverage"], "coverage_bars")
    mean = coverage.groupby(["name", "domain"], sort=False)["coverage"].mean()
    domains = list(dict.fromkeys(coverage["domain"]))
    k = f" (top-{int(coverage['k'].iloc[0])} eigenspace)" if "k" in coverage and len(coverage) else ""
    fig = _fig(title or f"Knowledge coverage: which domains does each C protect?{k}", "domain",
               "share of the domain's key energy covered", barmode="group")
    for name in dict.fromkeys(coverage["name"]):
        fig.add_bar(x=domains, y=[mean.get((name, d), np.nan) for d in domains], name=name,
                    marker_color=C_COLOURS.get(name, PALETTE["neutral"]),
                    hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>")
    if "random" in coverage and len(coverage):
        fig.add_hline(y=float(coverage["random"].mean()), line_dash="dash", line_color=PALETTE["neutral"],
                      annotation_text="random subspace (k/d)", annotation_position="top left")
    fig.update_yaxes(range=[0, 1])
    return fig


# ---------------------------------------------------------------------------------------------
# editing experiments
# ---------------------------------------------------------------------------------------------

#: C variants of the editing chapters (01, 05): Wiki blue, Moir red, oracle green, BOS orange; the
#: wiki-subset baseline a paler blue; the longer random prefixes of the seed ablation paler reds.
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


def _stderr_whiskers(stderr: pd.Series | None) -> dict | None:
    """Plotly error bars of the 95 % intervals of ``stderr`` (±Z95 standard errors; None without any)."""
    if stderr is None or not np.isfinite(stderr.to_numpy(dtype=float)).any():
        return None
    from moir_lib.evaluation.uncertainty import Z95

    return {"type": "data", "array": list(Z95 * stderr.fillna(0).to_numpy(dtype=float)), "visible": True}


def _whiskers(g: pd.DataFrame) -> dict | None:
    """Plotly ``error_y`` of the 95 % intervals in ``g``'s ``lo``/``hi`` columns (None without them)."""
    if not {"lo", "hi"} <= set(g.columns) or g[["lo", "hi"]].isna().all().all():
        return None
    return {"type": "data", "symmetric": False, "array": (g["hi"] - g["value"]).clip(lower=0).tolist(),
            "arrayminus": (g["value"] - g["lo"]).clip(lower=0).tolist(), "thickness": 1, "width": 3}


def claims_forest(claims: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Paired differences with their 95 % intervals (whiskers), one row per claim, coloured by verdict
    (``claims``: :func:`moir_lib.chapters.verdicts.claims_frame` rows: ``label``, ``value``, ``lo``, ``hi``,
    ``verdict``); the dashed line is no difference."""
    _require(claims, ["label", "value", "lo", "hi", "verdict"], "claims_forest")
    colours = {"reproduced": PALETTE["oracle"], "reversed": PALETTE["moir"]}
    fig = _fig(title or "Paired differences with 95 % intervals", "difference", "")
    for word, g in claims.groupby("verdict", sort=False):
        fig.add_scatter(x=g["value"], y=g["label"], mode="markers", name=str(word),
                        marker={"color": colours.get(word, PALETTE["neutral"]), "size": 9},
                        error_x={"type": "data", "symmetric": False, "array": (g["hi"] - g["value"]).tolist(),
                                 "arrayminus": (g["value"] - g["lo"]).tolist()},
                        hovertemplate="%{y}: %{x:+.3f}<extra>" + str(word) + "</extra>")
    fig.add_vline(x=0, line={"dash": "dash", "color": PALETTE["neutral"]})
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=max(260, 90 + 40 * len(claims)))
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


def edit_seed_ablation(ablation: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Table 2 as curves: edit HM (left) and S_p (right) against N for each seed strategy of C_Moir.

    ``ablation``: :func:`moir_lib.chapters.editing.seed_ablation` (``seed``, ``S_e@N``..., ``S_p@N``...).
    """
    _require(ablation, ["seed"], "edit_seed_ablation")
    fig = _subplots(1, 2, title or "Seed strategy of the self-generated C (MEMIT batch)",
                         subplot_titles=("edit HM", "S_p"))
    for col, prefix in ((1, "S_e@"), (2, "S_p@")):
        cols = [c for c in ablation.columns if c.startswith(prefix)]
        ns = [int(c.removeprefix(prefix)) for c in cols]
        for _, row in ablation.iterrows():
            cov = f"moir-{row['seed']}"
            fig.add_scatter(x=ns, y=[row[c] for c in cols], mode="lines+markers", name=str(row["seed"]),
                            legendgroup=cov, showlegend=(col == 1), line={"color": _edit_c_colour(cov)},
                            hovertemplate="N=%{x}: %{y:.3f}<extra>" + str(row["seed"]) + "</extra>",
                            row=1, col=col)
    fig.update_xaxes(title_text="number of edits")
    fig.update_layout(height=400)
    return fig
