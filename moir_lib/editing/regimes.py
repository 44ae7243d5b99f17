"""The two editing regimes of appendix C.1: batch and sequential.

* :func:`batch` — N edits applied jointly in one call of the editor (``K_past = 0``).
* :func:`sequential` — edits applied in batches of ``batch_size``, the weights and the
  :class:`~moir_lib.editing.state.EditState` (``K_past K_pastᵀ``, ``P``) persisting from one
  batch to the next; at each milestone (cumulative edit counts, default 10, 50, 100, 200, 500,
  1000, …, plus the final count) the ``evaluate`` callback scores all edits so far and a
  checkpoint is written. A run with the same ``checkpoint_dir`` resumes from its latest
  checkpoint and gives the same results as an uninterrupted run (same weights, same metrics).

Edits change the model in place. :class:`WeightSnapshot` keeps the original ``W_out`` of the
edit layers, so :meth:`WeightSnapshot.restore` brings the model back bit-exactly (both regimes
return their snapshot).

A checkpoint is one folder ``ckpt-<n_edits>`` written under a temporary name and renamed into
place, with ``LATEST`` (naming it) replaced atomically afterwards; a kill at any moment leaves
the previous checkpoint intact. It holds ``weights.safetensors`` (the edited ``W_out`` of the
edit layers in the model's dtype: the weight delta against the original model, stored as the
exact weights so that resuming is bit-exact), ``state.safetensors`` (the edit state) and
``progress.json`` (position, milestone metrics, per-request z losses, context templates, and
a run key: requests, editor configuration, batch size, milestones, original weights' digest).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moir_lib.cache import sha256_file
from moir_lib.editing.alphaedit import AlphaEditEditor
from moir_lib.editing.base import Editor, EditOutcome, as_adapter
from moir_lib.editing.memit import MemitEditor
from moir_lib.editing.requests import normalise_requests
from moir_lib.editing.state import EditState
from moir_lib.editing.templates import TemplateGroups, as_template_groups, context_templates
from moir_lib.editing.values import TargetSource, compute_targets

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Float64

    from moir_lib.editing.base import CovarianceSource


__all__ = [
    "DEFAULT_MILESTONES",
    "BatchResult",
    "SequentialResult",
    "WeightSnapshot",
    "batch",
    "make_editor",
    "sequential",
]

log = logging.getLogger(__name__)

DEFAULT_MILESTONES: tuple[int, ...] = (10, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000)

#: ``evaluate(model, tokenizer, records) -> {metric: value}``, e.g.
#: ``moir_lib.evaluation.counterfact.evaluate_counterfact`` (wrapped with ``functools.partial``).
Evaluate = Callable[[Any, Any, list[Any]], dict[str, Any]]

LATEST = "LATEST"
#: the files of a checkpoint folder, and the file holding their SHA-256 sums (checked on resume)
CHECKPOINT_FILES = ("weights.safetensors", "state.safetensors", "progress.json")
SUMS = "SHA256SUMS"


def make_editor(editor: str, profile: Any, cov: CovarianceSource, *, lambda_: float | None = None,
                lambda_mode: str | None = None, tau: float | None = None, tau_mode: str | None = None,
                **kwargs: Any) -> MemitEditor | AlphaEditEditor:
    """``MemitEditor``/``AlphaEditEditor`` from a profile, with command-line style overrides."""
    if editor == "memit":
        over = {k: v for k, v in {"lambda_": lambda_, "lambda_mode": lambda_mode}.items() if v is not None}
        return MemitEditor.from_profile(profile, cov, **over, **kwargs)
    if editor == "alphaedit":
        over = {k: v for k, v in {"tau": tau, "tau_mode": tau_mode}.items() if v is not None}
        return AlphaEditEditor.from_profile(profile, cov, **over, **kwargs)
    raise ValueError(f"unknown editor {editor!r}: choose 'memit' or 'alphaedit'")


def _templates(adapter: Any, templates: Sequence[Sequence[str]] | None, seed: int) -> TemplateGroups:
    """The given template groups (checked), or ROME's default set sampled with ``seed``."""
    return as_template_groups(templates) if templates is not None else context_templates(adapter, seed=seed)


# ----------------------------------------------------------------------------- weights


