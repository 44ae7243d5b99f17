"""The lab: one model, its covariances, and its editing experiments as stored points.

A :class:`Lab` binds a profile, its edit records, evaluation and editing settings to a
:class:`~moir_lib.experiments.store.PointStore` and to the model's shared resources
(:class:`~moir_lib.experiments.resources.ModelResources`: the model, its C's, editors, templates and z
targets). Asked for an experiment (an ``ExperimentSpec``) it returns its tidy rows, computing only the points
the store lacks along one path, :func:`moir_lib.experiments.point.compute_experiment` (records, C, editor,
edit, score, rows), which is also what :meth:`Lab.edit` (``moir edit``) runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.covariance.recipes import CovSettings
from moir_lib.experiments.experiment import ExperimentResult
from moir_lib.experiments.identity import editor_settings, point_key
from moir_lib.experiments.point import (
    Destination,
    PointContext,
    ScorePlan,
    compute_experiment,
    unedited_point,
)
from moir_lib.experiments.records import EditRecords
from moir_lib.experiments.resources import ModelResources
from moir_lib.experiments.rows import GROUPS, NONE, POINT_COLUMNS, empty_rows, with_cells
from moir_lib.experiments.specs import EDITORS, EditSettings, EvalSettings, ExperimentSpec
from moir_lib.experiments.store import PointStore
from moir_lib.locks import Busy

if TYPE_CHECKING:
    from moir_lib.covariance import CovarianceStats
    from moir_lib.editing.target_store import TargetStore
    from moir_lib.models import LoadedModel
    from moir_lib.profiles import Profile

log = logging.getLogger(__name__)

#: every group a point can score
ALL_GROUPS: tuple[str, ...] = ("edit", "preservation", "nll", "distortion")
#: :meth:`Lab.edit`'s default: CounterFact at every point of the spec
EDIT_ONLY = ScorePlan()


class Lab:
    """One model's editing experiments with their covariances and a store of scored points.

    ``profile``: a profile name, path or :class:`~moir_lib.profiles.Profile`; ``store``: a
    :class:`PointStore` or its run directory. ``evaluation``: :class:`EvalSettings`; ``cov_settings``:
    :class:`CovSettings` (resolved against the profile); ``editing``: :class:`EditSettings`; ``edit_records``:
    the :class:`EditRecords` it edits (default: the profile's pocket CounterFact).
    """

    def __init__(self, profile: str | os.PathLike[str] | Profile, store: PointStore | str | os.PathLike[str],
                 *, evaluation: EvalSettings | None = None, cov_settings: CovSettings | None = None,
                 editing: EditSettings | None = None,
                 edit_records: EditRecords | None = None, device: str | None = None,
                 progress: bool = False) -> None:
        from moir_lib.profiles import Profile, load_profile

        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.store = store if isinstance(store, PointStore) else PointStore(store)
        self.store.labels = {"profile": self.profile.name, "model": self.profile.model}
        self.evaluation = evaluation or EvalSettings()
        self.editing = editing or EditSettings()
        self.edit_records = edit_records or EditRecords.of(self.profile, self.evaluation)
        self.variant, self.suite = self.edit_records.variant, self.edit_records.suite
        self.cov_settings = (cov_settings or CovSettings()).resolved(self.profile)
        self.resources = ModelResources(self.profile, self.cov_settings, self.variant, device, progress)
        self.context = PointContext(self.resources, self.edit_records, self.evaluation,
                                    self.editing.seq_batch_size, {e: self.n_templates(e) for e in EDITORS},
                                    self.cov_settings.seed)
        self.computed: list[dict[str, Any]] = []  # what this lab computed (not read from the store)

    def describe(self) -> dict[str, Any]:
        """The lab's settings (for ``summary.json``)."""
        return {"profile": self.profile.name, "model": self.profile.model, "suite": self.suite,
                "evaluation": dataclasses.asdict(self.evaluation),
                "context_templates": {e: self.n_templates(e) for e in EDITORS},
                "seq_batch_size": self.editing.seq_batch_size,
                "cov_settings": dataclasses.asdict(self.cov_settings),
                "edit_records": self.edit_records.describe(),
                "portability": self.edit_records.given_portability,
                "memit": dataclasses.asdict(self.profile.memit),
                "alphaedit": dataclasses.asdict(self.profile.alphaedit)}

    def key(self, spec: ExperimentSpec) -> str:
        """Fingerprint of everything that determines the rows of ``spec`` at ``spec.n_edits``."""
        return point_key(spec, self.profile, self.cov_settings, self.edit_records, self.evaluation,
                         self.suite,
                         self.n_templates(spec.editor) if spec.editor != NONE else None,
                         self.editing.seq_batch_size)

    def sibling(self, store: PointStore, *, evaluation: EvalSettings, edit_records: EditRecords) -> Lab:
        """A lab on this lab's :attr:`resources` (model, C's, editors, context templates, z targets) that
        edits ``edit_records`` and scores them with ``evaluation`` into ``store``: the selection's validation
        lab (:mod:`moir_lib.experiments.selection`). Its points have their own keys."""
        other = Lab(self.profile, store, evaluation=evaluation, cov_settings=self.cov_settings,
                    editing=self.editing, edit_records=edit_records)
        other.resources = other.context.resources = self.resources
        return other

    def model(self) -> LoadedModel:
        """The model as it is now (:meth:`ModelResources.model`)."""
        return self.resources.model()

    def is_loaded(self) -> bool:
        return self.resources.loaded is not None

    def unedited(self) -> LoadedModel:
        """The model, checked to hold its original edit-layer weights (:meth:`ModelResources.unedited`)."""
        return self.resources.unedited()

    def defined_covs(self, covs: Iterable[str]) -> list[str]:
        """The names in ``covs`` this lab can build (``oracle`` and ``wiki-subset`` need their corpora)."""
        out = [c for c in covs if self.cov_settings.defines(c)]
        for c in set(covs) - set(out):
            log.info("C %s is not defined for profile %s: left out", c, self.profile.name)
        return out

    def covariance(self, name: str) -> CovarianceStats:
        """The C named ``name`` at the edit layers (:meth:`ModelResources.covariance`, cached)."""
        return self.resources.covariance(name)

    def cov_info(self) -> pd.DataFrame:
        """One row per C built so far: recipe, token count, build time."""
        return pd.DataFrame([{"cov": k, **{kk: (json.dumps(vv) if isinstance(vv, (dict, list)) else vv)
                                           for kk, vv in info.items()}}
                             for k, (_, info) in self.resources.cov_stats.items()])

    def domain_covariances(self) -> dict[str, CovarianceStats]:
        """Pocket only: ``C_d`` of every domain's training split
        (:meth:`ModelResources.domain_covariances`)."""
        return self.resources.domain_covariances()

    def editor(self, spec: ExperimentSpec, allow_empty: bool = False) -> Any:
        """The editor of ``spec`` (:meth:`ModelResources.editor`)."""
        return self.resources.editor(spec, allow_empty)

    def n_templates(self, editor: str) -> int:
        """Sampled prefixes ``editor`` averages over: the lab's ``context_templates``, else the profile's."""
        if self.editing.context_templates is not None:
            return self.editing.context_templates
        if editor not in EDITORS:
            raise ValueError(f"no context templates for editor {editor!r}: choose {', '.join(EDITORS)}")
        return getattr(self.profile, editor).context_templates  # the profile section named after it

    def templates(self, editor: str, seed: int) -> list[list[str]]:
        """The plain prompt and :meth:`n_templates` prefixes sampled from the unedited model."""
        return self.resources.templates(self.n_templates(editor), seed)

    def target_store(self) -> TargetStore:
        """The z targets on the unedited model (:meth:`ModelResources.target_store`)."""
        return self.resources.target_store()

    def edit(self, spec: ExperimentSpec, plan: ScorePlan = EDIT_ONLY, *, store: bool = False
             ) -> ExperimentResult:
        """The editing experiment ``spec`` (:func:`~moir_lib.experiments.point.compute_experiment`) on the
        first ``spec.n_edits`` records of its edit sample, scored as ``plan`` says; with ``store``, each
        scored point's rows go to this lab's store as soon as it is scored. The weights are restored and
        checked bit-exactly afterwards."""
        return compute_experiment(self.context, spec, plan, self._destination(spec) if store else None)

    def _destination(self, spec: ExperimentSpec) -> Destination:
        """Where the points of ``spec`` go: this lab's store, under their keys."""
        return Destination(self.store, {n: self.key(spec.at(n)) for n in spec.points},
                           editor_settings(spec, self.profile))

    def compute(self, spec: ExperimentSpec, groups: Sequence[str] = ALL_GROUPS, *, wait: bool = True
            ) -> pd.DataFrame | None:
        """The rows of ``spec`` (every scored point), computing only the points the store lacks; ``None``
        (nothing done) when ``wait`` is false and another process is computing them. The store's tables
        are consolidated afterwards (:meth:`PointStore.flush`)."""
        rows = self._rows(spec, groups, wait)
        self.store.flush()
        return rows

    def _rows(self, spec: ExperimentSpec, groups: Sequence[str], wait: bool) -> pd.DataFrame | None:
        """:meth:`compute` without consolidating the store's tables."""
        need = self._needed(groups, spec)
        keys = {n: self.key(spec.at(n)) for n in spec.points}
        if not all(self.store.has(keys[n], n, need) for n in spec.points):
            last = max(spec.points)
            what = f"editing experiment {spec.editor} {spec.regime} C={spec.cov} N={last}"
            try:
                with self.store.lock(keys[last], last, what, wait=wait):
                    missing = [n for n in spec.points if not self.store.has(keys[n], n, need)]
                    if missing:
                        self._score_missing(spec, need, missing)
            except Busy:
                return None
        rows = pd.concat([self.store.point(keys[n], n) for n in spec.points], ignore_index=True)
        return rows[rows["group"].isin({*need, "cost"})].reset_index(drop=True)

    def is_cached(self, spec: ExperimentSpec, groups: Sequence[str] = ("edit", "preservation")) -> bool:
        """Whether the store holds every point of ``spec`` with every group of ``groups``."""
        need = self._needed(groups, spec)
        return all(self.store.has(self.key(spec.at(n)), n, need) for n in spec.points)

    def compute_all(self, specs: Iterable[ExperimentSpec], groups: Sequence[str] = ALL_GROUPS
                    ) -> pd.DataFrame:
        """Rows of every experiment in ``specs`` (one table). With the machine-wide copy, an experiment
        another process is computing is put off rather than waited for, and read at the end: processes given
        overlapping lists (two chapters, a chapter and its helper) share the work, each experiment computed
        once."""
        specs = list(specs)
        first = [self._rows(s, groups, wait=False) for s in specs]
        put_off = sum(f is None for f in first)
        if put_off:
            log.info("%d experiment(s) put off while another process computes them", put_off)
        frames = [f if f is not None else self._rows(s, groups, True)
                  for f, s in zip(first, specs, strict=True)]
        self.store.flush()
        return pd.concat(frames, ignore_index=True) if frames else empty_rows()

    def _score_missing(self, spec: ExperimentSpec, need: Sequence[str], missing: list[int]) -> None:
        """Score the points ``missing`` of ``spec`` (groups ``need``), storing each once it is scored."""
        t_start = time.perf_counter()
        if spec.editor == NONE:
            unedited_point(self.context, spec, need, self._destination(spec))
        else:
            plan = ScorePlan(groups=tuple(need), score_at=tuple(missing))
            self.edit(spec.at(max(missing)), plan, store=True)
        self.computed.append({"spec": spec, "points": missing, "seconds": time.perf_counter() - t_start})
        log.info("%s %s C=%s N=%s edit sample %d: computed %s in %.1f s", spec.editor, spec.regime, spec.cov,
                 spec.n_edits, spec.edit_sample, missing, time.perf_counter() - t_start)

    def _needed(self, groups: Sequence[str], spec: ExperimentSpec) -> list[str]:
        """``groups`` less those this point cannot have (no distortion unedited, pocket-only groups)."""
        pocket = self.variant is not None
        return [g for g in groups if g in GROUPS and (g != "distortion" or (pocket and spec.editor != NONE))
                and (g != "nll" or (pocket and self.evaluation.nll_docs))]

    def table(self, specs: Iterable[ExperimentSpec] | None = None) -> pd.DataFrame:
        """All rows of this lab's store (or of ``specs``), tidy."""
        if specs is None:
            return self.store.rows.copy()
        keys = {self.key(s.at(n)) for s in specs for n in s.points}
        return self.store.rows[self.store.rows["key"].isin(keys)].reset_index(drop=True)

    def frames(self, specs: Iterable[ExperimentSpec]) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The rows of ``specs`` and their per-item scores, each item labelled with its point's
        :data:`~moir_lib.experiments.rows.POINT_COLUMNS` (what the chapters' tables and claims read), and
        both with the cell of the multi-level bootstrap (:mod:`moir_lib.evaluation.bootstrap`):
        ``organism`` (the profile's), ``sample`` (the edit sample), ``draw`` and ``cov_base`` (the C's
        draw and recipe, :func:`~moir_lib.covariance.recipes.parse_name`)."""
        rows = self.table(specs)
        points = rows[[*POINT_COLUMNS, "key"]].drop_duplicates(["key", "n_edits"])
        items = self.store.items.merge(points, on=["key", "n_edits"], how="inner")
        return with_cells(rows, self.profile.organism), with_cells(items, self.profile.organism)
