"""The sample budget of C (moir_lib.covariance.budget, moir_lib.experiments.budget_curve) and the prefix C's
of the recipes (``moir[1/4]``): constructed cases with known answers, and the curve on the micro pocket
model."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from moir_lib.covariance import CovarianceStats, recipes
from moir_lib.covariance import budget as B
from moir_lib.covariance.convergence import protected_rank, subspace_gap
from moir_lib.experiments import CovSettings, EditSettings, EvalSettings, ExperimentSpec, Lab, PointStore
from moir_lib.experiments import budget_curve as XB
from moir_lib.profiles import load_profile

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _private_results(monkeypatch):
    monkeypatch.setenv("MOIR_SHARED_RESULTS", "0")


def _stats(C: torch.Tensor, n: int = 100) -> CovarianceStats:
    return CovarianceStats.from_sums({0: C * n}, n, {"model": "m"})


# ----------------------------------------------------------------------------- constructed


def test_delta_change_and_subspace_gap_on_known_cases():
    a = {1: torch.ones(3, 4), 2: torch.zeros(3, 4)}
    b = {1: torch.ones(3, 4) * 1.1, 2: torch.zeros(3, 4)}
    assert B.delta_change(a, a) == 0.0
    assert B.delta_change(b, a) == pytest.approx(0.1)
    assert math.isnan(B.delta_change(a, {1: torch.zeros(3, 4), 2: torch.zeros(3, 4)}))
    with pytest.raises(ValueError, match="same layers"):
        B.delta_change({1: a[1]}, a)
    # C = diag(4, 3, 1e-3, 1e-3): AlphaEdit at τ = 0.01 protects the first two directions
    C = torch.diag(torch.tensor([4.0, 3.0, 1e-3, 1e-3], dtype=torch.float64))
    assert protected_rank(C, 0.01) == (2, 2)
    # rotate the top plane by θ in the (e2, e3) plane: one principal angle θ, the gap sin²θ / 2
    theta = 0.3
    R = torch.eye(4, dtype=torch.float64)
    R[1, 1], R[1, 2], R[2, 1], R[2, 2] = math.cos(theta), -math.sin(theta), math.sin(theta), math.cos(theta)
    gap, angle = subspace_gap(R @ C @ R.T, C, 2)
    assert gap == pytest.approx(math.sin(theta) ** 2 / 2) and angle == pytest.approx(math.degrees(theta))
    rows = B.compare(_stats(R @ C @ R.T, 10), _stats(C), documents=3, tau=0.01)
    got = rows.set_index("metric")["value"]
    assert got["gap"] == pytest.approx(gap) and got["null_dim"] == 2 and got["null_dim_full"] == 2
    assert set(rows["keys_per_dim"]) == {10 / 4} and set(rows["documents"]) == {3}


def test_needed_reads_the_smallest_settled_size():
    curve = pd.DataFrame({"keys_per_dim": [1, 2, 4, 8], "hi": [0.5, 0.08, 0.12, 0.05]})
    assert B.needed(curve, 0.1) == 8  # 2 dips under, 4 rises again: settled only from 8
    assert B.needed(curve, 0.2) == 2
    assert B.needed(curve, 0.01) is None


# ----------------------------------------------------------------------------- recipes


def test_prefix_names_and_identities():
    profile = load_profile("pocket-micro")
    assert recipes.split_prefix("moir[2/8]") == ("moir", "1/4")
    assert recipes.split_prefix("wiki") == ("wiki", None)
    assert recipes.prefix_name("moir@1", 0.25) == "moir[1/4]@1"
    assert recipes.parse_name("moir[1/4]@1") == ("moir[1/4]", 1)
    plain, tapped = CovSettings(), CovSettings(prefixes=("1/4", 0.5))
    assert tapped.prefixes == ("1/4", "1/2")
    for name in ("wiki", "moir", "wiki@1", "oracle"):  # the whole C's do not depend on the prefixes taken
        assert recipes.identity(name, profile, plain) == recipes.identity(name, profile, tapped)
    pre = recipes.identity("moir[1/4]@1", profile, plain)
    assert pre == {**recipes.identity("moir@1", profile, plain), "prefix": "1/4"}
    assert recipes.identity("moir[1/2]", profile, plain) != recipes.identity("moir[1/4]", profile, plain)
    with pytest.raises(ValueError, match="prefixes are taken of wiki and moir"):
        recipes.identity("oracle[1/4]", profile, plain)
    stop = CovSettings(until_converged=0.05)
    assert recipes.identity("moir", profile, stop)["stop"]["target"] == 0.05
    assert recipes.identity("wiki", profile, stop) == recipes.identity("wiki", profile, plain)
    with pytest.raises(ValueError, match="until_converged"):
        CovSettings(until_converged=0)


TINY = EvalSettings(n_eval=3, pres_limit=3, nll_docs=0, max_gen_tokens=4, fluency_prompts=1)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab("pocket-micro", PointStore(tmp_path_factory.mktemp("lab"), shared=False), evaluation=TINY,
              editing=EditSettings(context_templates=1), cov_settings=CovSettings(prefixes=("1/4", "1/2")))
    lab.model()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOIR_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield lab


def test_the_lab_builds_prefix_cs_from_the_pass_of_the_whole(lab):
    from moir_lib.covariance import EstimationSettings, estimate
    from moir_lib.documents import load_corpus

    whole = lab.covariance("wiki")
    pre = lab.covariance("wiki[1/4]")
    info = lab.resources.cov_info("wiki[1/4]")
    assert info["n_documents"] == 8 and info["of"] == "wiki"
    p = lab.profile
    cs = lab.cov_settings
    first = list(load_corpus(p.covariance.wiki_corpus, n=cs.n_documents, seed=cs.seed))[:8]
    settings = EstimationSettings(tokens_per_batch=p.covariance.tokens_per_batch,
                                  count_bos=cs.count_bos)
    alone = estimate(lab.model(), first, list(p.edit_layers), settings, cache=False, progress=False)
    for layer in p.edit_layers:
        assert pre.count(layer) == alone.count(layer) < whole.count(layer)
        assert float((pre.sum(layer) - alone.sum(layer)).norm() / alone.sum(layer).norm()) < 1e-6
    moir, half = lab.covariance("moir"), lab.covariance("moir[1/2]")
    assert half.count(0) < moir.count(0) and lab.resources.cov_info("moir[1/2]")["n_samples"] == 16


def test_the_budget_curve_on_the_micro_model(lab):
    before = {k: lab.model().adapter.weight_of(k).detach().clone() for k in lab.profile.edit_layers}
    rows = XB.curve([lab], ["wiki", "moir"], ["1/4", "1/2"], n_edits=3, draws=2)
    assert set(rows["metric"]) == {"memit_dW", "alphaedit_dW", "gap", "max_angle_deg", "null_dim",
                                   "null_dim_full"}
    assert all(torch.equal(before[k], lab.model().adapter.weight_of(k)) for k in before), "weights restored"
    assert rows[["organism", "draw"]].drop_duplicates().shape[0] == 2
    dw = rows[rows["metric"].str.endswith("_dW")]
    assert np.isfinite(dw["value"]).all() and (dw["value"] > 0).all()
    for _, g in rows.groupby(["cov", "draw"]):
        assert g.loc[g["fraction"] == "1/4", "keys_per_dim"].max() < g.loc[g["fraction"] == "1/2",
                                                                           "keys_per_dim"].min()
    # the whole C against itself changes nothing: the reference point of the curve
    spec = ExperimentSpec("memit", "batch", "moir", 3)
    assert B.delta_change(XB.deltas(lab, spec), XB.deltas(lab, spec)) == 0.0
    table = XB.intervals(rows)
    assert set(table["cells"]) == {2} and len(table) == 2 * 2 * 6
    ok = table.dropna(subset=["lo"])
    assert len(ok) and (ok["lo"] <= ok["value"] + 1e-12).all() and (ok["value"] <= ok["hi"] + 1e-12).all()
    # the interval of two draws is at least the t-interval on them (1 df)
    g = XB._cells(rows)
    one = g[(g["cov"] == "moir") & (g["fraction"] == "1/4") & (g["metric"] == "memit_dW")]["value"].to_numpy()
    t = table.set_index(["cov", "fraction", "metric"]).loc[("moir", "1/4", "memit_dW")]
    assert t["hi"] - t["value"] >= 12.7 * one.std(ddof=1) / math.sqrt(2) * 0.999  # lo is cut at 0
    assert (table["lo"].dropna() >= 0).all() and (table.loc[table["metric"] == "gap", "hi"] <= 1).all()


# ----------------------------------------------------------------------------- the book's words


def test_the_benchmark_log_gives_the_pipeline_it_projects(tmp_path):
    from moir_lib import benchlog

    p = benchlog.pipeline()
    assert (p.machine, p.d, p.tokens_per_sample, p.paper_samples) == ("H100", 14_336, 256, 100_000)
    projected = p.sources[3]
    gen, c, total = benchlog.numbers(projected.measured)[:3]  # "23 min generation + 15 min C = 38 min"
    paper = p.paper()
    # the log's own projection, from the same rows (it rounds to whole minutes)
    got = [paper[k] for k in ("generation_min", "c_min", "total_min")]
    assert got == pytest.approx([gen, c, total], abs=1)
    assert p.at(10)["tokens"] == 143_360 and p.at(10, generate=False)["generation_min"] == 0
    # a newer row on the same machine is the one read; a missing one is named
    log = tmp_path / "README.md"
    text = benchlog.LOG.read_text(encoding="utf-8")
    newer = ("| `python benchmarks/gpu.py --device cuda --batch 1024`: rand×1 self-generation, Llama-3.1-8B "
             "shapes (random weights, bf16), 256 tokens | H100 | 2030-01-01 | 36 600 tokens/s |\n")
    row = "| projected per-model pipeline"
    log.write_text(text.replace(row, newer + row, 1))
    assert benchlog.pipeline(log).generation_tps == 36_600
    with pytest.raises(ValueError, match="no row on A100"):
        benchlog.pipeline(log, machine="A100")


def _curve(values: dict[tuple[str, str], list[tuple[float, float]]]) -> pd.DataFrame:
    """Intervals rows: (C, measure) -> [(keys per dim, upper bound)] (value = lo = upper / 2)."""
    rows = []
    for (cov, metric), points in values.items():
        for i, (size, hi) in enumerate(points):
            rows.append({"cov": cov, "fraction": f"1/{2 ** (len(points) - i)}", "metric": metric, "cells": 6,
                         "keys_per_dim": size, "documents": size * 10, "value": hi / 2, "lo": hi / 4,
                         "hi": hi})
    return pd.DataFrame(rows)


def test_budget_words_are_the_curve_s():
    from moir_lib import benchlog
    from moir_lib.chapters import diagnosis

    curve = _curve({("moir", "memit_dW"): [(10, 0.3), (20, 0.08), (40, 0.05)],
                    ("moir", "alphaedit_dW"): [(10, 0.3), (20, 0.2), (40, 0.09)],
                    ("wiki", "memit_dW"): [(15, 0.2), (30, 0.15), (60, 0.12)],
                    ("wiki", "alphaedit_dW"): [(15, 0.05), (30, 0.04), (60, 0.03)]})
    needs = diagnosis.budget_needs(curve, 0.1)
    assert needs == {"memit": {"wiki": None, "moir": 20.0}, "alphaedit": {"wiki": 15.0, "moir": 40.0}}
    pipe = benchlog.pipeline()
    text = diagnosis.budget_text(curve, 0.1, pipe, d=768)
    assert "MEMIT more than 60 with Wiki and 20 with Moir; AlphaEdit 15 with Wiki and 40 with Moir" in text
    at = pipe.at(40)
    assert f"would take {at['total_min']:.1f} min" in text and f"{at['samples']:,.0f} samples" in text
    assert f"instead of {pipe.paper()['total_min']:.0f} min" in text and "over 6 draws" in text
    head = diagnosis.budget_headline(curve, 0.1, pipe)["budget"]
    assert head["pipeline"]["at_budget"] == at and head["needs"] == needs
    # an editor that never settles with C_Moir: no shorter pipeline is claimed
    late = curve.assign(hi=np.where(curve["metric"] == "alphaedit_dW", 0.5, curve["hi"]))
    assert "no shorter pipeline is projected" in diagnosis.budget_text(late, 0.1, pipe, d=768)
    table = diagnosis.budget_table(curve)
    assert list(table["keys/dim"]) == sorted(table["keys/dim"][:3]) + sorted(table["keys/dim"][3:])
    assert table.loc[0, "MEMIT ΔW change"] == "0.150 [0.075, 0.300]"


def test_a_lab_s_c_moir_stops_where_its_rule_stops_the_generation(tmp_path, monkeypatch):
    """CovSettings.until_converged (chapter 01's moir_until_converged): C_Moir is the keys of the samples the
    stop rule kept, in a self-generation cache entry of its own, and its provenance says where it stopped."""
    profile = load_profile("pocket-micro").with_overrides({"generation.n_samples": 64})
    lab = Lab(profile, PointStore(tmp_path / "lab", shared=False), evaluation=TINY,
              cov_settings=CovSettings(until_converged=1.0))
    plain = Lab(profile, PointStore(tmp_path / "plain", shared=False), evaluation=TINY)
    lab.model(), plain.model()  # the micro model from the usual cache; the C's in a fresh one
    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    stats = lab.covariance("moir")
    info = lab.resources.cov_info("moir")
    assert info["n_samples"] == 32 and info["stopped"]["converged"] and info["stopped"]["budget"] == 64
    full = plain.covariance("moir")
    whole = plain.resources.cov_info("moir")
    assert whole["n_samples"] == 64 and "stopped" not in whole
    assert stats.count(0) < full.count(0) and info["gen_dir"] != whole["gen_dir"]
    moir = ExperimentSpec("memit", "batch", "moir", 2)
    assert lab.key(moir) != plain.key(moir)


def test_no_fractions_no_budget_section():
    from moir_lib import benchlog
    from moir_lib.chapters import diagnosis

    assert diagnosis.budget_covs(["wiki", "oracle", "moir"], []) == []
    assert diagnosis.budget_covs(["wiki", "oracle", "moir"], ["1/2"]) == ["wiki", "moir"]
    assert diagnosis.budget_specs(["wiki"], [], 10, 0, {}, {}) == []
    empty = XB.intervals(pd.DataFrame(columns=list(XB.CURVE_COLUMNS)))
    assert empty.empty and diagnosis.budget_table(empty).empty
    assert diagnosis.budget_text(empty, 0.1, benchlog.pipeline(), d=8).startswith("No budget curve")
    assert diagnosis.budget_headline(empty, 0.1, benchlog.pipeline())["budget"]["needs"] == {}