class WeightSnapshot:
    """The original ``W_out`` of ``layers``, cloned before any edit (model dtype and device)."""

    def __init__(self, model: Any, layers: Sequence[int]) -> None:
        self.adapter = as_adapter(model)
        self.layers = self.adapter.check_layers(layers)
        self.original = {layer: self.adapter.weight_of(layer).detach().clone() for layer in self.layers}

    def restore(self) -> None:
        """Copy the original weights back: afterwards ``torch.equal`` holds with the unedited model."""
        import torch

        with torch.no_grad():
            for layer, w in self.original.items():
                self.adapter.weight_of(layer).copy_(w)

    def is_original(self) -> bool:
        import torch

        return all(torch.equal(self.adapter.weight_of(layer).detach(), w)
                   for layer, w in self.original.items())

    def delta(self, layer: int) -> Float64[torch.Tensor, "d_out d_in"]:
        """``W − W_0`` of ``layer`` in float64."""
        import torch

        current = self.adapter.weight_of(layer).detach().to(torch.float64)
        return current - self.original[layer].to(torch.float64)

    def current(self) -> dict[int, Float[torch.Tensor, "d_out d_in"]]:
        """The current (edited) weights, contiguous CPU copies."""
        return {layer: self.adapter.weight_of(layer).detach().cpu().contiguous() for layer in self.layers}

    def load(self, weights: dict[int, Float[torch.Tensor, "d_out d_in"]]) -> None:
        """Set the edit layers' weights (e.g. from a checkpoint), exactly."""
        import torch

        with torch.no_grad():
            for layer in self.layers:
                target = self.adapter.weight_of(layer)
                w = weights[layer]
                if tuple(w.shape) != tuple(target.shape) or w.dtype != target.dtype:
                    raise ValueError(f"checkpoint weights of layer {layer} are {tuple(w.shape)} {w.dtype}, "
                                     f"the model's {tuple(target.shape)} {target.dtype}")
                target.copy_(w)

    def digest(self) -> str:
        """SHA-256 of the original weights' bytes (identifies the model a checkpoint belongs to)."""
        import torch

        h = hashlib.sha256()
        for layer, w in self.original.items():
            h.update(f"{layer}:{w.dtype}:{tuple(w.shape)}".encode())
            h.update(w.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:32]

    def change_norms(self) -> dict[int, float]:
        """``‖W − W_0‖_F`` per layer."""
        import torch

        return {layer: float(torch.linalg.norm(self.delta(layer))) for layer in self.layers}


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


