"""Selecting AlphaEdit's τ and MEMIT's λ on the validation split: the split is disjoint from every record a
chapter edits or scores and from every preservation item it scores; the choice rule; every organism's own
choice and a chapter's runs moved to it; the neighbouring grid values; the grids; the tables;
``moir edit --tau auto`` / ``--lambda auto``. The model tests run on the micro pocket model."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from moir_lib.chapters import editing
from moir_lib.chapters.strength_tables import (
    grid_table,
    neighbour_text,
    organism_table,
    per_model_values,
    selection_text,
    sensitivity_text,
)
from moir_lib.cli import main
from moir_lib.experiments import EditSettings, EvalSettings, ExperimentSpec, Lab, PointStore, ScorePlan
from moir_lib.experiments.gates import ES_GATE
from moir_lib.experiments.records import EditRecords, RecordPlan, apart_by_subject
from moir_lib.experiments.selection import (
    Selection,
    SelectionRule,
    chosen,
    neighbours,
    organism_strengths,
    per_model,
    retune,
    select,
    select_each,
    strengths,
    validation_lab,
    validation_n,
)
from moir_lib.profiles import load_profile

#: the micro world's 58 records cut as the pocket one is: 3 + 2 preservation facts, 45 to edit, 8 to validate
HELD = {"editing.validation_records": 8, "editing.validation_items": 2}
TINY = EvalSettings(n_eval=3, pres_limit=3, nll_docs=2, max_gen_tokens=4, fluency_prompts=1)
EDIT_SAMPLES = range(6)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def micro_profile(**more):
    return load_profile("pocket-micro").with_overrides({**HELD, **more})


def micro_lab(path: Path, **more) -> Lab:
    return Lab(micro_profile(**more), PointStore(path, shared=False), evaluation=TINY,
               editing=EditSettings(context_templates=1))


# ----------------------------------------------------------------------------- the split (no model)


@pytest.mark.parametrize(("pres_limit", "held", "items"), [(3, 8, 2), (10, 12, 5), (50, 4, 2)])
def test_the_validation_split_is_disjoint_from_every_edited_and_scored_record(pres_limit, held, items):
    """Pocket CounterFact: the chapters' preservation facts, the selection's, the edit pool of every edit
    sample and the validation split are disjoint parts of the file, in that order; the facts task's item i is
    record i."""
    from moir_lib.pocket import build

    edit_records = EditRecords("micro", "pocket", pres_limit, plan=RecordPlan(held, items))
    file = edit_records.file()
    parts = edit_records.parts()
    assert [(p.start, p.stop) for p in parts.values()] == [(0, pres_limit + items),
                                                           (pres_limit + items, len(file) - held),
                                                           (len(file) - held, len(file))]
    facts_file = build("micro") / "benchmarks" / "facts.jsonl"
    facts = [json.loads(line) for line in facts_file.read_text().splitlines()]
    assert [f["prompt"] for f in facts] == [r.paraphrase_prompts[0] for r in file]  # item i asks record i
    chapter_facts = {r.case_id for r in file[:pres_limit]}
    selection_facts = {r.case_id for r in file[pres_limit:pres_limit + items]}
    validation = {r.case_id for r in edit_records.validation()}
    assert len(validation) == held and {r.case_id for r in edit_records.validation(3)} == validation
    for sample in EDIT_SAMPLES:
        pool = {r.case_id for r in edit_records.pool(sample)}
        assert len(pool) == len(file) - pres_limit - items - held
        assert not pool & validation and not pool & chapter_facts and not pool & selection_facts
    assert not validation & (chapter_facts | selection_facts) and not chapter_facts & selection_facts
    ids = [r.case_id for r in edit_records.validation()]
    assert [r.case_id for r in edit_records.validation_split().pool(0)] == ids
    assert {r.case_id for r in edit_records.all()} == {r.case_id for r in edit_records.pool(0)}


def test_subjects_apart_puts_each_subjects_kth_record_after_every_subjects_earlier_ones():
    """A stable reorder: the same records, each subject's k-th after every subject's (k-1)-th, and the given
    order kept among records of the same rank."""
    rec = [SimpleNamespace(subject=s, i=i) for i, s in enumerate("aabcbad")]
    out = apart_by_subject(rec)
    assert [(r.subject, r.i) for r in out] == [("a", 0), ("b", 2), ("c", 3), ("d", 6), ("a", 1), ("b", 4),
                                               ("a", 5)]
    assert apart_by_subject([]) == []


@pytest.mark.parametrize("sample", [0, 1, 2])
def test_pocket_edit_orders_keep_subjects_apart_and_edit_the_same_records(sample):
    """With ``subjects_apart`` each edit sample and the validation split edit the records they edit without
    it, and their first records are about distinct subjects, as many as the part holds; the option is part of
    the records' identity (every result key), and the pocket profiles set it while the paper's keep the
    file's order."""
    from moir_lib.profiles import load_profile

    plain = EditRecords("micro", "pocket", 3, plan=RecordPlan(8, 2))
    apart = EditRecords("micro", "pocket", 3, plan=RecordPlan(8, 2, True))
    for mine, theirs in ((apart.pool(sample), plain.pool(sample)),
                         (apart.validation(sample), plain.validation(sample))):
        assert sorted(r.case_id for r in mine) == sorted(r.case_id for r in theirs)
        n = len({r.subject for r in theirs})
        assert len({r.subject for r in mine[:n]}) == n
    assert len({r.subject for r in plain.pool(sample)}) < len(plain.pool(sample))  # the micro world repeats
    assert apart.identity() != plain.identity()
    assert [load_profile(p).editing.subjects_apart for p in ("pocket", "pocket-micro", "qwen3-8b")] == \
        [True, True, False]


