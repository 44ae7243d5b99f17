"""Run chapters with papermill and build the book from executed runs.

:func:`run_notebook` executes one chapter into a run directory, after
:func:`resolve_parameters` checks every parameter name against the notebook's ``parameters``
cell (``moir run``; the commands live in :mod:`moir_lib.cli.runs`).

:func:`build_book` (``moir book [--from RUN_DIR]``) builds the Jupyter Book (1.x) into
``_build/html`` from executed notebooks: without ``--from`` it first executes every chapter of
``_toc.yml`` on its default (pocket) parameters into ``runs/book/``. The book
sources and the executed copies are staged in ``_build/stage`` so the committed
notebooks stay output-free and the book never re-executes anything.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moir_lib.results import SUMMARY_NAME
from moir_lib.widgets import headless_kernels

__all__ = [
    "notebook_parameters",
    "resolve_parameters",
    "run_notebook",
    "toc_chapters",
    "collect_executed",
    "build_book",
    "ChapterFailed",
]

log = logging.getLogger(__name__)

BOOK_FILES = ("_config.yml", "_toc.yml")
#: where :func:`build_book` writes the wall time of every phase (under ``<path_output>/_build``)
TIMINGS_NAME = "timings.json"
BOOK_DIR = "book"
GENERATED = "_generated"


class ChapterFailed(RuntimeError):
    """A notebook cell raised; carries the cell's error and the executed copy's path."""


# --------------------------------------------------------------------------- parameters


def notebook_parameters(notebook: str | Path) -> dict[str, dict[str, Any]]:
    """The ``parameters`` cell of ``notebook``: name -> {default, type, help}."""
    import papermill as pm

    path = Path(notebook)
    if not path.is_file():
        raise FileNotFoundError(f"notebook not found: {path}")
    found = pm.inspect_notebook(str(path))
    if not found:
        raise ValueError(f"{path} has no cell tagged 'parameters' (papermill needs one)")
    return {
        name: {"default": p["default"], "help": p["help"],
               "type": NONE_DEFAULT_TYPES.get(name, "NoneType") if p["default"].strip() == "None"
               else _literal_type(p["default"], p["inferred_type_name"])}
        for name, p in found.items()
    }


#: the type of a parameter whose default is None (None keeps its documented meaning; any other value
#: must have this type, so a typo fails here, not in a cell mid-run)
NONE_DEFAULT_TYPES: dict[str, str] = {"context_templates": "int", "coverage_k": "int",
                                      "domain_corpora": "dict", "mixture": "dict"}


def _literal_type(default: str, inferred: str) -> str:
    """Type name of a default's literal (``1_000`` is an int, which papermill's inference misses)."""
    try:
        return type(ast.literal_eval(default)).__name__
    except (ValueError, SyntaxError):
        return inferred


def _parse_value(text: str) -> Any:
    """Command-line text to a Python value: literals (1, 0.5, [9, 14], True) else a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return text


def _coerce(name: str, value: Any, kind: str) -> Any:
    """Match the default's type where that is unambiguous; refuse obvious mismatches."""
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "str" and not isinstance(value, str):
        return str(value)
    expected = {"int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(kind)
    if expected and not isinstance(value, expected):
        raise ValueError(f"parameter {name!r} expects {kind}, got {value!r}")
    if kind == "int" and isinstance(value, bool):
        raise ValueError(f"parameter {name!r} expects int, got {value!r}")
    return value


def resolve_parameters(notebook: str | Path, overrides: list[tuple[str, str]] | dict[str, Any],
                       profile: str | None = None) -> dict[str, Any]:
    """Validate ``overrides`` against the notebook's parameters cell; return typed values.

    A name the cell does not define is an error listing the valid ones, raised before
    anything executes (a typo must never become a silent new variable).
    """
    declared = notebook_parameters(notebook)
    items = list(overrides.items()) if isinstance(overrides, dict) else list(overrides)
    if profile is not None:
        items.append(("profile", profile))
    unknown = sorted({name for name, _ in items if name not in declared})
    if unknown:
        valid = ", ".join(f"{n} (default {d['default']})" for n, d in declared.items())
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for {Path(notebook).name}; "
                         f"valid parameters: {valid}")
    resolved: dict[str, Any] = {}
    for name, raw in items:
        value = _parse_value(raw) if isinstance(raw, str) else raw
        if value is None and "None" in declared[name].get("help", ""):
            resolved[name] = None  # the parameter's comment documents what None means
        else:
            resolved[name] = _coerce(name, value, declared[name]["type"])
    if profile is not None:
        _check_profile(profile)
    return resolved


