"""An editor by name: MEMIT (eq. memit-update) or AlphaEdit (eq. alphaedit-update) from a profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.base import CovarianceSource
    from moir_lib.editing.memit import MemitEditor

__all__ = ["EDITORS", "make_editor"]

#: the editors a run can name (each has the profile section of its name)
EDITORS = ("memit", "alphaedit")


def make_editor(editor: str, profile: Any, cov: CovarianceSource, *, lambda_: float | None = None,
                lambda_mode: str | None = None, tau: float | None = None, tau_mode: str | None = None,
                **kwargs: Any) -> MemitEditor | AlphaEditEditor:
    """``MemitEditor``/``AlphaEditEditor`` from a profile, with command-line style overrides."""
    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.memit import MemitEditor

    if editor == "memit":
        over = {k: v for k, v in {"lambda_": lambda_, "lambda_mode": lambda_mode}.items() if v is not None}
        return MemitEditor.from_profile(profile, cov, **over, **kwargs)
    if editor == "alphaedit":
        over = {k: v for k, v in {"tau": tau, "tau_mode": tau_mode}.items() if v is not None}
        return AlphaEditEditor.from_profile(profile, cov, **over, **kwargs)
    raise ValueError(f"unknown editor {editor!r}: choose {' or '.join(map(repr, EDITORS))}")
