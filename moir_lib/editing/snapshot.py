"""The original weights of the edit layers, kept so that any edit can be undone bit-exactly.

A :class:`WeightSnapshot` clones ``W_out`` (the ``down_proj`` weight) of the edit layers before an edit;
:meth:`WeightSnapshot.restore` copies it back (afterwards ``torch.equal`` holds with the unedited model),
:meth:`WeightSnapshot.delta` gives ``ΔW = W − W_0`` in float64 (the distortion of
:mod:`moir_lib.experiments.measure` and the ``‖ΔW‖_F`` of a run), :meth:`WeightSnapshot.digest` identifies the
original weights a checkpoint belongs to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moir_lib.editing.base import as_adapter

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

__all__ = ["WeightSnapshot"]


class WeightSnapshot:
    """The original ``W_out`` of ``layers``, cloned before any edit (model dtype and device)."""

    def __init__(self, model: Any, layers: Sequence[int]) -> None:
        self.adapter = as_adapter(model)
        self.layers = self.adapter.check_layers(layers)
        self.original = {layer: self.adapter.weight_of(layer).detach().clone() for layer in self.layers}

    def restore(self) -> None:
        """Copy the original weights back: afterwards ``torch.equal`` holds with the unedited model."""
        import torch

        with torch.no_grad():
            for layer, w in self.original.items():
                self.adapter.weight_of(layer).copy_(w)

    def is_original(self) -> bool:
        import torch

        return all(torch.equal(self.adapter.weight_of(layer).detach(), w)
                   for layer, w in self.original.items())

    def delta(self, layer: int) -> Float64[torch.Tensor, "d_out d_in"]:
        """``W − W_0`` of ``layer`` in float64."""
        import torch

        current = self.adapter.weight_of(layer).detach().to(torch.float64)
        return current - self.original[layer].to(torch.float64)

    def current(self) -> dict[int, Float[torch.Tensor, "d_out d_in"]]:
        """The current (edited) weights, contiguous CPU copies."""
        return {layer: self.adapter.weight_of(layer).detach().cpu().contiguous() for layer in self.layers}

    def load(self, weights: dict[int, Float[torch.Tensor, "d_out d_in"]]) -> None:
        """Set the edit layers' weights (e.g. from a checkpoint), exactly."""
        import torch

        with torch.no_grad():
            for layer in self.layers:
                target = self.adapter.weight_of(layer)
                w = weights[layer]
                if tuple(w.shape) != tuple(target.shape) or w.dtype != target.dtype:
                    raise ValueError(f"checkpoint weights of layer {layer} are {tuple(w.shape)} {w.dtype}, "
                                     f"the model's {tuple(target.shape)} {target.dtype}")
                target.copy_(w)

    def digest(self) -> str:
        """SHA-256 of the original weights' bytes (identifies the model a checkpoint belongs to)."""
        import torch

        h = hashlib.sha256()
        for layer, w in self.original.items():
            h.update(f"{layer}:{w.dtype}:{tuple(w.shape)}".encode())
            h.update(w.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:32]

    def change_norms(self) -> dict[int, float]:
        """``‖W − W_0‖_F`` per layer."""
        import torch

        return {layer: float(torch.linalg.norm(self.delta(layer))) for layer in self.layers}
