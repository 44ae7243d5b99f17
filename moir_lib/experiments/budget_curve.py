"""The sample-budget curve of a chapter's C's on its labs (:mod:`moir_lib.covariance.budget`), with its
intervals.

For every lab (an organism), every C of ``covs`` and every draw ``0 … draws − 1`` of it, each prefix
fraction of the whole ``C`` (``moir[1/4]``: :func:`~moir_lib.covariance.recipes.split_prefix`, taken in
the pass that built it) is compared with the whole: the updates of MEMIT and AlphaEdit for the same
``n_edits`` records of ``edit_sample`` and the same z (the lab's target store), at the strength each
editor uses with the whole ``C``, computed by the editors themselves in the batch regime
(:func:`deltas`); the principal angles and null spaces at AlphaEdit's τ.

**Intervals.** The curve generalises over the corpus behind ``C`` (and, with several organisms, over the
model): each ``(organism, draw)`` is one cell of the multi-level bootstrap
(:mod:`moir_lib.evaluation.bootstrap`) holding one value, and :func:`intervals` gives every point the
interval of :func:`moir_lib.evaluation.inference.compare`, the interval of the book's claims: with one
organism no narrower than the t-interval on its draws, with several than the t-interval on the organisms'
means. A point with one cell has no interval (NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.covariance.budget import compare
from moir_lib.covariance.prefixes import format_fraction, prefix_counts
from moir_lib.covariance.recipes import parse_name, prefix_name
from moir_lib.experiments.specs import ExperimentSpec

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float64

    from moir_lib.experiments.lab import Lab

__all__ = ["CURVE_COLUMNS", "EDITORS", "curve", "deltas", "describe", "halves", "intervals"]

#: The editors whose updates the curve compares.
EDITORS: tuple[str, ...] = ("memit", "alphaedit")
#: Columns of :func:`curve`.
CURVE_COLUMNS: tuple[str, ...] = ("organism", "cov", "draw", "fraction", "documents", "keys", "keys_per_dim",
                                  "metric", "layer", "value")
#: How a per-layer measure becomes one value per cell: the worst layer, or the mean over layers.
_PER_CELL = {"gap": "max", "max_angle_deg": "max", "null_dim": "mean", "null_dim_full": "mean"}
#: The range of each measure: an interval is cut to it (a t-interval on few draws may reach past it).
_RANGE = {"gap": (0.0, 1.0), "max_angle_deg": (0.0, 90.0)}


def deltas(lab: Lab, spec: ExperimentSpec) -> dict[int, Float64[torch.Tensor, "d_out d_in"]]:
    """``ΔW`` per edit layer of the batch edit ``spec`` on ``lab``'s unedited model (its records, context
    templates and z targets, the editor's own layer loop), the weights restored after."""
    from moir_lib.editing.regimes import EditSetup, batch

    if spec.regime != "batch":
        raise ValueError(f"{spec}: the budget curve compares batch updates")
    loaded = lab.unedited()
    editor = lab.editor(spec, allow_empty=True)
    records = lab.edit_records.pool(spec.edit_sample)[:spec.n_edits]
    setup = EditSetup(lab.templates(spec.editor, spec.edit_sample), spec.edit_sample, lab.target_store())
    result = batch(loaded, editor, records, setup, keep_deltas=True)
    result.snapshot.restore()
    return dict(result.outcome.deltas)


def _strength(editor: str, cov: str, strengths: Mapping[str, Mapping[str, float]]) -> dict[str, float | None]:
    value = (strengths.get(editor) or {}).get(cov)
    return {"lambda_": value} if editor == "memit" else {"tau": value}


def curve(labs: Sequence[Lab], covs: Sequence[str], fractions: Sequence[str], *, n_edits: int,
          edit_sample: int = 0, draws: int = 1, strengths: Mapping[str, Mapping[str, float]] | None = None,
          editors: Sequence[str] = EDITORS) -> pd.DataFrame:
    """Rows of :data:`CURVE_COLUMNS`: every prefix fraction of every C of ``covs`` (base names, e.g.
    ``wiki``, ``moir``) against the whole, in every lab and draw; ``strengths``: ``{editor: {C: λ or τ}}``
    (the whole C's; missing: the profile's)."""
    strengths = strengths or {}
    parts = []
    for lab in labs:
        tau_mode = lab.profile.alphaedit.tau_mode
        for cov in covs:
            for draw in range(draws):
                name = cov if draw == 0 else f"{cov}@{draw}"
                whole = lab.covariance(name)
                total = _size(lab, cov)
                ref = {e: deltas(lab, ExperimentSpec(e, "batch", name, n_edits, edit_sample=edit_sample,
                                              **_strength(e, cov, strengths))) for e in editors}
                tau = (strengths.get("alphaedit") or {}).get(cov) or lab.profile.alphaedit.tau
                for fraction, m in prefix_counts(total, fractions).items():
                    pre_name = prefix_name(name, fraction)
                    updates = {e: (deltas(lab, ExperimentSpec(e, "batch", pre_name, n_edits,
                                                              edit_sample=edit_sample,
                                                       **_strength(e, cov, strengths))), ref[e])
                               for e in editors}
                    rows = compare(lab.covariance(pre_name), whole, documents=m, tau=tau, tau_mode=tau_mode,
                                   updates=updates)
                    parts.append(rows.assign(organism=lab.profile.organism, cov=cov, draw=draw,
                                             fraction=format_fraction(fraction)))
    if not parts:
        return pd.DataFrame(columns=list(CURVE_COLUMNS))
    return pd.concat(parts, ignore_index=True)[list(CURVE_COLUMNS)]


