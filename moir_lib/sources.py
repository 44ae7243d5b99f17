"""The code a computation runs, and its fingerprint: what a cached result is keyed by besides its inputs.

:func:`closure` follows, from ``entries``, every ``moir_lib`` module Python runs to import them and what they
import — at the top of a module or inside a function (the library imports lazily), ``from … import`` and
``import …``, relative or absolute — with the rules Python itself follows:

* a module's parent packages run before it (``import moir_lib.a.b`` runs ``moir_lib/a/__init__.py``), so
  they and what they import are in the closure;
* ``from pkg import name`` is the submodule ``pkg.name`` when there is one, else ``pkg`` itself;
* an import under ``if TYPE_CHECKING:`` never runs: it is not followed;
* an import by computed name (``importlib.import_module(f"moir_lib.editing.{name}")``) brings in every module
  whose name starts with the literal part of that name (every module of the importing package when it has
  none).

:func:`digest` hashes the closure's syntax trees (:func:`ast.dump`, without line numbers), docstrings and
other bare string statements removed: comments, docstrings and line wrapping do not count, every other
edit does. A tree's dump is stable within one Python version, so the version (``major.minor``) is part of
the digest. Docstrings are kept when a module of the closure reads ``__doc__`` (they could then change
what it computes). Data files the computation reads (``data``: glob patterns under the repository root)
are hashed byte for byte, with their names.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

__all__ = ["PACKAGE", "REPO", "closure", "digest", "modules"]

#: the package whose modules are followed (imports of anything else are the environment, not the code)
PACKAGE = "moir_lib"
#: the repository root: the folder holding :data:`PACKAGE` and ``data/``
REPO = Path(__file__).resolve().parents[1]


def modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of :data:`PACKAGE` under ``root``: dotted name -> file (a package's: ``__init__.py``)."""
    out = {}
    for f in sorted((root / PACKAGE).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def closure(entries: Iterable[str], root: Path = REPO) -> tuple[str, ...]:
    """The modules ``entries`` (dotted names) run, sorted (see the module's docstring for the rules);
    ``ValueError`` for an entry that is not a module under ``root``."""
    found = modules(root)
    return tuple(sorted(_closure(entries, found)))


def digest(entries: Iterable[str], data: Iterable[str] = (), root: Path = REPO) -> str:
    """Fingerprint of the code :func:`closure` finds from ``entries`` (syntax trees without docstrings),
    of the Python version and of the files matching ``data`` under ``root``."""
    facts = _closure(entries, modules(root))
    keep_docs = any(f.reads_doc for f in facts.values())
    h = hashlib.sha256(f"python {sys.version_info.major}.{sys.version_info.minor}".encode())
    for name in sorted(facts):
        h.update(f"\0{name}\0{facts[name].tree if keep_docs else facts[name].code}".encode())
    h.update(_files_digest(tuple(data), root).encode())
    return h.hexdigest()[:16]


def _files_digest(patterns: tuple[str, ...], root: Path = REPO) -> str:
    """Fingerprint of the files under ``root`` matching the glob ``patterns`` (names and contents)."""
    h = hashlib.sha256()
    for pattern in patterns:
        for f in sorted(root.glob(pattern)):
            if f.is_file():
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- one module


class _Facts(NamedTuple):
    """What :func:`closure` and :func:`digest` need of one module."""

    named: frozenset[str]  # the modules of the package it names in its imports (dotted)
    prefixes: tuple[str, ...]  # the name prefixes of its imports by computed name
    reads_doc: bool  # whether it reads ``__doc__``
    tree: str  # SHA-256 of its syntax tree (without line numbers)
    code: str  # the same without bare string statements (docstrings: they compute nothing)


def _closure(entries: Iterable[str], found: dict[str, Path]) -> dict[str, _Facts]:
    """The modules ``entries`` run (of ``found``), with their facts."""
    todo = list(entries)
    for name in todo:
        if name not in found:
            raise ValueError(f"{name} is not a module of {found.get(PACKAGE, Path(PACKAGE)).parent}")
    seen: dict[str, _Facts] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = found[name]
        facts = seen[name] = _facts(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        reached = {_resolve(n, found) for n in facts.named}
        reached |= {m for m in found if m.startswith(facts.prefixes)}
        reached |= {m.rpartition(".")[0] for m in [name, *reached] if "." in m}  # parents run first
        todo += [m for m in reached if m and m not in seen]
    return seen


@functools.lru_cache(maxsize=4096)
def _facts(source: str, name: str, is_package: bool) -> _Facts:
    """:class:`_Facts` of ``source``, the module ``name``."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    named: set[str] = set()
    prefixes: set[str] = set()
    for node in _running_nodes(tree):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            named |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                named.add(arg.value)
            else:
                lead = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else None
                literal = lead.value if isinstance(lead, ast.Constant) and isinstance(lead.value, str) else ""
                prefixes.add(literal if literal.startswith(PACKAGE) else package)
    reads_doc = any((isinstance(n, ast.Name) and n.id == "__doc__")
                    or (isinstance(n, ast.Attribute) and n.attr == "__doc__") for n in ast.walk(tree))
    full = _sha(ast.dump(tree))
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                setattr(node, field, [s for s in body if not _is_bare_string(s)])
    own = frozenset(n for n in named if n == PACKAGE or n.startswith(PACKAGE + "."))
    return _Facts(own, tuple(sorted(prefixes)), reads_doc, full, _sha(ast.dump(tree)))


def _running_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that can run: the body of ``if TYPE_CHECKING:`` left out (its ``else`` kept)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo += node.orelse
            continue
        todo += list(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _is_dynamic_import(func: ast.expr) -> bool:
    return ((isinstance(func, ast.Attribute) and func.attr == "import_module")
            or (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")))


def _is_bare_string(stmt: ast.AST) -> bool:
    value = stmt.value if isinstance(stmt, ast.Expr) else None
    return isinstance(value, ast.Constant) and isinstance(value.value, str)


def _resolve(name: str, found: dict[str, Path]) -> str:
    """``name`` if it is a module, else the longest module its dotted prefix names (an attribute of it)."""
    while name and name not in found:
        name = name.rpartition(".")[0]
    return name


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
