"""Uncertainty and verdicts (:mod:`moir_lib.evaluation.uncertainty`): the intervals of single numbers
(Wilson, Student-t, the top-1 share, Jensen–Shannon), the entry points that take one point's items per
seed (smoke tests on planted differences) and the three verdict words; the items a Lab point keeps on the
micro model, with a difference planted on them. The claim tests themselves: ``test_inference.py``; their
measured coverage, false verdicts and power: ``test_calibration.py``."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moir_lib.evaluation import uncertainty as unc


def _edit_items(rng, n, eff, gen=0.6, spec=0.8, flu=-2.0, base=-2.0, ids=None, key="k"):
    """Long items of one point: ``n`` records with Bernoulli Efficacy/Generalization/Specificity."""
    ids = ids if ids is not None else [str(i) for i in range(n)]
    cols = {"Efficacy": rng.random(n) < eff, "Generalization": rng.random(n) < gen,
            "Specificity": rng.random(n) < spec, "fluency": np.full(n, flu) + rng.normal(0, 0.1, n),
            "fluency_base": np.full(n, base), "Portability": np.full(n, np.nan),
            "ES": rng.random(n) < eff}
    rows = [{"key": key, "n_edits": 10, "group": "edit", "unit": "record", "item": i, "metric": m,
             "value": float(v[j])} for m, v in cols.items() for j, i in enumerate(ids)]
    return pd.DataFrame(rows, columns=list(unc.ITEM_COLUMNS))


def _pres_items(rng, accs, sizes, key="k"):
    rows = [{"key": key, "n_edits": 10, "group": "preservation", "unit": task, "item": f"{task}/{i}",
             "metric": "correct", "value": float(rng.random() < p)}
            for (task, p), n in zip(accs.items(), sizes, strict=True) for i in range(n)]
    return pd.DataFrame(rows, columns=list(unc.ITEM_COLUMNS))


def test_rate_of_0_1_outcomes_is_a_wilson_interval():
    x = np.array([1.0] * 30 + [0.0] * 70)
    est = unc.rate(x)
    p, n, z = 0.3, 100, 1.959963984540054
    assert est.value == pytest.approx(p)
    assert est.stderr == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))
    assert est.n == n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (est.lo, est.hi) == pytest.approx((centre - half, centre + half))
    assert est.hi - p > p - est.lo  # pulled towards 1/2, unlike p ± z·se
    assert unc.share(30, 100) == est  # a share from its count is the rate of its 0/1 outcomes
    with pytest.raises(ValueError, match="0 <= count <= n"):
        unc.share(11, 10)
    # all right or all wrong: an interval of real width that stays inside [0, 1], never "1.00 ± 0.00"
    ones, zeros = unc.share(20, 20), unc.share(0, 20)
    assert ones.hi == 1.0 and 0.8 < ones.lo < 0.9 and zeros.lo == 0.0 and 0.1 < zeros.hi < 0.2
    assert ones.fmt() != "1.00 ± 0.00"


def test_rate_of_a_small_sample_mean_uses_the_t_quantile():
    """16 documents' NLL: the interval is mean ± t_15 · s/√16 (wider than the normal one)."""
    from scipy import stats

    x = np.random.default_rng(0).normal(3.0, 0.5, 16)
    est = unc.rate(x)
    se = x.std(ddof=1) / 4
    assert est.stderr == pytest.approx(se)
    assert est.hi - est.value == pytest.approx(stats.t.ppf(0.975, 15) * se)
    assert est.hi - est.value > 1.96 * se * 1.05
    assert unc.rate([np.nan, 0.5]).n == 1 and math.isnan(unc.rate([np.nan, 0.5]).stderr)


def test_bootstrap_is_deterministic_by_seed():
    rng = np.random.default_rng(0)
    items = _pres_items(rng, {"facts": 0.7, "arith": 0.4}, [60, 40])
    a = unc.estimate(items, "S_p", seed=3)
    b = unc.estimate(items, "S_p", seed=3)
    c = unc.estimate(items, "S_p", seed=4)
    assert a == b
    assert (a.lo, a.hi) != (c.lo, c.hi)
    assert a.lo < a.value < a.hi


