"""The editors' linear algebra on small random problems (no model): eqs. memit-update and
alphaedit-update, the null-space projector, the edit state, and the refusals of bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from moir_lib import theory
from moir_lib.editing.alphaedit import alphaedit_delta, null_space_projector
from moir_lib.editing.base import check_covariance
from moir_lib.editing.memit import MemitEditor, effective_lambda, memit_delta
from moir_lib.editing.state import EditState

torch.manual_seed(0)


def problem(d_in: int = 24, d_out: int = 10, n: int = 5, n_past: int = 7, rank: int = 16, seed: int = 0):
    """R, K, K_past and a rank-deficient C = K0 K0ᵀ / m (per-token normalised), all float64."""
    g = torch.Generator().manual_seed(seed)
    K0 = torch.randn(d_in, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, 200, generator=g,
                                                                             dtype=torch.float64)
    C = K0 @ K0.T / K0.shape[1]
    K = torch.randn(d_in, n, generator=g, dtype=torch.float64)
    R = torch.randn(d_out, n, generator=g, dtype=torch.float64)
    K_past = torch.randn(d_in, n_past, generator=g, dtype=torch.float64)
    return R, K, K_past, C, K0


def soft_gradient(dW, R, K, C, lam, K_past):
    """∇ of ‖ΔW K − R‖² + λ tr(ΔW C ΔWᵀ) + ‖ΔW K_past‖² (the soft problem MEMIT solves)."""
    return 2 * ((dW @ K - R) @ K.T + lam * dW @ C + dW @ K_past @ K_past.T)


def term_scale(dW, R, K, C, lam, K_past):
    """Sum of the norms of the gradient's terms: what 'zero' is relative to."""
    norm = torch.linalg.norm
    return float(norm(R @ K.T) + norm(dW @ K @ K.T) + lam * norm(dW @ C) + norm(dW @ K_past @ K_past.T))


@pytest.mark.parametrize("lam", [1e-3, 1.0, 15_000.0])
def test_memit_update_is_stationary_for_the_soft_problem(lam: float) -> None:
    R, K, K_past, C, _ = problem()
    dW = memit_delta(R, K, C, lam, K_past @ K_past.T)
    assert dW.dtype == torch.float64 and dW.shape == (10, 24)
    scale = term_scale(dW, R, K, C, lam, K_past)
    assert torch.linalg.norm(soft_gradient(dW, R, K, C, lam, K_past)) / scale < 1e-10
    # the check can fail: a slightly different update is not stationary
    wrong = dW * (1 + 1e-4)
    assert torch.linalg.norm(soft_gradient(wrong, R, K, C, lam, K_past)) / scale > 1e-6
    # and the same without K_past (batch regime) for its own problem
    none = torch.zeros(24, 1, dtype=torch.float64)
    dW0 = memit_delta(R, K, C, lam)
    assert torch.linalg.norm(soft_gradient(dW0, R, K, C, lam, none)) / term_scale(dW0, R, K, C, lam,
                                                                                  none) < 1e-10


def test_memit_update_matches_the_theory_module() -> None:
    R, K, K_past, C, _ = problem(seed=3)
    ours = memit_delta(R, K, C, 15_000.0, K_past @ K_past.T).numpy()
    ref = theory.memit_update(R.numpy(), K.numpy(), C.numpy(), 15_000.0, K_past.numpy())
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12 * np.abs(ref).max())


def test_relative_lambda_scales_with_key_and_covariance_size() -> None:
    _, K, _, C, _ = problem()
    kk = float(torch.diagonal(K @ K.T).mean())
    cc = float(torch.diagonal(C).mean())
    assert effective_lambda(10.0, "relative", K, C) == pytest.approx(10.0 * kk / cc)
    assert effective_lambda(10.0, "relative", 2 * K, C) == pytest.approx(40.0 * kk / cc)
    assert effective_lambda(10.0, "absolute", K, C) == 10.0


