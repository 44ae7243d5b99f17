"""The pocket page (``book/pocket.md``): the bars of the pocket model's gates, read from the code that
applies them (:data:`moir_lib.pocket.report.GATES` and ``BUDGETS``, :mod:`moir_lib.experiments.gates`),
so the page types none of them."""

from __future__ import annotations

__all__ = ["gates_markdown"]

_SIGNS = {">=": "≥", "<=": "≤"}


def _bar(op: str, bound: float) -> str:
    return f"{_SIGNS[op]} {bound:.2f}" if bound <= 1 else f"{_SIGNS[op]} {bound:g}"


def _count(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def gates_markdown(variant: str = "pocket") -> str:
    """Every gate of ``moir pocket report`` with its bar, and the build's budget, as a markdown table,
    followed by the standard errors that size the leakage and efficacy bars (``variant``'s sample count)."""
    from moir_lib.evaluation.uncertainty import share
    from moir_lib.experiments.editability import labels
    from moir_lib.experiments.gates import EDIT_GATES, ES_GATE, N_EDITS, N_FACTS
    from moir_lib.pocket.report import BUDGETS, GATES, LABELS
    from moir_lib.pocket.variants import get_variant

    edit_labels = labels(N_EDITS)
    rows = ["| gate | quantity | bar |", "|---|---|---|"]
    rows += [f"| quality | {LABELS[name]} | {_bar(op, bound)} |" for name, (op, bound) in GATES.items()]
    for name, (op, bound) in EDIT_GATES.items():
        if name == "locus_ie":
            rows.append(f"| locus | {edit_labels[name]}, {N_FACTS} traced facts | {_bar(op, bound)} |")
        else:
            rows.append(f"| editability | {edit_labels[name]} | {_bar(op, bound)} |")
    rows += [f"| budget of the machine, not a gate | {LABELS[name]} | {_bar(op, bound)} |"
             for name, (op, bound) in BUDGETS.items()]
    n = get_variant(variant).bench.samples
    leakage = GATES["rand1_chat_leakage"][1]
    leakage_se, es_se = share(round(leakage * n), n).stderr, share(round(ES_GATE * N_EDITS), N_EDITS).stderr
    notes = (f"The seeded shares are over {_count(n)} samples each: a share near the {leakage:.2f} leakage "
             f"bar has a standard error of about {leakage_se:.3f}. An ES over {N_EDITS} edits "
             f"has a standard error of about {es_se:.2f} at its {ES_GATE:.2f} bar.")
    return "\n".join(rows) + "\n\n" + notes + "\n"
