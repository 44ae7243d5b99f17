"""The selection of AlphaEdit's τ and MEMIT's λ as the editing chapters show it: the grid scored on the
validation split (:func:`grid_table`), a sentence saying what each C got (:func:`selection_text`), what
every organism chose on its own split (:func:`organism_table`) and the sensitivity of a claim to the
choice: the claim again one grid value below and above every organism's (:func:`neighbour_claims`,
:func:`neighbour_text`).

The selections come from :func:`moir_lib.experiments.selection.select`, one per editor × C; a table or
sentence covers one editor."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from moir_lib.chapters.lab_tables import COV_LABELS, fmt
from moir_lib.chapters.verdicts import Claim, judge
from moir_lib.experiments.gates import ES_GATE
from moir_lib.experiments.labs import pooled_frames
from moir_lib.experiments.selection import Selection, neighbours, per_model

__all__ = ["grid_table", "neighbour_claims", "neighbour_text", "organism_table", "per_model_values",
           "selection_text", "sensitivity_text"]

#: the symbol of each editor's strength
SYMBOLS = {"alphaedit": "τ", "memit": "λ"}
_NAMES = {"alphaedit": "AlphaEdit", "memit": "MEMIT"}


def grid_table(selections: Sequence[Selection]) -> pd.DataFrame:
    """One row per C × grid value of one editor's ``selections``: the validation ES, edit score, ``S_p`` and
    Total, whether ES clears the edit gate and the value chosen (``✓``); a pinned selection is one row."""
    symbol = _symbol(selections)
    frames = []
    for s in selections:
        if s.pinned:
            t = pd.DataFrame([{"value": s.value, "gate": "", "chosen": "✓", "note": "pinned"}])
        else:
            t = s.table.assign(gate=["✓" if g else "–" for g in s.table["clears_gate"]],
                               chosen=["✓" if c else "" for c in s.table["chosen"]])
        frames.append(t.assign(C=_label(s.cov)))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True).rename(columns={"value": symbol,
                                                                "gate": f"ES ≥ {ES_GATE:.2f}"})
    metrics = [c for c in ("ES", "S_e", "S_e_noport", "S_p", "Total") if c in out.columns]
    cols = ["C", symbol, *metrics, f"ES ≥ {ES_GATE:.2f}", "chosen"]
    if out["note"].fillna("").astype(bool).any():
        cols.append("note")
    return out[cols]


def selection_text(selections: Sequence[Selection]) -> str:
    """Which τ (λ) each C got on the validation split, whether C_Moir and C_Wiki got different ones, where
    no value cleared the edit gate, and the one value for every C (the per-model sensitivity check)."""
    symbol = _symbol(selections)
    if not selections:
        return ""
    first = selections[0]
    parts = []
    for s in selections:
        if s.pinned:
            parts.append(f"{_label(s.cov)}: {symbol} = {s.value:g} (pinned)")
            continue
        row = s.table[s.table["chosen"]].iloc[0]
        parts.append(f"{_label(s.cov)}: {symbol} = {s.value:g} (ES {fmt(row['ES'], 2)}, Total "
                     f"{fmt(row['Total'], 3)})")
    measured = [s for s in selections if not s.pinned]
    if not measured:
        return f"**{_NAMES[first.editor]}'s {symbol}** is pinned, not selected: " + "; ".join(parts) + "."
    grid = ", ".join(f"{v:g}" for v in first.grid)
    score = {"total": f"Total = {first.edit_metric} + S_p", "edit": first.edit_metric,
             "preservation": "S_p"}[first.criterion]
    text = (f"**{_NAMES[first.editor]}'s {symbol}**, selected on the validation split ({first.n_edits} edits "
            f"in one batch, grid {{{grid}}}, the largest {score} among the values whose ES clears "
            f"{ES_GATE:.2f}): " + "; ".join(parts) + ". ")
    text += _moir_wiki(selections, symbol)
    failed = [s for s in measured if s.gated is False]
    if failed:
        text += (f"Under {', '.join(_label(s.cov) for s in failed)} no {symbol} of the grid clears the edit "
                 f"gate: the one with the largest ES is used. ")
    if len(measured) > 1:
        value, gated = per_model(measured)
        text += (f"One {symbol} for every C, as the paper's per-model choice, would be {value:g}"
                 f"{'' if gated else ' (no value clears the gate under every C)'}.")
    return text.strip()


def per_model_values(selections: Mapping[str, Sequence[Selection]]) -> dict[str, float]:
    """Editor -> the one value for every C (:func:`~moir_lib.experiments.selection.per_model`), for each
    editor of ``selections`` (editor -> one selection per C) with at least two measured selections."""
    return {editor: per_model([s for s in sels if not s.pinned])[0] for editor, sels in selections.items()
            if sum(not s.pinned for s in sels) > 1}


def sensitivity_text(selections: Mapping[str, Sequence[Selection]], changed: bool) -> str:
    """What the per-model sensitivity check says: per editor, the one value for every C against each C's
    own; ``changed``: whether any claim run changes (then its claims follow this text)."""
    values = per_model_values(selections)
    if not values:
        return "No editor's setting was selected for two or more C's: there is no per-model check to run."
    parts = []
    for editor, value in values.items():
        symbol, own = SYMBOLS[editor], {s.cov: s.value for s in selections[editor]}
        differs = [f"{_label(c)} ({v:g})" for c, v in own.items() if not math.isclose(v, value)]
        own_text = f", against {', '.join(differs)} on its own" if differs else \
            ", what every C got on its own"
        parts.append(f"{_NAMES[editor]}: one {symbol} = {value:g} for every C{own_text}")
    text = "**Sensitivity: one setting per model.** " + "; ".join(parts) + ". "
    if changed:
        return text + ("The claims below are measured again with that one setting for both C's (the same "
                       "points, edit samples and draws), judged as a family of their own.")
    return text + "No claim run changes, so the claims above are also the per-model claims."


def organism_table(own: Sequence[Mapping[str, Sequence[Selection]]]) -> pd.DataFrame:
    """What every organism chose on its own validation split (``own``: one ``editor -> selections`` per
    organism, :func:`~moir_lib.experiments.selection.organism_strengths`): one row per organism × editor ×
    C with the value, its validation ES and Total, and whether it clears the edit gate."""
    rows = []
    for mine in own:
        for editor, sels in mine.items():
            for s in sels:
                row = s.table[s.table["chosen"]].iloc[0] if not s.pinned and len(s.table) else {}
                rows.append({"organism": s.organism, "editor": _NAMES[editor], "C": _label(s.cov),
                             "strength": SYMBOLS[editor], "value": s.value, "ES": row.get("ES", math.nan),
                             "Total": row.get("Total", math.nan),
                             f"ES ≥ {ES_GATE:.2f}": "pinned" if s.pinned else "✓" if s.gated else "–"})
    return pd.DataFrame(rows)


def neighbour_claims(labs: Sequence[object], specs: Sequence[object],
                     own: Sequence[Mapping[str, Sequence[Selection]]], covs: Sequence[str],
                     claim_of: Callable[[pd.DataFrame, pd.DataFrame], Claim]) -> list[tuple[str, Claim]]:
    """A claim again with every organism's choice for ``covs`` one grid value below, and one above, its own
    (:func:`~moir_lib.experiments.selection.neighbours`): ``specs`` (the claim's runs) in every lab of
    ``labs`` at those values, ``claim_of(rows, items)`` measuring it, judged alone; ``(which, claim)`` per
    side, a side left out where a choice sits at its grid's end. Costs the claim's runs again per side."""
    out = []
    for step, which in ((-1, "one grid value below every organism's own choice"),
                        (1, "one grid value above every organism's own choice")):
        moved = [neighbours(mine, step, covs) for mine in own]
        if any(m is None for m in moved):
            continue
        rows, items = pooled_frames(labs, list(specs), moved)
        out.append((which, judge(claim_of(rows, items), components={})[0]))
    return out


def neighbour_text(judged: Sequence[Claim], rows: Sequence[tuple[str, Claim]]) -> str:
    """Whether the selection decides the sign of the primary claim of ``judged`` (its first): the claim at
    the neighbouring grid values (``rows``: :func:`neighbour_claims`) against its own estimate."""
    if not judged:
        return "**Sensitivity: the neighbouring grid values.** No claim was judged."
    main = judged[0]
    if not main.test.measured:
        return (f"**Sensitivity: the neighbouring grid values.** {main.measured} is not measured, so "
                "there is no sign for the selection to decide.")
    if not rows:
        return ("**Sensitivity: the neighbouring grid values.** Every organism's choice sits at an end of "
                "its grid, or nothing was selected: there is no neighbouring value to measure the claim at.")
    sign = (main.estimate.value > 0) - (main.estimate.value < 0)
    parts = [f"{which}: {c.estimate.value:+.3f} {c.estimate.interval(3)}" if c.test.measured
             else f"{which}: not measured" for which, c in rows]
    flips = [which for which, c in rows
             if c.test.measured and (c.estimate.value > 0) - (c.estimate.value < 0) != sign]
    verdict = (f"the selection decides its sign (the other sign {', '.join(flips)})" if flips else
               "its sign does not depend on the selection within one grid value")
    return (f"**Sensitivity: the neighbouring grid values.** {main.measured} is {main.estimate.value:+.3f} "
            f"{main.estimate.interval(3)} at every organism's own choice; " + "; ".join(parts)
            + f": {verdict}.")


def _moir_wiki(selections: Sequence[Selection], symbol: str) -> str:
    """Whether C_Moir and C_Wiki got the same value."""
    by_cov = {s.cov: s.value for s in selections}
    if not {"moir", "wiki"} <= set(by_cov):
        return ""
    if math.isclose(by_cov["moir"], by_cov["wiki"]):
        return f"C_Moir and C_Wiki get the same {symbol}. "
    return (f"C_Moir and C_Wiki get different {symbol} ({by_cov['moir']:g} and {by_cov['wiki']:g}): each C "
            f"is compared at its own best setting, as in the paper. ")


def _symbol(selections: Sequence[Selection]) -> str:
    editors = {s.editor for s in selections}
    if len(editors) > 1:
        raise ValueError(f"one editor per table or sentence, got {sorted(editors)}")
    return SYMBOLS[editors.pop()] if editors else "value"


def _label(cov: str) -> str:
    return f"C_{COV_LABELS.get(cov, cov)}"
