"""Editing experiments: one run = profile × editor × regime × C × N × seed → tidy rows (chapters 01 and 05).

A :class:`Lab` owns one model (loaded only when something must be computed), its candidate covariances
``C`` and a :class:`PointStore` of scored points; asking it for a run (:class:`RunSpec`) returns the
run's tidy rows and per-item scores, computing only what the store does not already hold. The chapters'
tables, claims, headlines and closing texts are functions of those rows and items, in
:mod:`moir_lib.chapters`.

========================  ===============================================================
module                    owns
========================  ===============================================================
:mod:`.specs`             ``RunSpec``, ``EvalSettings``, ``EditSettings``, ``N_EVAL``, ``PRES_LIMIT``,
                          ``grid_specs``
:mod:`.labs`              ``open_lab(s)``: a chapter's labs (one per organism) from its notebook
                          parameters; ``with_draws``, ``pooled_frames``: the runs its claims read
:mod:`.lab`               ``Lab``: named runs -> stored points
:mod:`.point`             ``edit_run``: one run's points, top to bottom (records, C, editor, edit,
                          score, rows); ``ScorePlan``
:mod:`.resources`         ``ModelResources``: the model, C's, editors, templates, z targets a lab shares
:mod:`.records`           ``EditRecords``: the edited records of each edit sample, the validation split
:mod:`.selection`         ``select``: AlphaEdit's τ and MEMIT's λ chosen on each organism's validation
                          split; ``organism_strengths``, ``retune``: a chapter's runs at each one's
:mod:`.budget_curve`            the sample-budget curve of C: prefixes against the whole, with intervals
:mod:`.editrun`           ``apply_edits``: the edits of one run; ``Scorer`` (CounterFact); ``EditRun``
:mod:`.measure`           what a point measures: CounterFact items, preservation, NLL, distortion
:mod:`.store`             ``PointStore``: own rows, reused runs, the machine-wide copy, locks
:mod:`.rows`              the tidy row schema, ``write_rows`` / ``load_rows``, ``clean``
:mod:`.identity`          a point's key, ``code_identity``, where the machine-wide copy lives
:mod:`.distortion`        ``output_distortion``: tr(ΔW C ΔWᵀ) / tr(W C Wᵀ)
:mod:`.gates`             ``ES_GATE``, ``EDIT_GATES``, ``N_FACTS``, ``N_EDITS``: the bars edits must clear
:mod:`.editability`       the locus and editability gates of the pocket report
:mod:`.pocket_report`     ``pocket_report``: the whole report, saved, reused under its key
========================  ===============================================================
"""

from __future__ import annotations

from moir_lib.covariance.recipes import CovSettings
from moir_lib.experiments.distortion import output_distortion
from moir_lib.experiments.identity import code_identity
from moir_lib.experiments.lab import Lab
from moir_lib.experiments.labs import LabSettings, open_lab, open_labs, pooled_frames, with_draws
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
    RunSpec,
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
    "RunSpec",
    "ScorePlan",
    "Selection",
    "clean",
    "chosen",
    "code_identity",
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
