"""Selecting an editor's strength on the validation split: AlphaEdit's τ and MEMIT's λ (appendix C.2).

The paper selects τ "from the grid {0.02, 0.005, 0.001, 0.0005} based on per-model optimal performance on a
held-out validation split" and λ "from the grid {0.5K, 1.5K, 5K, 15K, 30K}". :func:`select` does so for one
editor and one C: each value of the grid (the profile's ``alphaedit.tau_grid`` / ``memit.lambda_grid``)
edits the first ``n_edits`` records of the validation split (:meth:`EditRecords.validation
<moir_lib.experiments.records.EditRecords.validation>`: the file's last records, which no chapter edits
or scores) in one batch, and is scored there:

* ES and the edit score ``S_e`` (eq. (se)) on ``n_eval`` of the edited records, evenly spaced;
* ``S_p`` (eq. (sp)) on ``pres_items`` items per preservation task: those right after the chapters'
  ``pres_limit`` (``EvalSettings.pres_offset``), which no chapter scores (pocket: nor edits);
* the criterion: by default the paper's headline ``Total = S_e + S_p`` (Table 2's Edit Avg + Pres. Avg),
  which weighs the two things τ and λ trade, an edit that takes against a model that keeps what it knew.

The choice is the value with the largest criterion among those whose validation ES clears the edit gate
(:data:`~moir_lib.experiments.gates.ES_GATE`): an editor whose edits do not take preserves by not editing.
Where no value clears it, the largest ES is chosen and the selection says so (``gated`` false).

Per C is the main choice: each C's spectrum has its own scale, so a threshold fitted to one can be wrong
for another, and the paper compares each C at its best setting. :func:`per_model`, one value for every C
(the paper's "per-model optimal"), is the sensitivity check. Every grid value is a point like any other
(:meth:`~moir_lib.experiments.lab.Lab.compute` of :func:`validation_lab`), kept in
``<run directory>/selection`` and the machine-wide copy, so chapters 01 and 05 and the pocket report
compute it once. ``pin`` (or a
grid of one value) skips the selection.

**Per organism.** The paper selects per model, so each pocket organism selects on its own validation
split (:func:`strengths` on its own lab; :func:`organism_strengths` repeats a chapter's selections in every
organism, :func:`retune` moves a chapter's runs to each organism's values): the selection is part of the
recipe, and its variability sits inside the spread between organisms that a claim about the recipe
carries. It costs each further organism its own grid of validation points (one per editor × C × value),
and its claim runs are its own points. :func:`neighbours` moves every choice one grid value down or up:
the claims at the neighbouring values say whether the selection decides a claim's sign.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import pandas as pd

from moir_lib.experiments.gates import ES_GATE
from moir_lib.experiments.specs import ExperimentSpec
from moir_lib.experiments.store import PointStore

if TYPE_CHECKING:
    from moir_lib.experiments.lab import Lab

__all__ = ["CRITERIA", "N_EVAL", "PARAMS", "Selection", "Setting", "chosen", "grid_of", "neighbours",
           "organism_strengths", "per_model", "reselect", "retune", "select", "select_each", "strengths",
           "validation_lab", "validation_n"]

log = logging.getLogger(__name__)

#: editor -> the strength it selects (the profile key and the rows' column)
PARAMS: dict[str, str] = {"alphaedit": "tau", "memit": "lambda"}
#: criterion -> what it maximises: ``total`` = S_e + S_p (the paper's Total), or either alone
CRITERIA: tuple[str, ...] = ("total", "edit", "preservation")
#: edited validation records scored per grid value (half the chapters' N_EVAL: each value costs a point)
N_EVAL = 50
#: the groups a grid value is scored on
GROUPS: tuple[str, ...] = ("edit", "preservation")
#: the folder of a run directory holding the selection's points and its summaries
FOLDER = "selection"
_EDIT_METRICS = ("S_e", "S_e_noport")
#: a notebook's τ / λ setting: ``"auto"`` (select), a number (pin it) or None (pin the profile's)
Setting: TypeAlias = "str | float | None"


@dataclass(frozen=True)
class Selection:
    """The strength chosen for ``editor`` with C ``cov`` at ``n_edits`` validation edits (``edit_sample``).

    ``value``: the chosen τ (AlphaEdit) or λ (MEMIT); ``gated``: whether its validation ES clears
    :data:`ES_GATE` (``None`` when ``pinned``: nothing was measured); ``table``: one row per grid value
    (``value``, ``ES``, the edit score ``edit_metric``, ``S_p``, ``Total``, ``clears_gate``, ``chosen``,
    ``note``: why a value could not be scored); ``n_eval`` and ``pres_items``: how each value was scored;
    ``organism``: the pocket organism whose validation split chose it."""

    editor: str
    cov: str
    n_edits: int
    edit_sample: int
    grid: tuple[float, ...]
    criterion: str
    edit_metric: str
    value: float
    gated: bool | None
    pinned: bool
    table: pd.DataFrame
    n_eval: int = N_EVAL
    pres_items: int | None = None
    organism: int = 0

    @property
    def param(self) -> str:
        """``"tau"`` or ``"lambda"``."""
        return PARAMS[self.editor]

    def spec(self, regime: str, n_edits: int, **kw: Any) -> ExperimentSpec:
        """A chapter's experiment with this editor and C at the chosen value (``kw``: ``milestones``,
        ``edit_sample``)."""
        strength = {"tau": self.value} if self.editor == "alphaedit" else {"lambda_": self.value}
        return ExperimentSpec(self.editor, regime, self.cov, n_edits, **kw, **strength)

    def describe(self) -> dict[str, Any]:
        """The selection as plain JSON data (for ``summary.json``)."""
        from moir_lib.experiments.rows import json_value

        head = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "table"}
        table = [{k: json_value(v) for k, v in row.items()} for row in self.table.to_dict("records")]
        return {**head, "grid": list(self.grid), "param": self.param, "es_gate": ES_GATE, "table": table}


def grid_of(profile: Any, editor: str) -> tuple[float, ...]:
    """The profile's grid of ``editor``: ``alphaedit.tau_grid`` or ``memit.lambda_grid``."""
    if editor not in PARAMS:
        raise ValueError(f"unknown editor {editor!r}: choose {' or '.join(PARAMS)}")
    return tuple(profile.alphaedit.tau_grid if editor == "alphaedit" else profile.memit.lambda_grid)


