"""Build the HTML book (``moir book``): execute the chapters, stage them, run jupyter-book.

:func:`build_book` builds the Jupyter Book (1.x) into ``<path_output>/_build/html`` from executed
notebooks: without ``--from`` it first builds the book's pocket organisms when needed
(:mod:`moir_lib.book.pooled_organisms`) and executes every chapter of ``_toc.yml`` on its default (pocket)
parameters and those organisms into ``runs/book/`` (:func:`~moir_lib.book.execute.execute_book`); with
``--from``, a chapter run once per organism (grid array tasks) is merged first
(:func:`~moir_lib.book.merge.merged_runs`). The book sources and the executed copies are staged in
``_build/stage`` (:func:`~moir_lib.book.stage.stage_book`) so the committed notebooks stay output-free
and the book never re-executes anything. jupyter-book builds into a fresh folder, swapped in for
``_build/html`` once the build succeeded: an interrupted build leaves the previous book whole, and
nothing of it (a half-written Sphinx environment) is read by the next one. One build at a time writes
into an output folder: ``<path_output>/_build`` is locked (:mod:`moir_lib.locks`), and a second build
into it is refused, naming the first. A chapter that ran at another commit than the book's is marked
on its page and in the provenance table, or refused (``same_commit``: :mod:`moir_lib.book.commits`).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from moir_lib.book.commits import refuse_foreign
from moir_lib.book.execute import default_jobs, execute_book, quiet_bars
from moir_lib.book.merge import merged_runs
from moir_lib.book.pooled_organisms import VARIANT, book_organisms, build_organisms, executed_organisms
from moir_lib.book.progress import display_for, watch
from moir_lib.book.stage import collect_executed, stage_book, toc_chapters
from moir_lib.locks import dir_lock_path, exclusive
from moir_lib.results import git_hash

__all__ = ["TIMINGS_NAME", "BookSettings", "build_book"]

log = logging.getLogger(__name__)

#: where :func:`build_book` writes the wall time of every phase (under ``<path_output>/_build``)
TIMINGS_NAME = "timings.json"
#: where jupyter-book builds, under ``<path_output>/_build`` (emptied before every build)
SCRATCH = ".next"
#: what jupyter-book leaves beside ``_build/html`` when it builds there directly: cleared as stale
LEFTOVERS = (".doctrees", "jupyter_execute", ".jupyter_cache", "html.old")
#: the jupyter-book output kept for reading when a build fails
LOG_NAME = "jupyter-book.log"
#: where the runs of chapters split by organism are merged, under ``<path_output>/_build``
MERGED = "merged"


@dataclass(frozen=True)
class BookSettings:
    """What a :func:`build_book` runs and stages: the chapters executed (``execute``, with ``jobs``
    processes, on the pocket ``organisms``) or read from executed runs, whether a missing chapter is
    allowed (``allow_missing``), the pages ``includes`` and whether a chapter of another commit is refused
    (``same_commit``); each is described at :func:`build_book`."""

    execute: bool = True
    allow_missing: bool = False
    jobs: int | None = None
    includes: Mapping[str, str] | None = None
    organisms: Sequence[int] | None = None
    same_commit: bool = False


def build_book(root: str | Path = ".", run_dir: str | Path | None = None,
               path_output: str | Path | None = None, settings: BookSettings = BookSettings(),
               stream: TextIO | None = None) -> Path:
    """Build the HTML book; return ``<path_output>/_build/html``. ``settings``: a :class:`BookSettings`,
    whose fields are these:

    ``execute`` builds the pocket ``organisms`` when needed (default: those the chapters' defaults name,
    :func:`~moir_lib.book.pooled_organisms.book_organisms`) and runs every chapter on its defaults and those
    organisms into ``run_dir`` (default ``runs/book``) with ``jobs`` processes (default
    :func:`default_jobs`; :func:`execute_book`), then each organism's pocket report; otherwise ``run_dir``
    must already hold the executed chapters, a chapter run once per organism being merged into
    ``<path_output>/_build/merged`` (:func:`~moir_lib.book.merge.merged_runs`), and the book shows the
    organisms they ran. ``includes``: pages the book's sources include besides those the build computes
    (name under ``book/_generated`` -> markdown; ``moir book`` passes
    :func:`moir_lib.chapters.book_includes`). What runs is shown on ``stream`` (default standard
    output, :mod:`moir_lib.book.progress`). The wall time of every phase goes to
    ``<path_output>/_build/timings.json``. Warnings are errors (``-W -n``): a broken cross-reference
    fails the build. ``<path_output>/_build`` is locked for the whole build: a second build into it
    raises :class:`~moir_lib.locks.Busy`. A chapter that ran at another commit than ``root``'s checkout
    is marked on its page and in the provenance table, or refused before staging (``same_commit``).
    """
    import multiprocessing

    execute, jobs, organisms = settings.execute, settings.jobs, settings.organisms
    root = Path(root).resolve()
    path_output = Path(path_output).resolve() if path_output else root
    run_dir = Path(run_dir).resolve() if run_dir else root / "runs" / "book"
    chapters = toc_chapters(root)
    if organisms is not None and not execute:
        raise ValueError("organisms are chosen when the chapters run: a book built from executed runs "
                         "(--from) shows the organisms they ran on")
    build_dir, commit = path_output / "_build", git_hash(root)
    record: dict[str, Any] = {"jobs": None, "organisms": None, "tasks": {}, "phases": {}}
    display = display_for(stream or sys.stdout)
    with (exclusive(dir_lock_path(build_dir), f"the book output {build_dir}"),
          watch(display, multiprocessing.get_context("spawn").Queue()) as events):
        if execute:
            record["jobs"] = jobs or default_jobs()
            chosen = book_organisms(root, chapters, organisms)
            record["organisms"] = list(chosen)
            record["phases"]["pocket build"] = _build_pocket(events, chosen, record["jobs"])
            t0 = time.perf_counter()
            record["tasks"] = execute_book(root, run_dir, chapters, record["jobs"], events=events,
                                           organisms=chosen)
            record["phases"]["chapters and report"] = time.perf_counter() - t0
            source = run_dir
        else:
            t0 = time.perf_counter()
            source = merged_runs(root, run_dir, chapters, build_dir / MERGED, events)
            record["phases"]["merging split runs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        executed = collect_executed(source, chapters, allow_missing=settings.allow_missing)
        if settings.same_commit:
            refuse_foreign(executed, commit)
        pocket = (VARIANT, chosen) if execute else executed_organisms(e.notebook for e in executed)
        stage_book(root, build_dir / "stage", run_dir, executed, settings.includes, pocket=pocket,
                   commit=commit)
        events.put(("start", "jupyter-book"))
        try:
            html = _jupyter_book(build_dir / "stage", build_dir)
        except RuntimeError:
            events.put(("failed", "jupyter-book", "Sphinx reported the errors below"))
            raise
        record["phases"]["HTML build"] = time.perf_counter() - t0
        events.put(("done", "jupyter-book", record["phases"]["HTML build"]))
        record["chapters"] = {Path(e.chapter).name: (e.summary or {}).get("timings", {}) for e in executed}
        (build_dir / TIMINGS_NAME).write_text(json.dumps(record, indent=2) + "\n")
    log.info("book built: %s", html / "index.html")
    return html


def _build_pocket(events: Any, organisms: tuple[int, ...], jobs: int) -> float:
    """Build the pocket ``organisms`` not cached (their training shown as one task, side by side where
    ``jobs`` allow: :func:`~moir_lib.book.pooled_organisms.build_organisms`); the wall time."""
    t0 = time.perf_counter()
    task = "pocket model" if organisms == (0,) else f"pocket organisms {', '.join(map(str, organisms))}"
    events.put(("start", task))
    with quiet_bars():
        build_organisms(organisms, jobs)
    seconds = time.perf_counter() - t0
    events.put(("done", task, seconds))
    return seconds


def _jupyter_book(stage: Path, build_dir: Path) -> Path:
    """Run jupyter-book on ``stage`` in a fresh ``build_dir/.next`` and swap its HTML in for
    ``build_dir/html``; ``RuntimeError`` with Sphinx's warnings and errors when it fails (its whole
    output in ``build_dir/jupyter-book.log``)."""
    scratch = build_dir / SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)  # what an interrupted build left
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(stage), "--path-output", str(scratch),
           "--builder", "html", "-W", "-n", "--keep-going"]
    log.debug("building the book: %s", " ".join(cmd))
    result = subprocess.run(cmd, text=True, capture_output=True)
    (build_dir / LOG_NAME).write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}):\n{_problems(result)}\n"
                           f"(the whole output: {build_dir / LOG_NAME})")
    fresh = scratch / "_build" / "html"
    for page in fresh.rglob("*.html"):
        _dedupe_head_scripts(page)
    html, old = build_dir / "html", build_dir / "html.old"
    shutil.rmtree(old, ignore_errors=True)
    if html.exists():
        html.rename(old)
    fresh.rename(html)
    for name in (*LEFTOVERS, SCRATCH):
        shutil.rmtree(build_dir / name, ignore_errors=True)
    return html


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL|SEVERE)\b|Error\b|Exception\b")


def _problems(result: subprocess.CompletedProcess[str]) -> str:
    """The lines of a failed jupyter-book run that say why (Sphinx's warnings and errors, the last
    exception), else its output's tail."""
    lines = _ANSI.sub("", result.stdout + "\n" + result.stderr).splitlines()
    found = [line for line in lines if _PROBLEM.search(line) and "Config(" not in line]
    return "\n".join(found[-40:]) if found else "\n".join(lines[-60:])


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
