"""Chapter 06, "Which layers carry a fact?": causal tracing (appendix C.4) as the chapter presents it.

:mod:`moir_lib.tracing` measures the indirect effect of restoring each (layer, position); this module
turns a :class:`~moir_lib.tracing.TraceResult` into the chapter's ``summary.json`` headline
(:func:`headline`: the chosen window, the peak, validity), the paper's summary table with this run
added (:func:`paper_comparison`, :data:`PAPER_RESULTS`) and the closing paragraphs (:func:`findings`),
and writes the results (:func:`write`: the summary and the tidy tables, for the chapter and for
``moir trace`` alike).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.results import write_results
from moir_lib.tracing import VALID_MARGIN, TraceResult

if TYPE_CHECKING:
    from jaxtyping import Float

#: The chapter's run directory name (``summary.json``'s ``chapter``).
CHAPTER = "06_causal_tracing"
#: Appendix C.4, Table "Summary of causal tracing results" (instruct models): layers, valid/100,
#: peak layer, peak IE, edit target.
PAPER_RESULTS: dict[str, dict[str, Any]] = {
    "OLMo2-7B-Instruct": {"n_layers": 32, "valid": 51, "peak_layer": 12, "peak_ie": 0.308,
                          "window": (9, 14)},
    "Llama-3.1-8B-Instruct": {"n_layers": 32, "valid": 58, "peak_layer": 4, "peak_ie": 0.338,
                              "window": (3, 8)},
    "Qwen3-8B": {"n_layers": 36, "valid": 41, "peak_layer": 14, "peak_ie": 1.115, "window": (12, 17)},
}


def headline(result: TraceResult, window_length: int, profile_layers: Sequence[int] = ()) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline of a :class:`~moir_lib.tracing.TraceResult`: the chosen
    window of ``window_length`` layers, the peak, validity counts, agreement with ``profile_layers``.

    With no valid prompt, ``window`` is empty and the peak and sums are ``None``.
    """
    curve = result.layer_curve().dropna(subset=["ie"])
    window = result.window(window_length)
    peak = curve.loc[curve["ie"].idxmax()] if len(curve) else None
    profile_layers = [int(x) for x in profile_layers]
    return {
        "window": window,
        "window_ie_sum": float(curve.set_index("layer").loc[window, "ie"].sum()) if window else None,
        "peak_layer": int(peak["layer"]) if peak is not None else None,
        "peak_ie": float(peak["ie"]) if peak is not None else None,
        "n_valid": result.n_valid,
        "n_prompts": result.n_prompts,
        "n_layers": result.n_layers,
        "profile_layers": profile_layers,
        "agrees_with_profile": window == profile_layers,
        "overlap_with_profile": len(set(window) & set(profile_layers)),
        "max_effect_before_subject": result.max_effect_before_subject(),
        "layer_ie": _floats(result.layer_curve()["ie"]),
        "last_token_layer_ie": _floats(result.last_token_curve()["ie"]),
        "mean_p_clean": float(result.prompts["p_clean"].mean()),
        "mean_p_corrupted": float(result.prompts["p_corrupted"].mean()),
        "clean_top1_accuracy": float(result.prompts["correct"].mean()),
        "noise_std": result.noise_std,
        "noise_sigma": result.noise_std * result.noise_scale,
        "seconds": result.seconds,
    }


def write(out_dir: str | os.PathLike[str], result: TraceResult, head: dict[str, Any],
          parameters: dict[str, Any]) -> Path:
    """The chapter's results in ``out_dir``: the tidy tables ``trace_prompts``, ``trace_scores`` and
    ``trace_aligned`` (parquet) and ``summary.json`` with ``head``; returns the summary's path."""
    tables = {"trace_prompts": result.prompts, "trace_scores": result.scores,
              "trace_aligned": result.aligned()}
    return write_results(out_dir, CHAPTER, head, parameters, tables=tables, table_format="parquet")


def paper_comparison(headline: dict[str, Any], name: str) -> pd.DataFrame:
    """The paper's summary table (appendix C.4, instruct models) with this run as the last row.

    Columns: ``model, layers, valid, peak_layer, peak_ie, edit_target`` (``valid`` as "k/n").
    """
    rows = [{"model": f"{m} (paper)", "layers": r["n_layers"], "valid": f"{r['valid']}/100",
             "peak_layer": r["peak_layer"], "peak_ie": r["peak_ie"],
             "edit_target": f"{r['window'][0]}–{r['window'][1]}"} for m, r in PAPER_RESULTS.items()]
    window = list(headline["window"])
    rows.append({"model": f"{name} (this run)", "layers": headline["n_layers"],
                 "valid": f"{headline['n_valid']}/{headline['n_prompts']}",
                 "peak_layer": headline["peak_layer"], "peak_ie": headline["peak_ie"],
                 "edit_target": _layers(window)})
    return pd.DataFrame(rows)


def _floats(values: Iterable[Any]) -> list[float | None]:
    """JSON-ready floats, ``None`` for NaN."""
    return [None if v is None or not np.isfinite(v) else float(v) for v in values]