def validation_lab(lab: Lab, *, n_eval: int = N_EVAL, pres_items: int | None = None) -> Lab:
    """The lab that scores the selection: ``lab``'s model and C's (:meth:`Lab.sibling`), editing the
    validation split, scoring ``n_eval`` edited records and ``pres_items`` preservation items per task
    from the chapters' ``pres_limit`` on (default: the profile's ``editing.validation_items``), storing
    in ``<lab's run directory>/selection`` (and the machine-wide copy when ``lab``'s store uses it)."""
    edit_records, ev = lab.edit_records, lab.evaluation
    items = edit_records.validation_items if pres_items is None else pres_items
    name = lab.profile.name
    if not edit_records.validation_count:
        raise ValueError(f"profile {name!r} holds no validation split (editing.validation_records: 0): "
                         f"set it to the number of records to hold out, or pin τ / λ")
    if ev.pres_offset or ev.pres_limit is None:
        raise ValueError("the selection scores the preservation items after a chapter's: open it on a lab "
                         "with pres_offset 0 and a pres_limit (the full tasks leave none)")
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise ValueError(f"pres_items must be a positive integer, got {items!r} (profile {name!r}: "
                         f"editing.validation_items)")
    if edit_records.parts()["preservation"] and items > edit_records.validation_items:
        raise ValueError(f"pres_items {items}: the pocket facts task's items are records, and only "
                         f"{edit_records.validation_items} after the chapters' are kept out of the edit pool "
                         f"(editing.validation_items); ask for at most that many")
    evaluation = dataclasses.replace(ev, n_eval=n_eval, pres_offset=ev.pres_limit, pres_limit=items,
                                     nll_docs=0)
    store = PointStore(lab.store.out_dir / FOLDER, shared=lab.store.shared)
    return lab.sibling(store, evaluation=evaluation, edit_records=edit_records.validation_split())


