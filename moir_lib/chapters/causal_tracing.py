"""Chapter 06, "Which layers carry a fact?": causal tracing (appendix C.4) as the chapter presents it.

:mod:`moir_lib.tracing` measures the indirect effect of restoring each (layer, position); this module
traces each pocket organism of the chapter (:func:`trace_organisms`: one model of the recipe each, an
organism traced by an earlier run with the same prompts, settings and weights read back from it), pools
them (:func:`pooled`: every organism's traced facts together, so that one organism gives its own
result), turns the pooled :class:`~moir_lib.tracing.TraceResult` into the chapter's ``summary.json``
headline (:func:`headline`: the chosen window, the peak, validity, and per organism its peak and whether
it falls within the profile's edit layers), the paper's summary table with this run added
(:func:`paper_comparison`, :data:`PAPER_RESULTS`) and the closing paragraphs (:func:`findings`), and
writes the results (:func:`write`: the summary and the tidy tables, for the chapter and for ``moir
trace`` alike).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moir_lib.results import SUMMARY_NAME, write_results
from moir_lib.tracing import PAPER_TRACE, VALID_MARGIN, TracePrompt, TraceResult, TraceSettings

if TYPE_CHECKING:
    from jaxtyping import Float

    from moir_lib.profiles import Profile

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class OrganismTrace:
    """One organism's trace: its :class:`~moir_lib.tracing.TraceResult`, the SHA-256 of the traced weights
    (a pocket organism's, ``None`` for another model) and the run it was read back from (``None``: traced
    here)."""

    organism: int
    result: TraceResult
    weights_sha256: str | None = None
    reused: str | None = None


def _weights(profile: Profile, organism: int) -> str | None:
    """The SHA-256 of organism ``organism``'s weights as built on this machine (pocket models), else None."""
    from moir_lib.models import POCKET_SPECS
    from moir_lib.pocket import provenance

    variant = POCKET_SPECS.get(profile.model)
    built = provenance(variant, organism) if variant else None
    return built.weights_sha256 if built else None


def trace_organisms(profile: Profile, organisms: Sequence[int], prompts: Sequence[TracePrompt],
                    settings: TraceSettings = PAPER_TRACE, *, device: Any = None,
                    reuse: Iterable[str | os.PathLike[str]] = (), progress: bool = True
                    ) -> list[OrganismTrace]:
    """Trace ``prompts`` through the model of each of ``organisms`` of ``profile`` in turn (one loaded at a
    time) under ``settings``, or read an organism back from a ``reuse`` run of this chapter that traced it
    with the same prompts, ``n_noise``, ``noise_scale`` and ``seed`` and, where both machines know them,
    the same weights. Organisms other than 0 need a pocket model (checked before anything is traced)."""
    from moir_lib import tracing
    from moir_lib.models import check_organisms, load

    organisms = [int(k) for k in organisms]
    if not organisms or len(set(organisms)) != len(organisms) or min(organisms) < 0:
        raise ValueError(f"organisms {organisms}: give distinct integers >= 0, e.g. [0] or [0, 1, 2]")
    check_organisms(organisms, profile.model)
    recorded = {"n_noise": settings.n_noise, "noise_scale": float(settings.noise_scale),
                "seed": settings.seed}
    traces = []
    for k in organisms:
        own = profile.with_overrides({"organism": k}) if k else profile
        found = _read_back(reuse, k, prompts, recorded, _weights(own, k))
        if found is not None:
            traces.append(found)
            continue
        model, tokenizer, _ = load(own, device=device)
        result = tracing.trace(model, tokenizer, prompts, settings, progress=progress)
        del model
        traces.append(OrganismTrace(k, result, _weights(own, k)))
    return traces


def _read_back(reuse: Iterable[str | os.PathLike[str]], organism: int, prompts: Sequence[TracePrompt],
               settings: dict[str, Any], weights: str | None) -> OrganismTrace | None:
    """Organism ``organism``'s trace from the first ``reuse`` run holding it under ``settings``, the same
    ``prompts`` and (when both are known) ``weights``, else ``None``."""
    wanted = [(p.prompt, p.subject, p.answer) for p in prompts]
    for run in map(Path, reuse):
        summary = run / SUMMARY_NAME
        if not summary.is_file():
            raise ValueError(f"reuse path {run} holds no {SUMMARY_NAME}: give a run directory of this "
                             f"chapter")
        meta = {o["organism"]: o for o in json.loads(summary.read_text())["headline"].get("organisms", [])}
        entry = meta.get(organism)
        if entry is None or any(entry.get(k) != v for k, v in settings.items()):
            continue
        if weights and entry.get("weights_sha256") not in (None, weights):
            log.info("%s traced other weights of organism %d: tracing it again", run, organism)
            continue
        table = pd.read_parquet(run / "trace_prompts.parquet")
        rows = table[table["organism"] == organism]
        if list(rows[["prompt", "subject", "answer"]].itertuples(index=False, name=None)) != wanted:
            continue
        scores = pd.read_parquet(run / "trace_scores.parquet")
        scores = scores[scores["organism"] == organism]
        first = int(rows["prompt_id"].min())
        fields = {f.name: entry[f.name] for f in dataclasses.fields(TraceResult) if f.name in entry}
        result = TraceResult(rows.drop(columns="organism").assign(prompt_id=rows["prompt_id"] - first)
                             .reset_index(drop=True),
                             scores.drop(columns="organism").assign(prompt_id=scores["prompt_id"] - first)
                             .reset_index(drop=True), **fields)
        return OrganismTrace(organism, result, entry.get("weights_sha256"), str(run))
    return None


