"""Figures of the causal-tracing chapter (appendix C.4, ``notebooks/06_causal_tracing``), fed by
:mod:`moir_lib.tracing`: the indirect-effect heat map and the per-layer curve with the chosen window
(each pocket organism's curve faint behind the pooled one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.style import PALETTE, _fig, _require


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
                        last_token: pd.DataFrame | None = None, title: str | None = None,
                        organisms: Mapping[int, pd.DataFrame] | None = None) -> go.Figure:
    """Appendix C.4: indirect effect at the last subject token per layer, the chosen window shaded.

    ``curve``: rows ``layer``, ``ie`` and optionally ``sem`` (standard error over prompts, drawn as
    a band); ``window``: the selected contiguous edit layers (shaded green); ``profile_layers``:
    the profile's current ``edit_layers``, outlined when they differ from the window;
    ``last_token``: optionally the same curve at the prompt's last token (grey, dotted);
    ``organisms``: each organism's own curve (organism -> rows ``layer``, ``ie``), drawn faint behind
    ``curve``, which is then their pooled curve.
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
    for organism, own in (organisms or {}).items():
        _require(own, ["layer", "ie"], "tracing_layer_curve")
        own = own.sort_values("layer")
        fig.add_scatter(x=own["layer"], y=own["ie"], mode="lines", name=f"organism {organism}",
                        line={"color": PALETTE["wiki"], "width": 1}, opacity=0.35, legendgroup="organisms",
                        hovertemplate=f"organism {organism}<br>layer %{{x}}<br>IE=%{{y:.3f}}<extra></extra>")
    if last_token is not None:
        _require(last_token, ["layer", "ie"], "tracing_layer_curve")
        late = last_token.sort_values("layer")
        fig.add_scatter(x=late["layer"], y=late["ie"], mode="lines+markers", name="IE, last prompt token",
                        line={"color": PALETTE["neutral"], "dash": "dot", "width": 2},
                        hovertemplate="layer %{x}<br>IE=%{y:.3f} (last token)<extra></extra>")
    name = "IE, last subject token" + (", organisms pooled" if organisms else "")
    fig.add_scatter(x=df["layer"], y=df["ie"], mode="lines+markers", name=name,
                    line={"color": PALETTE["wiki"], "width": 3},
                    hovertemplate="layer %{x}<br>IE=%{y:.3f}<extra></extra>")
    fig.add_hline(y=0, line_color=PALETTE["neutral"], line_width=1)
    if df["ie"].isna().all():
        fig.add_annotation(text="no valid prompt: nothing to average", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    fig.update_xaxes(dtick=1 if len(df) <= 16 else None)
    fig.update_layout(legend={"orientation": "h", "x": 1, "y": 1.02, "xanchor": "right", "yanchor": "bottom"})
    return fig
