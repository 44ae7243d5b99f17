"""Has ``C`` converged? The split-half agreement of a ``C`` on the subspace AlphaEdit protects.

Two disjoint halves of one corpus, its first ``N₁ = ⌈N/2⌉`` documents and the other ``N₂``, each give a
``C`` (one pass: the prefix at ``N₁`` and the difference of the sums, :mod:`moir_lib.covariance.prefixes`).
First and second halves rather than interleaved ones: for exchangeable documents (a seeded sample,
self-generated sequences, i.i.d. by index) both are equally honest; for a corpus in some order (articles
cut into consecutive chunks) interleaved halves share neighbours and agree more than independent samples
would, while first and second halves count the drift, which is real. What the editors read of each half:

* AlphaEdit protects ``C``'s top-``k`` eigenspace, ``k = d − dim null(C)`` at its threshold τ
  (:func:`~moir_lib.editing.alphaedit.null_space_projector`, of the whole ``C``); the halves' top-``k``
  subspaces differ by their principal angles ``θ_i``
  (:func:`~moir_lib.covariance.diagnostics.principal_angles`),
  summarised as the **gap** ``(1/k) Σ sin² θ_i = ‖P₁ − P₂‖²_F / (2k)`` (``P`` the projectors onto them):
  0 for the same subspace, 1 for orthogonal ones, the share of the protected directions' energy one half
  protects and the other does not;
* the halves' null-space dimensions at τ, and ``‖C₁ − C₂‖_F / ‖C‖_F`` (what MEMIT's ``λ C`` term reads).

For exchangeable documents a ``C``'s sampling error falls as ``1/√n``: each half's is ``√2`` times the
whole's, so the whole ``C`` lies about half the halves' angle from the ``C`` of unlimited samples (a quarter
of their gap). :func:`split_half` measures one corpus, :class:`Agreement` says it in words; a target gap
met means that half the documents already gave two ``C``'s that agree: they sufficed
(:meth:`Agreement.sufficed`, the rule by which ``moir generate --until-converged`` stops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from moir_lib.covariance.prefixes import second_half
from moir_lib.covariance.stats import CovarianceStats

__all__ = ["DEFAULT_TARGET", "Agreement", "HalfAgreement", "protected_rank", "split_half", "subspace_gap"]

#: The gap below which two halves count as agreeing: their protected subspaces share 99 % of the
#: protected directions' energy (``‖P₁ − P₂‖²_F / 2k = 0.01``; a mean principal angle near 6°).
#: ``benchmarks/budget.py`` prints, beside each whole C's split-half gap, how far its prefixes' updates
#: move: what a gap means for the editors on a given model.
DEFAULT_TARGET = 0.01


def protected_rank(C: Any, tau: float, tau_mode: str = "absolute") -> tuple[int, int]:
    """``(k, null_dim)``: the directions AlphaEdit protects in ``C`` at τ (``d − null_dim``) and its null
    space's dimension (:func:`~moir_lib.editing.alphaedit.null_space_projector`, any τ allowed)."""
    from moir_lib.editing.alphaedit import null_space_projector

    _, info = null_space_projector(C, tau, tau_mode, allow_full=True, allow_empty=True)  # type: ignore[arg-type]
    return info["d"] - info["null_dim"], info["null_dim"]


def subspace_gap(a: Any, b: Any, k: int) -> tuple[float, float]:
    """``(gap, largest angle in degrees)`` between the top-``k`` eigenspaces of ``a`` and ``b``: the mean
    ``sin²`` of their principal angles (module doc); ``k`` is clipped to ``1 … d − 1``."""
    from moir_lib.covariance.diagnostics import principal_angles

    d = int(a.shape[0])
    k = min(max(int(k), 1), d - 1)
    theta = principal_angles(a, b, k)
    return float(theta.sin().pow(2).mean()), math.degrees(float(theta.max()))


@dataclass(frozen=True)
class HalfAgreement:
    """One layer's split halves: documents and keys of each, the protected rank ``k`` (of the whole ``C``)
    and the gap, largest angle, null-space dimensions and relative Frobenius difference of the halves."""

    layer: int
    documents: tuple[int, int]
    keys: tuple[int, int]
    d: int
    k: int
    gap: float
    max_angle_deg: float
    null_dims: tuple[int, int]
    frobenius: float

    @property
    def keys_per_dim(self) -> float:
        """Key vectors of the whole ``C`` per key dimension."""
        return sum(self.keys) / self.d


