"""The `moir` command: parameter validation, failure reporting, chapter runs and summaries; executing
the book's chapters side by side and what the terminal shows meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from moir_lib import book, runs
from moir_lib.book import execute, stage
from moir_lib.cli import main
from moir_lib.pocket.variants import get_variant

G_CANCEL = Path(__file__).resolve().parents[1] / "notebooks" / "04_g_cancellation.ipynb"


def _notebook(path: Path, params: str, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_parameters_cell_is_read():
    params = runs.notebook_parameters(G_CANCEL)
    assert {"seed", "n_instances", "out_dir"} <= set(params)
    assert params["n_instances"]["type"] == "int"


def test_typo_fails_before_executing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", str(G_CANCEL), "-p", "n_instancez", "5", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "n_instancez" in err and "n_instances" in err and "seed" in err
    assert not out.exists(), "nothing may execute when a parameter name is wrong"


@pytest.mark.parametrize("value", ["abc", "1.5", "[1]", "None"])
def test_wrong_type_is_refused(value):
    with pytest.raises(ValueError, match="n_instances"):
        runs.resolve_parameters(G_CANCEL, [("n_instances", value)])


def test_values_are_typed():
    got = runs.resolve_parameters(G_CANCEL, [("n_instances", "200"), ("seed", "3")])
    assert got == {"n_instances": 200, "seed": 3}


def test_none_only_where_the_comment_documents_it():
    editing = Path(__file__).resolve().parents[1] / "notebooks" / "05_editing.ipynb"
    got = runs.resolve_parameters(editing, [("pres_limit", "None"), ("milestones", "null")])
    assert got == {"pres_limit": None, "milestones": None}
    with pytest.raises(ValueError, match="seq_batch_size"):
        runs.resolve_parameters(editing, [("seq_batch_size", "None")])


def test_an_editor_strength_takes_auto_a_number_none_or_one_per_c(root):
    editing = root / "notebooks" / "05_editing.ipynb"
    got = runs.resolve_parameters(editing, [("taus", "0.005"), ("lambdas", "{'moir': 'auto', 'wiki': 3}")])
    assert got == {"taus": 0.005, "lambdas": {"moir": "auto", "wiki": 3}}
    assert runs.resolve_parameters(editing, [("taus", "auto"), ("lambdas", "None")]) == {"taus": "auto",
                                                                                       "lambdas": None}
    with pytest.raises(ValueError, match="'taus' expects 'auto', a number, None or a dict per C"):
        runs.resolve_parameters(editing, [("taus", "best")])


def test_profile_needs_a_profile_parameter():
    with pytest.raises(ValueError, match="unknown parameter.*profile"):
        runs.resolve_parameters(G_CANCEL, [], profile="pocket")


def test_unknown_profile_is_refused(tmp_path):
    nb = _notebook(tmp_path / "p.ipynb", 'profile = "pocket"  # model profile', "print(profile)")
    with pytest.raises(ValueError, match="unknown profile 'no-such-model'"):
        runs.resolve_parameters(nb, [], profile="no-such-model")


def test_failing_cell_fails_the_command(tmp_path, capsys):
    nb = _notebook(tmp_path / "boom.ipynb", "x = 1  # a parameter", "raise RuntimeError(f'boom {x}')")
    code = main(["run", str(nb), "-q", "-p", "x", "7", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert "RuntimeError: boom 7" in err
    failed = runs.failed_copy(tmp_path / "out", "boom.ipynb")
    assert failed.is_file() and str(failed) in err, "the executed copy is kept for inspection, and named"
    assert not (tmp_path / "out" / "boom.ipynb").exists(), "a failed run is not published as a run"


def test_committed_notebooks_are_clean(root):
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    assert notebooks
    for nb in notebooks:
        assert runs.notebook_problems(nb) == [], nb.name


def test_notebook_problems_detects_outputs(tmp_path):
    nb = _notebook(tmp_path / "dirty.ipynb", "x = 1", "x")
    data = nbformat.read(str(nb), as_version=4)
    data.cells[1].outputs = [nbformat.v4.new_output("stream", text="1")]
    data.cells[1].execution_count = 1
    nbformat.write(data, str(nb))
    assert len(runs.notebook_problems(nb)) == 2
    runs.strip_outputs(nb)
    assert runs.notebook_problems(nb) == []


def test_toc_lists_every_notebook(root):
    chapters = book.toc_chapters(root)
    on_disk = {f"notebooks/{p.stem}" for p in (root / "notebooks").glob("*.ipynb")}
    assert set(chapters) == on_disk


def test_g_cancellation_chapter(g_cancellation_run):
    """`moir run notebooks/04_g_cancellation.ipynb -p n_instances 200` meets the issue's targets."""
    summary = json.loads((g_cancellation_run / "summary.json").read_text())
    h = summary["headline"]
    assert summary["parameters"]["n_instances"] == 200
    assert h["prop1_max_rel_err"] <= 1e-9
    assert h["alphaedit_max_abs_K0"] <= 1e-9
    assert 0.9 <= h["memit_limit_slope"] <= 1.1
    assert h["lemma2_max_ratio"] <= 1.0
    assert h["jsd_bound_max_ratio"] <= 1.0
    assert summary["git_hash"] and summary["moir_version"]