@dataclass(frozen=True)
class SelectionRule:
    """How a grid value is judged: ``criterion`` of :data:`CRITERIA`, ``edit_metric`` ``"S_e"`` or
    ``"S_e_noport"`` (the chapters' edit score where Portability is 0), scored with :func:`validation_lab`
    on ``n_eval`` edited records and ``pres_items`` preservation items per task."""

    criterion: str = "total"
    edit_metric: str = "S_e"
    n_eval: int = N_EVAL
    pres_items: int | None = None


#: the selection of the chapters, ``moir edit`` and the pocket report
DEFAULT_RULE = SelectionRule()


def select(lab: Lab, editor: str, cov: str, n_edits: int, grid: Sequence[float] | None = None, *,
           rule: SelectionRule = DEFAULT_RULE, edit_sample: int = 0, pin: float | None = None) -> Selection:
    """Select ``editor``'s τ / λ for C ``cov`` on the validation split (module doc): ``grid`` (default: the
    profile's, :func:`grid_of`), ``n_edits`` validation records edited in one batch (``edit_sample``),
    each value judged by ``rule``. ``pin`` (or a one-value grid) returns that value without measuring
    anything."""
    criterion, edit_metric = rule.criterion, rule.edit_metric
    n_eval, pres_items = rule.n_eval, rule.pres_items
    grid = tuple(float(v) for v in (grid_of(lab.profile, editor) if grid is None else grid))
    if editor not in PARAMS or criterion not in CRITERIA or edit_metric not in _EDIT_METRICS:
        raise ValueError(f"editor {editor!r}, criterion {criterion!r}, edit_metric {edit_metric!r}: choose "
                         f"an editor of {tuple(PARAMS)}, a criterion of {CRITERIA} and an edit metric of "
                         f"{_EDIT_METRICS}")
    if not grid or any(not (v > 0 and math.isfinite(v)) for v in grid):
        raise ValueError(f"the grid must hold positive numbers, got {list(grid)}")
    head = {"editor": editor, "cov": cov, "n_edits": n_edits, "edit_sample": edit_sample, "grid": grid,
            "criterion": criterion, "edit_metric": edit_metric}
    how = {"n_eval": n_eval, "pres_items": pres_items, "organism": int(lab.profile.organism or 0)}
    if pin is not None or len(grid) == 1:
        value = float(pin if pin is not None else grid[0])
        return Selection(**head, value=value, gated=None, pinned=True, table=_empty_table(edit_metric), **how)
    val = validation_lab(lab, n_eval=n_eval, pres_items=pres_items)
    held = len(lab.edit_records.parts()["validation"])
    if n_edits > held:
        raise ValueError(f"n_edits {n_edits}: the validation split holds {held} records "
                         f"(editing.validation_records of profile {lab.profile.name!r})")
    specs = {v: _spec(editor, cov, n_edits, edit_sample, v) for v in grid}
    if not all(val.is_cached(s, GROUPS) for s in specs.values()):
        lab.unedited()  # loaded once, by the chapter's lab, and shared by the validation lab
        val = validation_lab(lab, n_eval=n_eval, pres_items=pres_items)
    notes = {v: note for v, s in specs.items()
             if not val.is_cached(s, GROUPS) and (note := _unusable(val, s))}
    rows = val.compute_all([s for v, s in specs.items() if v not in notes], GROUPS)
    table = _grid_table(rows, {v: val.key(s) for v, s in specs.items()}, notes, edit_metric)
    value, gated = _choose(table, _score_column(criterion, edit_metric))
    table["chosen"] = table["value"] == value
    selection = Selection(**head, value=value, gated=gated, pinned=False, table=table, **how)
    _save(selection, val)
    log.info("%s with C=%s at N=%d: %s = %g (%s)", editor, cov, n_edits, PARAMS[editor], value,
             "clears the edit gate" if gated else f"no value clears ES >= {ES_GATE}: the largest ES")
    return selection


