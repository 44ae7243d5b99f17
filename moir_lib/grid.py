"""Parameter grids of papermill runs: ``moir grid GRID.yaml [--executor local|slurm]``.

A grid file names notebooks, profiles and parameter lists; their Cartesian product is a set of
runs, each executed by :func:`moir_lib.runs.run_notebook` into ``<out>/<run_id>/``. A run whose
``summary.json`` exists is skipped, so an interrupted grid resumes without redoing finished
work. Every run writes ``run.json`` (parameters, status, wall time): ``running`` as it starts, and
its outcome once it ends, a finished run's published with its notebook and before its summary, so a
run directory with a summary never holds a record that says it is running; ``index.csv`` (one row per
run) is rebuilt from those files. ``--executor slurm`` submits the pending runs as one job array
through submitit (partition, GPUs, time, memory from the grid's ``slurm`` section).

The pocket organisms the runs need (:func:`pocket_builds`: each run on a pocket profile, its ``organisms``
or the notebook's default) are built before any of them starts, each build on its recipe's fixed
thread count, so that no two chapter tasks build at once and each build's weights are the ones a lone
build gives: locally side by side where the cores allow (:func:`moir_lib.pocket.builds.build_side_by_side`);
with ``--executor slurm`` as one job array of their own (a task per organism, ``cpus_per_task`` at least
the recipe's threads, no GPU), the runs' array submitted after it with an ``afterok`` dependency on it
(a failed build cancels them), or, on submitit's local and debug executors, which have no dependencies,
once it has finished. A build task records what it built in ``_builds/<variant>-<organism>.json`` (status,
the weights' SHA-256, precision, build time, host). On a cluster, ``$MOIR_CACHE`` must be one folder every
node sees, and nodes of other CPU kinds resolve another training precision (another cache key): set
``$MOIR_POCKET_PRECISION`` for them all.

Grid file::

    name: smoke
    max_parallel: 1                 # local workers / slurm array parallelism
    slurm: {partition: gpu, gpus_per_node: 1, timeout_min: 240, mem_gb: 60, cpus_per_task: 4}
    runs:
      - notebook: notebooks/04_g_cancellation.ipynb
        profiles: [pocket]          # optional; each sets the notebook's `profile`
        parameters: {seed: [0, 1], n_instances: 50}   # lists are swept, scalars fixed
      - notebook: notebooks/06_causal_tracing.ipynb
        profiles: [pocket]
        parameters: {organisms: [[0], [1], [2]]}      # one run (an array task) per pocket organism

Before anything runs, :func:`check_grid` checks the whole document in one pass (each key of the grid,
``slurm`` and every run against its schema: what it is, what it must be) and reports every fault at
once, naming the file and the key; each parameter is then checked against its notebook.

``moir book --from <out>`` merges the runs of a chapter split by organism into one run over them all
(:mod:`moir_lib.book.merge`).
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moir_lib.files import atomic_write, write_json
from moir_lib.results import SUMMARY_NAME

__all__ = ["GridBuild", "GridRun", "check_grid", "execute_build", "execute_run", "load_grid", "pending",
           "pocket_builds", "run_grid", "write_index"]

log = logging.getLogger(__name__)

RUN_RECORD = "run.json"
INDEX_NAME = "index.csv"
#: where the build tasks' records go, under the grid's output
BUILDS_DIR = "_builds"


@dataclass(frozen=True)
class GridRun:
    """One point of the grid: a notebook, an optional profile and its parameters."""

    run_id: str
    notebook: str
    profile: str | None
    parameters: dict[str, Any] = field(default_factory=dict)

    def out_dir(self, root: Path) -> Path:
        return root / self.run_id


@dataclass(frozen=True)
class GridBuild:
    """One pocket organism the grid's runs need, built before them."""

    variant: str
    organism: int

    @property
    def build_id(self) -> str:
        return f"{self.variant}-{self.organism}"

    def record_path(self, root: Path) -> Path:
        return root / BUILDS_DIR / f"{self.build_id}.json"


@dataclass(frozen=True)
class Grid:
    name: str
    runs: list[GridRun]
    max_parallel: int = 1
    slurm: dict[str, Any] = field(default_factory=dict)