def test_collect_executed_reports_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="04_g_cancellation.ipynb"):
        book.collect_executed(tmp_path, ["notebooks/04_g_cancellation"])


def test_a_saved_pocket_report_is_reused_only_under_its_key(tmp_path, monkeypatch):
    """The book's report of a built model is measured again when the editing profile changes, or when
    the saved one is partial (``--no-edit-gates``, ``--limit``), not shown stale."""
    import importlib
    import shutil

    from moir_lib.experiments import editability

    build = importlib.import_module("moir_lib.pocket.build")  # the package exports functions of these names
    report = importlib.import_module("moir_lib.pocket.report")

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    profiles = tmp_path / "profiles"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "profiles", profiles)
    monkeypatch.setenv("MOIR_PROFILES", str(profiles))
    monkeypatch.setattr(build, "provenance", lambda variant, organism=0: f"{variant} {organism} is built")
    measured = []

    def measure(variant, limit=None, organism=0):
        measured.append(variant)
        return {"variant": variant, "limit": limit, "metrics": {"fact_recall": 0.99}, "gates": {}}

    monkeypatch.setattr(report, "measure", measure)
    monkeypatch.setattr(editability, "editing_gates", lambda profile, n_facts, n_edits: (
        {"memit_ES": 0.97, "traced_window": [0, 1]},
        {"memit_ES": {"value": 0.97, "op": ">=", "threshold": 0.95, "passed": True}}))
    first = stage.pocket_report_page("pocket")
    assert "0.970" in first and stage.pocket_report_page("pocket") == first and measured == ["pocket"]
    saved = build.entry_dir("pocket", build.cache_key(get_variant("pocket"))) / "report.json"
    assert json.loads(saved.read_text())["report_key"] == editability.report_key("pocket")
    yaml_path = profiles / "pocket.yaml"  # another MEMIT λ: the gate's numbers are stale
    assert "lambda: 3.0" in yaml_path.read_text()
    yaml_path.write_text(yaml_path.read_text().replace("lambda: 3.0", "lambda: 4.0"))
    stage.pocket_report_page("pocket")
    assert measured == ["pocket"] * 2
    assert editability.report_key("pocket", limit=4) != editability.report_key("pocket")
    assert editability.report_key("pocket", organism=1) != editability.report_key("pocket", organism=0)
    partial = json.loads(saved.read_text())
    del partial["report_key"]  # as `moir pocket report --no-edit-gates` saves it
    saved.write_text(json.dumps(partial))
    stage.pocket_report_page("pocket")
    assert measured == ["pocket"] * 3


def test_the_pocket_report_of_an_unbuilt_model_says_how_to_build_it(tmp_path, monkeypatch, root):
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))  # an empty cache: no pocket model is built
    pages = stage.generated_pages()
    assert "run `moir pocket report --variant pocket` to build" in pages["pocket_report.md"]
    assert "_generated/pocket_report.md" in (root / "book" / "pocket.md").read_text()  # the pocket page
    included = "".join(p.read_text() for p in (root / "book").glob("*.md"))
    assert all(f"_generated/{name}" in included for name in pages)


def test_phases_count_their_own_time(monkeypatch):
    """A nested phase's time is not counted twice: each phase keeps its own seconds."""
    from moir_lib import timings

    clock = iter([0.0, 1.0, 4.0, 10.0])  # outer starts, inner starts, inner ends, outer ends
    monkeypatch.setattr(timings.time, "perf_counter", lambda: next(clock))
    timings.reset()
    with timings.phase("outer"):
        with timings.phase("inner"):
            pass
    assert timings.snapshot() == {"outer": {"seconds": 7.0, "calls": 1},
                                  "inner": {"seconds": 3.0, "calls": 1}}
    timings.reset()
    assert timings.snapshot() == {}


