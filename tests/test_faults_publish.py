"""What a run publishes, and what the book takes from it: a chapter run killed mid-way leaves the previous
run whole (and the book refuses a half-run page, or a summary of another run), a killed grid task is not
recorded as done, a run from another commit is marked or refused, and two books never build into one
output folder at once.

Kills are real: the chapter's kernel sends SIGKILL to the process running it (``moir run``, ``moir
grid``) right after the chapter wrote its summary, as a node lost mid-run would.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import nbformat
import pytest

from moir_lib import book
from moir_lib.book import site as book_site
from moir_lib.cli import main
from moir_lib.locks import Busy

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "OMP_NUM_THREADS": "1"}
CHAPTER = "notebooks/07_tiny"
NAME = "07_tiny.ipynb"


def _tiny_chapter(root: Path) -> Path:
    """A chapter that stores its point in its run directory (as chapters 01 and 05 store theirs, to resume
    from), writes its summary, then (``die``) kills the process running it, then prints."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 1  # a value\ndie = False  # kill the run after its summary\n'
                                       'out_dir = "."  # where it writes')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A tiny chapter"), params,
                nbformat.v4.new_code_cell('import pathlib\nfrom moir_lib.results import write_results\n'
                                          'with open(pathlib.Path(out_dir) / "points.txt", "a") as f:\n'
                                          '    f.write(f"{x}\\n")\n'
                                          'write_results(out_dir, "tiny", {"x": x}, {"x": x})'),
                nbformat.v4.new_code_cell("import os, signal\nif die:\n"
                                          "    os.kill(os.getppid(), signal.SIGKILL)  # the run's process"),
                nbformat.v4.new_code_cell('print("the end")')]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    path = root / "notebooks" / NAME
    nbformat.write(nb, str(path))
    return path


