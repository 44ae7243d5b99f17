"""Pocket organisms in the report and the book: the report's table per organism, the organisms a book
runs, a chapter split by organism and merged (``moir book --jobs``, grid array tasks and ``--from``),
chapter 06 per organism."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nbformat
import pytest

from moir_lib.book import execute, merge
from moir_lib.book import pooled_organisms as book_organisms
from moir_lib.cli import main
from moir_lib.cli.args import organism_list
from moir_lib.pocket import report


def _report(organism: int, es: float, build_s: float = 300.0) -> dict:
    """A report of :func:`moir_lib.pocket.report.measure`'s shape with one quality and one editing gate."""
    gates = {"fact_recall": {"value": 0.99, "op": ">=", "threshold": 0.9, "passed": True},
             "memit_ES": {"value": es, "op": ">=", "threshold": 0.9, "passed": es >= 0.9}}
    return {"variant": "micro", "organism": organism, "enforced": True, "passed": es >= 0.9, "gates": gates,
            "metrics": {"fact_recall": 0.99, "memit_ES": es, "build_s": build_s, "organism": organism,
                        "weights_sha256": f"{organism}" * 64},
            "budgets": {"build_s": {"value": build_s, "op": "<=", "threshold": 600.0,
                                    "within": build_s <= 600}},
            "labels": {"memit_ES": "MEMIT ES"}}


def test_the_report_shows_a_column_per_organism_and_names_what_missed():
    table = report.organisms_table([_report(0, 0.96), _report(1, 0.85, build_s=700.0)])
    lines = table.splitlines()
    assert lines[0] == "| quantity | gate | organism 0 | organism 1 | worst (organism) |"
    assert "| MEMIT ES | >= 0.900 | 0.960 | 0.850 **FAIL** | 0.850 (1) |" in lines
    assert "| whole build wall time (s) | budget <= 600 | 300 | 700 (over budget) | 700 (1) |" in lines
    assert "| every gate | | pass | **FAIL** | |" in lines and lines[-1] == "Organism 1 misses `memit_ES`."
    low = _report(3, 0.95)
    low["gates"]["leakage"] = {"value": 0.02, "op": "<=", "threshold": 0.05, "passed": True}
    low["metrics"]["leakage"] = 0.02
    high = _report(4, 0.97)
    high["gates"]["leakage"] = {"value": 0.04, "op": "<=", "threshold": 0.05, "passed": True}
    high["metrics"]["leakage"] = 0.04
    rows = report.organisms_table([low, high]).splitlines()
    assert "| MEMIT ES | >= 0.900 | 0.950 | 0.970 | 0.950 (3) |" in rows, "a >= bar: the lowest is the worst"
    assert "| leakage | <= 0.050 | 0.020 | 0.040 | 0.040 (4) |" in rows, "a <= bar: the highest is the worst"
    assert any(row.startswith("| weights") and row.endswith("|  |") for row in rows), "no bar, no worst"
    assert "`0000000000000000` | `1111111111111111` |" in table and "0" * 17 not in table, "hash prefixes"
    assert "organism of the recipe" not in table, "the columns name the organisms"
    both = report.organisms_table([_report(0, 0.96), _report(2, 0.93)])
    assert both.splitlines()[-1] == "Every organism (0, 2) passes every gate."
    assert report.reports_markdown([_report(0, 0.96)]) == report.markdown_table(_report(0, 0.96))
    with pytest.raises(ValueError, match="at least one organism"):
        report.reports_markdown([])


