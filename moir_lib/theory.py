"""Numerical proof check of the paper's theory (Section 4.1 and Appendix B).

What is checked, in float64 numpy, on random instances of varied size:

* **Proposition 1 (G-cancellation), eq. (rome-objective).** The constrained problem
  ``min vec(dW)^T (A kron G) vec(dW)  s.t.  dW K = R`` is solved *directly* from its KKT system
  (:func:`solve_kkt`) and compared with the closed form
  ``dW* = R (K^T A^-1 K)^-1 K^T A^-1`` (:func:`closed_form`). For positive-definite G the minimiser
  is unique and the two must agree; for positive semi-definite G the minimiser set is
  ``dW* + V`` with ``V = {dW : dW K = 0, G dW = 0}``, so we check equal objective, feasibility and
  that the difference lies in V (:func:`check_prop1`, :func:`nonuniqueness_example`).
* **Remark 1 (i), eq. (memit-update).** With ``K_past = 0`` MEMIT's Tikhonov update tends to the
  ``A = C`` closed form as lambda -> 0+, linearly in lambda (:func:`memit_limit_curve`).
* **Remark 1 (ii), eq. (alphaedit-update).** With an exact null-space projector P of
  ``C = K0 K0^T``, AlphaEdit's update satisfies ``dW K0 = 0`` (:func:`alphaedit_exact_check`); with a
  full-rank C of decaying spectrum the leak ``dW K0`` depends on the threshold tau
  (:func:`alphaedit_tau_curve`).
* **Lemma 2 (TV-Lipschitz), eq. (tv-lipschitz), and eq. (jsd-bound).** On discrete distributions
  with bounded features, ``||Sigma(p) - Sigma(q)||_F <= 2 M^2 TV(p, q) <= 2 sqrt(2) M^2 sqrt(JSD)``
  (:func:`lemma2_check`), including the JSD convention (nats, bits, distance) under which the
  Pinsker-type step ``TV <= sqrt(2 JSD)`` holds.

This module imports nothing from the rest of ``moir_lib``: the proof check must not trust the
code it checks. Every function takes a ``numpy.random.Generator`` so results are deterministic
by seed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from scipy.special import kl_div

if TYPE_CHECKING:
    from jaxtyping import Bool, Float

log = logging.getLogger(__name__)

# The AlphaEdit null-space thresholds of the paper's Appendix C (absolute, on the raw covariance).
PAPER_TAU_GRID: tuple[float, ...] = (0.02, 0.005, 0.001, 0.0005)
_TINY = np.finfo(np.float64).tiny


# ---------------------------------------------------------------------------------------------
# random matrices
# ---------------------------------------------------------------------------------------------


def _orthogonal(rng: np.random.Generator, d: int) -> Float[np.ndarray, "d d"]:
    """Haar-random orthogonal matrix (QR of a Gaussian with the sign fix)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def random_pd(rng: np.random.Generator, d: int, cond: float = 10.0) -> Float[np.ndarray, "d d"]:
    """Symmetric positive-definite matrix with eigenvalues log-spaced in ``[1/cond, 1]``."""
    if d < 1 or cond < 1:
        raise ValueError(f"random_pd needs d >= 1 and cond >= 1, got d={d}, cond={cond}")
    q = _orthogonal(rng, d)
    eig = np.logspace(0.0, -math.log10(cond), d) if d > 1 else np.ones(1)
    m = (q * eig) @ q.T
    return 0.5 * (m + m.T)


def random_psd(rng: np.random.Generator, d: int, rank: int) -> Float[np.ndarray, "d d"]:
    """Symmetric positive semi-definite matrix of exact rank ``rank`` (nonzero eigenvalues in [0.5, 2])."""
    if not 0 <= rank <= d:
        raise ValueError(f"random_psd needs 0 <= rank <= d, got rank={rank}, d={d}")
    q = _orthogonal(rng, d)[:, :rank]  # (d, rank)
    eig = rng.uniform(0.5, 2.0, rank)
    m = (q * eig) @ q.T
    return 0.5 * (m + m.T)


# ---------------------------------------------------------------------------------------------
# Proposition 1
# ---------------------------------------------------------------------------------------------


def objective(A: Float[np.ndarray, "d_in d_in"], G: Float[np.ndarray, "d_out d_out"],
              dW: Float[np.ndarray, "d_out d_in"]) -> float:
    """Eq. (rome-objective): ``Tr(G dW A dW^T) = vec(dW)^T (A kron G) vec(dW)``."""
    return float(np.trace(G @ dW @ A @ dW.T))


