"""The chapters' claims on the engine (:mod:`moir_lib.chapters.verdicts`), through the chapters' own claim
functions: arms pooled over edit samples, C draws and organisms, each chapter's hierarchy (the primary at α,
the secondaries gatekept, Holm among them), relative non-inferiority for edit quality, rate claims with
their sign-flip test, the gate, the degenerate composite, the null control judged alone, and one row per
measurement in the book's claims table. Model-free: the item frames are built here in the layout of
:meth:`moir_lib.experiments.lab.Lab.frames`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moir_lib import book
from moir_lib.chapters import diagnosis, editing, lab_tables, verdicts
from moir_lib.evaluation.families import holm
from moir_lib.evaluation.inference import ClaimTest, Variance
from moir_lib.evaluation.intervals import NOT_MEASURED, REPRODUCED, REVERSED, UNRESOLVED, Estimate
from moir_lib.experiments import ExperimentSpec, cov_draws, with_draws
from moir_lib.experiments.labs import organism_dir

N = 100
TASKS = ("facts", "code", "arith")
#: per C: preservation accuracy per task, and the edits' Efficacy
PAPERLIKE = {"wiki": ({"facts": 0.8, "code": 0.2, "arith": 0.1}, 0.95),
             "oracle": ({"facts": 0.8, "code": 0.45, "arith": 0.4}, 0.95),
             "moir": ({"facts": 0.8, "code": 0.4, "arith": 0.45}, 0.94)}


def _point(cov: str, seed: int, organism: int, acc: dict[str, float], eff: float, rng: np.random.Generator,
           n_items: int, n_records: int, portability: float | None = None) -> tuple[list[dict], list[dict]]:
    """One scored point's tidy rows and items: preservation items shared by every point and edited records
    drawn per edit sample, each with a difficulty fixed by its id, against a threshold jittered per cell."""
    key = f"{organism}/{cov}/{seed}"
    point = {"profile": "pocket", "model": "pocket", "editor": "memit", "regime": "batch", "cov": cov,
             "n_edits": N, "edit_sample": seed, "lambda": np.nan, "tau": np.nan, "key": key}
    items, rows = [], []
    for k, (t, p) in enumerate(acc.items()):
        difficulty = np.random.default_rng(100 + k).uniform(0, 1, n_items)
        correct = (difficulty < p + rng.normal(0, 0.03)).astype(float)
        items += [{**point, "group": "preservation", "unit": t, "item": f"{t}/{i}", "metric": "correct",
                   "value": v} for i, v in enumerate(correct)]
        rows.append({**point, "group": "preservation", "metric": t, "value": correct.mean()})
    took = np.random.default_rng(seed).uniform(0, 1, n_records) < eff + rng.normal(0, 0.01)
    for r in range(n_records):
        item = f"s{seed}/r{r}"
        extra = () if portability is None else (("Portability", portability),)
        for m, v in (("Efficacy", float(took[r])), ("Generalization", 0.5 + 0.3 * eff), ("Specificity", 0.6),
                     ("fluency_base", -2.0), ("fluency", -2.1), *extra):
            items.append({**point, "group": "edit", "unit": "record", "item": item, "metric": m, "value": v})
    rows.append({**point, "group": "edit", "metric": "ES", "value": 0.95})
    return rows, items


def frames(settings: dict[str, tuple[dict[str, float], float]] = PAPERLIKE, *, seeds=(0, 1, 2), draws=2,
           organisms=(0,), n_items: int = 80, n_records: int = 60, seed: int = 0,
           portability: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows and items of MEMIT batch at ``N`` for every C of ``settings`` at ``draws`` draws (an int, or per
    C), crossed with ``seeds`` and ``organisms``, labelled like :meth:`Lab.frames` (ES 0.95 everywhere)."""
    rng = np.random.default_rng(seed)
    rows, items = [], []
    for o in organisms:
        for s in seeds:
            for cov, (acc, eff) in settings.items():
                for d in range(draws[cov] if isinstance(draws, dict) else draws):
                    r, i = _point(f"{cov}@{d}" if d else cov, s, o, acc, eff, rng, n_items, n_records,
                                  portability)
                    rows += [{**x, "organism": o, "sample": s, "draw": d, "cov_base": cov} for x in r]
                    items += [{**x, "organism": o, "sample": s, "draw": d, "cov_base": cov} for x in i]
    return pd.DataFrame(rows), pd.DataFrame(items)