def _check_profile(profile: str) -> None:
    """Refuse an unknown profile name early (profiles may also be given as a YAML path)."""
    if profile.endswith((".yaml", ".yml")) and Path(profile).is_file():
        return
    from moir_lib import profiles

    names = profiles.list_profiles()
    if profile not in names:
        raise ValueError(f"unknown profile {profile!r}; available: {', '.join(names)}")


# --------------------------------------------------------------------------- running


def run_notebook(notebook: str | Path, out_dir: str | Path, parameters: dict[str, Any] | None = None,
                 progress: bool = True) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/<name>.ipynb``.

    ``out_dir`` (absolute) is injected as the ``out_dir`` parameter when the notebook
    declares one, so every chapter writes its ``summary.json`` beside its executed copy.
    Raises :class:`ChapterFailed` with the failing cell's error.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src = Path(notebook).resolve()
    out = Path(out_dir).resolve()
    params = dict(parameters or {})
    if "out_dir" in notebook_parameters(src):
        params.setdefault("out_dir", str(out))
    out.mkdir(parents=True, exist_ok=True)
    executed = out / src.name
    log.info("executing %s -> %s with %s", src.name, executed, params)
    try:
        with headless_kernels():  # explorers render static views: no widget messages to wait on
            pm.execute_notebook(str(src), str(executed), parameters=params, cwd=str(src.parent),
                                progress_bar=progress, kernel_name="python3")
    except PapermillExecutionError as err:
        raise ChapterFailed(f"{src.name}: cell {err.exec_count} failed with {err.ename}: {err.evalue} "
                            f"(executed copy: {executed})") from err
    return executed


# --------------------------------------------------------------------------- hygiene


def notebook_problems(notebook: str | Path) -> list[str]:
    """Why a committed notebook is not clean: outputs, execution counts, no parameters cell."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has an execution count")
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        problems.append("no cell tagged 'parameters'")
    return problems


def strip_outputs(notebook: str | Path) -> None:
    """Remove outputs and execution counts in place (what `moir nbcheck --strip` does)."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, str(notebook))


# --------------------------------------------------------------------------- the book


@dataclass(frozen=True)
class Executed:
    """One executed chapter: its notebook copy and (when written) its summary."""

    chapter: str
    notebook: Path
    summary: dict[str, Any] | None


def toc_chapters(root: str | Path = ".") -> list[str]:
    """Notebook chapters listed in ``_toc.yml`` (e.g. ``notebooks/04_g_cancellation``), in order."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    files: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return [f for f in files if f.startswith("notebooks/")]


def collect_executed(run_dir: str | Path, chapters: list[str], allow_missing: bool = False) -> list[Executed]:
    """Find each chapter's executed notebook under ``run_dir`` (exactly one per chapter).

    A chapter without one is an error, unless ``allow_missing`` (then it is left out).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    found, missing = [], []
    for chapter in chapters:
        name = Path(chapter).name + ".ipynb"
        hits = sorted(p for p in run_dir.rglob(name) if ".ipynb_checkpoints" not in p.parts)
        if not hits:
            missing.append(name)
            continue
        if len(hits) > 1:
            raise ValueError(f"{len(hits)} executed copies of {name} under {run_dir}: "
                             f"{', '.join(map(str, hits))}; point --from at one run")
        check_executed(hits[0], chapter)
        summary_path = hits[0].parent / SUMMARY_NAME
        try:
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
        except ValueError as exc:
            raise ValueError(f"{summary_path} is damaged ({exc}): rerun {chapter}") from None
        found.append(Executed(chapter, hits[0], summary))
    if missing and not allow_missing:
        raise FileNotFoundError(f"{run_dir} lacks executed chapters: {', '.join(missing)} "
                                f"(--allow-missing builds the book without them)")
    return found


