"""A point's code identity (:func:`moir_lib.experiments.identity.code_identity`): the import closure of the
lab, hashed as syntax trees. Every module the closure holds changes the key when a line of it that computes
changes; a docstring or comment does not, nor does the presentation (``chapters/``, ``plots/``, …)."""

from __future__ import annotations

import ast
import contextlib
import io
import shutil
import subprocess
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from moir_lib import sources
from moir_lib.experiments.editability import REPORT_MODULES
from moir_lib.experiments.identity import POINT_DATA, POINT_MODULES, code_identity

ROOT = Path(__file__).resolve().parents[1]
PRESENTATION = ("moir_lib.chapters", "moir_lib.plots", "moir_lib.book", "moir_lib.cli")
#: modules that compute or score a point: each must be in its closure
COMPUTING = ("experiments.lab", "experiments.experiment", "experiments.measure", "experiments.records",
             "experiments.specs", "experiments.distortion", "experiments.identity", "experiments.rows",
             "editing.memit", "editing.alphaedit", "editing.base", "editing.values", "editing.keys",
             "covariance.recipes", "covariance.estimation", "generation.decoding",
             "evaluation.counterfact.pipeline", "evaluation.counterfact.fluency", "evaluation.scores",
             "evaluation.uncertainty", "evaluation.preservation.evaluate_suite", "analysis.nll", "models",
             "pocket.train", "pocket.benchmarks", "documents", "data", "streams")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the package's sources and of the data the numbers read (no caches, no notebooks)."""
    root = tmp_path_factory.mktemp("repo")
    for part in ("moir_lib", "data/tasks"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _key(root: Path) -> str:
    return sources.digest(POINT_MODULES, POINT_DATA, root)


@contextlib.contextmanager
def _edited(path: Path, text: str) -> Iterator[None]:
    """``path`` holds ``text`` inside the block, its own text again after it."""
    before = path.read_text()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(before)


def _number_changed(source: str) -> str | None:
    """``source`` with its first number literal (outside docstrings) changed to another value; None when
    it has none."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.NUMBER:
            continue
        value = ast.literal_eval(tok.string)
        if isinstance(value, complex):
            continue
        new = str(value + 1) if isinstance(value, int) else repr(value * 2 + 1)
        lines = source.splitlines(keepends=True)
        row, col = tok.start[0] - 1, tok.start[1]
        lines[row] = lines[row][:col] + new + lines[row][tok.end[1]:]
        return "".join(lines)
    return None


def test_the_point_closure_holds_every_module_that_computes_and_no_presentation():
    closure = sources.closure(POINT_MODULES)
    missing = [m for m in COMPUTING if f"moir_lib.{m}" not in closure]
    assert not missing, f"modules that compute a point are outside its code identity: {missing}"
    shown = [m for m in closure if m.startswith(PRESENTATION)]
    assert not shown, f"the presentation entered a point's code identity: {shown}"
    assert code_identity() == _key(ROOT)
    report = sources.closure(REPORT_MODULES)
    assert set(closure) < set(report) and "moir_lib.tracing" in report
    assert not [m for m in report if m.startswith(PRESENTATION)]


def test_a_computing_edit_in_every_module_of_the_closure_changes_the_key(tree):
    """For each module of the closure, its first number literal changed (or, in a module without one, a
    statement appended) changes the key."""
    base = _key(tree)
    unchanged = []
    for name in sources.closure(POINT_MODULES, tree):
        path = sources.modules(tree)[name]
        source = path.read_text()
        edited = _number_changed(source) or source + "\n_PROBE = 1\n"
        with _edited(path, edited):
            if _key(tree) == base:
                unchanged.append(name)
    assert not unchanged, f"a computing edit kept the key of: {unchanged}"
    assert _key(tree) == base
    task = next((tree / "data" / "tasks").glob("*.yaml"))
    with _edited(task, task.read_text() + "\n# another task setting\n"):
        assert _key(tree) != base  # a data file counts byte for byte


def test_docstrings_comments_and_wrapping_keep_the_key(tree):
    base = _key(tree)
    changed = []
    for name in sources.closure(POINT_MODULES, tree):
        path = sources.modules(tree)[name]
        source = path.read_text()
        tree_ = ast.parse(source)
        lines = source.splitlines(keepends=True)
        for node in [tree_, *ast.walk(tree_)]:  # every docstring reworded (line counts kept)
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                row = body[0].lineno - 1
                lines[row] = lines[row].replace('"""', '"""Reworded: ', 1)
        edited = "# a new comment\n\n" + "".join(lines)
        with _edited(path, edited):
            if _key(tree) != base:
                changed.append(name)
    assert not changed, f"a docstring or comment edit changed the key of: {changed}"


def test_presentation_edits_keep_the_key(tree):
    base = _key(tree)
    for package in ("chapters", "plots", "book", "cli"):
        path = next((tree / "moir_lib" / package).glob("*.py"))
        with _edited(path, path.read_text() + "\n_PROBE = 1\n"):
            assert _key(tree) == base, path


def test_the_closure_follows_python_s_import_rules(tmp_path):
    """Lazy and relative imports are followed, parents run first, ``TYPE_CHECKING`` imports are not, an
    import by computed name brings its package in; names of other packages are the environment."""
    pkg = tmp_path / "moir_lib"
    files = {
        "__init__.py": "",
        "entry.py": """
            from typing import TYPE_CHECKING
            import numpy
            from .sub import helper
            if TYPE_CHECKING:
                from moir_lib import typed_only
            else:
                from moir_lib import untyped
            def later():
                from moir_lib.lazy import thing
                return thing
        """,
        "sub/__init__.py": "from moir_lib.sub.parent_only import x",
        "sub/helper.py": """
            import importlib
            def get(n):
                return importlib.import_module(f"moir_lib.dyn.{n}")
        """,
        "sub/parent_only.py": "x = 1",
        "typed_only.py": "", "untyped.py": "", "lazy.py": "thing = 1", "unused.py": "",
        "dyn/__init__.py": "", "dyn/a.py": "", "dyn/b.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(textwrap.dedent(text))
    assert sources.closure(["moir_lib.entry"], tmp_path) == (
        "moir_lib", "moir_lib.dyn", "moir_lib.dyn.a", "moir_lib.dyn.b", "moir_lib.entry", "moir_lib.lazy",
        "moir_lib.sub", "moir_lib.sub.helper", "moir_lib.sub.parent_only", "moir_lib.untyped")
    with pytest.raises(ValueError, match="moir_lib.nowhere is not a module of"):
        sources.closure(["moir_lib.nowhere"], tmp_path)
    before = sources.digest(["moir_lib.entry"], root=tmp_path)
    (pkg / "lazy.py").write_text('"""Now documented."""\n# and commented\nthing = (\n    1\n)\n')
    assert sources.digest(["moir_lib.entry"], root=tmp_path) == before
    (pkg / "lazy.py").write_text("thing = 2\n")
    assert sources.digest(["moir_lib.entry"], root=tmp_path) != before
    (pkg / "untyped.py").write_text("def f():\n    return f.__doc__\n")  # a docstring that is read counts
    before = sources.digest(["moir_lib.entry"], root=tmp_path)
    (pkg / "lazy.py").write_text('"""Now documented."""\nthing = 2\n')
    assert sources.digest(["moir_lib.entry"], root=tmp_path) != before


COMPUTE_A_POINT = """
import sys
from moir_lib.experiments import EditSettings, EvalSettings, Lab, PointStore, ExperimentSpec
lab = Lab("pocket-micro", PointStore(sys.argv[1], shared=False), editing=EditSettings(context_templates=1),
          evaluation=EvalSettings(n_eval=3, pres_limit=3, nll_docs=2, max_gen_tokens=4, fluency_prompts=1))
rows = lab.compute(ExperimentSpec("memit", "batch", "wiki", 2))
assert len(rows), "no rows"
print(" ".join(sorted(m for m in sys.modules if m == "moir_lib" or m.startswith("moir_lib."))))
"""


@pytest.mark.slow
def test_every_module_a_point_runs_is_in_its_closure(tmp_path):
    """A micro point computed in a fresh process loads only modules of the static closure."""
    out = subprocess.run([sys.executable, "-c", COMPUTE_A_POINT, str(tmp_path / "lab")], capture_output=True,
                         text=True, cwd=ROOT, check=False, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(out.stdout.strip().splitlines()[-1].split())
    outside = sorted(loaded - set(sources.closure(POINT_MODULES)))
    assert not outside, f"a point ran modules outside its code identity: {outside}"