@pytest.fixture
def timed_book(tmp_path) -> Path:
    """A book root whose one chapter, ``notebooks/timed``, runs one library phase (``keys``, twice) and
    writes its summary with the worker's thread settings in its headline."""
    (tmp_path / "book" / "notebooks").mkdir(parents=True)
    _notebook(tmp_path / "book" / "notebooks" / "timed.ipynb", 'out_dir = "."',
              "import os\n"
              "from moir_lib import timings\n"
              "from moir_lib.results import write_summary\n"
              "for _ in range(2):\n"
              "    with timings.phase('keys'):\n"
              "        pass\n"
              "write_summary(out_dir, 'timed', {'omp_threads': os.environ.get('OMP_NUM_THREADS')}, {})\n")
    return tmp_path / "book"


def test_the_book_executes_chapters_in_worker_processes(tmp_path, timed_book, monkeypatch):
    """``execute_book`` runs each chapter in a worker process (one thread for its kernels) and returns its
    wall time; the chapter's summary carries the library's phases of its own process."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the worker sets one for its chapters
    done = execute.execute_book(timed_book, tmp_path / "run", ["notebooks/timed"], jobs=2, report=False)
    assert set(done) == {"notebooks/timed"} and done["notebooks/timed"]["wall_s"] > 0
    summary = json.loads((tmp_path / "run" / "timed" / "summary.json").read_text())
    assert summary["timings"]["keys"]["calls"] == 2 and set(summary["timings"]) == {"keys"}
    assert summary["headline"] == {"omp_threads": "1"}


def test_the_pocket_report_takes_an_idle_worker_before_a_helper():
    """The report waits for the chapters whose points it reads only while every worker is busy; an idle
    worker starts it first, and a helper only with a worker still idle."""
    ch01, ch05, ch02 = "notebooks/01_diagnosis", "notebooks/05_editing", "notebooks/02_generation"
    both = set(execute.REPORT_AFTER)
    report = list(execute.report_tasks((0,)))
    assert report == ["pocket report"]
    assert execute._extra_tasks([ch05, ch01, ch02], 2, report, both, set()) == []
    assert execute._extra_tasks([ch05, ch01], 2, report, both, set()) == []
    assert execute._extra_tasks([ch05], 2, report, {ch05}, set()) == ["pocket report"]
    assert execute._extra_tasks([ch05], 3, report, {ch05}, set()) == ["pocket report", f"{ch05} helper"]
    assert execute._extra_tasks([ch05, "pocket report"], 2, [], {ch05}, set()) == []
    assert execute._extra_tasks([ch05], 2, [], {ch05}, set()) == [f"{ch05} helper"]
    assert execute._extra_tasks([ch05], 2, [], {ch05}, {ch05}) == []
    assert execute._extra_tasks([ch02, ch01], 2, report, set(), set()) == ["pocket report"], "points done"
    assert execute._extra_tasks([ch05], 1, report, {ch05}, set()) == [], "one worker: after the chapters"


def test_an_idle_worker_runs_a_helper_copy_of_a_long_chapter(tmp_path, timed_book, monkeypatch):
    """With a worker free and a chapter of ``HELPED`` running, a copy of it runs into a scratch directory
    (its phases kept in its record); the book's run directory holds the chapter only."""
    monkeypatch.setattr(execute, "HELPED", ("notebooks/timed",))
    done = execute.execute_book(timed_book, tmp_path / "run", ["notebooks/timed"], jobs=2, report=False)
    assert set(done) == {"notebooks/timed", "notebooks/timed helper"}
    assert done["notebooks/timed helper"]["timings"]["keys"]["calls"] == 2
    assert "timings" not in done["notebooks/timed"]  # the chapter's phases are in its own summary
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["timed"]
    alone = execute.execute_book(timed_book, tmp_path / "one", ["notebooks/timed"], jobs=1, report=False)
    assert set(alone) == {"notebooks/timed"}, "one worker: nothing is left to help with"


