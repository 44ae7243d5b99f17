"""One point's call path, from ``Lab.edit`` to its stored rows, read module by module.

The path is traced with :func:`sys.setprofile` over the frames of the experiments layer
(``moir_lib.experiments``; what a step calls in the packages below is that step's own business). A
module is *entered* when a frame of it starts, or a generator of it resumes, under a frame of another
module. Control *returns to a module already left* when a generator of it resumes (it was left at its
``yield``) or when a module calls back into one that is waiting lower on the stack: the two ways a
reader must climb back up into code they have read past. Calling down into another module, however
often, is not a return: that is a step read top to bottom.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

#: the most times the point's path may enter ``lab.py``, and return to a module it has left
MAX_LAB_ENTRIES = 2
MAX_RETURNS = 5
_GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


@dataclass
class PathTrace:
    """The modules a traced call entered, in order, and the returns to modules it had left."""

    entries: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)
    _stack: list[tuple[FrameType, str]] = field(default_factory=list)
    _generators: dict[int, FrameType] = field(default_factory=dict)  # held, so that ids stay unique

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if not module.startswith("moir_lib.experiments"):
                return
            caller = self._stack[-1][1] if self._stack else None
            if module != caller:
                self.entries.append(module)
                if id(frame) in self._generators or any(m == module for _, m in self._stack):
                    self.returns.append(module)
            if frame.f_code.co_flags & _GENERATOR:
                self._generators[id(frame)] = frame
            self._stack.append((frame, module))
        elif event == "return" and self._stack and self._stack[-1][0] is frame:
            self._stack.pop()

    def count(self, module: str) -> int:
        return self.entries.count(module)


def trace(fn: Any, *args: Any, **kwargs: Any) -> PathTrace:
    """``fn(*args, **kwargs)`` run under a :class:`PathTrace`."""
    path = PathTrace()
    sys.setprofile(path)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return path


def _function(module: str, source: str, env: dict[str, Any]) -> Any:
    """The one function ``source`` defines, as if it lived in ``module``."""
    namespace = {"__name__": module, **env}
    exec(source, namespace)  # noqa: S102 - a fixed snippet of this test
    return next(v for k, v in namespace.items() if k not in env and callable(v) and not k.startswith("__"))


def test_the_tracer_counts_entries_and_returns():
    """Calling down into ``lab`` twice from ``point`` enters it twice and returns nowhere; each resumption
    of a generator of ``lab`` returns to it; a call back into a waiting ``point`` returns to it; a module
    outside the experiments layer is not recorded."""
    lab, pt = "moir_lib.experiments.lab", "moir_lib.experiments.point"
    callee = _function(lab, "def callee():\n    return 1\n", {})
    twice = _function(pt, "def twice():\n    callee()\n    callee()\n", {"callee": callee})
    path = trace(twice)
    assert path.entries == [pt, lab, lab] and path.returns == [] and path.count(lab) == 2
    steps = _function(lab, "def steps():\n    yield 1\n    yield 2\n", {})
    drain = _function(pt, "def drain():\n    for _ in steps():\n        pass\n", {"steps": steps})
    path = trace(drain)
    assert path.entries == [pt, lab, lab, lab] and path.returns == [lab, lab]
    back = _function(pt, "def back():\n    return 2\n", {})
    up = _function(lab, "def up():\n    back()\n", {"back": back})
    down = _function(pt, "def down():\n    up()\n", {"up": up})
    path = trace(down)
    assert path.entries == [pt, lab, pt] and path.returns == [pt]
    outside = _function("elsewhere", "def outside():\n    callee()\n", {"callee": callee})
    assert trace(outside).entries == [lab]


def test_one_point_reads_top_to_bottom(tmp_path):
    """Done when: the path of one point (a batch MEMIT point scored on every group) enters ``lab.py`` at
    most twice and returns to a module already left at most five times."""
    from moir_lib.experiments import EvalSettings, ExperimentSpec, Lab, PointStore, ScorePlan
    from moir_lib.experiments.lab import ALL_GROUPS

    tiny = EvalSettings(n_eval=3, pres_limit=3, nll_docs=2, max_gen_tokens=4, fluency_prompts=1)
    lab = Lab("pocket-micro", PointStore(tmp_path, shared=False), evaluation=tiny)
    spec = ExperimentSpec("memit", "batch", "wiki", 2)
    path = trace(lab.edit, spec, ScorePlan(groups=ALL_GROUPS), store=True)
    listed = " -> ".join(m.removeprefix("moir_lib.") for m in path.entries)
    assert len(lab.store.point(lab.key(spec), 2)), "the point's rows are stored"
    assert path.count("moir_lib.experiments.lab") <= MAX_LAB_ENTRIES, listed
    assert len(path.returns) <= MAX_RETURNS, f"returns to {path.returns}: {listed}"
    print(f"\n{len(path.entries)} entries into {len(set(path.entries))} modules, "
          f"{len(path.returns)} returns ({', '.join(path.returns)}): {listed}")
