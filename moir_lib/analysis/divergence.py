"""Jensen–Shannon between per-document NLL distributions (appendix D.3, Fig. 11b).

The paper's recipe: a common grid of 512 points spanning ``[P0.5, P99.5]`` of the *pooled* NLL
values of the two samples; a Gaussian KDE (Scott bandwidth, :class:`scipy.stats.gaussian_kde`) of each
sample evaluated on the grid and normalised to sum to one on it; then

    JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m),   m = ½ (p + q).

We report the *divergence* in nats (bounded by ln 2 ≈ 0.693) and in bits (bounded by 1), and the
Jensen–Shannon *distance* ``sqrt(JSD)`` (a metric; ``scipy.spatial.distance.jensenshannon`` returns
the nats version, bounded by sqrt(ln 2) ≈ 0.833; the bits version is bounded by 1).

**Which one is Fig. 11b?** Its header says "Jensen–Shannon distances" (values .0015–.3646), while
the text defines the divergence. The smallest entry decides it: web vs the pretraining reference,
.0015, where "web" (DCLM) is 95.4 % of the pretraining mixture, so the two samples come from nearly
the same distribution. Two *independent* samples of the same distribution never give zero: the KDE
noise alone gives, at the paper's sizes (3000 documents per corpus, ≈6000 for post-training), a
divergence of about 4e-4–6e-4 nats (6e-4–9e-4 bits) but a distance of about 0.020–0.029 (measured
on normal, lognormal, gamma and skewed-mixture samples; ``tests/test_analysis.py::test_fig11b_noise_floor``
checks it). A
*distance* of .0015 would need a divergence of 2e-6, some 200× below that floor — unreachable with
3000 documents unless the two samples shared their documents; a *divergence* of .0015 sits 2-3× above
the floor, as a corpus that is 95 % of the mixture should.
So **Fig. 11b's numbers behave like the divergence, not the distance**, despite the header. Whether they
are in nats or bits cannot be told from the table (a factor 1/ln 2 = 1.44 changes no ordering and the
floor argument holds for both; ``scipy.spatial.distance.jensenshannon(p, q) ** 2`` would give nats).
This is an inference from sampling noise, not a statement by the authors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from jaxtyping import Float

__all__ = ["JSDResult", "GRID_POINTS", "QUANTILES", "common_grid", "kde_on_grid", "jensen_shannon",
           "js_of_densities", "jsd_table", "scott_bandwidth"]

log = logging.getLogger(__name__)

GRID_POINTS = 512
QUANTILES = (0.5, 99.5)
LN2 = math.log(2.0)


@dataclass(frozen=True)
class JSDResult:
    """Jensen–Shannon between two samples: the divergence (nats, bits) and the distance ``sqrt`` of each."""

    jsd: float  # divergence, nats, in [0, ln 2]
    jsd_bits: float  # divergence, bits, in [0, 1]
    distance: float  # sqrt(jsd): the Jensen–Shannon distance in nats^½ (scipy's default), in [0, sqrt(ln 2)]
    distance_bits: float  # sqrt(jsd_bits), in [0, 1]
    n_p: int
    n_q: int
    lo: float  # grid start (pooled P0.5)
    hi: float  # grid end (pooled P99.5)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _clean(values: object, name: str) -> Float[np.ndarray, " samples"]:
    arr = np.asarray(values, dtype=np.float64).ravel()
    finite = np.isfinite(arr)
    if not finite.all():
        log.warning("%s: dropping %d non-finite values of %d", name, int((~finite).sum()), arr.size)
        arr = arr[finite]
    if arr.size < 2:
        raise ValueError(f"{name}: need at least 2 finite values for a KDE, got {arr.size}")
    if np.ptp(arr) == 0:
        raise ValueError(f"{name}: all {arr.size} values are equal ({arr[0]}); a KDE needs some spread")
    return arr


def common_grid(p: Float[np.ndarray, " samples"], q: Float[np.ndarray, " samples_q"],
                points: int = GRID_POINTS, quantiles: tuple[float, float] = QUANTILES
                ) -> Float[np.ndarray, " points"]:
    """``points`` equally spaced values over ``[P_lo, P_hi]`` of the pooled samples (percentiles)."""
    lo, hi = np.percentile(np.concatenate([p, q]), quantiles)
    if not hi > lo:
        raise ValueError(f"the pooled samples have no spread between the {quantiles} percentiles")
    return np.linspace(lo, hi, points)


def kde_on_grid(values: Float[np.ndarray, " samples"], grid: Float[np.ndarray, " points"],
                bandwidth: float | None = None,
                weights: Float[np.ndarray, "*shape samples"] | None = None
                ) -> Float[np.ndarray, "*shape points"]:
    """Gaussian KDE of ``values`` on ``grid``, normalised to sum to 1 on the grid: Scott's bandwidth
    (:class:`scipy.stats.gaussian_kde`) by default; with ``bandwidth``, that fixed bandwidth and, with
    ``weights`` (multiplicities ``(..., samples)``, e.g. a bootstrap's), one density per row of weights
    (a resample's own Scott bandwidth would shrink with its ties: fix it from the full sample,
    :func:`scott_bandwidth`)."""
    if bandwidth is not None:
        kernel = np.exp(-0.5 * ((grid[None, :] - values[:, None]) / bandwidth) ** 2)  # (samples, points)
        density = kernel.sum(axis=0) if weights is None else np.asarray(weights, dtype=np.float64) @ kernel
        total = density.sum(axis=-1, keepdims=True)
        if not np.all(total > 0):
            raise ValueError("the KDE has no mass on the grid (the samples lie outside the pooled "
                             "percentiles)")
        return density / total
    if weights is not None:
        raise ValueError("weighted KDEs need a fixed bandwidth: pass bandwidth=scott_bandwidth(values)")
    from scipy.stats import gaussian_kde

    density = gaussian_kde(values, bw_method="scott")(grid)
    total = density.sum()
    if not total > 0:
        raise ValueError("the KDE has no mass on the grid (the samples lie outside the pooled percentiles)")
    return density / total


def scott_bandwidth(values: Float[np.ndarray, " samples"]) -> float:
    """Scott's rule as :class:`scipy.stats.gaussian_kde` applies it in one dimension: ``s · n^(-1/5)``
    (``s`` the sample standard deviation)."""
    return float(np.std(values, ddof=1) * values.size ** (-1 / 5))


def js_of_densities(p: Float[np.ndarray, "*shape points"], q: Float[np.ndarray, "*shape points"]
                    ) -> float | Float[np.ndarray, "*shape"]:
    """``½ KL(p ‖ m) + ½ KL(q ‖ m)`` of densities on one grid (over the last axis), clipped to [0, ln 2]."""
    from scipy.special import rel_entr

    m = 0.5 * (p + q)
    value = np.clip(0.5 * rel_entr(p, m).sum(axis=-1) + 0.5 * rel_entr(q, m).sum(axis=-1), 0.0, LN2)
    return float(value) if value.ndim == 0 else value


def jensen_shannon(p_values: object, q_values: object, *, points: int = GRID_POINTS,
                   quantiles: tuple[float, float] = QUANTILES) -> JSDResult:
    """Jensen–Shannon between the distributions of two samples (e.g. per-document NLLs), the paper's way.

    Non-finite values are dropped (with a warning). Symmetric in its arguments.
    """
    p = _clean(p_values, "p")
    q = _clean(q_values, "q")
    grid = common_grid(p, q, points, quantiles)
    jsd = js_of_densities(kde_on_grid(p, grid), kde_on_grid(q, grid))
    bits = jsd / LN2
    return JSDResult(jsd, bits, math.sqrt(jsd), math.sqrt(bits), p.size, q.size, float(grid[0]),
                     float(grid[-1]))


def jsd_table(samples: Mapping[str, object], references: Mapping[str, object], *, points: int = GRID_POINTS,
              quantiles: tuple[float, float] = QUANTILES) -> pd.DataFrame:
    """Every sample against every reference (Fig. 11b: corpora × {pre-, post-training}), tidy.

    Columns: ``corpus, reference, jsd, jsd_bits, distance, distance_bits, n_corpus, n_reference``.
    The paper-style wide table is ``table.pivot(index="corpus", columns="reference", values="jsd")``
    (see the module docstring for why ``jsd`` — the divergence — is the column that matches Fig. 11b).
    """
    if not samples or not references:
        raise ValueError("jsd_table needs at least one sample and one reference")
    rows = []
    for name, values in samples.items():
        for ref, ref_values in references.items():
            r = jensen_shannon(values, ref_values, points=points, quantiles=quantiles)
            rows.append({"corpus": name, "reference": ref, "jsd": r.jsd, "jsd_bits": r.jsd_bits,
                         "distance": r.distance, "distance_bits": r.distance_bits, "n_corpus": r.n_p,
                         "n_reference": r.n_q})
    return pd.DataFrame(rows)