def batch(model: Any, editor: MemitEditor | AlphaEditEditor, requests: Sequence[Any], *,
          n_edits: int | None = None, evaluate: Evaluate | None = None,
          templates: Sequence[Sequence[str]] | None = None, seed: int = 0, keep_deltas: bool = False,
          targets: TargetSource = compute_targets) -> BatchResult:
    """Apply the first ``n_edits`` requests jointly; then ``evaluate(model, tokenizer, records)``.
    ``targets``: what fits z (a :class:`~moir_lib.editing.target_store.TargetStore` shares them).

    The model is edited in place; ``result.snapshot.restore()`` undoes it bit-exactly.
    """
    adapter = as_adapter(model)
    records = list(requests)
    n = _validate_count(n_edits, len(records))
    records = records[:n]
    normalise_requests(records)  # refuse bad requests before any model work
    editor.check_model(adapter)
    t0 = time.perf_counter()
    templates = _templates(adapter, templates, seed)
    t1 = time.perf_counter()
    snapshot = WeightSnapshot(adapter, editor.layers)
    state = editor.new_state()
    outcome = editor.apply(adapter, records, state, templates, keep_deltas=keep_deltas, targets=targets)
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_checkpoint(root: Path, snapshot: WeightSnapshot, state: EditState, progress: dict[str, Any],
                      keep: int) -> Path:
    from safetensors.torch import save_file

    position = progress["position"]
    name = f"ckpt-{position:07d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {f"weight.{layer}": w for layer, w in snapshot.current().items()}
    save_file(weights, str(tmp / "weights.safetensors"))
    state.save(tmp / "state.safetensors")
    (tmp / "progress.json").write_text(json.dumps(progress, indent=1, default=str))
    (tmp / SUMS).write_text("".join(f"{sha256_file(tmp / f)}  {f}\n" for f in CHECKPOINT_FILES))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    latest_tmp = root / f".{LATEST}.tmp-{os.getpid()}"
    latest_tmp.write_text(name + "\n")
    with open(latest_tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(latest_tmp, root / LATEST)
    _fsync_dir(root)
    olds = sorted(p for p in root.glob("ckpt-*") if p.is_dir() and p.name != name)
    for old in olds[: max(0, len(olds) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s written (%d edits)", final, position)
    return final


def _verify_checkpoint(folder: Path, root: Path) -> None:
    """``ValueError`` naming ``folder`` when a file is missing or differs from the SHA-256 recorded
    when it was written (a checkpoint of an older version, without sums, is resumed with a warning)."""
    what_to_do = (f"delete {folder} and write the name of an earlier ckpt-* folder to {root / LATEST}, "
                  f"or remove {root} to start over")
    sums_path = folder / SUMS
    if not sums_path.is_file():
        log.warning("checkpoint %s has no %s (written by an older version): resumed unverified", folder, SUMS)
        return
    recorded = dict(reversed(line.split(maxsplit=1)) for line in sums_path.read_text().splitlines() if line)
    for name in CHECKPOINT_FILES:
        path = folder / name
        if not path.is_file():
            raise ValueError(f"checkpoint {folder} is incomplete (no {name}): {what_to_do}")
        if recorded.get(name) != sha256_file(path):
            raise ValueError(f"checkpoint {folder} is damaged ({name}: SHA-256 mismatch): {what_to_do}")


def _read_checkpoint(root: Path) -> tuple[Path, dict[str, Any]] | None:
    latest = root / LATEST
    if not latest.is_file():
        return None
    folder = root / latest.read_text().strip()
    progress_path = folder / "progress.json"
    if not progress_path.is_file():
        raise ValueError(f"checkpoint {folder} named by {latest} is incomplete (no progress.json); "
                         f"remove {root} to start over")
    _verify_checkpoint(folder, root)
    try:
        return folder, json.loads(progress_path.read_text())
    except ValueError as exc:
        raise ValueError(f"checkpoint {folder} is damaged (progress.json: {exc}): remove {root} to start "
                         f"over") from None


@dataclass
class _Progress:
    """Where a sequential run stands: what a checkpoint holds besides the weights."""

    templates: TemplateGroups
    state: EditState
    position: int = 0
    milestones: list[dict[str, Any]] = field(default_factory=list)
    per_request: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None

    def to_json(self, run_key: dict[str, Any]) -> dict[str, Any]:
        return {"run_key": run_key, "position": self.position, "milestones": self.milestones,
                "per_request": self.per_request, "batches": self.batches, "templates": self.templates}


def _resume(root: Path, run_key: dict[str, Any], snapshot: WeightSnapshot, editor: Editor,
            templates: Sequence[Sequence[str]] | None) -> _Progress | None:
    """The progress of the latest checkpoint under ``root``, with its weights loaded into the
    (checked unedited) model; ``None`` without one. ``ValueError`` when it belongs to another run."""
    from safetensors.torch import load_file

    found = _read_checkpoint(root)
    if found is None:
        return None
    folder, progress = found
    if progress["run_key"] != run_key:
        diff = {k: (progress["run_key"].get(k), v) for k, v in run_key.items()
                if progress["run_key"].get(k) != v}
        raise ValueError(f"checkpoint {folder} belongs to another run (checkpoint, now): {diff}; "
                         f"use another checkpoint_dir or remove {root}")
    if not snapshot.is_original():
        raise ValueError("resuming needs the unedited model, but its edit-layer weights were already "
                         "changed")
    if templates is not None and as_template_groups(templates) != progress["templates"]:
        raise ValueError("the given context templates differ from the checkpoint's")
    try:
        weights = load_file(str(folder / "weights.safetensors"))
        snapshot.load({layer: weights[f"weight.{layer}"].to(snapshot.original[layer].device)
                       for layer in snapshot.layers})
        state = EditState.load(folder / "state.safetensors")
    except Exception as exc:  # noqa: BLE001 - unreadable content of an unverified (older) checkpoint
        raise ValueError(f"checkpoint {folder} is damaged ({type(exc).__name__}: {exc}): remove {root} to "
                         f"start over") from None
    state.check_compatible(editor)
    position = int(progress["position"])
    log.info("resuming sequential editing from %s (%d/%d edits)", folder, position, run_key["n_edits"])
    return _Progress(progress["templates"], state, position, progress["milestones"], progress["per_request"],
                     progress["batches"], resumed_from=position)


def _edit_batch(editor: Editor, adapter: Any, records: Sequence[Any], run: _Progress,
                size: int, targets: TargetSource = compute_targets) -> None:
    """Apply the next ``size`` records on top of the edits so far, their z fitted by ``targets``;
    record their rows."""
    outcome = editor.apply(adapter, records[run.position: run.position + size], run.state, run.templates,
                           targets=targets)
    rows = outcome.per_request()
    for row in rows:
        row["batch"] = run.state.n_batches - 1
    run.per_request.extend(rows)
    run.batches.append({"batch": run.state.n_batches - 1, "start": run.position, "size": size,
                        **outcome.summary()})
    run.position += size


def _score_milestone(adapter: Any, evaluate: Evaluate | None, records: Sequence[Any], run: _Progress,
                     edit_s: float, n: int) -> float:
    """``evaluate`` on every record edited so far, appended to ``run.milestones``; returns its seconds."""
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        metrics = dict(evaluate(adapter.model, adapter.tokenizer, records[:run.position])) if evaluate else {}
    dt = time.perf_counter() - t0
    timings = {"evaluate_s": dt, "edit_s_so_far": edit_s}
    run.milestones.append({"n_edits": run.position, **metrics, "timings": timings})
    log.info("milestone %d/%d: %s", run.position, n, {k: v for k, v in metrics.items()
                                                      if isinstance(v, (int, float))})
    return dt


def sequential(model: Any, editor: MemitEditor | AlphaEditEditor, requests: Sequence[Any], *,
               batch_size: int = 1, milestones: Sequence[int] = DEFAULT_MILESTONES,
               evaluate: Evaluate | None = None, checkpoint_dir: str | os.PathLike[str] | None = None,
               n_edits: int | None = None, templates: Sequence[Sequence[str]] | None = None, seed: int = 0,
               keep_checkpoints: int = 1, targets: TargetSource = compute_targets) -> SequentialResult:
    """Edit ``requests[:n_edits]`` in batches of ``batch_size`` with persistent weights and state.

    Batches are cut so that every milestone falls on a batch boundary. At each milestone
    ``evaluate(model, tokenizer, records_so_far)`` runs and (with ``checkpoint_dir``) a
    checkpoint is written; a later call with the same arguments and ``checkpoint_dir`` resumes
    from the latest checkpoint (the model must be the *unedited* original: it is checked).
    ``targets`` fits z for the first batch, on the weights as given (a
    :class:`~moir_lib.editing.target_store.TargetStore` of the unedited model shares them with every C
    and the batch regime); later batches fit theirs on the edited model.
    """
    adapter = as_adapter(model)
    records = list(requests)
    n = _validate_count(n_edits, len(records))
    records = records[:n]
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    marks = _milestones(milestones, n)
    if keep_checkpoints < 1:
        raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
    editor.check_model(adapter)
    snapshot = WeightSnapshot(adapter, editor.layers)
    run_key = {"requests": _requests_digest(records), "editor": json.loads(json.dumps(editor.config())),
               "batch_size": batch_size, "milestones": marks, "n_edits": n, "seed": seed,
               "original_weights": snapshot.digest()}
    root = Path(checkpoint_dir) if checkpoint_dir is not None else None
    t_start = time.perf_counter()
    run = _resume(root, run_key, snapshot, editor, templates) if root is not None else None
    if run is None:
        normalise_requests(records)
        run = _Progress(_templates(adapter, templates, seed), editor.new_state())
    t_edit = t_eval = 0.0
    while run.position < n:
        nxt = next(m for m in marks if m > run.position)
        t0 = time.perf_counter()
        _edit_batch(editor, adapter, records, run, min(batch_size, nxt - run.position),
                    targets if run.position == 0 else compute_targets)
        t_edit += time.perf_counter() - t0
        if run.position == nxt:
            t_eval += _score_milestone(adapter, evaluate, records, run, t_edit, n)
            if root is not None:
                _write_checkpoint(root, snapshot, run.state, run.to_json(run_key), keep_checkpoints)
    timings = {"edit_s": t_edit, "evaluate_s": t_eval, "total_s": time.perf_counter() - t_start}
    return SequentialResult(n, run.milestones, run.state, snapshot, run.per_request, run.batches,
                            run.templates, timings, run.resumed_from)