def check_executed(notebook: Path, chapter: str) -> None:
    """``ValueError`` naming ``notebook`` when it cannot be read (truncated), was executed from another
    chapter's source (papermill records the input), or failed (a cell raised): the book shows only
    chapters that ran to their end."""
    import nbformat

    try:
        nb = nbformat.read(str(notebook), as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable notebook is damage
        raise ValueError(f"executed notebook {notebook} is damaged ({type(exc).__name__}): rerun "
                         f"{chapter} (moir run {chapter}.ipynb)") from None
    source = (nb.metadata.get("papermill") or {}).get("input_path")
    if source and Path(source).stem != Path(chapter).name:
        raise ValueError(f"executed notebook {notebook} was run from {source}, not {chapter}: point --from "
                         f"at a run of this book's chapters")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    failed = (nb.metadata.get("papermill") or {}).get("exception") or any(
        o.get("output_type") == "error" for o in outputs)
    if failed:
        raise ValueError(f"executed notebook {notebook} holds a failed run (a cell raised): rerun {chapter} "
                         f"before building the book from it")


def _drop_chapters(node: Any, keep: set[str]) -> Any:
    """``_toc.yml`` without the notebook entries not in ``keep`` (and parts left empty)."""
    if isinstance(node, list):
        items = [_drop_chapters(n, keep) for n in node]
        return [n for n in items if n is not None]
    if isinstance(node, dict):
        if str(node.get("file", "")).startswith("notebooks/") and node["file"] not in keep:
            return None
        out = {k: _drop_chapters(v, keep) for k, v in node.items()}
        if "chapters" in node and not out["chapters"] and "file" not in node:
            return None
        return out
    return node


def _provenance_table(run_dir: Path, executed: list[Executed], chapters: list[str]) -> str:
    rows = ["| chapter | profile | commit | run at | summary |", "|---|---|---|---|---|"]
    for chapter in sorted(set(chapters) - {e.chapter for e in executed}):
        rows.append(f"| {Path(chapter).name} | — | — | not run | left out of this build |")
    for e in executed:
        s = e.summary or {}
        profile = (s.get("parameters") or {}).get("profile", "—")
        rows.append(f"| {Path(e.chapter).name} | {profile} | `{s.get('git_hash', 'unknown')[:12]}` "
                    f"| {s.get('created', '—')} | {'yes' if s else 'missing'} |")
    return f"Numbers in this build come from the run directory `{run_dir}`:\n\n" + "\n".join(rows) + "\n"


def claims_table(executed: list[Executed]) -> str:
    """The book's claims table (Markdown): every claim a chapter judged (its ``summary.json`` headline's
    ``claims``: :func:`moir_lib.chapters.verdicts.claim_records`), the pocket measurement with its 95 %
    interval, the verdict and the chapter that shows it; generated from the runs, never typed."""
    rows = ["| claim of the paper | pocket measurement (95 % interval) | verdict | chapter |",
            "|---|---|---|---|"]
    for e in executed:
        for c in ((e.summary or {}).get("headline") or {}).get("claims") or []:
            value, lo, hi = c.get("value"), c.get("lo"), c.get("hi")
            if value is None:
                measured = f"{c['measured']}: not measured"
            elif lo is None or hi is None:
                measured = f"{c['measured']}: {value:+.3f}"
            else:
                measured = f"{c['measured']}: {value:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            verdict = c["verdict"] + ("" if c.get("gate_ok", True) else " (edits miss the gate)")
            if c.get("n_to_resolve"):
                verdict += f"; ≈{c['n_to_resolve']} items would resolve it"
            rows.append(f"| {c['claim']} | {measured} | {verdict} | {{doc}}`/{e.chapter}` |")
    if len(rows) == 2:
        return "*No chapter of this build judged a claim.*\n"
    return "\n".join(rows) + "\n"


def stage_book(root: Path, stage: Path, run_dir: Path, executed: list[Executed]) -> None:
    """Copy book sources + executed notebooks into ``stage`` and write generated includes."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in BOOK_FILES:
        shutil.copy2(root / name, stage / name)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    (stage / "_toc.yml").write_text(yaml.safe_dump(_drop_chapters(toc, {e.chapter for e in executed}),
                                                   sort_keys=False))
    shutil.copytree(root / BOOK_DIR, stage / BOOK_DIR, ignore=shutil.ignore_patterns(GENERATED))
    (stage / "notebooks").mkdir()
    for e in executed:
        shutil.copy2(e.notebook, stage / f"{e.chapter}.ipynb")
    _vendor_mathjax(stage / "_static" / "mathjax")
    generated = stage / BOOK_DIR / GENERATED
    generated.mkdir()
    (generated / "provenance.md").write_text(_provenance_table(run_dir, executed, toc_chapters(root)))
    (generated / "claims.md").write_text(claims_table(executed))
    for name, text in _generated_pages(root).items():
        (generated / name).write_text(text)


def _vendor_mathjax(dest: Path) -> None:
    """Copy MathJax 3 (CommonHTML + its fonts) from the ``django-static-mathjax`` wheel so the
    book typesets equations without internet; ``_config.yml`` points ``mathjax_path`` here."""
    import mathjax

    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    dest.mkdir(parents=True)
    shutil.copy2(es5 / "tex-chtml.js", dest / "tex-chtml.js")
    fonts = Path("output") / "chtml" / "fonts" / "woff-v2"
    shutil.copytree(es5 / fonts, dest / fonts)


def _generated_pages(root: Path) -> dict[str, str]:
    """Markdown includes computed at build time by the library (name -> text).

    ``pocket_report.md``: the pocket model's quality report (``moir pocket report``), kept beside the
    model's cache entry as ``report.json`` and measured again when its
    :func:`~moir_lib.experiments.editability.report_key` (editing profile, code, sizes) changed. Its
    editability gate reads the editing points the chapters computed (the machine-wide results cache).
    A model not built on this machine (a book built elsewhere from executed runs with ``--from``) says
    so instead of being trained.
    """
    return {"pocket_report.md": _pocket_report("pocket")}


def _pocket_report(variant: str) -> str:
    from moir_lib.cache import entry_dir
    from moir_lib.pocket.build import cache_key, verify
    from moir_lib.pocket.report import markdown_table, measure, write
    from moir_lib.pocket.variants import get_variant

    entry = entry_dir("pocket", cache_key(get_variant(variant)))
    if verify(entry) is None:
        return (f"*The `{variant}` pocket model is not built on the machine that built this book: "
                f"run `moir pocket report --variant {variant}` to build and measure it.*\n")
    from moir_lib.experiments.editability import add_to_report, report_key

    cached = entry / "report.json"
    report = json.loads(cached.read_text()) if cached.is_file() else {}
    if report.get("report_key") != report_key(variant):  # another profile, code, or a partial report
        report = add_to_report(measure(variant))
        write(report, cached, None)
    return markdown_table(report)


#: chapters whose editing points the pocket report's editability gate reads: it starts once they are
#: done, or earlier when a worker has nothing else to do (it then computes or waits for the points
#: they have not stored yet; the points are the same whoever computes them)
REPORT_AFTER = ("notebooks/01_diagnosis", "notebooks/05_editing")
#: chapters with the longest editing grids, longest first: they start first, and a worker left with
#: nothing else to do runs a helper copy of one still running (its lab shares the grid's runs)
HELPED = ("notebooks/05_editing", "notebooks/01_diagnosis")


def default_jobs() -> int:
    """Chapters executed side by side: one per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def execute_book(root: Path, run_dir: Path, chapters: list[str], jobs: int = 1,
                 report: bool = True) -> dict[str, dict[str, Any]]:
    """Execute ``chapters`` into ``run_dir/<name>`` with ``jobs`` worker processes and (``report``)
    measure the pocket model's report, whose editability gate reads the points of the chapters of
    :data:`REPORT_AFTER` (:func:`_extra_tasks` says when it starts). Returns per task its wall time and,
    for the report, its phases.

    Every task runs on one torch thread whatever ``jobs`` is, so results equal a serial run's (``jobs=1``)
    up to float32 rounding in a few scores, such as Fluency*, whose kernels may round by memory alignment
    in another process; two tasks needing one cached C, model or editing run wait for one another.
    The chapters of :data:`HELPED` start first; once a worker has nothing else to do, it executes a
    copy of the longest one still running into a scratch directory (a *helper*): both labs walk the
    same grid, each computing the runs the other has not taken (:meth:`Lab.run_all
    <moir_lib.experiments.Lab.run_all>`), so each run is still computed once, on one thread. A
    failed chapter stops the book with its error; a failed helper only leaves its share to the chapter.
    """
    import concurrent.futures as cf
    import multiprocessing

    order = sorted(chapters, key=lambda c: HELPED.index(c) if c in HELPED else len(HELPED))  # stable
    waiting = set(REPORT_AFTER) & set(chapters)
    done: dict[str, dict[str, Any]] = {}
    ctx = multiprocessing.get_context("spawn")
    scratch = Path(tempfile.mkdtemp(prefix="moir-helpers-"))
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx, initializer=_one_thread) as pool:
        running = {pool.submit(_execute_chapter, root / f"{c}.ipynb", run_dir / Path(c).name): c
                   for c in order}
        helped: set[str] = set()
        report_pending = report
        while running:
            for task in _extra_tasks(list(running.values()), jobs, report_pending, waiting, helped):
                if task == "pocket report":
                    running[pool.submit(_measure_report, "pocket")] = task
                    report_pending = False
                else:
                    c = task.removesuffix(" helper")
                    helped.add(c)
                    running[pool.submit(_execute_chapter, root / f"{c}.ipynb", scratch / Path(c).name,
                                        True)] = task
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                try:
                    done[name] = future.result()  # a failed chapter raises ChapterFailed here
                except Exception as exc:
                    if not name.endswith(" helper"):
                        raise
                    log.warning("%s failed (the chapter computes its share): %s", name, exc)
                    continue
                log.info("%s done in %.0f s", name, done[name]["wall_s"])
                waiting.discard(name)
        if report_pending:
            done["pocket report"] = pool.submit(_measure_report, "pocket").result()
    shutil.rmtree(scratch, ignore_errors=True)
    return done


