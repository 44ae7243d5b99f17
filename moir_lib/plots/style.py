"""The one look of every figure: the :data:`PALETTE`, the book's plotly template, offline rendering
in notebooks (:func:`setup_notebook`), and the helpers every figure module shares.
"""

from __future__ import annotations

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


def _subplots(rows: int, cols: int, title: str, **kwargs: object) -> go.Figure:
    from plotly.subplots import make_subplots

    if TEMPLATE_NAME not in pio.templates:
        pio.templates[TEMPLATE_NAME] = _template()
    fig = make_subplots(rows=rows, cols=cols, **kwargs)
    fig.update_layout(template=TEMPLATE_NAME, title=title)
    return fig


def _require(df: pd.DataFrame, cols: Sequence[str], who: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{who}: table lacks columns {missing}; it has {list(df.columns)}")


def _stderr_whiskers(stderr: pd.Series | None) -> dict | None:
    """Plotly error bars of the 95 % intervals of ``stderr`` (±Z95 standard errors; None without any)."""
    if stderr is None or not np.isfinite(stderr.to_numpy(dtype=float)).any():
        return None
    from moir_lib.evaluation.uncertainty import Z95

    return {"type": "data", "array": list(Z95 * stderr.fillna(0).to_numpy(dtype=float)), "visible": True}
