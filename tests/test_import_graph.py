"""The library's import graph: no circles, and no library module importing the command line.

Every module under ``moir_lib/`` is parsed with :mod:`ast` (nothing is imported, so this needs
no torch and takes well under a second). Each ``import`` statement counts wherever it stands —
at the top, inside a function, under ``if TYPE_CHECKING:`` — because an import hidden in a
function still ties the two modules together. ``import a.b`` depends on ``a.b``;
``from a import b`` on the module ``a.b`` when there is one, else on ``a`` (a package means its
``__init__``); relative imports are resolved against the importing module;
``importlib.import_module("a.b")`` with a literal name counts too. Importing a submodule also
runs its parents' ``__init__``, but those implicit edges are left out: they are how packages
work, not a dependency one module chose.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[1] / "moir_lib"

#: (importing module, imported module, line): one import statement's edge
Edge = tuple[str, str, int]


def module_files(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` under the package directory ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _longest_module(name: str, modules: Mapping[str, Path]) -> str | None:
    """``name`` itself, or its longest prefix that is a known module (``pkg.mod.attr`` → ``pkg.mod``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _relative_base(module: str, level: int, modules: Mapping[str, Path]) -> str:
    """The package a ``from .`` (``level`` dots) in ``module`` refers to."""
    package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def imports_of(module: str, modules: Mapping[str, Path]) -> list[Edge]:
    """The library modules ``module`` imports (anywhere in its file), one edge per name imported."""
    tree = ast.parse(modules[module].read_text(), filename=str(modules[module]))
    edges = []

    def add(target: str, line: int) -> None:
        found = _longest_module(target, modules)
        if found is not None and found != module:
            edges.append((module, found, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(p for p in (_relative_base(module, node.level, modules), base) if p)
            for alias in node.names:
                # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_import_call(node.func)):
            add(node.args[0].value, node.lineno)
    return edges


def _is_import_call(func: ast.expr) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[Edge]]:
    """``{module: modules it imports}`` over every module under ``root``, and the edges with lines."""
    modules = module_files(root)
    edges = [e for m in modules for e in imports_of(m, modules)]
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for src, dst, _ in edges:
        graph[src].add(dst)
    return graph, edges


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles: every strongly connected component with more than one module, each
    sorted, in sorted order (Tarjan's algorithm, iterative; self-imports are ignored)."""
    succ = {v: sorted(set(ws) - {v}) for v, ws in graph.items()}
    for ws in list(succ.values()):
        for w in ws:
            succ.setdefault(w, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def cycle_path(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One shortest circle through the first module of ``component``: ``[a, b, …, a]``."""
    inside = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph.get(v, ())):
            if w not in inside:
                continue
            if w == start and v != start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise ValueError(f"{component} is not a circle")


def describe_cycle(graph: Mapping[str, Iterable[str]], edges: list[Edge], component: list[str],
                   modules: Mapping[str, Path]) -> str:
    """``a -> b -> a`` with the import lines that make each step."""
    path = cycle_path(graph, component)
    steps = []
    for src, dst in zip(path, path[1:], strict=False):
        lines = sorted({line for s, d, line in edges if s == src and d == dst})
        where = modules[src].relative_to(LIBRARY.parent)
        steps.append(f"    {src} -> {dst}  ({where}:{', '.join(map(str, lines))})")
    return " <-> ".join(component) + "\n" + "\n".join(steps)


def is_cli(module: str) -> bool:
    """The command-line package (``moir_lib/cli.py`` or ``moir_lib/cli/``), or ``moir_lib.__main__``."""
    return module in ("moir_lib.cli", "moir_lib.__main__") or module.startswith("moir_lib.cli.")


# ----------------------------------------------------------------------------- the finder itself


def test_find_cycles_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f", "e"}, "f": {"e"}, "g": {"g"}}
    assert find_cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    # a long chain closed at the end (deep enough to break a recursive finder's default limit)
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(3000)}
    chain["m3000"] = {"m0"}
    assert find_cycles(chain) == [sorted(chain)]


def test_imports_are_read_everywhere_and_resolved(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import A\n",
        "a.py": "A = 1\ndef f():\n    from . import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import a\nfrom ..b import thing\nimport pkg.sub\n",
        "d.py": "import importlib\nimportlib.import_module('pkg.a')\nfrom pkg import sub\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph, edges = import_graph(pkg)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": set(),
                     "pkg.sub.c": {"pkg.a", "pkg.b", "pkg.sub"}, "pkg.d": {"pkg.a", "pkg.sub"}}
    assert ("pkg.a", "pkg.b", 3) in edges
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


# ----------------------------------------------------------------------------- the library


@pytest.fixture(scope="module")
def library() -> tuple[dict[str, set[str]], list[Edge], dict[str, Path]]:
    graph, edges = import_graph(LIBRARY)
    return graph, edges, module_files(LIBRARY)


def test_the_library_has_no_import_circles(library):
    graph, edges, modules = library
    assert len(modules) > 20, f"found only {sorted(modules)} under {LIBRARY}"
    circles = find_cycles(graph)
    assert not circles, (f"{len(circles)} import circle(s); move the shared piece to the module that owns "
                         "the concept (a function-local import does not break a circle):\n"
                         + "\n".join(describe_cycle(graph, edges, c, modules) for c in circles))


def test_no_library_module_imports_the_command_line(library):
    _, edges, modules = library
    bad = sorted({(src, dst, line) for src, dst, line in edges if is_cli(dst) and not is_cli(src)})
    assert not bad, ("the library must not import the command line (moir_lib/cli); these do:\n"
                     + "\n".join(f"    {modules[s].relative_to(LIBRARY.parent)}:{line} imports {d}"
                                 for s, d, line in bad))


def test_only_the_command_line_imports_the_chapters(library):
    """The chapters (moir_lib/chapters) sit on top: they present what experiments, analysis, theory and
    tracing measure, and only the command line may call into them."""
    _, edges, modules = library
    bad = sorted({(src, dst, line) for src, dst, line in edges if _within(dst, "moir_lib.chapters")
                  and not (_within(src, "moir_lib.chapters") or is_cli(src))})
    assert not bad, ("only moir_lib/chapters and moir_lib/cli may import the chapters; these do:\n"
                     + "\n".join(f"    {modules[s].relative_to(LIBRARY.parent)}:{line} imports {d}"
                                 for s, d, line in bad))


#: The one-way dependencies of DESIGN.md: (importer prefix, imported prefix, why it must not).
FORBIDDEN = [
    ("moir_lib.theory", "moir_lib", "the proof check must not trust the code it checks"),
    ("moir_lib.evaluation", "moir_lib.editing", "metrics judge any model, edited by anything"),
    ("moir_lib.plots", "moir_lib.models", "figures read tidy tables, never live models"),
]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_dependencies_point_one_way(library):
    _, edges, modules = library
    bad = [f"    {modules[s].relative_to(LIBRARY.parent)}:{line} imports {d} ({why})"
           for importer, imported, why in FORBIDDEN
           for s, d, line in edges
           if _within(s, importer) and _within(d, imported) and not _within(d, importer)]
    assert not bad, "imports against DESIGN.md's direction:\n" + "\n".join(sorted(bad))


# ----------------------------------------------------------------------------- rooms small enough to read

#: The most lines a module may have: split a longer one by concept.
MAX_MODULE_LINES = 800
#: The most parameters a hand-written function or method may take (``self``/``cls`` not counted; ``*args`` and
#: ``**kwargs`` count one each): group the rest into a settings record that travels whole.
MAX_PARAMETERS = 8
#: ``"moir_lib/<path>.py::<qualname>"`` -> why that function may take more than :data:`MAX_PARAMETERS`.
ARITY_ALLOWANCE: dict[str, str] = {}


def test_no_module_is_too_long_to_read():
    long = {str(f.relative_to(LIBRARY.parent)): n for f in LIBRARY.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def parameter_counts(source: str) -> dict[str, int]:
    """``{qualname: parameters}`` of every function and method defined in ``source`` (nested ones too,
    ``outer.inner``); positional-only, positional and keyword-only parameters count, ``*args`` and
    ``**kwargs`` one each, a method's first ``self``/``cls`` does not."""
    counts: dict[str, int] = {}

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                if in_class and positional and positional[0].arg in ("self", "cls"):
                    n -= 1
                counts[f"{prefix}{node.name}"] = n
                visit(node.body, f"{prefix}{node.name}.", False)

    visit(ast.parse(source).body, "", False)
    return counts


def test_parameters_are_counted_from_the_source():
    source = ("def f(a, /, b, *args, c=1, **kwargs):\n"
              "    def inner(x, y):\n        pass\n"
              "class A:\n"
              "    def m(self, a, *, b):\n        pass\n"
              "    @classmethod\n    def k(cls, a):\n        pass\n"
              "    @staticmethod\n    def s(a, b):\n        pass\n"
              "    x: int = 0\n"
              "async def g(self):\n    pass\n")
    assert parameter_counts(source) == {"f": 5, "f.inner": 2, "A.m": 2, "A.k": 1, "A.s": 2, "g": 1}


def test_no_function_takes_more_than_eight_parameters():
    sizes = {f"{f.relative_to(LIBRARY.parent)}::{name}": n for f in sorted(LIBRARY.rglob("*.py"))
             for name, n in parameter_counts(f.read_text()).items()}
    big = {key: n for key, n in sizes.items() if n > MAX_PARAMETERS and key not in ARITY_ALLOWANCE}
    stale = sorted(key for key in ARITY_ALLOWANCE if sizes.get(key, 0) <= MAX_PARAMETERS)
    assert not big, f"functions over {MAX_PARAMETERS} parameters (group them into a settings record): {big}"
    assert not stale, f"allowances no longer needed (remove them from ARITY_ALLOWANCE): {stale}"


# ----------------------------------------------------------------------------- one name, one module

#: Packages whose modules are named after another module on purpose: ``cli/<name>.py`` is the
#: ``moir <name>`` command of the library's ``<name>``, ``plots/<name>.py`` the figures of the chapter or
#: analysis module ``<name>``.
MIRRORS = ("cli", "plots")


def test_module_names_are_unique_outside_the_mirrors():
    """A reader who meets ``runner.py`` or ``selection.py`` should not have to ask which: a module's name
    appears once in the library, but for ``__init__.py`` and the :data:`MIRRORS` of another module."""
    names: dict[str, list[str]] = {}
    for f in LIBRARY.rglob("*.py"):
        rel = f.relative_to(LIBRARY)
        if f.name != "__init__.py" and rel.parts[0] not in MIRRORS:
            names.setdefault(f.name, []).append(str(rel))
    repeated = {n: where for n, where in names.items() if len(where) > 1}
    assert not repeated, f"module names used twice (rename one by its concept): {repeated}"
