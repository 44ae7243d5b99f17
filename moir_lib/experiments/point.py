"""One editing experiment's points, computed top to bottom: records, C, editor, edit, score, rows.

:func:`compute_experiment` is the computation behind every edited point of the chapters and of ``moir edit``
(:meth:`moir_lib.experiments.lab.Lab.edit` binds it to a lab):

1. **records** — the first ``N`` records of the spec's edit sample (:meth:`EditRecords.pool`);
2. **C and editor** — the spec's C (:mod:`moir_lib.covariance.recipes`) and its MEMIT or AlphaEdit
   editor, built once per model (:class:`~moir_lib.experiments.resources.ModelResources`);
3. **edit** — inside ``with resources.edited()``, which restores the edit layers on the way out,
   :func:`apply_edits` applies the edits (batch, or sequential milestones),
   calling back at each milestone to
4. **score** — :func:`score_point` at each scored ``N``: CounterFact (ES/PS/NS ... ``S_e``) and the
   other groups (:mod:`moir_lib.experiments.measure`: preservation, the pocket domains' NLL, distortion);
5. **rows** — :func:`~moir_lib.experiments.measure.point_rows` with their intervals and item digests,
   written to the store one point at a time (:class:`Destination`).

:func:`unedited_point` scores the unedited model (``N = 0``) along steps 1, 4 and 5.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.experiments import measure
from moir_lib.experiments.experiment import ExperimentResult, Point, ScoredPoint, Scorer
from moir_lib.experiments.rows import stack_frames

if TYPE_CHECKING:
    from moir_lib.editing.alphaedit import AlphaEditEditor
    from moir_lib.editing.memit import MemitEditor
    from moir_lib.editing.regimes import Milestone, Score
    from moir_lib.editing.values import TargetSource
    from moir_lib.experiments.records import EditRecords
    from moir_lib.experiments.resources import ModelResources
    from moir_lib.experiments.specs import EvalSettings, ExperimentSpec
    from moir_lib.experiments.store import PointStore
    from moir_lib.models import LoadedModel

    AnyEditor = MemitEditor | AlphaEditEditor

__all__ = ["Destination", "PointContext", "ScorePlan", "apply_edits", "compute_experiment", "score_point",
           "unedited_point"]


@dataclass(frozen=True)
class ScorePlan:
    """What an editing experiment scores and writes: the ``groups`` at every ``N`` of ``score_at`` (None:
    every point of the spec); ``score_unedited``: keep the unedited model's CounterFact scores
    (``experiment.pre``);
    ``checkpoint_dir``: sequential checkpoints; ``out_dir``: the CounterFact tables."""

    groups: tuple[str, ...] = ("edit",)
    score_at: tuple[int, ...] | None = None
    score_unedited: bool = False
    checkpoint_dir: Path | None = None
    out_dir: Path | None = None


@dataclass(frozen=True)
class Destination:
    """Where an experiment's scored points go: ``store``, each under its key (``keys``: ``N`` -> point key),
    with the editor's λ / τ ``settings`` in every row."""

    store: PointStore
    keys: Mapping[int, str]
    settings: Mapping[str, Any]


@dataclass
class PointContext:
    """What a lab's points are computed with: the shared ``resources`` (model, C's, editors, templates, z
    targets), the lab's ``edit_records`` and ``evaluation``, the sequential batch size, the context templates
    per editor and the seed of the C draws; built on first use, the :meth:`scorer` and the pocket domains'
    held-out documents for the NLL."""

    resources: ModelResources
    edit_records: EditRecords
    evaluation: EvalSettings
    seq_batch_size: int
    n_templates: Mapping[str, int]
    cov_seed: int
    scorer_: Scorer | None = field(default=None, init=False)
    nll_docs: dict[str, list[list[int]]] | None = field(default=None, init=False)

    def scorer(self) -> Scorer:
        """How edits are scored, with the unedited model's fluency per record, kept across runs (the
        records' portability probes are found, for the pocket by its build, on first use)."""
        if self.scorer_ is None:
            self.scorer_ = Scorer(self.evaluation, self.edit_records.portability())
        return self.scorer_


