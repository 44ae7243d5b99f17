"""Execute the book's chapters side by side: one worker process per core, one torch thread each.

:func:`execute_book` runs every chapter of ``_toc.yml`` (:func:`moir_lib.runs.run_notebook`) and the
pocket model's report in a pool of worker processes; :func:`_extra_tasks` decides when the report
starts and when an idle worker helps a long chapter. Workers report what they do (a task started, a
cell started) to the display of :mod:`.progress` through one queue, and their warnings with it.
"""

from __future__ import annotations

import contextlib
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

from moir_lib.book.progress import display_for, watch
from moir_lib.runs import run_notebook

__all__ = ["HELPED", "REPORT_AFTER", "REPORT_TASK", "default_jobs", "execute_book", "quiet_bars"]

log = logging.getLogger(__name__)

#: chapters whose editing points the pocket report's editability gate reads: it starts once they are
#: done, or earlier when a worker has nothing else to do (it then computes or waits for the points
#: they have not stored yet; the points are the same whoever computes them)
REPORT_AFTER = ("notebooks/01_diagnosis", "notebooks/05_editing")
#: chapters with the longest editing grids, longest first: they start first, and a worker left with
#: nothing else to do runs a helper copy of one still running (its lab shares the grid's runs)
HELPED = ("notebooks/05_editing", "notebooks/01_diagnosis")
#: the name of the pocket report's task
REPORT_TASK = "pocket report"

#: in a worker process: the queue its events go to (set by :func:`_init_worker`)
_events: Any = None


def default_jobs() -> int:
    """Chapters executed side by side: one per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def execute_book(root: Path, run_dir: Path, chapters: list[str], jobs: int = 1, report: bool = True,
                 events: Any = None) -> dict[str, dict[str, Any]]:
    """Execute ``chapters`` into ``run_dir/<name>`` with ``jobs`` worker processes and (``report``)
    measure the pocket model's report, whose editability gate reads the points of the chapters of
    :data:`REPORT_AFTER` (:func:`_extra_tasks` says when it starts). Returns per task its wall time and,
    for the report, its phases. ``events``: a multiprocessing queue of :mod:`.progress` events (default:
    one shown on standard output by :func:`.progress.display_for`).

    Every task runs on one torch thread whatever ``jobs`` is, so results equal a serial run's (``jobs=1``)
    up to float32 rounding in a few scores, such as Fluency*, whose kernels may round by memory alignment
    in another process; two tasks needing one cached C, model or editing run wait for one another.
    The chapters of :data:`HELPED` start first; once a worker has nothing else to do, it executes a
    copy of the longest one still running into a scratch directory (a *helper*): both labs walk the
    same grid, each computing the runs the other has not taken (:meth:`Lab.run_all
    <moir_lib.experiments.Lab.run_all>`), so each run is still computed once, on one thread. A
    failed chapter stops the book with its error; a failed helper only leaves its share to the chapter.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with contextlib.ExitStack() as stack:
        if events is None:
            events = stack.enter_context(watch(display_for(sys.stdout), ctx.Queue()))
        scratch = Path(tempfile.mkdtemp(prefix="moir-helpers-"))
        stack.callback(shutil.rmtree, scratch, True)
        return _run_pool(ctx, events, root, run_dir, scratch, chapters, jobs, report)


def _run_pool(ctx: Any, events: Any, root: Path, run_dir: Path, scratch: Path, chapters: list[str],
              jobs: int, report: bool) -> dict[str, dict[str, Any]]:
    """:func:`execute_book`'s loop: submit the chapters, then the report and helpers as workers free up."""
    import concurrent.futures as cf

    order = sorted(chapters, key=lambda c: HELPED.index(c) if c in HELPED else len(HELPED))  # stable
    waiting = set(REPORT_AFTER) & set(chapters)
    done: dict[str, dict[str, Any]] = {}
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx, initializer=_init_worker,
                                initargs=(events,)) as pool:
        running = {pool.submit(_execute_chapter, root / f"{c}.ipynb", run_dir / Path(c).name, c): c
                   for c in order}
        helped: set[str] = set()
        report_pending = report
        while running:
            for task in _extra_tasks(list(running.values()), jobs, report_pending, waiting, helped):
                if task == REPORT_TASK:
                    running[pool.submit(_measure_report, "pocket")] = task
                    report_pending = False
                else:
                    c = task.removesuffix(" helper")
                    helped.add(c)
                    running[pool.submit(_execute_chapter, root / f"{c}.ipynb", scratch / Path(c).name, task,
                                        True)] = task
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                if _collect(future, name, done, events):
                    waiting.discard(name)
        if report_pending:
            done[REPORT_TASK] = pool.submit(_measure_report, "pocket").result()
            events.put(("done", REPORT_TASK, done[REPORT_TASK]["wall_s"]))
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


def _extra_tasks(running: list[str], jobs: int, report: bool, waiting: set[str], helped: set[str]
                 ) -> list[str]:
    """What to add to the ``running`` tasks (chapters submitted, queued or not): the pocket report
    (``report``: not yet submitted) once the chapters it ``waiting`` for are done or a worker is idle,
    then, while a worker is still idle, a helper of each :data:`HELPED` chapter running and not yet
    ``helped``, longest first."""
    tasks, busy = [], len(running)
    if report and (not waiting or busy < jobs):
        tasks.append(REPORT_TASK)
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


def _execute_chapter(notebook: Path, out: Path, task: str, helper: bool = False) -> dict[str, Any]:
    """Execute ``notebook`` into ``out`` as ``task``; a ``helper``'s record keeps its summary's phases."""
    task = _task_name(task)
    _post("start", task)
    t0 = time.perf_counter()
    run_notebook(notebook, out, progress=False, on_cell=lambda n, m: _post("cell", task, n, m))
    record: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
    if helper:
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


def _measure_report(variant: str) -> dict[str, Any]:
    from moir_lib import timings
    from moir_lib.book.stage import pocket_report_page

    _post("start", REPORT_TASK)
    timings.reset()  # a pool worker may have run another task before
    t0 = time.perf_counter()
    with timings.phase("pocket report"), quiet_bars():
        pocket_report_page(variant)
    return {"wall_s": time.perf_counter() - t0, "timings": timings.snapshot()}
