"""Oracle mixtures ``C = Σ_i w_i C_i`` (appendix A.2): the uncentered covariance is linear in the
distribution."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from moir_lib.covariance.products import _torch
from moir_lib.covariance.stats import IDENTITY_FIELDS, KEEP_ON_MERGE, CovarianceStats

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

    #: one mixture component: statistics, a matrix, or one matrix per layer
    Component = (CovarianceStats | Float[torch.Tensor, "d_in d_in"]
                 | Mapping[int, Float[torch.Tensor, "d_in d_in"]])


def mix(components: Mapping[Component, float] | Iterable[tuple[Component, float]]
        ) -> (CovarianceStats | Float64[torch.Tensor, "d_in d_in"]
              | dict[int, Float64[torch.Tensor, "d_in d_in"]]):
    """The oracle mixture ``C = Σ_i w_i C_i`` (appendix A.2), with weights normalised to sum 1.

    The uncentered covariance is linear in the distribution: for ``p = Σ w_i p_i``,
    ``E_p[k kᵀ] = Σ w_i E_{p_i}[k kᵀ]``. So per-layer *means* are mixed (not raw sums, which
    would weight each component by its token count). Components are all
    :class:`CovarianceStats` (result: statistics whose ``mean`` is the mixture, ``count`` the
    pooled token count, metadata ``mixture`` lists components and weights), all tensors
    (result: a float64 tensor) or all ``{layer: tensor}`` mappings (result: such a mapping).
    """
    torch = _torch()
    items = list(components.items()) if isinstance(components, Mapping) else list(components)
    if not items:
        raise ValueError("mix() needs at least one component")
    weights = [float(w) for _, w in items]
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"mixture weights must be finite, non-negative and not all zero, got {weights}")
    total = sum(weights)
    weights = [w / total for w in weights]
    parts = [c for c, _ in items]
    if all(isinstance(c, CovarianceStats) for c in parts):
        first = parts[0]
        for other in parts[1:]:
            diffs = first.identity_differences(other)
            if diffs:
                raise ValueError("cannot mix covariance statistics that differ in " + "; ".join(diffs))
        meta = {k: v for k, v in first.metadata.items() if k in IDENTITY_FIELDS or k in KEEP_ON_MERGE}
        meta["corpus"] = []
        meta["mixture"] = [{"weight": w, "corpus": c.metadata.get("corpus"), "tokens": c.n_tokens}
                           for c, w in zip(parts, weights, strict=True)]
        out = CovarianceStats(first.layers, first.dim, meta, precision=first.precision)
        for layer in first.layers:
            mixed = None
            for c, w in zip(parts, weights, strict=True):
                if w > 0:
                    term = w * c.mean(layer)
                    mixed = term if mixed is None else mixed + term.to(mixed.device)
            count = sum(c.count(layer) for c in parts)
            out._acc[layer] = mixed * count
            out._count[layer] = count
        return out
    if all(isinstance(c, torch.Tensor) for c in parts):
        shapes = {tuple(c.shape) for c in parts}
        if len(shapes) != 1:
            raise ValueError(f"cannot mix matrices of different shapes {sorted(shapes)}")
        return sum(w * c.to(torch.float64) for c, w in zip(parts, weights, strict=True))
    if all(isinstance(c, Mapping) for c in parts):
        keys = set(parts[0])
        if any(set(c) != keys for c in parts):
            raise ValueError("cannot mix layer mappings with different layers")
        return {layer: sum(w * c[layer].to(torch.float64) for c, w in zip(parts, weights, strict=True))
                for layer in sorted(keys)}
    raise TypeError("mix() components must be all CovarianceStats, all tensors or all "
                    "{layer: tensor} mappings")