def _slug(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def _run_id(notebook: str, profile: str | None, params: dict[str, Any]) -> str:
    parts = [Path(notebook).stem] + ([profile] if profile else [])
    parts += [f"{k}={_slug(v)}" for k, v in sorted(params.items())]
    return "__".join(parts)


def _read_yaml(path: Path) -> dict[str, Any]:
    """The grid file as a mapping; a syntax error names the file, line and column."""
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"{where}: not valid YAML ({problem})") from None
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a grid file is a mapping (name, runs, ...), got {type(spec).__name__}")
    return spec


# --------------------------------------------------------------------------- the grid file's schema


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_count(value: Any, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_amount(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value) is not None


def _is_profiles(value: Any) -> bool:
    return (isinstance(value, list) and bool(value) and all(_is_text(p) for p in value)
            and len(set(value)) == len(value))


def _is_parameters(value: Any) -> bool:
    return isinstance(value, dict) and all(_is_text(k) for k in value)


#: key -> (check, what is expected) of the grid file (``runs``: each entry, :data:`_RUN`; ``slurm``:
#: :data:`_SLURM`); every key may be left out but ``runs`` and a run's ``notebook``
_GRID: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_is_name, "a folder name (letters, digits, '.', '_', '+', '-'; default: the file's stem)"),
    "max_parallel": (_is_count, "a whole number >= 1 (local workers / slurm array parallelism; default 1)"),
    "slurm": (lambda v: isinstance(v, dict), "a mapping of slurm settings (partition, timeout_min, ...)"),
    "runs": (lambda v: isinstance(v, list) and bool(v),
             "a non-empty list of {notebook, profiles, parameters} entries"),
}
_RUN: dict[str, tuple[Callable[[Any], bool], str]] = {
    "notebook": (_is_text, "a notebook path from the repository root, e.g. notebooks/05_editing.ipynb"),
    "profiles": (_is_profiles, "a list of distinct profile names or paths, e.g. [pocket]"),
    "parameters": (_is_parameters, "a mapping of parameter names to values (a list is swept: "
                                   "{seed: [0, 1]}; a one-value sweep of a list is [[a, b]])"),
}
_SLURM: dict[str, tuple[Callable[[Any], bool], str]] = {
    "partition": (_is_text, "a partition name"),
    "account": (_is_text, "an account name"),
    "qos": (_is_text, "a QOS name"),
    "gpus_per_node": (lambda v: _is_count(v, 0), "a whole number >= 0"),
    "cpus_per_task": (_is_count, "a whole number >= 1"),
    "timeout_min": (_is_count, "a whole number of minutes >= 1"),
    "mem_gb": (_is_amount, "a number of GB > 0"),
}
_REQUIRED = {"": ("runs",), "runs[]": ("notebook",)}


