"""Editing experiments: one run = profile × editor × regime × C × N × seed → tidy rows (chapters 01 and 05).

A :class:`Lab` owns one model (loaded lazily, only when something must be computed), its candidate
covariances ``C`` and a results table in its run directory; asking it for a run (:class:`RunSpec`)
returns the run's tidy rows, computing only what the table does not already hold. The tables, the
headlines and the closing texts of the chapters are computed from those rows alone.

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.specs`             ``RunSpec``, ``EvalSettings``, ``grid_specs``, ``profile_counts``
:mod:`.lab`               ``Lab``: the C variants, editing, evaluation, the edited records
:mod:`.editrun`           ``run_edits``: one editing run and its scores (``Lab.edit``, ``moir edit``)
:mod:`.rows`              the tidy row schema, ``write_rows`` / ``load_rows``, ``clean``
:mod:`.identity`          ``code_identity``, the row version, the machine-wide result copies
:mod:`.distortion`        ``output_distortion``: tr(ΔW C ΔWᵀ) / tr(W C Wᵀ)
:mod:`.tables`            Tables 1, 2, 5-9, the curves, the distortion table (pure pandas)
:mod:`.findings`          the ``summary.json`` headlines and closing texts of chapters 01, 05
:mod:`.explore`           ``explorer``: ipywidgets over the rows, for JupyterLab
========================  ===============================================================
"""

from __future__ import annotations

from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.explore import explorer
from moir_lib.experiments.findings import (
    findings_diagnosis,
    findings_editing,
    headline_diagnosis,
    headline_editing,
)
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
from moir_lib.experiments.specs import EvalSettings, RunSpec, grid_specs, profile_counts
from moir_lib.experiments.tables import (
    COV_LABELS,
    PRES_LABELS,
    baseline_table,
    curves,
    distortion_table,
    edit_hm_metric,
    finals,
    paper_table,
    pres_tasks,
    seed_ablation,
    styled,
    table1,
    task_baseline,
    wide,
)

__all__ = [
    "COV_LABELS",
    "EDIT_METRICS",
    "GROUPS",
    "PRES_LABELS",
    "ROW_COLUMNS",
    "RESULTS_NAME",
    "EvalSettings",
    "Lab",
    "RunSpec",
    "baseline_table",
    "curves",
    "distortion_table",
    "edit_hm_metric",
    "findings_diagnosis",
    "findings_editing",
    "finals",
    "paper_table",
    "explorer",
    "clean",
    "styled",
    "profile_counts",
    "task_baseline",
    "grid_specs",
    "headline_diagnosis",
    "headline_editing",
    "load_rows",
    "output_distortion",
    "write_rows",
    "code_identity",
    "pres_tasks",
    "seed_ablation",
    "table1",
    "wide",
]