def test_s_p_bootstrap_is_stratified_per_task():
    """Every resample keeps each task's size: a task of one constant value adds no width."""
    rng = np.random.default_rng(1)
    items = _pres_items(rng, {"facts": 0.5, "arith": 1.0}, [200, 5])
    est = unc.estimate(items, "S_p")
    facts = items[items["unit"] == "facts"]["value"].mean()
    assert est.value == pytest.approx(2 / (1 / facts + 1))
    # S_p moves only through facts: its interval is the facts interval mapped through the HM
    f_lo = unc.estimate(items[items["unit"] == "facts"], "S_p").lo
    assert est.lo == pytest.approx(2 / (1 / f_lo + 1), abs=0.02)
    assert est.n == 205


def test_s_e_matches_the_harmonic_mean_of_the_constituents():
    from moir_lib.evaluation.scores import harmonic_mean

    rng = np.random.default_rng(2)
    items = _edit_items(rng, 80, eff=0.9, flu=-2.5, base=-2.0)
    w = items.pivot(index="item", columns="metric", values="value")
    expected = harmonic_mean({"Efficacy": w["Efficacy"].mean(), "Generalization": w["Generalization"].mean(),
                              "Specificity": w["Specificity"].mean(),
                              "Fluency*": w["fluency_base"].mean() / w["fluency"].mean()})
    est = unc.estimate(items, "S_e")
    assert est.value == pytest.approx(expected)
    assert est.lo < expected < est.hi


@pytest.mark.parametrize("metric", ["S_e", "Efficacy"])
def test_planted_difference_is_covered_and_reproduced(metric):
    """C 'a' edits better than 'b' on the same records by 0.3: the paired interval covers 0.3, excludes 0,
    and the verdict follows the claimed direction."""
    rng = np.random.default_rng(5)
    ids = [str(i) for i in range(150)]
    a = _edit_items(rng, 150, eff=0.9, ids=ids, key="a")
    b = _edit_items(rng, 150, eff=0.6, ids=ids, key="b")
    d = unc.difference(a, b, metric)
    true = unc.estimate(a, metric).value - unc.estimate(b, metric).value
    assert d.value == pytest.approx(true)
    assert d.lo < true < d.hi and d.lo > 0
    assert unc.verdict(d, +1) == unc.REPRODUCED
    assert unc.verdict(d, -1) == unc.REVERSED
    assert unc.verdict(d, +1, gate_ok=False) == unc.UNRESOLVED
    assert unc.items_to_resolve(d) is None


def test_null_difference_is_not_resolved_and_says_what_would_resolve_it():
    rng = np.random.default_rng(6)
    acc = {"facts": 0.6, "arith": 0.5, "code": 0.4}
    a = _pres_items(rng, acc, [40, 40, 40], key="a")
    b = _pres_items(rng, acc, [40, 40, 40], key="b")
    d = unc.difference(a, b, "S_p")
    assert d.lo < 0 < d.hi
    assert unc.verdict(d, +1) == unc.UNRESOLVED == unc.verdict(d, -1)
    need = unc.items_to_resolve(d)
    assert need is not None and need > d.n
    assert "would resolve" in unc.verdict_text(d, +1)


def test_paired_beats_unpaired_on_shared_items():
    """The same items scored under two C's that differ on a few items only: pairing makes the
    interval far narrower than two independent intervals."""
    rng = np.random.default_rng(7)
    a = _pres_items(rng, {"facts": 0.5}, [200], key="a")
    b = a.copy()
    wrong = b.index[b["value"] == 0.0][:20]
    b.loc[wrong, "value"] = 1.0  # 20 items answered wrong under a, right under b
    b["key"] = "b"
    d = unc.difference(b, a, "facts")
    single = unc.estimate(a, "facts")
    # unpaired, the difference's interval would be √2 times one point's; paired it is narrower than one
    assert d.hi - d.lo < 0.7 * (single.hi - single.lo)
    assert d.lo > 0