def test_eigh_projector_equals_the_svd_projector_and_the_theory_module() -> None:
    _, _, _, C, _ = problem(d_in=40, rank=25)
    for tau, mode in [(1e-8, "absolute"), (1e-3, "relative")]:
        P, info = null_space_projector(C, tau, mode)
        U, S, _ = torch.linalg.svd(C)
        cutoff = tau if mode == "absolute" else tau * float(S.max())
        Us = U[:, S < cutoff]
        torch.testing.assert_close(P, Us @ Us.T, rtol=0, atol=1e-10)
        ref = theory.null_space_projector(C.numpy(), tau, mode)
        np.testing.assert_allclose(P.numpy(), ref, atol=1e-10)
        assert info["null_dim"] == 15 and info["tau_mode"] == mode and info["cutoff"] == pytest.approx(cutoff)
        torch.testing.assert_close(P @ P, P, rtol=0, atol=1e-10)


def test_relative_and_absolute_tau_are_the_same_cutoff_scaled() -> None:
    _, _, _, C, _ = problem(d_in=30, rank=20)
    lam_max = float(torch.linalg.eigvalsh(C).max())
    P_rel, rel = null_space_projector(C, 1e-6, "relative")
    P_abs, ab = null_space_projector(C, 1e-6 * lam_max, "absolute")
    torch.testing.assert_close(P_rel, P_abs)
    assert rel["null_dim"] == ab["null_dim"] == 10
    assert rel["tau"] == 1e-6 and rel["tau_mode"] == "relative" and ab["tau_mode"] == "absolute"


def test_alphaedit_update_leaves_the_protected_keys_alone() -> None:
    R, K, K_past, C, K0 = problem(d_in=32, rank=20)
    P, info = null_space_projector(C, 1e-6, "relative")
    assert info["null_dim"] == 12
    dW = alphaedit_delta(R, K, P, 1.0, K_past @ K_past.T)
    leak = torch.linalg.norm(dW @ K0) / (torch.linalg.norm(dW) * torch.linalg.norm(K0))
    assert leak < 1e-10
    torch.testing.assert_close(dW @ P, dW, rtol=0, atol=1e-10)  # ΔW lives in the null space
    ref = theory.alphaedit_update(R.numpy(), K.numpy(), P.numpy(), K_past.numpy())
    np.testing.assert_allclose(dW.numpy(), ref, rtol=1e-9, atol=1e-12 * np.abs(ref).max())
    # without the projector (P = I) the same update leaks into the protected keys (the check can fail)
    dW_free = alphaedit_delta(R, K, torch.eye(32, dtype=torch.float64), 1.0, K_past @ K_past.T)
    assert torch.linalg.norm(dW_free @ K0) / (torch.linalg.norm(dW_free) * torch.linalg.norm(K0)) > 1e-3


def test_alphaedit_l2_scales_the_ridge() -> None:
    R, K, _, C, _ = problem(d_in=32, rank=20)
    P, _ = null_space_projector(C, 1e-6, "relative")
    small, big = alphaedit_delta(R, K, P, 0.01), alphaedit_delta(R, K, P, 100.0)
    assert torch.linalg.norm(big) < torch.linalg.norm(small)
    # stationarity of ‖ΔW P K − R‖²-type problem restricted to the null space: (ΔW K − R) Kᵀ P + l2 ΔW P = 0
    grad = (small @ K - R) @ K.T @ P + 0.01 * small
    assert torch.linalg.norm(grad) / torch.linalg.norm(R @ K.T) < 1e-9


# ----------------------------------------------------------------------------- refusals


def test_lambda_must_be_positive() -> None:
    R, K, _, C, _ = problem()
    for lam in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="λ must be > 0"):
            memit_delta(R, K, C, lam)
        with pytest.raises(ValueError, match="λ must be > 0"):
            MemitEditor({0: C}, [0], lambda_=lam)
    with pytest.raises(ValueError, match="lambda_mode"):
        MemitEditor({0: C}, [0], lambda_mode="scaled")


@pytest.mark.parametrize("tau", [0.0, -0.5, math.inf, math.nan])
def test_tau_outside_zero_infinity_is_refused(tau: float) -> None:
    _, _, _, C, _ = problem()
    with pytest.raises(ValueError, match=r"τ must lie in \(0, ∞\)"):
        null_space_projector(C, tau)