def _null_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """C_Wiki at draws 0-1, C_Moir at draws 0-3 (the null control's two sets)."""
    return frames({"wiki": PAPERLIKE["wiki"], "moir": PAPERLIKE["moir"]}, draws={"wiki": 2, "moir": 4})


# ----------------------------------------------------------------------------- arms and claims


def test_an_arm_pools_samples_draws_and_organisms():
    rows, items = frames(organisms=(0, 1))
    moir = verdicts.Arm("memit", "batch", "moir", N)
    sel = moir.select(items)
    assert set(sel["cov"]) == {"moir", "moir@1"} and set(sel["draw"]) == {0, 1}
    assert set(sel["sample"]) == {0, 1, 2} and set(sel["organism"]) == {0, 1}
    second = verdicts.Arm("memit", "batch", "moir", N, draws=(1,))
    assert set(second.select(items)["draw"]) == {0}, "a set of draws is renumbered from 0"
    assert second.name == "Moir [draw 1]" and moir.setting == "MEMIT batch, N = 100"
    claim = verdicts.measure("C_Moir preserves more than C_Wiki", "x", items,
                             [(1.0, "S_p", moir, verdicts.Arm("memit", "batch", "wiki", N))])
    assert (claim.scope.samples, claim.scope.draws, claim.scope.organisms) == (3, 2, 2)
    assert claim.scope.items == 3 * 80
    assert claim.verdict == REPRODUCED and claim.test.scope == "recipe"
    assert len(claim.test.organisms) == 2 and claim.test.agreeing == 2
    record = json.loads(json.dumps(claim.record(), allow_nan=False))
    assert record["generalises"] == {"items": 240, "samples": 3, "draws": 2, "organisms": 2}
    assert record["agreeing"] == 2 and record["id"] == claim.id
    empty = verdicts.measure("c", "x", items, [(1.0, "S_p", moir, verdicts.Arm("memit", "batch", "pile", N))])
    assert empty.verdict == NOT_MEASURED and "not measured" in empty.sentence()


def test_an_organism_whose_edits_miss_the_gate_is_named():
    """The claim's gate reads each arm's ES pooled over the organisms; one organism's own edits that miss it
    are named in the sentence and the record."""
    rows, items = frames(organisms=(0, 1))
    es = items[items["metric"] == "Efficacy"].assign(metric="ES", value=1.0)
    moir, wiki = (verdicts.Arm("memit", "batch", c, N) for c in ("moir", "wiki"))
    assert verdicts.short_of_gate(pd.concat([items, es]), [moir, wiki]) == ()
    missed = (es["organism"] == 1) & (es["cov_base"] == "moir") & es["item"].str.fullmatch(r"s\d+/r\d")
    es.loc[missed, "value"] = 0.0  # 10 of 60 records per point
    items = pd.concat([items, es], ignore_index=True)
    assert verdicts.short_of_gate(items, [moir, wiki]) == (("Moir", 1, pytest.approx(50 / 60)),)
    claim = verdicts.measure("c", "x", items, [(1.0, "S_p", moir, wiki)])
    assert "edits miss the editability gate in organism 1 (Moir, ES 0.83)" in claim.sentence()
    assert claim.record()["short_edits"] == [{"arm": "Moir", "organism": 1, "ES": pytest.approx(50 / 60)}]