@dataclass(frozen=True)
class Agreement:
    """The split-half agreement of a ``C``, per layer; ``tau``/``tau_mode``: AlphaEdit's threshold that
    fixes ``k``. The worst layer (largest gap) speaks for the ``C``."""

    layers: tuple[HalfAgreement, ...]
    tau: float
    tau_mode: str

    @property
    def worst(self) -> HalfAgreement:
        return max(self.layers, key=lambda h: h.gap)

    @property
    def gap(self) -> float:
        return self.worst.gap

    def sufficed(self, target: float = DEFAULT_TARGET) -> int | None:
        """The documents of the first half when the gap is at most ``target`` (half the documents gave two
        ``C``'s that agree), else ``None``."""
        return self.worst.documents[0] if self.gap <= target else None

    def to_dict(self, target: float = DEFAULT_TARGET) -> dict[str, Any]:
        """Plain data for the statistics' metadata (``split_half``), with the words of :meth:`describe`."""
        return {"tau": self.tau, "tau_mode": self.tau_mode, "target": target, "gap": self.gap,
                "sufficed": self.sufficed(target), "layers": [asdict(h) for h in self.layers],
                "text": self.describe(target)}

    def describe(self, target: float = DEFAULT_TARGET) -> str:
        """What the agreement means, in words."""
        w = self.worst
        n1, n2 = w.documents
        text = (f"Split halves: the first {n1:,} and the last {n2:,} documents ({w.keys[0]:,} and "
                f"{w.keys[1]:,} key vectors; {w.keys_per_dim:,.1f} per key dimension in the whole C) "
                f"protect top-{w.k} subspaces of the {w.d} key dimensions (AlphaEdit's at τ = "
                f"{self.tau:g}, {self.tau_mode}) that differ by a gap of {w.gap:.4f} (mean sin² of the "
                f"principal angles; largest angle {w.max_angle_deg:.1f}°) at layer {w.layer}, the worst of "
                f"{len(self.layers)}; their null spaces hold {w.null_dims[0]} and {w.null_dims[1]} "
                f"directions, and ‖C₁ − C₂‖/‖C‖ = {w.frobenius:.3f}. With exchangeable documents the whole "
                f"C's principal angles to the C of unlimited samples are about half the halves' (its gap "
                f"about a quarter).")
        if self.sufficed(target) is not None:
            return text + (f" The gap is within {target:g}: half the documents ({n1:,}) already gave two C's "
                           f"that agree, so they sufficed.")
        return text + (f" The gap exceeds {target:g}: the halves still disagree, and more documents would "
                       f"still move the protected subspace.")


def split_half(full: CovarianceStats, half: CovarianceStats, documents: tuple[int, int], *, tau: float,
               tau_mode: str = "absolute", layers: Sequence[int] | None = None) -> Agreement:
    """The :class:`Agreement` of ``full``'s first half ``half`` (its prefix at about half the documents)
    and the rest, at ``layers`` (default all), ``k`` fixed by AlphaEdit's τ on ``full``; ``documents``:
    those of ``half`` and of ``full``."""
    n1, n = (int(x) for x in documents)
    if not 0 < n1 < n:
        raise ValueError(f"split halves need 0 < documents of the first half < all documents, got {n1} of "
                         f"{n}")
    rest = second_half(full, half)
    out = []
    for layer in layers if layers is not None else full.layers:
        c, c1, c2 = full.mean(layer).cpu(), half.mean(layer).cpu(), rest.mean(layer).cpu()
        k, _ = protected_rank(c, tau, tau_mode)
        gap, angle = subspace_gap(c1, c2, k)
        out.append(HalfAgreement(int(layer), (n1, n - n1),
                                 (half.count(layer), rest.count(layer)), int(c.shape[0]), k, gap, angle,
                                 (protected_rank(c1, tau, tau_mode)[1], protected_rank(c2, tau, tau_mode)[1]),
                                 float((c1 - c2).norm() / c.norm())))
    return Agreement(tuple(out), float(tau), tau_mode)