def select_each(lab: Lab, editor: str, covs: Sequence[str], n_edits: int,
                setting: Setting | Mapping[str, Setting] = "auto", **kw: Any) -> list[Selection]:
    """One :func:`select` per C of ``covs`` (the main, per-C choice) as a notebook parameter asks it:
    ``setting`` ``"auto"`` selects on the validation split, a number pins that value, ``None`` pins the
    profile's (``alphaedit.tau`` / ``memit.lambda``); a mapping gives each C its own (a C it omits:
    ``"auto"``). Every setting is checked before anything runs; ``kw``: :func:`select`'s options."""
    settings = {cov: (setting.get(cov, "auto") if isinstance(setting, Mapping) else setting) for cov in covs}
    if isinstance(setting, Mapping) and (unknown := set(setting) - set(covs)):
        raise ValueError(f"{PARAMS.get(editor, 'strength')} settings for {sorted(unknown)}, which are not "
                         f"among the C's compared {list(covs)}")
    pins = {cov: _pin(lab, editor, value) for cov, value in settings.items()}
    return [select(lab, editor, cov, n_edits, pin=pins[cov], **kw) for cov in covs]


def strengths(lab: Lab, editors: Sequence[str], covs: Sequence[str], n_edits: Mapping[str, int] | int, *,
              taus: Setting | Mapping[str, Setting] = "auto",
              lambdas: Setting | Mapping[str, Setting] = "auto", **kw: Any) -> dict[str, list[Selection]]:
    """Editor -> :func:`select_each` over ``covs``: AlphaEdit's τ as ``taus`` asks, MEMIT's λ as ``lambdas``
    asks, each selected at :func:`validation_n` of its editor's ``n_edits`` (the N its claims compare) on
    ``lab``'s own validation split (its organism's); a chapter's one call, so that chapters 01 and 05 and
    the pocket report ask for the same points. ``kw``: :func:`select`'s."""
    settings = {"alphaedit": taus, "memit": lambdas}
    out = {}
    for editor in editors:
        n = n_edits[editor] if isinstance(n_edits, Mapping) else n_edits
        needs = settings[editor] == "auto" or (isinstance(settings[editor], Mapping)
                                                and "auto" in [settings[editor].get(c, "auto") for c in covs])
        out[editor] = select_each(lab, editor, covs, validation_n(lab, n) if needs else n, settings[editor],
                                  **kw)
    return out


def reselect(lab: Lab, selections: Mapping[str, Sequence[Selection]]) -> dict[str, list[Selection]]:
    """``selections`` (editor -> one per C, as :func:`strengths` gives them) made again on ``lab``'s own
    validation split, with the same grid, N, sample, criterion and scoring (a pinned one stays pinned)."""
    return {editor: [select(lab, s.editor, s.cov, s.n_edits, s.grid, edit_sample=s.edit_sample,
                            rule=SelectionRule(s.criterion, s.edit_metric, s.n_eval, s.pres_items),
                            pin=s.value if s.pinned else None) for s in sels]
            for editor, sels in selections.items()}


def organism_strengths(labs: Sequence[Lab], selections: Mapping[str, Sequence[Selection]]
                       ) -> list[dict[str, list[Selection]]]:
    """Per lab of ``labs`` (one per organism), :func:`reselect`: each organism's own τ / λ."""
    return [reselect(lab, selections) for lab in labs]


