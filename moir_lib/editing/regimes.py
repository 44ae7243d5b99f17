"""The two editing regimes of appendix C.1: batch and sequential.

* :func:`batch` — N edits applied jointly in one call of the editor (``K_past = 0``).
* :func:`sequential_edits` — edits applied in batches of ``batch_size`` (:class:`SequentialSchedule`),
  the weights and the :class:`~moir_lib.editing.state.EditState` (``K_past K_pastᵀ``, ``P``) persisting
  from one batch to the next. At each milestone (cumulative edit counts, default 10, 50, 100, 200, 500,
  1000, …, plus the final count) it calls ``score(milestone)``, which scores the model as it is then
  and returns the metrics kept for that milestone; a checkpoint is then written
  (:mod:`moir_lib.editing.checkpoints`). Editing again with the same ``checkpoint_dir`` resumes from its
  latest checkpoint and gives the same results as uninterrupted editing (same weights, same metrics).
  :func:`sequential` runs it to the end with an ``evaluate`` function.

Edits change the model in place. :class:`~moir_lib.editing.snapshot.WeightSnapshot` keeps the original
``W_out`` of the edit layers, so ``restore()`` brings the model back bit-exactly (both regimes return
their snapshot).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moir_lib.editing.alphaedit import AlphaEditEditor
from moir_lib.editing.base import Editor, EditOutcome, as_adapter
from moir_lib.editing.checkpoints import Progress, resume, write_checkpoint
from moir_lib.editing.memit import MemitEditor
from moir_lib.editing.requests import normalise_requests
from moir_lib.editing.snapshot import WeightSnapshot
from moir_lib.editing.state import EditState
from moir_lib.editing.templates import TemplateGroups, as_template_groups, context_templates
from moir_lib.editing.values import TargetSource, compute_targets

__all__ = [
    "DEFAULT_MILESTONES",
    "BatchResult",
    "EditSetup",
    "Milestone",
    "Score",
    "SequentialResult",
    "SequentialSchedule",
    "batch",
    "sequential",
    "sequential_edits",
]

log = logging.getLogger(__name__)

DEFAULT_MILESTONES: tuple[int, ...] = (10, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000)

#: ``evaluate(model, tokenizer, records) -> {metric: value}``, e.g.
#: ``moir_lib.evaluation.counterfact.evaluate_counterfact`` (wrapped with ``functools.partial``).
Evaluate = Callable[[Any, Any, list[Any]], dict[str, Any]]


@dataclass(frozen=True)
class EditSetup:
    """What a regime fits every edit with besides the editor and the requests: the context ``templates``
    (template groups; default: ROME's set sampled with ``seed``) and ``targets``, what fits z (a
    :class:`~moir_lib.editing.target_store.TargetStore` shares them across C's, editors and regimes)."""

    templates: Sequence[Sequence[str]] | None = None
    seed: int = 0
    targets: TargetSource = compute_targets


def _templates(adapter: Any, setup: EditSetup) -> TemplateGroups:
    """The given template groups (checked), or ROME's default set sampled with the seed."""
    if setup.templates is not None:
        return as_template_groups(setup.templates)
    return context_templates(adapter, seed=setup.seed)


# ----------------------------------------------------------------------------- batch


@dataclass
class BatchResult:
    n_edits: int
    outcome: EditOutcome = field(repr=False)
    state: EditState = field(repr=False)
    snapshot: WeightSnapshot = field(repr=False)
    metrics: dict[str, Any]
    timings: dict[str, float]
    templates: TemplateGroups

    def summary(self) -> dict[str, Any]:
        return {"regime": "batch", "n_edits": self.n_edits, "metrics": self.metrics, "timings": self.timings,
                "edit": self.outcome.summary(), "weight_change": self.snapshot.change_norms(),
                "templates": self.templates}


def _validate_count(n_edits: int | None, available: int) -> int:
    n = available if n_edits is None else n_edits
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_edits must be a positive integer, got {n_edits!r}")
    if n > available:
        raise ValueError(f"n_edits = {n} but only {available} requests were given")
    return n


def batch(model: Any, editor: MemitEditor | AlphaEditEditor, requests: Sequence[Any],
          setup: EditSetup = EditSetup(), *, n_edits: int | None = None, evaluate: Evaluate | None = None,
          keep_deltas: bool = False) -> BatchResult:
    """Apply the first ``n_edits`` requests jointly (templates and z targets of ``setup``); then
    ``evaluate(model, tokenizer, records)``.

    The model is edited in place; ``result.snapshot.restore()`` undoes it bit-exactly.
    """
    adapter = as_adapter(model)
    records = list(requests)
    n = _validate_count(n_edits, len(records))
    records = records[:n]
    normalise_requests(records)  # refuse bad requests before any model work
    editor.check_model(adapter)
    t0 = time.perf_counter()
    templates = _templates(adapter, setup)
    t1 = time.perf_counter()
    snapshot = WeightSnapshot(adapter, editor.layers)
    state = editor.new_state()
    outcome = editor.apply(adapter, records, state, templates, keep_deltas=keep_deltas, targets=setup.targets)
    t2 = time.perf_counter()
    metrics = dict(evaluate(adapter.model, adapter.tokenizer, records)) if evaluate is not None else {}
    t3 = time.perf_counter()
    timings = {"templates_s": t1 - t0, "edit_s": t2 - t1, "evaluate_s": t3 - t2, **outcome.timings}
    return BatchResult(n, outcome, state, snapshot, metrics, timings, templates)



# ----------------------------------------------------------------------------- sequential


@dataclass
class SequentialResult:
    """``milestones``: one dict per milestone, ``{"n_edits", **metrics}`` (timings under
    ``"timings"``). ``per_request``: the z optimisation's per-request rows of every batch."""

    n_edits: int
    milestones: list[dict[str, Any]]
    state: EditState = field(repr=False)
    snapshot: WeightSnapshot = field(repr=False)
    per_request: list[dict[str, Any]] = field(repr=False)
    batches: list[dict[str, Any]] = field(repr=False)
    templates: TemplateGroups
    timings: dict[str, float]
    resumed_from: int | None = None

    def metrics(self) -> list[dict[str, Any]]:
        """The milestone metrics without timings (what must match across a resume)."""
        return [{k: v for k, v in m.items() if k != "timings"} for m in self.milestones]

    def summary(self) -> dict[str, Any]:
        return {"regime": "sequential", "n_edits": self.n_edits, "milestones": self.milestones,
                "timings": self.timings, "resumed_from": self.resumed_from, "n_batches": self.state.n_batches,
                "weight_change": self.snapshot.change_norms(), "templates": self.templates}


@dataclass(frozen=True)
class SequentialSchedule:
    """How the sequential regime cuts its edits (appendix C.1): ``batch_size`` edits per batch, the cumulative
    edit counts ``milestones`` scored (each falls on a batch boundary; the final count is one too), of the
    first ``n_edits`` requests (default: all)."""

    batch_size: int = 1
    milestones: Sequence[int] = DEFAULT_MILESTONES
    n_edits: int | None = None


def _milestones(milestones: Sequence[int], n: int) -> list[int]:
    ms = list(milestones)
    for m in ms:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"milestones must be positive integers, got {m!r}")
    if any(b <= a for a, b in zip(ms, ms[1:], strict=False)):
        raise ValueError(f"milestones must be strictly increasing, got {ms}")
    kept = [m for m in ms if m < n]
    return [*kept, n]


