"""Explorers: live widgets in JupyterLab, a static view in headless runs (no widget messages)."""

from __future__ import annotations

import os

import ipywidgets as widgets
import pytest

from moir_lib import widgets as mw


@pytest.fixture
def interactive(monkeypatch):
    monkeypatch.delenv(mw.HEADLESS_ENV, raising=False)


def test_headless_kernels_sets_and_restores_the_flag(interactive):
    assert not mw.headless()
    with mw.headless_kernels():
        assert mw.headless() and os.environ[mw.HEADLESS_ENV] == "1"
    assert mw.HEADLESS_ENV not in os.environ


def test_headless_explorer_returns_the_first_view_and_no_widget(interactive):
    choice = widgets.Dropdown(options=["a", "b"])
    with mw.headless_kernels():
        shown = mw.explorer([[choice]], lambda: f"view of {choice.value}")
    assert shown == "view of a"


def test_interactive_explorer_redraws_on_change_without_capturing(interactive):
    choice = widgets.Dropdown(options=["a", "b"])
    calls = []

    def view():
        calls.append(choice.value)
        return f"view of {choice.value}"

    box = mw.explorer([[choice]], view)
    out = box.children[-1]
    assert isinstance(box, widgets.VBox) and isinstance(out, widgets.Output)
    assert [o["data"]["text/plain"] for o in out.outputs] == ["'view of a'"]
    choice.value = "b"
    assert calls == ["a", "b"]
    assert [o["data"]["text/plain"] for o in out.outputs] == ["'view of b'"]


def test_run_notebook_starts_headless_kernels(monkeypatch, tmp_path, root, interactive):
    """`moir run` executes chapters with the flag set, and leaves the environment as it was."""
    import papermill as pm

    from moir_lib import runs

    seen = {}

    def fake_execute(src, dst, **kwargs):
        seen["flag"] = os.environ.get(mw.HEADLESS_ENV)

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    nb = root / "notebooks" / "04_g_cancellation.ipynb"
    runs.run_notebook(nb, tmp_path / "out", progress=False)
    assert seen["flag"] == "1" and mw.HEADLESS_ENV not in os.environ
