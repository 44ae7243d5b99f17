"""A scored point's key (everything that determines its rows: the profile's content, the editor settings,
the C's recipe, the records, the evaluation settings, the code, the row version), and where the
machine-wide copy of a scored point lives."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.cache import fingerprint
from moir_lib.experiments.rows import NONE

if TYPE_CHECKING:
    from moir_lib.covariance.recipes import CovSettings
    from moir_lib.experiments.records import EditRecords
    from moir_lib.experiments.specs import EvalSettings, ExperimentSpec
    from moir_lib.profiles import Profile

#: Version of the lab's rows (part of every key): bumped when its evaluation changes.
ROW_VERSION = 2
#: Where a point's numbers are computed: the lab (editing, scoring, measuring a point) and, through its
#: imports, everything it runs (:func:`moir_lib.sources.closure`: editors, metrics, C estimation,
#: self-generation, corpora, model loading, the pocket organism, the NLL, the store, this key). The
#: presentation (``chapters/``, ``plots/``, ``book/``, ``cli/``) sits above the library and is never
#: imported by it, so it is not part of any key: editing a chapter's tables or texts keeps the cache.
POINT_MODULES = ("moir_lib.experiments.lab",)
#: Data files the numbers read besides those already in the key (the profile, the records): the pocket
#: preservation tasks' lm-eval configurations and their scoring code.
POINT_DATA = ("data/tasks/*",)


@functools.cache
def code_identity(modules: tuple[str, ...] = POINT_MODULES) -> str:
    """Fingerprint of the code that computes a point (:data:`POINT_MODULES`, or ``modules``, with what they
    import) and of :data:`POINT_DATA`: :func:`moir_lib.sources.digest`, which leaves out docstrings and
    comments and includes the Python version."""
    from moir_lib.sources import digest

    return digest(modules, POINT_DATA)


def shared_key(key: str, n: int) -> dict[str, Any]:
    """The cache key of the machine-wide copy of the point ``key`` at ``n`` edits (its files record it)."""
    return {"key": key, "n_edits": int(n)}


def shared_path(key: str, n: int) -> Path:
    """The machine-wide copy of one scored point (``$MOIR_CACHE/experiments/...``)."""
    from moir_lib.cache import entry_dir

    return entry_dir("experiments", shared_key(key, n)) / "rows.parquet"


def shared_items_path(key: str, n: int) -> Path:
    """The machine-wide copy of one scored point's per-item scores, beside its rows."""
    return shared_path(key, n).with_name("items.parquet")


def editor_settings(spec: ExperimentSpec, profile: Profile) -> dict[str, Any]:
    """The editor's strength of ``spec``: MEMIT's λ (and mode), AlphaEdit's τ (mode, L2), the profile's
    unless the spec sets one."""
    if spec.editor == "memit":
        m = profile.memit
        lam = spec.lambda_ if spec.lambda_ is not None else m.lambda_
        return {"lambda": lam, "lambda_mode": m.lambda_mode}
    if spec.editor == "alphaedit":
        a = profile.alphaedit
        return {"tau": spec.tau if spec.tau is not None else a.tau, "tau_mode": a.tau_mode, "l2": a.l2}
    return {}


def point_key(spec: ExperimentSpec, profile: Profile, cov_settings: CovSettings, edit_records: EditRecords,
              evaluation: EvalSettings, suite: str, templates: int | None, seq_batch_size: int) -> str:
    """Fingerprint of everything that determines the rows of ``spec`` at ``spec.n_edits``: the profile's
    sections that matter to it, the editor settings, the C's recipe
    (:func:`moir_lib.covariance.recipes.identity`), the records, the evaluation settings and suite, the
    context templates (``templates`` prefixes), the sequential batch cuts, the code and the row version."""
    from moir_lib.covariance.recipes import identity, parse_name
    from moir_lib.experiments.records import file_identity

    prof = profile.to_dict()
    for section in ("name", "editing"):  # the grid's edit counts do not change one run's numbers
        prof.pop(section, None)
    for section, grid in (("memit", "lambda_grid"), ("alphaedit", "tau_grid")):  # nor the values searched
        prof.get(section, {}).pop(grid, None)
    if parse_name(spec.cov)[0] in ("wiki", "wiki-subset", "oracle", NONE) or spec.cov in cov_settings.files:
        prof.pop("generation", None)
    if spec.editor == NONE:
        for section in ("memit", "alphaedit", "covariance", "generation"):
            prof.pop(section, None)
    record = {"v": ROW_VERSION, "code": code_identity(), "profile": prof, "editor": spec.editor,
              "settings": editor_settings(spec, profile), "regime": spec.regime, "cov": spec.cov,
              "cov_recipe": identity(spec.cov, profile, cov_settings) if spec.cov != NONE else {},
              "n_edits": spec.n_edits, "edit_sample": spec.edit_sample, "records": edit_records.identity(),
              "eval": evaluation.key(), "suite": suite}
    if templates is not None:
        record["templates"] = templates
    if edit_records.given_portability is not None:
        record["portability"] = file_identity(edit_records.given_portability)
    if spec.regime == "sequential":
        record["seq_batch_size"] = seq_batch_size
        cuts = [m for m in spec.milestones if m <= spec.n_edits]
        if any(m % seq_batch_size for m in cuts):  # batches are cut at milestones: they shape it
            record["cuts"] = cuts
    return fingerprint(record)
