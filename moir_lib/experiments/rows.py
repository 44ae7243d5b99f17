"""Tidy result rows (:data:`ROW_COLUMNS`) and the results table on disk.

One row per ``profile × model × editor × regime × C × N × seed × metric``, with the metric's
``group`` (``edit``, ``preservation``, ``nll``, ``distortion``, ``cost``) and a ``key``: the
fingerprint of everything that determines the value (the profile's content, the editor settings,
the C's recipe, the records, the evaluation settings; :meth:`~moir_lib.experiments.lab.Lab.key`).
The pre-edit model is the row set with ``editor = regime = cov = "none"`` and ``N = 0``.
``results.parquet`` and ``results.json`` in the run directory hold every row the lab has; a new lab
on that directory, or one given other run directories through ``reuse`` (e.g. the runs of ``moir
grid``), answers from them and computes only missing keys.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.files import atomic_write

log = logging.getLogger(__name__)

#: Columns of the tidy results table, in order.
ROW_COLUMNS: tuple[str, ...] = ("profile", "model", "editor", "regime", "cov", "n_edits", "seed", "lambda",
                                "tau", "group", "metric", "value", "key")
#: Metric groups.
GROUPS: tuple[str, ...] = ("edit", "preservation", "nll", "distortion", "cost")
#: File name of the results table in a run directory (``.parquet`` and ``.json``).
RESULTS_NAME = "results"
#: The CounterFact metrics kept (appendix C.3), in the paper's order (``NS_all``: NS with the neighbours
#: edited in the same run), then the composites.
EDIT_METRICS: tuple[str, ...] = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity",
                                 "Fluency*", "Portability", "S_e", "S_e_noport")
#: ``editor``, ``regime`` and ``cov`` of the pre-edit rows.
NONE = "none"


def json_value(v: Any) -> Any:
    """One scalar as plain JSON: NaN/inf as None, numpy scalars as Python numbers."""
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def write_rows(rows: pd.DataFrame, out_dir: str | os.PathLike[str]) -> Path:
    """``results.parquet`` and ``results.json`` (records, NaN as null) in ``out_dir``, atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = rows[list(ROW_COLUMNS)].reset_index(drop=True)
    atomic_write(out / f"{RESULTS_NAME}.parquet", lambda p: rows.to_parquet(p, index=False))
    records = [{k: json_value(v) for k, v in r.items()} for r in rows.to_dict("records")]
    atomic_write(out / f"{RESULTS_NAME}.json", lambda p: p.write_text(json.dumps(records, indent=0)))
    return out / f"{RESULTS_NAME}.parquet"


def load_rows(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Rows from ``results.parquet`` files or run directories (searched recursively), deduplicated."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    frames = []
    for p in map(Path, paths):
        files = sorted(p.rglob(f"{RESULTS_NAME}.parquet")) if p.is_dir() else [p] if p.is_file() else []
        if not files:
            log.info("no %s.parquet under %s", RESULTS_NAME, p)
        for f in files:
            try:
                frames.append(read_rows_file(f))
            except Exception as exc:  # noqa: BLE001 - a broken or foreign file is skipped, not fatal
                log.warning("skipping %s: %s", f, exc)
    if not frames:
        return empty_rows()
    rows = pd.concat(frames, ignore_index=True)
    return rows.drop_duplicates(["key", "n_edits", "group", "metric"], keep="last").reset_index(drop=True)


def _dtype(column: str) -> str:
    return "float64" if column in ("value", "lambda", "tau") else "int64" if column in ("n_edits", "seed") \
        else "object"


def empty_rows() -> pd.DataFrame:
    """A results table without rows (the column dtypes of a full one)."""
    return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in ROW_COLUMNS})


def read_rows_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One parquet results table in :data:`ROW_COLUMNS` order and the in-memory dtypes (parquet gives
    pandas' ``str`` for text columns; rows computed in memory hold ``object``)."""
    frame = pd.read_parquet(path)
    missing = [c for c in ROW_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a results table (missing {missing})")
    return frame[list(ROW_COLUMNS)].astype({c: _dtype(c) for c in ROW_COLUMNS})


def clean(obj: Any) -> Any:
    """Plain JSON data: NaN/inf as None, numpy scalars as Python numbers, recursively."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return json_value(obj)