def _extra_tasks(running: list[str], jobs: int, report: bool, waiting: set[str], helped: set[str]
                 ) -> list[str]:
    """What to add to the ``running`` tasks (chapters submitted, queued or not): the pocket report
    (``report``: not yet submitted) once the chapters it ``waiting`` for are done or a worker is idle,
    then, while a worker is still idle, a helper of each :data:`HELPED` chapter running and not yet
    ``helped``, longest first."""
    tasks, busy = [], len(running)
    if report and (not waiting or busy < jobs):
        tasks.append("pocket report")
        busy += 1
    for c in HELPED:
        if busy < jobs and c in running and c not in helped:
            tasks.append(f"{c} helper")
            busy += 1
    return tasks


def _one_thread() -> None:
    """Worker initialiser: one torch thread in the worker and in the kernels it starts."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def _execute_chapter(notebook: Path, out: Path, helper: bool = False) -> dict[str, Any]:
    """Execute ``notebook`` into ``out``; a ``helper``'s record keeps the phases of its summary."""
    t0 = time.perf_counter()
    run_notebook(notebook, out, progress=False)
    record: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
    if helper:
        summary = out / "summary.json"
        record["timings"] = json.loads(summary.read_text()).get("timings", {}) if summary.is_file() else {}
    return record


def _measure_report(variant: str) -> dict[str, Any]:
    from moir_lib import timings

    timings.reset()  # a pool worker may have run another task before
    t0 = time.perf_counter()
    with timings.phase("pocket report"):
        _pocket_report(variant)
    return {"wall_s": time.perf_counter() - t0, "timings": timings.snapshot()}