def _killed(code: str) -> None:
    """Run ``code`` in a child process whose chapter kills it (SIGKILL from its kernel)."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-3000:]


def _ran_with(notebook: Path) -> dict:
    return nbformat.read(str(notebook), as_version=4).metadata["papermill"]["parameters"]


def test_a_killed_rerun_leaves_the_previous_run_whole(tmp_path):
    """``moir run`` into an existing ``--out``, killed after the chapter wrote its summary: the earlier
    run's notebook and summary are left as they were, and the book builds from them; the point the killed
    run stored stays in the run directory, where the next run resumes from it."""
    chapter = _tiny_chapter(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(chapter), "-q", "-p", "x", "1", "--out", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in (NAME, "summary.json")}
    _killed(f"""
        from moir_lib.cli import main
        main(["run", {str(chapter)!r}, "-q", "-p", "x", "2", "-p", "die", "True", "--out", {str(out)!r}])
    """)
    assert {name: (out / name).read_bytes() for name in before} == before, "the previous run is kept"
    assert (out / "points.txt").read_text() == "1\n2\n", "the killed run's point is kept, once"
    [executed] = book.collect_executed(out, [CHAPTER])
    assert _ran_with(executed.notebook)["x"] == 1 and executed.summary["parameters"] == {"x": 1}
    assert main(["run", str(chapter), "-q", "-p", "x", "3", "--out", str(out)]) == 0, "the next run runs"
    assert _ran_with(out / NAME)["x"] == 3 and json.loads((out / "summary.json").read_text())["headline"] == {
        "x": 3}
    assert not (out / ".staging").exists(), "what the killed run left is cleared"
    assert (out / "points.txt").read_text() == "1\n2\n3\n"


def test_the_book_refuses_a_half_run_page_and_a_summary_of_another_run(tmp_path):
    """What a kill leaves when copied by hand: a notebook whose last cells never ran, a summary of another
    run beside a notebook (other parameters, or the same ones written before the notebook's run started)
    is refused by name, saying to rerun the chapter."""
    chapter = _tiny_chapter(tmp_path)
    for name, x in (("a", 1), ("b", 2), ("c", 1)):
        assert main(["run", str(chapter), "-q", "-p", "x", str(x), "--out", str(tmp_path / name)]) == 0
    a, b, c = (tmp_path / name for name in "abc")
    assert [e.notebook for e in book.collect_executed(a, [CHAPTER])] == [a / NAME]

    def pair(name: str, notebook: Path, summary: Path) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy2(notebook, folder / NAME)
        shutil.copy2(summary, folder / "summary.json")
        return folder

    half = pair("half", a / NAME, a / "summary.json")
    nb = nbformat.read(str(half / NAME), as_version=4)
    for cell in [c for c in nb.cells if c.cell_type == "code"][-2:]:  # a kill after the summary's cell
        cell.execution_count, cell.outputs = None, []
    nbformat.write(nb, str(half / NAME))
    with pytest.raises(ValueError, match=rf"{NAME} did not run to its end: its code cell 4 of 5 \(and 1 "
                                         rf"more\) never executed, so the run was interrupted; rerun "
                                         rf"{CHAPTER}"):
        book.collect_executed(half, [CHAPTER])
    with pytest.raises(ValueError, match=r"summary.json does not belong to the executed notebook .*: its "
                                         r"parameter 'x' is 2, the notebook ran with 1"):
        book.collect_executed(pair("mixed", a / NAME, b / "summary.json"), [CHAPTER])
    with pytest.raises(ValueError, match=r"summary.json does not belong .*before the notebook's run started"):
        book.collect_executed(pair("older", c / NAME, a / "summary.json"), [CHAPTER])


def test_a_killed_grid_task_is_pending_not_done(tmp_path):
    """A grid task killed after its chapter wrote its summary: its summary is not published, so the task is
    pending (the next grid reruns it), and neither its record nor the index says it is done."""
    import yaml

    from moir_lib import grid as g

    _tiny_chapter(tmp_path)
    spec = {"name": "t", "runs": [{"notebook": f"notebooks/{NAME}", "parameters": {"die": True}}]}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    _killed(f"""
        from moir_lib import grid as g
        g.run_grid(g.load_grid({str(tmp_path / "grid.yaml")!r}, {str(tmp_path)!r}), {str(out)!r},
                   root={str(tmp_path)!r})
    """)
    grid = g.load_grid(tmp_path / "grid.yaml", tmp_path)
    run_dir = out / grid.runs[0].run_id
    g.write_index(grid, out)
    with open(out / g.INDEX_NAME) as fh:
        [row] = list(csv.DictReader(fh))
    record = json.loads((run_dir / g.RUN_RECORD).read_text())
    assert not (run_dir / "summary.json").exists() and g.pending(grid, out) == grid.runs
    assert row["status"] == record["status"] == "running", "both say what the record knows, neither 'done'"


def test_the_book_marks_a_run_from_another_commit_or_refuses_it(tmp_path, root, g_cancellation_run,
                                                                 monkeypatch):
    """``moir book --from`` a run made at another commit: its page opens with a warning naming both
    commits and its provenance row is marked; ``--same-commit`` refuses it. A run at this commit is not
    marked."""
    from moir_lib.results import git_hash

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    staged = []
    monkeypatch.setattr(book_site, "_jupyter_book",
                        lambda stage, build_dir: staged.append(stage) or build_dir)
    runs = tmp_path / "runs"
    shutil.copytree(g_cancellation_run, runs / "04_g_cancellation")
    here = git_hash(root)
    book.build_book(root, run_dir=runs, path_output=tmp_path / "same",
                    settings=book.BookSettings(execute=False, allow_missing=True, includes={}))
    provenance = (staged[-1] / "book" / "_generated" / "provenance.md").read_text()
    assert f"built at commit `{here[:12]}`" in provenance and "not this book's commit" not in provenance
    summary_path = runs / "04_g_cancellation" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["git_hash"] = "0123456789ab" + "c" * 28
    summary_path.write_text(json.dumps(summary))
    book.build_book(root, run_dir=runs, path_output=tmp_path / "other",
                    settings=book.BookSettings(execute=False, allow_missing=True, includes={}))
    provenance = (staged[-1] / "book" / "_generated" / "provenance.md").read_text()
    assert "| 04_g_cancellation | — | `0123456789ab` — **not this book's commit** |" in provenance
    page = nbformat.read(str(staged[-1] / "notebooks" / "04_g_cancellation.ipynb"), as_version=4)
    assert page.cells[0].source.startswith("# ") and page.cells[1].source.startswith("```{warning}")
    assert "ran at commit `0123456789ab`, not at this book's commit" in page.cells[1].source
    with pytest.raises(ValueError, match=r"--same-commit: .*04_g_cancellation at 0123456789abc"):
        book.build_book(root, run_dir=runs, path_output=tmp_path / "refused",
                        settings=book.BookSettings(execute=False, allow_missing=True, includes={},
                                                   same_commit=True))


def test_a_second_book_into_one_output_is_refused_while_the_first_builds(tmp_path, root, g_cancellation_run,
                                                                          monkeypatch):
    """Two builds into one output folder: the second is refused at once, naming the first, and the first
    finishes with its staging folder whole."""
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    building, release, seen = threading.Event(), threading.Event(), {}

    def slow_jupyter_book(stage, build_dir):
        building.set()
        release.wait(60)
        seen["staged"] = sorted(p.name for p in (stage / "notebooks").iterdir())
        return build_dir

    monkeypatch.setattr(book_site, "_jupyter_book", slow_jupyter_book)
    kwargs = {"run_dir": g_cancellation_run.parent, "path_output": tmp_path / "out",
              "settings": book.BookSettings(execute=False, allow_missing=True, includes={})}
    first = threading.Thread(target=lambda: seen.update(html=book.build_book(root, **kwargs)))
    first.start()
    try:
        assert building.wait(120), "the first build did not reach jupyter-book"
        where = re.escape(str(tmp_path / "out" / "_build"))
        with pytest.raises(Busy, match=rf"the book output {where} is in use by PID"):
            book.build_book(root, **kwargs)
    finally:
        release.set()
        first.join(120)
    assert seen["staged"] == ["04_g_cancellation.ipynb"] and seen["html"] == tmp_path / "out" / "_build"