def closed_form(
    A: Float[np.ndarray, "d_in d_in"], K: Float[np.ndarray, "d_in n"], R: Float[np.ndarray, "d_out n"]
) -> Float[np.ndarray, "d_out d_in"]:
    """Proposition 1: ``dW* = R (K^T A^-1 K)^-1 K^T A^-1`` (solves, no explicit inverse).

    A: positive definite.
    """
    AiK = np.linalg.solve(A, K)  # (d_in, m) = A^-1 K
    S = K.T @ AiK  # (m, m) = K^T A^-1 K
    # dW* = R S^-1 (A^-1 K)^T  (A symmetric); R S^-1 = solve(S^T, R^T)^T
    return np.linalg.solve(S.T, R.T).T @ AiK.T


def _vec(X: Float[np.ndarray, "d_out d"]) -> Float[np.ndarray, " d_out*d"]:
    """Column-major vec."""
    return X.reshape(-1, order="F")


def kkt_system(
    A: Float[np.ndarray, "d_in d_in"], G: Float[np.ndarray, "d_out d_out"], K: Float[np.ndarray, "d_in n"],
    R: Float[np.ndarray, "d_out n"],
) -> tuple[
    Float[np.ndarray, "d_out*d_in+d_out*n d_out*d_in+d_out*n"], Float[np.ndarray, " d_out*d_in+d_out*n"]
]:
    """KKT matrix and right-hand side of eq. (rome-objective) in column-major vec.

    With ``x = vec(dW)``: objective ``x^T (A kron G) x`` (gradient ``2 (A kron G) x``), constraint
    ``vec(dW K) = (K^T kron I_out) x = vec(R)``. Returns ``[[2 (A kron G), C^T], [C, 0]]`` and
    ``[0; vec(R)]``.
    """
    d_out, m = R.shape
    d_in = A.shape[0]
    H = 2.0 * np.kron(A, G)  # (d_out d_in, d_out d_in)
    C = np.kron(K.T, np.eye(d_out))  # (d_out m, d_out d_in)
    n, p = d_out * d_in, d_out * m
    KKT = np.zeros((n + p, n + p))
    KKT[:n, :n] = H
    KKT[:n, n:] = C.T
    KKT[n:, :n] = C
    rhs = np.concatenate([np.zeros(n), _vec(R)])
    return KKT, rhs


def solve_kkt(
    A: Float[np.ndarray, "d_in d_in"], G: Float[np.ndarray, "d_out d_out"], K: Float[np.ndarray, "d_in n"],
    R: Float[np.ndarray, "d_out n"], *, rcond: float = 1e-12,
) -> Float[np.ndarray, "d_out d_in"]:
    """Solve eq. (rome-objective) directly from its KKT system, never using the closed form.

    For PD G the KKT matrix is nonsingular and is solved by LU. For singular G it is singular
    (the minimiser set is ``dW* + V``); we return the minimum-norm least-squares solution of the
    (consistent) KKT system via SVD with relative cutoff ``rcond``. Any KKT point minimises this
    convex problem, but it need not equal ``dW*``.
    """
    d_out, d_in = G.shape[0], A.shape[0]
    KKT, rhs = kkt_system(A, G, K, R)
    try:
        if np.linalg.eigvalsh(G).min() <= 1e-12 * max(np.abs(G).max(), _TINY):
            raise np.linalg.LinAlgError("singular G")
        sol = np.linalg.solve(KKT, rhs)
    except np.linalg.LinAlgError:
        sol = np.linalg.lstsq(KKT, rhs, rcond=rcond)[0]
    return sol[: d_out * d_in].reshape((d_out, d_in), order="F")


def kron_convention_error(rng: np.random.Generator, d_in: int = 4, d_out: int = 3, m: int = 2) -> float:
    """Max relative mismatch of the two vec identities used by :func:`kkt_system`.

    Checks ``vec(dW)^T (A kron G) vec(dW) = Tr(G dW A dW^T)`` and
    ``vec(dW K) = (K^T kron I) vec(dW)`` on a random instance; should be ~1e-16.
    """
    A, G = random_pd(rng, d_in), random_psd(rng, d_out, max(d_out - 1, 1))
    dW, K = rng.standard_normal((d_out, d_in)), rng.standard_normal((d_in, m))
    x = _vec(dW)
    q_kron = x @ np.kron(A, G) @ x
    q_tr = objective(A, G, dW)
    e1 = abs(q_kron - q_tr) / max(abs(q_tr), _TINY)
    lhs, rhs = _vec(dW @ K), np.kron(K.T, np.eye(d_out)) @ x
    e2 = np.linalg.norm(lhs - rhs) / np.linalg.norm(lhs)
    return float(max(e1, e2))


def _rel(num: float, den: float) -> float:
    return float(num / max(den, _TINY))