def test_a_records_file_holds_its_validation_split_at_the_end(slices):
    path = slices / "counterfact" / "counterfact_rome_100.json"
    edit_records = EditRecords(None, "paper", 50, records_path=path, plan=RecordPlan(30))
    file = edit_records.file()
    assert [r.case_id for r in edit_records.validation()] == [r.case_id for r in file[-30:]]
    assert [r.case_id for r in edit_records.pool(0)] == [r.case_id for r in file[:70]]  # no facts task here
    assert not {r.case_id for r in edit_records.pool(4)} & {r.case_id for r in edit_records.validation(4)}


def test_a_file_too_small_for_its_split_is_refused_with_what_to_do(slices):
    path = slices / "counterfact" / "counterfact_rome_100.json"
    with pytest.raises(ValueError, match=r"holds 100 records.*last 100 the validation split.*lower "
                                         r"validation_records"):
        EditRecords(None, "paper", 50, records_path=path, plan=RecordPlan(100)).pool(0)
    with pytest.raises(ValueError, match=r"first 55 are preservation facts and the last 8"):
        EditRecords("micro", "pocket", 50, plan=RecordPlan(8, 5)).all()
    assert len(EditRecords("micro", "pocket", 50).pool(0)) == 8  # without a split: as before


def test_every_organism_selects_on_its_own_validation_split(tmp_path):
    """A lab of organism 1 selects on its own split (the paper selects per model): its validation points are
    its own, and a chapter's selections made on organism 0 are made again in each organism, with the same
    grid, N and scoring; a chapter's runs then edit at each organism's values."""
    zero, one = micro_lab(tmp_path / "zero"), micro_lab(tmp_path / "one", organism=1)
    spec = ExperimentSpec("memit", "batch", "wiki", 8, lambda_=3.0)
    assert validation_lab(zero).key(spec) != validation_lab(one).key(spec)
    assert validation_lab(one).store.out_dir == tmp_path / "one" / "selection"
    pinned = strengths(zero, ["memit"], ["wiki", "moir"], 3, lambdas={"wiki": 6.0, "moir": 9.0})
    own = organism_strengths([zero, one], pinned)
    assert [s.organism for mine in own for s in mine["memit"]] == [0, 0, 1, 1]
    assert [chosen(mine["memit"]) for mine in own] == [{"wiki": 6.0, "moir": 9.0}] * 2
    moved = {"memit": [dataclasses.replace(s, value=s.value * 2) for s in own[1]["memit"]]}
    runs = [ExperimentSpec("memit", "batch", c, 3, lambda_=1.0)
            for c in ("wiki", "moir@1", "moir-bos", "oracle")]
    runs.append(ExperimentSpec("alphaedit", "batch", "wiki", 3, tau=0.02))
    again = retune(runs, moved)
    assert [s.lambda_ for s in again[:4]] == [12.0, 18.0, 18.0, 1.0], "draws and strategies follow C_Moir"
    assert again[4] == runs[4], "an editor without a selection keeps its value"
    assert not zero.is_loaded() and not one.is_loaded()


