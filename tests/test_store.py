"""The point store's read-backs: a point's rows are used only with the per-item scores they were computed
from (their ``items_digest``), whichever tier they come from — the run directory, a reused run, the
machine-wide copy — and a point whose items belong to other values is recomputed, the log naming the
point and the files. No model is loaded: the store is asked, not the lab's model."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from moir_lib.cache import write_checked
from moir_lib.experiments import ExperimentSpec, Lab, PointStore
from moir_lib.experiments.identity import editor_settings, shared_items_path, shared_key, shared_path
from moir_lib.experiments.measure import point_rows
from moir_lib.experiments.rows import EDIT_METRICS, items_digest, write_items, write_rows

SPEC = ExperimentSpec("memit", "batch", "wiki", 3)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))


def _point(lab: Lab, es: list[float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows and items of SPEC's point at 3 edits whose records have efficacy ``es``."""
    items = pd.DataFrame({"group": "edit", "unit": "record", "item": [str(i) for i in range(len(es))],
                          "metric": "ES", "value": es})
    values = {("edit", m): sum(es) / len(es) for m in EDIT_METRICS}
    return point_rows(SPEC, 3, lab.key(SPEC), editor_settings(SPEC, lab.profile), values, items)


def _probe(tmp_path) -> Lab:
    return Lab("pocket-micro", PointStore(tmp_path / "probe", shared=False))


def test_rows_carry_the_digest_of_their_group_s_items(tmp_path):
    rows, items = _point(_probe(tmp_path), [1.0, 0.0, 1.0])
    assert set(rows["items_digest"]) == {items_digest(items)} and items_digest(items) != ""
    assert items_digest(items.iloc[::-1]) == items_digest(items)  # order does not count
    assert items_digest(items.assign(value=[1.0, 1.0, 1.0])) != items_digest(items)
    assert items_digest(items.iloc[:0]) == ""


def test_a_reused_run_whose_items_belong_to_other_values_is_not_read_as_cached(tmp_path, caplog):
    """The same point keys, other values: the rows say ES 2/3, the items 1/3. The point is recomputed and
    the log says why, naming the point and both files."""
    probe = _probe(tmp_path)
    rows, _ = _point(probe, [1.0, 0.0, 1.0])
    _, foreign = _point(probe, [0.0, 0.0, 1.0])
    write_rows(rows, tmp_path / "old")
    write_items(foreign, tmp_path / "old")
    with caplog.at_level(logging.WARNING):
        lab = Lab("pocket-micro", PointStore(tmp_path / "new", shared=False, reuse=[tmp_path / "old"]))
        assert not lab.is_cached(SPEC, ("edit",)) and lab.store.rows.empty and lab.store.items.empty
    assert lab.key(SPEC) in caplog.text and "N=3" in caplog.text and "do not match" in caplog.text
    assert str(tmp_path / "old" / "results.parquet") in caplog.text
    assert str(tmp_path / "old" / "items.parquet") in caplog.text
    write_items(_point(probe, [1.0, 0.0, 1.0])[1], tmp_path / "old")  # its own items: reused
    lab = Lab("pocket-micro", PointStore(tmp_path / "again", shared=False, reuse=[tmp_path / "old"]))
    assert lab.is_cached(SPEC, ("edit",)) and len(lab.store.items) == 3


def test_a_run_directory_whose_items_belong_to_other_values_recomputes_the_point(tmp_path, caplog):
    probe = _probe(tmp_path)
    rows, items = _point(probe, [1.0, 0.0, 1.0])
    write_rows(rows, tmp_path / "run")
    write_items(_point(probe, [0.0, 0.0, 1.0])[1], tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        lab = Lab("pocket-micro", PointStore(tmp_path / "run", shared=False))
        assert not lab.is_cached(SPEC, ("edit",)) and lab.store.rows.empty and lab.store.items.empty
    assert lab.key(SPEC) in caplog.text and str(tmp_path / "run" / "items.parquet") in caplog.text
    lab.store.put(rows, items)  # a recomputed point replaces both
    again = Lab("pocket-micro", PointStore(tmp_path / "run", shared=False))
    assert again.is_cached(SPEC, ("edit",)) and set(again.store.items["value"]) == {0.0, 1.0}
    assert len(again.store.items) == 3


def test_the_machine_wide_copy_whose_items_belong_to_other_values_is_not_used(tmp_path, caplog):
    probe = _probe(tmp_path)
    rows, items = _point(probe, [1.0, 0.0, 1.0])
    PointStore(tmp_path / "writer", shared=True).put(rows, items)
    key = probe.key(SPEC)
    assert shared_path(key, 3).is_file()
    assert Lab("pocket-micro", PointStore(tmp_path / "reader", shared=True)).is_cached(SPEC, ("edit",))
    foreign = _point(probe, [0.0, 0.0, 1.0])[1]
    write_checked(shared_items_path(key, 3), lambda p: foreign.to_parquet(p, index=False),  # checksum and all
                  key=shared_key(key, 3))
    with caplog.at_level(logging.WARNING):
        lab = Lab("pocket-micro", PointStore(tmp_path / "other", shared=True))
        assert not lab.is_cached(SPEC, ("edit",)) and lab.store.rows.empty
    assert key in caplog.text and str(shared_items_path(key, 3)) in caplog.text


def test_a_recomputed_group_replaces_its_items_whole(tmp_path):
    """Rows and items of one point's group are stored together: items of an earlier computation that the
    new one does not hold are not left beside the new rows."""
    probe = _probe(tmp_path)
    store = PointStore(tmp_path / "run", shared=False)
    store.put(*_point(probe, [1.0, 0.0, 1.0, 1.0]))
    rows, items = _point(probe, [0.0, 1.0])
    store.put(rows, items)
    assert store.items["item"].tolist() == ["0", "1"]
    assert Lab("pocket-micro", PointStore(tmp_path / "run", shared=False)).is_cached(SPEC, ("edit",))


def test_putting_rows_with_items_they_do_not_match_is_an_error(tmp_path):
    probe = _probe(tmp_path)
    rows, _ = _point(probe, [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"point .* N=3: the edit rows do not match the items given"):
        PointStore(tmp_path / "run", shared=False).put(rows, _point(probe, [0.0, 0.0, 1.0])[1])


def test_a_point_is_written_as_a_part_and_the_tables_once_flushed(tmp_path):
    """``put`` writes one point's part without touching the run's tables; ``flush`` consolidates them; a
    store opened on parts a crashed run left behind reads and consolidates them, nothing lost or doubled."""
    probe = _probe(tmp_path)
    store = PointStore(tmp_path / "run", shared=False)
    store.put(*_point(probe, [1.0, 0.0, 1.0]))
    assert not (tmp_path / "run" / "results.parquet").exists()
    assert len(list((tmp_path / "run" / "parts").glob("*.parquet"))) == 2  # its rows and its items
    store.flush()
    table = pd.read_parquet(tmp_path / "run" / "results.parquet")
    assert len(table) == len(EDIT_METRICS) and not list((tmp_path / "run" / "parts").glob("*"))
    store.put(*_point(probe, [0.0, 0.0, 1.0]))  # recomputed, then the process dies before flushing
    again = PointStore(tmp_path / "run", shared=False)
    assert again.has(probe.key(SPEC), 3, ("edit",)) and len(again.rows) == len(EDIT_METRICS)
    assert sorted(again.items["value"]) == [0.0, 0.0, 1.0]
    assert set(pd.read_parquet(tmp_path / "run" / "items.parquet")["value"]) == {0.0, 1.0}
    assert not list((tmp_path / "run" / "parts").glob("*"))
