"""Where scored points live: a run directory's tables, other runs' tables, and the machine-wide copy.

A *point* is one scored state of a model (an editing experiment at ``N`` edits, or the unedited model at
``N = 0``), identified by its ``key`` (:meth:`moir_lib.experiments.lab.Lab.key`: everything that
determines its numbers) and ``N``. Its tidy rows (:data:`~moir_lib.experiments.rows.ROW_COLUMNS`)
and per-item scores (:data:`~moir_lib.evaluation.uncertainty.ITEM_COLUMNS`) are kept by a
:class:`PointStore` in three tiers, read in this order:

1. **own** — ``results.parquet`` / ``items.parquet`` in the run directory. :meth:`PointStore.put`
   writes one point as a part file under ``parts/`` (its items first), without rewriting the run's
   tables, so a crash keeps every point stored before it; :meth:`PointStore.flush` consolidates the
   parts into the two tables (a store opened on a directory with parts left by a crash flushes them);
2. **reused** — the tables of other run directories (``reuse``: an earlier run, a grid's runs); a
   point is copied from them only when every group asked for is complete there *and* its per-item
   scores are there too (a point without its items cannot feed a claim: it is recomputed);
3. **shared** — the machine-wide copy under ``$MOIR_CACHE/experiments`` (checksummed files, one
   folder per point), so that chapters run side by side, reruns and the pocket report share work.

Every read-back is checked: a group's rows are used only with the per-item scores they were computed
from, the ``items_digest`` they carry (:func:`~moir_lib.experiments.rows.items_digest`). A group whose
items do not match (the items of another computation under the same key, a table written before rows
carried the digest) is dropped with a warning naming the point and the files, and recomputed. A group of
a point is stored whole: its rows and items replace the earlier ones together.

:meth:`PointStore.lock` serialises two processes computing the same point (the second one waits,
or is told :class:`~moir_lib.locks.Busy`), after which the waiting one reads the other's copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pandas as pd

from moir_lib.cache import read_checked, write_checked
from moir_lib.experiments.identity import shared_items_path, shared_key, shared_path
from moir_lib.experiments.rows import (
    EDIT_METRICS,
    ITEMS_NAME,
    RESULTS_NAME,
    ROW_COLUMNS,
    as_items,
    as_rows,
    empty_items,
    empty_rows,
    items_digest,
    read_items_file,
    read_rows_file,
    write_items,
    write_rows,
)
from moir_lib.locks import exclusive, file_lock_path

__all__ = ["PointStore"]

log = logging.getLogger(__name__)

#: metrics a group's rows must all hold to be reused (a partial copy is recomputed, not half used)
REQUIRED = {"edit": set(EDIT_METRICS), "preservation": {"S_p"}}
#: groups whose rows are computed from per-item scores (a copy without them is not complete)
ITEMISED = ("edit", "preservation", "nll")
#: the folder of a run directory where points are stored one by one until :meth:`PointStore.flush`
PARTS = "parts"
_POINT = ["key", "n_edits"]
_GROUP = ["key", "n_edits", "group"]
_ITEM = ["key", "n_edits", "group", "unit", "item", "metric"]


def shared_default() -> bool:
    """Whether the machine-wide copy is used by default (``MOIR_SHARED_RESULTS=0`` turns it off)."""
    return os.environ.get("MOIR_SHARED_RESULTS", "1").strip().lower() not in ("0", "false", "no")


class PointStore:
    """The scored points of one run directory ``out_dir``, with ``reuse`` (other run directories or
    results files) and, when ``shared`` (default: :func:`shared_default`), the machine-wide copy.

    ``labels`` (set by the lab that owns the store, e.g. ``{"profile": ..., "model": ...}``) overwrite
    those columns of every stored row: rows of equal key hold the same numbers, whichever profile name
    computed them."""

    labels: dict[str, str]

    def __init__(self, out_dir: str | os.PathLike[str], *, reuse: Iterable[str | os.PathLike[str]] = (),
                 shared: bool | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.shared = shared_default() if shared is None else bool(shared)
        own = self.out_dir / f"{RESULTS_NAME}.parquet"
        self._parts = sorted((self.out_dir / PARTS).glob(f"*.{RESULTS_NAME}.parquet"))
        self.rows, self.items = _read_runs([own] * own.is_file() + self._parts, "this run directory")
        self.flush()  # points left as parts by a run that stopped before flushing them
        self._reused, self._reused_items = _read_runs(_results_files(_reuse_sources(reuse)), "a reused run")
        self._shared_seen: set[tuple[str, int]] = set()
        self.labels = {}

    # ------------------------------------------------------------------ reading

    def point(self, key: str, n: int) -> pd.DataFrame:
        """The rows of the point ``key`` at ``n`` edits, copying what the reused runs and the
        machine-wide copy hold and this run directory lacks."""
        hit = self._own(key, n)
        if not self._reused.empty:
            found = self._reused[(self._reused["key"] == key) & (self._reused["n_edits"] == n)]
            found = _complete(found, self._reused_items, key, n, "a reused run")
            if not set(found["group"]) <= set(hit["group"]):
                it = self._reused_items
                items = it[(it["key"] == key) & (it["n_edits"] == n) & it["group"].isin(found["group"])]
                self._merge(found, items, write_shared=False)
                hit = self._own(key, n)
        if self.shared and (key, n) not in self._shared_seen:
            self._shared_seen.add((key, n))
            shared = self._read_shared(key, n)
            if shared is not None and not set(shared[0]["group"]) <= set(hit["group"]):
                self._merge(*shared, write_shared=False)
                hit = self._own(key, n)
        return hit

    def has(self, key: str, n: int, groups: Sequence[str]) -> bool:
        """Whether the point holds rows of every group in ``groups``."""
        return set(groups) <= set(self.point(key, n)["group"])

    def items_of(self, key: str, n: int) -> pd.DataFrame:
        """The per-item scores of the point ``key`` at ``n`` edits."""
        return self.items[(self.items["key"] == key) & (self.items["n_edits"] == n)]

    def _own(self, key: str, n: int) -> pd.DataFrame:
        return self.rows[(self.rows["key"] == key) & (self.rows["n_edits"] == n)]

    def _read_shared(self, key: str, n: int) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        path, items_path = shared_path(key, n), shared_items_path(key, n)
        if read_checked(path, key=shared_key(key, n)) is None:  # absent, damaged or another's: recomputed
            return None
        try:
            rows = read_rows_file(path)
            checked = read_checked(items_path, key=shared_key(key, n))
            items = read_items_file(items_path) if checked is not None else empty_items()
        except Exception as exc:  # noqa: BLE001 - a broken entry is recomputed
            log.warning("ignoring unreadable shared result %s: %s", path, exc)
            return None
        rows, items = _matching(rows, items, f"the machine-wide copy ({path}, {items_path})")
        return _complete(rows, items, key, n, f"the machine-wide copy {path.parent}"), items

    # ------------------------------------------------------------------ writing

    def put(self, rows: pd.DataFrame, items: pd.DataFrame) -> None:
        """Store one or more points' rows and items here (and in the machine-wide copy); ``ValueError``
        when the rows do not carry the digest of the items given (:func:`_mismatches`)."""
        for key, n, group, _ in _mismatches(rows, items):
            raise ValueError(f"point {key} N={n}: the {group} rows do not match the items given (their "
                             f"items_digest is not that of the items)")
        self._merge(rows, items, write_shared=self.shared)

    def _merge(self, new: pd.DataFrame, items: pd.DataFrame, write_shared: bool) -> None:
        """Store ``new`` rows with their ``items``, each group of a point replacing its earlier rows and
        items whole."""
        if new.empty:
            return
        new = new.assign(**self.labels)
        self.rows, self.items = _replaced(self.rows, self.items, new, items)
        self._write_part(new, items)
        if write_shared:
            for (key, n), _ in new.groupby(_POINT):
                self._write_shared(str(key), int(n))

    def _write_part(self, rows: pd.DataFrame, items: pd.DataFrame) -> None:
        """``rows`` and their ``items`` as the next part file of ``parts/`` (items first: a point's rows
        never outlive its items)."""
        stem = self.out_dir / PARTS / f"{len(self._parts):06d}"
        write_items(items, stem.parent, name=f"{stem.name}.{ITEMS_NAME}")
        self._parts.append(write_rows(rows, stem.parent, name=f"{stem.name}.{RESULTS_NAME}", with_json=False))

    def flush(self) -> None:
        """The points stored as parts consolidated into ``results.parquet`` / ``items.parquet`` (and
        ``results.json``), the parts then removed; nothing to do when none is pending."""
        if not self._parts:
            return
        write_items(self.items, self.out_dir)  # items first: a point's rows never outlive its items
        write_rows(self.rows, self.out_dir)
        for part in self._parts:
            part.with_name(part.name.replace(RESULTS_NAME, ITEMS_NAME)).unlink(missing_ok=True)
            part.unlink(missing_ok=True)
        self._parts = []

    def _write_shared(self, key: str, n: int) -> None:
        point, point_items = self._own(key, n), self.items_of(key, n)
        path = shared_path(key, n)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_checked(shared_items_path(key, n), lambda p: point_items.to_parquet(p, index=False),
                          key=shared_key(key, n))
            write_checked(path, lambda p: point.to_parquet(p, index=False), key=shared_key(key, n))
        except OSError as exc:  # a read-only cache is not an error
            log.warning("could not write the shared result %s: %s", path, exc)

    # ------------------------------------------------------------------ two processes

    @contextlib.contextmanager
    def lock(self, key: str, n: int, what: str, wait: bool = True) -> Iterator[None]:
        """With the machine-wide copy: hold the lock of the point ``key`` at ``n``, so that two processes
        compute it once; afterwards the copy is read again (``wait`` false: :class:`~moir_lib.locks.Busy`
        when another process holds it)."""
        with contextlib.ExitStack() as stack:
            if self.shared:
                try:
                    stack.enter_context(exclusive(file_lock_path(shared_path(key, n)), what, wait=wait))
                except ValueError as exc:  # an unwritable cache: compute without the lock
                    log.warning("%s", exc)
                self._shared_seen.clear()  # read again what another process stored while this one waited
            yield


def _complete(rows: pd.DataFrame, items: pd.DataFrame, key: str, n: int, where: str) -> pd.DataFrame:
    """The rows of the groups of ``rows`` (one point) that hold every metric :data:`REQUIRED` names and,
    for the groups scored per item, their per-item scores (a copy without them is recomputed)."""
    mine = (items["key"] == key) & (items["n_edits"] == n) if len(items) else None
    have_items = set(items.loc[mine, "group"]) if mine is not None else set()
    ok = []
    for g, part in rows.groupby("group"):
        if not REQUIRED.get(g, set()) <= set(part["metric"]):
            continue
        if g in ITEMISED and g not in have_items:
            log.warning("point %s N=%d: %s holds %s rows without their per-item scores (items.parquet); "
                        "recomputing them", key, n, where, g)
            continue
        ok.append(g)
    return rows[rows["group"].isin(ok)]


def _mismatches(rows: pd.DataFrame, items: pd.DataFrame) -> list[tuple[str, int, str, str]]:
    """``(key, n, group, why)`` of every group of ``rows`` whose ``items_digest`` is not the digest of its
    items in ``items``: a foreign or changed items table, items left out, rows without the digest."""
    out = []
    mine = dict(tuple(items.groupby(_GROUP))) if len(items) else {}
    for (key, n, group), part in rows.groupby(_GROUP):
        claimed = set(part["items_digest"])
        held = items_digest(mine[(key, n, group)]) if (key, n, group) in mine else ""
        if claimed != {held}:
            why = ("no digest: written before rows carried one" if claimed <= {None}
                   else "without their per-item scores" if not held else "other per-item scores")
            out.append((str(key), int(n), str(group), why))
    return out


#: points a warning about rows that do not match their items names one by one (then: how many more)
_NAMED = 10


def _matching(rows: pd.DataFrame, items: pd.DataFrame, where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows`` and ``items`` less the groups whose items do not match their rows (:func:`_mismatches`),
    logged with the points and ``where`` (the files read)."""
    bad = _mismatches(rows, items)
    if not bad:
        return rows, items
    named = "; ".join(f"point {k} N={n} {g} ({why})" for k, n, g, why in bad[:_NAMED])
    more = f"; and {len(bad) - _NAMED} more" if len(bad) > _NAMED else ""
    log.warning("%s holds rows that do not match their per-item scores, recomputing them: %s%s", where,
                named, more)
    index = pd.MultiIndex.from_tuples([b[:3] for b in bad], names=_GROUP)
    return (rows[~_groups_of(rows).isin(index)].reset_index(drop=True),
            items[~_groups_of(items).isin(index)].reset_index(drop=True))


