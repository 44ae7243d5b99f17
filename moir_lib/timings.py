"""Where the time goes: wall time per named phase of this process.

The library wraps its expensive stages in :func:`phase` (self-generation, C estimation, keys,
z fitting, solves, CounterFact scoring, Fluency generation, preservation, NLL, causal tracing, …).
Phases nest; each keeps its *own* time (a nested phase's time is not counted twice), so the
phases of a process add up to the time spent inside any of them. :func:`snapshot` reads the totals
(a chapter's ``summary.json`` carries them, :func:`moir_lib.results.write_results`), and
``benchmarks/book.py`` prints them per chapter.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["PHASES", "elapsed", "phase", "reset", "snapshot", "timed"]

F = TypeVar("F", bound=Callable[..., Any])

#: the phases the library records, in the order a report lists them
PHASES = ("model load", "self-generation", "C estimation", "context templates", "z fitting", "keys",
          "solves", "CounterFact scoring", "Fluency generation", "preservation", "NLL", "distortion",
          "causal tracing", "pocket report")

_totals: dict[str, float] = {}
_counts: dict[str, int] = {}
_stack: list[list[float]] = []  # per open phase: [start, time spent in nested phases]


def elapsed(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the wall time inside the block (minus its nested phases) toward ``name``."""
    _stack.append([time.perf_counter(), 0.0])
    try:
        yield
    finally:
        start, nested = _stack.pop()
        spent = time.perf_counter() - start
        _totals[name] = _totals.get(name, 0.0) + spent - nested
        _counts[name] = _counts.get(name, 0) + 1
        if _stack:
            _stack[-1][1] += spent


def timed(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function is a :func:`phase` ``name``."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)
        return inner  # type: ignore[return-value]
    return wrap


def snapshot() -> dict[str, dict[str, float]]:
    """``{phase: {"seconds": own wall time, "calls": n}}`` of this process so far."""
    return {name: {"seconds": round(_totals[name], 3), "calls": _counts[name]} for name in _totals}


def reset() -> None:
    """Forget every total (a new measurement in the same process)."""
    _totals.clear()
    _counts.clear()