def _problems(mapping: dict[str, Any], schema: dict[str, tuple[Callable[[Any], bool], str]], where: str,
              required: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with ``mapping`` under ``schema``: unknown keys, missing ones, values of the wrong kind
    (each as ``<where>.<key>: expected ..., got ...``)."""
    prefix = f"{where}." if where else ""
    extra = sorted(map(str, set(mapping) - set(schema)))
    out = [f"{where or 'the grid'}: unknown key(s) {', '.join(extra)}; valid: {', '.join(sorted(schema))}"
           ] if extra else []
    out += [f"{prefix}{key}: missing; expected {schema[key][1]}" for key in required if key not in mapping]
    for key, (ok, expected) in schema.items():
        if key in mapping and not ok(mapping[key]):
            out.append(f"{prefix}{key}: expected {expected}, got {mapping[key]!r}")
    return out


def check_grid(spec: dict[str, Any], path: str | Path) -> None:
    """One pass over a grid file's document: every key of every level (the grid, ``slurm``, each run and
    its parameter axes) against the schema above; one ``ValueError`` naming the file and each faulty key
    with what it expects, before any notebook is read."""
    problems = _problems(spec, _GRID, "", _REQUIRED[""])
    if isinstance(spec.get("slurm"), dict):
        problems += _problems(spec["slurm"], _SLURM, "slurm")
    runs = spec.get("runs") if isinstance(spec.get("runs"), list) else []
    for i, entry in enumerate(runs):
        where = f"runs[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping with a `notebook`, got {entry!r}")
            continue
        problems += _problems(entry, _RUN, where, _REQUIRED["runs[]"])
        if _is_parameters(entry.get("parameters")):
            problems += [f"{where}.parameters.{name}: an empty list sweeps no value; give at least one value "
                         f"(a one-value sweep of a list is [[a, b]])"
                         for name, axis in entry["parameters"].items() if axis == []]
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))


def load_grid(path: str | Path, root: str | Path = ".") -> Grid:
    """Read, check (:func:`check_grid`) and expand a grid file; every parameter is validated against its
    notebook first."""
    from moir_lib.runs import resolve_parameters

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"grid file not found: {path}")
    spec = _read_yaml(path)
    check_grid(spec, path)
    runs: list[GridRun] = []
    for i, entry in enumerate(spec["runs"]):
        notebook = entry["notebook"]
        nb_path = Path(root) / notebook
        if not nb_path.is_file():
            raise FileNotFoundError(f"{path}: runs[{i}].notebook: {nb_path} not found")
        params = entry.get("parameters", {})
        names = list(params)
        axes = [v if isinstance(v, list) else [v] for v in params.values()]
        for profile in entry.get("profiles", [None]):
            for combo in itertools.product(*axes):
                point = dict(zip(names, combo, strict=True))
                try:
                    resolved = resolve_parameters(nb_path, point, profile=profile)
                except ValueError as exc:
                    raise ValueError(f"{path}: runs[{i}]: {exc}") from None
                resolved.pop("profile", None)
                runs.append(GridRun(_run_id(notebook, profile, point), notebook, profile, resolved))
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: the grid repeats runs: {sorted({i for i in ids if ids.count(i) > 1})}")
    return Grid(spec.get("name", path.stem), runs, spec.get("max_parallel", 1), spec.get("slurm", {}))


def pocket_builds(runs: list[GridRun], root: str | Path = ".") -> list[GridBuild]:
    """The pocket organisms ``runs`` need, sorted: for each run on a pocket profile (its own, else its
    notebook's default), the organisms it names, else its notebook's default ``organisms``, else the
    profile's organism."""
    import ast

    from moir_lib.book.pooled_organisms import declared
    from moir_lib.models import POCKET_SPECS
    from moir_lib.profiles import load_profile
    from moir_lib.runs import ORGANISMS, notebook_parameters

    found: set[tuple[str, int]] = set()
    for run in runs:
        notebook = Path(root) / run.notebook
        default = notebook_parameters(notebook).get("profile")
        name = run.profile or (ast.literal_eval(default["default"]) if default else None)
        if not isinstance(name, str):
            continue
        profile = load_profile(name)
        variant = POCKET_SPECS.get(profile.model)
        if variant is None:
            continue
        organisms = run.parameters.get(ORGANISMS) or declared(notebook) or (profile.organism,)
        found |= {(variant, int(k)) for k in organisms}
    return [GridBuild(v, k) for v, k in sorted(found)]


def pending(grid: Grid, out: Path) -> list[GridRun]:
    """Runs without a ``summary.json`` yet (the resumable part of the grid)."""
    return [r for r in grid.runs if not (r.out_dir(out) / SUMMARY_NAME).is_file()]


def _write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_json(run_dir / RUN_RECORD, record, indent=2)


def execute_run(run: GridRun, out: str, root: str = ".") -> dict[str, Any]:
    """Execute one grid run (locally, or inside a slurm array task) and record its outcome."""
    from moir_lib.runs import ChapterFailed, run_notebook

    run_dir = run.out_dir(Path(out))
    params = dict(run.parameters)
    if run.profile:
        params["profile"] = run.profile
    record = {**asdict(run), "status": "running", "started": time.time(), "host": os.uname().nodename}
    _write_record(run_dir, record)
    t0 = time.perf_counter()

    def finished(staging: Path) -> None:  # published with the run, before its summary
        record.update(status="done" if (staging / SUMMARY_NAME).is_file() else "no-summary",
                      wall_s=round(time.perf_counter() - t0, 2))
        _write_record(staging, record)

    try:
        run_notebook(Path(root) / run.notebook, run_dir, params, progress=False, before_publish=finished)
    except ChapterFailed as err:
        record.update(status="failed", error=str(err), wall_s=round(time.perf_counter() - t0, 2))
        _write_record(run_dir, record)
    except BaseException as err:  # interrupted (Ctrl-C, a lost kernel): the record says so, not "running"
        record.update(status="interrupted", error=f"{type(err).__name__}: {err}",
                      wall_s=round(time.perf_counter() - t0, 2))
        _write_record(run_dir, record)
        raise
    return record


def write_index(grid: Grid, out: Path) -> Path:
    """Rebuild ``index.csv`` from each run's ``run.json`` (one row per grid run)."""
    rows = []
    for run in grid.runs:
        rec_path = run.out_dir(out) / RUN_RECORD
        rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
        summary = run.out_dir(out) / SUMMARY_NAME
        rows.append({
            "run_id": run.run_id,
            "notebook": run.notebook,
            "profile": run.profile or "",
            "parameters": json.dumps(run.parameters, sort_keys=True),
            "status": _status(summary.is_file(), rec),
            "wall_s": rec.get("wall_s", ""),
            "summary": str(summary) if summary.is_file() else "",
        })
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(out / INDEX_NAME, write)


def _status(summarised: bool, record: dict[str, Any]) -> str:
    """A run's status in the index: ``done`` with a summary; else its record's, where a record that says
    ``done`` without a summary (a task killed as its files were published) reads ``interrupted``."""
    if summarised:
        return "done"
    status = record.get("status", "pending")
    return "interrupted" if status == "done" else status


def execute_build(build: GridBuild, out: str) -> dict[str, Any]:
    """Build (or find) one pocket organism (locally, or inside a slurm array task) and record it in
    ``<out>/_builds/<variant>-<organism>.json``; a failed build is recorded, then raised (so that the runs
    depending on it do not start)."""
    from moir_lib.pocket.builds import build_record

    path = build.record_path(Path(out))
    path.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {**asdict(build), "status": "running", "started": time.time(),
                              "host": os.uname().nodename}
    write_json(path, record, indent=2)
    try:
        record.update(build_record(build.variant, build.organism), status="done", finished=time.time())
    except BaseException as err:
        record.update(status="failed", error=f"{type(err).__name__}: {err}", finished=time.time())
        write_json(path, record, indent=2)
        raise
    write_json(path, record, indent=2)
    return record


def run_grid(grid: Grid, out: str | Path, executor: str = "local", max_parallel: int | None = None,
             root: str | Path = ".", slurm_cluster: str | None = None) -> list[dict[str, Any]]:
    """Build the pocket organisms the pending runs of ``grid`` need (:func:`pocket_builds`), then execute
    those runs under ``out``; return the runs' outcomes (their run.json records).

    ``executor="slurm"`` submits the builds as one submitit job array, then the runs as another that
    depends on it, and waits for both; ``slurm_cluster`` passes through to
    ``submitit.AutoExecutor(cluster=...)`` ("local"/"debug" in tests, where the runs are submitted once the
    builds are done). A failed build raises ``RuntimeError`` naming it; no run starts after it. ``out`` is
    locked for the whole grid (:mod:`moir_lib.locks`): a second grid into it is refused.
    """
    from moir_lib.locks import dir_lock_path, exclusive

    if executor not in ("local", "slurm"):
        raise ValueError(f"unknown executor {executor!r}: use local or slurm")
    out = Path(out).resolve()
    with exclusive(dir_lock_path(out), f"grid directory {out}"):
        try:
            return _run_pending(grid, out, executor, max_parallel, str(Path(root).resolve()), slurm_cluster)
        finally:
            write_index(grid, out)


def _run_pending(grid: Grid, out: Path, executor: str, max_parallel: int | None, root: str,
                 slurm_cluster: str | None) -> list[dict[str, Any]]:
    todo = pending(grid, out)
    done = len(grid.runs) - len(todo)
    log.info("grid %s: %d runs, %d already done, %d to run", grid.name, len(grid.runs), done, len(todo))
    if not todo:
        return []
    parallel = max(1, max_parallel or grid.max_parallel)
    builds = pocket_builds(todo, root)
    if executor == "slurm":
        return _run_slurm(grid, out, todo, builds, parallel, root, slurm_cluster)
    _build_locally(builds, str(out), parallel)
    outcomes: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for record in pool.map(lambda r: execute_run(r, str(out), root), todo):
            log.info("%s: %s in %.1f s", record["run_id"], record["status"], record["wall_s"])
            outcomes.append(record)
            write_index(grid, out)
    return outcomes


def _build_locally(builds: list[GridBuild], out: str, parallel: int) -> None:
    """The builds, side by side where the cores allow and at most ``parallel`` at once, then their records."""
    from moir_lib.pocket.builds import build_side_by_side

    for variant in sorted({b.variant for b in builds}):
        try:
            build_side_by_side(variant, [b.organism for b in builds if b.variant == variant], parallel)
        except Exception as err:
            raise RuntimeError(f"the pocket {variant} builds failed ({type(err).__name__}: {err}); no run "
                               f"was started") from err
    for b in builds:
        execute_build(b, out)  # found in the cache now: what each one is


def _executor(grid: Grid, out: Path, cluster: str | None, name: str, parallel: int,
              **overrides: Any) -> Any:
    """A submitit executor with the grid's ``slurm`` settings (``overrides`` of submitit's generic names
    win: ``cpus_per_task``, ``gpus_per_node``, ...; others are slurm's own, passed prefixed)."""
    import submitit

    ex = submitit.AutoExecutor(folder=str(out / "_submitit"), cluster=cluster)
    generic = ("gpus_per_node", "timeout_min", "mem_gb", "cpus_per_task")  # submitit's own names
    settings = {f"slurm_{k}": v for k, v in grid.slurm.items() if k not in generic}
    common = {k: grid.slurm[k] for k in generic if k in grid.slurm}
    ex.update_parameters(name=name, slurm_array_parallelism=parallel, **{**common, **settings, **overrides})
    return ex


def build_resources(grid: Grid, builds: list[GridBuild]) -> dict[str, Any]:
    """What a task of ``builds`` asks for: no GPU, as CPUs at least its recipe's training threads."""
    from moir_lib.pocket.variants import get_variant

    threads = max(get_variant(b.variant).train.threads for b in builds)
    return {"gpus_per_node": 0, "cpus_per_task": max(threads, int(grid.slurm.get("cpus_per_task", 1)))}


def after_builds(build_jobs: list[Any]) -> dict[str, Any]:
    """The slurm settings that hold the runs' array until every build task has succeeded (one ``afterok`` on
    the builds' array job), and cancel it when one fails."""
    array = {str(job.job_id).split("_")[0] for job in build_jobs}
    return {"slurm_dependency": "afterok:" + ":".join(sorted(array)),
            "slurm_additional_parameters": {"kill-on-invalid-dep": "yes"}}


def _run_slurm(grid: Grid, out: Path, todo: list[GridRun], builds: list[GridBuild], parallel: int, root: str,
               cluster: str | None) -> list[dict[str, Any]]:
    """The builds' job array, then the runs' (after it: a slurm dependency, or waiting for it on submitit's
    local and debug executors); the runs' outcomes, a run whose task did not finish recorded as such."""
    waits: dict[str, Any] = {}
    build_jobs: list[Any] = []
    if builds:
        resources = build_resources(grid, builds)
        ex = _executor(grid, out, cluster, f"moir-{grid.name}-builds", parallel, **resources)
        build_jobs = ex.map_array(execute_build, builds, [str(out)] * len(builds))
        log.info("submitted %d build tasks (%s)", len(build_jobs), build_jobs[0].job_id)
        if ex.cluster == "slurm":
            waits = after_builds(build_jobs)
        else:
            _results(build_jobs, builds, out)
    ex = _executor(grid, out, cluster, f"moir-{grid.name}", parallel, **waits)
    jobs = ex.map_array(execute_run, todo, [str(out)] * len(todo), [root] * len(todo))
    log.info("submitted %d array tasks (%s)", len(jobs), jobs[0].job_id if jobs else "-")
    outcomes = []
    for run, job in zip(todo, jobs, strict=True):
        try:
            outcomes.append(job.result())
        except Exception as err:  # its task never ran or died (a cancelled dependency, a lost node)
            outcomes.append({"run_id": run.run_id, "status": "not finished", "error": _last_line(err)})
    if waits:
        _results(build_jobs, builds, out)
    return outcomes


def _results(jobs: list[Any], builds: list[GridBuild], out: Path) -> None:
    """Wait for the build tasks; ``RuntimeError`` naming each that failed and why (its record's error, else
    submitit's)."""
    failed = []
    for build, job in zip(builds, jobs, strict=True):
        try:
            job.result()
        except Exception as err:
            path = build.record_path(out)
            record = json.loads(path.read_text()) if path.is_file() else {}
            failed.append(f"{build.build_id} ({record.get('error') or _last_line(err)})")
    if failed:
        raise RuntimeError(f"pocket build task(s) failed: {', '.join(failed)}; no run was started after them "
                           f"(logs under {out / '_submitit'})")


def _last_line(err: BaseException) -> str:
    """The last line of ``err``'s message (submitit's errors carry the task's whole traceback)."""
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__