def _layers(layers: Sequence[int]) -> str:
    layers = list(layers)
    if not layers:
        return "none"
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 1:
        return f"{layers[0]}–{layers[-1]}"
    return ", ".join(map(str, layers))


def _curve_shape(h: dict[str, Any]) -> str:
    """Sentences on the shape of the last-subject curve and the last-token curve (below the last layer)."""

    def below_last(key: str) -> Float[np.ndarray, " layers-1"]:
        return np.array([np.nan if v is None else v for v in h.get(key, [])], dtype=float)[:-1]

    curve, late = below_last("layer_ie"), below_last("last_token_layer_ie")
    if curve.size < 2 or not np.isfinite(curve).all():
        return ""
    if np.all(np.diff(curve) <= 1e-12):
        text = (f" Below the last layer the curve only falls with depth ({curve[0]:.3f} at layer 0 to "
                f"{curve[-1]:.3f} at layer {curve.size - 1}), with no mid-depth hump like the paper's.")
    elif 0 < int(np.argmax(curve)) < curve.size - 1:
        text = " The curve rises to a peak inside the stack and falls again, the shape the paper reports."
    else:
        text = f" Below the last layer the curve spans {curve.min():.3f}–{curve.max():.3f}."
    if late.size and np.isfinite(late).all():
        text += (f" Restoring the prompt's *last* token instead recovers {late.min():.2f}–{late.max():.2f} "
                 f"below the last layer (exactly 1 at the last layer, by construction)")
        text += (": more of the fact reaches the answer position after the subject than through the last "
                 "subject token." if late.mean() > curve.max() else ".")
    return text


def findings(headline: dict[str, Any], top: pd.DataFrame | None = None) -> str:
    """The chapter's closing paragraphs, written from a :func:`headline` (Markdown)."""
    h = headline
    n_layers, window, prof = int(h["n_layers"]), list(h["window"]), list(h["profile_layers"])
    share = 100 * h["n_valid"] / max(h["n_prompts"], 1)
    paper = list(PAPER_RESULTS.values())
    lo_v, hi_v = min(p["valid"] for p in paper), max(p["valid"] for p in paper)
    compare_valid = ("within" if lo_v <= share <= hi_v else "above" if share > hi_v else "below")
    parts = [
        f"*Valid prompts.* {h['n_valid']} of {h['n_prompts']} prompts ({share:.0f}%) lose more than "
        f"{VALID_MARGIN} of the answer's probability when the subject is noised (mean "
        f"$P_\\text{{clean}}$ {h['mean_p_clean']:.2f}, mean $P_\\text{{corrupted}}$ "
        f"{h['mean_p_corrupted']:.2f}; the clean top-1 token is the answer for "
        f"{h['clean_top1_accuracy']:.0%} of prompts). That is {compare_valid} the paper's {lo_v}–{hi_v} "
        f"valid prompts of 100 for its instruct models.",
    ]
    if h["peak_layer"] is None:
        parts.append("*No window.* Without a valid prompt there is no indirect effect to average: this "
                     "model does not recall these facts confidently enough to trace them, so the profile's "
                     f"edit layers ({_layers(prof)}) stay as they are. Trace facts the model knows, or more "
                     "of them.")
    else:
        depth = (h["peak_layer"] + 0.5) / n_layers
        depths = [(p["peak_layer"] + 0.5) / p["n_layers"] for p in paper]
        band = f"{min(depths):.0%}–{max(depths):.0%} of the depth"
        lo_ie, hi_ie = min(p["peak_ie"] for p in paper), max(p["peak_ie"] for p in paper)
        if depth > max(depths):
            where = (f"deeper than the paper's peaks ({band}): with {n_layers} layers there is little room "
                     f"between reading the subject and writing the answer")
        elif depth < min(depths):
            where = f"shallower than the paper's peaks ({band})"
        else:
            where = f"in the same band as the paper's peaks ({band})"
        if h["agrees_with_profile"]:
            verdict = "which agrees."
        else:
            verdict = (f"which **differs** ({h['overlap_with_profile']} of {len(window)} layers shared); "
                       f"`moir trace --write-profile` writes the traced window into the profile.")
        shape = _curve_shape(h)
        parts += [
            f"*Where the fact flows.* Restoring the residual stream at the last subject token has its "
            f"largest average indirect effect at layer {h['peak_layer']} of {n_layers} "
            f"(IE {h['peak_ie']:.3f}; the paper reports peaks of {lo_ie:.2f}–{hi_ie:.2f} on 32–36-layer "
            f"models). The peak sits at {depth:.0%} of the depth, {where}.{shape}",
            f"*Chosen window.* The {len(window)} contiguous layers with the largest summed IE are "
            f"{_layers(window)} (sum {h['window_ie_sum']:.3f}); the profile edits {_layers(prof)}, {verdict}",
        ]
        if top is not None and len(top):
            parts.append(f"*Top-{len(top)} table.* {int(top['in_window'].sum())} of the top {len(top)} "
                         f"layers fall inside the chosen window.")
    parts.append(f"*Causality check.* Before the subject, restoring any layer can change nothing in a causal "
                 f"model; the largest change of the answer's probability measured there is "
                 f"{h['max_effect_before_subject']:.1e}.")
    return "\n\n".join(parts)