def test_the_chapter_hierarchy_decides_the_words():
    """The primary claim at α alone; the secondaries only once it resolves, Holm among them; the null
    control apart. Alone, each secondary would resolve."""
    def claim(p: float) -> verdicts.Claim:
        est = Estimate(0.1, 0.01, 0.19, 0.04, 100)
        return verdicts.Claim("c", f"m{p}", ClaimTest(est, p, 0.0, 1, True, "studentized", "model", (),
                                                      variance=Variance(0.04 ** 2)))

    family = verdicts.judge(claim(0.01), [claim(p) for p in (0.04, 0.03)], components={})
    assert [c.role for c in family] == ["primary", "secondary", "secondary"]
    gatekept = [0.01, *np.maximum(holm([0.04, 0.03]), 0.01)]
    assert [c.result.p_adjusted for c in family] == pytest.approx(gatekept)
    assert [c.verdict for c in family] == [REPRODUCED, UNRESOLVED, UNRESOLVED]
    assert [claim(p).verdict for p in (0.04, 0.03)] == [REPRODUCED, REPRODUCED], "alone, each is resolved"
    assert all(c.record()["family"] == 3 for c in family)
    gated = verdicts.judge(claim(0.2), [claim(0.001)], components={})
    assert gated[1].verdict == UNRESOLVED and not gated[1].result.tested and gated[1].result.p_adjusted == 0.2
    assert "not tested: the primary did not resolve" in gated[1].sentence()
    rows, items = frames()
    judged = diagnosis.claims(rows, items, N, edit_metric="S_e_noport")
    assert len(judged) == 2 * (2 + 1 + 1)  # oracle and Moir: S_p, code, arith, edit score
    assert judged[0].measured == "S_p Oracle − Wiki (MEMIT batch, N = 100)" and judged[0].role == "primary"
    assert {c.result.family for c in judged} == {len(judged)}
    secondary = [c.test.p_value for c in judged[1:]]
    assert [c.result.p_adjusted for c in judged[1:]] == pytest.approx(
        np.maximum(holm(secondary), judged[0].test.p_value))
    assert diagnosis.HIERARCHY.primary.startswith("C_Oracle preserves more than C_Wiki (S_p")


def test_rate_claims_take_the_sign_flip_test_in_the_chapters():
    """A task's accuracy is a rate of 0/1 items: the chapter's claim carries the item-level sign-flip test
    beside the interval, and its p-value is the largest of them."""
    rows, items = frames()
    code = next(c for c in diagnosis.claims(rows, items, N, edit_metric="S_e_noport")
                if c.measured.startswith("code Oracle"))
    assert code.kind == "task" and "sign-flip" in code.test.parts
    assert code.test.p_value == max(code.test.parts.values())


def test_vulnerable_tasks_are_fixed_before_the_data():
    assert lab_tables.vulnerable_tasks(["facts", "prose", "code", "arith", "arith_raw"]) == ["code", "arith"]
    assert lab_tables.vulnerable_tasks(["MMLU", "GSM8K", "HellaSwag", "HumanEval"]) == ["HumanEval", "GSM8K"]
    # facts lose most here; the claims still test code and arithmetic, and only them
    settings = {c: ({**acc, "facts": 0.1 if c == "wiki" else 0.8}, eff)
                for c, (acc, eff) in PAPERLIKE.items()}
    rows, items = frames(settings)
    judged = diagnosis.claims(rows, items, N, edit_metric="S_e_noport")
    tasks = {c.measured.split(" ")[0] for c in judged}
    assert tasks == {"code", "arith", "S_p", "S_e_noport"}


def test_edit_quality_is_relative_non_inferiority_and_a_failed_gate_blocks_both_words():
    close = {**PAPERLIKE, "moir": (PAPERLIKE["moir"][0], 0.9)}  # a small loss of Efficacy
    rows, items = frames(close, n_records=300)
    judged = diagnosis.claims(rows, items, N, covs=("moir",), edit_metric="S_e_noport")
    edit = next(c for c in judged if c.claim.startswith("C_Moir does not cost edit quality"))
    assert edit.measured == "S_e_noport Moir − 0.9 × Wiki (MEMIT batch, N = 100)" and edit.kind == "edit"
    assert edit.test.null == 0 and edit.test.direction == 1 and 0 < edit.reference < 1
    assert edit.estimate.value > 0, "a loss within 10 % of C_Wiki's edit score"
    assert edit.verdict == REPRODUCED, "a loss within the margin does not cost edit quality"
    far = {**PAPERLIKE, "moir": (PAPERLIKE["moir"][0], 0.35)}
    rows_far, items_far = frames(far, n_records=300)
    judged = diagnosis.claims(rows_far, items_far, N, covs=("moir",), edit_metric="S_e_noport")
    edit = next(c for c in judged if c.claim.startswith("C_Moir does not cost edit quality"))
    assert edit.verdict == REVERSED
    weak = rows.assign(value=np.where(rows["metric"] == "ES", 0.3, rows["value"]))
    blocked = diagnosis.claims(weak, items, N, covs=("moir",), edit_metric="S_e_noport")
    assert all(c.verdict == UNRESOLVED and not c.test.gate_ok for c in blocked)
    assert any(c.estimate.lo > 0 for c in blocked), "the interval is there, the word is withheld"