def test_mean_over_edit_samples_pairs_within_each_edit_sample():
    rng = np.random.default_rng(8)
    samples_a, samples_b = [], []
    for s in range(3):
        ids = [f"{s}-{i}" for i in range(60)]
        samples_a.append(_edit_items(rng, 60, eff=0.95, ids=ids, key=f"a{s}"))
        samples_b.append(_edit_items(rng, 60, eff=0.5, ids=ids, key=f"b{s}"))
    d = unc.difference(samples_a, samples_b, "Efficacy")
    per_sample = [unc.difference(x, y, "Efficacy").value for x, y in zip(samples_a, samples_b, strict=True)]
    assert d.value == pytest.approx(np.mean(per_sample))
    assert unc.verdict(d) == unc.REPRODUCED
    with pytest.raises(ValueError, match="per edit sample"):
        unc.difference(samples_a, samples_b[:2], "Efficacy")


def test_jsd_difference_orders_corpora():
    from moir_lib.analysis.divergence import jensen_shannon

    rng = np.random.default_rng(9)
    ref = rng.normal(0, 1, 300)
    near, far = rng.normal(0.1, 1, 300), rng.normal(1.5, 1, 300)
    d = unc.jsd_difference(far, near, ref)
    assert d.value == pytest.approx(jensen_shannon(far, ref).jsd - jensen_shannon(near, ref).jsd, rel=1e-9)
    assert unc.verdict(d, +1) == unc.REPRODUCED
    assert d == unc.jsd_difference(far, near, ref)
    one = unc.jsd_estimate(far, ref, n_resamples=300)
    assert one.value == pytest.approx(jensen_shannon(far, ref).jsd, rel=1e-9) and one.lo < one.value < one.hi


def test_jsd_claim_carries_a_p_value_consistent_with_its_interval():
    rng = np.random.default_rng(9)
    ref = rng.normal(0, 1, 300)
    near, far = rng.normal(0.1, 1, 300), rng.normal(1.5, 1, 300)
    test = unc.jsd_claim(far, near, ref, n_resamples=400)
    assert test.estimate == unc.jsd_difference(far, near, ref, n_resamples=400)
    assert test.p_value < 0.05 and test.estimate.lo > 0 and test.verdict() == unc.REPRODUCED
    assert unc.jsd_claim(far, near, ref, direction=-1, n_resamples=400).verdict() == unc.REVERSED
    same = unc.jsd_claim(rng.normal(0, 1, 300), rng.normal(0, 1, 300), ref, n_resamples=400)
    assert (same.p_value < 0.05) == (same.estimate.excludes_zero() != 0)


def test_top_share_is_a_bootstrap_of_the_largest_share():
    """A clear winner: the interval is the binomial one (about Wilson's); two tokens tied at 0.3, where a
    bootstrap of a maximum is weakest: the interval still covers the true top share (at least 85 of 100
    repetitions)."""
    rng = np.random.default_rng(4)
    tokens = rng.choice(50, 400, p=np.r_[0.5, np.full(49, 0.5 / 49)])
    est, wil = unc.top_share(tokens), unc.share(int(np.bincount(tokens).max()), 400)
    assert est.value == wil.value and est == unc.top_share(tokens)
    assert (est.lo, est.hi) == pytest.approx((wil.lo, wil.hi), abs=0.02)
    p = np.r_[0.3, 0.3, np.full(40, 0.01)]
    hits = [unc.top_share(rng.choice(42, 200, p=p), seed=r, n_resamples=500) for r in range(100)]
    assert np.mean([e.lo <= 0.3 <= e.hi for e in hits]) >= 0.85


