"""The READMEs and the chapters' shared facts: generated from the package, and true to the code.

Everything here reads files and imports light modules (no model, no torch work): it runs in seconds.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import re
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from moir_lib import docs
from moir_lib.chapters import CHAPTERS
from moir_lib.experiments import N_EVAL, PRES_LIMIT
from moir_lib.experiments.shared import SHARED_EDITING
from moir_lib.runs import SETTING, notebook_parameters, parameter_values, resolve_parameters

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "moir_lib/README.md")
NOTEBOOKS = [c.file for c in CHAPTERS if c.file.startswith("notebooks/")]


def _backticked(text: str) -> list[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


def _section(text: str, title: str) -> str:
    """The markdown section ``## <title>`` of ``text``, up to the next ``## ``."""
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _copy_generated(root: Path) -> None:
    for name in docs.GENERATED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)


# ----------------------------------------------------------------------------- generated from the package


def test_generated_files_are_what_the_package_generates():
    assert docs.stale() == [], "run `moir docs` (the module maps or the shared run's defaults are stale)"


def test_module_map_lists_every_module_of_the_package():
    text = (ROOT / "moir_lib/README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    package = ROOT / "moir_lib"
    expected = {docs._name(p) for p in package.rglob("*.py") if p.name not in ("__main__.py",)} - {"./"}
    assert listed == expected


def test_a_module_in_no_layer_or_a_layer_member_not_in_the_package_is_refused(monkeypatch):
    layers = docs.LAYERS
    last = docs.Layer("x", "y", (*layers[-1].members[1:], "gone"))
    monkeypatch.setattr(docs, "LAYERS", (*layers[:-1], last))
    with pytest.raises(ValueError, match=r"not in moir_lib \['gone'\], in no layer \['models'\]"):
        docs.module_map()


def test_moir_docs_check_exits_2_when_a_file_is_out_of_date_and_moir_docs_regenerates(tmp_path, capsys):
    from moir_lib.cli import main

    _copy_generated(tmp_path)
    assert main(["docs", "--check", "--root", str(tmp_path)]) == 0
    readme = tmp_path / "moir_lib/README.md"
    readme.write_text(readme.read_text().replace("| `theory.py` |", "| `theory_old.py` |"))
    notebook = tmp_path / f"{SHARED_EDITING.chapters[0]}.ipynb"
    notebook.write_text(notebook.read_text().replace("seq_batch_size = 10 ", "seq_batch_size = 30 "))
    assert main(["docs", "--check", "--root", str(tmp_path)]) == 2
    assert {readme.name, notebook.name} <= {Path(line.split()[3]).name for line in
                                            capsys.readouterr().err.splitlines()}
    assert main(["docs", "--root", str(tmp_path)]) == 0
    assert all((tmp_path / name).read_text() == (ROOT / name).read_text() for name in docs.GENERATED)


def test_markers_are_required(tmp_path):
    (tmp_path / "README.md").write_text("# no markers\n")
    with pytest.raises(ValueError, match="module-map:start"):
        docs.GENERATED["README.md"]("# no markers\n", tmp_path / "README.md")


# ----------------------------------------------------------------------------- the chapter list


def _toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [entry["file"] for part in toc["parts"] for entry in part["chapters"]]


def test_toc_lists_the_pages_of_chapters_in_their_order():
    listed = [c.file for c in CHAPTERS]
    assert [e for e in _toc_entries() if e in listed or e.startswith("notebooks/")] == listed


def test_the_book_executes_the_notebooks_of_chapters_in_their_order():
    from moir_lib.book import execute, toc_chapters

    assert toc_chapters(ROOT) == NOTEBOOKS
    assert set(execute.HELPED) == set(execute.REPORT_AFTER) == set(SHARED_EDITING.chapters)
    assert set(SHARED_EDITING.chapters) <= set(NOTEBOOKS)


# ----------------------------------------------------------------------------- the shared run and parameters


@pytest.mark.parametrize("chapter", SHARED_EDITING.chapters)
def test_shared_chapters_default_to_the_one_declaration(chapter):
    declared = notebook_parameters(ROOT / f"{chapter}.ipynb")
    defaults = {name: ast.literal_eval(declared[name]["default"]) for name in SHARED_EDITING.parameters()}
    assert defaults == SHARED_EDITING.parameters()
    assert (SHARED_EDITING.n_eval, SHARED_EDITING.pres_limit) == (N_EVAL, PRES_LIMIT)
    assert all("SHARED_EDITING" in declared[name]["help"] for name in defaults), "say where it lives"


def test_shared_defaults_keep_each_comment_in_its_column(tmp_path):
    source = ["# parameters\n", "milestones = [1, 2]    # scored\n", "seq_batch_size = 1000 # step\n",
              "n_eval = 3  # records\n", "pres_limit = None      # items\n", "other = 1              # kept"]
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": source}]}
    out = json.loads(docs._shared_defaults(json.dumps(nb), tmp_path / "x.ipynb"))["cells"][0]["source"]
    assert out == ["# parameters\n", "milestones = [10, 30, 60] # scored\n", "seq_batch_size = 10   # step\n",
                   "n_eval = 100 # records\n", "pres_limit = 50        # items\n",
                   "other = 1              # kept"]
    nb["cells"][0]["source"] = source[:2]
    with pytest.raises(ValueError, match="lacks"):
        docs._shared_defaults(json.dumps(nb), tmp_path / "x.ipynb")


def test_parameter_values_are_the_parameters_cell_names_in_the_namespace():
    declared = notebook_parameters(ROOT / "notebooks/04_g_cancellation.ipynb")
    namespace: dict[str, Any] = {name: i for i, name in enumerate(declared)} | {"json": json, "res": {}}
    assert parameter_values("04_g_cancellation", namespace) == {name: i for i, name in enumerate(declared)}
    with pytest.raises(ValueError, match="not defined"):
        parameter_values("04_g_cancellation", {})


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_chapter_records_its_parameters_from_its_parameters_cell(notebook):
    """The first code cell takes the parameters (:func:`parameter_values` of the chapter's module), and no
    cell lists them again by hand for ``summary.json``."""
    cells = json.loads((ROOT / f"{notebook}.ipynb").read_text())["cells"]
    cells = [c for c in cells if c["cell_type"] == "code"]
    first = "".join(cells[1]["source"])
    assert re.search(r"^ran = parameter_values\(\w+\.CHAPTER, globals\(\)\)", first, flags=re.M), first
    rest = "".join("".join(c["source"]) for c in cells[2:])
    assert '"profile": profile' not in rest and '"organisms": organisms' not in rest
    assert re.search(r"write(_results)?\([^)]*\bran\b", rest), "summary.json gets the parameters taken"


def test_parameter_types_come_from_the_parameters_cell():
    declared = notebook_parameters(ROOT / "notebooks/05_editing.ipynb")
    assert declared["context_templates"]["type"] == "int" and declared["taus"]["type"] == SETTING
    assert notebook_parameters(ROOT / "notebooks/01_diagnosis.ipynb")["budget_taus"]["type"] == SETTING
    chapter_01 = ROOT / "notebooks/01_diagnosis.ipynb"
    assert resolve_parameters(chapter_01, [("budget_taus", "3")]) == {"budget_taus": 3}
    with pytest.raises(ValueError, match="expects int"):
        resolve_parameters(ROOT / "notebooks/05_editing.ipynb", [("context_templates", "many")])


# ----------------------------------------------------------------------------- the READMEs true to the code


def _resolve(name: str) -> Any:
    """``name`` (``experiments.open_labs``, ``Lab.compute_all``, ``identity.point_key``) as an object of the
    library, looked up under ``moir_lib`` then ``moir_lib.experiments``."""
    parts = name.split(".")
    for base in ("moir_lib", "moir_lib.experiments"):
        try:
            try:
                obj: Any = importlib.import_module(f"{base}.{parts[0]}")
            except ModuleNotFoundError:
                obj = getattr(importlib.import_module(base), parts[0])
            for part in parts[1:]:
                found = getattr(obj, part, None)
                obj = found if found is not None else importlib.import_module(f"{obj.__name__}.{part}")
            return obj
        except (AttributeError, ModuleNotFoundError):
            continue
    raise LookupError(name)


def _code_names(text: str) -> list[str]:
    """The dotted or CamelCase names in ``text``'s backticks (calls without their arguments), not files."""
    names = []
    for span in _backticked(text):
        name = re.sub(r"\(.*\)$", "", span)
        if (re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", name) and ("." in name or name[0].isupper())
                and not re.search(r"\.(json|parquet|py|md|ya?ml|csv)$", name)
                and not hasattr(builtins, name) and not hasattr(typing, name)):
            names.append(name)
    return names


@pytest.mark.parametrize("section", ["One experiment, from `make book` to a row", "One home per fact",
                                     "Words"])
def test_every_name_the_library_readme_walks_through_exists(section):
    names = _code_names(_section((ROOT / "moir_lib/README.md").read_text(), section))
    assert len(names) > 5
    missing = []
    for name in names:
        try:
            _resolve(name)
        except LookupError:
            missing.append(name)
    assert not missing, f"moir_lib/README.md names what the code does not have: {missing}"


def test_the_walk_opens_the_labs_the_notebooks_open():
    walk = _section((ROOT / "moir_lib/README.md").read_text(), "One experiment")
    cells = json.loads((ROOT / "notebooks/01_diagnosis.ipynb").read_text())["cells"]
    first = "".join([c for c in cells if c["cell_type"] == "code"][1]["source"])
    assert "experiments.open_labs(" in walk and "experiments.open_labs(" in first
    assert "experiments.open_lab(" not in walk


@pytest.mark.parametrize("readme", READMES)
def test_every_python_file_a_readme_names_exists(readme):
    prose = re.sub(r"<!-- module-map:start -->.*<!-- module-map:end -->", "", (ROOT / readme).read_text(),
                   flags=re.S)  # the generated map names the package's files by construction
    files = [s for s in _backticked(prose) if re.fullmatch(r"[\w/.]+\.py", s)]
    assert files
    missing = [f for f in files if not ((ROOT / f).is_file() or (ROOT / "moir_lib" / f).is_file())]
    assert not missing, f"{readme} names files that do not exist: {missing}"


@pytest.mark.parametrize("readme", READMES)
def test_readmes_point_only_inside_the_clone(readme):
    text = (ROOT / readme).read_text()
    assert "DESIGN.md" not in text and "../shared" not in text


def test_readme_opens_with_the_two_newcomer_commands():
    text = (ROOT / "README.md").read_text()
    block = text[text.index("```bash"):text.index("```", text.index("```bash") + 3)]
    assert text.index("```bash") < text.index("\n## ")
    assert [line.split("#")[0].strip() for line in block.splitlines()[1:3]] == ["make book", "make test"]


#: Spellings retired so that each word means one thing (moir_lib/README.md, "Words"): a pattern and what
#: replaced it. Docs, code, notebooks and tests must not use them again.
RETIRED = {
    r"\bRunSpec\b": "ExperimentSpec",
    r"\bEditRun\b": "ExperimentResult",
    r"\bedit_run\b": "compute_experiment",
    r"\bSHARED_EDITING_RUN\b": "SHARED_EDITING",
    r"\b(lab|self)\.run_all\(": "Lab.compute_all",
    r"\bStrategyRun\b": "StrategyGeneration",
    r"\bload_runs\b": "load_generations",
    r"\bshard_run\b": "shard_writer",
    r"ExperimentSpec\([^)]*\bseed=": "edit_sample=",
    r"\b(curve|seq|table2)_seeds\b": "<name>_edit_samples",
    r"\bablation_seeds\b": "ablation_strategies",
    r"\bseed_ablation\b": "strategy_ablation",
    r"\bbest_seed\b": "best_strategy",
    r"\b(lab|ctx|self)\.records\b": "edit_records (an EditRecords)",
}
WHERE = ["moir_lib/**/*.py", "notebooks/*.ipynb", "tests/*.py", "benchmarks/*.py", "README.md",
         "moir_lib/README.md", "book/*.md", "data/grids/*.yaml"]


def test_retired_spellings_are_gone():
    found = []
    for pattern in WHERE:
        for path in sorted(ROOT.glob(pattern)):
            if path.name == "test_docs.py":
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {m.group(0)!r} (now {new})"
                      for old, new in RETIRED.items() for m in re.finditer(old, text)]
    assert not found, "\n".join(found)


def test_the_words_table_names_every_retired_meaning_s_new_home():
    words = _section((ROOT / "moir_lib/README.md").read_text(), "Words")
    for word in ("run", "experiment", "edit sample", "records", "edit records", "records path", "seed",
                 "seed strategy", "seed sequence", "sample", "generation"):
        assert f"\n| {word} |" in words, word

