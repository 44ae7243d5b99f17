"""The lab: one model, its covariances, and running a point of an editing experiment.

A :class:`Lab` owns one model (loaded by :meth:`Lab.model` when something must be computed), its
candidate covariances ``C`` (each built by its recipe, :mod:`moir_lib.covariance.recipes`) and a
:class:`~moir_lib.experiments.store.PointStore`. Asked for a run (a ``RunSpec``) it returns the run's
tidy rows, computing only the points the store lacks: :meth:`Lab.edit` (the one editing run of the
chapters and of ``moir edit``) runs MEMIT or AlphaEdit through
:func:`~moir_lib.experiments.editrun.edit_steps`, which yields every point, and scores it there at one
level (:mod:`moir_lib.experiments.measure`), with its per-item scores. z targets are fitted once per
request set and shared by every C and both editors; after every run the edit layers are restored and
checked bit-exactly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.covariance.recipes import CovSettings
from moir_lib.experiments import measure
from moir_lib.experiments.editrun import (
    EditRun,
    EditSession,
    Point,
    ScoredPoint,
    Scorer,
    edit_steps,
    run_parameters,
)
from moir_lib.experiments.identity import editor_settings, point_key
from moir_lib.experiments.records import EditRecords
from moir_lib.experiments.rows import GROUPS, NONE, POINT_COLUMNS, empty_rows, stack_frames, with_cells
from moir_lib.experiments.specs import EDITORS, EditSettings, EvalSettings, RunSpec
from moir_lib.experiments.store import PointStore
from moir_lib.locks import Busy

if TYPE_CHECKING:
    from moir_lib.covariance import CovarianceStats
    from moir_lib.editing.snapshot import WeightSnapshot
    from moir_lib.editing.target_store import TargetStore
    from moir_lib.models import LoadedModel
    from moir_lib.profiles import Profile

log = logging.getLogger(__name__)

#: every group a point can score
ALL_GROUPS: tuple[str, ...] = ("edit", "preservation", "nll", "distortion")


class Lab:
    """One model's editing experiments with their covariances and a store of scored points.

    ``profile``: a profile name, path or :class:`~moir_lib.profiles.Profile`; ``store``: a
    :class:`PointStore` or its run directory. ``evaluation``: :class:`EvalSettings`; ``covs``:
    :class:`CovSettings` (resolved against the profile); ``editing``: :class:`EditSettings`; ``records``:
    a CounterFact file or :class:`EditRecords` (pocket profiles: the pocket CounterFact).
    """

    def __init__(self, profile: str | os.PathLike[str] | Profile, store: PointStore | str | os.PathLike[str],
                 *, evaluation: EvalSettings | None = None, covs: CovSettings | None = None,
                 editing: EditSettings | None = None,
                 records: EditRecords | str | os.PathLike[str] | None = None, device: str | None = None,
                 progress: bool = False) -> None:
        from moir_lib.profiles import Profile, load_profile

        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.store = store if isinstance(store, PointStore) else PointStore(store)
        self.store.labels = {"profile": self.profile.name, "model": self.profile.model}
        self.evaluation = evaluation or EvalSettings()
        self.editing = editing or EditSettings()
        self.device, self.progress = device, progress
        self.records = (records if isinstance(records, EditRecords)
                        else EditRecords.of(self.profile, self.evaluation, records))
        self.variant, self.suite = self.records.variant, self.records.suite
        self.covs = (covs or CovSettings()).resolved(self.profile)
        self._loaded: LoadedModel | None = None
        self._snapshot: WeightSnapshot | None = None
        self._c: dict[str, tuple[CovarianceStats, dict[str, Any]]] = {}
        self._memo: dict[Any, Any] = {}  # domain C's, editors, templates, targets, scorer, NLL documents
        self.computed: list[dict[str, Any]] = []  # what this lab computed (not read from the store)

    def describe(self) -> dict[str, Any]:
        """The lab's settings (for ``summary.json``)."""
        return {"profile": self.profile.name, "model": self.profile.model, "suite": self.suite,
                "evaluation": dataclasses.asdict(self.evaluation),
                "context_templates": {e: self.n_templates(e) for e in EDITORS},
                "seq_batch_size": self.editing.seq_batch_size, "cov_settings": dataclasses.asdict(self.covs),
                "records": self.records.describe(), "portability": self.records.given_portability,
                "memit": dataclasses.asdict(self.profile.memit),
                "alphaedit": dataclasses.asdict(self.profile.alphaedit)}

    def key(self, spec: RunSpec) -> str:
        """Fingerprint of everything that determines the rows of ``spec`` at ``spec.n_edits``."""
        return point_key(spec, self.profile, self.covs, self.records, self.evaluation, self.suite,
                         self.n_templates(spec.editor) if spec.editor != NONE else None,
                         self.editing.seq_batch_size)

    def sibling(self, store: PointStore, *, evaluation: EvalSettings, records: EditRecords) -> Lab:
        """A lab on this lab's model (once loaded), C's, editors, context templates and z targets that
        edits ``records`` and scores them with ``evaluation`` into ``store``: the selection's validation
        lab (:mod:`moir_lib.experiments.selection`). Its points have their own keys."""
        other = Lab(self.profile, store, evaluation=evaluation, covs=self.covs, editing=self.editing,
                    records=records, device=self.device, progress=self.progress)
        other._loaded, other._snapshot, other._c = self._loaded, self._snapshot, self._c
        other._memo.update({k: v for k, v in self._memo.items() if k not in ("scorer", "nll_docs")})
        return other

    def model(self) -> LoadedModel:
        """The model as it is now (loaded on first use, with a snapshot of its original edit layers)."""
        if self._loaded is None:
            from moir_lib.editing.snapshot import WeightSnapshot
            from moir_lib.models import load

            t0 = time.perf_counter()
            self._loaded = load(self.profile, device=self.device)
            self._snapshot = WeightSnapshot(self._loaded.adapter, self.profile.edit_layers)
            log.info("loaded %s in %.1f s", self.profile.model, time.perf_counter() - t0)
        return self._loaded

    def is_loaded(self) -> bool:
        return self._loaded is not None

    def unedited(self) -> LoadedModel:
        """:meth:`model`, checked to hold its original edit-layer weights (what C's, context templates and z
        targets are computed on, and where every run starts)."""
        loaded = self.model()
        if not self._snapshot.is_original():
            raise RuntimeError("the model's edit layers differ from the original weights: a run did not "
                               "restore them")
        return loaded

    def defined_covs(self, covs: Iterable[str]) -> list[str]:
        """The names in ``covs`` this lab can build (``oracle`` and ``wiki-subset`` need their corpora)."""
        out = [c for c in covs if self.covs.defines(c)]
        for c in set(covs) - set(out):
            log.info("C %s is not defined for profile %s: left out", c, self.profile.name)
        return out

    def covariance(self, name: str) -> CovarianceStats:
        """The C named ``name`` at the edit layers (:func:`moir_lib.covariance.recipes.build`, cached)."""
        if name not in self._c:
            from moir_lib.covariance import recipes

            t0 = time.perf_counter()
            pocket_component = self.variant is not None and recipes.parse_name(name) in (("wiki-subset", 0),
                                                                                          ("oracle", 0))
            components = ({f"pocket:{d}": c for d, c in self.domain_covariances().items()}
                          if pocket_component else None)
            loaded = None if name in self.covs.files else self.unedited()  # a file needs no model
            stats, info = recipes.build(name, loaded, self.profile, self.covs, components=components,
                                        progress=self.progress)
            self._c[name] = stats, {**info, "seconds": round(time.perf_counter() - t0, 2)}
            log.info("C %s: %s", name, self._c[name][1])
        return self._c[name][0]

    def cov_info(self) -> pd.DataFrame:
        """One row per C built so far: recipe, token count, build time."""
        return pd.DataFrame([{"cov": k, **{kk: (json.dumps(vv) if isinstance(vv, (dict, list)) else vv)
                                           for kk, vv in info.items()}} for k, (_, info) in self._c.items()])

    def domain_covariances(self) -> dict[str, CovarianceStats]:
        """Pocket only: ``C_d`` of every domain's training split (the oracle's components and the distortion
        probes, :func:`moir_lib.covariance.recipes.domain_covariances`)."""
        if "domains" not in self._memo:
            from moir_lib.covariance.recipes import domain_covariances

            self._memo["domains"] = domain_covariances(self.unedited(), self.profile, self.covs,
                                                       self.progress)
        return self._memo["domains"]

    def editor(self, spec: RunSpec, allow_empty: bool = False) -> Any:
        """The editor of ``spec`` (one per editor × C × λ/τ, its projectors computed once). A τ that
        leaves ``C`` no null space is refused, unless ``allow_empty`` (the points of a grid, where a τ
        selected on one C may leave another none): that AlphaEdit point edits nothing (``P = 0``, as
        its authors' code does) and its efficacy says so."""
        from moir_lib.editing.editors import make_editor

        ck = ("editor", spec.editor, spec.cov, spec.lambda_, spec.tau)
        if ck not in self._memo:
            extra = {"allow_empty": True} if spec.editor == "alphaedit" else {}
            self._memo[ck] = make_editor(spec.editor, self.profile, self.covariance(spec.cov),
                                         lambda_=spec.lambda_, tau=spec.tau, **extra)
        if spec.editor == "alphaedit" and not allow_empty:
            self._memo[ck].require_null_space()
        return self._memo[ck]

    def n_templates(self, editor: str) -> int:
        """Sampled prefixes ``editor`` averages over: the lab's ``context_templates``, else the profile's."""
        if self.editing.context_templates is not None:
            return self.editing.context_templates
        if editor not in EDITORS:
            raise ValueError(f"no context templates for editor {editor!r}: choose {', '.join(EDITORS)}")
        return getattr(self.profile, editor).context_templates  # the profile section named after it

    def templates(self, editor: str, seed: int) -> list[list[str]]:
        """The plain prompt and :meth:`n_templates` prefixes sampled from the unedited model."""
        ck = ("templates", self.n_templates(editor), seed)
        if ck not in self._memo:
            from moir_lib.editing.templates import sample_templates

            self._memo[ck] = sample_templates(self.unedited().adapter, ck[1], seed)
        return self._memo[ck]

    def target_store(self) -> TargetStore:
        """The z targets on this lab's unedited model, fitted once per request set and settings and kept in
        ``$MOIR_CACHE/targets`` (:mod:`moir_lib.editing.target_store`)."""
        if "targets" not in self._memo:
            from moir_lib.editing.target_store import TargetStore
            from moir_lib.models import model_fingerprint

            model_id = model_fingerprint(self.unedited().model, self.profile.revision)
            self._memo["targets"] = TargetStore(model_id)
        return self._memo["targets"]

    def scorer(self) -> Scorer:
        """How edits are scored, with the unedited model's fluency per record, kept across runs."""
        if "scorer" not in self._memo:
            self._memo["scorer"] = Scorer(self.evaluation, self.records.portability())
        return self._memo["scorer"]

    def edit(self, spec: RunSpec, *, groups: Sequence[str] = ("edit",), score_at: Iterable[int] | None = None,
             score_unedited: bool = False, checkpoint_dir: str | os.PathLike[str] | None = None,
             out_dir: str | os.PathLike[str] | None = None) -> EditSession:
        """The editing run ``spec`` on the first ``spec.n_edits`` records of the edit pool of ``spec.seed``,
        scored (``groups``) at every point of ``score_at`` (default: all of ``spec.points``); iterate the
        session for the scored points. The weights are restored and checked bit-exactly afterwards.
        ``score_unedited``: keep the unedited model's CounterFact scores (``session.run.pre``);
        ``checkpoint_dir``: sequential checkpoints; ``out_dir``: the CounterFact tables."""
        t_start = time.perf_counter()
        loaded = self.unedited()
        pool = self.records.pool(spec.seed)
        if spec.n_edits > len(pool):
            raise ValueError(f"{spec}: {spec.n_edits} edits requested but only {len(pool)} records are "
                             f"available")
        t0 = time.perf_counter()
        self.covariance(spec.cov)
        timings = {"covariance_s": time.perf_counter() - t0}
        editor = self.editor(spec, allow_empty=True)
        t0 = time.perf_counter()
        run = EditRun(spec, self.templates(spec.editor, spec.seed),
                      Path(out_dir) if out_dir is not None else None)
        timings["templates_s"] = time.perf_counter() - t0
        run.parameters = run_parameters(run, editor, self.profile, self._c[spec.cov][1], self.records,
                                        self.evaluation, self.device, cov_seed=self.covs.seed,
                                        batch_size=self.editing.seq_batch_size)
        wanted = set(spec.points if score_at is None else score_at)
        records = pool[:spec.n_edits]
        if "edit" in groups:  # the unedited model's fluency on every record scored later (Fluency*)
            scorer = self.scorer()
            t0 = time.perf_counter()
            scored = [r for n in sorted(wanted) for r in scorer.subset(records[:n])]
            run.pre = scorer.unedited(loaded, scored, keep=score_unedited)
            timings["evaluate_pre_s"] = time.perf_counter() - t0
            if run.pre is not None:
                run.write_table(run.pre, "counterfact_pre")

        def points() -> Iterator[ScoredPoint]:
            try:
                for step in edit_steps(loaded, editor, records, run, batch_size=self.editing.seq_batch_size,
                                       checkpoint_dir=checkpoint_dir, targets=self.target_store()):
                    if step.n_edits in wanted:
                        point = self._scored(step.records, step.n_edits, groups, run, step.edit_s)
                        step.metrics = run.points[-1].metrics() if "edit" in groups else {}
                        yield point
            finally:
                self._snapshot.restore()
            if not self._snapshot.is_original():
                raise RuntimeError("restoring the original weights failed")
            run.timings = {**timings, **run.timings, "total_s": time.perf_counter() - t_start}

        return EditSession(run, points())

    def _scored(self, records: list[Any], n: int, groups: Sequence[str], run: EditRun | None = None,
                edit_s: float | None = None) -> ScoredPoint:
        """Everything ``groups`` asks of the model as it is with ``records`` edited (the unedited model:
        the records scored): CounterFact, then :meth:`measure`, at one level."""
        t0 = time.perf_counter()
        values: dict[tuple[str, str], float] = {}
        items: list[pd.DataFrame] = []
        if "edit" in groups and records:
            result = self.scorer().score(self.model(), records)
            if run is not None:
                run.add(Point(n, result, edit_s or 0.0, time.perf_counter() - t0))
            values = measure.edit_values(result)
            items.append(measure.record_items(result, self.scorer().unedited_fluency))
        more, more_items = self.measure(records if run is not None else [], groups)
        values.update(more)
        if edit_s is not None:
            values[("cost", "edit_s")] = edit_s
        values[("cost", "eval_s")] = time.perf_counter() - t0
        return ScoredPoint(n, values, stack_frames(items + more_items))

    def measure(self, edited: Sequence[Any], groups: Sequence[str]) -> tuple[dict[tuple[str, str], float],
                                                                            list[pd.DataFrame]]:
        """The groups besides ``edit`` on the model as it is now: preservation, the pocket domains' NLL, the
        distortion (when ``edited`` is not empty)."""
        loaded = self.model()
        values: dict[tuple[str, str], float] = {}
        items: list[pd.DataFrame] = []
        if "preservation" in groups:
            more, pres = measure.preservation(loaded.model, loaded.tokenizer, self.evaluation, self.suite,
                                              self.variant, quiet=not self.progress)
            values.update(more)
            items += [pres] if pres is not None else []
        if "nll" in groups and self.variant is not None and self.evaluation.nll_docs:
            if "nll_docs" not in self._memo:
                self._memo["nll_docs"] = measure.domain_documents(loaded.tokenizer, self.evaluation.nll_docs,
                                                                  self.covs.seed)
            more, docs = measure.domain_nll(loaded.model, loaded.tokenizer, self._memo["nll_docs"])
            values.update(more)
            items += docs
        if "distortion" in groups and self.variant is not None and edited:
            values.update(measure.distortion(self._snapshot, self.domain_covariances(),
                                             self.profile.edit_layers))
        return values, items

    def run(self, spec: RunSpec, groups: Sequence[str] = ALL_GROUPS, *, wait: bool = True
            ) -> pd.DataFrame | None:
        """The rows of ``spec`` (every scored point), computing only the points the store lacks; ``None``
        (nothing done) when ``wait`` is false and another process is computing them."""
        need = self._needed(groups, spec)
        keys = {n: self.key(spec.at(n)) for n in spec.points}
        if not all(self.store.has(keys[n], n, need) for n in spec.points):
            last = max(spec.points)
            what = f"editing run {spec.editor} {spec.regime} C={spec.cov} N={last}"
            try:
                with self.store.lock(keys[last], last, what, wait=wait):
                    missing = [n for n in spec.points if not self.store.has(keys[n], n, need)]
                    if missing:
                        self._compute(spec, need, missing)
            except Busy:
                return None
        rows = pd.concat([self.store.point(keys[n], n) for n in spec.points], ignore_index=True)
        return rows[rows["group"].isin({*need, "cost"})].reset_index(drop=True)

    def is_cached(self, spec: RunSpec, groups: Sequence[str] = ("edit", "preservation")) -> bool:
        """Whether the store holds every point of ``spec`` with every group of ``groups``."""
        need = self._needed(groups, spec)
        return all(self.store.has(self.key(spec.at(n)), n, need) for n in spec.points)

    def run_all(self, specs: Iterable[RunSpec], groups: Sequence[str] = ALL_GROUPS) -> pd.DataFrame:
        """Rows of every run in ``specs`` (one table). With the machine-wide copy, a run another process is
        computing is put off rather than waited for, and read at the end: processes given overlapping lists
        (two chapters, a chapter and its helper) share the work, each run computed once."""
        specs = list(specs)
        first = [self.run(s, groups, wait=False) for s in specs]
        put_off = sum(f is None for f in first)
        if put_off:
            log.info("%d run(s) put off while another process computes them", put_off)
        frames = [f if f is not None else self.run(s, groups) for f, s in zip(first, specs, strict=True)]
        return pd.concat(frames, ignore_index=True) if frames else empty_rows()

    def _compute(self, spec: RunSpec, need: Sequence[str], missing: list[int]) -> None:
        """Score the points ``missing`` of ``spec`` (groups ``need``), storing each once it is scored."""
        t_start = time.perf_counter()
        if spec.editor == NONE:
            records = self.records.pool(spec.seed)
            self.unedited()
            self._store(spec, self._scored(records[:self.evaluation.n_eval or len(records)], 0, need))
        else:
            if "distortion" in need and self.variant is not None:
                self.domain_covariances()  # estimated on the unedited model
            for point in self.edit(spec.at(max(missing)), groups=need, score_at=missing):
                self._store(spec, point)
        self.computed.append({"spec": spec, "points": missing, "seconds": time.perf_counter() - t_start})
        log.info("%s %s C=%s N=%s seed %d: computed %s in %.1f s", spec.editor, spec.regime, spec.cov,
                 spec.n_edits, spec.seed, missing, time.perf_counter() - t_start)

    def _store(self, spec: RunSpec, point: ScoredPoint) -> None:
        """One point's rows (with their uncertainty) and items, keyed by the point, into the store."""
        key = self.key(spec.at(point.n_edits))
        self.store.put(*measure.point_rows(spec, point.n_edits, key, editor_settings(spec, self.profile),
                                           point.values, point.items))

    def _needed(self, groups: Sequence[str], spec: RunSpec) -> list[str]:
        """``groups`` less those this point cannot have (no distortion unedited, pocket-only groups)."""
        pocket = self.variant is not None
        return [g for g in groups if g in GROUPS and (g != "distortion" or (pocket and spec.editor != NONE))
                and (g != "nll" or (pocket and self.evaluation.nll_docs))]

    def table(self, specs: Iterable[RunSpec] | None = None) -> pd.DataFrame:
        """All rows of this lab's store (or of ``specs``), tidy."""
        if specs is None:
            return self.store.rows.copy()
        keys = {self.key(s.at(n)) for s in specs for n in s.points}
        return self.store.rows[self.store.rows["key"].isin(keys)].reset_index(drop=True)

    def frames(self, specs: Iterable[RunSpec]) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The rows of ``specs`` and their per-item scores, each item labelled with its point's
        :data:`~moir_lib.experiments.rows.POINT_COLUMNS` (what the chapters' tables and claims read), and
        both with the cell of the multi-level bootstrap (:mod:`moir_lib.evaluation.bootstrap`):
        ``organism`` (the profile's), ``sample`` (the edit-sample seed), ``draw`` and ``cov_base`` (the C's
        draw and recipe, :func:`~moir_lib.covariance.recipes.parse_name`)."""
        rows = self.table(specs)
        points = rows[[*POINT_COLUMNS, "key"]].drop_duplicates(["key", "n_edits"])
        items = self.store.items.merge(points, on=["key", "n_edits"], how="inner")
        return with_cells(rows, self.profile.organism), with_cells(items, self.profile.organism)