def test_moir_pocket_report_gates_every_organism(tmp_path, monkeypatch, capsys):
    """``--organisms 0,1``: each organism measured, one table, a JSON list, exit 1 when one misses a gate."""
    from moir_lib.experiments import pocket_report

    asked = []

    def measured(variant, *, organism=0, json_path=None, **options):
        asked.append((variant, organism, json_path))
        return _report(organism, 0.96 if organism == 0 else 0.85)

    monkeypatch.setattr(pocket_report, "pocket_report", measured)
    out = tmp_path / "reports.json"
    assert main(["pocket", "report", "--variant", "micro", "--organisms", "0,1", "--json", str(out),
                 "--markdown", str(tmp_path / "r.md")]) == 1
    assert asked == [("micro", 0, None), ("micro", 1, None)], "several organisms: each saved in its entry"
    assert [r["organism"] for r in json.loads(out.read_text())] == [0, 1]
    shown = capsys.readouterr().out
    assert "| organism 0 | organism 1 |" in shown and (tmp_path / "r.md").read_text() == shown
    asked.clear()
    assert main(["pocket", "report", "--variant", "micro", "--json", str(out)]) == 0
    assert asked == [("micro", 0, out)], "one organism: --json is its report, as before"


@pytest.mark.parametrize("text", ["0,0", "-1", "a", "0,,1"])
def test_bad_organism_lists_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="organisms"):
        organism_list(text)
    assert organism_list("2,0,1") == (2, 0, 1)