def test_the_build_time_is_a_budget_of_the_machine_not_a_gate_of_the_model():
    """A slow (float32-path) build is shown over budget, and the report still passes its gates."""
    from moir_lib.pocket import report

    assert "build_s" in report.BUDGETS and "build_s" not in report.GATES
    over = {"metrics": {"fact_recall": 0.99, "build_s": 857.0}, "passed": True,
            "gates": {"fact_recall": {"value": 0.99, "op": ">=", "threshold": 0.9, "passed": True}},
            "budgets": {"build_s": {"value": 857.0, "op": "<=", "threshold": 600.0, "within": False}}}
    table = report.markdown_table(over)
    assert "| 857 | budget <= 600 | over budget on this CPU |" in table and "FAIL" not in table
    over["budgets"]["build_s"].update(value=389.0, within=True)
    over["metrics"]["build_s"] = 389.0
    assert "| 389 | budget <= 600 | within budget |" in report.markdown_table(over)


def test_moir_book_passes_the_chapters_pages(tmp_path, monkeypatch):
    """The book includes pages the chapters compute (the chapter list, the pocket gates); the command
    line, which alone imports the chapters, hands them to the build."""
    from moir_lib.chapters import book_includes

    seen = {}
    monkeypatch.setattr(book, "build_book", lambda root, **kw: seen.update(kw) or tmp_path)
    assert main(["book", "--from", str(tmp_path)]) == 0
    assert seen["settings"].includes == book_includes() and not seen["settings"].execute


# --------------------------------------------------------------------------- what `moir book` shows


