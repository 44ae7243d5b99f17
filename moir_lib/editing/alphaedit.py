"""AlphaEdit: the hard-constraint editor, eq. (alphaedit-update) of appendix B.1.

**Projector.** ``C`` is symmetric positive semi-definite, so its eigendecomposition
``C = U diag(λ) Uᵀ`` comes from ``torch.linalg.eigh`` (not a general SVD: same vectors, several
times faster, see ``benchmarks/editing.py``). ``Û`` keeps the eigenvectors whose eigenvalue is
below the threshold and ``P = Û Ûᵀ`` projects onto that (approximate) null space, so
``P K_0 ≈ 0`` for the keys ``C`` was estimated from. The threshold τ is either

* ``"absolute"`` — eigenvalues ``< τ`` (the AlphaEdit code's convention, on the per-token
  normalised ``C``; the paper's grid is 0.02 … 0.0005), or
* ``"relative"`` — eigenvalues ``< τ · λ_max``, which transfers across models and ``C``
  sources whose scales differ.

Both are recorded with the resulting null-space dimension. τ outside ``(0, ∞)`` is refused. So
is, with the spectrum bounds, a τ above every eigenvalue (``P = I`` protects nothing) unless
``allow_full``, and a τ below every eigenvalue (an empty null space) unless ``allow_empty``: then
``P = 0``, as the AlphaEdit code computes, and no edit takes, which the efficacy gate reports.

**Update.** With the L2 term of the AlphaEdit code (``l2``; eq. (alphaedit-update) has ``I``)::

    ΔW = R Kᵀ P (K_past K_pastᵀ P + K Kᵀ P + l2 · I)⁻¹                 (alphaedit-update)

solved in float64 as ``(P M + l2 I) ΔWᵀ = P K Rᵀ`` with ``M = K_past K_pastᵀ + K Kᵀ``. The
solution satisfies ``ΔWᵀ = P ΔWᵀ`` (so ``ΔW K_0 = ΔW P K_0 ≈ 0``). Residuals are spread over the
layers exactly as in MEMIT (:func:`moir_lib.editing.base.spread_edit`).

The projectors are computed once per editor and carried in the sequential state
(:class:`moir_lib.editing.state.EditState`).
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

__all__ = ["AlphaEditEditor", "alphaedit_delta", "null_space_projector"]

log = logging.getLogger(__name__)

TauMode = Literal["absolute", "relative"]


def _check_tau(tau: float, tau_mode: str) -> None:
    if tau_mode not in ("absolute", "relative"):
        raise ValueError(f"tau_mode must be 'absolute' or 'relative', got {tau_mode!r}")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (0 < tau < math.inf):
        raise ValueError(f"τ must lie in (0, ∞), got {tau!r}: the projector keeps eigenvalues below τ "
                         f"({'· λ_max' if tau_mode == 'relative' else 'absolute'})")


def _bounds(lo: float, hi: float) -> str:
    return f"spectrum of C: [{lo:.4g}, {hi:.4g}], λ_min/λ_max = {lo / hi if hi else float('nan'):.3g}"


def _empty_null_space(tau: float, tau_mode: str, cutoff: float, lo: float, hi: float) -> str:
    """Why a τ below every eigenvalue ``[lo, hi]`` of ``C`` is refused, and what to raise it to."""
    hint = f"raise τ above {lo:.4g}" if tau_mode == "absolute" else \
        f"raise τ above {lo / hi if hi else float('nan'):.3g}"
    return (f"τ = {tau:g} ({tau_mode}, cutoff {cutoff:.4g}) leaves an empty null space: every eigenvalue "
            f"is above the cutoff ({_bounds(lo, hi)}); {hint}")


def null_space_projector(
    C: Float[torch.Tensor, "d_in d_in"], tau: float, tau_mode: TauMode = "absolute", *,
    allow_full: bool = False, allow_empty: bool = False,
    eigh: tuple[Float[torch.Tensor, " d_in"], Float[torch.Tensor, "d_in d_in"]] | None = None,
) -> tuple[Float64[torch.Tensor, "d_in d_in"], dict[str, Any]]:
    """``P = Û Ûᵀ`` (float64) over the eigenvectors of ``C`` with eigenvalue below the cutoff (``τ`` or
    ``τ · λ_max``), from ``torch.linalg.eigh``; and a record of the choice.

    ``eigh``: a precomputed ``(eigenvalues, eigenvectors)`` of ``C``.
    """
    import torch

    _check_tau(tau, tau_mode)
    C = C.to(torch.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"C must be a square (d, d) matrix, got shape {tuple(C.shape)}")
    evals, evecs = eigh if eigh is not None else torch.linalg.eigh(0.5 * (C + C.T))
    lo, hi = float(evals[0]), float(evals[-1])
    cutoff = float(tau) if tau_mode == "absolute" else float(tau) * hi
    keep = evals < cutoff
    k = int(keep.sum())
    d = C.shape[0]
    bounds = _bounds(lo, hi)
    if k == 0 and not allow_empty:
        raise ValueError(_empty_null_space(tau, tau_mode, cutoff, lo, hi))
    if k == d and not allow_full:
        below = hi if tau_mode == "absolute" else 1.0
        raise ValueError(f"τ = {tau:g} ({tau_mode}, cutoff {cutoff:.4g}) is above every eigenvalue "
                         f"({bounds}): P = I and AlphaEdit protects nothing; lower τ below {below:.4g}"
                         + (" or try tau_mode 'relative'" if tau_mode == "absolute" else ""))
    U = evecs[:, keep]  # (d, k)
    P = U @ U.T
    info = {"tau": float(tau), "tau_mode": tau_mode, "cutoff": cutoff, "null_dim": k, "d": d,
            "null_fraction": k / d, "eig_min": lo, "eig_max": hi}
    return P, info


def alphaedit_delta(R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                    P: Float[torch.Tensor, "d_in d_in"], l2: float = 1.0,
                    kkt_past: Float[torch.Tensor, "d_in d_in"] | None = None
                    ) -> Float64[torch.Tensor, "d_out d_in"]:
    """Eq. (alphaedit-update) with AlphaEdit's L2 term, in float64.

    ``P``: the null-space projector; ``kkt_past``: the accumulated ``K_past K_pastᵀ``, or None.
    ``l2 > 0`` (with a proper null space ``P M`` is singular, so the ridge is what makes the system
    solvable).
    """
    import torch

    if not l2 > 0:
        raise ValueError(f"l2 must be > 0, got {l2}: P (K Kᵀ + K_past K_pastᵀ) is singular whenever the "
                         f"null space is a proper subspace")
    R, K, P = R.to(torch.float64), K.to(torch.float64), P.to(torch.float64)
    if K.shape[0] != P.shape[0] or R.shape[1] != K.shape[1]:
        raise ValueError(f"shape mismatch: R {tuple(R.shape)}, K {tuple(K.shape)}, P {tuple(P.shape)}")
    M = K @ K.T
    if kkt_past is not None:
        M = M + kkt_past.to(device=M.device, dtype=torch.float64)
    A = P @ M
    A.diagonal().add_(l2)
    return torch.linalg.solve(A, P @ (K @ R.T)).T


class AlphaEditEditor(Editor):
    """AlphaEdit with the null-space projector of ``C`` per edit layer.

    ``cov``: a ``CovarianceStats``, a mapping ``{layer: C}`` or a callable. ``tau``/``tau_mode``
    and ``l2`` as in the profile's ``alphaedit`` section; ``values``: the z optimisation (the
    profile's ``memit`` value settings). The projectors are computed once, here.
    """

    name = "alphaedit"

    def __init__(self, cov: CovarianceSource, layers: Sequence[int], *, tau: float = 0.02,
                 tau_mode: TauMode = "absolute", l2: float = 1.0, values: ValueConfig | None = None,
                 batch_size: int = 32, allow_empty: bool = False) -> None:
        import torch

        _check_tau(tau, tau_mode)
        if not l2 > 0:
            raise ValueError(f"l2 must be > 0, got {l2}")
        self.tau, self.tau_mode, self.l2 = float(tau), tau_mode, float(l2)
        super().__init__(cov, layers, values, batch_size)
        self.P: dict[int, Float64[torch.Tensor, "d_in d_in"]] = {}
        self.projector_info: dict[int, dict[str, Any]] = {}
        for layer in self.layers:
            C = 0.5 * (self.C[layer] + self.C[layer].T)
            evals, evecs = torch.linalg.eigh(C)
            self.spectrum[layer] = check_covariance(self.C[layer], layer=layer, eigenvalues=evals)
            try:
                P, info = null_space_projector(C, self.tau, tau_mode, allow_empty=allow_empty,
                                               eigh=(evals, evecs))
            except ValueError as exc:
                raise ValueError(f"layer {layer}: {exc}") from None
            self.P[layer], self.projector_info[layer] = P, info
            if info["null_dim"] == 0:
                log.warning("layer %d: %s τ = %g leaves C no null space (eigenvalues from %.4g): P = 0, "
                            "no edit takes at this layer", layer, tau_mode, tau, info["eig_min"])
            else:
                log.info("layer %d: null space of dimension %d/%d (%s τ = %g, cutoff %.3g)", layer,
                         info["null_dim"], info["d"], tau_mode, tau, info["cutoff"])

    def require_null_space(self) -> None:
        """Refuse, as :func:`null_space_projector` does, a τ that leaves some layer's ``C`` no null
        space (an editor built with ``allow_empty``)."""
        for layer, info in self.projector_info.items():
            if info["null_dim"] == 0:
                raise ValueError(f"layer {layer}: " + _empty_null_space(
                    info["tau"], info["tau_mode"], info["cutoff"], info["eig_min"], info["eig_max"]))

    @classmethod
    def from_profile(cls, profile: Any, cov: CovarianceSource, **overrides: Any) -> AlphaEditEditor:
        a = profile.alphaedit
        kwargs: dict[str, Any] = {"tau": a.tau, "tau_mode": a.tau_mode, "l2": a.l2,
                                  "values": ValueConfig.from_memit(profile.memit)}
        kwargs.update(overrides)
        return cls(cov, profile.edit_layers, **kwargs)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "tau": self.tau, "tau_mode": self.tau_mode, "l2": self.l2}

    def new_state(self) -> EditState:
        state = super().new_state()
        state.projectors = {k: v.clone() for k, v in self.P.items()}
        state.projector_info = {k: dict(v) for k, v in self.projector_info.items()}
        return state

    def _solver(self, adapter: ModelAdapter, state: EditState | None = None) -> Solver:
        device = next(adapter.model.parameters()).device
        projectors = state.projectors if state is not None and state.projectors else self.P
        cache: dict[int, torch.Tensor] = {}

        def solve(layer: int, R: Float[torch.Tensor, "d_out n"], K: Float[torch.Tensor, "d_in n"],
                  past: Float[torch.Tensor, "d_in d_in"] | None
                  ) -> tuple[Float64[torch.Tensor, "d_out d_in"], dict[str, float]]:
            if layer not in cache:
                cache[layer] = projectors[layer].to(device)
            info = self.projector_info[layer]
            delta = alphaedit_delta(R.to(device), K.to(device), cache[layer], self.l2, past)
            return delta, {"null_dim": info["null_dim"], "cutoff": info["cutoff"]}

        return solve