def test_the_neighbouring_grid_values_of_every_choice():
    wiki = fake("wiki", [(0.02, 0.95, 0.3, 0.3), (0.005, 0.96, 0.5, 0.5), (0.001, 0.99, 0.2, 0.2)])
    moir = fake("moir", [(0.02, 0.95, 0.9, 0.9), (0.005, 0.85, 0.9, 0.9), (0.001, 0.97, 0.1, 0.1)])
    own = {"alphaedit": [wiki, moir]}  # wiki chose 0.005 (the middle), moir 0.02 (the top)
    assert chosen(neighbours(own, -1, ["wiki"])["alphaedit"]) == {"wiki": 0.001}
    assert chosen(neighbours(own, 1, ["wiki"])["alphaedit"]) == {"wiki": 0.02}
    assert neighbours(own, 1) is None, "C_Moir's choice sits at the grid's top: no value above"
    assert chosen(neighbours(own, -1)["alphaedit"]) == {"wiki": 0.001, "moir": 0.005}
    table = organism_table([own])
    assert list(table["value"]) == [0.005, 0.02] and set(table["strength"]) == {"τ"}
    assert "No claim was judged" in neighbour_text([], [])


def test_the_split_is_part_of_a_points_key(tmp_path):
    lab = micro_lab(tmp_path)
    plain = Lab("pocket-micro", PointStore(tmp_path / "b", shared=False), evaluation=TINY,
                editing=EditSettings(context_templates=1))
    spec = ExperimentSpec("memit", "batch", "wiki", 2)
    val = validation_lab(lab)
    keys = {lab.key(spec), plain.key(spec), val.key(spec)}
    assert len(keys) == 3  # held-out records change the pool; the validation split is other records
    assert val.evaluation.pres_offset == TINY.pres_limit and val.evaluation.pres_limit == 2
    assert val.evaluation.n_eval == 50 and val.store.out_dir == tmp_path / "selection"
    # a grid does not change one run's numbers: another grid keeps the key
    regridded = Lab(micro_profile(**{"alphaedit.tau_grid": [0.5]}), PointStore(tmp_path / "c", shared=False),
                    evaluation=TINY, editing=EditSettings(context_templates=1))
    assert regridded.key(spec) == lab.key(spec)


def test_selection_settings_are_checked_before_any_model(tmp_path):
    lab = micro_lab(tmp_path)
    plain = Lab("pocket-micro", PointStore(tmp_path / "p", shared=False), evaluation=TINY)
    with pytest.raises(ValueError, match="holds no validation split"):
        select(plain, "memit", "wiki", 2)
    with pytest.raises(ValueError, match="the validation split holds 8 records"):
        select(lab, "memit", "wiki", 9)
    with pytest.raises(ValueError, match="only 2 after the chapters'"):
        select(lab, "memit", "wiki", 2, rule=SelectionRule(pres_items=3))
    with pytest.raises(ValueError, match="criterion"):
        select(lab, "memit", "wiki", 2, rule=SelectionRule(criterion="best"))
    pinned = select(lab, "alphaedit", "wiki", 2, pin=0.005)
    assert pinned.pinned and pinned.value == 0.005 and pinned.gated is None
    assert pinned.spec("batch", 10).tau == 0.005 and select(lab, "memit", "wiki", 2, grid=[7.0]).value == 7.0
    # a notebook's setting: None pins the profile's value, a number pins it, "auto" selects
    assert [s.value for s in select_each(lab, "alphaedit", ["wiki", "moir"], 2, None)] == [0.02, 0.02]
    assert [s.value for s in select_each(lab, "memit", ["wiki"], 2, 30.0)] == [30.0]
    with pytest.raises(ValueError, match="'auto', a positive number or None"):
        select_each(lab, "memit", ["wiki"], 2, "best")
    # a setting per C: each C its own, an omitted C selects; a C not compared is refused before anything runs
    each = select_each(lab, "memit", ["wiki", "moir"], 2, {"wiki": 30.0, "moir": None})
    assert [(s.value, s.pinned) for s in each] == [(30.0, True), (lab.profile.memit.lambda_, True)]
    with pytest.raises(ValueError, match=r"settings for \['oracle'\], which are not among"):
        select_each(lab, "memit", ["wiki", "moir"], 2, {"oracle": 3.0})
    with pytest.raises(ValueError, match="positive number"):
        select_each(lab, "alphaedit", ["wiki", "moir"], 2, {"wiki": 0.02, "moir": -1})
    # a chapter's call: each editor pinned or selected at the claims' N, capped at the validation split
    pins = strengths(lab, ["memit", "alphaedit"], ["wiki", "moir"], {"memit": 100, "alphaedit": 3},
                     taus=0.005, lambdas={"wiki": 6.0, "moir": 9.0})
    assert chosen(pins["alphaedit"]) == {"wiki": 0.005, "moir": 0.005}
    assert chosen(pins["memit"]) == {"wiki": 6.0, "moir": 9.0}
    assert validation_n(lab, 100) == 8 and validation_n(lab, 3) == 3
    assert not lab.is_loaded()


