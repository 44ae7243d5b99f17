"""Bad inputs refused before any work, with one line naming the input: records, hyper-parameters,
profiles, and the rows reused from other runs (only rows whose key matches are used or copied)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
from test_data import ROME_RECORD, dump

from moir_lib import cli
from moir_lib.data import check_distinct_facts, load_counterfact
from moir_lib.experiments import Lab, RunSpec
from moir_lib.experiments.rows import EDIT_METRICS, write_rows
from moir_lib.profiles import ProfileError, load_profile

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_editing.ipynb"


@pytest.fixture
def no_model_load(monkeypatch):
    import moir_lib.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr(moir_lib.models, "load", refuse)


def rome(case_id: int, **rewrite) -> dict:
    rec = copy.deepcopy(ROME_RECORD)
    rec["case_id"] = case_id
    rec["requested_rewrite"].update(rewrite)
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


SPEC = RunSpec("memit", "batch", "wiki", 3)


def _rows_of_other_run(lab: Lab, profile: str) -> pd.DataFrame:
    """Rows another run wrote: this spec's point (under another profile name) and a stale twin."""
    point, _ = lab._make_rows(SPEC, 3, {("edit", m): 0.5 for m in EDIT_METRICS})
    stale = point.assign(key="0" * 16, value=0.125)
    return pd.concat([point, stale], ignore_index=True).assign(profile=profile)


def test_reuse_path_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="reuse path .*nowhere does not exist"):
        Lab("pocket-micro", tmp_path / "out", shared_cache=False, reuse=[tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no results.parquet"):
        Lab("pocket-micro", tmp_path / "out", shared_cache=False, reuse=[tmp_path / "empty"])


def test_reuse_copies_only_matching_rows_under_this_profile(tmp_path):
    probe = Lab("pocket-micro", tmp_path / "probe", shared_cache=False)
    write_rows(_rows_of_other_run(probe, "someone-else"), tmp_path / "old")
    lab = Lab("pocket-micro", tmp_path / "new", shared_cache=False, reuse=[tmp_path / "old"])
    assert lab.is_cached(SPEC, ("edit",)) and not lab.model_loaded
    table = pd.read_parquet(tmp_path / "new" / "results.parquet")  # an all-reused run has its table
    assert set(table["key"]) == {lab.key(SPEC.at(3))}  # the stale twin is not copied
    assert set(table["profile"]) == {"pocket-micro"}
    assert len(table) == len(EDIT_METRICS) and set(table["value"]) == {0.5}


def test_reused_point_missing_a_metric_is_recomputed_not_half_used(tmp_path):
    probe = Lab("pocket-micro", tmp_path / "probe", shared_cache=False)
    rows = _rows_of_other_run(probe, "pocket-micro")
    write_rows(rows[rows["metric"] != "S_e"], tmp_path / "old")
    lab = Lab("pocket-micro", tmp_path / "new", shared_cache=False, reuse=[tmp_path / "old"])
    assert not lab.is_cached(SPEC, ("edit",)) and lab.rows.empty


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
        G.self_generate(llama.model, llama.tokenizer, "rand1", 10**12, 4, 2, out, progress=False)
    assert not out.exists()


# --------------------------------------------------------------------------- moir book --from


def _executed(folder: Path, chapter: str, source: str, error: bool = False) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x = 1")
    if error:
        cell.outputs = [nbformat.v4.new_output("error", ename="TypeError", evalue="bad", traceback=[])]
    nb.cells = [cell]
    nb.metadata["papermill"] = {"input_path": source, "exception": error or None}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{chapter}.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_book_from_a_truncated_foreign_or_failed_run_is_refused(tmp_path):
    from moir_lib import runs

    chapter = "notebooks/04_g_cancellation"
    good = _executed(tmp_path / "good", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb")
    assert [e.notebook for e in runs.collect_executed(tmp_path / "good", [chapter])] == [good]
    cut = _executed(tmp_path / "cut", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb")
    cut.write_bytes(cut.read_bytes()[:40])
    _executed(tmp_path / "foreign", "04_g_cancellation", "notebooks/02_generation.ipynb")
    _executed(tmp_path / "failed", "04_g_cancellation", "notebooks/04_g_cancellation.ipynb", error=True)
    for run, message in (("cut", "is damaged"), ("foreign", "was run from notebooks/02_generation.ipynb"),
                         ("failed", "holds a failed run")):
        with pytest.raises(ValueError, match=message):
            runs.collect_executed(tmp_path / run, [chapter])