def test_top_share_interval_covers_near_ties_where_the_replicates_miss():
    """Four tokens near the top (0.070, 0.068, 0.066, 0.064): the replicates' maximum sits above the
    estimate, so the percentile interval of the same replicates misses the true 0.07 far more often than
    5 %; the symmetric interval of :func:`top_share` covers it."""
    from moir_lib.evaluation.intervals import percentile_interval

    rng = np.random.default_rng(1)
    p = np.r_[0.07, 0.068, 0.066, 0.064, np.full(400, 0.732 / 400)]
    symmetric, percentile = [], []
    for r in range(150):
        x = rng.choice(p.size, 400, p=p)
        est = unc.top_share(x, seed=r, n_resamples=400)
        symmetric.append(est.lo <= 0.07 <= est.hi)
        counts = np.unique(x, return_counts=True)[1]
        reps = np.random.default_rng(r).multinomial(400, counts / 400, size=400).max(axis=1) / 400
        lo, hi = percentile_interval(reps)
        percentile.append(lo <= 0.07 <= hi)
    assert np.mean(symmetric) >= 0.9 and np.mean(percentile) <= 0.85


def test_jsd_bootstrap_keeps_the_full_sample_bandwidth():
    """Two samples of one distribution: the JSD is KDE noise. Replicates with their own Scott bandwidth
    (resampled ties shrink it: more wiggles, a larger divergence) sit far above the estimate; with the
    bandwidth fixed from the full samples they straddle it, and the interval covers the estimate."""
    from scipy.stats import gaussian_kde

    from moir_lib.analysis.divergence import common_grid, js_of_densities, kde_on_grid, scott_bandwidth

    rng = np.random.default_rng(3)
    a, ref = rng.normal(0, 1, 400), rng.normal(0, 1, 400)
    grid = common_grid(a, ref)
    assert kde_on_grid(a, grid, scott_bandwidth(a)) == pytest.approx(kde_on_grid(a, grid), rel=1e-9)
    own = []
    for _ in range(40):
        x, y = rng.choice(a, a.size), rng.choice(ref, ref.size)
        dens = [gaussian_kde(v)(grid) for v in (x, y)]
        own.append(js_of_densities(*(d / d.sum() for d in dens)))
    est = unc.jsd_estimate(a, ref, n_resamples=400)
    assert np.median(own) > 1.5 * est.value  # the bias a fixed bandwidth avoids
    assert est.lo <= est.value <= est.hi


def test_verdict_rejects_a_bad_direction():
    with pytest.raises(ValueError, match="direction"):
        unc.verdict(unc.Estimate(0.1, 0.05, 0.15, 0.02, 10), 0)


# ----------------------------------------------------------------------------- the micro model's items


def test_micro_lab_points_keep_their_items_and_planted_differences_resolve(tmp_path, monkeypatch):
    """A micro-model point saves per-item scores keyed like its rows; its rows' n/stderr follow from them;
    a difference planted on its items is reproduced (or reversed), the point against itself is not
    resolved."""
    from moir_lib.experiments import EditSettings, EvalSettings, ExperimentSpec, Lab, PointStore
    from moir_lib.experiments.rows import load_items

    monkeypatch.setenv("MOIR_SHARED_RESULTS", "0")
    ev = EvalSettings(n_eval=8, pres_limit=12, nll_docs=3, max_gen_tokens=4, fluency_prompts=1)
    lab = Lab("pocket-micro", PointStore(tmp_path, shared=False), evaluation=ev,
              editing=EditSettings(context_templates=1))
    spec = ExperimentSpec("memit", "batch", "wiki", 8)
    rows = lab.compute(spec)
    items = lab.frames([spec])[1][list(lab.store.items.columns)]
    assert set(items["group"]) == {"edit", "preservation", "nll"}
    assert set(items["key"]) == set(rows["key"]) and set(items["n_edits"]) == {8}
    assert items[items["group"] == "edit"]["item"].nunique() == 8
    assert {"ES", "PS", "NS", "Efficacy", "fluency", "fluency_base", "prob_new"} <= set(items["metric"])
    pd.testing.assert_frame_equal(load_items([tmp_path]).reset_index(drop=True),
                                  lab.store.items.reset_index(drop=True), check_dtype=False)
    row = rows.set_index(["group", "metric"])
    es = items[(items["group"] == "edit") & (items["metric"] == "ES")]["value"]
    assert row.loc[("edit", "ES"), "value"] == pytest.approx(es.mean())
    assert row.loc[("edit", "ES"), "n"] == 8
    assert row.loc[("edit", "ES"), "stderr"] == pytest.approx(unc.rate(es).stderr, nan_ok=True)
    facts = items[(items["group"] == "preservation") & (items["unit"] == "facts")]["value"]
    assert row.loc[("preservation", "facts"), "value"] == pytest.approx(facts.mean())
    assert row.loc[("preservation", "S_p"), "value"] == pytest.approx(unc.estimate(items, "S_p").value)
    sp = row.loc[("preservation", "S_p")]
    assert sp["lo"] <= sp["value"] <= sp["hi"] and sp["n"] == len(items[items["metric"] == "correct"])

    # plant: every preservation item answered right, and every edit efficacious, under "b"
    better = items.copy()
    better.loc[better["group"] == "preservation", "value"] = 1.0
    better.loc[better["metric"].isin(["Efficacy", "Generalization", "Specificity"]), "value"] = 1.0
    d_sp = unc.difference(better, items, "S_p")
    assert d_sp.value > 0 and unc.verdict(d_sp, +1) == unc.REPRODUCED
    assert unc.verdict(unc.difference(items, better, "S_p"), +1) == unc.REVERSED
    assert unc.verdict(unc.difference(items, items, "S_p"), +1) == unc.UNRESOLVED
    assert unc.difference(better, items, "S_e_noport").value > 0


