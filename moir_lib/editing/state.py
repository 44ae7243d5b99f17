"""The sequential editing state: everything one batch of edits leaves to the next (both editors).

:class:`EditState` holds, per layer, the accumulated ``K_past K_pastᵀ`` (the ``K_past`` term of
eqs. memit-update and alphaedit-update) and AlphaEdit's projector ``P``, plus the edit and
batch counts, the layers and the editor's configuration (τ and its mode, λ, the value
optimisation). It is an explicit object — no module globals — with :meth:`EditState.save` /
:meth:`EditState.load` (one safetensors file, written atomically) and :meth:`EditState.reset`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.files import atomic_write

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

__all__ = ["EditState"]

_META_KEY = "moir_edit_state"


def _normalised(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


@dataclass
class EditState:
    """Everything sequential editing carries from one batch to the next (both editors).

    ``kkt_past[ℓ]``: accumulated ``K_past K_pastᵀ`` (float64, CPU); ``projectors[ℓ]``: AlphaEdit's
    ``P`` (empty for MEMIT) with ``projector_info[ℓ]`` (τ, mode, cutoff, null dimension,
    spectrum bounds); ``n_edits`` requests and ``n_batches`` batches applied; ``config`` the
    editor's configuration, checked against the editor that continues from this state.
    """

    editor: str
    layers: list[int]
    config: dict[str, Any] = field(default_factory=dict)
    kkt_past: dict[int, Float64[torch.Tensor, "d_in d_in"]] = field(default_factory=dict, repr=False)
    projectors: dict[int, Float64[torch.Tensor, "d_in d_in"]] = field(default_factory=dict, repr=False)
    projector_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    n_edits: int = 0
    n_batches: int = 0

    def add_keys(self, layer: int, K: Float[torch.Tensor, "d_in n"]) -> None:
        """``K_past K_pastᵀ += K Kᵀ`` for ``layer``."""
        import torch

        K = K.detach().to(device="cpu", dtype=torch.float64)
        kkt = K @ K.T
        self.kkt_past[layer] = kkt if layer not in self.kkt_past else self.kkt_past[layer] + kkt

    def check_compatible(self, editor: Any) -> None:
        """``ValueError`` when ``editor`` is not the one this state was made by (name, layers,
        configuration such as τ or λ)."""
        if editor.name != self.editor:
            raise ValueError(f"this edit state belongs to {self.editor!r}, not {editor.name!r}")
        if list(editor.layers) != list(self.layers):
            raise ValueError(f"this edit state covers layers {self.layers}, the editor edits {editor.layers}")
        mine, theirs = _normalised(self.config), _normalised(editor.config())
        if self.config and mine != theirs:
            diff = {k: (mine.get(k), theirs.get(k)) for k in sorted(set(mine) | set(theirs))
                    if mine.get(k) != theirs.get(k)}
            raise ValueError(f"the edit state was made with another configuration (state, editor): {diff}")

    def reset(self) -> None:
        """Forget the past edits (``K_past``, counts); the projectors depend only on C and stay.

        The model's weights are restored separately (``regimes.WeightSnapshot.restore``).
        """
        self.kkt_past.clear()
        self.n_edits = 0
        self.n_batches = 0

    def copy(self) -> EditState:
        return EditState(self.editor, list(self.layers), _normalised(self.config),
                         {k: v.clone() for k, v in self.kkt_past.items()},
                         {k: v.clone() for k, v in self.projectors.items()},
                         {k: dict(v) for k, v in self.projector_info.items()}, self.n_edits, self.n_batches)

    def metadata(self) -> dict[str, Any]:
        return {"editor": self.editor, "layers": self.layers, "config": self.config,
                "projector_info": {str(k): v for k, v in self.projector_info.items()},
                "n_edits": self.n_edits, "n_batches": self.n_batches,
                "kkt_layers": sorted(self.kkt_past), "projector_layers": sorted(self.projectors),
                "version": 1}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write one ``.safetensors`` file atomically (a temporary file renamed into place)."""
        from safetensors.torch import save_file

        tensors = {f"kkt_past.{k}": v.detach().cpu().contiguous() for k, v in self.kkt_past.items()}
        tensors.update({f"projector.{k}": v.detach().cpu().contiguous() for k, v in self.projectors.items()})
        meta = {_META_KEY: json.dumps(self.metadata(), default=str)}
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EditState:
        """Read a state written by :meth:`save`."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no edit state at {path}")
        with safe_open(str(path), framework="pt") as f:
            meta_text = (f.metadata() or {}).get(_META_KEY)
            if meta_text is None:
                raise ValueError(f"{path} is not a Moir edit state (no {_META_KEY!r} metadata)")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        meta = json.loads(meta_text)
        state = cls(meta["editor"], [int(x) for x in meta["layers"]], meta.get("config", {}),
                    n_edits=int(meta["n_edits"]), n_batches=int(meta["n_batches"]))
        state.projector_info = {int(k): v for k, v in meta.get("projector_info", {}).items()}
        for name, t in tensors.items():
            kind, layer = name.rsplit(".", 1)
            # a fresh (aligned) copy: MKL rounds products differently at the file's offsets
            (state.kkt_past if kind == "kkt_past" else state.projectors)[int(layer)] = t.clone()
        return state
