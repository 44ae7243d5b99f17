"""Diagnostics of ``C``: eigen-spectra, effective ranks, principal angles and domain coverage.

The paper's knowledge-coverage figure (Section 6, Fig. 7) is :func:`coverage` of each domain's keys
by a ``C``'s top-``k`` eigenspace; :func:`diagnose` tabulates everything for named covariances.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moir_lib.covariance.products import _torch
from moir_lib.covariance.stats import CovarianceStats

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import torch
    from jaxtyping import Float, Float64

    #: a C as :func:`diagnose` reads it: statistics (their per-layer means), one matrix, or one per layer
    CovarianceLike = (CovarianceStats | Float[torch.Tensor | np.ndarray, "d_in d_in"]
                      | Mapping[int, Float[torch.Tensor | np.ndarray, "d_in d_in"]])


def _as_matrix(c: Float[torch.Tensor | np.ndarray, "d_in d_in"]) -> Float64[torch.Tensor, "d_in d_in"]:
    torch = _torch()
    m = torch.as_tensor(c).to(torch.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"a covariance must be a square matrix, got shape {tuple(m.shape)}")
    return m


def _eigh(c: Float[torch.Tensor | np.ndarray, "d_in d_in"]
          ) -> tuple[Float64[torch.Tensor, " d_in"], Float64[torch.Tensor, "d_in d_in"]]:
    """Eigenvalues (descending) and eigenvectors (columns) of the symmetrised matrix."""
    torch = _torch()
    m = _as_matrix(c)
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return vals.flip(0), vecs.flip(1)


def spectrum(c: Float[torch.Tensor | np.ndarray, "d_in d_in"]) -> Float64[torch.Tensor, " d_in"]:
    """Eigenvalues of ``C`` in descending order."""
    return _eigh(c)[0]


def _eigvals(
    c_or_vals: Float[torch.Tensor | np.ndarray, "d_in d_in"] | Float[torch.Tensor | np.ndarray, " d_in"],
) -> Float64[torch.Tensor, " d_in"]:
    torch = _torch()
    t = torch.as_tensor(c_or_vals).to(torch.float64)
    return spectrum(t) if t.ndim == 2 else t


def effective_rank(c_or_eigenvalues: Float[torch.Tensor | np.ndarray, "d_in d_in"]
                   | Float[torch.Tensor | np.ndarray, " d_in"]) -> float:
    """``exp(H(p))``, ``p_i = λ_i / Σλ`` (Roy & Vetterli's effective rank; negative rounding clipped)."""
    torch = _torch()
    lam = _eigvals(c_or_eigenvalues).clamp(min=0)
    total = lam.sum()
    if total <= 0:
        return 0.0
    p = lam / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def participation_ratio(c_or_eigenvalues: Float[torch.Tensor | np.ndarray, "d_in d_in"]
                        | Float[torch.Tensor | np.ndarray, " d_in"]) -> float:
    """``(Σλ)² / Σλ²``."""
    lam = _eigvals(c_or_eigenvalues).clamp(min=0)
    sq = float((lam**2).sum())
    return float(lam.sum()) ** 2 / sq if sq > 0 else 0.0


def top_eigenspace(c: Float[torch.Tensor | np.ndarray, "d_in d_in"], k: int
                   ) -> Float64[torch.Tensor, "d_in k"]:
    """``U_k``: orthonormal columns spanning the top-``k`` eigenspace of ``C``."""
    vals, vecs = _eigh(c)
    if not 1 <= k <= vals.shape[0]:
        raise ValueError(f"k must be in 1..{vals.shape[0]}, got {k}")
    return vecs[:, :k]


def principal_angles(
    a: Float[torch.Tensor | np.ndarray, "d_in d_in"] | Float[torch.Tensor | np.ndarray, "d_in k"],
    b: Float[torch.Tensor | np.ndarray, "d_in d_in"] | Float[torch.Tensor | np.ndarray, "d_in k"],
    k: int,
) -> Float64[torch.Tensor, " k"]:
    """Principal angles (radians, ascending) between the top-``k`` eigenspaces of ``a`` and ``b``.

    ``a``/``b`` may also be orthonormal bases. ``cos θ_i`` are the singular values of ``U_aᵀ U_b``.
    """
    return _angles(_basis(a, k), _basis(b, k))


def _angles(ua: Float[torch.Tensor, "d_in k"], ub: Float[torch.Tensor, "d_in k"]
            ) -> Float[torch.Tensor, " k"]:
    """Principal angles between the spans of two orthonormal bases (radians, ascending)."""
    torch = _torch()
    s = torch.linalg.svdvals(ua.T @ ub).clamp(-1.0, 1.0)
    return torch.arccos(s).sort().values


def _basis(
    x: Float[torch.Tensor | np.ndarray, "d_in d_in"] | Float[torch.Tensor | np.ndarray, "d_in k"], k: int,
) -> Float64[torch.Tensor, "d_in k"]:
    torch = _torch()
    t = torch.as_tensor(x).to(torch.float64)
    if t.ndim == 2 and t.shape[0] == t.shape[1]:
        return top_eigenspace(t, k)
    if t.ndim == 2 and t.shape[1] == k:
        return t
    raise ValueError(f"expected a square covariance or a d×{k} basis, got shape {tuple(t.shape)}")


def coverage(c: Float[torch.Tensor | np.ndarray, "d_in d_in"] | None,
             domain: Float[torch.Tensor | np.ndarray, "d_in d_in"], k: int,
             basis: Float[torch.Tensor, "d_in k"] | None = None) -> float:
    """Share of a domain's key energy inside ``C``'s top-``k`` eigenspace: ``tr(U_kᵀ C_d U_k) / tr(C_d)``.

    1 means every key of the domain lies in the directions ``C`` protects most; ``k/d`` is what
    a random subspace would cover of an isotropic domain.
    """
    cd = _as_matrix(domain)
    u = basis if basis is not None else top_eigenspace(c, k)
    total = float(cd.diagonal().sum())
    if total <= 0:
        raise ValueError("the domain covariance has zero trace")
    return float((u.T @ cd @ u).diagonal().sum()) / total


def _per_layer(x: CovarianceLike, layers: Sequence[int] | None
               ) -> dict[int | None, Float64[torch.Tensor, "d_in d_in"]]:
    torch = _torch()
    if isinstance(x, CovarianceStats):
        use = layers if layers is not None else x.layers
        return {layer: x.mean(layer) for layer in use if layer in x.layers}
    if isinstance(x, torch.Tensor) or hasattr(x, "__array__"):
        return {None: _as_matrix(x)}
    if isinstance(x, Mapping):
        return {layer: _as_matrix(v) for layer, v in x.items() if layers is None or layer in layers}
    raise TypeError(f"expected CovarianceStats, a matrix or {{layer: matrix}}, got {type(x).__name__}")


def _subspace_sizes(k: int | Sequence[int] | None, d: int) -> list[int]:
    """The ``k`` of :func:`diagnose` (default ``d/64, d/16, d/4``)."""
    if k is None:
        return sorted({max(1, d // 64), max(1, d // 16), max(1, d // 4)})
    return [k] if isinstance(k, int) else list(k)


@dataclass
class Diagnosis:
    """Tidy tables (one row per measurement) from :func:`diagnose`.

    ``spectrum``: name, layer, index, eigenvalue, share, cumulative. ``summary``: name, layer,
    dim, tokens, trace, top_eigenvalue, effective_rank, participation_ratio, k90, k99 (eigen-
    directions holding 90 / 99 % of the trace). ``angles``: a, b, layer, k, index, angle_rad,
    angle_deg, cos. ``coverage``: name, domain, layer, k, coverage, random (``k/d``).
    """

    spectrum: pd.DataFrame
    summary: pd.DataFrame
    angles: pd.DataFrame
    coverage: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"spectrum": self.spectrum, "summary": self.summary, "angles": self.angles,
                "coverage": self.coverage}


def diagnose(covariances: Mapping[str, CovarianceLike], *,
             domains: Mapping[str, CovarianceLike] | None = None, k: int | Sequence[int] | None = None,
             layers: Sequence[int] | None = None, spectrum_points: int | None = None) -> Diagnosis:
    """Spectra, effective ranks, principal angles and domain coverage of named covariances.

    ``covariances``: ``{name: CovarianceStats | matrix | {layer: matrix}}`` (statistics are read
    through :meth:`CovarianceStats.mean`). ``domains``: ``{domain: …}`` whose coverage by each
    covariance's top-``k`` eigenspace is reported (default: the covariances themselves, a
    cross-coverage table). ``k``: one or several subspace sizes (default ``d/64, d/16, d/4``).
    ``spectrum_points``: keep only this many leading eigenvalues per spectrum (default all).
    Principal angles are reported for every pair of covariances. One ``eigh`` per matrix.
    """
    import pandas as pd

    named = {name: _per_layer(c, layers) for name, c in covariances.items()}
    dom_source = domains if domains is not None else covariances
    dom = {name: _per_layer(c, layers) for name, c in dom_source.items()}
    stats_tokens = {name: c.counts for name, c in covariances.items() if isinstance(c, CovarianceStats)}
    eig: dict[tuple[str, Any], tuple[Float64[torch.Tensor, " d_in"], Float64[torch.Tensor, "d_in d_in"]]] = {}
    spec_rows, sum_rows, angle_rows, cov_rows = [], [], [], []
    for name, per in named.items():
        for layer, c in per.items():
            vals, vecs = _eigh(c)
            eig[name, layer] = (vals, vecs)
            lam = vals.clamp(min=0)
            total = float(lam.sum())
            share = (lam / total) if total > 0 else lam
            cum = share.cumsum(0)
            d = int(vals.shape[0])
            keep = d if spectrum_points is None else min(d, spectrum_points)
            for i in range(keep):
                spec_rows.append({"name": name, "layer": layer, "index": i, "eigenvalue": float(vals[i]),
                                  "share": float(share[i]), "cumulative": float(cum[i])})
            sum_rows.append({
                "name": name, "layer": layer, "dim": d,
                "tokens": stats_tokens.get(name, {}).get(layer),
                "trace": float(c.diagonal().sum()), "top_eigenvalue": float(vals[0]),
                "effective_rank": effective_rank(vals), "participation_ratio": participation_ratio(vals),
                "k90": int((cum < 0.9).sum()) + 1 if total > 0 else 0,
                "k99": int((cum < 0.99).sum()) + 1 if total > 0 else 0,
            })

    names = list(named)
    for ia, a in enumerate(names):
        for b in names[ia + 1:]:
            for layer in named[a]:
                if layer not in named[b]:
                    continue
                va, vb = eig[a, layer][1], eig[b, layer][1]
                if va.shape != vb.shape:
                    raise ValueError(f"{a} and {b} have different dimensions at layer {layer}")
                for kk in _subspace_sizes(k, va.shape[0]):
                    theta = _angles(va[:, :kk], vb[:, :kk])
                    for i, t in enumerate(theta.tolist()):
                        angle_rows.append({"a": a, "b": b, "layer": layer, "k": kk, "index": i,
                                           "angle_rad": t, "angle_deg": math.degrees(t), "cos": math.cos(t)})
    for name, per in named.items():
        for layer in per:
            vecs = eig[name, layer][1]
            d = vecs.shape[0]
            for dname, dper in dom.items():
                if layer not in dper:
                    continue
                for kk in _subspace_sizes(k, d):
                    cov_rows.append({"name": name, "domain": dname, "layer": layer, "k": kk,
                                     "coverage": coverage(None, dper[layer], kk, basis=vecs[:, :kk]),
                                     "random": kk / d})
    return Diagnosis(
        spectrum=pd.DataFrame(spec_rows,
                              columns=["name", "layer", "index", "eigenvalue", "share", "cumulative"]),
        summary=pd.DataFrame(sum_rows, columns=["name", "layer", "dim", "tokens", "trace", "top_eigenvalue",
                                                "effective_rank", "participation_ratio", "k90", "k99"]),
        angles=pd.DataFrame(angle_rows,
                            columns=["a", "b", "layer", "k", "index", "angle_rad", "angle_deg", "cos"]),
        coverage=pd.DataFrame(cov_rows, columns=["name", "domain", "layer", "k", "coverage", "random"]),
    )
