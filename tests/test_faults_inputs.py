"""Bad inputs refused before any work, with one line naming the input: records, hyper-parameters,
profiles, and the rows reused from other runs (only rows whose key matches are used or copied)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from tiny import ROME_RECORD, dump

from moir_lib import cli
from moir_lib.data import check_distinct_facts, load_counterfact
from moir_lib.experiments import ExperimentSpec, Lab, PointStore
from moir_lib.experiments.identity import editor_settings
from moir_lib.experiments.measure import point_rows
from moir_lib.experiments.rows import EDIT_METRICS, write_items, write_rows
from moir_lib.profiles import ProfileError, load_profile

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_editing.ipynb"


@pytest.fixture
def no_model_load(monkeypatch):
    import moir_lib.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(moir_lib.models, "load", refuse)


def rome(case_id: int, **rewrite) -> dict:
    """:data:`ROME_RECORD` under ``case_id`` with ``rewrite``; another subject is its paraphrases' too."""
    rec = copy.deepcopy(ROME_RECORD)
    rec["case_id"] = case_id
    old = rec["requested_rewrite"]["subject"]
    rec["requested_rewrite"].update(rewrite)
    new = rec["requested_rewrite"]["subject"]
    rec["paraphrase_prompts"] = [p.replace(old, new) for p in rec["paraphrase_prompts"]]
    return rec


# --------------------------------------------------------------------------- records


def test_rewrite_to_the_true_target_is_refused(tmp_path):
    same = rome(3, target_new={"str": "Africa", "id": "Q15"})
    with pytest.raises(ValueError, match=r"record 1 \(case_id 3\): target_new equals target_true"):
        load_counterfact(dump(tmp_path, [ROME_RECORD, same]))


def test_one_fact_under_many_case_ids_is_refused(tmp_path):
    records = load_counterfact(dump(tmp_path, [rome(i) for i in range(5)]))
    with pytest.raises(ValueError, match="case_id 1 repeats the rewrite of case_id 0"):
        check_distinct_facts(records, "cf.json")
    check_distinct_facts(records[:1])
    other = load_counterfact(dump(tmp_path, [rome(1, subject="Ghana")], "b.json"))
    check_distinct_facts([records[0], *other])  # another subject is another fact


def test_records_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "cf.json"
    path.write_bytes(json.dumps([ROME_RECORD]).encode().replace(b"Angola", b"Ang\xe9la"))
    with pytest.raises(ValueError, match=rf"{path}: not UTF-8 text"):
        load_counterfact(path)


# --------------------------------------------------------------------------- hyper-parameters, profiles


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_non_finite_lambda_is_refused_before_the_model(value, tmp_path, capsys, no_model_load):
    code = cli.main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                     "batch", "--n-edits", "2", "--lambda", value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and ("--lambda must be finite" if value == "inf" else "--lambda must be > 0") in err, err
    assert not (tmp_path / "o").exists()


def test_non_finite_profile_value_is_refused():
    with pytest.raises(ProfileError, match="memit: lambda: expected a finite number, got inf"):
        load_profile("pocket-micro").with_overrides({"memit.lambda": float("inf")})


def test_profile_that_is_a_directory_or_not_utf8(tmp_path):
    folder = tmp_path / "p.yaml"
    folder.mkdir()
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(folder)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: bad\nmodel: caf\xe9\n")
    with pytest.raises(ProfileError, match=r"bad.yaml .*not UTF-8 text"):
        load_profile(bad)


# --------------------------------------------------------------------------- reuse


SPEC = ExperimentSpec("memit", "batch", "wiki", 3)