def test_evaluation_offset_is_checked_and_absent_from_the_chapters_keys():
    assert "pres_offset" not in EvalSettings().key() and EvalSettings(pres_offset=5).key()["pres_offset"] == 5
    with pytest.raises(ValueError, match="pres_offset needs pres_limit"):
        EvalSettings(pres_offset=5, pres_limit=None)
    with pytest.raises(ValueError, match="pres_offset must be"):
        EvalSettings(pres_offset=-1)


def test_offset_samples_take_the_items_after_the_offset_in_every_task(slices):
    """lm-eval's ``samples`` for the paper suite's offline files (MMLU: each subject) and the pocket tasks."""
    from lm_eval.tasks import TaskManager

    from moir_lib.evaluation.preservation import offline_task_configs
    from moir_lib.evaluation.preservation.configs import _task_manager
    from moir_lib.evaluation.preservation.harness import offset_samples
    from moir_lib.pocket import build
    from moir_lib.pocket.benchmarks import TASKS, TASKS_DIR

    configs = offline_task_configs(slices, ["mmlu", "arc_challenge", "gsm8k"], _task_manager())
    paper = offset_samples(_task_manager(), [c for cs in configs.values() for c in cs], 5, 10)
    assert {"arc_challenge", "gsm8k"} <= set(paper) and sum(k.startswith("mmlu_") for k in paper) == 4
    assert paper["arc_challenge"] == list(range(5, 15))
    assert paper["mmlu_college_computer_science"] == list(range(5, 11))  # the slice's 11 questions
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                          metadata={"pocket_data": str(build("micro") / "benchmarks")})
    pocket = offset_samples(manager, list(TASKS), 6, 5)
    assert pocket["pocket_facts"] == [6, 7, 8, 9, 10] and pocket["pocket_code"] == [6, 7]  # 8 code tasks
    with pytest.raises(ValueError, match="pocket_code has only 8 documents"):
        offset_samples(manager, list(TASKS), 8, 5)


# ----------------------------------------------------------------------------- the choice (no model)


def fake(cov: str, rows: list[tuple[float, float, float, float]], editor: str = "alphaedit") -> Selection:
    """A measured selection from ``(value, ES, S_e, S_p)`` rows, chosen by the module's rule."""
    from moir_lib.experiments.selection import _choose

    table = pd.DataFrame([{"value": v, "ES": es, "S_e": se, "S_p": sp, "Total": se + sp,
                           "clears_gate": es >= ES_GATE, "chosen": False, "note": ""}
                          for v, es, se, sp in rows])
    value, gated = _choose(table, "Total")
    table["chosen"] = table["value"] == value
    return Selection(editor, cov, 100, 0, tuple(table["value"]), "total", "S_e", value, gated, False, table)


def test_the_largest_total_among_values_that_clear_the_gate_is_chosen():
    best_fails = fake("moir", [(0.02, 0.85, 0.9, 0.9), (0.005, 0.95, 0.5, 0.6), (0.001, 0.97, 0.4, 0.5)])
    assert best_fails.value == 0.005 and best_fails.gated
    none_clears = fake("wiki", [(0.02, 0.70, 0.9, 0.9), (0.005, 0.80, 0.5, 0.6), (0.001, math.nan, 0, 0)])
    assert none_clears.value == 0.005 and none_clears.gated is False  # the largest ES, flagged
    # per model: one value for both C's, among those clearing the gate under both
    wiki = fake("wiki", [(0.02, 0.95, 0.3, 0.3), (0.005, 0.96, 0.5, 0.5), (0.001, 0.99, 0.2, 0.2)])
    moir = fake("moir", [(0.02, 0.95, 0.9, 0.9), (0.005, 0.85, 0.9, 0.9), (0.001, 0.97, 0.1, 0.1)])
    assert (wiki.value, moir.value) == (0.005, 0.02)
    assert per_model([wiki, moir]) == (0.02, True)
    with pytest.raises(ValueError, match="one editor, grid"):
        per_model([wiki, fake("moir", [(0.3, 0.95, 0.5, 0.5)])])