def compute_experiment(ctx: PointContext, spec: ExperimentSpec, plan: ScorePlan,
                       dest: Destination | None = None) -> ExperimentResult:
    """The editing experiment ``spec`` on the first ``spec.n_edits`` records of its edit sample, scored
    (``plan.groups``) at every point of ``plan.score_at``, each point's rows stored at ``dest`` as soon as
    it is scored; the edit layers are restored and checked bit-exactly afterwards."""
    t_start = time.perf_counter()
    res = ctx.resources
    pool = ctx.edit_records.pool(spec.edit_sample)                                        # 1. records
    if spec.n_edits > len(pool):
        raise ValueError(f"{spec}: {spec.n_edits} edits requested but only {len(pool)} records are "
                         f"available")
    records = pool[:spec.n_edits]
    t0 = time.perf_counter()
    res.covariance(spec.cov)                                                  # 2. C ...
    timings = {"covariance_s": time.perf_counter() - t0}
    editor = res.editor(spec, allow_empty=True)                               # ... and editor
    if "distortion" in plan.groups and ctx.edit_records.variant is not None:
        res.domain_covariances()  # the distortion's probes, estimated on the unedited model
    t0 = time.perf_counter()
    experiment = ExperimentResult(spec, res.templates(ctx.n_templates[spec.editor], spec.edit_sample),
                                  plan.out_dir)
    timings["templates_s"] = time.perf_counter() - t0
    experiment.parameters = experiment_parameters(ctx, experiment, editor)
    wanted = set(spec.points if plan.score_at is None else plan.score_at)
    with res.edited() as loaded:                                              # 3. edit
        if "edit" in plan.groups:  # the unedited model's fluency on every record scored later (Fluency*)
            t0 = time.perf_counter()
            scored = [r for n in sorted(wanted) for r in ctx.scorer().subset(records[:n])]
            experiment.pre = ctx.scorer().unedited(loaded, scored, keep=plan.score_unedited)
            timings["evaluate_pre_s"] = time.perf_counter() - t0
            if experiment.pre is not None:
                experiment.write_table(experiment.pre, "counterfact_pre")

        def score(step: Milestone) -> dict[str, Any]:                        # 4. score ...
            if step.n_edits not in wanted:
                return {}
            point = score_point(ctx, loaded, step.records, step.n_edits, plan.groups, experiment, step.edit_s)
            if dest is not None:                                              # 5. ... and rows
                dest.store.put(*measure.point_rows(spec, point.n_edits, dest.keys[point.n_edits],
                                                   dest.settings, point.values, point.items))
            return experiment.points[-1].metrics() if "edit" in plan.groups else {}

        apply_edits(loaded, editor, records, experiment, score=score, batch_size=ctx.seq_batch_size,
                    checkpoint_dir=plan.checkpoint_dir, targets=res.target_store())
    experiment.timings = {**timings, **experiment.timings, "total_s": time.perf_counter() - t_start}
    return experiment


def experiment_parameters(ctx: PointContext, experiment: ExperimentResult, editor: AnyEditor) -> dict[str,
                                                                                                      Any]:
    """What ``experiment`` is (``summary.json``'s parameters): the profile, the editor's configuration and
    spectrum, the C's provenance, the records, the schedule, the context templates, the evaluation."""
    spec, res, evaluation = experiment.spec, ctx.resources, ctx.evaluation
    return {"profile": res.profile.to_dict(), "editor": editor.config(), "cov": dict(res.cov_info(spec.cov)),
            "records": ctx.edit_records.source(), "portability": ctx.edit_records.portability(),
            "n_edits": spec.n_edits, "regime": spec.regime, "batch_size": ctx.seq_batch_size,
            "milestones": list(spec.milestones), "edit_sample": spec.edit_sample, "cov_seed": ctx.cov_seed,
            "device": res.device, "context_templates": len(experiment.templates[1]) if
            len(experiment.templates) > 1 else 0,
            "templates": experiment.templates, "spectrum": {str(k): v for k, v in editor.spectrum.items()},
            "projector": {str(k): v for k, v in getattr(editor, "projector_info", {}).items()},
            "fluency": evaluation.fluency, "max_gen_tokens": evaluation.max_gen_tokens,
            "evaluation": dataclasses.asdict(evaluation)}


def unedited_point(ctx: PointContext, spec: ExperimentSpec, groups: Sequence[str], dest: Destination) -> None:
    """The unedited model's point (``N = 0``): up to ``n_eval`` records of the spec's edit sample scored
    (``groups``) and stored at ``dest``."""
    records = ctx.edit_records.pool(spec.edit_sample)
    point = score_point(ctx, ctx.resources.unedited(), records[:ctx.evaluation.n_eval or len(records)], 0,
                        groups)
    dest.store.put(*measure.point_rows(spec, 0, dest.keys[0], dest.settings, point.values, point.items))


