"""What ``moir book`` shows while it works: one live line per task on a terminal, plain lines in a log.

The tasks (the pocket build, each chapter executed by a worker process, the pocket report) send
events to one queue (:func:`watch`); a thread of the building process hands them to one display:

* :class:`LiveLines` when the stream is a terminal: a line per running task (chapter, cell ``n`` of
  ``m``, elapsed time) rewritten in place every second, finished tasks and messages scrolling above;
* :class:`PlainLines` otherwise (``make book > log``): a line when a task starts, at most one per
  task every :attr:`PlainLines.interval` seconds as its cells advance, one when it ends with its wall
  time; no carriage return, no cursor movement.

An event is a tuple ``(kind, *args)`` naming a method of the display: ``("start", task)``,
``("cell", task, n, m)``, ``("done", task, seconds)``, ``("failed", task, error)``, ``("say", text)``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from moir_lib.timings import elapsed

__all__ = ["LiveLines", "PlainLines", "Progress", "display_for", "watch"]

#: how often a terminal's live lines are redrawn (and the event queue polled), in seconds
REFRESH_S = 1.0


class Progress:
    """A display of tasks: where their state is kept; subclasses decide what is written when."""

    #: whether nothing else may write to the terminal while it shows (log records go through it)
    owns_terminal = False

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.clock = stream, clock
        self.running: dict[str, dict[str, Any]] = {}  # task -> {"since": t, "cell": n, "cells": m}

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def start(self, task: str) -> None:
        self.running[task] = {"since": self.clock(), "cell": 0, "cells": 0}

    def cell(self, task: str, n: int, m: int) -> None:
        self.running.setdefault(task, {"since": self.clock()}).update(cell=n, cells=m)

    def done(self, task: str, seconds: float) -> None:
        self.running.pop(task, None)

    def failed(self, task: str, error: str) -> None:
        self.running.pop(task, None)

    def say(self, text: str) -> None:
        self._write(text + "\n")

    def tick(self) -> None:
        """Called about every :data:`REFRESH_S` seconds."""

    def close(self) -> None:
        """Called once after the last event."""

    def state(self, task: str) -> str:
        """``cell n/m, elapsed`` (or the elapsed time alone before the first cell)."""
        info = self.running[task]
        spent = elapsed(self.clock() - info["since"])
        return f"cell {info['cell']}/{info['cells']}, {spent}" if info.get("cells") else spent


class PlainLines(Progress):
    """Lines for a log file: started, a cell line at most every :attr:`interval` s per task, done."""

    interval = 30.0

    def start(self, task: str) -> None:
        super().start(task)
        self.running[task]["said"] = self.clock()
        self.say(f"{task}: started")

    def cell(self, task: str, n: int, m: int) -> None:
        super().cell(task, n, m)
        info = self.running[task]
        if self.clock() - info.get("said", info["since"]) >= self.interval:
            info["said"] = self.clock()
            self.say(f"{task}: {self.state(task)}")

    def done(self, task: str, seconds: float) -> None:
        super().done(task, seconds)
        self.say(f"{task}: done in {elapsed(seconds)}")

    def failed(self, task: str, error: str) -> None:
        super().failed(task, error)
        self.say(f"{task}: failed: {error}")


class LiveLines(Progress):
    """A terminal's display: the running tasks' lines at the bottom, rewritten in place (so the
    building process's log records are shown through it too, above them: :func:`watch`)."""

    owns_terminal = True

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream, clock)
        self.drawn = 0  # live lines on screen below the scrolled text

    def _redraw(self, above: str = "") -> None:
        width = max(20, shutil.get_terminal_size().columns - 1)  # a wrapped line would break the cursor-up
        lines = [f"  {task}: {self.state(task)}"[:width] for task in self.running]
        erase = f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""  # to the first live line, clear below
        self._write(erase + above + "".join(line + "\n" for line in lines))
        self.drawn = len(lines)

    def start(self, task: str) -> None:
        super().start(task)
        self._redraw()

    def cell(self, task: str, n: int, m: int) -> None:
        super().cell(task, n, m)
        self._redraw()

    def done(self, task: str, seconds: float) -> None:
        super().done(task, seconds)
        self._redraw(f"{task}: done in {elapsed(seconds)}\n")

    def failed(self, task: str, error: str) -> None:
        super().failed(task, error)
        self._redraw(f"{task}: failed: {error}\n")

    def say(self, text: str) -> None:
        self._redraw(text + "\n")

    def tick(self) -> None:
        if self.running:
            self._redraw()

    def close(self) -> None:
        self.running.clear()
        self._redraw()


def display_for(stream: TextIO) -> Progress:
    """:class:`LiveLines` on a terminal, :class:`PlainLines` elsewhere."""
    isatty = getattr(stream, "isatty", None)
    return LiveLines(stream) if isatty is not None and isatty() else PlainLines(stream)


class _LogToEvents(logging.Handler):
    """Log records of this process as ``say`` events (formatted as the handler it stands in for)."""

    def __init__(self, events: Any, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.events = events
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.events.put(("say", self.format(record)))


@contextlib.contextmanager
def watch(display: Progress, events: Any = None) -> Iterator[Any]:
    """A thread hands the events put on ``events`` (a new :class:`queue.Queue` by default; a
    multiprocessing queue reaches worker processes) to ``display`` until the block ends; yields
    ``events``. A display that :attr:`~Progress.owns_terminal` also shows this process's log records
    meanwhile (in place of the root logger's handlers), so none lands between its live lines."""
    events = queue.Queue() if events is None else events
    root, handlers = logging.getLogger(), logging.getLogger().handlers[:]
    if display.owns_terminal and handlers:
        root.handlers[:] = [_LogToEvents(events, handlers[0].formatter)]

    def pump() -> None:
        while True:
            try:
                event = events.get(timeout=REFRESH_S)
            except queue.Empty:
                display.tick()
                continue
            if event is None:
                break
            getattr(display, event[0])(*event[1:])

    thread = threading.Thread(target=pump, name="moir-book-progress", daemon=True)
    thread.start()
    try:
        yield events
    finally:
        events.put(None)
        thread.join()
        root.handlers[:] = handlers
        display.close()
