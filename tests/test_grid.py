"""`moir grid`: expansion, validation, resumable local runs, submitit job arrays, index."""

from __future__ import annotations

import csv
import json
import os
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
    outcomes = g.run_grid(grid, out, root=root)
    assert [r["run_id"] for r in outcomes] == [grid.runs[1].run_id]
    assert (out / grid.runs[0].run_id / "summary.json").stat().st_mtime_ns == stamp
    rows = _index(out)
    assert [r["status"] for r in rows] == ["done", "done"]
    assert all(json.loads(r["parameters"])["n_instances"] == 20 for r in rows)
    assert g.run_grid(grid, out, root=root) == []  # nothing left to do


def test_failed_run_is_recorded(tmp_path, root):
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"n_instances": 20, "max_d": 1}}])
    grid = g.load_grid(path, root)
    outcomes = g.run_grid(grid, tmp_path / "out", root=root)
    assert outcomes[0]["status"] == "failed" and "cell" in outcomes[0]["error"]
    assert _index(tmp_path / "out")[0]["status"] == "failed"


def test_slurm_executor_submits_a_job_array(tmp_path, root):
    pytest.importorskip("submitit")
    path = _grid_file(tmp_path, [{"notebook": NB, "parameters": {"seed": [3, 4], "n_instances": 20}}],
                      slurm={"partition": "debug", "timeout_min": 5})
    grid = g.load_grid(path, root)
    outcomes = g.run_grid(grid, tmp_path / "out", executor="slurm", root=root, slurm_cluster="debug")
    assert sorted(r["status"] for r in outcomes) == ["done", "done"]
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


# ------------------------------------------------------------------------- pocket builds as array tasks


def _micro_grid(tmp_path, organisms, **extra):
    params = {"n_prompts": 4, "n_noise": 2, "organisms": organisms}
    run = {"notebook": "notebooks/06_causal_tracing.ipynb", "profiles": ["pocket-micro"],
           "parameters": params}
    return _grid_file(tmp_path, [run], **extra)


def test_the_grids_name_the_pocket_organisms_their_runs_need(tmp_path, root):
    """A run's organisms, else its notebook's default ones, of the pocket variant of its profile (its own,
    else the notebook's default); runs on no pocket model need none."""
    def needs(path):
        grid = g.load_grid(path, root)
        return [(b.variant, b.organism) for b in g.pocket_builds(grid.runs, root)]

    grids = root / "data" / "grids"
    assert needs(grids / "organisms.yaml") == [("pocket", 0), ("pocket", 1), ("pocket", 2)]
    assert needs(grids / "smoke.yaml") == [("micro", 0), ("micro", 1), ("micro", 2)], "the chapters' default"
    assert needs(grids / "paper.yaml") == [], "real models, and a chapter that loads none"
    assert needs(_micro_grid(tmp_path, [[2], [1]])) == [("micro", 1), ("micro", 2)]
    assert g.GridBuild("micro", 2).record_path(tmp_path) == tmp_path / "_builds" / "micro-2.json"


def _pocket_chapter(root):
    """A chapter on the micro pocket model that loads nothing: it says which of its organisms are built."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "pocket-micro"  # model profile\n'
                                       'organisms = [0]  # pocket organisms\n'
                                       'out_dir = "."  # where it writes')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A pocket chapter"), params,
                nbformat.v4.new_code_cell('from moir_lib.pocket import provenance\n'
                                          'from moir_lib.results import write_results\n'
                                          'found = {k: getattr(provenance("micro", k), "weights_sha256", '
                                          'None) for k in organisms}\n'
                                          'write_results(out_dir, "pocket", {"found": found}, {})')]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(root / "notebooks" / "07_pocket.ipynb"))


def test_slurm_builds_the_organisms_as_an_array_before_the_runs(tmp_path, monkeypatch):
    """submitit's local executor (each task a process, as on a cluster): the organism a run needs is built
    by a build task of its own, recorded with its weights, and the run's task starts once it is done: the
    chapter finds it built."""
    pytest.importorskip("submitit")
    from moir_lib.pocket import provenance

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))  # nothing built yet
    _pocket_chapter(tmp_path)
    run = {"notebook": "notebooks/07_pocket.ipynb", "parameters": {"organisms": [[1]]}}
    path = _grid_file(tmp_path, [run], slurm={"timeout_min": 20})
    grid = g.load_grid(path, tmp_path)
    out = tmp_path / "out"
    outcomes = g.run_grid(grid, out, executor="slurm", root=tmp_path, slurm_cluster="local")
    assert [r["status"] for r in outcomes] == ["done"]
    build = json.loads(g.GridBuild("micro", 1).record_path(out).read_text())
    built = provenance("micro", 1)
    assert build["status"] == "done" and build["weights_sha256"] == built.weights_sha256
    assert build["entry"] == str(built.entry) and build["wall_s"] >= build["build_s"] > 0, "built by the task"
    run = out / grid.runs[0].run_id
    assert json.loads((run / g.RUN_RECORD).read_text())["started"] >= build["finished"]
    assert json.loads((run / "summary.json").read_text())["headline"]["found"] == {"1": built.weights_sha256}


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_a_failed_build_starts_no_run(executor, tmp_path, root, monkeypatch):
    """A build that fails (here: a training precision no CPU has, in the environment every task inherits),
    locally or as a task of submitit's local executor, is raised naming it; no run is started after it."""
    if executor == "slurm":
        pytest.importorskip("submitit")
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MOIR_POCKET_PRECISION", "fp7")
    grid = g.load_grid(_micro_grid(tmp_path, [[1]], slurm={"timeout_min": 5}), root)
    out = tmp_path / "out"
    where = "the pocket micro builds failed" if executor == "local" else r"build task\(s\) failed: micro-1"
    with pytest.raises(RuntimeError, match=rf"{where} \(.*precision 'fp7'.*no run was started"):
        g.run_grid(grid, out, executor=executor, root=root, slurm_cluster="local")
    assert not (out / grid.runs[0].run_id).exists()
    assert [r["status"] for r in _index(out)] == ["pending"]
    if executor == "slurm":
        assert json.loads(g.GridBuild("micro", 1).record_path(out).read_text())["status"] == "failed"


def test_on_slurm_the_runs_array_waits_for_the_builds_array(tmp_path, monkeypatch):
    """The sbatch scripts submitit writes: the build tasks ask for the recipe's threads and no GPU, the
    runs' array waits for every build task to succeed (one ``afterok`` on their array) and is cancelled
    otherwise."""
    pytest.importorskip("submitit")
    from types import SimpleNamespace

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    slurm = {"partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1, "timeout_min": 30}
    grid = g.Grid("t", [], slurm=slurm)
    builds = [g.GridBuild("pocket", 0), g.GridBuild("pocket", 1)]

    def script(**overrides):
        ex = g._executor(grid, tmp_path, "slurm", "t", 2, **overrides)
        return ex._executor._make_submission_file_text("CMD", "uid").splitlines()

    build = script(**g.build_resources(grid, builds))
    assert "#SBATCH --cpus-per-task=2" in build and "#SBATCH --gpus-per-node=0" in build
    waits = g.after_builds([SimpleNamespace(job_id="4242_0"), SimpleNamespace(job_id="4242_1")])
    runs = script(**waits)
    assert "#SBATCH --dependency=afterok:4242" in runs and "#SBATCH --kill-on-invalid-dep=yes" in runs
    assert "#SBATCH --partition=gpu" in runs and "#SBATCH --cpus-per-task=1" in runs
    assert "#SBATCH --gpus-per-node=1" in runs and not any("dependency" in line for line in build)
