"""Editing experiments: one run = profile × editor × regime × C × N × seed → tidy rows (chapters 01 and 05).

A :class:`Lab` owns one model (loaded lazily, only when something must be computed), its candidate
covariances ``C`` and a results table in its run directory; asking it for a run (:class:`RunSpec`)
returns the run's tidy rows, computing only what the table does not already hold. The chapters'
tables, headlines and closing texts are computed from those rows alone, in :mod:`moir_lib.chapters`.

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.specs`             ``RunSpec``, ``EvalSettings``, ``N_EVAL``, ``PRES_LIMIT``, ``CovSettings``,
                          ``grid_specs``
:mod:`.lab`               ``Lab``: the C variants, editing, evaluation, the edited records
:mod:`.editrun`           ``run_edits``: one editing run and its scores (``Lab.edit``, ``moir edit``)
:mod:`.rows`              the tidy row schema, ``write_rows`` / ``load_rows``, ``clean``
:mod:`.identity`          ``code_identity``, the row version, the machine-wide result copies
:mod:`.distortion`        ``output_distortion``: tr(ΔW C ΔWᵀ) / tr(W C Wᵀ)
:mod:`.editability`       the locus and editability gates of the pocket report
========================  ===============================================================
"""

from __future__ import annotations

from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.identity import code_identity
from moir_lib.experiments.lab import Lab
from moir_lib.experiments.rows import (
    EDIT_METRICS,
    GROUPS,
    RESULTS_NAME,
    ROW_COLUMNS,
    clean,
    load_rows,
    write_rows,
)
from moir_lib.experiments.specs import (
    N_EVAL,
    PRES_LIMIT,
    CovSettings,
    EvalSettings,
    RunSpec,
    grid_specs,
    profile_counts,
)

__all__ = [
    "EDIT_METRICS",
    "GROUPS",
    "ROW_COLUMNS",
    "RESULTS_NAME",
    "CovSettings",
    "EvalSettings",
    "N_EVAL",
    "PRES_LIMIT",
    "Lab",
    "RunSpec",
    "clean",
    "profile_counts",
    "grid_specs",
    "load_rows",
    "output_distortion",
    "write_rows",
    "code_identity",
]
