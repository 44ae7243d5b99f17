"""Execute the book's chapters side by side: one worker process per core, one torch thread each.

:func:`execute_book` runs every chapter of ``_toc.yml`` (the pages of :data:`moir_lib.chapters.CHAPTERS`
that are notebooks, in that order; :func:`moir_lib.runs.run_notebook`) on the
book's pocket organisms and measures each organism's report in a pool of worker processes;
:func:`_extra_tasks` decides when the reports start and when an idle worker helps a long chapter. With
several organisms and workers, a chapter that can read an organism's run back (it declares
``organisms`` and ``reuse``: :func:`moir_lib.book.pooled_organisms.splits`) runs as one task per organism
and a
last one over them all, which reads their work back. Workers report what they do (a task started, a
cell started) to the display of :mod:`.progress` through one queue, and their warnings with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from moir_lib.book.pooled_organisms import VARIANT, chapter_parameters, splits
from moir_lib.book.progress import display_for, watch
from moir_lib.experiments.shared import SHARED_EDITING
from moir_lib.runs import run_notebook

__all__ = ["HELPED", "REPORT_AFTER", "REPORT_TASK", "default_jobs", "execute_book", "quiet_bars",
           "report_tasks"]

log = logging.getLogger(__name__)

#: chapters whose editing points the pocket report's editability gate reads (those sharing the editing
#: run): it starts once they are done, or earlier when a worker has nothing else to do (it then computes
#: or waits for the points they have not stored yet; the points are the same whoever computes them)
REPORT_AFTER = SHARED_EDITING.chapters
#: chapters with the longest editing grids, longest first (the shared run's chapters): they start first,
#: and a worker left with nothing else to do runs a helper copy of one still running (its lab shares the
#: grid's runs)
HELPED = SHARED_EDITING.chapters
#: the name of the pocket report's task (of each organism's, with several)
REPORT_TASK = "pocket report"
#: what names the task of one organism of a chapter split by organism: ``<chapter> organism <k>``
PART = " organism "

#: in a worker process: the queue its events go to (set by :func:`_init_worker`)
_events: Any = None


def default_jobs() -> int:
    """Chapters executed side by side: one per core this process may use."""
    from moir_lib.pocket.builds import available_cores

    return available_cores()


def report_tasks(organisms: tuple[int, ...]) -> dict[str, int]:
    """The report tasks of ``organisms`` (task name -> organism): ``pocket report`` for one organism,
    ``pocket report, organism <k>`` for each of several."""
    if len(organisms) == 1:
        return {REPORT_TASK: organisms[0]}
    return {f"{REPORT_TASK}, organism {k}": k for k in organisms}


def execute_book(root: Path, run_dir: Path, chapters: list[str], jobs: int = 1, report: bool = True,
                 events: Any = None, organisms: tuple[int, ...] = (0,)) -> dict[str, dict[str, Any]]:
    """Execute ``chapters`` on the pocket ``organisms`` (given to every chapter that takes them) into
    ``run_dir/<name>`` with ``jobs`` worker processes and (``report``) measure each organism's pocket
    report, whose editability gate reads the points of the chapters of :data:`REPORT_AFTER`
    (:func:`_extra_tasks` says when it starts). Returns per task its wall time and, for a report, its
    phases. ``events``: a multiprocessing queue of :mod:`.progress` events (default: one shown on
    standard output by :func:`.progress.display_for`).

    Every task runs on one torch thread whatever ``jobs`` is, so results equal a serial run's (``jobs=1``)
    up to float32 rounding in a few scores, such as Fluency*, whose kernels may round by memory alignment
    in another process; two tasks needing one cached C, model or editing experiment wait for one another.
    The chapters of :data:`HELPED` start first; once a worker has nothing else to do, it executes a
    copy of the longest one still running into a scratch directory (a *helper*): both labs walk the
    same grid, each computing the runs the other has not taken (:meth:`Lab.compute_all
    <moir_lib.experiments.Lab.compute_all>`), so each run is still computed once, on one thread. With
    several organisms and ``jobs``, a chapter that :func:`~moir_lib.book.pooled_organisms.splits` (and is
    not of :data:`HELPED`) runs once per organism into the scratch directory (``<chapter> organism <k>``),
    then once over every organism into ``run_dir``, reading those runs back (``reuse``); it gets no helper.
    A failed chapter stops the book with its error; a failed helper only leaves its share to the chapter.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with contextlib.ExitStack() as stack:
        if events is None:
            events = stack.enter_context(watch(display_for(sys.stdout), ctx.Queue()))
        scratch = Path(tempfile.mkdtemp(prefix="moir-helpers-"))
        stack.callback(shutil.rmtree, scratch, True)
        return _run_pool(ctx, events, _Book(root, run_dir, scratch, chapters, tuple(organisms), jobs), report)


