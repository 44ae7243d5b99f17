"""Key covariances ``C = E[k kᵀ]`` at the key site (eq. (kfac), Algorithm 1, eq. (memoir_estimator)).

Closed-form editors protect the span of the keys ``k = φ_ℓ(x)`` (the input of ``W_out^ℓ``): MEMIT
regularises with ``λ·C``, AlphaEdit projects onto the null space of ``C``. One module per concern:

- :mod:`~moir_lib.covariance.stats`: :class:`CovarianceStats` (exact float64 sums and counts, merge,
  save/load with checksums), :func:`check_disjoint`, :func:`read_metadata`;
- :mod:`~moir_lib.covariance.products`: the batch products ``KᵀK`` in float64 / float32 / tf32;
- :mod:`~moir_lib.covariance.hooks`: :class:`KeyCollector` at the key site, :func:`base_metadata`;
- :mod:`~moir_lib.covariance.packing`: documents → padded batches (which positions count);
- :mod:`~moir_lib.covariance.estimation`: :func:`estimate` over a corpus, cached and resumable;
- :mod:`~moir_lib.covariance.mixing`: :func:`mix`, the oracle mixture ``Σ_i w_i C_i`` (appendix A.2);
- :mod:`~moir_lib.covariance.diagnostics`: spectra, effective ranks, principal angles, coverage,
  :func:`diagnose`;
- :mod:`~moir_lib.covariance.recipes`: the one recipe per named C (``wiki``, ``wiki-subset``,
  ``oracle``, ``moir``, ``moir-<strategy>``, a saved file), used by ``moir edit``, the Lab and the
  alignment analysis;
- :mod:`~moir_lib.covariance.interop`: C to and from the ``layer_stats`` cache that the MEMIT and
  AlphaEdit repositories and EasyEdit read.

The commands ``moir cov estimate|merge|export|import`` live in :mod:`moir_lib.cli.covariance`.
"""

from moir_lib.covariance.diagnostics import (
    Diagnosis,
    coverage,
    diagnose,
    effective_rank,
    participation_ratio,
    principal_angles,
    spectrum,
    top_eigenspace,
)
from moir_lib.covariance.estimation import EstimationSettings, estimate, estimate_key, tokenizer_fingerprint
from moir_lib.covariance.hooks import KeyCollector, base_metadata
from moir_lib.covariance.mixing import mix
from moir_lib.covariance.products import PRECISIONS, resolve_precision
from moir_lib.covariance.recipes import build, component
from moir_lib.covariance.stats import FORMAT, IDENTITY_FIELDS, CovarianceStats, check_disjoint, read_metadata

__all__ = [
    "FORMAT",
    "IDENTITY_FIELDS",
    "PRECISIONS",
    "CovarianceStats",
    "Diagnosis",
    "EstimationSettings",
    "KeyCollector",
    "base_metadata",
    "build",
    "check_disjoint",
    "component",
    "coverage",
    "diagnose",
    "effective_rank",
    "estimate",
    "estimate_key",
    "mix",
    "participation_ratio",
    "principal_angles",
    "read_metadata",
    "resolve_precision",
    "spectrum",
    "tokenizer_fingerprint",
    "top_eigenspace",
]
