"""Run results: the ``summary.json`` every chapter writes, its provenance, and the tidy tables
beside it — the one writer of a chapter's results (:func:`write_results`).

Batch runs, tests and the book read a chapter's headline numbers from
``<out_dir>/summary.json``: ``{"chapter", "headline", "parameters", "git_hash",
"moir_version", "created"}``, then any tables a chapter keeps in it as lists of JSON rows.
Tidy tables (one row per measurement) sit beside it as ``<name>.csv`` or ``<name>.parquet``.

While :func:`moir_lib.runs.run_notebook` executes a chapter into a run directory, the chapter's
results go to that directory's staging folder (:func:`results_dir`), and the run publishes them
beside the executed notebook once it has finished: a run killed mid-way leaves the previous run's
notebook, summary and tables as they were.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from moir_lib import __version__, timings
from moir_lib.files import atomic_write, write_json

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["git_hash", "results_dir", "write_results", "write_summary", "write_tables", "read_summary",
           "RUN_ENV", "STAGING", "SUMMARY_NAME"]

SUMMARY_NAME = "summary.json"
#: the environment variable naming the run directory a kernel's chapter is executed into (set by
#: :func:`moir_lib.runs.run_notebook` for that kernel alone)
RUN_ENV = "MOIR_RUN_DIR"
#: the folder of a run directory where a run's results wait until it has finished
STAGING = ".staging"
#: Fields of ``summary.json`` that no table added to it may take as its name.
SUMMARY_FIELDS = ("chapter", "headline", "parameters", "git_hash", "moir_version", "created", "timings")


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


def results_dir(out_dir: str | Path) -> Path:
    """Where results for ``out_dir`` are written: its :data:`STAGING` folder while this kernel's chapter is
    executed into ``out_dir`` (:data:`RUN_ENV`), published when the run finishes; ``out_dir`` otherwise."""
    out = Path(out_dir)
    running = os.environ.get(RUN_ENV)
    if running and out.resolve() == Path(running).resolve():
        return out / STAGING
    return out


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


def _json_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as a list of JSON rows: NaN as null, numpy scalars as Python numbers (inf refused)."""
    import pandas as pd

    return _jsonable(table.astype(object).where(pd.notna(table), None).to_dict("records"))


def write_summary(out_dir: str | Path, chapter: str, headline: dict[str, Any], parameters: dict[str, Any],
                  *, summary_tables: Mapping[str, pd.DataFrame] | None = None) -> Path:
    """Write ``<out_dir>/summary.json`` atomically (in its staging folder while a run executes into it:
    :func:`results_dir`) and return its path.

    ``summary_tables``: tables kept in the summary itself, each a top-level list of JSON rows (``name:
    [{column: value}, …]``, NaN as null) after the provenance fields; a name may not be one of
    :data:`SUMMARY_FIELDS`.
    """
    summary_tables = dict(summary_tables or {})
    taken = sorted(set(summary_tables) & set(SUMMARY_FIELDS))
    if taken:
        raise ValueError(f"{taken[0]!r} is a summary field, not a table name")
    out = results_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "chapter": chapter,
        "headline": _jsonable(headline),
        "parameters": _jsonable(parameters),
        "git_hash": git_hash(),
        "moir_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds"),
        "timings": timings.snapshot(),
    }
    record.update({name: _json_rows(table) for name, table in summary_tables.items()})
    path = out / SUMMARY_NAME
    return write_json(path, record, indent=2)


def write_tables(out_dir: str | Path, tables: Mapping[str, pd.DataFrame],
                 table_format: Literal["csv", "parquet"] = "csv") -> list[Path]:
    """Write each tidy table as ``<out_dir>/<name>.<table_format>`` (no index), atomically; returns
    the paths."""
    if table_format not in ("csv", "parquet"):
        raise ValueError(f"table_format must be 'csv' or 'parquet', got {table_format!r}")
    out = results_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in tables.items():
        path = out / f"{name}.{table_format}"
        if table_format == "csv":
            atomic_write(path, lambda p, t=table: t.to_csv(p, index=False))
        else:
            atomic_write(path, lambda p, t=table: t.to_parquet(p, index=False))
        paths.append(path)
    return paths


def write_results(out_dir: str | Path, chapter: str, headline: dict[str, Any], parameters: dict[str, Any],
                  *, tables: Mapping[str, pd.DataFrame] | None = None,
                  table_format: Literal["csv", "parquet"] = "csv",
                  summary_tables: Mapping[str, pd.DataFrame] | None = None) -> Path:
    """A chapter's results in ``out_dir``: the ``tables`` (:func:`write_tables`), then ``summary.json``
    (:func:`write_summary`, with ``summary_tables``) — last, because a run directory with a summary counts as
    finished (``moir grid`` resumes the others). Returns the summary's path."""
    write_tables(out_dir, tables or {}, table_format)
    return write_summary(out_dir, chapter, headline, parameters, summary_tables=summary_tables)


def read_summary(out_dir: str | Path) -> dict[str, Any]:
    """Read ``<out_dir>/summary.json``; a clear error when the run never wrote one."""
    path = Path(out_dir) / SUMMARY_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {SUMMARY_NAME} in {out_dir}: did the chapter finish?")
    return json.loads(path.read_text())