def check_prop1(
    rng: np.random.Generator, n_instances: int, max_d: int = 8, max_cond: float = 100.0
) -> pd.DataFrame:
    """Proposition 1 on ``n_instances`` random instances of varied size (one row each).

    Sizes: ``2 <= d_in <= max_d``, ``1 <= d_out <= max_d``, ``1 <= m < d_in``; A PD with condition
    number log-uniform in [1, max_cond]; G PD for even rows, PSD of rank ``0..d_out-1`` for odd rows.

    Columns (relative measures; NaN where not applicable):
      ``err_kkt`` ||kkt - dW*||_F/||dW*||_F (PD G only: unique minimiser);
      ``obj_gap`` |f(kkt) - f(dW*)| / f(dW*);
      ``feas_closed`` / ``feas_kkt`` ||dW K - R||_F / ||R||_F;
      ``diff_K`` ||D K||_F / (||K||_2 s), ``diff_G`` ||G D||_F / (||G||_2 s) with D = kkt - dW*,
      s = ||kkt||_F + ||dW*||_F (PSD G only: D must lie in V);
      ``diff_norm`` ||D||_F / ||dW*||_F (informative: nonzero for singular G);
      ``g_indep`` ||kkt(G1) - kkt(G2)||_F / ||kkt(G1)||_F for two PD G's on the same (A, K, R);
      ``rel_err`` the max of the applicable measures.
    """
    rows = []
    for i in range(n_instances):
        d_in = int(rng.integers(2, max_d + 1))
        d_out = int(rng.integers(1, max_d + 1))
        m = int(rng.integers(1, d_in))
        cond_a = float(10 ** rng.uniform(0.0, math.log10(max_cond)))
        A = random_pd(rng, d_in, cond=cond_a)
        K = rng.standard_normal((d_in, m))  # (d_in, m)
        R = rng.standard_normal((d_out, m))  # (d_out, m)
        pd_g = i % 2 == 0
        g_rank = d_out if pd_g else int(rng.integers(0, d_out))
        G = (
            random_pd(rng, d_out, cond=float(10 ** rng.uniform(0.0, math.log10(max_cond))))
            if pd_g
            else random_psd(rng, d_out, g_rank)
        )
        star = closed_form(A, K, R)
        kkt = solve_kkt(A, G, K, R)
        f_star, f_kkt = objective(A, G, star), objective(A, G, kkt)
        nR = np.linalg.norm(R)
        row = {
            "instance": i,
            "d_in": d_in,
            "d_out": d_out,
            "m": m,
            "g_rank": g_rank,
            "g_class": "full rank" if pd_g else "rank-deficient",
            "cond_A": cond_a,
            "f_star": f_star,
            "f_kkt": f_kkt,
            "obj_gap": _rel(abs(f_kkt - f_star), f_star),
            "feas_closed": _rel(np.linalg.norm(star @ K - R), nR),
            "feas_kkt": _rel(np.linalg.norm(kkt @ K - R), nR),
        }
        D = kkt - star
        row["diff_norm"] = _rel(np.linalg.norm(D), np.linalg.norm(star))
        if pd_g:
            row["err_kkt"] = row["diff_norm"]
            row["diff_K"] = row["diff_G"] = np.nan
        else:
            s = np.linalg.norm(kkt) + np.linalg.norm(star)
            row["err_kkt"] = np.nan
            row["diff_K"] = _rel(np.linalg.norm(D @ K), np.linalg.norm(K, 2) * s)
            g_norm = np.linalg.norm(G, 2)
            row["diff_G"] = _rel(np.linalg.norm(G @ D), g_norm * s) if g_norm > 0 else 0.0
        G1 = G if pd_g else random_pd(rng, d_out, cond=10.0)
        G2 = random_pd(rng, d_out, cond=float(10 ** rng.uniform(0.0, math.log10(max_cond))))
        k1 = kkt if pd_g else solve_kkt(A, G1, K, R)
        k2 = solve_kkt(A, G2, K, R)
        row["g_indep"] = _rel(np.linalg.norm(k1 - k2), np.linalg.norm(k1))
        measures = ["obj_gap", "feas_closed", "feas_kkt", "g_indep"]
        measures += ["err_kkt"] if pd_g else ["diff_K", "diff_G"]
        row["rel_err"] = float(max(row[k] for k in measures))
        rows.append(row)
    return pd.DataFrame(rows)


def _null_basis(X: Float[np.ndarray, "n d_in"], rtol: float = 1e-10) -> Float[np.ndarray, "d_in k"]:
    """Orthonormal basis of ker(X) from the SVD of the rectangular X."""
    _, s, vt = np.linalg.svd(X)
    rank = int((s > rtol * (s[0] if s.size else 0.0)).sum())
    return vt[rank:].T


