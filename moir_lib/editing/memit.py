"""MEMIT: the soft-constraint editor, eq. (memit-update) of appendix B.1.

For each edit layer ℓ (in order, on the partly edited model: the layer loop of
:func:`moir_lib.editing.base.spread_edit`)::

    ΔW_ℓ = R_ℓ K_ℓᵀ (K_past K_pastᵀ + K_ℓ K_ℓᵀ + λ C_ℓ)⁻¹            (memit-update)

``K_ℓ`` ``(d_in, n)``: the keys of the batch at ℓ, recomputed after the layers before ℓ were
edited (:func:`moir_lib.editing.keys.compute_keys`); ``R_ℓ = (Z − H_L) / (#layers left)``
``(d_out, n)``: the distance from the current output of the last edit layer ``L`` to the
targets ``Z`` (:mod:`moir_lib.editing.values`), spread evenly over the layers still to be
edited; ``K_past K_pastᵀ``: the accumulated keys of earlier sequential batches (zero in the
batch regime), each batch's keys read on the model *after* all its layers were edited, as
AlphaEdit's code updates its ``cache_c``.

It minimises ``‖ΔW K − R‖² + λ tr(ΔW C ΔWᵀ) + ‖ΔW K_past‖²``: its gradient
``2 (ΔW (K_past K_pastᵀ + K Kᵀ + λ C) − R Kᵀ)`` vanishes there. Everything is float64; the
system is *solved* (Cholesky, as it is symmetric positive definite), never inverted.

**Scale convention.** ``C`` is the per-token normalised second moment
``C = (1/N) Σ_tokens k kᵀ`` (``CovarianceStats.mean(layer)``; ROME/MEMIT's ``mom2``), which is
the scale the paper's λ = 15 000 was tuned for (``mom2_update_weight``). With
``lambda_mode="relative"`` the weight adapts to the batch and the model:
``λ_eff = λ · mean diag(K Kᵀ) / mean diag(C)`` per layer (``λ`` is then a ratio: the field
notes used λ = 10), which transfers across models whose key norms differ. ``λ ≤ 0`` is
refused; ``C`` must be ``(d_in, d_in)``, symmetric and positive semi-definite (checked once,
:func:`moir_lib.editing.base.check_covariance`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from moir_lib.editing.base import Editor, Solver, check_covariance
from moir_lib.editing.values import ValueConfig

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

    from moir_lib.editing.base import CovarianceSource
    from moir_lib.editing.state import EditState
    from moir_lib.models import ModelAdapter

__all__ = ["MemitEditor", "effective_lambda", "memit_delta"]

log = logging.getLogger(__name__)

LambdaMode = Literal["absolute", "relative"]


def effective_lambda(lam: float, mode: LambdaMode, K: Float[torch.Tensor, "d_in n"],
                     C: Float[torch.Tensor, "d_in d_in"]) -> float:
    """λ as used in the solve: ``λ`` (absolute) or ``λ · mean diag(K Kᵀ) / mean diag(C)``."""
    if not lam > 0:
        raise ValueError(f"λ must be > 0, got {lam}: λ weighs the preservation term λ tr(ΔW C ΔWᵀ)")
    if mode == "absolute":
        return float(lam)
    if mode == "relative":
        kk = float((K.double() ** 2).sum()) / K.shape[0]  # mean diag(K Kᵀ)
        cc = float(C.diagonal().mean())
        if not cc > 0:
            raise ValueError(f"relative λ needs mean diag(C) > 0, got {cc}")
        return float(lam) * kk / cc
    raise ValueError(f"lambda_mode must be 'absolute' or 'relative', got {mode!r}")


def memit_delta(R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                C: Float[torch.Tensor, "d_in d_in"], lam: float,
                kkt_past: Float[torch.Tensor, "d_in d_in"] | None = None
                ) -> Float64[torch.Tensor, "d_out d_in"]:
    """Eq. (memit-update): ``R Kᵀ (K_past K_pastᵀ + K Kᵀ + λ C)⁻¹`` in float64.

    ``kkt_past``: the accumulated ``K_past K_pastᵀ``, or None. ``λ`` is used as given (see
    :func:`effective_lambda`).
    """
    import torch

    if not lam > 0:
        raise ValueError(f"λ must be > 0, got {lam}")
    R, K, C = R.to(torch.float64), K.to(torch.float64), C.to(torch.float64)
    if K.shape[0] != C.shape[0] or R.shape[1] != K.shape[1]:
        raise ValueError(f"shape mismatch: R {tuple(R.shape)}, K {tuple(K.shape)}, C {tuple(C.shape)}")
    M = K @ K.T + lam * C
    if kkt_past is not None:
        M = M + kkt_past.to(device=M.device, dtype=torch.float64)
    # ΔW M = R Kᵀ with M symmetric positive definite  ⇔  M ΔWᵀ = K Rᵀ, solved by Cholesky
    rhs = K @ R.T
    L, info = torch.linalg.cholesky_ex(M)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, L).T
    log.warning("K_past K_pastᵀ + K Kᵀ + λC is not numerically positive definite (C rank-deficient and λ "
                "small?); solving it by LU")
    return torch.linalg.solve(M, rhs).T



class MemitEditor(Editor):
    """MEMIT with ``C`` per edit layer (see the module docstring for λ's scale).

    ``cov``: a ``CovarianceStats``, a mapping ``{layer: C}`` or a callable. ``lambda_`` and
    ``lambda_mode`` as in the profile's ``memit`` section; ``values``: the z optimisation.
    """

    name = "memit"

    def __init__(self, cov: CovarianceSource, layers: Sequence[int], *, lambda_: float = 15_000.0,
                 lambda_mode: LambdaMode = "absolute", values: ValueConfig | None = None,
                 batch_size: int = 32) -> None:
        if not lambda_ > 0 or not math.isfinite(lambda_):
            raise ValueError(f"λ must be > 0 and finite, got {lambda_}: λ weighs the preservation term "
                             f"λ tr(ΔW C ΔWᵀ)")
        if lambda_mode not in ("absolute", "relative"):
            raise ValueError(f"lambda_mode must be 'absolute' or 'relative', got {lambda_mode!r}")
        self.lambda_ = float(lambda_)
        self.lambda_mode: LambdaMode = lambda_mode
        super().__init__(cov, layers, values, batch_size)
        for layer in self.layers:
            self.spectrum[layer] = check_covariance(self.C[layer], layer=layer)
            self.C[layer] = 0.5 * (self.C[layer] + self.C[layer].T)

    @classmethod
    def from_profile(cls, profile: Any, cov: CovarianceSource, **overrides: Any) -> MemitEditor:
        m = profile.memit
        kwargs: dict[str, Any] = {"lambda_": m.lambda_, "lambda_mode": m.lambda_mode,
                                  "values": ValueConfig.from_memit(m)}
        kwargs.update(overrides)
        return cls(cov, profile.edit_layers, **kwargs)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "lambda": self.lambda_, "lambda_mode": self.lambda_mode}

    def _solver(self, adapter: ModelAdapter, state: EditState | None = None) -> Solver:
        device = next(adapter.model.parameters()).device

        def solve(layer: int, R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                  past: Float[torch.Tensor, "d_in d_in"] | None
                  ) -> tuple[Float64[torch.Tensor, "d_out d_in"], dict[str, float]]:
            C = self._C_on(layer, device)
            lam = effective_lambda(self.lambda_, self.lambda_mode, K, C)
            return memit_delta(R.to(device), K.to(device), C, lam, past), {"lambda_eff": lam}

        return solve
