"""What each chapter of the book says about its measurements, one module per notebook, and the chapter list.

Each module gives its chapter's ``summary.json`` headline, its closing "what we saw" text (computed, not
typed) and its tables for display. :data:`CHAPTERS` is the book's chapter list (the question each page
answers and what of the paper it reproduces), which the book's introduction shows; ``_toc.yml`` lists
the same pages in the same order (``tests/test_docs.py``).

========================  ===================================================================
module                    chapter (``notebooks/``) and what it presents from
========================  ===================================================================
:mod:`.diagnosis`         01, the Lab's rows (:mod:`moir_lib.experiments`)
:mod:`.generation`        02, the seed strategies' samples (:mod:`moir_lib.analysis.selfgen`)
:mod:`.nll_jsd`           03, NLL, JSD and coverage (:mod:`moir_lib.analysis.alignment`)
:mod:`.g_cancellation`    04, the proof check's numbers (:mod:`moir_lib.theory`)
:mod:`.editing`           05, the Lab's rows, with the explorer
:mod:`.causal_tracing`    06, the traced window (:mod:`moir_lib.tracing`)
:mod:`.lab_tables`        what 01 and 05 share: wide rows, Table 5, curves, distortion, notes
:mod:`.verdicts`          the claims each chapter judges, gathered into the book's claims table
:mod:`.pocket`            the pocket page (``book/pocket.md``): its gates and their bars
:mod:`.methods`           the methods page (``book/methods.md``): the claim tests' measured calibration
========================  ===================================================================

Each chapter module names its run directory (``CHAPTER``); :mod:`moir_lib.results` writes every
chapter's ``summary.json`` and tidy tables. The chapters import the measuring modules, never the
reverse: only the command line (:mod:`moir_lib.cli`) imports a chapter module, and the book build
(:mod:`moir_lib.book`) writes :func:`book_includes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["CHAPTERS", "Chapter", "book_includes", "chapters_table"]


@dataclass(frozen=True)
class Chapter:
    """One page of the book's chapter list."""

    file: str  # its entry in ``_toc.yml``
    question: str  # the question it answers (MyST markdown)
    paper: str  # what of the paper it reproduces (MyST markdown)


#: the book's pages in the order of ``_toc.yml``: the model organism, then the chapters
CHAPTERS: tuple[Chapter, ...] = (
    Chapter("book/pocket", "What is the embedded default model (the *pocket world*), and does it pass its "
            "quality gates?", "—"),
    Chapter("notebooks/01_diagnosis", "Does the source of $C$ decide which capabilities survive MEMIT edits?",
            "Table 1, Fig. 2"),
    Chapter("notebooks/02_generation", "Which seed (BOS or rand×1…4) escapes the chat-template attractor?",
            "Fig. 10, Tables 8-9, Table 2's seeds"),
    Chapter("notebooks/03_nll_jsd", "Which corpus matches the post-training distribution, and what does "
            "each $C$ cover?", "Fig. 3, Fig. 11, Fig. 7, App. A.2"),
    Chapter("notebooks/04_g_cancellation", "Does $C$ alone determine the closed-form edit? A numerical proof "
            "check.", "Prop. 1, Remark 1, Lemma 2, {eq}`jsd-bound`"),
    Chapter("notebooks/05_editing", r"Does $C_\text{Moir}$ preserve more across editors, regimes and edit "
            "counts; which seed is best?", "Tables 2, 5-9, Figs 4-9"),
    Chapter("notebooks/06_causal_tracing", "Where does the model store a fact, and which layers should an "
            "editor write to?", "App. C.4: the top-10 and summary tables, the layer-wise IE figure"),
)


def chapters_table() -> str:
    """:data:`CHAPTERS` as the markdown table of the book's introduction."""
    rows = ["| page (see the sidebar) | question | paper |", "|---|---|---|"]
    rows += [f"| `{PurePosixPath(c.file).name}` | {c.question} | {c.paper} |" for c in CHAPTERS]
    return "\n".join(rows) + "\n"


def book_includes() -> dict[str, str]:
    """The book's pages computed from this package, by file name under ``book/_generated``:
    ``chapters.md`` (the introduction's chapter list), ``pocket_gates.md`` (the pocket page's gates) and
    ``calibration.md`` (the methods page's measured coverage, false verdicts and power; cached while the
    engine's sources are unchanged, :func:`moir_lib.chapters.methods.calibration`), and the methods page's
    ``hierarchy.md`` (every chapter's primary and secondary claims), ``components.md`` (the book's variance
    components) and ``power.md`` (the power of the designs)."""
    from moir_lib.chapters import methods
    from moir_lib.chapters.pocket import gates_markdown

    return {"chapters.md": chapters_table(), "pocket_gates.md": gates_markdown(),
            "calibration.md": methods.calibration_markdown(), "hierarchy.md": methods.hierarchy_markdown(),
            "components.md": methods.components_markdown(), "power.md": methods.power_markdown()}
