"""Shared test setup: offline hub, a private cache dir, the real-format slices in data/slices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI must not be flaky); locally
# HYPOTHESIS_PROFILE=explore searches afresh.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): on
    two cores tiny matrices only fight over them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def slices() -> Path:
    """``data/slices``: unmodified excerpts of the public data sets (see its SOURCES.md)."""
    return ROOT / "data" / "slices"


@pytest.fixture(scope="session")
def g_cancellation_run(tmp_path_factory) -> Path:
    """One `moir run` of the proof-check chapter with small parameters (shared by tests)."""
    from moir_lib.cli import main

    out = tmp_path_factory.mktemp("run") / "04_g_cancellation"
    code = main(["run", str(ROOT / "notebooks" / "04_g_cancellation.ipynb"), "-q",
                 "-p", "n_instances", "200", "--out", str(out)])
    assert code == 0, "moir run of 04_g_cancellation failed"
    return out