def _selection_of(editor: str, cov: str, own: Mapping[str, Sequence[Selection]]) -> Selection | None:
    """The selection an experiment of ``editor`` with C ``cov`` edits at: its recipe's (``moir@1`` edits at
    ``moir``'s), a seed strategy's of C_Moir (``moir-bos``, Table 2) at C_Moir's; None when none."""
    from moir_lib.covariance.recipes import parse_name

    base = parse_name(cov)[0]
    by_cov = {s.cov: s for s in own.get(editor, ())}
    return by_cov.get(base) or (by_cov.get("moir") if base.startswith("moir-") else None)


def retune(specs: Sequence[ExperimentSpec], own: Mapping[str, Sequence[Selection]]) -> list[ExperimentSpec]:
    """``specs`` at the values of ``own`` (editor -> selections, one organism's): each experiment of an
    editor and C with a selection (:func:`_selection_of`) at that selection's value, the others as they
    are."""
    out = []
    for spec in specs:
        sel = _selection_of(spec.editor, spec.cov, own)
        if sel is not None:
            spec = dataclasses.replace(spec, **({"tau": sel.value} if spec.editor == "alphaedit"
                                                else {"lambda_": sel.value}))
        out.append(spec)
    return list(dict.fromkeys(out))


def neighbours(own: Mapping[str, Sequence[Selection]], step: int, covs: Sequence[str] | None = None
               ) -> dict[str, list[Selection]] | None:
    """``own``'s selections of ``covs`` (default: all) with every measured choice moved ``step`` places
    along its grid (sorted by value; pinned ones kept); None when a choice has no value there (it sits at
    the grid's end)."""
    out: dict[str, list[Selection]] = {}
    for editor, sels in own.items():
        moved = []
        for s in sels:
            if covs is not None and s.cov not in covs:
                continue
            if not s.pinned:
                grid = sorted(s.grid)
                i = grid.index(s.value) + step
                if not 0 <= i < len(grid):
                    return None
                s = dataclasses.replace(s, value=grid[i])
            moved.append(s)
        out[editor] = moved
    return out


def chosen(selections: Sequence[Selection]) -> dict[str, float]:
    """C -> the value each selection chose (one editor's entry of
    :func:`~moir_lib.experiments.specs.grid_specs`' ``strengths``)."""
    return {s.cov: s.value for s in selections}


def validation_n(lab: Lab, n_edits: int) -> int:
    """The batch the selection edits for a chapter whose claims edit ``n_edits`` records: that many, or the
    whole validation split where it holds fewer (a real profile's 1 000 records against AlphaEdit's N of
    thousands)."""
    return min(int(n_edits), len(lab.edit_records.parts()["validation"]))


def _pin(lab: Lab, editor: str, setting: Setting) -> float | None:
    """None for ``"auto"`` (select), else the value pinned: the number, or the profile's for None."""
    if setting == "auto":
        return None
    if setting is None:
        return float(lab.profile.alphaedit.tau if editor == "alphaedit" else lab.profile.memit.lambda_)
    if isinstance(setting, bool) or not isinstance(setting, int | float) or not setting > 0:
        raise ValueError(f"a {PARAMS.get(editor, 'strength')} setting is 'auto', a positive number or None "
                         f"(the profile's), got {setting!r}")
    return float(setting)


def per_model(selections: Sequence[Selection]) -> tuple[float, bool]:
    """One value for every C of ``selections`` (one editor, grid, N and criterion; the paper's per-model
    choice, the sensitivity check of the per-C one): the largest mean criterion over the C's among the
    values whose ES clears :data:`ES_GATE` under every C, else the largest smallest ES (``False``)."""
    measured = [s for s in selections if not s.pinned]
    if not measured:
        raise ValueError("per_model needs selections that measured their grid (none is pinned)")
    first = measured[0]
    if len({(s.editor, s.grid, s.n_edits, s.criterion, s.edit_metric) for s in measured}) > 1:
        raise ValueError("per_model compares selections of one editor, grid, N, criterion and edit metric")
    score = _score_column(first.criterion, first.edit_metric)
    both = pd.concat([s.table.assign(cov=s.cov) for s in measured], ignore_index=True)
    by_value = both.groupby("value", sort=False).agg(ES=("ES", lambda x: x.min(skipna=False)),
                                                     score=(score, lambda x: x.mean(skipna=False)))
    return _choose(by_value.reset_index().rename(columns={"score": score}), score)


