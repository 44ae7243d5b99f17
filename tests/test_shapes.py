"""One shape convention in the tensor-heavy modules' signatures (see :mod:`moir_lib.shapes`).

Every listed module is parsed with :mod:`ast` (nothing of it is imported). In the signatures of its
functions and methods (parameters and returns; module and class level, public or not: nested helpers
are left alone) and in the annotated attributes of its classes (dataclass fields, ``self.x: …``), a
``torch.Tensor`` / ``Tensor`` / ``np.ndarray`` must stand as the array type of a jaxtyping annotation
(``Float[torch.Tensor, "n d_in"]``), never bare. Every shape string must use the dimension names of
:data:`moir_lib.shapes.DIMENSIONS` and be one that jaxtyping accepts, and ``jaxtyping`` is imported only
under ``if TYPE_CHECKING:`` (annotation only: importing the library must not pay for it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from moir_lib.shapes import DIMENSIONS

LIBRARY = Path(__file__).resolve().parents[1] / "moir_lib"

#: The tensor-heavy modules whose signatures carry shapes.
MODULES = [
    "editing/keys.py", "editing/values.py", "editing/memit.py", "editing/alphaedit.py", "editing/base.py",
    "editing/state.py", "editing/regimes.py", "editing/snapshot.py", "editing/checkpoints.py",
    "covariance/stats.py", "covariance/products.py", "covariance/hooks.py", "covariance/estimation.py",
    "covariance/mixing.py", "covariance/diagnostics.py",
    "theory.py", "tracing.py",
    "analysis/nll.py", "analysis/divergence.py", "analysis/alignment.py",
    "pocket/train.py", "pocket/report.py",
    "generation/seeds.py", "generation/decoding.py", "generation/shards.py", "generation/keystats.py",
    "generation/plan.py", "generation/shard_writer.py",
]

ARRAYS = {"Tensor", "ndarray"}
#: jaxtyping's dtype kinds (``Float``, ``Int``, ``Bool``, ``Float64`` …), by name.
DTYPES = {"Float", "Float16", "Float32", "Float64", "BFloat16", "Int", "Int8", "Int16", "Int32", "Int64",
          "UInt", "UInt8", "Integer", "Bool", "Num", "Real", "Inexact", "Shaped", "Complex"}

#: (where, annotation) of one signature or attribute
Site = tuple[str, ast.expr]


def _sites(tree: ast.Module, path: str) -> Iterator[Site]:
    """Every annotation of a module- or class-level function's parameters and return, of a class's
    annotated attributes, and of ``self.x: …`` in its methods."""

    def functions(body: list[ast.stmt], owner: str) -> Iterator[Site]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from functions(node.body, f"{owner}{node.name}.")
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        yield f"{path}:{stmt.lineno} {owner}{node.name}.{stmt.target.id}", stmt.annotation
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{path}:{node.lineno} {owner}{node.name}"
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None and arg.annotation is not None:
                        yield f"{name}({arg.arg})", arg.annotation
                if node.returns is not None:
                    yield f"{name} -> return", node.returns
                if owner:
                    for stmt in ast.walk(node):
                        target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
                        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                and target.value.id == "self"):
                            yield f"{path}:{stmt.lineno} {owner}self.{target.attr}", stmt.annotation

    yield from functions(tree.body, "")


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def check_annotation(node: ast.expr) -> tuple[list[str], list[str]]:
    """``(bare arrays, shape strings)`` in one annotation: the arrays that stand outside the first
    argument of a jaxtyping dtype (``Float[HERE, "…"]``), and every shape string found."""
    bare: list[str] = []
    shapes: list[str] = []

    def visit(n: ast.AST, as_array: bool) -> None:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):  # a quoted forward reference
            try:
                visit(ast.parse(n.value, mode="eval").body, as_array)
            except SyntaxError:
                pass
            return
        if isinstance(n, ast.Subscript) and _name(n.value) in DTYPES:
            args = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
            if len(args) != 2 or not (isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)):
                bare.append(f"{ast.unparse(n)} (expected Dtype[array, \"shape\"])")
                return
            visit(args[0], True)
            shapes.append(args[1].value)
            return
        if _name(n) in ARRAYS and isinstance(n, (ast.Name, ast.Attribute)):
            if not as_array:
                bare.append(ast.unparse(n))
            return
        # only a union keeps the array position: Float[torch.Tensor | np.ndarray, "…"]
        keep = as_array and isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)
        for child in ast.iter_child_nodes(n):
            visit(child, keep)

    visit(node, False)
    return bare, shapes


def unknown_dimensions(shape: str) -> list[str]:
    """The names in a shape string that :data:`DIMENSIONS` does not list (``*shape``, ``...``, numbers and
    arithmetic allowed)."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", shape)
    return [n for n in names if n not in DIMENSIONS]