@dataclasses.dataclass(frozen=True)
class _Book:
    """What :func:`_run_pool` executes: the chapters, where, on which organisms, with how many workers."""

    root: Path
    run_dir: Path
    scratch: Path
    chapters: list[str]
    organisms: tuple[int, ...]
    jobs: int

    def notebook(self, chapter: str) -> Path:
        return self.root / f"{chapter}.ipynb"

    def split(self) -> dict[str, list[str]]:
        """Chapters run once per organism -> their organism tasks (none with one organism or one worker).
        The chapters of :data:`HELPED` are not split: beyond their first organism they add only their
        claims' runs, which a helper shares, while a run per organism would repeat every table, figure and
        the τ / λ selection, all of the first organism's."""
        if len(self.organisms) < 2 or self.jobs < 2:
            return {}
        return {c: [f"{c}{PART}{k}" for k in self.organisms] for c in self.chapters
                if splits(self.notebook(c)) and c not in HELPED}

    def submit(self, pool: Any, task: str, split: dict[str, list[str]]) -> Any:
        """Submit chapter task ``task``: a chapter (merging its organism tasks' runs when it is split), a
        helper, or one organism of a split chapter."""
        chapter, _, organism = task.removesuffix(" helper").partition(PART)
        params = chapter_parameters(self.notebook(chapter), [int(organism)] if organism else self.organisms)
        if organism:
            return pool.submit(_execute_chapter, self.notebook(chapter), self._part(chapter, int(organism)),
                               task, False, params)
        if task.endswith(" helper"):
            return pool.submit(_execute_chapter, self.notebook(chapter), self.scratch / Path(chapter).name,
                               task, True, params)
        if chapter in split:
            params["reuse"] = [str(self._part(chapter, k)) for k in self.organisms]
        return pool.submit(_execute_chapter, self.notebook(chapter), self.run_dir / Path(chapter).name, task,
                           False, params)

    def _part(self, chapter: str, organism: int) -> Path:
        return self.scratch / "organisms" / f"{Path(chapter).name}-{organism}"


def _run_pool(ctx: Any, events: Any, book: _Book, report: bool) -> dict[str, dict[str, Any]]:
    """:func:`execute_book`'s loop: submit the chapters (a split one's organisms first), then the reports
    and helpers as workers free up, and a split chapter's merging run once its organisms are done."""
    import concurrent.futures as cf

    order = sorted(book.chapters, key=lambda c: HELPED.index(c) if c in HELPED else len(HELPED))  # stable
    split = book.split()
    waiting = set(REPORT_AFTER) & set(book.chapters)
    reports = report_tasks(book.organisms) if report else {}
    done: dict[str, dict[str, Any]] = {}
    with cf.ProcessPoolExecutor(max_workers=max(1, book.jobs), mp_context=ctx, initializer=_init_worker,
                                initargs=(events,)) as pool:
        running = {book.submit(pool, t, split): t for c in order for t in split.get(c, [c])}
        helped: set[str] = set(split)  # a split chapter's organisms are its parallel share
        while running or reports:
            for task in _extra_tasks(list(running.values()), book.jobs, list(reports), waiting, helped):
                if task in reports:
                    running[pool.submit(_measure_report, VARIANT, reports.pop(task), task)] = task
                else:
                    helped.add(task.removesuffix(" helper"))
                    running[book.submit(pool, task, split)] = task
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                if _collect(future, name, done, events):
                    waiting.discard(name)
                chapter = name.partition(PART)[0]  # "pocket report, organism k" is no chapter's part
                if PART in name and chapter in split and all(t in done for t in split[chapter]):
                    running[book.submit(pool, chapter, split)] = chapter
    return done