def _groups_of(frame: pd.DataFrame) -> pd.MultiIndex:
    """The ``(key, n_edits, group)`` of every row of ``frame``."""
    return pd.MultiIndex.from_frame(frame[_GROUP])


def _read_runs(files: list[Path], what: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``files`` (results tables) with the items beside each, each pair checked
    (:func:`_matching`); a later file's group of a point replaces an earlier one's whole. A broken file is
    skipped with a warning."""
    rows, items = empty_rows(), empty_items()
    for f in files:
        items_file = f.with_name(f.name.replace(RESULTS_NAME, ITEMS_NAME))  # results.parquet: items.parquet
        try:
            part = read_rows_file(f)
            part_items = read_items_file(items_file) if items_file.is_file() else empty_items()
        except Exception as exc:  # noqa: BLE001 - a broken or foreign file is skipped, not fatal
            log.warning("skipping %s: %s", f, exc)
            continue
        part, part_items = _matching(part, part_items, f"{what} ({f}, {items_file})")
        rows, items = _replaced(rows, items, part, part_items)
    return rows, items


def _replaced(rows: pd.DataFrame, items: pd.DataFrame, new: pd.DataFrame, new_items: pd.DataFrame
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows`` and ``items`` with each group of a point that ``new`` holds replaced whole by ``new``'s rows
    and ``new_items``' items of it."""
    if new.empty:
        return rows, items
    groups = pd.MultiIndex.from_frame(new[_GROUP].drop_duplicates())
    rows = pd.concat([f for f in (rows[~_groups_of(rows).isin(groups)], new[list(ROW_COLUMNS)]) if len(f)],
                     ignore_index=True)
    kept, added = items[~_groups_of(items).isin(groups)], new_items[_groups_of(new_items).isin(groups)]
    frames = [f for f in (kept, added) if len(f)]
    items = pd.concat(frames, ignore_index=True) if frames else empty_items()
    return (as_rows(rows.drop_duplicates([*_GROUP, "metric"], keep="last").reset_index(drop=True)),
            as_items(items.drop_duplicates(_ITEM, keep="last").reset_index(drop=True)))


def _results_files(paths: list[Path]) -> list[Path]:
    """The results tables of ``paths`` (files, or directories searched recursively)."""
    return [f for p in paths for f in (sorted(p.rglob(f"{RESULTS_NAME}.parquet")) if p.is_dir() else [p])]


def _reuse_sources(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The ``reuse`` paths, each an existing results file or a directory holding one (``ValueError``
    naming the first that is not)."""
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"reuse path {p} does not exist: give a run directory or a "
                             f"{RESULTS_NAME}.parquet file")
        if p.is_dir() and not any(p.rglob(f"{RESULTS_NAME}.parquet")):
            raise ValueError(f"reuse path {p} holds no {RESULTS_NAME}.parquet: give a run directory of an "
                             f"earlier run")
        out.append(p)
    return out