def _spec(editor: str, cov: str, n_edits: int, edit_sample: int, value: float) -> ExperimentSpec:
    strength = {"tau": value} if editor == "alphaedit" else {"lambda_": value}
    return ExperimentSpec(editor, "batch", cov, n_edits, edit_sample=edit_sample, **strength)


def _unusable(val: Lab, spec: ExperimentSpec) -> str | None:
    """Why ``spec``'s editor cannot be built (AlphaEdit: a τ that leaves no null space, or all of it)."""
    try:
        val.editor(spec)
    except ValueError as exc:
        log.warning("%s τ=%s λ=%s with C=%s: %s", spec.editor, spec.tau, spec.lambda_, spec.cov, exc)
        return str(exc)
    return None


def _score_column(criterion: str, edit_metric: str) -> str:
    return {"total": "Total", "edit": edit_metric, "preservation": "S_p"}[criterion]


def _empty_table(edit_metric: str) -> pd.DataFrame:
    return pd.DataFrame(columns=["value", "ES", edit_metric, "S_p", "Total", "clears_gate", "chosen", "note"])


def _grid_table(rows: pd.DataFrame, keys: dict[float, str], notes: dict[float, str], edit_metric: str
                ) -> pd.DataFrame:
    """One row per grid value: its validation ES, edit score, ``S_p`` and Total (NaN where ``notes`` says
    why it could not be scored)."""
    out = []
    for value, key in keys.items():
        mine = rows[rows["key"] == key]
        metric = dict(zip(mine["group"] + ":" + mine["metric"], mine["value"], strict=True))
        es, se, sp = (float(metric.get(k, math.nan)) for k in ("edit:ES", f"edit:{edit_metric}",
                                                                "preservation:S_p"))
        out.append({"value": value, "ES": es, edit_metric: se, "S_p": sp, "Total": se + sp,
                    "clears_gate": bool(es >= ES_GATE), "chosen": False, "note": notes.get(value, "")})
    return pd.DataFrame(out)


def _choose(table: pd.DataFrame, score: str) -> tuple[float, bool]:
    """The value with the largest ``score`` among those whose ``ES`` clears :data:`ES_GATE` (the first of
    the grid on a tie), else the one with the largest ES; and whether the gate held."""
    passing = table[(table["ES"] >= ES_GATE) & table[score].notna()]
    if len(passing):
        return float(passing.loc[passing[score].idxmax(), "value"]), True
    scored = table[table["ES"].notna()]
    if scored.empty:
        raise ValueError(f"no value of the grid {list(table['value'])} could be scored: "
                         f"{'; '.join(n for n in table.get('note', pd.Series(dtype=str)) if n)}")
    return float(scored.loc[scored["ES"].idxmax(), "value"]), False


def _save(selection: Selection, val: Lab) -> None:
    """``<editor>-<C>-N<n>-<fingerprint>.json`` in the validation lab's run directory: what was chosen, from
    what."""
    from moir_lib.cache import fingerprint
    from moir_lib.files import write_json

    data = selection.describe()
    s = selection
    data["points"] = [val.key(_spec(s.editor, s.cov, s.n_edits, s.edit_sample, v)) for v in s.grid]
    name = f"{selection.editor}-{selection.cov}-N{selection.n_edits}-{fingerprint(data, 8)}.json"
    write_json(val.store.out_dir / name, data, indent=1)