def test_combined_difference_sums_its_paired_terms():
    rng = np.random.default_rng(10)
    ids = [str(i) for i in range(80)]
    ea, eb = _edit_items(rng, 80, eff=0.9, ids=ids), _edit_items(rng, 80, eff=0.7, ids=ids)
    pa, pb = (_pres_items(rng, {"facts": 0.6, "arith": 0.5}, [50, 50]),
              _pres_items(rng, {"facts": 0.6, "arith": 0.3}, [50, 50]))
    total = unc.combined_difference([(1.0, ea, eb, "S_e_noport"), (1.0, pa, pb, "S_p")])
    parts = unc.difference(ea, eb, "S_e_noport").value + unc.difference(pa, pb, "S_p").value
    assert total.value == pytest.approx(parts)
    assert total.lo < total.value < total.hi


def test_tables_show_values_with_half_intervals():
    """Table cells as ``0.62 ± 0.05``: one seed's half-width, and over seeds √Σh²/k."""
    from moir_lib.chapters import editing, lab_tables
    from moir_lib.experiments.rows import ROW_COLUMNS

    def row(cov, seed, metric, group, value, half):
        return {"profile": "p", "model": "p", "editor": "memit", "regime": "batch", "cov": cov, "n_edits": 10,
                "edit_sample": seed, "lambda": 1.0, "tau": math.nan, "group": group, "metric": metric,
                "value": value, "n": 100.0, "stderr": half / 1.96, "lo": value - half, "hi": value + half,
                "key": f"{cov}-{seed}"}

    rows = pd.DataFrame([row("wiki", s, "S_p", "preservation", 0.5, 0.06) for s in (0, 1)]
                        + [row("moir", 0, "S_p", "preservation", 0.62, 0.05),
                           row("moir", 0, "Efficacy", "edit", 0.9, 0.04)], columns=list(ROW_COLUMNS))
    h = lab_tables.halves(rows, ["cov"])
    assert h.loc["wiki", "S_p"] == pytest.approx(math.sqrt(2 * 0.06 ** 2) / 2)
    table = editing.paper_table(rows, "memit", "batch", with_pm=True).set_index("C")
    assert table.loc["moir", "S_p"] == "0.62 ± 0.05" and table.loc["moir", "Eff"] == "0.90 ± 0.04"
    assert table.loc["wiki", "S_p"] == "0.50 ± 0.04"
    assert table.loc["wiki", "Eff"] == "–"
