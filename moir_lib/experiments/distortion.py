"""Output distortion: how much an edit moves what a layer writes on one distribution's keys."""

from __future__ import annotations

from typing import Any


def output_distortion(w0: Any, delta: Any, C: Any) -> float:
    """``tr(ΔW C ΔWᵀ) / tr(W₀ C W₀ᵀ)``: for ``C = E[k kᵀ]`` this is ``E‖ΔW k‖² / E‖W₀ k‖²``, the relative
    change of the layer's output on keys of that distribution. ``w0``, ``delta``: ``(d_out, d_in)``;
    ``C``: ``(d_in, d_in)``."""
    import torch

    w0, dw = torch.as_tensor(w0, dtype=torch.float64), torch.as_tensor(delta, dtype=torch.float64)
    c = torch.as_tensor(C).to(torch.float64)
    return float(torch.trace(dw @ c @ dw.T) / torch.trace(w0 @ c @ w0.T))