def _chapter(root: Path, name: str, params: str, body: str = "") -> str:
    """A chapter ``notebooks/<name>`` of ``root`` with the parameters cell ``params``; returns it."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# Chapter {name}"), cell, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(root / "notebooks" / f"{name}.ipynb"))
    return f"notebooks/{name}"


def test_the_book_runs_the_organisms_given_else_those_its_chapters_name(tmp_path):
    a = _chapter(tmp_path, "01_a", "organisms = [0, 2]  # organisms\nreuse = []  # runs read back")
    b = _chapter(tmp_path, "02_b", "organisms = [1]  # organisms")
    c = _chapter(tmp_path, "03_c", "seed = 0  # a seed")
    assert book_organisms.book_organisms(tmp_path, [a, b, c]) == (0, 1, 2)
    assert book_organisms.book_organisms(tmp_path, [c]) == (0,)
    assert book_organisms.book_organisms(tmp_path, [a, b, c], [3, 1]) == (3, 1)
    with pytest.raises(ValueError, match="distinct integers"):
        book_organisms.book_organisms(tmp_path, [a], [1, 1])
    assert book_organisms.splits(tmp_path / f"{a}.ipynb")
    assert not book_organisms.splits(tmp_path / f"{b}.ipynb")
    assert book_organisms.chapter_parameters(tmp_path / f"{b}.ipynb", (0, 1)) == {"organisms": [0, 1]}
    assert book_organisms.chapter_parameters(tmp_path / f"{c}.ipynb", (0, 1)) == {}


def test_each_organism_report_takes_an_idle_worker_or_waits_for_the_chapters():
    ch01, ch05 = "notebooks/01_diagnosis", "notebooks/05_editing"
    tasks = execute.report_tasks((0, 1, 2))
    assert execute.report_tasks((0,)) == {"pocket report": 0}
    assert tasks == {f"pocket report, organism {k}": k for k in (0, 1, 2)}
    names = list(tasks)
    both = {ch01, ch05}
    assert execute._extra_tasks([ch05, ch01], 2, names, both, set()) == []
    assert execute._extra_tasks([ch05], 3, names, {ch05}, set()) == names[:2], "one per idle worker"
    assert execute._extra_tasks([ch05], 2, names, set(), set()) == names, "the points are done: all queued"
    assert execute._extra_tasks([ch05], 3, [], {ch05}, set()) == [f"{ch05} helper"]


_SPLIT_BODY = """import json, pathlib
parts = [json.loads((pathlib.Path(r) / "seen.json").read_text()) for r in reuse]
pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
(pathlib.Path(out_dir) / "seen.json").write_text(json.dumps({"organisms": organisms, "parts": parts}))"""


def test_a_chapter_that_reads_runs_back_runs_once_per_organism_then_merged(tmp_path, monkeypatch):
    """With two organisms and two workers, a chapter taking ``organisms`` and ``reuse`` runs once per
    organism (in the scratch directory), then once over both reading their runs back (in the run
    directory); with one worker it runs once."""
    chapter = _chapter(tmp_path / "root", "01_split", 'organisms = [0]  # organisms\nreuse = []  # runs\n'
                       'out_dir = "."  # where it writes', _SPLIT_BODY)
    done = execute.execute_book(tmp_path / "root", tmp_path / "runs", [chapter], jobs=2, report=False,
                                organisms=(0, 1))
    assert set(done) == {chapter, f"{chapter} organism 0", f"{chapter} organism 1"}
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["01_split"]
    seen = json.loads((tmp_path / "runs" / "01_split" / "seen.json").read_text())
    assert seen == {"organisms": [0, 1], "parts": [{"organisms": [0], "parts": []},
                                                   {"organisms": [1], "parts": []}]}
    alone = execute.execute_book(tmp_path / "root", tmp_path / "one", [chapter], jobs=1, report=False,
                                 organisms=(0, 1))
    assert set(alone) == {chapter}
    # the editing chapters are helped, not split: their other organisms add only the claims' runs
    book = execute._Book(tmp_path / "root", tmp_path / "runs", tmp_path, [chapter, *execute.HELPED],
                         (0, 1), 2)
    monkeypatch.setattr(execute, "splits", lambda notebook: True)
    assert set(book.split()) == {chapter}
    assert json.loads((tmp_path / "one" / "01_split" / "seen.json").read_text())["organisms"] == [0, 1]


class _ThreadPool:
    """A stand-in for the book's process pool: the same interface, tasks on threads of this process."""

    def __init__(self, max_workers: int, mp_context=None, initializer=None, initargs=()):
        import concurrent.futures as cf

        self._pool = cf.ThreadPoolExecutor(max_workers=max_workers)

    def submit(self, fn, *args):
        return self._pool.submit(fn, *args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._pool.shutdown()


def test_the_pool_runs_every_organism_s_report_and_merges_each_split_chapter_once(tmp_path, monkeypatch):
    """The whole schedule of a three-organism book with two workers: a split chapter's parts, its merge
    (once, after its parts), the helped editing chapters and their helpers, and one report per organism
    (whose name holds " organism " too, and is no chapter's part)."""
    import concurrent.futures as cf
    import queue
    import threading

    root = tmp_path / "root"
    split = _chapter(root, "06_split", "organisms = [0]  # o\nreuse = []  # r")
    helped = [_chapter(root, Path(c).name, "organisms = [0]  # o") for c in execute.HELPED]
    order: list[str] = []
    lock = threading.Lock()

    def chapter(notebook, out, task, helper=False, parameters=None):
        with lock:
            order.append(task)
        return {"wall_s": 0.0, "parameters": parameters}

    def measure(variant, organism, task):
        with lock:
            order.append(task)
        return {"wall_s": 0.0, "organism": organism}

    monkeypatch.setattr(cf, "ProcessPoolExecutor", _ThreadPool)
    monkeypatch.setattr(execute, "_execute_chapter", chapter)
    monkeypatch.setattr(execute, "_measure_report", measure)
    book = execute._Book(root, tmp_path / "runs", tmp_path / "scratch", [split, *helped], (0, 1, 2), 2)
    done = execute._run_pool(cf, queue.Queue(), book, report=True)
    reports = list(execute.report_tasks((0, 1, 2)))
    parts = [f"{split} organism {k}" for k in (0, 1, 2)]
    assert set(done) >= {split, *parts, *helped, *reports}
    assert set(done) - {split, *parts, *helped, *reports} <= {f"{c} helper" for c in helped}
    assert sorted(order) == sorted(set(order)), "every task runs once"
    assert all(order.index(p) < order.index(split) for p in parts), "the merge follows its parts"
    assert all(done[r]["organism"] == k for r, k in zip(reports, (0, 1, 2), strict=True))
    assert done[split]["parameters"] == {"organisms": [0, 1, 2],
                                         "reuse": [str(book._part(split, k)) for k in (0, 1, 2)]}
    assert all(done[p]["parameters"] == {"organisms": [k]} for p, k in zip(parts, (0, 1, 2), strict=True))
    assert all(done[c]["parameters"] == {"organisms": [0, 1, 2]} for c in helped), "helped: not split"


def _executed(path: Path, chapter_root: Path, chapter: str, **given) -> Path:
    """An executed copy of ``chapter`` at ``path`` whose run was given ``given`` (papermill's record)."""
    nb = nbformat.read(str(chapter_root / f"{chapter}.ipynb"), as_version=4)
    nb.metadata["papermill"] = {"parameters": given, "input_path": f"{chapter}.ipynb"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def test_only_runs_of_distinct_organisms_of_one_setting_merge(tmp_path):
    chapter = _chapter(tmp_path, "06_t", "organisms = [0]  # o\nreuse = []  # r\nseed = 0  # s")
    fixed = _chapter(tmp_path, "04_f", "seed = 0  # s")

    def run(name, **given):
        return _executed(tmp_path / "runs" / name / "06_t.ipynb", tmp_path, chapter, **given)

    one, two = run("a", organisms=[0], seed=1), run("b", organisms=[1, 2], seed=1, reuse=["/old"])
    params = merge.merge_parameters(tmp_path, chapter, [one, two])
    assert params == {"seed": 1, "organisms": [0, 1, 2], "reuse": [str(one.parent), str(two.parent), "/old"]}
    with pytest.raises(ValueError, match="differ in more than their organisms"):
        merge.merge_parameters(tmp_path, chapter, [one, run("c", organisms=[3], seed=2)])
    with pytest.raises(ValueError, match="organism 0 of notebooks/06_t ran twice"):
        merge.merge_parameters(tmp_path, chapter, [one, run("d", seed=1)])
    copies = [_executed(tmp_path / "f" / n / "04_f.ipynb", tmp_path, fixed, seed=s)
              for n, s in (("x", 1), ("y", 2))]
    with pytest.raises(ValueError, match="cannot merge runs"):
        merge.merge_parameters(tmp_path, fixed, copies)
    assert merge.merged_runs(tmp_path, tmp_path / "f" / "x", [fixed], tmp_path / "m") == tmp_path / "f" / "x"


def test_merged_runs_of_two_organisms_with_one_model_s_weights_are_refused(tmp_path):
    """Two runs split by organism whose summaries record the same weights for organisms 1 and 2 (one model
    run twice under two names) are refused before the merge executes anything."""
    chapter = _chapter(tmp_path, "06_t", "organisms = [0]  # o\nreuse = []  # r")
    for k, sha in ((1, "ab" * 32), (2, "ab" * 32)):
        path = _executed(tmp_path / "runs" / f"o{k}" / "06_t.ipynb", tmp_path, chapter, organisms=[k])
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.execution_count = 1
        nbformat.write(nb, str(path))
        summary = {"parameters": {"organisms": [k]},
                   "headline": {"organisms": [{"organism": k, "weights_sha256": sha}]}}
        (path.parent / "summary.json").write_text(json.dumps(summary))
    same = "the runs of notebooks/06_t merged: organisms 1 and 2 of .* have the same weights"
    with pytest.raises(ValueError, match=same):
        merge.merged_runs(tmp_path, tmp_path / "runs", [chapter], tmp_path / "merged")
    assert not (tmp_path / "merged" / "06_t").exists(), "nothing merged"


def test_the_organisms_grid_splits_every_chapter_that_can_merge(root):
    """``data/grids/organisms.yaml`` runs each chapter that can merge its organism runs once per organism,
    and every other chapter once, so that ``moir book --from`` builds the whole book from it."""
    from moir_lib import grid as g
    from moir_lib.book.stage import toc_chapters

    grid = g.load_grid(root / "data" / "grids" / "organisms.yaml", root)
    split = {r.notebook for r in grid.runs if "organisms" in r.parameters}
    assert split == {f"{c}.ipynb" for c in toc_chapters(root) if book_organisms.splits(root / f"{c}.ipynb")}
    assert {r.notebook for r in grid.runs} == {f"{c}.ipynb" for c in toc_chapters(root)}
    for notebook in split:
        runs = sorted(r.parameters["organisms"] for r in grid.runs if r.notebook == notebook)
        assert runs == [[0], [1], [2]], notebook


def test_a_page_for_organisms_not_built_says_how_to_build_them(tmp_path, monkeypatch):
    from moir_lib.book import stage

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))
    page = stage.pocket_report_page("pocket", (0, 2))
    assert "(organisms 0, 2) is not built" in page and "--variant pocket --organisms 0,2`" in page
    table = book_organisms.provenance_table((0, 2), "micro")
    assert "| 2 | not built on the machine that built this book |" in table and "2 organisms" in table
    summaries = [{"headline": {"organisms": [{"organism": 2, "weights_sha256": "ab12"}]}}, None, {}]
    recorded = book_organisms.recorded_weights(summaries)
    assert recorded == {2: {"ab12"}}
    table = book_organisms.provenance_table((0, 2), "micro", recorded)
    assert "| 2 | `ab12` (the chapters' record; not built here) | — | — |" in table