def _library_sites() -> Iterator[tuple[str, list[str], list[str]]]:
    for rel in MODULES:
        path = LIBRARY / rel
        tree = ast.parse(path.read_text(), filename=str(path))
        for where, annotation in _sites(tree, f"moir_lib/{rel}"):
            bare, shapes = check_annotation(annotation)
            yield where, bare, shapes


# ----------------------------------------------------------------------------- the checker itself


def _one(source: str) -> tuple[list[str], list[str]]:
    return check_annotation(ast.parse(source, mode="eval").body)


def test_the_checker_finds_bare_arrays_and_reads_shapes():
    assert _one("torch.Tensor") == (["torch.Tensor"], [])
    assert _one("Tensor | None") == (["Tensor"], [])
    assert _one("dict[int, tuple[np.ndarray, float]]") == (["np.ndarray"], [])
    assert _one("'torch.Tensor'") == (["torch.Tensor"], [])
    assert _one('Float[torch.Tensor, "d_in d_in"]') == ([], ["d_in d_in"])
    assert _one('dict[int, Float64[torch.Tensor, "d_out d_in"]] | None') == ([], ["d_out d_in"])
    assert _one('Float[torch.Tensor | np.ndarray, " n"]') == ([], [" n"])
    assert _one('Float[list[torch.Tensor], " n"]') == (["torch.Tensor"], [" n"])
    assert _one("Float[torch.Tensor]")[0] == ['Float[torch.Tensor] (expected Dtype[array, "shape"])']
    assert _one("Any") == ([], []) and _one("list[int]") == ([], [])
    assert unknown_dimensions("*shape n d_in") == [] and unknown_dimensions(" layers-1") == []
    assert unknown_dimensions("n dd") == ["dd"] and unknown_dimensions("...") == []


def test_the_checker_reads_every_signature_and_attribute():
    source = '''
import torch
from dataclasses import dataclass

def f(a: torch.Tensor, *rest: torch.Tensor, b: int = 0, **kw: np.ndarray) -> Tensor: ...

@dataclass
class Box:
    z: torch.Tensor
    ok: Float[torch.Tensor, " n"]

    def __init__(self, x: Float[torch.Tensor, " n"]) -> None:
        self.c: dict[int, torch.Tensor] = {}
        def nested(y: torch.Tensor) -> None: ...
'''
    found = {where.split(" ", 1)[1]: check_annotation(a)[0] for where, a in _sites(ast.parse(source), "m.py")}
    assert {k for k, v in found.items() if v} == {"f(a)", "f(rest)", "f(kw)", "f -> return", "Box.z",
                                                  "Box.self.c"}
    assert "Box.__init__(x)" in found and not any("nested" in k for k in found)


# ----------------------------------------------------------------------------- the library


def test_no_bare_tensor_or_array_in_the_shaped_modules():
    for rel in MODULES:
        assert (LIBRARY / rel).is_file(), f"moir_lib/{rel} is listed in MODULES but does not exist"
    bad = [f"    {where}: {', '.join(bare)}" for where, bare, _ in _library_sites() if bare]
    assert not bad, (f"{len(bad)} annotation(s) with a bare tensor/array; give each a dtype and a shape, "
                     "e.g. Float[torch.Tensor, \"n d_in\"] (names in moir_lib/shapes.py):\n" + "\n".join(bad))


def test_shapes_use_the_documented_dimension_names():
    bad = [f"    {where}: {shape!r} ({', '.join(unknown_dimensions(shape))})"
           for where, _, shapes in _library_sites() for shape in shapes if unknown_dimensions(shape)]
    assert not bad, ("dimension names that moir_lib.shapes.DIMENSIONS does not list (reuse a listed name, "
                     "or add the new one there with what it counts):\n" + "\n".join(bad))


def test_every_shape_is_one_jaxtyping_accepts():
    jaxtyping = pytest.importorskip("jaxtyping")
    import numpy as np

    seen = {shape for _, _, shapes in _library_sites() for shape in shapes}
    assert seen, "no shape annotation found in the shaped modules"
    bad = []
    for shape in sorted(seen):
        try:
            jaxtyping.Float[np.ndarray, shape]
        except Exception as exc:  # noqa: BLE001 - whatever jaxtyping raises, report it
            bad.append(f"    {shape!r}: {exc}")
    assert not bad, "shape strings jaxtyping refuses:\n" + "\n".join(bad)


def test_jaxtyping_is_imported_for_annotations_only():
    """``import jaxtyping`` costs ≈ 0.2 s: the library imports it only under ``if TYPE_CHECKING:``."""
    bad = []
    for path in sorted(LIBRARY.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        guarded: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _name(node.test) == "TYPE_CHECKING":
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "jaxtyping" for n in names) and id(node) not in guarded:
                bad.append(f"    {path.relative_to(LIBRARY.parent)}:{node.lineno}")
    assert not bad, "jaxtyping imported outside `if TYPE_CHECKING:`:\n" + "\n".join(bad)