def _tiny_chapter(root: Path) -> str:
    """A book root holding one chapter of three code cells; returns the chapter."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 1  # a parameter")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A tiny chapter"), params,
                nbformat.v4.new_code_cell("import time\ntime.sleep(0.2)"),
                nbformat.v4.new_code_cell("print(x)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(nb, str(root / "notebooks" / "01_tiny.ipynb"))
    return "notebooks/01_tiny"


def test_the_book_in_a_log_shows_plain_lines_and_no_kernel_noise(tmp_path, capfd, monkeypatch):
    """With its output going to a file, the book writes plain lines (a chapter started, its cells, done
    with its wall time), no carriage return, and no kernel warning: kernels write to the standard error
    they inherit, which ``capfd`` reads at the file descriptor."""
    import io
    import multiprocessing
    import re

    from moir_lib.book.progress import PlainLines, display_for, watch

    monkeypatch.setattr(PlainLines, "interval", 0.0)  # a line for every cell
    chapter = _tiny_chapter(tmp_path / "root")
    log = io.StringIO()
    with watch(display_for(log), multiprocessing.get_context("spawn").Queue()) as events:
        execute.execute_book(tmp_path / "root", tmp_path / "runs", [chapter], jobs=1, report=False,
                             events=events)
    shown = log.getvalue()
    lines = shown.splitlines()
    assert lines[0] == "01_tiny: started" and len(lines) == 5, shown
    for n, line in enumerate(lines[1:4], 1):
        assert re.fullmatch(rf"01_tiny: cell {n}/3, 0:\d\d", line), line
    assert re.fullmatch(r"01_tiny: done in 0:\d\d", lines[4])
    out, err = capfd.readouterr()
    for text in (shown, out, err):
        assert "\r" not in text and "Kernel is running over TCP" not in text
    assert (tmp_path / "runs" / "01_tiny" / "01_tiny.ipynb").is_file()


def test_a_log_gets_a_cell_line_at_most_every_interval():
    import io

    from moir_lib.book.progress import PlainLines

    clock, log = [0.0], io.StringIO()
    plain = PlainLines(log, clock=lambda: clock[0])
    plain.start("02_generation")
    for t, n in ((10.0, 2), (31.0, 3), (40.0, 4), (70.0, 5)):
        clock[0] = t
        plain.cell("02_generation", n, 9)
    plain.done("02_generation", 75.0)
    assert log.getvalue().splitlines() == ["02_generation: started", "02_generation: cell 3/9, 0:31",
                                           "02_generation: cell 5/9, 1:10", "02_generation: done in 1:15"]


def test_a_terminal_shows_one_live_line_per_task_rewritten_in_place():
    import io

    from moir_lib.book.progress import LiveLines, PlainLines, display_for

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(display_for(Terminal()), LiveLines)
    assert isinstance(display_for(io.StringIO()), PlainLines)
    clock, screen = [0.0], Terminal()
    live = LiveLines(screen, clock=lambda: clock[0])
    live.start("05_editing")
    live.start("01_diagnosis")
    live.cell("05_editing", 3, 40)
    clock[0] = 65.0
    live.tick()
    assert screen.getvalue().endswith("\x1b[2F\x1b[J  05_editing: cell 3/40, 1:05\n  01_diagnosis: 1:05\n")
    live.done("01_diagnosis", 65.0)
    done = "\x1b[2F\x1b[J01_diagnosis: done in 1:05\n  05_editing: cell 3/40, 1:05\n"
    assert screen.getvalue().endswith(done)
    live.close()
    assert screen.getvalue().endswith("\x1b[1F\x1b[J") and "\r" not in screen.getvalue()


def test_a_terminal_display_shows_the_log_above_its_live_lines():
    """While live lines are drawn, the building process's log records go through the display (a record
    written straight to the terminal would land between them), and back to their handler after."""
    import io
    import logging

    from moir_lib.book.progress import LiveLines, watch

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen, stderr, root = Terminal(), io.StringIO(), logging.getLogger()
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = root.handlers[:]
    root.handlers[:] = [handler]
    try:
        with watch(LiveLines(screen)) as events:
            events.put(("start", "05_editing"))
            logging.getLogger("moir_lib.example").warning("careful")
        logging.getLogger("moir_lib.example").warning("after")
    finally:
        root.handlers[:] = saved
    assert "WARNING moir_lib.example: careful\n  05_editing: " in screen.getvalue()
    assert stderr.getvalue() == "WARNING moir_lib.example: after\n"


def test_progress_bars_stay_out_of_the_log(capsys):
    """The pocket build and report run with their tqdm bars dropped (their carriage returns would fill a
    log file), their other lines kept."""
    import sys

    from tqdm import tqdm

    with execute.quiet_bars():
        for _ in tqdm(range(3), mininterval=0):
            pass
        print("a warning", file=sys.stderr)
    assert capsys.readouterr().err == "a warning\n"


# --------------------------------------------------------------------------- the staged book


def test_link_titles_are_free_of_math(root):
    """The claims table links each chapter by its title as plain text: a link's text is not typeset,
    so ``$C_\\text{Moir}$`` would show as raw LaTeX."""
    assert stage.plain_title(r"Does $C_\text{Moir}$ preserve more?") == "Does C_Moir preserve more?"
    assert stage.plain_title(r"Does $C$ alone determine the edit?") == "Does C alone determine the edit?"
    for notebook in sorted((root / "notebooks").glob("*.ipynb")):
        title = stage.plain_title(stage._title(nbformat.read(str(notebook), as_version=4)))
        assert title and "$" not in title and "\\" not in title, notebook.name
    claim = {"claim": "C_Moir preserves more", "measured": "S_p", "value": 0.1, "lo": 0.0, "hi": 0.2,
             "verdict": "reproduced"}
    executed = book.Executed("notebooks/05_editing", root / "x.ipynb", {"headline": {"claims": [claim]}},
                             stage.plain_title(r"Does $C_\text{Moir}$ preserve more?"))
    assert "| {doc}`Does C_Moir preserve more? </notebooks/05_editing>` |" in book.claims_table([executed])


def test_the_staged_injected_parameters_show_paths_inside_the_repository_relative_to_it(tmp_path):
    """The injected cell shows ``out_dir`` as the chapter's defaults do, relative to the chapter's folder
    (where its kernel runs), not where the repository lay on the machine that built the book."""
    repo = tmp_path / "repo"
    nb = nbformat.v4.new_notebook()
    injected = nbformat.v4.new_code_cell(f'# Parameters\nout_dir = "{repo}/runs/book/04_g_cancellation"\n'
                                         f'generation_dir = "{tmp_path}/elsewhere"\n')
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter"), injected]
    nbformat.write(nb, str(tmp_path / "run.ipynb"))
    stage._stage_notebook(tmp_path / "run.ipynb", tmp_path / "staged.ipynb", repo, repo / "notebooks")
    source = nbformat.read(str(tmp_path / "staged.ipynb"), as_version=4).cells[1].source
    assert 'out_dir = "../runs/book/04_g_cancellation"' in source and str(repo) not in source
    assert f'generation_dir = "{tmp_path}/elsewhere"' in source, "a path outside the repository stays whole"
