"""`moir grid`: expansion, validation, resumable local runs, submitit job arrays, index."""

from __future__ import annotations

import csv
import json
import re

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
    ([], "runs: expected a non-empty list"),
])
def test_bad_grids_are_refused_before_running(tmp_path, root, runs, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        g.load_grid(_grid_file(tmp_path, runs), root)


GRID_FAULTS = {
    "empty axis": ({"runs": [{"notebook": NB, "parameters": {"seed": [], "n_instances": 20}}]},
                   r"runs\[0\]\.parameters\.seed: an empty list sweeps no value"),
    "parameters a list": ({"runs": [{"notebook": NB, "parameters": ["seed", 1]}]},
                          r"runs\[0\]\.parameters: expected a mapping of parameter names to values"),
    "name null": ({"name": None}, r"name: expected a folder name .*got None"),
    "name a path": ({"name": "../elsewhere"}, r"name: expected a folder name .*got '\.\./elsewhere'"),
    "max_parallel a word": ({"max_parallel": "two"}, r"max_parallel: expected a whole number >= 1 .*'two'"),
    "max_parallel zero": ({"max_parallel": 0}, r"max_parallel: expected a whole number >= 1 .*got 0"),
    "profiles a string": ({"runs": [{"notebook": NB, "profiles": "pocket-micro"}]},
                          r"runs\[0\]\.profiles: expected a list of distinct profile .*got 'pocket-micro'"),
    "profiles null": ({"runs": [{"notebook": NB, "profiles": None}]}, r"runs\[0\]\.profiles: .*got None"),
    "slurm a list": ({"slurm": ["gpu"]}, r"slurm: expected a mapping of slurm settings"),
    "slurm memory": ({"slurm": {"mem_gb": "lots"}}, r"slurm\.mem_gb: expected a number of GB > 0, got 'lot"),
    "slurm minutes": ({"slurm": {"timeout_min": 1.5}}, r"slurm\.timeout_min: expected a whole number"),
    "run without notebook": ({"runs": [{"parameters": {"seed": [0]}}]}, r"runs\[0\]\.notebook: missing"),
    "run not a mapping": ({"runs": [NB]}, r"runs\[0\]: expected a mapping with a `notebook`"),
}


@pytest.mark.parametrize("fault", list(GRID_FAULTS))
def test_grid_file_faults_name_the_file_and_the_key(fault, tmp_path, root, capsys, monkeypatch):
    """Each fault of a grid document is one clear line from `moir grid` naming the file, the key and what
    it expects, before any notebook runs (no traceback, no run directory)."""
    from moir_lib import cli

    document, message = GRID_FAULTS[fault]
    path = tmp_path / "grid.yaml"
    good = {"name": "t", "runs": [{"notebook": NB, "parameters": {"n_instances": 20}}]}
    path.write_text(yaml.safe_dump({**good, **document}))
    monkeypatch.chdir(root)
    code = cli.main(["grid", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"moir grid: error: {path}: ") and len(err.splitlines()) == 1, err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_grid_file_faults_are_reported_together(tmp_path, root):
    """One pass over the document: every faulty key at once, not the first one only."""
    runs = [{"notebook": NB, "profiles": "pocket"}, {"parameters": []}]
    path = _grid_file(tmp_path, runs, max_parallel="x")
    with pytest.raises(ValueError) as err:
        g.load_grid(path, root)
    found = re.findall(r"(max_parallel|runs\[0\]\.profiles|runs\[1\]\.notebook|runs\[1\]\.parameters):",
                       str(err.value))
    assert found == ["max_parallel", "runs[0].profiles", "runs[1].notebook", "runs[1].parameters"], err.value


def test_a_notebook_parameter_fault_names_the_grid_file_and_run(tmp_path, root):
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"n_instances": 20}},
                                 {"notebook": NB, "parameters": {"seed": "abc"}}])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: runs\[1\]: parameter 'seed' expects int"):
        g.load_grid(path, root)


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
