"""A chapter's lab from its notebook parameters: the one way chapters 01 and 05 open one."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from moir_lib.covariance.recipes import CovSettings
from moir_lib.experiments.lab import Lab
from moir_lib.experiments.specs import EditSettings, EvalSettings
from moir_lib.experiments.store import PointStore

__all__ = ["open_lab"]


def open_lab(profile: Any, out_dir: str | os.PathLike[str], *, reuse: Iterable[str | os.PathLike[str]] = (),
             records: str | os.PathLike[str] | None = None, device: str | None = None,
             n_samples: int | None = None, strategy_samples: int | None = None,
             context_templates: int | None = None, seq_batch_size: int = 1, progress: bool = False,
             **evaluation: Any) -> Lab:
    """The :class:`Lab` of ``profile`` storing its points in ``out_dir`` (reading ``reuse`` and the
    machine-wide copy): ``n_samples`` / ``strategy_samples`` of :class:`CovSettings` (``None`` or 0: the
    profile's), ``context_templates`` / ``seq_batch_size`` of :class:`EditSettings`, and ``evaluation``:
    :class:`EvalSettings`' fields (``n_eval``, ``pres_limit``, ``nll_docs``, …)."""
    covs = CovSettings(n_samples=n_samples or None, strategy_samples=strategy_samples or None)
    return Lab(profile, PointStore(out_dir, reuse=reuse), evaluation=EvalSettings(**evaluation), covs=covs,
               editing=EditSettings(context_templates, seq_batch_size), records=records, device=device,
               progress=progress)