def nonuniqueness_example(
    rng: np.random.Generator, d_in: int = 6, d_out: int = 5, m: int = 3, g_rank: int = 2
) -> dict[str, float]:
    """For singular G, a second minimiser ``dW* + dW`` with ``dW K = 0`` and ``G dW = 0``.

    ``dW = U_ker(G) X Q_perp(K)^T``: U_ker spans ker(G) (from ``eigh``), Q_perp spans the
    orthogonal complement of range(K). Returns the objectives and feasibility residuals of both
    minimisers and ``||dW||_F`` (nonzero), as in the uniqueness caveat after Prop. 1's second proof.
    """
    if not (g_rank < d_out and m < d_in):
        raise ValueError(
            f"need g_rank < d_out and m < d_in for a nontrivial V, got {g_rank=}, {d_out=}, {m=}"
        )
    A = random_pd(rng, d_in, cond=10.0)
    G = random_psd(rng, d_out, g_rank)
    K, R = rng.standard_normal((d_in, m)), rng.standard_normal((d_out, m))
    evals, evecs = np.linalg.eigh(G)
    U_ker = evecs[:, evals <= 1e-10 * max(evals.max(), _TINY)]  # (d_out, d_out - g_rank)
    Q_perp = _null_basis(K.T)  # (d_in, d_in - m)
    X = rng.standard_normal((U_ker.shape[1], Q_perp.shape[1]))
    dW = U_ker @ X @ Q_perp.T  # (d_out, d_in)
    star = closed_form(A, K, R)
    other = star + dW
    f_star, f_other = objective(A, G, star), objective(A, G, other)
    nR = np.linalg.norm(R)
    return {
        "f_star": f_star,
        "f_perturbed": f_other,
        "obj_rel_diff": _rel(abs(f_other - f_star), f_star),
        "feas_star": _rel(np.linalg.norm(star @ K - R), nR),
        "feas_perturbed": _rel(np.linalg.norm(other @ K - R), nR),
        "norm_dW_star": float(np.linalg.norm(star)),
        "norm_delta": float(np.linalg.norm(dW)),
        "delta_K": float(np.linalg.norm(dW @ K)),
        "G_delta": float(np.linalg.norm(G @ dW)),
        "f_perturbed_Geps": objective(A, G + 1e-3 * np.eye(d_out), other),
        "f_star_Geps": objective(A, G + 1e-3 * np.eye(d_out), star),
    }


# ---------------------------------------------------------------------------------------------
# Remark 1 (i): MEMIT
# ---------------------------------------------------------------------------------------------


def memit_update(
    R: Float[np.ndarray, "d_out n"], K: Float[np.ndarray, "d_in n"], C: Float[np.ndarray, "d_in d_in"],
    lam: float, K_past: Float[np.ndarray, "d_in n_past"] | None = None,
) -> Float[np.ndarray, "d_out d_in"]:
    """Eq. (memit-update): ``R K^T (K_past K_past^T + K K^T + lam C)^-1`` in float64."""
    R, K, C = (np.asarray(x, dtype=np.float64) for x in (R, K, C))
    M = K @ K.T + lam * C  # (d_in, d_in), symmetric
    if K_past is not None:
        K_past = np.asarray(K_past, dtype=np.float64)
        M = M + K_past @ K_past.T
    # X M^-1 = solve(M^T, X^T)^T
    return np.linalg.solve(M.T, (R @ K.T).T).T


def memit_limit_curve(
    rng: np.random.Generator,
    lambdas: Sequence[float] | Float[np.ndarray, " points"] | None = None,
    d_in: int = 8,
    d_out: int = 6,
    m: int = 3,
    cond: float = 10.0,
) -> pd.DataFrame:
    """Remark 1 (i): ``||dW_MEMIT(lam) - R (K^T C^-1 K)^-1 K^T C^-1||_F / ||limit||_F`` vs lam.

    ``K_past = 0``, C PD with condition number ``cond``, K and R Gaussian. The error is O(lam) for
    small lam until float rounding (~eps cond(KK^T + lam C) ~ eps/lam) takes over. Columns:
    ``lam``, ``rel_err``.
    """
    lams = np.logspace(-9, 2, 45) if lambdas is None else np.asarray(lambdas, dtype=np.float64)
    C = random_pd(rng, d_in, cond=cond)
    K = rng.standard_normal((d_in, m)) / math.sqrt(d_in)
    R = rng.standard_normal((d_out, m))
    limit = closed_form(C, K, R)
    n_lim = np.linalg.norm(limit)
    errs = [np.linalg.norm(memit_update(R, K, C, float(lam)) - limit) / n_lim for lam in lams]
    return pd.DataFrame({"lam": lams, "rel_err": np.asarray(errs)})