def test_a_build_waits_for_the_process_building_the_same_organism(tmp_path, monkeypatch):
    """Grid tasks asking for one organism: the one holding the build's lock builds, the other waits and
    reuses its entry instead of training (and replacing it) again."""
    import hashlib
    import importlib
    import threading
    import time

    from moir_lib.locks import exclusive, file_lock_path
    from moir_lib.pocket.build import cache_key, entry_dir, resolved
    from moir_lib.pocket.variants import get_variant

    build_module = importlib.import_module("moir_lib.pocket.build")  # the package exports a function `build`
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))
    trained = []
    monkeypatch.setattr(build_module, "_build_entry", lambda *args: trained.append(args) or args[2])
    key = cache_key(resolved(get_variant("micro")), 3)
    entry = entry_dir("pocket", key)
    found = []
    with exclusive(file_lock_path(entry), "a build in another process"):
        waiting = threading.Thread(target=lambda: found.append(build_module.build("micro", organism=3)))
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and not found, "it waits for the lock"
        entry.mkdir(parents=True)  # what the other process built: a verified entry
        (entry / "model.safetensors").write_bytes(b"w")
        files = {"model.safetensors": hashlib.sha256(b"w").hexdigest()}
        (entry / "manifest.json").write_text(json.dumps({"key": key, "files": files}))
    waiting.join(30)
    assert found == [entry] and trained == [], "reused, not trained again"


