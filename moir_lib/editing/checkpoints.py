"""Checkpoints of sequential editing: written atomically, checksummed, resumed bit-exactly.

A checkpoint is one folder ``ckpt-<n_edits>`` written under a temporary name and renamed into
place, with ``LATEST`` (naming it) replaced atomically afterwards; a kill at any moment leaves
the previous checkpoint intact. It holds ``weights.safetensors`` (the edited ``W_out`` of the
edit layers in the model's dtype: the weight delta against the original model, stored as the
exact weights so that resuming is bit-exact), ``state.safetensors`` (the edit state) and
``progress.json`` (position, milestone metrics, per-request z losses, context templates, and
a checkpoint key (stored as ``run_key``): requests, editor configuration, batch size, milestones, original
weights' digest), with ``SHA256SUMS`` of the three, checked on resume.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moir_lib.cache import sha256_file
from moir_lib.editing.base import Editor
from moir_lib.editing.snapshot import WeightSnapshot
from moir_lib.editing.state import EditState
from moir_lib.editing.templates import TemplateGroups, as_template_groups
from moir_lib.files import writing

__all__ = ["CHECKPOINT_FILES", "LATEST", "SUMS", "Progress", "resume", "write_checkpoint"]

log = logging.getLogger(__name__)

LATEST = "LATEST"
#: the files of a checkpoint folder, and the file holding their SHA-256 sums (checked on resume)
CHECKPOINT_FILES = ("weights.safetensors", "state.safetensors", "progress.json")
SUMS = "SHA256SUMS"


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


def write_checkpoint(root: Path, snapshot: WeightSnapshot, state: EditState, progress: dict[str, Any],
                      keep: int) -> Path:
    from safetensors.torch import save_file

    position = progress["position"]
    name = f"ckpt-{position:07d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with writing(final):  # a full disk or a file-size limit names the checkpoint
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
class Progress:
    """Where sequential editing stands: what a checkpoint holds besides the weights."""

    templates: TemplateGroups
    state: EditState
    position: int = 0
    milestones: list[dict[str, Any]] = field(default_factory=list)
    per_request: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None

    def to_json(self, checkpoint_key: dict[str, Any]) -> dict[str, Any]:
        return {"run_key": checkpoint_key, "position": self.position, "milestones": self.milestones,
                "per_request": self.per_request, "batches": self.batches, "templates": self.templates}


def resume(root: Path, checkpoint_key: dict[str, Any], snapshot: WeightSnapshot, editor: Editor,
            templates: Sequence[Sequence[str]] | None) -> Progress | None:
    """The progress of the latest checkpoint under ``root``, with its weights loaded into the
    (checked unedited) model; ``None`` without one. ``ValueError`` when it belongs to other edits."""
    from safetensors.torch import load_file

    found = _read_checkpoint(root)
    if found is None:
        return None
    folder, progress = found
    if progress["run_key"] != checkpoint_key:
        diff = {k: (progress["run_key"].get(k), v) for k, v in checkpoint_key.items()
                if progress["run_key"].get(k) != v}
        raise ValueError(f"checkpoint {folder} belongs to other edits (checkpoint, now): {diff}; "
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
    log.info("resuming sequential editing from %s (%d/%d edits)", folder, position, checkpoint_key["n_edits"])
    return Progress(progress["templates"], state, position, progress["milestones"], progress["per_request"],
                     progress["batches"], resumed_from=position)