def pooled(traces: Sequence[OrganismTrace]) -> TraceResult:
    """Every organism's traced prompts in one :class:`~moir_lib.tracing.TraceResult` (an ``organism``
    column first in its tables, prompt ids made distinct): its curves average over every valid prompt of
    every organism, and one organism gives its own result. ``noise_std`` is the organisms' mean (each
    model's subject embeddings have their own spread), ``seconds`` their sum."""
    if not traces:
        raise ValueError("no organism traced: give at least one")
    prompts, scores, offset = [], [], 0
    for t in traces:
        for table, out in ((t.result.prompts, prompts), (t.result.scores, scores)):
            shifted = table.assign(prompt_id=table["prompt_id"] + offset)
            shifted.insert(0, "organism", t.organism)
            out.append(shifted)
        offset += len(t.result.prompts)
    return dataclasses.replace(traces[0].result, prompts=pd.concat(prompts, ignore_index=True),
                               scores=pd.concat(scores, ignore_index=True),
                               noise_std=float(np.mean([t.result.noise_std for t in traces])),
                               seconds=float(sum(t.result.seconds for t in traces)))


def _organism_entry(t: OrganismTrace, window_length: int, profile_layers: list[int]) -> dict[str, Any]:
    """One organism's part of the headline: its window and peak, whether the peak falls within
    ``profile_layers``, and what :func:`_read_back` needs to reuse it."""
    r = t.result
    curve = r.layer_curve()
    valid = curve.dropna(subset=["ie"])
    peak = valid.loc[valid["ie"].idxmax()] if len(valid) else None
    fields = ("n_layers", "noise_std", "noise_scale", "n_noise", "seed", "kind", "seconds", "model_name")
    return {"organism": t.organism, "weights_sha256": t.weights_sha256, "reused_from": t.reused,
            "window": r.window(window_length), "peak_layer": None if peak is None else int(peak["layer"]),
            "peak_ie": None if peak is None else float(peak["ie"]),
            "peak_in_profile": None if peak is None else int(peak["layer"]) in profile_layers,
            "n_valid": r.n_valid, "n_prompts": r.n_prompts, "layer_ie": _floats(curve["ie"]),
            **{f: getattr(r, f) for f in fields}}


def headline(result: TraceResult, window_length: int, profile_layers: Sequence[int] = (),
             organisms: Sequence[OrganismTrace] = ()) -> dict[str, Any]:
    """The chapter's ``summary.json`` headline of a :class:`~moir_lib.tracing.TraceResult` (the organisms'
    :func:`pooled` one): the chosen window of ``window_length`` layers, the peak, validity counts,
    agreement with ``profile_layers``; with ``organisms`` traced, each one's window and peak
    (``organisms``) and whether every organism's peak falls within ``profile_layers``.

    With no valid prompt, ``window`` is empty and the peak and sums are ``None``.
    """
    curve = result.layer_curve().dropna(subset=["ie"])
    window = result.window(window_length)
    peak = curve.loc[curve["ie"].idxmax()] if len(curve) else None
    profile_layers = [int(x) for x in profile_layers]
    entries = [_organism_entry(t, window_length, profile_layers) for t in organisms]
    extra: dict[str, Any] = {}
    if entries:
        extra = {"organisms": entries,
                 "organism_peaks_in_profile": all(e["peak_in_profile"] for e in entries)}
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
        **extra,
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


def _organisms_text(h: dict[str, Any]) -> str:
    """The paragraph on the organisms of a :func:`headline`: each one's peak, and whether every peak falls
    within the profile's edit layers."""
    entries, prof = h["organisms"], list(h["profile_layers"])
    peaks = "; ".join(f"organism {e['organism']} at layer {e['peak_layer']} (IE {e['peak_ie']:.3f})"
                      if e["peak_layer"] is not None else f"organism {e['organism']} without a valid prompt"
                      for e in entries)
    outside = [str(e["organism"]) for e in entries if not e["peak_in_profile"]]
    own = sum(list(e["window"]) == prof for e in entries)
    if not outside:
        verdict = (f"every organism's peak falls within the profile's edit layers ({_layers(prof)}): the "
                   f"recipe, not one draw of it, stores its facts where the editors write")
    else:
        verdict = (f"the peak of organism{'s' if len(outside) > 1 else ''} {', '.join(outside)} falls "
                   f"outside the profile's edit layers ({_layers(prof)}): where a fact is stored depends on "
                   f"the draw of the model, and an edit at those layers reaches less of it there")
    agree = (f"traced alone, {own} of {len(entries)} choose the profile's edit layers as their window"
             if own < len(entries)
             else "each of them, traced alone, chooses the profile's edit layers as its window")
    return (f"*Organisms.* The curve pools {len(entries)} organisms of the pocket recipe (each its own "
            f"weight initialisation and data order, drawn faint in the figure). Their peaks: {peaks}; "
            f"{verdict}. {agree[0].upper()}{agree[1:]}.")


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
        if len(h.get("organisms") or []) > 1:
            parts.append(_organisms_text(h))
        if top is not None and len(top):
            parts.append(f"*Top-{len(top)} table.* {int(top['in_window'].sum())} of the top {len(top)} "
                         f"layers fall inside the chosen window.")
    parts.append(f"*Causality check.* Before the subject, restoring any layer can change nothing in a causal "
                 f"model; the largest change of the answer's probability measured there is "
                 f"{h['max_effect_before_subject']:.1e}.")
    return "\n\n".join(parts)