def score_point(ctx: PointContext, loaded: LoadedModel, records: list[Any], n: int, groups: Sequence[str],
                experiment: ExperimentResult | None = None, edit_s: float | None = None) -> ScoredPoint:
    """Everything ``groups`` asks of the model as it is with ``records`` edited, ``n`` of them (``experiment``
    None: the unedited model, ``n`` 0, ``records`` the ones scored), at one level: CounterFact
    (``edit``), preservation, the pocket domains' NLL, the distortion (edited points only), the costs."""
    t0 = time.perf_counter()
    values: dict[tuple[str, str], float] = {}
    items: list[pd.DataFrame] = []
    if "edit" in groups and records:
        result = ctx.scorer().score(loaded, records)
        if experiment is not None:
            experiment.add(Point(n, result, edit_s or 0.0, time.perf_counter() - t0))
        values = measure.edit_values(result)
        items.append(measure.record_items(result, ctx.scorer().unedited_fluency))
    variant = ctx.edit_records.variant
    if "preservation" in groups:
        more, pres = measure.preservation(loaded.model, loaded.tokenizer, ctx.evaluation,
                                          ctx.edit_records.suite,
                                          variant, quiet=not ctx.resources.progress)
        values.update(more)
        items += [pres] if pres is not None else []
    if "nll" in groups and variant is not None and ctx.evaluation.nll_docs:
        if ctx.nll_docs is None:
            ctx.nll_docs = measure.domain_documents(loaded.tokenizer, ctx.evaluation.nll_docs, ctx.cov_seed,
                                                     variant)
        more, docs = measure.domain_nll(loaded.model, loaded.tokenizer, ctx.nll_docs)
        values.update(more)
        items += docs
    if "distortion" in groups and variant is not None and experiment is not None and records:
        values.update(measure.distortion(ctx.resources.snapshot, ctx.resources.domain_covariances(),
                                         ctx.resources.profile.edit_layers))
    if edit_s is not None:
        values[("cost", "edit_s")] = edit_s
    values[("cost", "eval_s")] = time.perf_counter() - t0
    return ScoredPoint(n, values, stack_frames(items))


def apply_edits(loaded: LoadedModel, editor: AnyEditor, records: Sequence[Any],
                experiment: ExperimentResult, *,
                score: Score, batch_size: int = 1, checkpoint_dir: str | os.PathLike[str] | None = None,
                targets: TargetSource | None = None) -> None:
    """Edit ``records`` (``experiment.spec.n_edits`` of them, in edit order) with ``editor`` in
    ``experiment.spec.regime``, calling ``score`` at every point of ``experiment.spec.points`` (batch: one, at
    N) with the
    :class:`~moir_lib.editing.regimes.Milestone` reached: it scores the model as it is then and returns the
    milestone's metrics. The model is left edited (``WeightSnapshot.restore`` undoes it); ``experiment``
    receives the z statistics, the milestones, ``‖ΔW‖_F`` per layer and the timings.

    ``batch_size``: edits per sequential batch; ``checkpoint_dir``: sequential checkpoints, resumed from
    when present; ``targets``: what fits z on the unedited model, in the batch regime and for the first
    sequential batch (a :class:`~moir_lib.editing.target_store.TargetStore` serves the targets shared by
    every C, editor and chapter; default: fit them).
    """
    from moir_lib.editing.regimes import EditSetup, Milestone, SequentialSchedule, batch, sequential_edits
    from moir_lib.editing.values import compute_targets

    targets = compute_targets if targets is None else targets  # (a TargetStore's len may be 0: no `or`)
    records = list(records)
    spec = experiment.spec
    if len(records) != spec.n_edits:
        raise ValueError(f"{spec}: {spec.n_edits} edits but {len(records)} records were given")
    if spec.regime == "batch":
        t0 = time.perf_counter()
        result = batch(loaded, editor, records, EditSetup(experiment.templates, spec.edit_sample, targets))
        experiment.timings.update({f"edit_{k}": v for k, v in result.outcome.timings.items()})
        experiment.edit = result.outcome.summary()
        experiment.per_request = result.outcome.per_request()
        score(Milestone(len(records), records, time.perf_counter() - t0))
        snapshot = result.snapshot
    else:
        done = sequential_edits(loaded, editor, records, SequentialSchedule(batch_size, spec.milestones),
                                EditSetup(experiment.templates, spec.edit_sample, targets), score=score,
                                checkpoint_dir=checkpoint_dir)
        experiment.milestones = done.metrics()
        experiment.resumed_from = done.resumed_from
        experiment.per_request = done.per_request
        experiment.timings.update({f"sequential_{k}": v for k, v in done.timings.items()})
        snapshot = done.snapshot
    experiment.weight_change = snapshot.change_norms()
