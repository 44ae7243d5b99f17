"""Closed-form knowledge editors: MEMIT and AlphaEdit, batch and sequential (appendix B.1, C.1-C.2).

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.requests`          edit requests, the last subject token, target ids, grouping
:mod:`.templates`         context templates (sampled prefixes, ROME/MEMIT's grouping)
:mod:`.keys`              k*: key at the last subject token, averaged over templates
:mod:`.values`            z: target hidden state at the last edit layer (Adam on δ)
:mod:`.base`              C checks, the layer loop spreading residuals, the editor driver
:mod:`.state`             ``EditState``: ``K_past K_pastᵀ``, ``P``, counts (save / load / reset)
:mod:`.memit`             eq. (memit-update), ``MemitEditor``
:mod:`.alphaedit`         null-space projector (eigh), eq. (alphaedit-update), ``AlphaEditEditor``
:mod:`.editors`           ``make_editor``: an editor by name from a profile
:mod:`.snapshot`          ``WeightSnapshot``: the original weights, restored bit-exactly
:mod:`.regimes`           ``batch`` / ``sequential_edits`` (scores each milestone) / ``sequential``
:mod:`.checkpoints`       a sequential run's checkpoints (atomic, checksummed, resumed bit-exactly)
:mod:`.reference`         the golden check against the authors' code
========================  ===============================================================

A typical batch edit::

    from moir_lib import models
    from moir_lib.editing import MemitEditor, batch

    model, tok, adapter = models.load(profile)
    editor = MemitEditor.from_profile(profile, cov)      # cov: CovarianceStats or {layer: C}
    result = batch(adapter, editor, records, n_edits=100)
    result.snapshot.restore()                            # the original weights, bit-exactly

Names are imported lazily, so importing this package (e.g. for ``moir --help``) costs no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EditRequest": "requests",
    "RequestGroup": "requests",
    "group_requests": "requests",
    "locate_subject": "requests",
    "normalise_requests": "requests",
    "target_token_ids": "requests",
    "as_template_groups": "templates",
    "context_templates": "templates",
    "sample_templates": "templates",
    "compute_keys": "keys",
    "TargetResult": "values",
    "ValueConfig": "values",
    "compute_targets": "values",
    "EditOutcome": "base",
    "Editor": "base",
    "check_covariance": "base",
    "EditState": "state",
    "MemitEditor": "memit",
    "effective_lambda": "memit",
    "memit_delta": "memit",
    "AlphaEditEditor": "alphaedit",
    "alphaedit_delta": "alphaedit",
    "null_space_projector": "alphaedit",
    "EDITORS": "editors",
    "make_editor": "editors",
    "WeightSnapshot": "snapshot",
    "DEFAULT_MILESTONES": "regimes",
    "BatchResult": "regimes",
    "EditSetup": "regimes",
    "Milestone": "regimes",
    "Score": "regimes",
    "SequentialResult": "regimes",
    "SequentialSchedule": "regimes",
    "batch": "regimes",
    "sequential": "regimes",
    "sequential_edits": "regimes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"moir_lib.editing.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'moir_lib.editing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