def _collect(future: Any, name: str, done: dict[str, dict[str, Any]], events: Any) -> bool:
    """Record the finished task ``name`` in ``done``; whether it succeeded. A failed chapter raises its
    :class:`~moir_lib.runs.ChapterFailed`; a failed helper is reported and left to its chapter."""
    shown = _task_name(name)
    try:
        done[name] = future.result()
    except Exception as exc:
        events.put(("failed", shown, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        if not name.endswith(" helper"):
            raise
        events.put(("say", f"{shown}: its chapter computes its share"))
        return False
    events.put(("done", shown, done[name]["wall_s"]))
    return True


def _extra_tasks(running: list[str], jobs: int, reports: list[str], waiting: set[str], helped: set[str]
                 ) -> list[str]:
    """What to add to the ``running`` tasks (chapters submitted, queued or not): the pocket ``reports``
    not yet submitted, all once the chapters they are ``waiting`` for are done, else one per idle
    worker, then, while a worker is still idle, a helper of each :data:`HELPED` chapter running and not
    yet ``helped``, longest first."""
    tasks, busy = [], len(running)
    for task in reports:
        if waiting and busy >= jobs:
            break
        tasks.append(task)
        busy += 1
    for c in HELPED:
        if busy < jobs and c in running and c not in helped:
            tasks.append(f"{c} helper")
            busy += 1
    return tasks


class _Forward(logging.Handler):
    """A worker's log records of WARNING and above, as ``say`` events of the building process."""

    def emit(self, record: logging.LogRecord) -> None:
        _post("say", f"{record.levelname} {record.name}: {record.getMessage()}")


def _init_worker(events: Any) -> None:
    """Worker initialiser: one torch thread in the worker and in the kernels it starts; events and
    warnings go to ``events``."""
    global _events
    _events = events
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    logging.captureWarnings(True)
    root = logging.getLogger()
    root.handlers[:] = [_Forward(logging.WARNING)]
    root.setLevel(logging.WARNING)


def _post(*event: Any) -> None:
    if _events is not None:
        _events.put(event)


def _task_name(chapter: str) -> str:
    """``notebooks/05_editing helper`` -> ``05_editing helper``: the name a display shows."""
    return chapter.removeprefix("notebooks/")


def _execute_chapter(notebook: Path, out: Path, task: str, helper: bool = False,
                     parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute ``notebook`` into ``out`` as ``task`` with ``parameters``; the record of a run into the
    scratch directory (a ``helper``, an organism of a split chapter) keeps its summary's phases."""
    task = _task_name(task)
    _post("start", task)
    t0 = time.perf_counter()
    run_notebook(notebook, out, parameters, progress=False, on_cell=lambda n, m: _post("cell", task, n, m))
    record: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
    if helper or PART in task:
        summary = out / "summary.json"
        record["timings"] = json.loads(summary.read_text()).get("timings", {}) if summary.is_file() else {}
    return record


class _WithoutBars(io.TextIOBase):
    """A text stream passing the lines written to it on to ``stream``, except the ones that hold a
    carriage return: progress bars (tqdm's), which redraw themselves with one."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream, self.pending = stream, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if "\r" not in line:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def quiet_bars() -> Iterator[None]:
    """No progress bar on this process's standard error inside the block, its other lines kept: the
    display of :mod:`.progress` shows the task instead, and a log file holds no carriage returns."""
    with contextlib.redirect_stderr(_WithoutBars(sys.stderr)):
        yield


def _measure_report(variant: str, organism: int, task: str) -> dict[str, Any]:
    """Measure (or read back, while its key matches) the report of ``organism`` as ``task``."""
    from moir_lib import timings
    from moir_lib.experiments.pocket_report import pocket_report

    _post("start", task)
    timings.reset()  # a pool worker may have run another task before
    t0 = time.perf_counter()
    with timings.phase("pocket report"), quiet_bars():
        pocket_report(variant, organism=organism, reuse=True)
    return {"wall_s": time.perf_counter() - t0, "timings": timings.snapshot()}
