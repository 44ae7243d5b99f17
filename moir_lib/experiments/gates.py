"""The bars a model's edits must clear to count as *taking*: the locus and editability gates.

:mod:`.editability` measures them for the pocket report; the chapters read :data:`ES_GATE` to call a
preservation claim reproduced only where the edits take; the book's pocket page shows them from here.
Numbers only, importing nothing from the library, so that every reader shares one value.
"""

from __future__ import annotations

__all__ = ["EDIT_GATES", "ES_GATE", "LOCUS_MIN", "N_EDITS", "N_FACTS"]

#: facts the locus gate traces (causal tracing, appendix C.4)
N_FACTS = 60
#: pocket CounterFact edits the editability gate makes in one batch
N_EDITS = 100
#: the mean indirect effect at the last subject token (best edit layer) the locus gate asks for
LOCUS_MIN = 0.30
#: MEMIT's and AlphaEdit's efficacy bar: below it a chapter calls no preservation claim reproduced.
#: An ES over :data:`N_EDITS` edits has a standard error of about 0.02 near 0.95, so a bar at 0.95
#: passes or fails a model whose edits take by the draw of the records alone; 0.90 keeps the ES
#: measured on both training-precision paths (the pocket report, ``book/pocket_log.md``) two
#: standard errors above.
ES_GATE = 0.90
#: metric -> (comparison, threshold)
EDIT_GATES: dict[str, tuple[str, float]] = {
    "locus_ie": (">=", LOCUS_MIN),
    "memit_ES": (">=", ES_GATE),
    "memit_PS": (">=", 0.60),
    "memit_NS": (">=", 0.60),
    "alphaedit_ES": (">=", ES_GATE),
}