def fit_loglog(
    x: Sequence[float] | Float[np.ndarray, " points"],
    y: Sequence[float] | Float[np.ndarray, " points"],
    y_min: float = 1e-10,
    y_max: float = 1e-3,
    x_min: float | None = None,
) -> tuple[float, float, Bool[np.ndarray, " points"]]:
    """Least-squares line ``log10 y = slope log10 x + intercept`` on the asymptotic small-x range.

    Uses points with ``y_min < y < y_max`` (above float noise, below the saturation at large x)
    and ``x >= x_min``. By default ``x_min`` is 100 times the x of the smallest y when that
    minimum is interior: left of it the curve is the rounding floor (error ~ eps / x), not the
    truncation error being measured. Returns (slope, intercept, mask over the input order).
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y) & (y > 0) & (x > 0)
    if x_min is None:
        xs, ys = x[ok], y[ok]
        order = np.argsort(xs)
        k = int(np.argmin(ys[order])) if xs.size else 0
        x_min = float(xs[order][0]) if k == 0 else 100.0 * float(xs[order][k])
    mask = ok & (y > y_min) & (y < y_max) & (x >= x_min)
    if mask.sum() < 2:
        raise ValueError(
            f"fit_loglog needs >= 2 points with {y_min:g} < y < {y_max:g} and x >= {x_min:g}, "
            f"got {mask.sum()}; extend the x grid towards the asymptotic range"
        )
    slope, intercept = np.polyfit(np.log10(x[mask]), np.log10(y[mask]), 1)
    return float(slope), float(intercept), mask


def fit_loglog_slope(
    x: Sequence[float] | Float[np.ndarray, " points"],
    y: Sequence[float] | Float[np.ndarray, " points"],
    **kw: float,
) -> float:
    """Slope of the least-squares fit of log y on log x over the asymptotic range (:func:`fit_loglog`)."""
    return fit_loglog(x, y, **kw)[0]


# ---------------------------------------------------------------------------------------------
# Remark 1 (ii): AlphaEdit
# ---------------------------------------------------------------------------------------------


def null_space_projector(
    C: Float[np.ndarray, "d_in d_in"], tau: float, mode: Literal["absolute", "relative"] = "absolute",
    allow_full: bool = False,
) -> Float[np.ndarray, "d_in d_in"]:
    """AlphaEdit's projector ``P = U_hat U_hat^T`` onto the (approximate) null space of symmetric C.

    U_hat are the eigenvectors of C (``numpy.linalg.eigh``; C is symmetric, so no general SVD)
    with eigenvalue ``< tau`` (``mode="absolute"``, the paper's convention on the raw covariance)
    or ``< tau * lambda_max`` (``mode="relative"``). Raises ValueError naming the spectrum bounds
    if the kept space is empty (tau too small), or if it is the whole space (tau too large: P = I
    preserves nothing) unless ``allow_full``.
    """
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"C must be square, got shape {C.shape}")
    if not np.allclose(C, C.T, rtol=1e-10, atol=1e-12 * max(np.abs(C).max(), _TINY)):
        raise ValueError("C must be symmetric (an uncentered covariance K0 K0^T)")
    if mode not in ("absolute", "relative"):
        raise ValueError(f"mode must be 'absolute' or 'relative', got {mode!r}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    evals, evecs = np.linalg.eigh(0.5 * (C + C.T))
    lo, hi = float(evals[0]), float(evals[-1])
    cut = tau if mode == "absolute" else tau * hi
    keep = evals < cut
    k = int(keep.sum())
    if k == 0:
        raise ValueError(
            f"empty null space: {mode} tau={tau:g} (cutoff {cut:.3g}) is below every eigenvalue of C "
            f"(spectrum [{lo:.3g}, {hi:.3g}]); raise tau above {lo:.3g}"
            + (f" (relative: above {lo / hi:.3g})" if mode == "relative" and hi > 0 else "")
        )
    if k == C.shape[0] and not allow_full:
        raise ValueError(
            f"null space is the whole space: {mode} tau={tau:g} (cutoff {cut:.3g}) exceeds every eigenvalue "
            f"of C (spectrum [{lo:.3g}, {hi:.3g}]), so P = I protects nothing; lower tau below {hi:.3g}"
        )
    U = evecs[:, keep]  # (d, k)
    return U @ U.T


def alphaedit_update(
    R: Float[np.ndarray, "d_out n"], K: Float[np.ndarray, "d_in n"], P: Float[np.ndarray, "d_in d_in"],
    K_past: Float[np.ndarray, "d_in n_past"] | None = None,
) -> Float[np.ndarray, "d_out d_in"]:
    """Eq. (alphaedit-update): ``R K^T P (K_past K_past^T P + K K^T P + I)^-1``, P the projector.

    Since ``(X P + I) K0 = K0`` when ``P K0 = 0``, the update satisfies ``dW K0 = R K^T P K0 = 0``.
    """
    R, K, P = (np.asarray(x, dtype=np.float64) for x in (R, K, P))
    d = P.shape[0]
    X = K @ K.T
    if K_past is not None:
        K_past = np.asarray(K_past, dtype=np.float64)
        X = X + K_past @ K_past.T
    M = X @ P + np.eye(d)  # (d_in, d_in), not symmetric
    B = R @ K.T @ P  # (d_out, d_in)
    return np.linalg.solve(M.T, B.T).T


def alphaedit_exact_check(
    rng: np.random.Generator, n_instances: int, max_d: int = 12, rel_tau: float = 1e-10
) -> pd.DataFrame:
    """Remark 1 (ii): ``dW K0 = 0`` with the exact null-space projector of a rank-deficient C.

    Per instance: d in [3, max_d], K0 (d, n0) with n0 < d columns of norm O(1), C = K0 K0^T,
    P from :func:`null_space_projector` at relative threshold ``rel_tau`` (just above float noise),
    m new keys, optional K_past. Columns include ``max_abs_K0`` = max |dW K0| and ``max_abs_PK0``.
    """
    rows = []
    for i in range(n_instances):
        d = int(rng.integers(3, max_d + 1))
        n0 = int(rng.integers(1, d))
        d_out = int(rng.integers(1, max_d + 1))
        m = int(rng.integers(1, d + 1))
        K0 = rng.standard_normal((d, n0)) / math.sqrt(d)  # (d, n0)
        C = K0 @ K0.T
        P = null_space_projector(C, rel_tau, mode="relative")
        K = rng.standard_normal((d, m)) / math.sqrt(d)
        R = rng.standard_normal((d_out, m))
        K_past = rng.standard_normal((d, int(rng.integers(1, d + 1)))) / math.sqrt(d) if i % 2 else None
        dW = alphaedit_update(R, K, P, K_past=K_past)
        rows.append(
            {
                "instance": i,
                "d": d,
                "n0": n0,
                "d_out": d_out,
                "m": m,
                "with_K_past": K_past is not None,
                "null_dim": int(round(np.trace(P))),
                "max_abs_K0": float(np.abs(dW @ K0).max()),
                "max_abs_PK0": float(np.abs(P @ K0).max()),
                "norm_dW": float(np.linalg.norm(dW)),
            }
        )
    return pd.DataFrame(rows)


def decaying_spectrum_keys(
    rng: np.random.Generator, d: int = 48, top: float = 1.0, bottom: float = 1e-7
) -> Float[np.ndarray, "d d"]:
    """Keys K0 with ``K0 K0^T = C`` exactly, C full rank with eigenvalues log-spaced in [bottom, top]."""
    q = _orthogonal(rng, d)
    eig = np.logspace(math.log10(top), math.log10(bottom), d)
    return (q * np.sqrt(eig)) @ _orthogonal(rng, d)


def alphaedit_tau_curve(
    rng: np.random.Generator,
    taus: Sequence[float] | Float[np.ndarray, " points"] | None = None,
    d: int = 48,
    d_out: int = 16,
    m: int = 4,
    top: float = 1.0,
    bottom: float = 1e-7,
) -> pd.DataFrame:
    """Leak of AlphaEdit vs the absolute threshold tau for a full-rank C with decaying spectrum.

    C = K0 K0^T has eigenvalues log-spaced over [bottom, top] (many tiny ones spanning several
    decades), so no exact null space exists and tau decides what is "null". Rows: ``tau``,
    ``null_dim`` (eigenvalues < tau), ``residual`` = ||dW K0||_F / (||dW||_F ||K0||_F),
    ``max_eig_kept``, ``paper_grid`` (tau in the paper's grid). tau outside (bottom, top) is
    skipped with a log message (empty or full null space).
    """
    grid = np.asarray(PAPER_TAU_GRID)
    if taus is None:
        taus = np.unique(np.concatenate([np.logspace(-6.5, -0.5, 25), grid]))
    K0 = decaying_spectrum_keys(rng, d, top, bottom)
    C = K0 @ K0.T
    evals = np.linalg.eigvalsh(C)
    K = rng.standard_normal((d, m)) / math.sqrt(d)
    R = rng.standard_normal((d_out, m))
    rows = []
    for tau in np.sort(np.asarray(taus, dtype=np.float64)):
        try:
            P = null_space_projector(C, float(tau), mode="absolute")
        except ValueError as err:
            log.info("skipping tau=%g: %s", tau, err)
            continue
        dW = alphaedit_update(R, K, P)
        kept = evals[evals < tau]
        rows.append(
            {
                "tau": float(tau),
                "null_dim": int(kept.size),
                "max_eig_kept": float(kept.max()),
                "residual": float(np.linalg.norm(dW @ K0) / (np.linalg.norm(dW) * np.linalg.norm(K0))),
                "paper_grid": bool(np.isclose(tau, grid, rtol=1e-9).any()),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Lemma 2 and eq. (jsd-bound)
# ---------------------------------------------------------------------------------------------


def jsd(p: Float[np.ndarray, " support"], q: Float[np.ndarray, " support"], base: float = math.e) -> float:
    """Jensen-Shannon *divergence* ``0.5 KL(p||m) + 0.5 KL(q||m)``, m = (p+q)/2, in log ``base``.

    Uses ``scipy.special.kl_div`` (elementwise ``x log(x/y) - x + y >= 0``), which is accurate
    for near-identical p, q; the ``-x + y`` terms cancel exactly in the symmetric sum.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    mix = 0.5 * (p + q)
    nats = 0.5 * float(kl_div(p, mix).sum()) + 0.5 * float(kl_div(q, mix).sum())
    return max(nats, 0.0) / math.log(base)


def tv(p: Float[np.ndarray, " support"], q: Float[np.ndarray, " support"]) -> float:
    """Total variation ``0.5 ||p - q||_1``."""
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def second_moment(
    p: Float[np.ndarray, " support"], phi: Float[np.ndarray, "support d"]
) -> Float[np.ndarray, "d d"]:
    """``Sigma(p) = sum_x p_x phi_x phi_x^T`` (eq. (kfac) input factor)."""
    return (phi * p[:, None]).T @ phi


_LEMMA2_FAMILIES = ("dirichlet", "near", "disjoint", "one_point", "sphere", "orthogonal_pair")


def _lemma2_instance(
    rng: np.random.Generator, family: str
) -> tuple[Float[np.ndarray, " support"], Float[np.ndarray, " support"], Float[np.ndarray, "support d"]]:
    """(p, q, phi) for one adversarial family."""
    n, d = int(rng.integers(2, 40)), int(rng.integers(1, 9))
    phi = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0)
    alpha = float(10 ** rng.uniform(-1, 1))
    p, q = rng.dirichlet(np.full(n, alpha)), rng.dirichlet(np.full(n, alpha))
    if family == "near":  # near-identical: q = p (1 + eps z), the Pinsker step is tight here
        p = rng.dirichlet(np.full(n, 5.0))
        eps = float(10 ** rng.uniform(-4, -1))
        z = rng.choice([-1.0, 1.0], n)
        z[:2] = 1.0, -1.0  # both signs, so the perturbation survives normalisation
        q = p * (1.0 + eps * (z - p @ z))  # sums to 1 up to rounding; > 0 since eps <= 0.1
        q /= q.sum()
    elif family == "disjoint":
        cut = int(rng.integers(1, n))
        p[cut:], q[:cut] = 0.0, 0.0
        p, q = p / p.sum(), q / q.sum()
    elif family == "one_point":  # phi concentrated on one support point
        phi = rng.standard_normal((n, d)) * 1e-3
        phi[int(rng.integers(n))] = rng.standard_normal(d)
    elif family == "sphere":  # every feature at norm M
        phi /= np.linalg.norm(phi, axis=1, keepdims=True)
    elif family == "orthogonal_pair":  # extremal for the Frobenius norm: two orthogonal unit features
        d = max(d, 2)
        eps = float(10 ** rng.uniform(-4, -0.31))
        p, q = np.array([0.5 + eps, 0.5 - eps]), np.array([0.5 - eps, 0.5 + eps])
        phi = _orthogonal(rng, d)[:2] * rng.uniform(0.1, 3.0)
    return p, q, phi


def lemma2_check(rng: np.random.Generator, n_instances: int) -> pd.DataFrame:
    """Lemma 2 (eq. (tv-lipschitz)) and eq. (jsd-bound) on random discrete p, q with features phi.

    Families cycle over ``dirichlet``, ``near`` (q a small perturbation of p), ``disjoint``
    supports, ``one_point`` (phi concentrated on one point), ``sphere`` (all ||phi_x|| = M) and
    ``orthogonal_pair`` (two orthogonal features of equal norm, the extremal case).

    Columns: ``ratio_tv`` = ||Sigma(p)-Sigma(q)||_F / (2 M^2 TV) (Lemma 2 holds iff <= 1);
    ``ratio_jsd`` = ||.||_F / (2 sqrt(2) M^2 sqrt(JSD_nats)) (eq. (jsd-bound), JSD divergence in nats);
    ``ratio_jsd_bits``, ``ratio_jsd_dist`` the same with JSD in bits / as the distance sqrt(JSD_nats);
    ``pinsker_nats``/``pinsker_bits``/``pinsker_dist`` = TV / sqrt(2 JSD) under each convention;
    ``ratio_tv_sharp`` = ||.||_F / (sqrt(2) M^2 TV). The sharp constant: writing
    Sigma(p) - Sigma(q) = P+ - P- with P+- PSD and tr P+- <= M^2 TV, and <P+, P-> >= 0,
    ||P+ - P-||_F^2 <= ||P+||_F^2 + ||P-||_F^2 <= 2 M^4 TV^2, so ratio_tv <= 1/sqrt(2) always and the
    orthogonal pair attains it: Lemma 2 holds with slack sqrt(2) in the Frobenius norm.
    """
    rows = []
    for i in range(n_instances):
        family = _LEMMA2_FAMILIES[i % len(_LEMMA2_FAMILIES)]
        p, q, phi = _lemma2_instance(rng, family)
        t = tv(p, q)
        if t < 1e-12:  # p = q up to rounding: both sides of the bound are float noise
            log.info("lemma2_check: skipping instance %d (TV=%.1e)", i, t)
            continue
        M = float(np.linalg.norm(phi, axis=1).max())
        fro = float(np.linalg.norm(second_moment(p, phi) - second_moment(q, phi)))
        j_nats, j_bits = jsd(p, q), jsd(p, q, base=2.0)
        j_dist = math.sqrt(j_nats)
        rows.append(
            {
                "instance": i,
                "family": family,
                "n": p.size,
                "d": phi.shape[1],
                "M": M,
                "tv": t,
                "jsd_nats": j_nats,
                "jsd_bits": j_bits,
                "fro_diff": fro,
                "ratio_tv": fro / (2 * M**2 * t),
                "ratio_tv_sharp": fro / (math.sqrt(2) * M**2 * t),
                "ratio_jsd": fro / (2 * math.sqrt(2) * M**2 * math.sqrt(j_nats)),
                "ratio_jsd_bits": fro / (2 * math.sqrt(2) * M**2 * math.sqrt(j_bits)),
                "ratio_jsd_dist": fro / (2 * math.sqrt(2) * M**2 * math.sqrt(j_dist)),
                "pinsker_nats": t / math.sqrt(2 * j_nats),
                "pinsker_bits": t / math.sqrt(2 * j_bits),
                "pinsker_dist": t / math.sqrt(2 * j_dist),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# everything at once
# ---------------------------------------------------------------------------------------------


def run_all(seed: int = 0, n_instances: int = 1000, max_d: int = 8) -> dict[str, object]:
    """All checks, deterministic by ``seed``; headline numbers plus tidy tables for plotting.

    Headline keys (targets): ``prop1_max_rel_err`` (<= 1e-9), ``memit_limit_slope`` (~1),
    ``alphaedit_max_abs_K0`` (<= 1e-9), ``lemma2_max_ratio`` (<= 1; sharp value 1/sqrt(2)),
    ``jsd_bound_max_ratio`` (<= 1). Tables: ``prop1``, ``memit_curve`` (with ``in_fit``),
    ``alphaedit_exact``, ``alphaedit_tau``, ``lemma2``; plus ``nonuniqueness``, ``memit_fit``,
    ``pinsker_max`` (max TV/sqrt(2 JSD) per convention), ``kron_convention_error``, ``seconds``.

    Raises ``ValueError`` with the valid range for an impossible parameter, before any computation.
    """
    for name, value, low in (("seed", seed, 0), ("n_instances", n_instances, 1), ("max_d", max_d, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    t0 = time.perf_counter()
    r_prop, r_non, r_memit, r_ae, r_tau, r_lem, r_kron = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7)
    )
    prop1 = check_prop1(r_prop, n_instances, max_d=max_d)
    curve = memit_limit_curve(r_memit)
    slope, intercept, mask = fit_loglog(curve["lam"], curve["rel_err"])
    curve["in_fit"] = mask
    ae = alphaedit_exact_check(r_ae, n_instances)
    tau = alphaedit_tau_curve(r_tau)
    lem = lemma2_check(r_lem, n_instances)
    out: dict[str, object] = {
        "prop1_max_rel_err": float(prop1["rel_err"].max()),
        "memit_limit_slope": slope,
        "alphaedit_max_abs_K0": float(ae["max_abs_K0"].max()),
        "lemma2_max_ratio": float(lem["ratio_tv"].max()),
        "jsd_bound_max_ratio": float(lem["ratio_jsd"].max()),
        "prop1": prop1,
        "memit_curve": curve,
        "memit_fit": {"slope": slope, "intercept": intercept},
        "alphaedit_exact": ae,
        "alphaedit_tau": tau,
        "lemma2": lem,
        "nonuniqueness": nonuniqueness_example(r_non),
        "pinsker_max": {c: float(lem[f"pinsker_{c}"].max()) for c in ("nats", "bits", "dist")},
        "lemma2_max_ratio_sharp": float(lem["ratio_tv_sharp"].max()),
        "kron_convention_error": kron_convention_error(r_kron),
    }
    out["seconds"] = time.perf_counter() - t0
    log.info("run_all(seed=%d, n_instances=%d) took %.1f s", seed, n_instances, out["seconds"])
    return out