def test_a_degenerate_edit_score_reads_not_measured_in_the_chapter_and_the_table(root):
    """Portability 0 under both C's: S_e is 0 in both arms in every cell, so its non-inferiority claim is
    not measured (before: 0 [0, 0], p = 0, reproduced), though C_Moir loses Efficacy."""
    worse = {**PAPERLIKE, "moir": (PAPERLIKE["moir"][0], 0.5)}
    rows, items = frames(worse, portability=0.0)
    judged = diagnosis.claims(rows, items, N, covs=("moir",), edit_metric="S_e")
    edit = next(c for c in judged if c.claim.startswith("C_Moir does not cost edit quality"))
    assert not edit.test.measured and edit.verdict == NOT_MEASURED
    assert "not measured" in edit.sentence()
    record = edit.record()
    assert record["value"] is None and record["measured_ok"] is False
    text = book.claims_table([book.Executed("notebooks/01_diagnosis", root / "x.ipynb",
                                            {"headline": {"claims": [record]}})])
    assert "S_e Moir − 0.9 × Wiki (MEMIT batch, N = 100): **not measured**" in text


def test_null_control_is_judged_alone_and_apart():
    rows, items = _null_frames()
    specs = [ExperimentSpec("memit", "batch", c, N, edit_sample=s) for s in (0, 1, 2)
             for c in ("wiki", "moir")]
    plan = editing.claim_plan(specs, 2)
    assert plan.points == (("memit", "batch", N),)
    assert {s.cov for s in plan.draw_specs} == {"wiki", "wiki@1", "moir", "moir@1"}
    assert {s.cov for s in plan.null_specs} == {"moir@2", "moir@3"} and len(plan.null_specs) == 6
    judged = editing.claims(rows, items, plan, "S_e_noport")
    control = [c for c in judged if c.control]
    assert len(control) == 1 and control[0].claim == verdicts.NULL_CLAIM
    assert control[0].measured == "S_p Moir [draws 2-3] − Moir [draws 0-1] (MEMIT batch, N = 100)"
    assert control[0].role == "control" and control[0].result.family == 1
    assert control[0].result.p_adjusted == control[0].test.p_value, "judged alone at α"
    claims_only = [c for c in judged if not c.control]
    assert {c.result.family for c in claims_only} == {2} and claims_only[0].role == "primary"
    assert control[0].scope.draws == 2
    assert control[0].verdict == UNRESOLVED and "must read not resolved" in control[0].sentence()
    text = editing.findings(rows[rows["draw"] == 0], pd.DataFrame(), judged=judged)
    assert "**Null control.**" in text and "must read not resolved" in text and "judged alone" in text


def test_the_n_of_a_claim_is_fixed_in_advance():
    """The batch claims at the editability gate's N (100) whatever the data say; the sequential ones at the
    last milestone."""
    specs = [ExperimentSpec("memit", "batch", c, n, edit_sample=0) for c in ("wiki", "moir")
             for n in (30, 100, 300)]
    specs += [ExperimentSpec("alphaedit", "sequential", c, 60, (10, 30, 60)) for c in ("wiki", "moir")]
    specs += [ExperimentSpec("alphaedit", "batch", c, n) for c in ("wiki", "moir") for n in (30, 60)]
    plan = editing.claim_plan(specs, 1)
    assert set(plan.points) == {("memit", "batch", 100), ("alphaedit", "sequential", 60),
                                ("alphaedit", "batch", 60)}
    assert editing.claim_n("batch", [10, 100]) == 100 and editing.claim_n("sequential", [10, 30]) == 30


