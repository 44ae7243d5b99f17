"""Tidy result rows (:data:`ROW_COLUMNS`) and the results table on disk.

One row per ``profile × model × editor × regime × C × N × edit sample × metric``, with the metric's
``group`` (``edit``, ``preservation``, ``nll``, ``distortion``, ``cost``), its uncertainty (``n`` items,
``stderr``, the 95 % interval ``lo``-``hi``: :mod:`moir_lib.evaluation.uncertainty`) and a ``key``: the
fingerprint of everything that determines the value (the profile's content, the editor settings,
the C's recipe, the records, the evaluation settings; :meth:`~moir_lib.experiments.lab.Lab.key`).
The pre-edit model is the row set with ``editor = regime = cov = "none"`` and ``N = 0``.
``results.parquet`` and ``results.json`` in the run directory hold every row the lab has; a new lab
on that directory, or one given other run directories through ``reuse`` (e.g. the runs of ``moir
grid``), answers from them and computes only missing keys. ``items.parquet`` beside it keeps every point's
per-item scores (:data:`~moir_lib.evaluation.uncertainty.ITEM_COLUMNS`, keyed like the rows), from which
two points sharing records or items are compared paired. Every row carries ``items_digest``, the
:func:`items_digest` of its point's items of its group (``""``: a group scored without items): rows and
items read back are used together only while it matches (:mod:`moir_lib.experiments.store`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moir_lib.files import atomic_write

log = logging.getLogger(__name__)

#: Columns of the tidy results table, in order.
ROW_COLUMNS: tuple[str, ...] = ("profile", "model", "editor", "regime", "cov", "n_edits", "edit_sample",
                                "lambda", "tau", "group", "metric", "value", "n", "stderr", "lo", "hi", "key",
                                "items_digest")
#: The columns that name a scored point (besides its ``key``): what an item is labelled with for the claims.
POINT_COLUMNS: tuple[str, ...] = ("profile", "model", "editor", "regime", "cov", "n_edits", "edit_sample",
                                  "lambda", "tau")
#: The uncertainty columns (NaN where a metric has none: distortion, cost).
UNCERTAINTY_COLUMNS: tuple[str, ...] = ("n", "stderr", "lo", "hi")
#: Metric groups.
GROUPS: tuple[str, ...] = ("edit", "preservation", "nll", "distortion", "cost")
#: File name of the results table in a run directory (``.parquet`` and ``.json``).
RESULTS_NAME = "results"
#: File name of the per-item scores beside it.
ITEMS_NAME = "items"
#: The CounterFact metrics kept (appendix C.3), in the paper's order (``NS_all``: NS with the neighbours
#: edited in the same run), then the composites.
EDIT_METRICS: tuple[str, ...] = ("ES", "PS", "NS", "NS_all", "Efficacy", "Generalization", "Specificity",
                                 "Fluency*", "Portability", "S_e", "S_e_noport")
#: ``editor``, ``regime`` and ``cov`` of the pre-edit rows.
NONE = "none"
#: The items table's dtypes besides ``object``.
_ITEM_TYPES = {"n_edits": "int64", "value": "float64"}


def json_value(v: Any) -> Any:
    """One scalar as plain JSON: NaN/inf as None, numpy scalars as Python numbers."""
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def write_rows(rows: pd.DataFrame, out_dir: str | os.PathLike[str], *, name: str = RESULTS_NAME,
               with_json: bool = True) -> Path:
    """``<name>.parquet`` (default ``results.parquet``) and, ``with_json``, ``<name>.json`` (records, NaN
    as null) in ``out_dir``, atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = rows[list(ROW_COLUMNS)].reset_index(drop=True)
    atomic_write(out / f"{name}.parquet", lambda p: rows.to_parquet(p, index=False))
    if with_json:
        rows_json = [{k: json_value(v) for k, v in r.items()} for r in rows.to_dict("records")]
        atomic_write(out / f"{name}.json", lambda p: p.write_text(json.dumps(rows_json, indent=0)))
    return out / f"{name}.parquet"


def load_rows(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Rows from ``results.parquet`` files or run directories (searched recursively), deduplicated."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for p in map(Path, paths):
        found = sorted(p.rglob(f"{RESULTS_NAME}.parquet")) if p.is_dir() else [p] if p.is_file() else []
        if not found:
            log.info("no %s.parquet under %s", RESULTS_NAME, p)
        files += found
    return _read_all(files, read_rows_file, empty_rows, ["key", "n_edits", "group", "metric"])


def _read_all(files: Iterable[Path], read: Callable[[Path], pd.DataFrame], empty: Callable[[], pd.DataFrame],
              unique: list[str]) -> pd.DataFrame:
    """The frames ``read`` gives for ``files`` (a broken or foreign file skipped with a warning),
    concatenated and deduplicated on ``unique`` (the last file wins); ``empty()`` when none."""
    frames = []
    for f in files:
        try:
            frames.append(read(f))
        except Exception as exc:  # noqa: BLE001 - a broken or foreign file is skipped, not fatal
            log.warning("skipping %s: %s", f, exc)
    if not frames:
        return empty()
    return pd.concat(frames, ignore_index=True).drop_duplicates(unique, keep="last").reset_index(drop=True)


def _dtype(column: str) -> str:
    if column in ("value", "lambda", "tau", *UNCERTAINTY_COLUMNS):
        return "float64"
    return "int64" if column in ("n_edits", "edit_sample") else "object"


def empty_rows() -> pd.DataFrame:
    """A results table without rows (the column dtypes of a full one)."""
    return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in ROW_COLUMNS})


