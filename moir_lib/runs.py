"""Run one chapter with papermill: its parameters, checked before anything executes (``moir run``).

:func:`run_notebook` executes a chapter into a run directory, after :func:`resolve_parameters`
checks every parameter name and type against the notebook's ``parameters`` cell; the command lives
in :mod:`moir_lib.cli.runs`. A run is published only once it has finished: the executed notebook
and the chapter's results (:func:`moir_lib.results.results_dir`) are written into the run
directory's staging folder and moved beside the previous run's data when the last cell is done, so
a run killed mid-way leaves the previous run's notebook and summary whole (the chapters' point
stores, ``results.parquet`` and ``items.parquet``, stay in the run directory itself: a rerun
resumes from them). :func:`parameter_values` gives a running chapter its parameters as its run has them
(what its ``summary.json`` records); :func:`executed_parameters` reads back what an executed notebook ran
with.
:func:`notebook_problems` and :func:`strip_outputs` keep the committed notebooks output-free
(``moir nbcheck``). The book, which executes every chapter side by side and builds the HTML from
the executed copies, is :mod:`moir_lib.book`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moir_lib.locks import DIR_LOCK, dir_lock_path, exclusive
from moir_lib.results import RUN_ENV, STAGING, SUMMARY_NAME
from moir_lib.widgets import headless_kernels

__all__ = [
    "KERNEL_ARGUMENTS",
    "ChapterFailed",
    "executed_parameters",
    "failed_copy",
    "notebook_parameters",
    "notebook_problems",
    "parameter_values",
    "resolve_parameters",
    "run_notebook",
    "strip_outputs",
]

log = logging.getLogger(__name__)

#: arguments of every kernel a chapter runs in: ipykernel logs errors only, so its start-up warning
#: about unencrypted TCP to papermill on this machine stays out of the terminal of ``moir run`` and
#: ``moir book`` (the kernel writes its log to the terminal it inherits)
KERNEL_ARGUMENTS = ("--log-level=ERROR",)
#: the papermill engine of :func:`run_notebook` (registered by :func:`_register_engine`)
ENGINE = "moir"


class ChapterFailed(RuntimeError):
    """A notebook cell raised; carries the cell's error and the executed copy's path."""


# --------------------------------------------------------------------------- parameters


def notebook_parameters(notebook: str | Path) -> dict[str, dict[str, Any]]:
    """The ``parameters`` cell of ``notebook``: name -> {default, type, help}. A parameter's type is its
    annotation where it has one (``context_templates: int = None``: ``None`` or an int; ``taus: "Setting" =
    "auto"``: :data:`SETTING`), else its default's."""
    import papermill as pm

    path = Path(notebook)
    if not path.is_file():
        raise FileNotFoundError(f"notebook not found: {path}")
    found = pm.inspect_notebook(str(path))
    if not found:
        raise ValueError(f"{path} has no cell tagged 'parameters' (papermill needs one)")
    return {name: {"default": p["default"], "help": p["help"],
                   "type": _declared_type(p["default"], p["inferred_type_name"])}
            for name, p in found.items()}


#: the annotation of a parameter that takes an editor's strength: "auto" (select it), a number (pin it),
#: None (the profile's) or a dict per C of those (:func:`moir_lib.experiments.selection.select_each`)
SETTING_ANNOTATION = "Setting"
SETTING = "auto, number, None or dict"
#: the parameter naming the pocket organisms a chapter runs on (:func:`moir_lib.pocket.organisms.check_list`)
ORGANISMS = "organisms"
#: the chapters' notebooks in this checkout
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _declared_type(default: str, annotation: str) -> str:
    """A parameter's type name: its annotation's (papermill reads it; ``"None"`` when there is none), else
    its default literal's (``1_000`` is an int, which papermill's inference misses); a ``None`` default
    without an annotation takes any value."""
    if annotation not in ("None", ""):
        return SETTING if annotation == SETTING_ANNOTATION else annotation
    if default.strip() == "None":
        return "NoneType"
    try:
        return type(ast.literal_eval(default)).__name__
    except (ValueError, SyntaxError):
        return "None"