def test_claims_table_shows_one_measurement_once_with_its_chapters(root):
    rows, items = _null_frames()
    ch01 = diagnosis.claims(rows, items, N, edit_metric="S_e_noport")
    assert len(ch01) == 4, "the oracle did not run: its claims are left out, C_Moir's S_p is the primary"
    assert ch01[0].measured == "S_p Moir − Wiki (MEMIT batch, N = 100)" and ch01[0].role == "primary"
    plan = editing.claim_plan([ExperimentSpec("memit", "batch", c, N, edit_sample=s) for s in (0, 1, 2)
                               for c in ("wiki", "moir")], 2)
    ch05 = editing.claims(rows, items, plan, "S_e_noport")
    shared = {c.id for c in ch01} & {c.id for c in ch05}
    assert len(shared) == 2, "S_p and the edit score of C_Moir − C_Wiki are one measurement each"
    executed = [book.Executed(f"notebooks/{chapter}", root / "x.ipynb",
                              {"headline": {"claims": verdicts.claims_json(judged, chapter)}}, title)
                for chapter, judged, title in (("01_diagnosis", ch01, "Which C?"),
                                               ("05_editing", ch05, "Moir?"))]
    text = book.claims_table(executed)
    main, _, controls = text.partition("**Null controls**")
    lines = [line for line in main.splitlines() if line.startswith("| ") and "claim of the paper" not in line]
    assert len(lines) == len(ch01) + len(ch05) - 1 - 2, "the null control is shown apart"
    sp = [line for line in lines if "S_p Moir − Wiki (MEMIT batch, N = 100)" in line]
    assert len(sp) == 1 and "</notebooks/01_diagnosis>" in sp[0] and "</notebooks/05_editing>" in sp[0]
    assert "240 items · 3 edit samples · 2 C draws · 1 organism (about this model)" in sp[0]
    assert "(studentized ∪ t on the cells)" in sp[0] and "primary, adj. p" in sp[0]
    assert "marginal 95 % interval" in text and "adjusted p" in text
    control = [line for line in controls.splitlines() if "Null control" in line]
    assert len(control) == 1 and "must read" in control[0] and "alone, adj. p" in control[0]
    assert "{doc}`/book/methods`" in text
    # the same measurement judged differently by two chapters shows each chapter's word
    other = [{**r, "verdict": REPRODUCED if r["verdict"] != REPRODUCED else UNRESOLVED}
             for r in verdicts.claims_json(ch05, "05_editing")]
    split = book.claims_table([executed[0], book.Executed("notebooks/05_editing", root / "x.ipynb",
                                                          {"headline": {"claims": other}})])
    row = next(line for line in split.splitlines() if "S_p Moir − Wiki (MEMIT batch" in line)
    assert "(01_diagnosis)" in row and "(05_editing)" in row
    assert "No chapter" in book.claims_table([])
    assert "_generated/claims.md" in (root / "book" / "intro.md").read_text()


def test_a_null_control_that_resolves_is_flagged_and_the_gate_is_shown(root):
    record = {"id": "x", "claim": verdicts.NULL_CLAIM, "measured": "S_p", "value": 0.1, "lo": 0.05,
              "hi": 0.15, "verdict": REPRODUCED, "control": True, "role": "control", "p_adjusted": 0.01}
    text = book.claims_table([book.Executed("notebooks/05_editing", root / "x.ipynb",
                                            {"headline": {"claims": [record]}})])
    assert "the null control must read" in text and "too narrow" in text
    blocked = {**record, "id": "y", "claim": "C_Moir preserves more than C_Wiki", "control": False,
               "verdict": UNRESOLVED, "gate_ok": False, "generalises": None, "role": "primary",
               "p_adjusted": 0.2, "power": 0.31, "minimal_effect": 0.15, "kind": "S_p"}
    unresolved = {**blocked, "id": "z", "gate_ok": True, "n_to_resolve": 900, "role": "secondary",
                  "tested": False}
    text = book.claims_table([book.Executed("notebooks/05_editing", root / "x.ipynb",
                                            {"headline": {"claims": [blocked, unresolved]}})])
    assert f"| primary, adj. p 0.2: {UNRESOLVED} (edits miss the gate) | — | 0.31 (Δ = 0.15) | — |" in text
    assert (f"| secondary, not tested (primary unresolved), adj. p 0.2: {UNRESOLVED}; ≈900 items would "
            "resolve it |") in text
    jsd = {**record, "id": "j", "control": False, "verdict": REPRODUCED, "scope": "sample", "n": 400,
           "role": "primary"}
    text = book.claims_table([book.Executed("notebooks/03_nll_jsd", root / "x.ipynb",
                                            {"headline": {"claims": [jsd]}})])
    assert f"| primary, adj. p 0.01: {REPRODUCED} (about this sample) | — | — | n = 400 · 1 organism " in text


