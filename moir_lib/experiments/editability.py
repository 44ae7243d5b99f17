"""Is a model a faithful MEMIT/AlphaEdit target? The *locus* and *editability* gates.

* **locus** — causal tracing (appendix C.4) of ``n_facts`` facts that pocket CounterFact
  rewrites: the mean indirect effect ``IE(ℓ, last subject token)`` of restoring the hidden state
  at the last subject token, at the best layer ℓ of the profile's edit window. It must be at
  least :data:`~moir_lib.experiments.gates.LOCUS_MIN`: the fact must pass through where MEMIT writes.
* **editability** — ``n_edits`` pocket CounterFact edits in one batch with the profile's
  defaults (each editor's threshold and ``context_templates``) and ``C_Wiki``, scored in the ROME
  convention (ES: p(new) > p(true) on the rewrite prompt; PS on paraphrases; NS on the
  neighbourhood prompts whose subject is not itself edited in the batch, ``NS_all`` on all of
  them, reported beside it), for MEMIT and AlphaEdit, through the chapters' own
  :class:`~moir_lib.experiments.lab.Lab`.

:func:`editing_gates` returns both as report metrics and gates, which ``moir pocket report``
adds to the pocket model's other gates, for one organism of the recipe at a time (:func:`gate_profile`:
the editing profile with its ``organism``, so the points are that organism's). Their bars and default
sizes are in :mod:`moir_lib.experiments.gates`.
"""

from __future__ import annotations

import logging
import tempfile
from typing import TYPE_CHECKING, Any

from moir_lib.experiments.gates import EDIT_GATES, N_EDITS, N_FACTS
from moir_lib.experiments.specs import EvalSettings

if TYPE_CHECKING:
    from moir_lib.profiles import Profile

__all__ = ["GATE_EVALUATION", "PROFILES", "REPORT_MODULES", "add_to_report", "editability", "editing_gates",
           "gate_profile", "labels", "locus", "report_key"]

log = logging.getLogger(__name__)

#: how the gate scores its edits: the chapters' evaluation settings (``N_EVAL`` records, ``PRES_LIMIT``
#: items, which also decide the edited records), so that their
#: points are shared
GATE_EVALUATION = EvalSettings()
#: pocket variant -> the profile that edits it
PROFILES = {"pocket": "pocket", "micro": "pocket-micro"}
#: where a report's numbers are computed: its measurement and its editing gates (with what they import,
#: the lab's points among it: :func:`~moir_lib.experiments.identity.code_identity`)
REPORT_MODULES = ("moir_lib.pocket.report", "moir_lib.experiments.editability")
_EDITORS = (("memit", "MEMIT"), ("alphaedit", "AlphaEdit"))


def gate_profile(variant: str, organism: int = 0) -> Profile:
    """The profile that edits organism ``organism`` of the pocket ``variant`` (:data:`PROFILES`; its
    ``organism`` set when not 0, so organism 0's points keep the keys they always had)."""
    from moir_lib.profiles import load_profile

    profile = load_profile(PROFILES[variant])
    return profile.with_overrides({"organism": organism}) if organism else profile


def _profile(profile: str | Profile) -> Profile:
    from moir_lib.profiles import Profile, load_profile

    return profile if isinstance(profile, Profile) else load_profile(profile)


def labels(n_edits: int = N_EDITS) -> dict[str, str]:
    """The report's label of each metric of :func:`editing_gates`, ``n_edits`` the editability gate's size."""
    return {
        **{f"{e}_settings": f"{name}: profile settings of the gate" for e, name in _EDITORS},
        "locus_ie": "locus: IE at the last subject token, best edit layer",
        "locus_layer": "locus: that layer",
        "locus_valid": "locus: valid traced facts",
        "last_token_ie": "last token: IE at the same layer",
        **{f"{e}_{m}": f"{name}, {n_edits} edits, C_Wiki: {shown}" for e, name in _EDITORS
           for m, shown in (("ES", "ES"), ("PS", "PS"), ("NS", "NS (unedited neighbours)"),
                            ("NS_all", "NS over every neighbour"))},
    }


def locus(profile: str | Profile = "pocket", n_facts: int = N_FACTS, seed: int = 0, n_noise: int = 10
          ) -> dict[str, Any]:
    """Trace ``n_facts`` rewritable facts; the IE at the last subject token at the best edit layer."""
    from moir_lib.tracing import TraceSettings, trace_profile

    prof = _profile(profile)
    result = trace_profile(prof, n_facts, settings=TraceSettings(n_noise=n_noise, seed=seed), progress=False)
    curve = result.layer_curve().set_index("layer")["ie"]
    last = result.last_token_curve().set_index("layer")["ie"]
    window = [int(x) for x in prof.edit_layers]
    best = max(window, key=lambda layer: float(curve.get(layer, float("nan")) or -1.0))
    return {"locus_ie": float(curve[best]), "locus_layer": int(best), "locus_valid": int(result.n_valid),
            "last_token_ie": float(last[best]), "traced_window": result.window(len(window))}