def test_tau_leaving_an_empty_null_space_shows_the_spectrum() -> None:
    C = torch.diag(torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"empty null space.*spectrum of C: \[0\.5, 4\]"):
        null_space_projector(C, 0.1, "absolute")
    with pytest.raises(ValueError, match=r"empty null space.*raise τ above 0\.125"):
        null_space_projector(C, 0.01, "relative")
    with pytest.raises(ValueError, match=r"above every eigenvalue.*P = I"):
        null_space_projector(C, 10.0, "absolute")
    P, info = null_space_projector(C, 10.0, "absolute", allow_full=True)
    torch.testing.assert_close(P, torch.eye(4, dtype=torch.float64))
    P, info = null_space_projector(C, 0.6, "absolute")
    assert info["null_dim"] == 1 and info["eig_min"] == 0.5 and info["eig_max"] == 4.0


def test_bad_covariances_are_refused_with_the_reason() -> None:
    _, _, _, C, _ = problem(d_in=12, rank=6)
    with pytest.raises(ValueError, match=r"has shape \(12, 12\) but the model's key width .* is 16"):
        check_covariance(C, 16)
    asym = C.clone()
    asym[0, 1] += 1.0
    with pytest.raises(ValueError, match="not symmetric"):
        check_covariance(asym)
    neg = C - 0.3 * torch.eye(12, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"not positive semi-definite: smallest eigenvalue -0\.3"):
        check_covariance(neg)
    with pytest.raises(ValueError, match="not positive semi-definite"):
        MemitEditor({0: neg}, [0])
    with pytest.raises(ValueError, match="square"):
        check_covariance(torch.ones(3, 4, dtype=torch.float64))
    bounds = check_covariance(C, 12)
    assert bounds["eig_min"] > -1e-10 and bounds["eig_max"] > 0
    with pytest.raises(ValueError, match="l2 must be > 0"):
        alphaedit_delta(*problem()[:2], torch.eye(24, dtype=torch.float64), 0.0)


# ----------------------------------------------------------------------------- the state


def test_edit_state_save_load_reset(tmp_path) -> None:
    R, K, K_past, C, _ = problem()
    state = EditState("alphaedit", [3, 4], {"tau": 0.02, "tau_mode": "absolute"})
    P, info = null_space_projector(C, 1e-6, "relative")
    state.projectors = {3: P, 4: P.clone()}
    state.projector_info = {3: info, 4: info}
    state.add_keys(3, K)
    state.add_keys(3, K_past)
    state.add_keys(4, K)
    state.n_edits, state.n_batches = 12, 2
    path = state.save(tmp_path / "s" / "state.safetensors")
    assert path.is_file() and not list(path.parent.glob(".*tmp*"))
    back = EditState.load(path)
    assert (back.editor, back.layers, back.n_edits, back.n_batches) == ("alphaedit", [3, 4], 12, 2)
    assert back.config == state.config and back.projector_info[3]["null_dim"] == info["null_dim"]
    assert torch.equal(back.kkt_past[3], K @ K.T + K_past @ K_past.T)
    assert torch.equal(back.projectors[4], P)
    back.reset()
    assert back.n_edits == 0 and not back.kkt_past and torch.equal(back.projectors[3], P)
    with pytest.raises(FileNotFoundError):
        EditState.load(tmp_path / "missing.safetensors")


def test_state_refuses_another_editor_configuration() -> None:
    _, _, _, C, _ = problem()
    editor = MemitEditor({1: C, 2: C}, [1, 2], lambda_=100.0)
    state = editor.new_state()
    state.check_compatible(editor)
    with pytest.raises(ValueError, match=r"another configuration.*lambda.*100\.0, 200\.0"):
        state.check_compatible(MemitEditor({1: C, 2: C}, [1, 2], lambda_=200.0))
    with pytest.raises(ValueError, match="covers layers"):
        state.check_compatible(MemitEditor({1: C}, [1], lambda_=100.0))


def test_an_allowed_empty_null_space_edits_nothing_as_the_authors_code() -> None:
    """``allow_empty`` (the experiment grid): ``P = 0`` and a zero update, not an error."""
    C = torch.diag(torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64))
    P, info = null_space_projector(C, 0.1, "absolute", allow_empty=True)
    assert info["null_dim"] == 0 and torch.equal(P, torch.zeros(4, 4, dtype=torch.float64))
    R, K = torch.randn(3, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(alphaedit_delta(R, K, P), torch.zeros(3, 4, dtype=torch.float64))
    _, info = null_space_projector(C, 0.6, "absolute", allow_empty=True)
    assert info["null_dim"] == 1  # a non-empty null space is unchanged by the flag
