"""Merge the runs of a chapter split by organism into one run over them all (``moir book --from``).

A grid may run a chapter once per pocket organism, each run an array task (``organisms: [[0], [1], [2]]``
in the grid file: :mod:`moir_lib.grid`). The book shows each chapter once, pooled over its organisms:
:func:`merged_runs` finds the chapters with several executed copies, checks that the copies differ in
their organisms alone, and executes the chapter once more on all of them, reading each copy's work back
through the chapter's ``reuse`` parameter, into a folder of its own; a chapter run once is taken as it
is. A chapter that cannot read a run back (no ``reuse`` parameter) is refused rather than recomputed,
and so are copies the book would refuse (:func:`~moir_lib.book.stage.read_executed`: failed, interrupted,
beside another run's summary) and copies of two organisms that record the same weights. The merge
records the runs it read and their commits (:data:`~moir_lib.book.commits.SOURCES`), for the book's
provenance table. A merge is kept while its parameters stay those of the copies, so building the book
again executes nothing.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from moir_lib.book.commits import SOURCES, merged_sources
from moir_lib.book.pooled_organisms import PARAMETER, REUSE, pocket_variant, ran, recorded_weights, splits
from moir_lib.book.stage import executed_notebooks, read_executed
from moir_lib.files import write_json
from moir_lib.results import SUMMARY_NAME

__all__ = ["executed_copies", "merge_parameters", "merged_runs"]

log = logging.getLogger(__name__)

#: parameters every run gets its own value of (papermill's record of them differs between copies)
_PER_RUN = ("out_dir", PARAMETER, REUSE)


def executed_copies(run_dir: Path, chapters: list[str]) -> dict[str, list[Path]]:
    """Every executed copy of each chapter under ``run_dir`` (chapter -> notebooks, sorted)."""
    copies = {}
    for chapter in chapters:
        hits = executed_notebooks(run_dir, chapter)
        if hits:
            copies[chapter] = hits
    return copies


def _given(notebook: Path) -> dict[str, Any]:
    """The parameters the run of ``notebook`` was given (papermill's record), but for :data:`_PER_RUN`."""
    import nbformat

    given = (nbformat.read(str(notebook), as_version=4).metadata.get("papermill") or {}).get("parameters")
    return {k: v for k, v in (given or {}).items() if k not in _PER_RUN}


def merge_parameters(root: Path, chapter: str, notebooks: list[Path]) -> dict[str, Any]:
    """The parameters that run ``chapter`` once over the organisms of its executed copies ``notebooks``,
    reading each copy back (``reuse``); a ``ValueError`` that says what to do when the copies are not one
    chapter split by organism."""
    listed = ", ".join(map(str, notebooks))
    if not splits(root / f"{chapter}.ipynb"):
        raise ValueError(f"{len(notebooks)} executed copies of {chapter} ({listed}), and the chapter "
                         f"cannot merge runs (it takes no `{PARAMETER}` and `{REUSE}` parameters): point "
                         f"--from at one run")
    common = _given(notebooks[0])
    organisms: dict[int, Path] = {}
    for notebook in notebooks:
        differences = _differences(root / f"{chapter}.ipynb", common, _given(notebook))
        if differences:
            raise ValueError(f"the executed copies of {chapter} differ in more than their organisms: "
                             f"{'; '.join(differences)} ({notebooks[0]} and {notebook}): point --from at the "
                             f"runs of one setting")
        for k in ran(notebook) or (0,):
            if k in organisms:
                raise ValueError(f"organism {k} of {chapter} ran twice ({organisms[k]} and {notebook}): "
                                 f"point --from at runs of distinct organisms")
            organisms[k] = notebook
    reused = [str(n.parent.resolve()) for n in notebooks]
    reused += [r for n in notebooks for r in _reused(n) if r not in reused]
    return {**common, PARAMETER: sorted(organisms), REUSE: reused}


def _differences(chapter: Path, first: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Each parameter of the runs of ``chapter`` (a notebook) whose value in ``other`` differs from
    ``first``'s, with both values: a parameter left out is its default, and a profile is compared by its
    content (:func:`_profile_content`), so one given by name and by path is the same."""
    from moir_lib.runs import notebook_defaults

    defaults = notebook_defaults(chapter)
    out = []
    for name in sorted(set(first) | set(other)):
        a, b = first.get(name, defaults.get(name)), other.get(name, defaults.get(name))
        if a == b:
            continue
        if name == "profile":
            settings = [_profile_content(chapter, v) for v in (a, b)]
            if settings[0] is not None and settings[0] == settings[1]:
                continue
            if None not in settings:
                keys = _changed(*settings)
                out.append(f"parameter 'profile' is {a!r} and {b!r}, which differ in "
                           + ", ".join(f"{k} ({x!r} vs {y!r})" for k, x, y in keys))
                continue
        out.append(f"parameter {name!r} is {a!r} and {b!r}")
    return out


def _profile_content(chapter: Path, value: Any) -> dict[str, Any] | None:
    """The settings of the profile ``value`` names (a name, a path, or a path from the chapter's folder,
    where its run resolved it) but its name, which is the file's; ``None`` when no such profile is here."""
    from moir_lib.profiles import load_profile

    if not isinstance(value, str):
        return None
    for spelling in dict.fromkeys([value, str(chapter.parent / value)]):  # the chapter's run: from its folder
        try:
            return {k: v for k, v in load_profile(spelling).to_dict().items() if k != "name"}
        except (OSError, ValueError):
            continue
    return None


def _changed(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` of every setting that differs between two profiles."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _changed(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append((f"{prefix}{key}", x, y))
    return out


def _reused(notebook: Path) -> list[str]:
    """The runs the run of ``notebook`` was given to read back (``reuse``)."""
    import nbformat

    given = (nbformat.read(str(notebook), as_version=4).metadata.get("papermill") or {}).get("parameters")
    return list((given or {}).get(REUSE) or [])


def _up_to_date(dest: Path, notebook: Path, params: dict[str, Any]) -> bool:
    """Whether ``dest`` holds a finished merge run with ``params``."""
    import nbformat

    if not (notebook.is_file() and (dest / SUMMARY_NAME).is_file()):
        return False
    meta = nbformat.read(str(notebook), as_version=4).metadata.get("papermill") or {}
    given = {k: v for k, v in (meta.get("parameters") or {}).items() if k != "out_dir"}
    return not meta.get("exception") and given == params


def merged_runs(root: Path, run_dir: Path, chapters: list[str], out: Path, events: Any = None) -> Path:
    """A run directory with one executed copy of each chapter of ``run_dir``: ``run_dir`` itself when no
    chapter has several, else ``out``, holding each chapter run once (its notebook and summary) and each
    chapter split by organism merged (executed here, unless ``out`` holds that merge already); ``events``:
    a queue of :mod:`.progress` events."""
    copies = executed_copies(run_dir, chapters)
    if all(len(found) == 1 for found in copies.values()):
        return run_dir
    if out.resolve().is_relative_to(run_dir.resolve()):
        raise ValueError(f"the merged runs cannot go inside the run directory {run_dir} (its chapters would "
                         f"be found twice): give another --path-output")
    out.mkdir(parents=True, exist_ok=True)
    for chapter, found in copies.items():
        dest = out / Path(chapter).name
        if len(found) > 1:
            _merged(root, chapter, found, dest, events)
            continue
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for path in (found[0], found[0].parent / SUMMARY_NAME, found[0].parent / SOURCES):
            if path.is_file():
                shutil.copy2(path, dest / path.name)
    return out


def _merged(root: Path, chapter: str, found: list[Path], dest: Path, events: Any) -> None:
    """Merge the executed copies ``found`` of ``chapter`` into ``dest`` (kept when it holds that merge),
    after checking each copy as the book would and that no two organisms record the same weights."""
    from moir_lib.pocket.organisms import same_weights

    copies = [read_executed(n, chapter) for n in found]
    same_weights(recorded_weights(c.summary for c in copies), f"the runs of {chapter} merged",
                 pocket_variant(found[0]) or "the pocket recipe")
    params = merge_parameters(root, chapter, found)
    sources = [{"notebook": str(c.notebook), "git_hash": (c.summary or {}).get("git_hash", "unknown")}
               for c in copies]
    if _up_to_date(dest, dest / f"{Path(chapter).name}.ipynb", params) and merged_sources(dest) == sources:
        return
    _merge(root, chapter, found, dest, params, events)
    write_json(dest / SOURCES, sources, indent=1)


def _merge(root: Path, chapter: str, found: list[Path], dest: Path, params: dict[str, Any],
           events: Any) -> None:
    """Execute ``chapter`` into ``dest`` with ``params``, shown as one task on ``events``."""
    import time

    from moir_lib.runs import run_notebook

    task = f"{Path(chapter).name} (merging {len(found)} runs)"
    if events is not None:
        events.put(("start", task))
    log.info("merging %s: %s", chapter, ", ".join(map(str, found)))
    t0 = time.perf_counter()
    shutil.rmtree(dest, ignore_errors=True)
    run_notebook(root / f"{chapter}.ipynb", dest, params, progress=False)
    if events is not None:
        events.put(("done", task, time.perf_counter() - t0))