def test_the_primary_claim_carries_its_sensitivity_to_the_selection(root):
    """The primary claim at the neighbouring grid values rides on its record; the claims table says where
    the selection decides its sign."""
    rows, items = frames()
    judged = diagnosis.claims(rows, items, N, edit_metric="S_e_noport")
    flipped = Estimate(-0.05, -0.2, 0.1, 0.07, 240)
    same = Estimate(0.2, 0.05, 0.35, 0.07, 240)
    moved = verdicts.with_sensitivity(judged, [("one grid value below", verdicts.Claim("c", "m", ClaimTest(
        flipped, 0.5, 0.0, 1, True, "studentized", "model", ()))), ("one grid value above", verdicts.Claim(
            "c", "m", ClaimTest(same, 0.01, 0.0, 1, True, "studentized", "model", ())))])
    assert [m["which"] for m in moved[0].record()["sensitivity"]] == ["one grid value below",
                                                                      "one grid value above"]
    assert moved[1:] == judged[1:] and not judged[0].sensitivity
    text = book.claims_table([book.Executed("notebooks/01_diagnosis", root / "x.ipynb",
                                            {"headline": {"claims": verdicts.claims_json(moved, "01")}})])
    row = next(line for line in text.splitlines() if "S_p Oracle − Wiki" in line)
    assert "one grid value below: -0.050 [-0.200, +0.100]" in row and "the selection decides its sign" in row


def test_draws_organisms_and_the_claims_runs():
    specs = [ExperimentSpec("memit", "batch", c, N, edit_sample=s) for s in (0, 1)
             for c in ("wiki", "wiki-subset", "moir")]
    runs = diagnosis.claim_specs(specs, 2)
    assert sorted({s.cov for s in runs}) == ["moir", "moir@1", "wiki", "wiki@1"] and len(runs) == 8
    assert with_draws([ExperimentSpec("memit", "batch", "moir@1", N)], range(2, 4))[0].cov == "moir@2"
    assert organism_dir("runs/x", 0) == "runs/x"
    assert organism_dir("runs/x", 2) == str(Path("runs/x/organism-2"))
    abl = [ExperimentSpec("memit", "batch", f"moir-{s}", N) for s in ("rand1", "rand2", "bos")]
    assert {s.cov for s in editing.ablation_claim_specs(abl, 2)} == {"moir-rand1", "moir-rand1@1", "moir-bos",
                                                                     "moir-bos@1"}


def test_cov_draws_default_follows_the_organisms():
    """One draw of each C with several organisms, two with one (a claim about one model needs two cells);
    a given count is kept and a count under 1 fails."""
    assert cov_draws([0, 1, 2]) == 1 and cov_draws([0]) == 2 and cov_draws([0], 3) == 3
    with pytest.raises(ValueError, match="cov_draws must be >= 1"):
        cov_draws([0, 1], 0)


def test_tables_average_the_draws_of_a_c():
    rows, _ = frames(draws=2)
    rows = rows.assign(value=np.where(rows["draw"] == 1, rows["value"] + 0.1, rows["value"]))
    t1 = diagnosis.table1(rows, N, ("wiki", "oracle", "moir")).set_index("C")
    wiki = rows[(rows["cov_base"] == "wiki") & (rows["metric"] == "code")]["value"].mean()
    assert t1.loc["Wiki", "code"] == pytest.approx(wiki)
    assert [c for c in t1.columns if c.startswith("Δ")] == ["Δ code", "Δ arith"]
