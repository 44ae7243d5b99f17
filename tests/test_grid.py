"""`moir grid`: expansion, validation, resumable local runs, submitit job arrays, index."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from moir_lib import grid as g


def _grid_file(tmp_path, runs, **extra):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "runs": runs, **extra}))
    return path


NB = "notebooks/04_g_cancellation.ipynb"


def test_expansion_is_the_cartesian_product(tmp_path, root):
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"seed": [0, 1, 2], "max_d": [4, 6],
                                                                    "n_instances": 20}}])
    grid = g.load_grid(path, root)
    assert len(grid.runs) == 6
    assert len({r.run_id for r in grid.runs}) == 6
    assert all(r.parameters["n_instances"] == 20 for r in grid.runs)
    assert "04_g_cancellation__max_d=4__n_instances=20__seed=0" in {r.run_id for r in grid.runs}


@pytest.mark.parametrize("runs, message", [
    ([{"notebook": NB, "parameters": {"n_instancez": [1]}}], "n_instancez"),
    ([{"notebook": NB, "paramters": {}}], "unknown key"),
    ([{"notebook": "notebooks/nope.ipynb"}], "not found"),
    ([], "no `runs`"),
])
def test_bad_grids_are_refused_before_running(tmp_path, root, runs, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        g.load_grid(_grid_file(tmp_path, runs), root)


def _index(out):
    with open(out / g.INDEX_NAME) as fh:
        return list(csv.DictReader(fh))


def test_local_grid_resumes_without_redoing_finished_runs(tmp_path, root):
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"seed": [0, 1], "n_instances": 20}}])
    grid = g.load_grid(path, root)
    out = tmp_path / "out"
    # an interrupted earlier invocation finished the first run only
    first = g.execute_run(grid.runs[0], str(out), str(root))
    assert first["status"] == "done"
    stamp = (out / grid.runs[0].run_id / "summary.json").stat().st_mtime_ns
    records = g.run_grid(grid, out, root=root)
    assert [r["run_id"] for r in records] == [grid.runs[1].run_id]
    assert (out / grid.runs[0].run_id / "summary.json").stat().st_mtime_ns == stamp
    rows = _index(out)
    assert [r["status"] for r in rows] == ["done", "done"]
    assert all(json.loads(r["parameters"])["n_instances"] == 20 for r in rows)
    assert g.run_grid(grid, out, root=root) == []  # nothing left to do


def test_failed_run_is_recorded(tmp_path, root):
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"n_instances": 20, "max_d": 1}}])
    grid = g.load_grid(path, root)
    records = g.run_grid(grid, tmp_path / "out", root=root)
    assert records[0]["status"] == "failed" and "cell" in records[0]["error"]
    assert _index(tmp_path / "out")[0]["status"] == "failed"


def test_slurm_executor_submits_a_job_array(tmp_path, root):
    pytest.importorskip("submitit")
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"seed": [3, 4], "n_instances": 20}}],
                      slurm={"partition": "debug", "timeout_min": 5})
    grid = g.load_grid(path, root)
    records = g.run_grid(grid, tmp_path / "out", executor="slurm", root=root, slurm_cluster="debug")
    assert sorted(r["status"] for r in records) == ["done", "done"]
    assert (tmp_path / "out" / "_submitit").is_dir()
    assert [r["status"] for r in _index(tmp_path / "out")] == ["done", "done"]


def test_paper_grid_is_valid(root):
    grid = g.load_grid(root / "data" / "grids" / "paper.yaml", root)
    profiles = {r.profile for r in grid.runs if r.profile}
    assert profiles == {"olmo2-7b-instruct", "llama3.1-8b-instruct", "qwen3-8b"}
    assert grid.slurm["gpus_per_node"] == 1


def test_smoke_grid_is_valid(root):
    grid = g.load_grid(root / "data" / "grids" / "smoke.yaml", root)
    chapters = [r.notebook for r in grid.runs]
    assert len(chapters) == len(set(chapters)), "one run per chapter so the book can be built from it"
