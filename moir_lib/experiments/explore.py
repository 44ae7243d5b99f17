"""The interactive explorer of the editing results (ipywidgets, for JupyterLab)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from moir_lib.experiments.rows import NONE
from moir_lib.experiments.tables import curves, edit_hm_metric, finals, task_baseline


def explorer(rows: pd.DataFrame) -> Any:
    """ipywidgets controls (model, editor, regime, view) over the tidy rows, for JupyterLab.

    Returns a ``VBox``; in a headless run (papermill, the book) it renders as a static widget
    placeholder and never fails. The figures come from :mod:`moir_lib.plots`.
    """
    import ipywidgets as widgets
    from IPython.display import display

    from moir_lib import plots

    edited = rows[rows["editor"] != NONE]
    models = sorted(set(edited["model"])) or ["-"]
    model = widgets.Dropdown(options=models, description="model")
    editor = widgets.Dropdown(options=sorted(set(edited["editor"])) or ["-"], description="editor")
    regime = widgets.Dropdown(options=["all", *sorted(set(edited["regime"]))], description="regime")
    view = widgets.ToggleButtons(options=["harmonic means", "per task", "radar"], description="view")
    out = widgets.Output()

    def draw(*_: Any) -> None:
        sel = rows[(rows["model"] == model.value) | (rows["editor"] == NONE)]
        if regime.value != "all":
            sel = sel[(sel["regime"] == regime.value) | (sel["editor"] == NONE)]
        cur = curves(sel)
        out.clear_output(wait=True)
        with out:
            if view.value == "harmonic means":
                fig = plots.edit_hm_curves(cur, editor.value, edit_hm_metric(sel))
            elif view.value == "per task":
                fig = plots.edit_task_curves(cur, editor.value)
            else:
                fin = finals(sel)
                fig = plots.edit_radar(fin[fin["editor"] == editor.value], task_baseline(sel))
            display(fig)

    for w in (model, editor, regime, view):
        w.observe(draw, names="value")
    draw()
    return widgets.VBox([widgets.HBox([model, editor, regime]), view, out])
