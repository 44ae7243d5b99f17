"""The figure of the claims each chapter judges (:mod:`moir_lib.chapters.verdicts`): paired
differences with their 95 % intervals, coloured by verdict.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from moir_lib.plots.style import PALETTE, _fig, _require


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