def test_grid_table_marks_the_choice_and_the_text_names_each_cs_value():
    wiki = fake("wiki", [(0.02, 0.95, 0.3, 0.3), (0.005, 0.96, 0.5, 0.5)])
    moir = fake("moir", [(0.02, 0.95, 0.9, 0.9), (0.005, 0.80, 0.9, 0.9)])
    table = grid_table([wiki, moir])
    assert list(table.columns) == ["C", "τ", "ES", "S_e", "S_p", "Total", f"ES ≥ {ES_GATE:.2f}", "chosen"]
    chosen = table.loc[table["chosen"] == "✓", ["C", "τ"]].values.tolist()
    assert chosen == [["C_Wiki", 0.005], ["C_Moir", 0.02]]
    text = selection_text([wiki, moir])
    assert "C_Wiki: τ = 0.005" in text and "C_Moir: τ = 0.02" in text
    assert "C_Moir and C_Wiki get different τ (0.02 and 0.005)" in text
    same = selection_text([fake("wiki", [(0.02, 0.95, 0.3, 0.3)]), fake("moir", [(0.02, 0.92, 0.3, 0.3)])])
    assert "get the same τ" in same
    failed = selection_text([fake("moir", [(0.02, 0.5, 0.3, 0.3)])])
    assert "Under C_Moir no τ of the grid clears the edit gate" in failed
    pinned = Selection("alphaedit", "wiki", 100, 0, (0.02,), "total", "S_e", 0.02, None, True, pd.DataFrame())
    assert selection_text([pinned]) == "**AlphaEdit's τ** is pinned, not selected: C_Wiki: τ = 0.02 (pinned)."
    assert grid_table([pinned])["chosen"].tolist() == ["✓"]
    with pytest.raises(ValueError, match="one editor"):
        grid_table([wiki, fake("wiki", [(3.0, 0.95, 0.3, 0.3)], editor="memit")])


def test_the_per_model_check_reruns_the_claims_only_where_a_c_changes_its_value():
    """Per C is the main choice; one value for every C is the sensitivity check: the claims' runs again
    at that value, both C's, where any run changes; none when every C got that value on its own."""
    wiki = fake("wiki", [(0.02, 0.95, 0.3, 0.3), (0.005, 0.96, 0.5, 0.5), (0.001, 0.99, 0.2, 0.2)])
    moir = fake("moir", [(0.02, 0.95, 0.9, 0.9), (0.005, 0.85, 0.9, 0.9), (0.001, 0.97, 0.1, 0.1)])
    selections = {"alphaedit": [wiki, moir]}
    assert per_model_values(selections) == {"alphaedit": 0.02}
    taus = chosen([wiki, moir])
    specs = [ExperimentSpec("alphaedit", r, c, 10, edit_sample=s, tau=taus[c]) for r in ("batch",)
             for c in ("moir", "wiki") for s in (0, 1)]
    memit = [ExperimentSpec("memit", "batch", c, 10, lambda_=3.0) for c in ("moir", "wiki")]
    plan = editing.ClaimPlan((("alphaedit", "batch", 10), ("memit", "batch", 10)), 1, (*specs, *memit), ())
    again = editing.per_model_plan(plan, per_model_values(selections))
    assert again is not None and again.points == (("alphaedit", "batch", 10),) and not again.null_specs
    assert {s.tau for s in again.draw_specs} == {0.02} and len(again.draw_specs) == 4
    assert {(s.cov, s.edit_sample) for s in again.draw_specs} == {(s.cov, s.edit_sample) for s in specs}
    text = sensitivity_text(selections, changed=True)
    assert "one τ = 0.02 for every C, against C_Wiki (0.005) on its own" in text and "measured again" in text
    same = {"alphaedit": [fake("wiki", [(0.02, 0.95, 0.3, 0.3)]), fake("moir", [(0.02, 0.95, 0.9, 0.9)])]}
    pinned_plan = editing.ClaimPlan((("alphaedit", "batch", 10),), 1,
                                    tuple(dataclasses.replace(s, tau=0.02) for s in specs), ())
    assert editing.per_model_plan(pinned_plan, per_model_values(same)) is None
    assert editing.per_model_claims([], pinned_plan, []) == []  # nothing runs
    assert "what every C got on its own" in sensitivity_text(same, changed=False)
    assert "no per-model check" in sensitivity_text({"memit": [fake("wiki", [(3.0, 0.95, 0.3, 0.3)],
                                                                       editor="memit")]}, changed=False)


