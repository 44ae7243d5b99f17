"""The batch products ``KᵀK`` added to a float64 ``C`` sum, in three precisions (eq. (memoir_estimator)).

Only the upper triangle of each product is computed (blocks of 1024 columns, about half the
arithmetic for wide keys); :func:`symmetric` returns the full matrix.

``precision="float64"`` forms each batch's ``KᵀK`` in float64. ``"float32"`` forms it in float32
(per batch, ≤ ``tokens_per_batch`` terms, as ``layer_stats`` and the paper do for the whole sum)
and adds it to the float64 sum, at ~1e-7 relative error per batch. On CUDA, float16/bfloat16
keys then go to a half-precision GEMM with float32 output (exact products, tensor-core speed):
far faster than float64 there. On CPU it only pays at large batches (≳1k tokens per product;
below that the float64 accumulator's memory traffic dominates either way). ``"tf32"``
(float16/bfloat16 keys only) converts the keys to float32 — exactly: TF32's 11 significant bits
hold every bf16/fp16 value — and forms each block product as a float32 GEMM with TF32 tensor
cores allowed on CUDA (``torch.set_float32_matmul_precision`` is set to ``"high"`` around the
product and restored): every product ``k_a k_b`` is exact, only the float32 accumulation within
one batch of ``n`` keys rounds, ``|ΔS| ≤ γ_{n-1}·|K|ᵀ|K|`` elementwise with
``γ_m = m·u/(1 - m·u)``, ``u = 2⁻²⁴`` (``2⁻²³`` where tensor cores truncate), and the float64 sum
across batches adds ``γ_B`` (float64, ``B`` batches) on top. On CPU the same arithmetic runs as a
plain float32 GEMM (tested against float64 to that bound). ``precision="auto"`` (see
:func:`resolve_precision`) is ``"tf32"`` for half-precision models on CUDA and ``"float64"``
otherwise. The resolved name is recorded in the metadata and the cache fingerprint, and
statistics of different precisions are not merged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

PRECISIONS = ("float64", "float32", "tf32")
_BLOCK = 1024


def _torch():
    import torch

    return torch


def upper_addmm_(acc: Float64[torch.Tensor, "d_in d_in"], k: Float64[torch.Tensor, "tokens d_in"],
                 beta: float = 1.0) -> None:
    """``acc ← beta·acc + kᵀk`` on the block upper triangle (the upper triangle of ``acc`` is exact).

    Column blocks of ``_BLOCK``: block row ``I`` gets ``k_Iᵀ k_{I:}``, so every element on or
    above the diagonal is written and about half of the products of a full ``kᵀk`` are skipped
    for wide keys. Elements below the diagonal are meaningless; read through :func:`symmetric`.
    """
    d = k.shape[1]
    if d <= _BLOCK:
        acc.addmm_(k.T, k, beta=beta)
        return
    for s in range(0, d, _BLOCK):
        e = min(s + _BLOCK, d)
        acc[s:e, s:].addmm_(k[:, s:e].T, k[:, s:], beta=beta)


def upper_add_float32_(acc: Float64[torch.Tensor, "d_in d_in"],
                       k: Float[torch.Tensor, "tokens d_in"]) -> None:
    """``acc ← acc + kᵀk`` on the block upper triangle, each block product formed in float32.

    One ``_BLOCK``-row block at a time: the float32 block is added to the float64 accumulator
    right away (no ``d×d`` float32 scratch, half the memory traffic of a full fold).
    float16/bfloat16 keys on CUDA go straight to a half-precision GEMM with float32 output
    (``torch.mm(..., out_dtype=float32)``: exact products, tensor-core speed); anything else is
    converted to float32 first.
    """
    torch = _torch()
    d = k.shape[1]
    half_on_gpu = k.is_cuda and k.dtype in (torch.float16, torch.bfloat16)
    k32 = None if half_on_gpu else k.to(torch.float32)
    # one reusable block buffer: fresh multi-MB allocations cost page faults on every batch (CPU)
    buffer = None if half_on_gpu else torch.empty(min(d, _BLOCK) * d, dtype=torch.float32, device=k.device)
    for s in range(0, d, _BLOCK):
        e = min(s + _BLOCK, d)
        block = None
        if half_on_gpu:
            try:
                block = torch.mm(k[:, s:e].T, k[:, s:], out_dtype=torch.float32)
            except (TypeError, RuntimeError):  # a torch without mm(out_dtype=...) here
                half_on_gpu, k32 = False, k.to(torch.float32)
                buffer = torch.empty(min(d, _BLOCK) * d, dtype=torch.float32, device=k.device)
        if block is None:
            block = buffer[: (e - s) * (d - s)].view(e - s, d - s)
            torch.mm(k32[:, s:e].T, k32[:, s:], out=block)
        acc[s:e, s:].add_(block)


@contextlib.contextmanager
def _tf32_allowed(enabled: bool) -> Iterator[None]:
    """Allow TF32 tensor cores for float32 matrix products inside the block (when ``enabled``)."""
    torch = _torch()
    if not enabled:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def upper_add_tf32_(acc: Float64[torch.Tensor, "d_in d_in"], k: Float[torch.Tensor, "tokens d_in"]) -> None:
    """``acc ← acc + kᵀk`` on the block upper triangle for half-precision keys ``k``: exact float32
    copies, each block product a float32 GEMM (TF32 tensor cores on CUDA), added to the float64 ``acc``.

    TF32 keeps 11 significant bits, bf16 8 and fp16 11, so the tensor cores see the keys unrounded and
    every product is exact; the module doc states the bound of the float32 accumulation.
    """
    torch = _torch()
    with _tf32_allowed(k.is_cuda):
        upper_add_float32_(acc, k.to(torch.float32))


def resolve_precision(precision: str, device: Any, dtype: Any) -> str:
    """The precision :func:`~moir_lib.covariance.estimation.estimate` uses: ``"auto"`` is ``"tf32"`` for
    float16/bfloat16 models on CUDA, else ``"float64"``; an explicit ``"tf32"`` for a model of another dtype
    is refused (``ValueError``)."""
    torch = _torch()
    if precision != "auto" and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose auto or one of {', '.join(PRECISIONS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if precision == "auto":
        return "tf32" if half and torch.device(device).type == "cuda" else "float64"
    if precision == "tf32" and not half:
        raise ValueError(f"precision 'tf32' is exact only for float16/bfloat16 models, and this one is "
                         f"{dtype}: use precision 'float32' or 'float64'")
    return precision


def symmetric(acc: Float[torch.Tensor, "d_in d_in"]) -> Float[torch.Tensor, "d_in d_in"]:
    """The full symmetric matrix whose upper triangle is ``acc``'s."""
    torch = _torch()
    return torch.triu(acc) + torch.triu(acc, 1).T
