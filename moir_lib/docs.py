"""The documentation generated from the package: the READMEs' module maps and the shared run's defaults.

Each generated block sits between marker comments (``<!-- module-map:start -->`` …
``<!-- module-map:end -->``) in a file of :data:`GENERATED`; :func:`module_map` lists every package and
module of ``moir_lib`` with the summary of its docstring, grouped by :data:`LAYERS`, read from the source
(nothing is imported). The parameters cells of the chapters sharing the editing settings get their
defaults (:data:`moir_lib.experiments.shared.SHARED_EDITING`). :func:`stale` says which files differ
from what the package generates, :func:`regenerate` rewrites them (``moir docs [--check]``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moir_lib.experiments.shared import SHARED_EDITING

__all__ = ["GENERATED", "LAYERS", "Layer", "library_table", "module_map", "modules", "regenerate", "stale"]

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent


@dataclass(frozen=True)
class Layer:
    """One layer of the library: what it is for, and its top-level modules and packages (names under
    ``moir_lib/``, without ``.py``). A layer imports only from itself and the layers after it."""

    name: str
    about: str
    members: tuple[str, ...]


#: the library's layers, top first; every top-level module and package belongs to exactly one
LAYERS: tuple[Layer, ...] = (
    Layer("presentation", "what the book and the command line show: tables, closing texts, figures, the "
          "build; no measuring module imports it", ("chapters", "plots", "book", "cli", "docs")),
    Layer("experiments", "the editing experiments of chapters 01 and 05, composed from the measuring "
          "packages", ("experiments",)),
    Layer("measuring", "the paper's concepts, each measured on its own", (
        "editing", "covariance", "generation", "streams", "vllm_backend", "evaluation", "analysis",
        "tracing", "theory")),
    Layer("foundation", "models, profiles, data, caches and run directories", (
        "models", "profiles", "pocket", "documents", "data", "cache", "sources", "locks", "files", "results",
        "runs", "grid", "benchlog", "timings", "shapes", "widgets")),
)

MARKER = "module-map"


def _summary(path: Path) -> str:
    """The first paragraph of ``path``'s docstring on one line, its reST markup as markdown."""
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    text = re.sub(r":\w+:`(~?)([^`]+)`", _role, text)
    return text.replace("``", "`").replace("|", "\\|")


def _role(match: re.Match[str]) -> str:
    """A reST role (``:func:`~a.b``) as markdown code (`` `b` ``; without ``~``: `` `a.b` ``)."""
    tilde, target = match.groups()
    return f"`{target.rpartition('.')[2] if tilde else target}`"


def _name(path: Path) -> str:
    """``moir_lib/editing/memit.py`` -> ``editing/memit.py``; a package as ``editing/``."""
    rel = path.relative_to(PACKAGE)
    return f"{rel.parent.as_posix()}/" if rel.name == "__init__.py" else rel.as_posix()


def modules(top: str) -> list[tuple[str, str]]:
    """``(name, summary)`` of the top-level module or package ``top`` and, for a package, of every module
    and subpackage in it (sorted, a package before its modules)."""
    if (PACKAGE / f"{top}.py").is_file():
        return [(f"{top}.py", _summary(PACKAGE / f"{top}.py"))]
    files = sorted((PACKAGE / top).rglob("*.py"), key=lambda p: _name(p).replace("/", "\0"))
    return [(_name(p), _summary(p)) for p in files if p.name != "__main__.py"]


def _checked_layers() -> tuple[Layer, ...]:
    """:data:`LAYERS`, refused when a member is not in the package or a top-level module is in no layer."""
    found = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    found |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    listed = [m for layer in LAYERS for m in layer.members]
    missing = sorted(set(listed) - found)
    unplaced = sorted(found - set(listed))
    twice = sorted({m for m in listed if listed.count(m) > 1})
    if missing or unplaced or twice:
        raise ValueError(f"moir_lib.docs.LAYERS is not the package: not in moir_lib {missing}, in no layer "
                         f"{unplaced}, in two layers {twice}")
    return LAYERS


def module_map() -> str:
    """Every package and module of the library with its docstring's summary, one table per layer."""
    parts = []
    for layer in _checked_layers():
        rows = [f"| `{name}` | {summary} |" for top in layer.members for name, summary in modules(top)]
        parts.append(f"**{layer.name}**: {layer.about}.\n\n| module | what |\n|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def library_table() -> str:
    """Each top-level package and module with its docstring's summary and its modules' names."""
    rows = ["| layer | module | what | holds |", "|---|---|---|---|"]
    for layer in _checked_layers():
        for top in layer.members:
            (name, summary), *inside = modules(top)
            held = ", ".join(f"`{n.removeprefix(name)}`" for n, _ in inside)
            rows.append(f"| {layer.name} | `moir_lib/{name}` | {summary} | {held} |")
    return "\n".join(rows) + "\n"


def _between_markers(text: str, block: str, where: Path) -> str:
    """``text`` with what lies between its :data:`MARKER` comments replaced by ``block``."""
    start, end = f"<!-- {MARKER}:start -->", f"<!-- {MARKER}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{where} needs one {start} before one {end}")
    head, rest = text.split(start)
    return f"{head}{start}\n{block}{end}{rest.split(end)[1]}"


def _shared_defaults(text: str, where: Path) -> str:
    """The notebook ``text`` with the shared run's parameters in its parameters cell set to
    :data:`SHARED_EDITING`'s values, each line's comment kept in its column."""
    nb = json.loads(text)
    cell = next((c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        raise ValueError(f"{where} has no parameters cell")
    wanted, seen = SHARED_EDITING.parameters(), set()
    for i, line in enumerate(cell["source"]):
        match = re.match(r"(\w+ *= *)(.*?)( *#.*)?(\n?)$", line)
        name = match and match.group(1).partition("=")[0].strip()
        if name in wanted:
            assign, value, comment, newline = match.groups(default="")
            new = f"{assign}{wanted[name]!r}"
            column = len(assign) + len(value) + len(comment) - len(comment.lstrip())
            comment = comment and " " * max(1, column - len(new)) + comment.lstrip()
            cell["source"][i] = f"{new}{comment}{newline}"
            seen.add(name)
    if seen != set(wanted):
        raise ValueError(f"{where}'s parameters cell lacks {sorted(set(wanted) - seen)} of the shared run")
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _readme(render: Callable[[], str]) -> Callable[[str, Path], str]:
    return lambda text, where: _between_markers(text, render(), where)


#: file (relative to the repository) -> how its generated part is made from its text: the READMEs' module
#: maps, and the parameters cells of the chapters sharing the editing settings
GENERATED: dict[str, Callable[[str, Path], str]] = {
    "README.md": _readme(library_table),
    "moir_lib/README.md": _readme(module_map),
    **{f"{chapter}.ipynb": _shared_defaults for chapter in SHARED_EDITING.chapters},
}


def stale(root: Path | None = None) -> list[Path]:
    """The generated files under ``root`` (default: this package's checkout) whose text differs from what
    the package generates."""
    root, out = root or ROOT, []
    for name, make in GENERATED.items():
        path = root / name
        text = path.read_text()
        if make(text, path) != text:
            out.append(path)
    return out


def regenerate(root: Path | None = None) -> list[Path]:
    """Rewrite the generated files under ``root`` (default: this package's checkout) that are out of date;
    returns them."""
    root = root or ROOT
    changed = stale(root)
    for path in changed:
        path.write_text(GENERATED[path.relative_to(root).as_posix()](path.read_text(), path))
    return changed