# ----------------------------------------------------------------------------- the grids


def test_profiles_carry_the_papers_grids_and_the_pocket_ones_span_the_same_range():
    paper = (500.0, 1500.0, 5000.0, 15000.0, 30000.0)
    for name in ("qwen3-8b", "olmo2-7b-instruct", "llama3.1-8b-instruct"):
        p = load_profile(name)
        assert p.memit.lambda_grid == paper and p.memit.lambda_ in p.memit.lambda_grid
        assert p.alphaedit.tau_grid == (0.02, 0.005, 0.001, 0.0005)
        assert p.editing.validation_records > 0 and p.editing.validation_items > 0
    pocket = load_profile("pocket")
    grid = pocket.memit.lambda_grid
    assert [round(v / pocket.memit.lambda_, 6) for v in grid] == [round(v / 15000.0, 6) for v in paper]
    assert [round(v / 10, 6) for v in pocket.alphaedit.tau_grid] == [0.02, 0.005, 0.001, 0.0005]
    assert pocket.alphaedit.tau in pocket.alphaedit.tau_grid
    # the pocket CounterFact keeps enough records to edit the largest N of every regime
    e = pocket.editing
    assert e.validation_records == 100 and e.validation_items == 25


# ----------------------------------------------------------------------------- on the micro model


@pytest.fixture(scope="module")
def selected(tmp_path_factory):
    """A MEMIT selection over two λ on the micro model, and the lab it ran on."""
    out = tmp_path_factory.mktemp("select")
    lab = micro_lab(out)
    return lab, select(lab, "memit", "wiki", 4, grid=(1500.0, 15000.0), rule=SelectionRule(n_eval=3)), out


def test_selection_scores_each_value_on_the_validation_split(selected):
    lab, sel, out = selected
    assert list(sel.table["value"]) == [1500.0, 15000.0] and sel.table["chosen"].sum() == 1
    assert sel.table[["ES", "S_e", "S_p"]].notna().all().all()
    passing = sel.table[sel.table["ES"] >= ES_GATE]
    expected = passing.loc[passing["Total"].idxmax(), "value"] if len(passing) else \
        sel.table.loc[sel.table["ES"].idxmax(), "value"]
    assert sel.value == expected and sel.gated == bool(len(passing))
    assert (out / "selection" / "results.parquet").is_file()
    assert list((out / "selection").glob("memit-wiki-N4-*.json"))
    assert sel.spec("batch", 2).lambda_ == sel.value


def test_each_organism_runs_a_chapters_claims_at_its_own_choice(selected, tmp_path):
    """The selection made again on organism 1's own validation split, and the chapter's claim runs pooled
    over both organisms, each at its own λ."""
    from moir_lib.experiments.labs import pooled_frames

    lab, sel, _ = selected
    one = micro_lab(tmp_path / "one", organism=1)
    own = organism_strengths([lab, one], {"memit": [sel]})
    mine, theirs = own[0]["memit"][0], own[1]["memit"][0]
    assert mine.table.equals(sel.table) and theirs.organism == 1 and theirs.grid == sel.grid
    assert not theirs.table["value"].isna().any() and theirs.n_eval == sel.n_eval == 3
    rows, _ = pooled_frames([lab, one], [ExperimentSpec("memit", "batch", "wiki", 2, lambda_=sel.value)], own)
    by = rows.groupby("organism")["lambda"].agg(set).to_dict()
    assert by == {0: {sel.value}, 1: {theirs.value}}


