"""Run results: the ``summary.json`` every chapter writes, and its provenance.

Batch runs, tests and the book read a chapter's headline numbers from
``<out_dir>/summary.json``: ``{"chapter", "headline", "parameters", "git_hash",
"moir_version", "created"}``. Tidy tables (one row per measurement) sit beside it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from moir_lib import __version__

__all__ = ["git_hash", "write_summary", "read_summary", "SUMMARY_NAME"]

SUMMARY_NAME = "summary.json"


def git_hash(cwd: str | Path | None = None) -> str:
    """The checkout's commit (with ``-dirty`` when modified), or ``"unknown"`` outside git."""
    cwd = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def undefined_as_none(value: Any) -> Any:
    """NaN/inf (undefined metrics) -> None, recursively: JSON has no NaN and :func:`write_summary`
    refuses it."""
    if isinstance(value, dict):
        return {k: undefined_as_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [undefined_as_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    """Plain JSON types: numpy/torch scalars to Python numbers, NaN/inf refused."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"summary value {value!r} is not finite")
    if isinstance(value, Path):
        return str(value)
    return value


def write_summary(out_dir: str | Path, chapter: str, headline: dict[str, Any],
                  parameters: dict[str, Any]) -> Path:
    """Write ``<out_dir>/summary.json`` atomically and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "chapter": chapter,
        "headline": _jsonable(headline),
        "parameters": _jsonable(parameters),
        "git_hash": git_hash(),
        "moir_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    path = out / SUMMARY_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_summary(out_dir: str | Path) -> dict[str, Any]:
    """Read ``<out_dir>/summary.json``; a clear error when the run never wrote one."""
    path = Path(out_dir) / SUMMARY_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {SUMMARY_NAME} in {out_dir}: did the chapter finish?")
    return json.loads(path.read_text())
