"""CounterFact (ROME + EasyEdit formats) and knowns loaders: real fixtures and malformed records."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
from tiny import ROME_RECORD, dump

from moir_lib.data import CounterFactRecord, detect_format, load_counterfact, load_knowns

EASY_RECORD = {
    "case_id": 10,
    "prompt": "BBC One, by",
    "target_new": "Sega",
    "subject": "BBC One",
    "ground_truth": "BBC",
    "rephrase_prompt": "BBC One is owned by",
    "locality_prompt": "BBC Radio, by",
    "locality_ground_truth": "BBC",
}


def second_copy(record: dict, case_id: int = 8) -> dict:
    other = copy.deepcopy(record)
    other["case_id"] = case_id
    return other


# --------------------------------------------------------------------------- real fixtures

@pytest.mark.parametrize("folder", ["slices", "reference"])
def test_vendored_files_match_their_checksums(root: Path, folder: str) -> None:
    """Every file listed in ``data/<folder>/SHA256SUMS`` is present, byte for byte (CRLF kept), and
    every data file is listed."""
    base = root / "data" / folder
    listed = {}
    for line in (base / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.removeprefix("./")] = digest
    for name, digest in listed.items():
        assert hashlib.sha256((base / name).read_bytes()).hexdigest() == digest, name
    on_disk = {p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()}
    assert on_disk - set(listed) == {"SHA256SUMS", "SOURCES.md"}



def test_rome_format_fixture(slices: Path) -> None:
    path = slices / "counterfact" / "counterfact_rome_100.json"
    records = load_counterfact(path)
    raw = json.loads(path.read_text())
    assert len(records) == len(raw) == 100
    first = records[0]
    assert (first.case_id, first.subject, first.relation_id) == (20952, "Angola", "P30")
    assert first.prompt == "{} is located in"
    assert (first.target_new, first.target_true, first.target_new_id) == ("Antarctica", "Africa", "Q51")
    assert first.filled_prompt == "Angola is located in"
    for rec, src in zip(records, raw, strict=True):
        assert rec.source_format == "rome" and rec.prompt.count("{}") == 1
        assert rec.paraphrase_prompts == tuple(src["paraphrase_prompts"]) and len(rec.paraphrase_prompts) == 2
        assert len(rec.neighborhood_prompts) == 10 and set(rec.neighborhood_targets) == {rec.target_true}
        assert len(rec.attribute_prompts) == 10 and len(rec.generation_prompts) == 10
        assert rec.to_rome() == src  # nothing lost


def test_easyedit_format_fixture(slices: Path) -> None:
    path = slices / "counterfact" / "counterfact_easyedit_300.json"
    records = load_counterfact(path)
    raw = json.loads(path.read_text())
    assert len(records) == 300
    for rec, src in zip(records, raw, strict=True):
        assert rec.source_format == "easyedit" and rec.case_id == src["case_id"]
        assert rec.prompt.count("{}") >= 1 and rec.filled_prompt == src["prompt"]
        assert (rec.target_new, rec.target_true) == (src["target_new"], src["ground_truth"])
        assert rec.paraphrase_prompts == (src["rephrase_prompt"],)
        assert rec.neighborhood_prompts == (src["locality_prompt"],)
        assert rec.neighborhood_targets == (src["locality_ground_truth"],)
    assert records[0].to_request() == {
        "case_id": 10, "prompt": "{}, by", "subject": "BBC One",
        "target_new": {"str": "Sega"}, "target_true": {"str": "BBC"},
    }


def test_knowns_fixture(slices: Path) -> None:
    knowns = load_knowns(slices / "knowns" / "known_200.json")
    assert len(knowns) == 200
    k = knowns[0]
    assert (k.known_id, k.subject, k.attribute, k.relation_id) == (0, "Vinson Massif", "Antarctica", "P30")
    assert k.prompt.startswith(k.template.format(k.subject))
    assert all(r.subject in r.prompt for r in knowns)


# --------------------------------------------------------------------------- formats


def test_detect_format_and_limit(tmp_path: Path) -> None:
    assert detect_format(ROME_RECORD) == "rome" and detect_format(EASY_RECORD) == "easyedit"
    with pytest.raises(ValueError, match=r"record 3: neither the ROME .* its keys: question, answer"):
        detect_format({"question": 1, "answer": 2}, 3)
    path = dump(tmp_path, [ROME_RECORD, second_copy(ROME_RECORD)])
    assert [r.case_id for r in load_counterfact(path, limit=1)] == [7]


def test_jsonl_and_round_trip(tmp_path: Path) -> None:
    rec = load_counterfact(dump(tmp_path, [ROME_RECORD]))[0]
    path = tmp_path / "cf.jsonl"
    path.write_text(json.dumps(rec.to_rome()) + "\n\n" + json.dumps(second_copy(rec.to_rome())) + "\n")
    again = load_counterfact(path)
    assert again[0] == rec and isinstance(again[0], CounterFactRecord) and again[1].case_id == 8


def test_named_neighbours_load_round_trip_and_must_align(tmp_path: Path) -> None:
    named = dict(second_copy(ROME_RECORD), neighborhood_subjects=["Ghana", "Mali"])
    plain, rec = load_counterfact(dump(tmp_path, [ROME_RECORD, named]))
    assert plain.neighborhood_subjects == () and "neighborhood_subjects" not in plain.to_rome()
    assert rec.neighborhood_subjects == ("Ghana", "Mali") and rec.to_rome() == named
    short = dict(named, neighborhood_subjects=["Ghana"])
    with pytest.raises(ValueError, match="^record 1: 1 neighborhood_subjects for 2 neighborhood_prompts"):
        load_counterfact(dump(tmp_path, [ROME_RECORD, short]))


def test_easyedit_lists_and_portability(tmp_path: Path) -> None:
    rec = dict(EASY_RECORD, locality_prompt=["BBC Radio, by", "BBC Two, by"],
               portability={"Subject_Aliasing": [{"prompt": "BBC1, by", "ground_truth": "Sega"}]})
    del rec["case_id"]
    loaded = load_counterfact(dump(tmp_path, [rec]))[0]
    assert loaded.case_id == 0  # the index when absent
    assert loaded.neighborhood_targets == ("BBC", "BBC")
    assert loaded.portability["Subject_Aliasing"][0]["ground_truth"] == "Sega"


# --------------------------------------------------------------------------- malformed records


def _rome_without(*path: str) -> dict:
    rec = second_copy(ROME_RECORD, 99)
    target = rec
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return rec


ROME_RR = ROME_RECORD["requested_rewrite"]
MALFORMED_ROME = [
    (_rome_without("requested_rewrite", "target_new"), "missing field 'requested_rewrite.target_new'"),
    (_rome_without("requested_rewrite", "target_true", "str"),
     "missing field 'requested_rewrite.target_true.str'"),
    (_rome_without("requested_rewrite", "subject"), "missing field 'requested_rewrite.subject'"),
    (_rome_without("case_id"), "missing field 'case_id'"),
    (_rome_without("neighborhood_prompts"), "missing field 'neighborhood_prompts'"),
    (dict(second_copy(ROME_RECORD), paraphrase_prompts=3), "field 'paraphrase_prompts' must be a list"),
    (dict(second_copy(ROME_RECORD), requested_rewrite="x"), "field 'requested_rewrite' must be an object"),
    (dict(second_copy(ROME_RECORD), case_id="8"), "field 'case_id' must be an integer"),
    (dict(second_copy(ROME_RECORD), requested_rewrite={**ROME_RR, "prompt": "Angola is in"}),
     r"field 'requested_rewrite.prompt' must contain the subject placeholder '\{\}' exactly once"),
    (second_copy(ROME_RECORD, 7), "case_id 7 repeats record 0"),
    (EASY_RECORD, "missing field 'requested_rewrite'"),
    ([1, 2], "expected an object, got list"),
]


@pytest.mark.parametrize(("bad", "message"), MALFORMED_ROME)
def test_malformed_rome_record_is_reported_by_index_and_field(tmp_path: Path, bad, message: str) -> None:
    with pytest.raises(ValueError, match=f"^record 1: {message}"):
        load_counterfact(dump(tmp_path, [ROME_RECORD, bad]))


MALFORMED_EASY = [
    ({k: v for k, v in EASY_RECORD.items() if k != "ground_truth"}, "missing field 'ground_truth'"),
    (dict(EASY_RECORD, case_id=3, subject="ITV"), r"subject 'ITV' does not occur in prompt 'BBC One, by'"),
    (dict(EASY_RECORD, case_id=3, target_new=""), "field 'target_new' must be a non-empty string"),
    (dict(EASY_RECORD, case_id=3, locality_prompt=["a", "b"], locality_ground_truth=["x", "y", "z"]),
     r"2 locality_prompt\(s\) but 3 locality_ground_truth\(s\)"),
]


@pytest.mark.parametrize(("bad", "message"), MALFORMED_EASY)
def test_malformed_easyedit_record(tmp_path: Path, bad, message: str) -> None:
    with pytest.raises(ValueError, match=f"^record 1: {message}"):
        load_counterfact(dump(tmp_path, [EASY_RECORD, bad]))


def test_forced_format_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^record 0: missing field 'requested_rewrite'$"):
        load_counterfact(dump(tmp_path, [EASY_RECORD]), format="rome")
    with pytest.raises(FileNotFoundError, match="no such data file"):
        load_counterfact(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="expected a list of records, got dict"):
        load_counterfact(dump(tmp_path, {"a": 1}, "dict.json"))
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_counterfact(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="no records"):
        load_counterfact(dump(tmp_path, [], "empty.json"))


def test_malformed_known(tmp_path: Path) -> None:
    good = {"known_id": 0, "subject": "Vinson Massif", "attribute": "Antarctica",
            "template": "{} is located in the continent", "prediction": " Antarctica",
            "prompt": "Vinson Massif is located in the continent of", "relation_id": "P30"}
    assert load_knowns(dump(tmp_path, [good]))[0].attribute == "Antarctica"
    with pytest.raises(ValueError, match="^record 1: missing field 'attribute'"):
        load_knowns(dump(tmp_path, [good, {k: v for k, v in good.items() if k != "attribute"}]))
    with pytest.raises(ValueError, match="^record 1: subject 'Mount Kenya' does not occur"):
        load_knowns(dump(tmp_path, [good, dict(good, known_id=1, subject="Mount Kenya")]))
    with pytest.raises(ValueError, match="^record 0: field 'template' has no"):
        load_knowns(dump(tmp_path, [dict(good, template="located in")]))