def test_selection_uses_no_record_or_item_a_chapter_scores(selected):
    lab, sel, out = selected
    chapter = lab.compute(ExperimentSpec("memit", "batch", "wiki", 4), groups=("edit", "preservation"))
    _, chapter_items = lab.frames([ExperimentSpec("memit", "batch", "wiki", 4)])
    val_items = PointStore(out / "selection", shared=False).items
    edited = set(val_items.loc[val_items["group"] == "edit", "item"])
    validation = {str(r.case_id) for r in lab.edit_records.validation()}
    assert edited and edited <= validation
    pool = {str(r.case_id) for s in EDIT_SAMPLES for r in lab.edit_records.pool(s)}
    assert not edited & pool and not edited & set(chapter_items.loc[chapter_items["group"] == "edit", "item"])
    pres = set(val_items.loc[val_items["group"] == "preservation", "item"])
    chapter_pres = set(chapter_items.loc[chapter_items["group"] == "preservation", "item"])
    assert pres and chapter_pres and not pres & chapter_pres
    assert {int(i.rsplit("/", 1)[1]) for i in pres} == {3, 4}  # the 2 items after the chapters' 3
    assert {int(i.rsplit("/", 1)[1]) for i in chapter_pres} == {0, 1, 2}
    assert len(chapter)


def test_a_stored_selection_is_read_back_without_the_model(selected):
    lab, sel, out = selected
    again = micro_lab(out)
    read = select(again, "memit", "wiki", 4, grid=(1500.0, 15000.0), rule=SelectionRule(n_eval=3))
    assert read.value == sel.value
    assert not again.is_loaded()


def test_unusable_values_are_noted_not_fatal(selected):
    """A τ above every eigenvalue of C (a projector that protects nothing) is refused by AlphaEdit: noted,
    and the choice made among the others."""
    lab, _, _ = selected
    sel = select(lab, "alphaedit", "wiki", 2, grid=(1e9, 0.02), rule=SelectionRule(n_eval=2))
    unusable = sel.table.iloc[0]
    assert "above every eigenvalue" in unusable["note"] and math.isnan(unusable["ES"])
    assert sel.value == 0.02 and "note" in grid_table([sel]).columns


def test_a_grid_point_whose_tau_empties_the_null_space_edits_nothing(selected, caplog):
    """A τ below every eigenvalue of C: a plain editor refuses it (``moir edit``), a point of the grid
    (:meth:`Lab.edit`, under :meth:`Lab.run`) edits with ``P = 0`` as AlphaEdit's code does, says so, and
    scores the unchanged model."""
    lab, _, _ = selected
    spectrum = lab.editor(ExperimentSpec("alphaedit", "batch", "wiki", 2)).projector_info.values()
    lowest = min(info["eig_min"] for info in spectrum)
    assert lowest > 0
    spec = ExperimentSpec("alphaedit", "batch", "wiki", 2, tau=lowest / 2)
    with pytest.raises(ValueError, match="empty null space"):
        lab.editor(spec)
    with caplog.at_level(logging.WARNING, logger="moir_lib.editing.alphaedit"):
        experiment = lab.edit(spec, ScorePlan(score_unedited=True))
    assert "leaves C no null space" in caplog.text
    assert all(not P.any() for P in lab.editor(spec, allow_empty=True).P.values())
    pre, post = experiment.pre.per_record, experiment.points[-1].counterfact.per_record
    assert experiment.points[-1].n_edits == 2 and list(post["case_id"]) == list(pre["case_id"])
    for metric in ("ES", "PS", "Efficacy", "Generalization"):
        assert post[metric].equals(pre[metric]), metric


def test_moir_edit_tau_auto_selects_then_edits(tmp_path, capsys):
    data = micro_profile(**{"memit.lambda_grid": [1500.0, 15000.0]}).to_dict()
    profile = tmp_path / "micro-held.yaml"
    profile.write_text(yaml.safe_dump(data))
    base = ["edit", "--profile", str(profile), "--cov", "wiki", "--regime", "batch", "--n-edits", "3",
            "--n-eval", "2", "--pres-limit", "3", "--max-gen-tokens", "4", "--context-templates", "1"]
    assert main([*base, "--editor", "memit", "--tau", "auto", "--out", str(tmp_path / "no")]) == 2
    assert "--tau auto selects alphaedit's value" in capsys.readouterr().err
    assert main([*base, "--editor", "memit", "--lambda", "auto", "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    chosen = summary["parameters"]["selection"]
    assert chosen["param"] == "lambda" and chosen["value"] in (1500.0, 15000.0) and chosen["n_edits"] == 3
    assert summary["parameters"]["editor"]["lambda"] == chosen["value"]  # the run used the selected λ
