"""Closed-form knowledge editors: MEMIT and AlphaEdit, batch and sequential (appendix B.1, C.1-C.2).

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.keys`              k*: key at the last subject token, context templates, grouping
:mod:`.values`            z: target hidden state at the last edit layer (Adam on δ)
:mod:`.memit`             eq. (memit-update), the layer loop, ``MemitEditor``
:mod:`.alphaedit`         null-space projector (eigh), eq. (alphaedit-update), ``EditState``
:mod:`.regimes`           ``batch`` / ``sequential`` (milestones, checkpoints, resume)
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
    "EditRequest": "keys",
    "RequestGroup": "keys",
    "compute_keys": "keys",
    "context_templates": "keys",
    "sample_templates": "keys",
    "as_template_groups": "keys",
    "group_requests": "keys",
    "locate_subject": "keys",
    "normalise_requests": "keys",
    "TargetResult": "values",
    "ValueConfig": "values",
    "compute_targets": "values",
    "target_token_ids": "values",
    "EditOutcome": "memit",
    "MemitEditor": "memit",
    "check_covariance": "memit",
    "effective_lambda": "memit",
    "memit_delta": "memit",
    "AlphaEditEditor": "alphaedit",
    "EditState": "alphaedit",
    "alphaedit_delta": "alphaedit",
    "null_space_projector": "alphaedit",
    "DEFAULT_MILESTONES": "regimes",
    "BatchResult": "regimes",
    "SequentialResult": "regimes",
    "WeightSnapshot": "regimes",
    "batch": "regimes",
    "make_editor": "regimes",
    "sequential": "regimes",
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