# --------------------------------------------------------------------------- on the micro model


@pytest.fixture(scope="module")
def micro_organisms():
    """Organisms 0 and 1 of the micro recipe, built in the machine's cache (seconds each once built)."""
    from moir_lib.pocket import build, provenance

    for k in (0, 1):
        build("micro", organism=k)
    return {k: provenance("micro", k).weights_sha256 for k in (0, 1)}


@pytest.mark.parametrize("todo, jobs, cores, at_once", [
    (3, 2, 2, 1),     # two cores, two training threads: one after another, whatever --jobs says
    (3, 4, 2, 1),
    (3, 16, 16, 3),   # never more than the builds to do
    (8, 16, 16, 8),   # one per two cores
    (8, 4, 16, 4),    # at most --jobs processes
    (8, 16, 3, 1),
])
def test_builds_run_side_by_side_one_per_threads_cores_at_most_jobs(todo, jobs, cores, at_once):
    from moir_lib.pocket.builds import builds_at_once

    assert builds_at_once(todo, jobs, threads=2, cores=cores) == at_once


def test_organisms_built_side_by_side_have_the_weights_built_one_after_another(micro_organisms, tmp_path,
                                                                              monkeypatch, caplog):
    """Two micro organisms built at once in processes of their own, each on the recipe's fixed threads (as
    ``moir book --jobs`` builds them where the cores allow): byte for byte the weights of the serial
    builds."""
    import logging

    from moir_lib.pocket import provenance

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path))  # nothing built yet
    with caplog.at_level(logging.INFO, logger="moir_lib.pocket.builds"):
        book_organisms.build_organisms((0, 1), jobs=2, variant="micro", cores=4)
    assert "building organisms [0, 1] of micro, 2 side by side" in caplog.text
    assert {k: provenance("micro", k).weights_sha256 for k in (0, 1)} == micro_organisms
    assert all(provenance("micro", k).entry.is_relative_to(tmp_path) for k in (0, 1))


