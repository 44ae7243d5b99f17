"""Interactive explorers in JupyterLab, static views in headless runs.

A chapter's explorer is a row of controls over one view. In JupyterLab it is an ipywidgets box whose
view is redrawn when a control changes. In a headless run (``moir run`` / ``moir book``, which set
:data:`HEADLESS_ENV` for the kernel) no widget is created: the current view is displayed as a plain
output, which the HTML book shows, and the notebook client never waits on widget messages (nbclient
can block for good on a cell that creates and redraws widgets: jupyter/nbclient#312, seen here
under load). The view is set as the output widget's state (``append_display_data``) rather than
captured with ``with out:`` and ``clear_output(wait=True)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

HEADLESS_ENV = "MOIR_HEADLESS"


def headless() -> bool:
    """Whether this kernel runs without a front end (set by :func:`headless_kernels`)."""
    return os.environ.get(HEADLESS_ENV) == "1"


@contextlib.contextmanager
def headless_kernels() -> Iterator[None]:
    """Kernels started inside this block see :data:`HEADLESS_ENV` (they inherit the environment)."""
    before = os.environ.get(HEADLESS_ENV)
    os.environ[HEADLESS_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HEADLESS_ENV, None)
        else:
            os.environ[HEADLESS_ENV] = before


def explorer(rows: Sequence[Sequence[Any]], view: Callable[[], Any]) -> Any:
    """Rows of controls (ipywidgets value widgets) above ``view()`` (anything ``display`` shows),
    redrawn on every change; headless: ``view()`` of the controls' initial values, for display."""
    if headless():
        return view()
    import ipywidgets as widgets

    out = widgets.Output()

    def draw(*_: Any) -> None:
        out.outputs = ()
        out.append_display_data(view())

    for row in rows:
        for control in row:
            control.observe(draw, names="value")
    draw()
    return widgets.VBox([*(widgets.HBox(list(row)) for row in rows), out])
