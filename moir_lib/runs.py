"""Run one chapter with papermill: its parameters, checked before anything executes (``moir run``).

:func:`run_notebook` executes a chapter into a run directory, after :func:`resolve_parameters`
checks every parameter name and type against the notebook's ``parameters`` cell; the command lives
in :mod:`moir_lib.cli.runs`. :func:`notebook_problems` and :func:`strip_outputs` keep the committed
notebooks output-free (``moir nbcheck``). The book, which executes every chapter side by side and
builds the HTML from the executed copies, is :mod:`moir_lib.book`.
"""

from __future__ import annotations

import ast
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moir_lib.widgets import headless_kernels

__all__ = [
    "KERNEL_ARGUMENTS",
    "ChapterFailed",
    "notebook_parameters",
    "notebook_problems",
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
               "type": SETTING if name in SETTING_PARAMETERS
               else NONE_DEFAULT_TYPES.get(name, "NoneType") if p["default"].strip() == "None"
               else _literal_type(p["default"], p["inferred_type_name"])}
        for name, p in found.items()
    }


#: the type of a parameter whose default is None (None keeps its documented meaning; any other value
#: must have this type, so a typo fails here, not in a cell mid-run)
NONE_DEFAULT_TYPES: dict[str, str] = {"context_templates": "int", "coverage_k": "int",
                                      "domain_corpora": "dict", "mixture": "dict"}


#: parameters that take an editor's strength: "auto" (select it), a number (pin it), None (the profile's) or
#: a dict per C of those (:func:`moir_lib.experiments.selection.select_each`); their type is :data:`SETTING`
SETTING_PARAMETERS: frozenset[str] = frozenset({"taus", "lambdas"})
SETTING = "auto, number, None or dict"
#: the parameter naming the pocket organisms a chapter runs on (:func:`moir_lib.pocket.organisms.check_list`)
ORGANISMS = "organisms"


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
                 progress: bool = True, on_cell: Callable[[int, int], None] | None = None) -> Path:
    """Execute ``notebook`` with papermill into ``out_dir/<name>.ipynb``.

    ``out_dir`` (absolute) is injected as the ``out_dir`` parameter when the notebook
    declares one, so every chapter writes its ``summary.json`` beside its executed copy.
    ``progress`` shows papermill's bar of cells; ``on_cell(n, m)`` is called as the ``n``-th of the
    ``m`` code cells starts. Raises :class:`ChapterFailed` with the failing cell's error.
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
    _register_engine()
    try:
        with headless_kernels():  # explorers render static views: no widget messages to wait on
            pm.execute_notebook(str(src), str(executed), parameters=params, cwd=str(src.parent),
                                progress_bar=progress, kernel_name="python3", engine_name=ENGINE,
                                extra_arguments=list(KERNEL_ARGUMENTS), on_cell=on_cell)
    except PapermillExecutionError as err:
        raise ChapterFailed(f"{src.name}: cell {err.exec_count} failed with {err.ename}: {err.evalue} "
                            f"(executed copy: {executed})") from err
    return executed


@functools.cache
def _register_engine() -> None:
    """Register :data:`ENGINE` (once): papermill's nbclient engine that reports each code cell it starts."""
    from papermill.engines import NBClientEngine, papermill_engines

    class _CellEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str,
                                     on_cell: Callable[[int, int], None] | None = None, **kwargs: Any) -> Any:
            if on_cell is not None:  # numbered among the parameterised notebook's code cells
                cells = nb_man.nb.cells
                code = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()]
                number = {index: n for n, index in enumerate(code, 1)}
                kwargs["on_cell_execute"] = lambda cell, cell_index: on_cell(number.get(cell_index, 0),
                                                                             len(code))
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

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