def test_each_organism_is_measured_on_its_own_model(micro_organisms):
    from moir_lib.experiments.pocket_report import pocket_reports, saved_report

    reports = pocket_reports("micro", (0, 1), limit=4, edit_gates=False)
    assert [r["organism"] for r in reports] == [0, 1]
    assert [r["metrics"]["weights_sha256"] for r in reports] == [micro_organisms[0], micro_organisms[1]]
    assert json.loads(saved_report("micro", 1).read_text())["organism"] == 1
    assert saved_report("micro", 1).parent != saved_report("micro", 0).parent
    assert "| organism 0 | organism 1 |" in report.reports_markdown(reports)


def test_chapter_06_traces_each_organism_and_pools_them(micro_organisms, tmp_path):
    """Each organism is traced on its own model; the pool of one organism is that organism's result, of
    two their prompts together; a run reads an organism back only under the same settings and weights."""
    import pandas as pd

    from moir_lib import plots, tracing
    from moir_lib.chapters import causal_tracing as ct
    from moir_lib.profiles import load_profile

    prof = load_profile("pocket-micro")
    prompts = tracing.prompts_for(prof, None, 4, 0)
    traces = ct.trace_organisms(prof, [0, 1], prompts, tracing.TraceSettings(n_noise=2), progress=False)
    assert [t.weights_sha256 for t in traces] == [micro_organisms[0], micro_organisms[1]]
    assert not traces[0].result.scores["p_restored"].equals(traces[1].result.scores["p_restored"])
    one = ct.pooled(traces[:1])
    pd.testing.assert_frame_equal(one.prompts.drop(columns="organism"), traces[0].result.prompts)
    assert ct.headline(one, 2, [0, 1])["layer_ie"] == ct.headline(traces[0].result, 2, [0, 1])["layer_ie"]
    both = ct.pooled(traces)
    assert both.n_prompts == 8 and both.prompts["prompt_id"].is_unique
    head = ct.headline(both, 2, prof.edit_layers, organisms=traces)
    assert [e["organism"] for e in head["organisms"]] == [0, 1] and head["n_valid"] == sum(
        t.result.n_valid for t in traces)
    assert head["organism_peaks_in_profile"] == all(e["peak_in_profile"] for e in head["organisms"])
    if head["peak_layer"] is not None and all(e["peak_layer"] is not None for e in head["organisms"]):
        assert "*Organisms.* The curve pools 2 organisms" in ct.findings(head)
    ct.write(tmp_path, both, head, {"profile": "pocket-micro"})
    again = ct.trace_organisms(prof, [1, 0], prompts, tracing.TraceSettings(n_noise=2), reuse=[tmp_path],
                               progress=False)
    assert [t.reused for t in again] == [str(tmp_path)] * 2
    pd.testing.assert_frame_equal(again[0].result.scores, traces[1].result.scores)
    other = ct.trace_organisms(prof, [0], prompts[:3], tracing.TraceSettings(n_noise=2), reuse=[tmp_path],
                               progress=False)
    assert other[0].reused is None, "other prompts: traced again"
    fig = plots.tracing_layer_curve(both.layer_curve(), both.window(2), [0, 1],
                                    organisms={t.organism: t.result.layer_curve() for t in traces})
    assert [t.name for t in fig.data if t.name.startswith("organism")] == ["organism 0", "organism 1"]
    assert all(t.opacity < 1 for t in fig.data if t.name.startswith("organism")), "faint"
    assert fig.data[-1].name == "IE, last subject token, organisms pooled"
    with pytest.raises(ValueError, match=r"'some/hub-model' is one model; pass organisms=\[0\]"):
        ct.trace_organisms(prof.with_overrides({"model": "some/hub-model"}), [0, 1], prompts)