def parameter_values(chapter: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values in ``namespace`` of the parameters of ``chapter`` (the names its parameters cell in
    :data:`NOTEBOOKS` declares): a chapter's first code cell passes ``globals()``, which then holds its
    defaults with the values its run was given, so its ``summary.json`` records what it ran with."""
    names = notebook_parameters(NOTEBOOKS / f"{chapter}.ipynb")
    missing = sorted(set(names) - set(namespace))
    if missing:
        raise ValueError(f"{chapter}: parameters {missing} are not defined; call this after the parameters "
                         f"cell")
    return {name: namespace[name] for name in names}


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
    if kind == SETTING:
        if value == "auto" or isinstance(value, dict) or (isinstance(value, int | float)
                                                          and not isinstance(value, bool)):
            return value
        raise ValueError(f"parameter {name!r} expects 'auto', a number, None or a dict per C, got {value!r}")
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
    if ORGANISMS in resolved:
        from moir_lib.pocket.organisms import check_list

        check_list(resolved[ORGANISMS], f"parameter {ORGANISMS!r} got")
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
                 progress: bool = True, on_cell: Callable[[int, int], None] | None = None,
                 before_publish: Callable[[Path], None] | None = None) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/<name>.ipynb``, published once it has finished.

    ``out_dir`` (absolute) is injected as the ``out_dir`` parameter when the notebook
    declares one, so every chapter writes its ``summary.json`` beside its executed copy.
    ``progress`` shows papermill's bar of cells; ``on_cell(n, m)`` is called as the ``n``-th of the
    ``m`` code cells starts.

    The executed copy and the chapter's results are written into ``out_dir``'s staging folder
    (:data:`~moir_lib.results.STAGING`, locked: a second run into ``out_dir`` is refused with
    :class:`~moir_lib.locks.Busy`) and moved into ``out_dir`` when the run has finished: its tables
    first, then anything ``before_publish(staging)`` writes there, then the notebook, ``summary.json``
    last (a run directory with a summary counts as finished). A run killed mid-way leaves the previous
    run's files as they were (the next run clears what it left). Raises :class:`ChapterFailed` with the
    failing cell's error; the failed copy goes to :func:`failed_copy`, the previous run kept.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src = Path(notebook).resolve()
    out = Path(out_dir).resolve()
    params = dict(parameters or {})
    if "out_dir" in notebook_parameters(src):
        params.setdefault("out_dir", str(out))
    staging = out / STAGING
    with exclusive(dir_lock_path(staging), f"run directory {out}"):
        _clear(staging)
        executed = staging / src.name
        log.info("executing %s -> %s with %s", src.name, out / src.name, params)
        _register_engine()
        try:
            with headless_kernels():  # explorers render static views: no widget messages to wait on
                pm.execute_notebook(str(src), str(executed), parameters=params, cwd=str(src.parent),
                                    progress_bar=progress, kernel_name="python3", engine_name=ENGINE,
                                    extra_arguments=list(KERNEL_ARGUMENTS), on_cell=on_cell,
                                    kernel_env={RUN_ENV: str(out)})
        except PapermillExecutionError as err:
            failed = failed_copy(out, src.name)
            os.replace(executed, failed)
            kept = f"; the previous run in {out} is kept" if (out / src.name).is_file() else ""
            raise ChapterFailed(f"{src.name}: cell {err.exec_count} failed with {err.ename}: {err.evalue} "
                                f"(executed copy: {failed}{kept})") from err
        if before_publish is not None:
            before_publish(staging)
        _publish(staging, out, src.name)
        shutil.rmtree(staging, ignore_errors=True)
    return out / src.name


def failed_copy(out_dir: str | Path, name: str) -> Path:
    """Where the executed copy of a failed run of notebook ``name`` into ``out_dir`` is kept for reading:
    ``<stem>.failed.ipynb`` (no chapter's name, so the book never takes it for a run)."""
    return Path(out_dir) / f"{Path(name).stem}.failed.ipynb"


def _clear(staging: Path) -> None:
    """Empty ``staging`` of what a killed run left (its lock file, held now, stays)."""
    staging.mkdir(parents=True, exist_ok=True)
    for path in staging.iterdir():
        if path.name == DIR_LOCK:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _publish(staging: Path, out: Path, name: str) -> None:
    """Move a finished run's files from ``staging`` into ``out``: its other files, the notebook ``name``,
    then ``summary.json``; a run that wrote no summary removes the previous run's (it would sit beside
    another run's notebook), as a successful run removes the copy of an earlier failed one."""
    files = sorted(p.name for p in staging.iterdir() if p.is_file() and p.name != DIR_LOCK)
    last = [n for n in (name, SUMMARY_NAME) if n in files]
    if SUMMARY_NAME not in files:
        (out / SUMMARY_NAME).unlink(missing_ok=True)
    for file in [n for n in files if n not in last] + last:
        os.replace(staging / file, out / file)
    failed_copy(out, name).unlink(missing_ok=True)


def notebook_defaults(notebook: str | Path) -> dict[str, Any]:
    """The values of ``notebook``'s parameters cell defaults (a default that is no literal, such as a call,
    is left out)."""
    found: dict[str, Any] = {}
    for name, declared in notebook_parameters(notebook).items():
        with contextlib.suppress(ValueError, SyntaxError):
            found[name] = ast.literal_eval(declared["default"])
    return found


def executed_parameters(notebook: str | Path) -> dict[str, Any]:
    """The parameters the executed ``notebook`` ran with: the values its run was given (papermill's record
    of the injected parameters), else its :func:`notebook_defaults`."""
    import nbformat

    given = ((nbformat.read(str(notebook), as_version=4).metadata.get("papermill") or {})
             .get("parameters") or {})
    return {**notebook_defaults(notebook), **given}


@functools.cache
def _register_engine() -> None:
    """Register :data:`ENGINE` (once): papermill's nbclient engine that reports each code cell it starts."""
    from papermill.engines import NBClientEngine, papermill_engines

    class _CellEngine(NBClientEngine):
        """nbclient's engine, reporting each code cell it starts (``on_cell``) and starting the kernel with
        ``kernel_env`` added to this process's environment."""

        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str,
                                     on_cell: Callable[[int, int], None] | None = None,
                                     kernel_env: dict[str, str] | None = None, **kwargs: Any) -> Any:
            """``kwargs``: what papermill gives every engine (``log_output``, ``stdout_file``,
            ``stderr_file``, ``start_timeout``, ``execution_timeout``, ``input_path``, nbclient's options)."""
            from papermill.clientwrap import PapermillNotebookClient

            kwargs.pop("input_path", None)
            if on_cell is not None:  # numbered among the parameterised notebook's code cells
                cells = nb_man.nb.cells
                code = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()]
                number = {index: n for n, index in enumerate(code, 1)}
                kwargs["on_cell_execute"] = lambda cell, cell_index: on_cell(number.get(cell_index, 0),
                                                                             len(code))
            client = PapermillNotebookClient(nb_man, kernel_name=kernel_name,
                                             timeout=kwargs.pop("execution_timeout", None),
                                             startup_timeout=kwargs.pop("start_timeout", 60),
                                             log=logging.getLogger("papermill"), **kwargs)
            return client.execute(env={**os.environ, **(kernel_env or {})})

    papermill_engines.register(ENGINE, _CellEngine)


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