def _size(lab: Lab, cov: str) -> int:
    """The documents (``wiki``) or samples (``moir``) the whole C ``cov`` is built from."""
    base, _ = parse_name(cov)
    return lab.cov_settings.n_documents if base == "wiki" else lab.cov_settings.n_samples


def _cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One value per ``(organism, draw)`` cell and measure: per-layer measures by :data:`_PER_CELL`."""
    keys = ["cov", "fraction", "metric", "organism", "draw"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, "value", "keys_per_dim", "documents"])
    how = rows["metric"].map(_PER_CELL).fillna("mean")
    parts = [rows[how == h].groupby(keys, as_index=False).agg(value=("value", h),
                                                              keys_per_dim=("keys_per_dim", "mean"),
                                                              documents=("documents", "mean"))
             for h in ("max", "mean") if (how == h).any()]
    return pd.concat(parts, ignore_index=True)


def intervals(rows: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """Per C, fraction and measure: the mean over cells ``value`` with its 95 % interval ``lo``-``hi``
    (module doc; cut to the measure's range: changes, dimensions and gaps are not negative, a gap is at
    most 1, an angle at most 90°), ``cells``, and the mean ``keys_per_dim`` and ``documents``."""
    from moir_lib.evaluation.bootstrap import Term
    from moir_lib.evaluation.inference import compare as test

    out = []
    for (cov, fraction, metric), g in _cells(rows).groupby(["cov", "fraction", "metric"], sort=False):
        g = g[np.isfinite(g["value"])]
        row = {"cov": cov, "fraction": fraction, "metric": metric, "cells": len(g),
               "keys_per_dim": float(g["keys_per_dim"].mean()), "documents": float(g["documents"].mean()),
               "value": float(g["value"].mean()) if len(g) else np.nan, "lo": np.nan, "hi": np.nan}
        if len(g) >= 2:
            frame = g.assign(sample=0, group="budget", unit=metric, item="C", metric="value")
            est = test(Term(frame[["organism", "sample", "draw", "group", "unit", "item", "metric", "value"]],
                            None, f"budget:{metric}"), seed=seed).estimate
            low, high = _RANGE.get(metric, (0.0, np.inf))
            row.update(value=est.value, lo=max(est.lo, low), hi=min(est.hi, high))
        out.append(row)
    return pd.DataFrame(out, columns=["cov", "fraction", "metric", "cells", "keys_per_dim", "documents",
                                      "value", "lo", "hi"])


def halves(lab: Lab, covs: Sequence[str], fractions: Sequence[str],
           taus: Mapping[str, float] | None = None) -> dict[str, Any]:
    """C -> the split-half :class:`~moir_lib.covariance.convergence.Agreement` of the whole C (draw 0) on
    ``lab``, from its prefix at half (``{}`` unless ``1/2`` is among ``fractions``; a C_Moir whose
    generation a stop rule ends is left out: its halves are the stop rule's); ``taus``: AlphaEdit's τ per
    C (missing: the profile's)."""
    from moir_lib.covariance.convergence import split_half

    if "1/2" not in {format_fraction(f) for f in fractions}:
        return {}
    a = lab.profile.alphaedit
    out = {}
    for cov in covs:
        if parse_name(cov)[0] != "wiki" and lab.cov_settings.until_converged is not None:
            continue
        total = _size(lab, cov)
        m = prefix_counts(total, ["1/2"])["1/2"]
        out[cov] = split_half(lab.covariance(cov), lab.covariance(prefix_name(cov, "1/2")), (m, total),
                              tau=(taus or {}).get(cov) or a.tau, tau_mode=a.tau_mode)
    return out


def describe(rows: pd.DataFrame) -> dict[str, Any]:
    """The curve's settings for ``summary.json``: C's, fractions, cells."""
    if rows.empty:
        return {"covs": [], "fractions": [], "cells": 0}
    return {"covs": sorted(rows["cov"].unique()), "fractions": sorted(rows["fraction"].unique()),
            "cells": int(rows[["organism", "draw"]].drop_duplicates().shape[0])}