def test_organisms_run_as_grid_array_tasks_and_the_book_merges_them(micro_organisms, tmp_path, root,
                                                                    monkeypatch):
    """A grid runs chapter 06 once per organism (local executor); ``moir book --from`` merges the two runs
    into one over both organisms that reads their traces back, lists both organisms' weights in the
    provenance table, and merges nothing again on the next build."""
    import yaml

    from moir_lib import grid as g
    from moir_lib.book import site, stage

    params = {"n_prompts": 4, "n_noise": 2, "organisms": [[0], [1]]}
    spec = {"name": "organisms", "runs": [{"notebook": "notebooks/06_causal_tracing.ipynb",
                                           "profiles": ["pocket-micro"], "parameters": params}]}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(spec))
    grid = g.load_grid(tmp_path / "grid.yaml", root)
    runs = tmp_path / "runs"
    assert [r["status"] for r in g.run_grid(grid, runs, root=root)] == ["done", "done"]
    staged = []
    monkeypatch.setattr(stage, "generated_pages", lambda organisms: {"pocket_report.md": f"{organisms}"})
    monkeypatch.setattr(site, "_jupyter_book",
                        lambda stage, build_dir: staged.append(stage) or build_dir / "html")
    out = tmp_path / "book"
    site.build_book(root, run_dir=runs, path_output=out,
                     settings=site.BookSettings(execute=False, allow_missing=True, includes={}))
    merged = out / "_build" / "merged" / "06_causal_tracing"
    head = json.loads((merged / "summary.json").read_text())["headline"]
    split = {r.parameters["organisms"][0]: json.loads((runs / r.run_id / "summary.json").read_text())
             ["headline"] for r in grid.runs}
    assert [e["organism"] for e in head["organisms"]] == [0, 1] and head["n_prompts"] == 8
    for entry in head["organisms"]:
        assert entry["reused_from"] == str((runs / grid.runs[entry["organism"]].run_id).resolve())
        assert entry["layer_ie"] == split[entry["organism"]]["organisms"][0]["layer_ie"]
    generated = staged[0] / "book" / "_generated"
    assert (generated / "pocket_report.md").read_text() == "(0,)", "the micro organisms are not the book's"
    provenance = (generated / "provenance.md").read_text()
    for k, sha in micro_organisms.items():
        assert f"| {k} | `{sha}` |" in provenance, "this machine's build, the weights the chapter ran"
    mixed = book_organisms.provenance_table((0,), "micro", {0: {"f" * 64}})
    assert f"| 0 | `{micro_organisms[0]}` — **the chapters ran other weights**: `{'f' * 64}` |" in mixed
    stamp = (merged / "06_causal_tracing.ipynb").stat().st_mtime_ns
    site.build_book(root, run_dir=runs, path_output=out,
                     settings=site.BookSettings(execute=False, allow_missing=True, includes={}))
    assert (merged / "06_causal_tracing.ipynb").stat().st_mtime_ns == stamp, "the merge is kept"
    with pytest.raises(ValueError, match="--from"):
        site.build_book(root, run_dir=runs, path_output=out,
                         settings=site.BookSettings(execute=False, organisms=[0]))