def _requests_digest(records: Sequence[Any]) -> str:
    from moir_lib.cache import fingerprint

    rows = [[r.case_id, r.prompt, r.subject, r.target_new] for r in normalise_requests(records)]
    return fingerprint(rows, 32)


def _edit_batch(editor: Editor, adapter: Any, records: Sequence[Any], progress: Progress,
                size: int, targets: TargetSource = compute_targets) -> None:
    """Apply the next ``size`` records on top of the edits so far, their z fitted by ``targets``;
    record their rows."""
    outcome = editor.apply(adapter, records[progress.position: progress.position + size], progress.state,
                           progress.templates,
                           targets=targets)
    rows = outcome.per_request()
    for row in rows:
        row["batch"] = progress.state.n_batches - 1
    progress.per_request.extend(rows)
    progress.batches.append({"batch": progress.state.n_batches - 1, "start": progress.position, "size": size,
                        **outcome.summary()})
    progress.position += size


@dataclass(frozen=True)
class Milestone:
    """One milestone of the sequential regime: ``n_edits`` edits applied (the first ``n_edits`` of
    ``records``), ``edit_s`` editing seconds since the previous milestone."""

    n_edits: int
    records: list[Any]
    edit_s: float


#: What scores a milestone: the metrics kept in the milestones and its checkpoint.
Score = Callable[[Milestone], Mapping[str, Any]]