def read_rows_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One parquet results table in :data:`ROW_COLUMNS` order and the in-memory dtypes (parquet gives
    pandas' ``str`` for text columns; rows computed in memory hold ``object``)."""
    frame = pd.read_parquet(path)
    for c in UNCERTAINTY_COLUMNS:  # tables written before the rows carried them
        if c not in frame.columns:
            frame[c] = np.nan
    if "items_digest" not in frame.columns:  # nor their items' digest: such rows match no items
        frame["items_digest"] = None
    missing = [c for c in ROW_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a results table (missing {missing})")
    return as_rows(frame)


def as_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s :data:`ROW_COLUMNS` in order, with the in-memory dtypes."""
    return frame[list(ROW_COLUMNS)].astype({c: _dtype(c) for c in ROW_COLUMNS})


def empty_items() -> pd.DataFrame:
    """An items table without rows."""
    from moir_lib.evaluation.uncertainty import ITEM_COLUMNS

    return pd.DataFrame({c: pd.Series(dtype=_ITEM_TYPES.get(c, "object")) for c in ITEM_COLUMNS})


def as_items(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s :data:`~moir_lib.evaluation.uncertainty.ITEM_COLUMNS` in order, with the in-memory
    dtypes."""
    from moir_lib.evaluation.uncertainty import ITEM_COLUMNS

    return frame[list(ITEM_COLUMNS)].astype({c: _ITEM_TYPES.get(c, "object") for c in ITEM_COLUMNS})


def read_items_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One parquet items table in :data:`~moir_lib.evaluation.uncertainty.ITEM_COLUMNS` order."""
    from moir_lib.evaluation.uncertainty import ITEM_COLUMNS

    frame = pd.read_parquet(path)
    missing = [c for c in ITEM_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not an items table (missing {missing})")
    return as_items(frame)


def load_items(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Items from ``items.parquet`` files, run directories (searched recursively) or the results files
    they sit beside, deduplicated."""
    files = []
    for p in map(Path, paths):
        if p.is_file():
            p = p.with_name(f"{ITEMS_NAME}.parquet")
            files += [p] if p.is_file() else []
        else:
            files += sorted(p.rglob(f"{ITEMS_NAME}.parquet")) if p.is_dir() else []
    return _read_all(files, read_items_file, empty_items,
                     ["key", "n_edits", "group", "unit", "item", "metric"])


def items_digest(items: pd.DataFrame) -> str:
    """Fingerprint of one point's per-item scores of one group (``unit``, ``item``, ``metric``, ``value``,
    in any order; ``""`` for none): what its rows carry as ``items_digest``."""
    if not len(items):
        return ""
    frame = items.sort_values(["unit", "item", "metric"], kind="stable")
    columns = [frame[c].astype(str) for c in ("unit", "item", "metric")]
    names = "\0".join(f"{u}\0{i}\0{m}" for u, i, m in zip(*columns, strict=True))
    values = frame["value"].to_numpy(dtype="<f8", copy=True)
    values[np.isnan(values)] = np.nan  # one NaN, whatever its bits
    return hashlib.sha256(names.encode() + values.tobytes()).hexdigest()[:16]


def write_items(items: pd.DataFrame, out_dir: str | os.PathLike[str], *, name: str = ITEMS_NAME) -> Path:
    """``<name>.parquet`` (default ``items.parquet``) in ``out_dir``, atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.parquet"
    atomic_write(path, lambda p: items.reset_index(drop=True).to_parquet(p, index=False))
    return path


def clean(obj: Any) -> Any:
    """Plain JSON data: NaN/inf as None, numpy scalars as Python numbers, recursively."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return json_value(obj)


def with_cells(frame: pd.DataFrame, organism: int) -> pd.DataFrame:
    """``frame`` (with ``cov`` and ``edit_sample``) of ``organism``'s points labelled with its cells:
    ``organism``, ``sample`` (its edit sample), ``draw``, ``cov_base``."""
    from moir_lib.covariance.recipes import parse_name

    names = {c: parse_name(c) for c in frame["cov"].unique()}
    return frame.assign(organism=int(organism), sample=frame["edit_sample"].astype("int64"),
                        draw=frame["cov"].map({c: d for c, (_, d) in names.items()}).astype("int64"),
                        cov_base=frame["cov"].map({c: b for c, (b, _) in names.items()}).astype(object))


def stack_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The non-empty ``frames`` in one frame (an empty frame when none)."""
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
