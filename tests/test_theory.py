"""Property tests of moir_lib.theory: Proposition 1, Remark 1, Lemma 2 and eq. (jsd-bound).

Instances are drawn by hypothesis (bounded sizes, a numpy seed); every assertion compares a
computed value with a tolerance, so a wrong formula, vec convention or threshold fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moir_lib import theory as T

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def prop1_instance(draw, psd: bool = False):
    """(A, G, K, R, g_rank) with d_in, d_out <= 7, m < d_in; G PD, or PSD of rank < d_out."""
    rng = np.random.default_rng(draw(seeds))
    d_in = draw(st.integers(2, 7))
    d_out = draw(st.integers(2 if psd else 1, 7))
    m = draw(st.integers(1, d_in - 1))
    A = T.random_pd(rng, d_in, cond=draw(st.floats(1.0, 100.0)))
    if psd:
        g_rank = draw(st.integers(0, d_out - 1))
        G = T.random_psd(rng, d_out, g_rank)
    else:
        g_rank = d_out
        G = T.random_pd(rng, d_out, cond=draw(st.floats(1.0, 100.0)))
    K, R = rng.standard_normal((d_in, m)), rng.standard_normal((d_out, m))
    return A, G, K, R, g_rank


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# --------------------------------------------------------------------------- helpers


@SETTINGS
@given(seed=seeds, d=st.integers(1, 9), cond=st.floats(1.0, 1e3))
def test_random_pd_has_requested_spectrum(seed, d, cond):
    A = T.random_pd(np.random.default_rng(seed), d, cond=cond)
    ev = np.linalg.eigvalsh(A)
    assert np.allclose(A, A.T)
    assert ev.min() > 0
    assert ev.max() / ev.min() == pytest.approx(cond if d > 1 else 1.0, rel=1e-8)


@SETTINGS
@given(seed=seeds, d=st.integers(1, 9), data=st.data())
def test_random_psd_has_exact_rank(seed, d, data):
    rank = data.draw(st.integers(0, d))
    G = T.random_psd(np.random.default_rng(seed), d, rank)
    ev = np.linalg.eigvalsh(G)
    assert int((ev > 1e-10).sum()) == rank
    assert ev.min() > -1e-12


@SETTINGS
@given(seed=seeds, d_in=st.integers(1, 6), d_out=st.integers(2, 6), m=st.integers(1, 4))
def test_kron_convention_matches_trace(seed, d_in, d_out, m):
    """vec(dW)^T (A kron G) vec(dW) == Tr(G dW A dW^T) and vec(dW K) == (K^T kron I) vec(dW)."""
    assert T.kron_convention_error(np.random.default_rng(seed), d_in, d_out, m) < 1e-12


def test_wrong_kron_order_would_be_detected():
    """The opposite ordering (G kron A) gives a different quadratic form: the check can fail."""
    rng = np.random.default_rng(0)
    A, G, dW = T.random_pd(rng, 4), T.random_pd(rng, 3), rng.standard_normal((3, 4))
    x = dW.reshape(-1, order="F")
    assert abs(x @ np.kron(G, A) @ x - T.objective(A, G, dW)) > 1e-3


# --------------------------------------------------------------------------- Proposition 1


@SETTINGS
@given(inst=prop1_instance(psd=False))
def test_closed_form_satisfies_constraint(inst):
    A, _, K, R, _ = inst
    star = T.closed_form(A, K, R)
    assert np.linalg.norm(star @ K - R) <= 1e-10 * np.linalg.norm(R)


@SETTINGS
@given(inst=prop1_instance(psd=False))
def test_closed_form_equals_direct_kkt_for_pd_g(inst):
    A, G, K, R, _ = inst
    star, kkt = T.closed_form(A, K, R), T.solve_kkt(A, G, K, R)
    assert rel(kkt, star) < 1e-9


@SETTINGS
@given(inst=prop1_instance(psd=True))
def test_psd_g_objective_matches_and_difference_in_V(inst):
    A, G, K, R, _ = inst
    star, kkt = T.closed_form(A, K, R), T.solve_kkt(A, G, K, R)
    f_star, f_kkt = T.objective(A, G, star), T.objective(A, G, kkt)
    scale = np.linalg.norm(G, 2) * np.linalg.norm(A, 2) * np.linalg.norm(star) ** 2
    assert abs(f_kkt - f_star) <= 1e-9 * max(f_star, 1e-3 * scale)
    assert np.linalg.norm(kkt @ K - R) <= 1e-9 * np.linalg.norm(R)
    D = kkt - star  # must lie in V = {D : D K = 0, G D = 0}
    s = np.linalg.norm(kkt) + np.linalg.norm(star)
    assert np.linalg.norm(D @ K) <= 1e-9 * np.linalg.norm(K, 2) * s
    assert np.linalg.norm(G @ D) <= 1e-9 * max(np.linalg.norm(G, 2), 1.0) * s


@SETTINGS
@given(inst=prop1_instance(psd=True), seed=seeds)
def test_closed_form_is_optimal_against_feasible_perturbations(inst, seed):
    """f(dW* + dW) >= f(dW*) for random dW with dW K = 0 (the first proof), PSD G."""
    A, G, K, R, _ = inst
    rng = np.random.default_rng(seed)
    star = T.closed_form(A, K, R)
    Q, _ = np.linalg.qr(K, mode="complete")
    Q_perp = Q[:, K.shape[1] :]  # (d_in, d_in - m), orthogonal to range(K)
    f_star = T.objective(A, G, star)
    for _ in range(5):
        dW = rng.standard_normal((G.shape[0], Q_perp.shape[1])) @ Q_perp.T
        assert np.linalg.norm(dW @ K) < 1e-10 * np.linalg.norm(dW)
        assert T.objective(A, G, star + dW) >= f_star - 1e-10 * max(f_star, 1.0)


@SETTINGS
@given(inst=prop1_instance(psd=False), seed=seeds)
def test_direct_solution_is_independent_of_g(inst, seed):
    A, G, K, R, _ = inst
    G2 = T.random_pd(np.random.default_rng(seed), G.shape[0], cond=50.0)
    assert rel(T.solve_kkt(A, G2, K, R), T.solve_kkt(A, G, K, R)) < 1e-9


def test_kkt_solution_depends_on_a():
    """Sanity: the direct solve is not G- *and* A-independent (the check can tell solutions apart)."""
    rng = np.random.default_rng(1)
    A1, A2, G = T.random_pd(rng, 5), T.random_pd(rng, 5, cond=30.0), T.random_pd(rng, 4)
    K, R = rng.standard_normal((5, 2)), rng.standard_normal((4, 2))
    assert rel(T.solve_kkt(A1, G, K, R), T.solve_kkt(A2, G, K, R)) > 1e-3


@SETTINGS
@given(seed=seeds, d_in=st.integers(3, 7), d_out=st.integers(2, 6), data=st.data())
def test_nonuniqueness_for_singular_g(seed, d_in, d_out, data):
    m = data.draw(st.integers(1, d_in - 1))
    g_rank = data.draw(st.integers(0, d_out - 1))
    ex = T.nonuniqueness_example(np.random.default_rng(seed), d_in, d_out, m, g_rank)
    assert ex["norm_delta"] > 1e-3
    assert ex["delta_K"] < 1e-10 * ex["norm_delta"] and ex["G_delta"] < 1e-10 * ex["norm_delta"]
    assert ex["feas_star"] < 1e-10 and ex["feas_perturbed"] < 1e-10
    assert abs(ex["f_perturbed"] - ex["f_star"]) <= 1e-9 * max(ex["f_star"], 1e-12)
    # with G + eps I (PD) the second point is no longer a minimiser: uniqueness is restored
    assert ex["f_perturbed_Geps"] > ex["f_star_Geps"]


def test_nonuniqueness_needs_nontrivial_v():
    with pytest.raises(ValueError, match="g_rank < d_out"):
        T.nonuniqueness_example(np.random.default_rng(0), d_in=4, d_out=3, m=2, g_rank=3)


def test_check_prop1_table():
    df = T.check_prop1(np.random.default_rng(3), 60, max_d=6)
    assert len(df) == 60
    assert set(df["g_class"]) == {"full rank", "rank-deficient"}
    assert df["d_in"].nunique() > 2 and df["d_out"].nunique() > 2
    assert (df["m"] < df["d_in"]).all()
    assert df["rel_err"].max() < 1e-9
    deficient = df[df["g_class"] == "rank-deficient"]
    assert (deficient["g_rank"] < deficient["d_out"]).all()
    # for singular G the min-norm KKT point is usually *another* minimiser, not dW*
    assert deficient["diff_norm"].max() > 1e-3


# --------------------------------------------------------------------------- Remark 1 (i): MEMIT


@SETTINGS
@given(seed=seeds, d_in=st.integers(3, 8), d_out=st.integers(1, 5), data=st.data())
def test_memit_update_matches_explicit_formula(seed, d_in, d_out, data):
    rng = np.random.default_rng(seed)
    m = data.draw(st.integers(1, d_in))
    lam = data.draw(st.floats(1e-2, 1e2))
    K, R, C = rng.standard_normal((d_in, m)), rng.standard_normal((d_out, m)), T.random_pd(rng, d_in)
    K_past = rng.standard_normal((d_in, 2))
    ref = R @ K.T @ np.linalg.inv(K_past @ K_past.T + K @ K.T + lam * C)
    assert rel(T.memit_update(R, K, C, lam, K_past=K_past), ref) < 1e-9


@settings(max_examples=10, deadline=None)
@given(seed=seeds, d_in=st.integers(4, 9), d_out=st.integers(1, 6), data=st.data())
def test_memit_tends_to_closed_form_linearly(seed, d_in, d_out, data):
    m = data.draw(st.integers(1, d_in - 1))
    curve = T.memit_limit_curve(np.random.default_rng(seed), np.logspace(-9, 1, 41), d_in, d_out, m)
    err = curve["rel_err"].to_numpy()
    lam = curve["lam"].to_numpy()
    at = lambda x: err[np.isclose(lam, x)].item()  # noqa: E731
    # linear convergence: 100x smaller lambda, ~100x smaller error (loose: 30x), and small already
    assert at(1e-6) < at(1e-4) / 30 and at(1e-6) < 1e-3
    assert err[-1] > 1e-2  # far from the limit at large lambda: the curve has content
    assert 0.9 <= T.fit_loglog_slope(curve["lam"], curve["rel_err"]) <= 1.1


def test_fit_loglog_slope_recovers_known_power():
    x = np.logspace(-8, 0, 33)
    y = 3.0 * x**2 + 1e-14 / x  # power law plus a rounding-like floor at small x
    assert T.fit_loglog_slope(x, y, y_max=1e-1) == pytest.approx(2.0, abs=0.02)
    with pytest.raises(ValueError, match="needs >= 2 points"):
        T.fit_loglog_slope(x, np.full_like(x, 1e-12))


# --------------------------------------------------------------------------- Remark 1 (ii): AlphaEdit


@st.composite
def rank_deficient_keys(draw):
    rng = np.random.default_rng(draw(seeds))
    d = draw(st.integers(3, 10))
    n0 = draw(st.integers(1, d - 1))
    return rng, d, n0, rng.standard_normal((d, n0)) / math.sqrt(d)


@SETTINGS
@given(keys=rank_deficient_keys())
def test_projector_symmetric_idempotent_annihilates_k0(keys):
    _, d, n0, K0 = keys
    P = T.null_space_projector(K0 @ K0.T, 1e-10, mode="relative")
    assert np.abs(P - P.T).max() < 1e-12
    assert np.abs(P @ P - P).max() < 1e-12
    assert np.trace(P) == pytest.approx(d - n0, abs=1e-9)
    assert np.abs(P @ K0).max() < 1e-12


def test_projector_is_built_with_eigh(monkeypatch):
    calls = []
    eigh = np.linalg.eigh

    def spy(a, *args, **kw):
        calls.append(a.shape)
        return eigh(a, *args, **kw)

    def no_svd(*args, **kw):
        raise AssertionError("null_space_projector must use eigh, not a general SVD")

    monkeypatch.setattr(np.linalg, "eigh", spy)
    monkeypatch.setattr(np.linalg, "svd", no_svd)
    K0 = np.random.default_rng(0).standard_normal((6, 3))
    T.null_space_projector(K0 @ K0.T, 1e-10, mode="relative")
    assert calls == [(6, 6)]


def test_projector_keeps_negative_eigendirections():
    """eigh keeps eigenvalue -1 (< tau); an SVD would see singular value 1 and drop it."""
    C = np.diag([-1.0, 1e-14, 2.0])
    P = T.null_space_projector(C, 1e-6)
    assert np.allclose(np.diag(P), [1.0, 1.0, 0.0])


def test_tau_outside_spectrum_raises_with_bounds():
    C = np.diag([1e-3, 1e-1, 1.0])
    with pytest.raises(ValueError, match=r"empty null space.*spectrum \[0\.001, 1\]"):
        T.null_space_projector(C, 1e-4)
    with pytest.raises(ValueError, match=r"empty null space.*relative: above 0\.001"):
        T.null_space_projector(C, 1e-4, mode="relative")
    with pytest.raises(ValueError, match=r"whole space.*spectrum \[0\.001, 1\]"):
        T.null_space_projector(C, 2.0)
    assert np.allclose(T.null_space_projector(C, 2.0, allow_full=True), np.eye(3))
    assert np.trace(T.null_space_projector(C, 0.05)) == pytest.approx(1.0)
    assert np.trace(T.null_space_projector(C, 0.5, mode="relative")) == pytest.approx(2.0)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="tau must be > 0"):
            T.null_space_projector(C, bad)
    with pytest.raises(ValueError, match="symmetric"):
        T.null_space_projector(np.array([[1.0, 2.0], [0.0, 1.0]]), 0.5)


@SETTINGS
@given(keys=rank_deficient_keys(), d_out=st.integers(1, 6), data=st.data())
def test_alphaedit_update_annihilates_k0_with_exact_null_space(keys, d_out, data):
    rng, d, _, K0 = keys
    m = data.draw(st.integers(1, d))
    P = T.null_space_projector(K0 @ K0.T, 1e-10, mode="relative")
    K, R = rng.standard_normal((d, m)) / math.sqrt(d), rng.standard_normal((d_out, m))
    K_past = rng.standard_normal((d, 2)) / math.sqrt(d) if data.draw(st.booleans()) else None
    dW = T.alphaedit_update(R, K, P, K_past=K_past)
    assert np.abs(dW @ K0).max() <= 1e-9
    X = K @ K.T + (K_past @ K_past.T if K_past is not None else 0.0)
    ref = R @ K.T @ P @ np.linalg.inv(X @ P + np.eye(d))  # eq. (alphaedit-update) literally
    assert rel(dW, ref) < 1e-9


def test_alphaedit_exact_check_and_leak_without_projector():
    df = T.alphaedit_exact_check(np.random.default_rng(4), 40)
    assert df["max_abs_K0"].max() <= 1e-9
    assert (df["null_dim"] == df["d"] - df["n0"]).all()
    # control: with P = I (no null-space restriction) the update does touch K0
    rng = np.random.default_rng(5)
    K0, K, R = rng.standard_normal((6, 3)), rng.standard_normal((6, 2)), rng.standard_normal((4, 2))
    assert np.abs(T.alphaedit_update(R, K, np.eye(6)) @ K0).max() > 1e-3


def test_alphaedit_tau_curve_is_monotone_and_marks_paper_grid():
    df = T.alphaedit_tau_curve(np.random.default_rng(6))
    assert df["paper_grid"].sum() == len(T.PAPER_TAU_GRID)
    assert (np.diff(df["null_dim"]) >= 0).all()  # larger tau keeps more directions
    assert df["residual"].iloc[-1] > 10 * df["residual"].iloc[0]  # and leaks more
    assert (df["max_eig_kept"] < df["tau"]).all()
    assert df["residual"].max() < 1.0


# --------------------------------------------------------------------------- Lemma 2 / eq. (jsd-bound)


def test_jsd_basic_values():
    p, q = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert T.jsd(p, q) == pytest.approx(math.log(2))
    assert T.jsd(p, q, base=2) == pytest.approx(1.0)
    r = np.array([0.2, 0.3, 0.5])
    s = np.array([0.5, 0.25, 0.25])
    assert T.jsd(r, r) == 0.0
    assert T.jsd(r, s) == pytest.approx(T.jsd(s, r), rel=1e-14)
    m = 0.5 * (r + s)
    ref = 0.5 * np.sum(r * np.log(r / m)) + 0.5 * np.sum(s * np.log(s / m))
    assert T.jsd(r, s) == pytest.approx(ref, rel=1e-12)
    assert T.tv(r, s) == pytest.approx(0.3)


@st.composite
def distributions(draw):
    rng = np.random.default_rng(draw(seeds))
    n, d = draw(st.integers(2, 20)), draw(st.integers(1, 6))
    alpha = draw(st.floats(0.05, 10.0))
    p, q = rng.dirichlet(np.full(n, alpha)), rng.dirichlet(np.full(n, alpha))
    if draw(st.booleans()):  # disjoint supports
        cut = draw(st.integers(1, n - 1))
        p[cut:], q[:cut] = 0.0, 0.0
        p, q = p / p.sum(), q / q.sum()
    phi = rng.standard_normal((n, d)) * draw(st.floats(0.01, 10.0))
    return p, q, phi


@settings(max_examples=60, deadline=None)
@given(inst=distributions())
def test_lemma2_and_jsd_bound_hold(inst):
    p, q, phi = inst
    t = T.tv(p, q)
    if t < 1e-12:
        return
    M = np.linalg.norm(phi, axis=1).max()
    fro = np.linalg.norm(T.second_moment(p, phi) - T.second_moment(q, phi))
    assert fro <= 2 * M**2 * t * (1 + 1e-12)  # eq. (tv-lipschitz)
    assert fro <= math.sqrt(2) * M**2 * t * (1 + 1e-12)  # the sharp constant
    assert fro <= 2 * math.sqrt(2) * M**2 * math.sqrt(T.jsd(p, q)) * (1 + 1e-12)  # eq. (jsd-bound), nats
    assert t <= math.sqrt(2 * T.jsd(p, q)) * (1 + 1e-12)  # Pinsker-type step, nats


def test_second_moment_is_sigma():
    p = np.array([0.25, 0.75])
    phi = np.array([[1.0, 0.0], [1.0, 2.0]])
    assert np.allclose(
        T.second_moment(p, phi), 0.25 * np.outer(phi[0], phi[0]) + 0.75 * np.outer(phi[1], phi[1])
    )


def test_lemma2_check_extremes_and_conventions():
    df = T.lemma2_check(np.random.default_rng(7), 300)
    assert set(df["family"]) == set(T._LEMMA2_FAMILIES)
    # Lemma 2 holds, and the orthogonal pair attains the sharp 1/sqrt(2) (not 1)
    assert df["ratio_tv"].max() == pytest.approx(1 / math.sqrt(2), abs=1e-9)
    assert df["ratio_tv_sharp"].max() <= 1 + 1e-9
    assert df["ratio_jsd"].max() <= 1 / math.sqrt(2) + 1e-9
    # Pinsker step TV <= sqrt(2 JSD): tight in nats (near-identical p, q), slack sqrt(ln 2) in bits
    assert 0.999 < df["pinsker_nats"].max() <= 1.0
    assert df["pinsker_bits"].max() == pytest.approx(math.sqrt(math.log(2)), rel=1e-3)
    assert df["pinsker_dist"].max() < df["pinsker_nats"].max()
    # a wrong convention that is *not* an upper bound would show: e.g. TV / sqrt(JSD_nats / 2)
    assert (df["tv"] / np.sqrt(df["jsd_nats"] / 2)).max() > 1.5


# --------------------------------------------------------------------------- run_all and plots


HEADLINE = (
    "prop1_max_rel_err",
    "memit_limit_slope",
    "alphaedit_max_abs_K0",
    "lemma2_max_ratio",
    "jsd_bound_max_ratio",
)


@pytest.fixture(scope="module")
def run200():
    return T.run_all(seed=0, n_instances=200)


@pytest.mark.parametrize("seed", [0, 3])
def test_run_all_headlines_within_targets(seed, run200):
    out = run200 if seed == 0 else T.run_all(seed=seed, n_instances=200)
    assert set(HEADLINE) <= set(out)
    assert out["prop1_max_rel_err"] <= 1e-9
    assert 0.9 <= out["memit_limit_slope"] <= 1.1
    assert out["alphaedit_max_abs_K0"] <= 1e-9
    assert 0.7 < out["lemma2_max_ratio"] <= 1.0
    assert 0.7 < out["jsd_bound_max_ratio"] <= 1.0
    assert out["kron_convention_error"] < 1e-12
    assert len(out["prop1"]) == 200


def test_run_all_is_deterministic(run200):
    again = T.run_all(seed=0, n_instances=200)
    for k in HEADLINE:
        assert again[k] == run200[k]
    assert T.run_all(seed=9, n_instances=200)["prop1_max_rel_err"] != run200["prop1_max_rel_err"]


def test_plots_read_theory_tables(run200):
    import plotly.graph_objects as go

    from moir_lib import plots

    figs = [
        plots.prop1_error_hist(run200["prop1"]),
        plots.memit_limit_loglog(run200["memit_curve"], **run200["memit_fit"]),
        plots.memit_limit_loglog(run200["memit_curve"]),
        plots.alphaedit_tau_curve(run200["alphaedit_tau"]),
        plots.lemma2_ratios(run200["lemma2"]),
    ]
    assert all(isinstance(f, go.Figure) and f.layout.title.text for f in figs)
    # the fitted line drawn by the figure carries the slope of the table's fit
    assert f"{run200['memit_fit']['slope']:.3f}" in figs[2].data[1].name
    with pytest.raises(ValueError, match="lacks columns"):
        plots.lemma2_ratios(run200["prop1"])


def test_chapter_headline_and_findings(run200):
    from moir_lib.chapters import g_cancellation

    head = g_cancellation.headline(run200)
    assert tuple(head) == HEADLINE and head == {k: run200[k] for k in HEADLINE}
    text = g_cancellation.findings(run200, 200)
    assert text.count(" holds.*") == 4 and "**fails**" not in text
    assert f"{run200['memit_limit_slope']:.3f}" in text
