"""Chapter 04, "Does C alone determine the edit?": the numerical proof check as the chapter presents it.

:func:`moir_lib.theory.run_all` checks Proposition 1 (eq. (rome-objective)), Remark 1 (eq.
(memit-update), eq. (alphaedit-update)) and Lemma 2 (eq. (tv-lipschitz), eq. (jsd-bound)) on random
instances; :func:`headline` picks the chapter's ``summary.json`` headline from its result and
:func:`findings` writes the closing paragraph from it.
"""

from __future__ import annotations

from typing import Any

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "04_g_cancellation"
#: The numbers of :func:`~moir_lib.theory.run_all` that make the headline, with their targets there.
HEADLINE_KEYS: tuple[str, ...] = ("prop1_max_rel_err", "memit_limit_slope", "alphaedit_max_abs_K0",
                                  "lemma2_max_ratio", "jsd_bound_max_ratio")


def headline(res: dict[str, Any]) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline: :data:`HEADLINE_KEYS` of a :func:`~moir_lib.theory.run_all`
    result."""
    return {k: res[k] for k in HEADLINE_KEYS}


def findings(res: dict[str, object], n_instances: int) -> str:
    """The chapter's closing paragraph, written from the numbers of :func:`~moir_lib.theory.run_all`
    (Markdown)."""
    prop1, tau, lem = res["prop1"], res["alphaedit_tau"], res["lemma2"]
    non, pinsker = res["nonuniqueness"], res["pinsker_max"]
    err, slope = float(res["prop1_max_rel_err"]), float(res["memit_limit_slope"])
    k0, r_tv, r_jsd = (float(res[k]) for k in
                       ("alphaedit_max_abs_K0", "lemma2_max_ratio", "jsd_bound_max_ratio"))
    n_def = int((prop1["g_class"] == "rank-deficient").sum())
    on_grid = tau[tau["paper_grid"]]
    verdict = lambda ok: "holds" if ok else "**fails**"  # noqa: E731
    parts = [
        f"*Proposition 1 {verdict(err <= 1e-9)}.* Over {len(prop1)} instances ({n_def} with rank-deficient "
        f"$G$) the direct KKT solve and the closed form agree to a largest relative error of {err:.1e}; two "
        f"different positive-definite $G$ give the same update to {float(prop1['g_indep'].max()):.1e}. With "
        f"singular $G$ the minimiser is not unique: adding a $\\delta W$ of norm "
        f"{float(non['norm_delta']):.2f} changed the objective by a relative "
        f"{float(non['obj_rel_diff']):.1e}.",
        f"*Remark 1 (i) {verdict(0.9 <= slope <= 1.1)}.* MEMIT's update approaches the $A = C$ closed form "
        f"with log-log slope {slope:.3f} in $\\lambda$, i.e. linearly.",
        f"*Remark 1 (ii) {verdict(k0 <= 1e-9)}.* With the exact null space, the largest entry of "
        f"$|\\Delta W K_0|$ over {n_instances} instances is {k0:.1e}. With a full-rank $C$ whose spectrum "
        f"decays over seven decades, the paper's thresholds $\\tau \\in$ "
        f"[{on_grid['tau'].min():g}, {on_grid['tau'].max():g}] let a relative "
        f"{on_grid['residual'].min():.1e}–{on_grid['residual'].max():.1e} of $\\Delta W K_0$ through: "
        f"a larger $\\tau$ buys more room for edits at the cost of protection.",
        f"*Lemma 2 and eq. (jsd-bound) {verdict(r_tv <= 1 and r_jsd <= 1)}.* The largest ratio of the left "
        f"side to the bound is {r_tv:.4f} for the TV form and {r_jsd:.4f} for the JSD form. "
        f"Neither comes near 1: the constant $2M^2$ is loose by $\\sqrt{{2}}$ for the Frobenius norm "
        f"(the ratio against $\\sqrt{{2}}M^2\\,\\mathrm{{TV}}$ reaches "
        f"{float(lem['ratio_tv_sharp'].max()):.4f}). The Pinsker-type "
        f"step $\\mathrm{{TV}} \\le \\sqrt{{2\\,\\mathrm{{JSD}}}}$ holds with JSD the *divergence in nats*, "
        f"where it is tight (largest ratio {pinsker['nats']:.4f}); in bits ({pinsker['bits']:.3f}) or "
        f"with the distance $\\sqrt{{\\mathrm{{JSD}}}}$ ({pinsker['dist']:.3f}) it holds more loosely.",
    ]
    return "\n\n".join(parts)
