"""Editing experiments: profile × editor × regime × C × N × edit sample → tidy rows (chapters 01 and 05).

A :class:`Lab` owns one model (loaded only when something must be computed), its candidate covariances
``C`` and a :class:`PointStore` of scored points; asking it for an experiment (:class:`ExperimentSpec`)
returns the experiment's tidy rows and per-item scores, computing only what the store does not already
hold. The chapters' tables, claims, headlines and closing texts are functions of those rows and items, in
:mod:`moir_lib.chapters`.

Its modules, each with what it owns, are listed in ``moir_lib/README.md``'s module map (generated from
their docstrings by ``moir docs``).
"""

from __future__ import annotations

from moir_lib.covariance.recipes import CovSettings
from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.identity import code_identity
from moir_lib.experiments.lab import Lab
from moir_lib.experiments.labs import (
    LabSettings,
    claimed_point,
    cov_draws,
    open_lab,
    open_labs,
    pooled_frames,
    with_draws,
)
from moir_lib.experiments.point import ScorePlan
from moir_lib.experiments.records import EditRecords
from moir_lib.experiments.rows import (
    EDIT_METRICS,
    GROUPS,
    RESULTS_NAME,
    ROW_COLUMNS,
    clean,
    load_rows,
    write_rows,
)
from moir_lib.experiments.selection import Selection, chosen, organism_strengths, strengths
from moir_lib.experiments.specs import (
    N_EVAL,
    PRES_LIMIT,
    EditSettings,
    EvalSettings,
    ExperimentSpec,
    grid_specs,
    profile_counts,
)
from moir_lib.experiments.store import PointStore

__all__ = [
    "EDIT_METRICS",
    "GROUPS",
    "ROW_COLUMNS",
    "RESULTS_NAME",
    "CovSettings",
    "EditRecords",
    "EditSettings",
    "EvalSettings",
    "N_EVAL",
    "PRES_LIMIT",
    "Lab",
    "LabSettings",
    "PointStore",
    "ExperimentSpec",
    "ScorePlan",
    "Selection",
    "clean",
    "chosen",
    "claimed_point",
    "code_identity",
    "cov_draws",
    "grid_specs",
    "load_rows",
    "open_lab",
    "open_labs",
    "organism_strengths",
    "output_distortion",
    "pooled_frames",
    "profile_counts",
    "strengths",
    "with_draws",
    "write_rows",
]
