"""The interactive explorer of the editing results (ipywidgets, for JupyterLab)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from moir_lib.experiments.rows import NONE
from moir_lib.experiments.tables import curves, edit_hm_metric, finals, task_baseline


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

    def figure() -> Any:
        sel = rows[(rows["model"] == model.value) | (rows["editor"] == NONE)]
        if regime.value != "all":
            sel = sel[(sel["regime"] == regime.value) | (sel["editor"] == NONE)]
        if view.value == "harmonic means":
            return plots.edit_hm_curves(curves(sel), editor.value, edit_hm_metric(sel))
        if view.value == "per task":
            return plots.edit_task_curves(curves(sel), editor.value)
        fin = finals(sel)
        return plots.edit_radar(fin[fin["editor"] == editor.value], task_baseline(sel))

    return widget_explorer([[model, editor, regime], [view]], figure)