def editability(profile: str | Profile = "pocket", n_edits: int = N_EDITS) -> dict[str, Any]:
    """ES/PS/NS/NS_all of MEMIT and AlphaEdit at ``n_edits`` batch edits with C_Wiki, each editor at the τ / λ
    the chapters select for C_Wiki on the validation split (:func:`~moir_lib.experiments.selection.strengths`,
    the same points; the profile's where it holds no split), its settings first (``<editor>_settings``: its
    threshold and context prefixes).

    The points are the chapters' own (:data:`GATE_EVALUATION`, seed 0, the machine-wide results cache):
    a point a chapter computed is read back, and one the gate computes serves the chapters."""
    from moir_lib.experiments.lab import Lab
    from moir_lib.experiments.selection import strengths

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="moir-editability-") as tmp:
        lab = Lab(_profile(profile), tmp, evaluation=GATE_EVALUATION)
        setting = "auto" if lab.edit_records.validation_count else None
        chosen = {e: sels[0] for e, sels in strengths(lab, ("memit", "alphaedit"), ("wiki",), n_edits,
                                                      taus=setting, lambdas=setting).items()}
        specs = [chosen[editor].spec("batch", n_edits) for editor in ("memit", "alphaedit")]
        lab.compute_all(specs, groups=("edit",))
        rows = lab.table(specs)
        m, a = lab.profile.memit, lab.profile.alphaedit
        how = {e: "pinned: the profile's" if s.pinned else "selected" for e, s in chosen.items()}
        thresholds = {"memit": f"λ {chosen['memit'].value:g} ({m.lambda_mode}, {how['memit']})",
                      "alphaedit": f"τ {chosen['alphaedit'].value:g} ({a.tau_mode}, {how['alphaedit']})"}
        for editor in ("memit", "alphaedit"):
            out[f"{editor}_settings"] = (f"{thresholds[editor]}, {lab.n_templates(editor)} context prefixes, "
                                         f"{m.v_num_grad_steps} z steps")
            for metric in ("ES", "PS", "NS", "NS_all"):
                hit = rows[(rows["editor"] == editor) & (rows["metric"] == metric)]
                out[f"{editor}_{metric}"] = float(hit["value"].iloc[0])
    return out


def editing_gates(profile: str | Profile = "pocket", n_facts: int = N_FACTS, n_edits: int = N_EDITS
                  ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(metrics, gates)`` of :func:`locus` and :func:`editability`, in the report's format."""
    import operator

    ops = {">=": operator.ge, "<=": operator.le}
    metrics = {**locus(profile, n_facts), **editability(profile, n_edits)}
    gates = {name: {"value": metrics[name], "op": op, "threshold": bound,
                    "passed": bool(ops[op](metrics[name], bound))}
             for name, (op, bound) in EDIT_GATES.items()}
    log.info("editing gates: %s", {k: round(v["value"], 3) for k, v in gates.items()})
    return metrics, gates


def report_key(variant: str, limit: int | None = None, n_facts: int = N_FACTS, n_edits: int = N_EDITS,
               organism: int = 0) -> str:
    """Everything a report of :func:`add_to_report` depends on besides the model (its cache entry): the
    editing profile of the organism, the code and the sizes; a saved report is reused only under the same
    key."""
    from moir_lib.cache import fingerprint
    from moir_lib.experiments.identity import code_identity

    return fingerprint({"profile": gate_profile(variant, organism).to_dict(),
                        "code": code_identity(REPORT_MODULES), "limit": limit, "n_facts": n_facts,
                        "n_edits": n_edits})


def add_to_report(report: dict[str, Any], n_facts: int = N_FACTS, n_edits: int = N_EDITS) -> dict[str, Any]:
    """``report`` (from :func:`moir_lib.pocket.report.measure`, of one organism) with the editing gates of
    that organism and its :func:`report_key` added."""
    organism = report.get("organism", 0)
    report["report_key"] = report_key(report["variant"], report.get("limit"), n_facts, n_edits, organism)
    metrics, gates = editing_gates(gate_profile(report["variant"], organism), n_facts, n_edits)
    report["metrics"].update({k: v for k, v in metrics.items() if k != "traced_window"})
    report["gates"].update(gates)
    report["labels"] = {**report.get("labels", {}), **labels(n_edits)}
    report["traced_window"] = metrics["traced_window"]
    report["passed"] = all(g["passed"] for g in report["gates"].values())
    return report
