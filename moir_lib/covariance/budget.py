"""The sample budget of ``C``: how far the editors' updates move when ``C`` averages fewer key vectors.

``C`` is a sum over a corpus, so the ``C`` of its first ``m`` documents is a prefix of the same pass
(:mod:`moir_lib.covariance.prefixes`). Against the whole ``C`` each prefix is measured on what the
editors read of it:

* the **relative change of the update**: for the same requests and the same targets ``z`` (they do not
  depend on ``C``), ``‖ΔW_m − ΔW‖_F / ‖ΔW‖_F`` over the edit layers stacked, ``ΔW`` MEMIT's eq.
  (memit-update) or AlphaEdit's eq. (alphaedit-update) as the editors compute it
  (:func:`delta_change`; the updates come from :func:`moir_lib.experiments.budget_curve.deltas`);
* the **principal angles** between the top-``k`` eigenspaces of the prefix's and the whole ``C``,
  ``k`` the directions AlphaEdit protects in the whole ``C`` at τ
  (:func:`~moir_lib.covariance.convergence.protected_rank`), summarised as the gap
  ``(1/k) Σ sin² θ_i`` and the largest angle (:func:`~moir_lib.covariance.convergence.subspace_gap`);
* AlphaEdit's **null-space dimension** at τ of the prefix, beside the whole's.

Sizes are key vectors per key dimension (keys counted / ``d``): the scale on which a 7B model's budget
reads the same as the pocket model's (Gupta et al. 2025 report ≈ 10 × ``d``). :func:`compare` measures
one prefix; :func:`needed` reads a curve (one row per prefix with its interval) for the smallest size
whose upper bound is within a tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from moir_lib.covariance.convergence import protected_rank, subspace_gap
from moir_lib.covariance.stats import CovarianceStats

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

__all__ = ["BUDGET_COLUMNS", "METRICS", "compare", "delta_change", "needed"]

#: The curve's measures: the editors' update changes, the subspace gap and largest angle, the null spaces.
METRICS: dict[str, str] = {
    "memit_dW": "MEMIT ‖ΔW − ΔW_full‖ / ‖ΔW_full‖",
    "alphaedit_dW": "AlphaEdit ‖ΔW − ΔW_full‖ / ‖ΔW_full‖",
    "gap": "top-k subspace gap (mean sin²)",
    "max_angle_deg": "largest principal angle (°)",
    "null_dim": "AlphaEdit null-space dimension",
}
#: Columns of :func:`compare`'s rows (``layer`` is -1 for a measure over all the edit layers).
BUDGET_COLUMNS: tuple[str, ...] = ("documents", "keys", "keys_per_dim", "metric", "layer", "value")


def delta_change(delta: Mapping[int, Float[torch.Tensor, "d_out d_in"]],
                 reference: Mapping[int, Float[torch.Tensor, "d_out d_in"]]) -> float:
    """``‖ΔW − ΔW_ref‖_F / ‖ΔW_ref‖_F`` over the layers of ``reference`` stacked (NaN when ``ΔW_ref = 0``:
    an AlphaEdit whose null space is empty edits nothing)."""
    if set(delta) != set(reference):
        raise ValueError(f"updates of layers {sorted(delta)} against {sorted(reference)}: the same layers")
    num = sum(float((delta[k].double() - reference[k].double()).pow(2).sum()) for k in reference)
    den = sum(float(reference[k].double().pow(2).sum()) for k in reference)
    return math.sqrt(num / den) if den > 0 else math.nan


def compare(prefix: CovarianceStats, whole: CovarianceStats, *, documents: int, tau: float,
            tau_mode: str = "absolute", updates: Mapping[str, tuple[Mapping[int, Any], Mapping[int, Any]]]
            | None = None, layers: Sequence[int] | None = None) -> pd.DataFrame:
    """One prefix (of ``documents`` documents) against the whole ``C``: rows of :data:`BUDGET_COLUMNS`.

    Per layer the subspace gap and largest angle at AlphaEdit's protected rank of the whole (τ,
    ``tau_mode``), and the null-space dimension of the prefix (``null_dim``) and of the whole
    (``null_dim_full``); ``updates``: ``{editor: (ΔW of the prefix, ΔW of the whole)}`` per layer, whose
    :func:`delta_change` is the row ``<editor>_dW`` (layer -1)."""
    rows = []
    keys = prefix.n_tokens
    base = {"documents": int(documents), "keys": int(keys), "keys_per_dim": keys / prefix.dim}
    for layer in layers if layers is not None else whole.layers:
        c, cm = whole.mean(layer).cpu(), prefix.mean(layer).cpu()
        k, null_full = protected_rank(c, tau, tau_mode)
        gap, angle = subspace_gap(cm, c, k)
        rows += [{**base, "metric": "gap", "layer": int(layer), "value": gap},
                 {**base, "metric": "max_angle_deg", "layer": int(layer), "value": angle},
                 {**base, "metric": "null_dim", "layer": int(layer), "value": float(protected_rank(cm, tau,
                                                                                                   tau_mode)[1])},
                 {**base, "metric": "null_dim_full", "layer": int(layer), "value": float(null_full)}]
    for editor, (delta, reference) in (updates or {}).items():
        rows.append({**base, "metric": f"{editor}_dW", "layer": -1, "value": delta_change(delta, reference)})
    return pd.DataFrame(rows, columns=list(BUDGET_COLUMNS))


def needed(curve: pd.DataFrame, tolerance: float, *, upper: str = "hi", size: str = "keys_per_dim"
           ) -> float | None:
    """The smallest ``size`` of ``curve`` (one measure: rows with ``size`` and ``upper``, the interval's
    upper end) whose upper end is within ``tolerance``, and every larger one's too (a curve that dips and
    rises again is not yet settled); ``None`` when no prefix is."""
    c = curve.sort_values(size)
    ok = (c[upper] <= tolerance).to_numpy()
    if not ok.size or not ok[-1]:
        return None
    first = len(ok) - 1
    while first > 0 and ok[first - 1]:
        first -= 1
    return float(c[size].iloc[first])
