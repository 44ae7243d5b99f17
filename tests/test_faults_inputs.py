"""Bad inputs refused before any work, with one line naming the input: records, hyper-parameters,
profiles, and the rows reused from other runs (only rows whose key matches are used or copied)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
from test_data import ROME_RECORD, dump

from moir_lib import cli
from moir_lib.data import check_distinct_facts, load_counterfact
from moir_lib.experiments import Lab, RunSpec
from moir_lib.experiments.rows import write_rows
from moir_lib.profiles import ProfileError, load_profile


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
    assert code == 2 and "--lambda must lie in (0, ∞)" in err, err
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
    point = lab._make_rows(SPEC, 3, {("edit", "ES"): 0.75, ("edit", "PS"): 0.5})
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
    assert sorted(table["value"]) == [0.5, 0.75]