def _rows_of_other_run(lab: Lab, profile: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows and items another run wrote: this spec's point (under another profile name) and a stale twin."""
    items = pd.DataFrame({"group": "edit", "unit": "record", "item": ["1", "2"], "metric": "ES",
                          "value": 0.5})
    point, items = point_rows(SPEC, 3, lab.key(SPEC), editor_settings(SPEC, lab.profile),
                              {("edit", m): 0.5 for m in EDIT_METRICS}, items)
    stale = point.assign(key="0" * 16, value=0.125)
    return pd.concat([point, stale], ignore_index=True).assign(profile=profile), items


def test_reuse_path_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="reuse path .*nowhere does not exist"):
        PointStore(tmp_path / "out", shared=False, reuse=[tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no results.parquet"):
        PointStore(tmp_path / "out", shared=False, reuse=[tmp_path / "empty"])


def test_reuse_copies_only_matching_rows_under_this_profile(tmp_path):
    probe = Lab("pocket-micro", PointStore(tmp_path / "probe", shared=False))
    rows, items = _rows_of_other_run(probe, "someone-else")
    write_rows(rows, tmp_path / "old")
    write_items(items, tmp_path / "old")
    lab = Lab("pocket-micro", PointStore(tmp_path / "new", shared=False, reuse=[tmp_path / "old"]))
    assert lab.is_cached(SPEC, ("edit",)) and not lab.is_loaded()
    lab.compute_all([SPEC], ("edit",))
    table = pd.read_parquet(tmp_path / "new" / "results.parquet")  # an all-reused run has its table
    assert set(table["key"]) == {lab.key(SPEC.at(3))}  # the stale twin is not copied
    assert set(table["profile"]) == {"pocket-micro"}
    assert len(table) == len(EDIT_METRICS) and set(table["value"]) == {0.5}


def test_reused_point_missing_a_metric_is_recomputed_not_half_used(tmp_path):
    probe = Lab("pocket-micro", PointStore(tmp_path / "probe", shared=False))
    rows, items = _rows_of_other_run(probe, "pocket-micro")
    write_rows(rows[rows["metric"] != "S_e"], tmp_path / "old")
    write_items(items, tmp_path / "old")
    lab = Lab("pocket-micro", PointStore(tmp_path / "new", shared=False, reuse=[tmp_path / "old"]))
    assert not lab.is_cached(SPEC, ("edit",)) and lab.store.rows.empty


def test_reused_point_without_its_items_is_recomputed_with_a_warning(tmp_path, caplog):
    """A run directory holding rows but no items.parquet (an older run, a grid that kept only rows) cannot
    feed a claim: its points are not taken as cached, and the log says why."""
    probe = Lab("pocket-micro", PointStore(tmp_path / "probe", shared=False))
    rows, _ = _rows_of_other_run(probe, "pocket-micro")
    write_rows(rows, tmp_path / "old")
    lab = Lab("pocket-micro", PointStore(tmp_path / "new", shared=False, reuse=[tmp_path / "old"]))
    with caplog.at_level("WARNING"):
        assert not lab.is_cached(SPEC, ("edit",)) and lab.store.rows.empty
    assert "without their per-item scores" in caplog.text and "recomputing" in caplog.text


# --------------------------------------------------------------------------- environment, parameters


def test_cache_root_that_is_a_file_is_named(tmp_path, monkeypatch):
    from moir_lib.cache import cache_dir

    blocker = tmp_path / "cache-file"
    blocker.write_text("x")
    for root in (blocker, blocker / "below"):
        monkeypatch.setenv("MOIR_CACHE", str(root))
        with pytest.raises(ValueError, match=rf"cache root {root} .*set MOIR_CACHE to a directory"):
            cache_dir()


def test_cli_reports_an_environment_fault_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    def full_disk(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "c.safetensors"))

    parser = cli.build_parser()
    args = parser.parse_args(["cov", "merge", "a", "b", "--out", str(tmp_path / "c.safetensors")])
    monkeypatch.setattr(cli, "build_parser", lambda: _Fixed(parser, args, full_disk))
    code = cli.main(["cov", "merge", "a", "b", "--out", str(tmp_path / "c.safetensors")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "No space left on device" in err and "c.safetensors" in err and "the disk is full" in err


class _Fixed:
    """A parser whose parse_args returns ``args`` with ``func`` replaced."""

    def __init__(self, parser, args, func):
        self.parser, self.args = parser, args
        self.args.func = func

    def parse_args(self, argv):
        return self.args


def test_notebook_parameter_of_the_wrong_type_is_named():
    from moir_lib.runs import resolve_parameters

    with pytest.raises(ValueError, match="parameter 'context_templates' expects int, got 'abc'"):
        resolve_parameters(NOTEBOOK, [("context_templates", "abc")])
    assert resolve_parameters(NOTEBOOK, [("context_templates", "None")]) == {"context_templates": None}


def test_sample_count_beyond_memory_is_refused_before_any_file(tmp_path):
    from tiny import tiny_loaded

    from moir_lib import generation as G

    llama = tiny_loaded("llama", n_layers=2, seed=0)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"n_samples 1,000,000,000,000: .*GiB of memory"):
        G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand1", 10**12, 4, 2), out,
                        progress=False)
    assert not out.exists()


# --------------------------------------------------------------------------- moir book --from


def _executed(folder: Path, chapter: str, source: str, error: bool = False) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.execution_count = 1
    if error:
        cell.outputs = [nbformat.v4.new_output("error", ename="TypeError", evalue="bad", traceback=[])]
    nb.cells = [nbformat.v4.new_markdown_cell("# Does $C$ alone determine the edit?"), cell]
    nb.metadata["papermill"] = {"input_path": source, "exception": error or None}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{chapter}.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_book_from_a_truncated_foreign_or_failed_run_is_refused(tmp_path):
    from moir_lib import book

    chapter = "notebooks/04_g_cancellation"
    good = _executed(tmp_path / "good", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb")
    assert [e.notebook for e in book.collect_executed(tmp_path / "good", [chapter])] == [good]
    cut = _executed(tmp_path / "cut", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb")
    cut.write_bytes(cut.read_bytes()[:40])
    _executed(tmp_path / "foreign", "04_g_cancellation", "notebooks/02_generation.ipynb")
    _executed(tmp_path / "failed", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb", error=True)
    for run, message in (("cut", "is damaged"), ("foreign", "was run from notebooks/02_generation.ipynb"),
                         ("failed", "holds a failed run")):
        with pytest.raises(ValueError, match=message):
            book.collect_executed(tmp_path / run, [chapter])


def test_book_from_a_foreign_notebook_named_like_a_chapter_is_refused_before_the_build(tmp_path, root):
    """A notebook that only bears a chapter's name (no title, no summary.json, not run by papermill) is
    refused by name, saying what it lacks, before jupyter-book runs (which would fail on the missing title
    without saying why)."""
    import re

    import nbformat

    from moir_lib import book

    foreign = tmp_path / "run" / "04_g_cancellation.ipynb"
    foreign.parent.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('hello')")]
    nbformat.write(nb, str(foreign))
    message = rf"{re.escape(str(foreign))} has no title .*no summary.json lies beside it"
    with pytest.raises(ValueError, match=message):
        book.build_book(root, run_dir=tmp_path / "run", path_output=tmp_path / "out",
                        settings=book.BookSettings(execute=False, allow_missing=True))
    assert not (tmp_path / "out" / "_build" / "html").exists()


# --------------------------------------------------------------------------- inputs checked at the door


@pytest.fixture(scope="module")
def door_llama():
    from tiny import tiny_loaded

    return tiny_loaded("llama", n_layers=2, seed=0)


def _generated(llama, out: Path, n: int = 8) -> Path:
    """A complete generation directory of ``n`` samples (one shard)."""
    from moir_lib import generation as G

    G.self_generate(llama.model, llama.tokenizer, G.GenerationSettings("rand1", n, 4, 4), out, progress=False)
    return out


SHARD = "shard-00000-of-00001.jsonl"


def _edit_lines(gen_dir: Path, edit) -> None:
    path = gen_dir / SHARD
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def _duplicate(lines):
    return lines[:3] + [lines[2]] + lines[3:]


def _delete(lines):
    return lines[:2] + lines[3:]


def _retoken(lines):
    rec = json.loads(lines[4])
    rec["token_ids"] = [t + 1 for t in rec["token_ids"]]
    return lines[:4] + [json.dumps(rec, ensure_ascii=False) + "\n"] + lines[5:]


def _claim_more(gen_dir: Path) -> None:
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    (gen_dir / "manifest.json").write_text(json.dumps({**manifest, "n_samples": 10}))


CORPUS_FAULTS = {
    "duplicated line": (lambda d: _edit_lines(d, _duplicate), r"line 4 repeats sample index 2 of line 3"),
    "deleted line": (lambda d: _edit_lines(d, _delete), r"line 3 holds index 3 where index 2 belongs"),
    "changed record": (lambda d: _edit_lines(d, _retoken), r"differs from the checksum written when it "),
    "manifest claims more": (_claim_more, r"holds 8 of the 10 samples the manifest gives it"),
}


@pytest.mark.parametrize("fault", list(CORPUS_FAULTS))
def test_self_generated_corpus_is_what_its_manifest_says(fault, door_llama, tmp_path, capsys, no_model_load):
    """`moir cov estimate --corpus GEN_DIR` on a generation whose shard lost, repeated or changed a record
    (or whose manifest claims more) is refused before the model loads, naming the shard file, the line and
    the problem; the library refuses the same generation rather than count keys twice or miss some."""
    import re

    from moir_lib import covariance as C
    from moir_lib.documents import load_corpus

    damage, problem = CORPUS_FAULTS[fault]
    gen_dir = _generated(door_llama, tmp_path / "gen")
    damage(gen_dir)
    code = cli.main(["cov", "estimate", "--profile", "pocket-micro", "--corpus", str(gen_dir), "--out",
                     str(tmp_path / "c.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and str(gen_dir / SHARD) in err and "Traceback" not in err, err
    assert re.search(problem, err), err
    with pytest.raises(ValueError, match=problem):
        C.estimate(door_llama, load_corpus(gen_dir), [1], C.EstimationSettings(tokens_per_batch=64),
                   cache=False, progress=False)


def test_valid_corpus_is_sealed_and_gives_the_same_c(door_llama, tmp_path, caplog):
    """A complete shard carries its SHA-256 (sha256sum format); the corpus it makes gives the C of its
    documents bit for bit; a shard without the checksum (older generations) is read with a warning."""
    import hashlib
    import logging

    import torch

    from moir_lib import covariance as C
    from moir_lib.documents import load_corpus

    gen_dir = _generated(door_llama, tmp_path / "gen")
    digest, name = (gen_dir / f"{SHARD}.sha256").read_text().split()
    assert name == SHARD and digest == hashlib.sha256((gen_dir / SHARD).read_bytes()).hexdigest()
    docs = [r["seed_ids"] + r["token_ids"]
            for r in map(json.loads, (gen_dir / SHARD).read_text().splitlines())]
    kw = {"settings": C.EstimationSettings(tokens_per_batch=64), "cache": False, "progress": False}
    ref = C.estimate(door_llama, docs, [1], corpus_spec="same documents", **kw)
    (gen_dir / f"{SHARD}.sha256").unlink()
    with caplog.at_level(logging.WARNING):
        stats = C.estimate(door_llama, load_corpus(gen_dir), [1], **kw)
    assert "no checksum" in caplog.text and SHARD in caplog.text
    assert stats.count(1) == ref.count(1) and torch.equal(stats.sum(1), ref.sum(1))


def test_incomplete_shard_is_refused_then_resumes_and_is_sealed(door_llama, tmp_path):
    """A shard cut short is an incomplete generation (refused as a corpus); resuming it regenerates the
    rest byte for byte and seals it only then."""
    from moir_lib.generation import verify_generation

    gen_dir = _generated(door_llama, tmp_path / "gen")
    whole = (gen_dir / SHARD).read_bytes()
    _edit_lines(gen_dir, lambda lines: lines[:3])
    with pytest.raises(ValueError, match=rf"{SHARD} holds 3 of the 8 samples .*resume it with `moir gen"):
        verify_generation(gen_dir)
    _generated(door_llama, gen_dir)
    assert (gen_dir / SHARD).read_bytes() == whole
    verify_generation(gen_dir)
    assert (gen_dir / f"{SHARD}.sha256").is_file()


def test_resuming_a_shard_with_a_duplicated_line_names_it(door_llama, tmp_path, capsys, no_model_load):
    """`moir generate` over a shard with a repeated record says which line of which file, and how to
    repair it, before the model loads (the library raises the same ValueError, not a RuntimeError)."""
    from moir_lib import generation as G

    gen_dir = _generated(door_llama, tmp_path / "gen")
    _edit_lines(gen_dir, _duplicate)
    code = cli.main(["generate", "--profile", "pocket-micro", "--n-samples", "8", "--out", str(gen_dir)])
    err = capsys.readouterr().err
    assert code == 2 and f"{gen_dir / SHARD}: line 4 repeats sample index 2 of line 3" in err, err
    assert f"head -n 3 {gen_dir / SHARD}" in err and "rerun `moir generate`" in err
    with pytest.raises(ValueError, match="line 4 repeats sample index 2 of line 3"):
        G.self_generate(door_llama.model, door_llama.tokenizer, G.GenerationSettings("rand1", 8, 4, 4),
                        gen_dir, progress=False)


@pytest.mark.parametrize(("prompt", "problem"), [
    ("Ghana is located in", "subject 'Angola' \\(case_id 7\\) does not occur in it"),
    ("Angola is located in", "which writes subject 'Angola' \\(case_id 7\\) out: .*'\\{\\} is located in'"),
])
def test_record_whose_subject_is_not_in_its_prompt_is_refused(prompt, problem, tmp_path, capsys,
                                                              no_model_load):
    records = dump(tmp_path, [rome(7, prompt=prompt), rome(8, subject="Ghana")])
    with pytest.raises(ValueError, match=rf"record 0: .*got '{prompt}'.*{problem}"):
        load_counterfact(records)
    code = cli.main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                     "batch", "--n-edits", "1", "--records", str(records), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "case_id 7" in err and "'Angola'" in err and prompt in err, err


def _benchmarks(tmp_path: Path, task: str, damage) -> Path:
    """A copy of data/slices/benchmarks/<task> with its file damaged by ``damage(path)``."""
    import shutil

    root = Path(__file__).resolve().parents[1] / "data" / "slices" / "benchmarks"
    shutil.copytree(root / task, tmp_path / "bench" / task)
    damage(next(p for p in (tmp_path / "bench" / task).rglob("*") if p.suffix in (".jsonl", ".csv")))
    return tmp_path / "bench"


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])


def _garble(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5] + ["this is not json\n"] + lines[5:]))


def _answer_z(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = json.dumps({**json.loads(lines[3]), "answerKey": "Z"}) + "\n"
    path.write_text("".join(lines))


EVAL_FAULTS = {
    "truncated": ("arc_challenge", _cut,
                  r"arc_challenge: .*ARC-Challenge-Test_100.jsonl:100: the file ends in the middle of this"),
    "not json": ("hellaswag", _garble, r"hellaswag: .*val_100.jsonl:6: not a JSON record"),
    "empty": ("gsm8k", lambda p: p.write_text(""), r"gsm8k: .*test_100.jsonl holds no records"),
    "answer outside the choices": ("arc_challenge", _answer_z,
                                   r"arc_challenge: .*ARC-Challenge-Test_100.jsonl:4: record 3 "
                                   r"\(id '[^']+'\): field 'answerKey' is 'Z', not one of the choices"),
    "mmlu row cut": ("mmlu", lambda p: p.write_text(p.read_text()[:-30]),
                     r"mmlu_\w+: .*_(dev|test).csv:\d+: (row \d+ has \d+ fields|not a CSV row)"),
}


@pytest.mark.parametrize("fault", list(EVAL_FAULTS))
def test_benchmark_files_are_checked_before_the_model(fault, tmp_path, capsys, no_model_load):
    """`moir eval --data-dir` on a file cut off mid-record, with a line that is not JSON, empty, or with an
    answer outside the choices: one line naming task, file, line (record and id) and field, before the
    model loads."""
    import re

    task, damage, message = EVAL_FAULTS[fault]
    data = _benchmarks(tmp_path, task, damage)
    code = cli.main(["eval", "--profile", "pocket-micro", "--suite", "paper", "--data-dir", str(data),
                     "--tasks", task, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err


def test_pocket_task_files_are_checked(tmp_path):
    """The pocket suite's task YAMLs (data/tasks) and the pocket build's files go through the same checks."""
    import shutil

    from moir_lib.evaluation.preservation.file_checks import check_pocket_files, pocket_task_files
    from moir_lib.pocket.benchmarks import TASKS, TASKS_DIR

    files = pocket_task_files(TASKS_DIR, TASKS)
    assert files["pocket_arith_raw"] == files["pocket_arith"] == "arith.jsonl"  # through its include
    tasks = shutil.copytree(TASKS_DIR, tmp_path / "tasks")
    (tasks / "pocket_prose.yaml").write_text((tasks / "pocket_prose.yaml").read_text().replace(
        "doc_to_choice: choices", "doc_to_choice: [choices"))
    with pytest.raises(ValueError, match=r"pocket_prose: .*pocket_prose.yaml:\d+: not valid YAML"):
        pocket_task_files(tasks, ["pocket_prose"])
    data = tmp_path / "benchmarks"
    data.mkdir()
    (data / "facts.jsonl").write_text(json.dumps({"prompt": "p", "choices": [" a", " b"], "label": 2,
                                                  "subject": "Ada"}) + "\n")
    with pytest.raises(ValueError, match=r"pocket_facts: .*facts.jsonl:1: record 0 \(id 'Ada'\): "
                                         r"field 'label' is 2, not an index of the 2 choices"):
        check_pocket_files(data, {"pocket_facts": "facts.jsonl"})


@pytest.mark.parametrize("where", ["the root", "below it"])
def test_cache_root_in_a_symlink_loop_is_named(where, tmp_path, monkeypatch):
    from moir_lib.cache import cache_dir

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    root = tmp_path / "a" if where == "the root" else tmp_path / "a" / "cache"
    monkeypatch.setenv("MOIR_CACHE", str(root))
    with pytest.raises(ValueError, match=rf"cache root {root} .*symlink loop: {tmp_path / 'a'} "):
        cache_dir()


def test_merge_onto_an_input_says_the_input_is_gone(door_llama, tmp_path, capsys):
    from tiny import random_documents

    from moir_lib import covariance as C

    docs = random_documents(12, seed=8)
    paths = []
    for i in range(2):
        stats = C.estimate(door_llama, docs[i::2], [1], C.EstimationSettings(tokens_per_batch=64),
                           cache=False, progress=False,
                           corpus_spec={"name": "door", "n": 12, "shard": [i, 2]})
        paths.append(str(stats.save(tmp_path / f"s{i}.safetensors")))
    assert cli.main(["cov", "merge", *paths, "--out", paths[0]]) == 0
    err = capsys.readouterr().err
    assert f"--out {paths[0]} is the input {paths[0]}" in err and "now holds the merge of all 2 shards" in err
    assert cli.main(["cov", "merge", *paths, "--out", str(tmp_path / "again.safetensors")]) == 2
    assert "count documents twice" in capsys.readouterr().err


# --------------------------------------------------------------------------- the remaining doors


@pytest.mark.parametrize("value", ["[1.5]", "[True]", "[0.0]", "[False]", "[0, 0]", "[]", "[-1]"])
def test_organisms_that_are_not_distinct_integers_are_refused_at_the_door(value, tmp_path, capsys):
    """`-p organisms` is a list of distinct integers >= 0 (True is no organism, 1.5 none either): refused
    naming the parameter and the value, by `moir run` before the chapter starts and by the labs a chapter
    opens (`[0.0]` would run organism 0 and store it as organism 0.0)."""
    import ast

    from moir_lib.experiments import open_labs
    from moir_lib.runs import resolve_parameters

    message = rf"parameter 'organisms' got {re.escape(repr(ast.literal_eval(value)))}: give a list of"
    with pytest.raises(ValueError, match=message):
        resolve_parameters(NOTEBOOK, [("organisms", value)])
    code = cli.main(["run", str(NOTEBOOK), "-p", "organisms", value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="give a list of distinct integers >= 0"):
        open_labs("pocket-micro", tmp_path / "labs", ast.literal_eval(value))
    assert resolve_parameters(NOTEBOOK, [("organisms", "[0, 2]")]) == {"organisms": [0, 2]}


def _run_of(folder: Path, chapter: str, **given) -> Path:
    """An executed copy of ``chapter`` in ``folder`` whose run was given ``given`` (papermill's record)."""
    import nbformat

    root = Path(__file__).resolve().parents[1]
    nb = nbformat.read(str(root / f"{chapter}.ipynb"), as_version=4)
    nb.metadata["papermill"] = {"parameters": given, "input_path": f"{chapter}.ipynb"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(chapter).name}.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_runs_of_one_profile_by_name_and_by_path_merge(tmp_path, root):
    """`moir book --from` over the runs of a chapter split by organism: one profile given by name in one run
    and by path in another (absolute, or relative to the chapter as its kernel read it) is one setting; a
    real difference names the parameter and both values (a profile: the settings that differ)."""
    import yaml

    from moir_lib.book.merge import merge_parameters

    chapter = "notebooks/05_editing"
    by_name = _run_of(tmp_path / "a", chapter, profile="pocket-micro", organisms=[0], n_eval=8)
    runs = [by_name, _run_of(tmp_path / "b", chapter, profile=str(root / "data/profiles/pocket-micro.yaml"),
                             organisms=[1], n_eval=8),
            _run_of(tmp_path / "c", chapter, profile="../data/profiles/pocket-micro.yaml", organisms=[2],
                    n_eval=8)]
    params = merge_parameters(root, chapter, runs)
    assert params["organisms"] == [0, 1, 2] and params["profile"] == "pocket-micro"
    other = yaml.safe_load((root / "data/profiles/pocket-micro.yaml").read_text())
    other["memit"]["lambda"] = 123.0
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(other))
    changed = _run_of(tmp_path / "d", chapter, profile=str(tmp_path / "mine.yaml"), organisms=[1], n_eval=8)
    with pytest.raises(ValueError, match=rf"parameter 'profile' is 'pocket-micro' and "
                                         rf"'{re.escape(str(tmp_path / 'mine.yaml'))}', which differ in "
                                         rf"memit\.lambda \([0-9.e+]+ vs 123\.0\)"):
        merge_parameters(root, chapter, [by_name, changed])
    fewer = _run_of(tmp_path / "e", chapter, profile="pocket-micro", organisms=[1], n_eval=4)
    with pytest.raises(ValueError, match=r"parameter 'n_eval' is 8 and 4 \("):
        merge_parameters(root, chapter, [by_name, fewer])


@pytest.mark.parametrize(("fault", "problem"), [
    ({"paraphrase_prompts": ["Ghana belongs to the continent of"]},
     r"record 0 \(case_id 7\): field 'paraphrase_prompts\[0\]' does not name its subject 'Angola': got"),
    ({"neighborhood_subjects": ["Ghana", "Togo"]},
     r"record 0 \(case_id 7\): field 'neighborhood_prompts\[1\]' does not name its subject 'Togo': got"),
    ({"requested_rewrite": {**ROME_RECORD["requested_rewrite"], "subject": "{}"}},
     r"record 0: subject '\{\}' \(case_id 7\) holds the placeholder"),
])
def test_record_whose_paraphrase_does_not_name_its_subject_is_refused(fault, problem, tmp_path, capsys,
                                                                      no_model_load):
    """A CounterFact record's paraphrases are prompts about its subject (PS scores the edit on them), and a
    neighbourhood prompt is about the subject the record names for it: one that is not is refused at load,
    naming the record, its case id, the field and the prompt, before `moir edit` loads the model."""
    records = dump(tmp_path, [{**copy.deepcopy(ROME_RECORD), **fault}, rome(8, subject="Ghana")])
    with pytest.raises(ValueError, match=problem):
        load_counterfact(records)
    code = cli.main(["edit", "--profile", "pocket-micro", "--editor", "memit", "--cov", "wiki", "--regime",
                     "batch", "--n-edits", "1", "--records", str(records), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and re.search(problem, err), err
    flat = {"case_id": 3, "prompt": "Angola is located in", "subject": "Angola", "target_new": "Antarctica",
            "ground_truth": "Africa", "rephrase_prompt": "Ghana is in the continent of"}
    with pytest.raises(ValueError, match=r"record 0 \(case_id 3\): field 'rephrase_prompt\[0\]' does not"):
        load_counterfact(dump(tmp_path, [flat], "easyedit.json"))


def test_pocket_report_json_at_a_directory_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """`moir pocket report --json PATH` (and `--markdown`) with PATH a directory is refused at once, not
    after every organism has been built and measured; so is the library's report."""
    import moir_lib.experiments.pocket_report as reports

    def measured(*args, **kwargs):
        raise AssertionError("an organism was measured before the output paths were checked")

    monkeypatch.setattr(reports, "pocket_report", measured)
    monkeypatch.setattr("moir_lib.pocket.report.measure", measured)
    folder = tmp_path / "reports"
    folder.mkdir()
    for flag in ("--json", "--markdown"):
        code = cli.main(["pocket", "report", "--variant", "micro", "--organisms", "0,1", flag, str(folder)])
        err = capsys.readouterr().err
        assert code == 2 and f"{flag} {folder} is a directory: name a file" in err, err
    monkeypatch.undo()
    with pytest.raises(ValueError, match=rf"the report's JSON path {re.escape(str(folder))} is a directory"):
        reports.pocket_report("micro", json_path=folder)