def build_book(root: str | Path = ".", run_dir: str | Path | None = None,
               path_output: str | Path | None = None, execute: bool = True,
               allow_missing: bool = False, jobs: int | None = None) -> Path:
    """Build the HTML book; return ``<path_output>/_build/html``.

    ``execute`` builds the pocket model when needed and runs every chapter on its defaults into
    ``run_dir`` (default ``runs/book``) with ``jobs`` processes (default :func:`default_jobs`;
    :func:`execute_book`), then the pocket report; otherwise ``run_dir`` must already hold the
    executed chapters. The wall time of every phase goes to ``<path_output>/_build/timings.json``.
    Warnings are errors (``-W -n``): a broken cross-reference fails the build.
    """
    root = Path(root).resolve()
    path_output = Path(path_output).resolve() if path_output else root
    run_dir = Path(run_dir).resolve() if run_dir else root / "runs" / "book"
    chapters = toc_chapters(root)
    record: dict[str, Any] = {"jobs": None, "tasks": {}, "phases": {}}
    if execute:
        from moir_lib.pocket import build

        t0 = time.perf_counter()
        build("pocket")
        record["phases"]["pocket build"] = time.perf_counter() - t0
        record["jobs"] = jobs or default_jobs()
        t0 = time.perf_counter()
        record["tasks"] = execute_book(root, run_dir, chapters, record["jobs"])
        record["phases"]["chapters and report"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    executed = collect_executed(run_dir, chapters, allow_missing=allow_missing)
    stage = path_output / "_build" / "stage"
    stage_book(root, stage, run_dir, executed)
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(stage), "--path-output",
           str(path_output), "--builder", "html", "-W", "-n", "--keep-going"]
    log.info("building the book: %s", " ".join(cmd))
    result = subprocess.run(cmd, text=True, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}):\n"
                           f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
    html = path_output / "_build" / "html"
    for page in html.rglob("*.html"):
        _dedupe_head_scripts(page)
    record["phases"]["HTML build"] = time.perf_counter() - t0
    record["chapters"] = {Path(e.chapter).name: (e.summary or {}).get("timings", {}) for e in executed}
    (path_output / "_build" / TIMINGS_NAME).write_text(json.dumps(record, indent=2) + "\n")
    log.info("book built: %s", html / "index.html")
    return html


_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S)
_SRC = re.compile(r'src="([^"?]+)')


def _dedupe_head_scripts(page: Path) -> None:
    """Drop repeated ``<script>`` tags from a page's ``<head>``.

    jupyter-book 1.0.4 emits some head scripts twice (sphinx-thebe's ``const THEBE_JS_URL``,
    sphinx-togglebutton's config, MathJax): the second ``const`` is a JavaScript SyntaxError
    and a second MathJax load throws. Scripts are the same when their ``src`` (ignoring the
    cache-busting query) or, for inline ones, their body is the same.
    """
    text = page.read_text()
    head_end = text.find("</head>")
    if head_end < 0:
        return
    seen: set[str] = set()

    def keep_first(match: re.Match[str]) -> str:
        src = _SRC.search(match.group(1))
        key = src.group(1) if src else match.group(2).strip()
        if not key or key not in seen:
            seen.add(key)
            return match.group(0)
        return ""

    head = _SCRIPT.sub(keep_first, text[:head_end])
    if len(head) != head_end:
        page.write_text(head + text[head_end:])