def sequential_edits(model: Any, editor: MemitEditor | AlphaEditEditor, requests: Sequence[Any],
                     schedule: SequentialSchedule = SequentialSchedule(), setup: EditSetup = EditSetup(), *,
                     score: Score | None = None, checkpoint_dir: str | os.PathLike[str] | None = None,
                     keep_checkpoints: int = 1) -> SequentialResult:
    """Edit ``requests[:n_edits]`` in batches of ``batch_size`` (``schedule``) with persistent weights and
    state, calling ``score`` at each :class:`Milestone` (None: no metrics).

    Batches are cut so that every milestone falls on a batch boundary. After each milestone (once
    ``score`` has scored it) a checkpoint is written with ``checkpoint_dir`` (the latest ``keep_checkpoints``
    kept); a later call with the same arguments and ``checkpoint_dir`` resumes from the latest checkpoint
    (the model must be the *unedited* original: it is checked) and scores the milestones after it.
    ``setup``'s templates serve every batch; its ``targets`` fits z for the first batch,
    on the weights as given (a :class:`~moir_lib.editing.target_store.TargetStore` of the unedited model
    shares them with every C and the batch regime); later batches fit theirs on the edited model.
    Arguments are checked before any edit.
    """
    adapter = as_adapter(model)
    records = list(requests)
    n = _validate_count(schedule.n_edits, len(records))
    records = records[:n]
    batch_size, seed = schedule.batch_size, setup.seed
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    marks = _milestones(schedule.milestones, n)
    if keep_checkpoints < 1:
        raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
    editor.check_model(adapter)
    snapshot = WeightSnapshot(adapter, editor.layers)
    checkpoint_key = {"requests": _requests_digest(records),
                      "editor": json.loads(json.dumps(editor.config())),
               "batch_size": batch_size, "milestones": marks, "n_edits": n, "seed": seed,
               "original_weights": snapshot.digest()}
    root = Path(checkpoint_dir) if checkpoint_dir is not None else None
    progress = resume(root, checkpoint_key, snapshot, editor, setup.templates) if root is not None else None
    if progress is None:
        normalise_requests(records)
        progress = Progress(_templates(adapter, setup), editor.new_state())

    t_start = time.perf_counter()
    t_edit = t_eval = 0.0
    since = 0.0
    while progress.position < n:
        nxt = next(m for m in marks if m > progress.position)
        t0 = time.perf_counter()
        _edit_batch(editor, adapter, records, progress, min(batch_size, nxt - progress.position),
                    setup.targets if progress.position == 0 else compute_targets)
        dt = time.perf_counter() - t0
        t_edit, since = t_edit + dt, since + dt
        if progress.position == nxt:
            t0 = time.perf_counter()
            milestone = Milestone(progress.position, records[:progress.position], since)
            metrics = dict(score(milestone)) if score else {}
            dt = time.perf_counter() - t0
            t_eval, since = t_eval + dt, 0.0
            progress.milestones.append({"n_edits": progress.position, **metrics,
                                   "timings": {"evaluate_s": dt, "edit_s_so_far": t_edit}})
            log.info("milestone %d/%d: %s", progress.position, n,
                     {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
            if root is not None:
                write_checkpoint(root, snapshot, progress.state, progress.to_json(checkpoint_key),
                                 keep_checkpoints)
    timings = {"edit_s": t_edit, "evaluate_s": t_eval, "total_s": time.perf_counter() - t_start}
    return SequentialResult(n, progress.milestones, progress.state, snapshot, progress.per_request,
                            progress.batches,
                            progress.templates, timings, progress.resumed_from)


def sequential(model: Any, editor: MemitEditor | AlphaEditEditor, requests: Sequence[Any], *,
               evaluate: Evaluate | None = None, **options: Any) -> SequentialResult:
    """:func:`sequential_edits` with ``evaluate(model, tokenizer, records_so_far)`` scoring each milestone
    (``options``: :func:`sequential_edits`' other arguments, by name)."""
    import torch

    adapter = as_adapter(model)

    def score(milestone: Milestone) -> dict[str, Any]:
        with torch.no_grad():
            return dict(evaluate(adapter.model, adapter.tokenizer, milestone.records))

    return sequential_edits(adapter, editor, requests, score=score if evaluate is not None else None,
                            **options)
