"""The book pages computed from the code: the chapter list (``moir_lib.chapters.CHAPTERS``) and the
pocket page's gate bars, so that neither is typed a second time in ``book/`` or the README."""

from __future__ import annotations

import re
from pathlib import Path

from moir_lib import book
from moir_lib.chapters import CHAPTERS, book_includes, chapters_table


def test_the_chapter_list_follows_the_table_of_contents(root: Path):
    files = [c.file for c in CHAPTERS]
    assert [f for f in files if f.startswith("notebooks/")] == book.toc_chapters(root)
    toc = (root / "_toc.yml").read_text()
    for f in files:
        assert f"file: {f}\n" in toc
        assert (root / f"{f}.md").is_file() or (root / f"{f}.ipynb").is_file(), f


def test_the_chapter_table_has_one_row_per_chapter():
    rows = chapters_table().splitlines()[2:]
    assert len(rows) == len(CHAPTERS)
    for row, c in zip(rows, CHAPTERS, strict=True):
        assert row == f"| `{Path(c.file).name}` | {c.question} | {c.paper} |"


def test_the_chapter_list_is_typed_once(root: Path):
    intro = (root / "book" / "intro.md").read_text()
    readme = (root / "README.md").read_text()
    assert "_generated/chapters.md" in intro and "](book/intro.md)" in readme
    for text in (intro, readme):
        assert not re.search(r"^\|.*`(notebooks/)?0\d_\w+(\.ipynb)?`", text, re.M), "a chapter row by hand"


def test_every_generated_page_is_included_by_a_book_page(root: Path):
    pages = "".join(p.read_text() for p in (root / "book").glob("*.md"))
    for name in book_includes():
        assert f"{{include}} _generated/{name}" in pages, name


def test_the_pocket_page_shows_the_bars_the_code_applies(monkeypatch):
    from moir_lib.experiments import gates
    from moir_lib.pocket import report

    table = book_includes()["pocket_gates.md"]
    for name, (op, bound) in {**report.GATES, **report.BUDGETS}.items():
        sign = {">=": "≥", "<=": "≤"}[op]
        bar = f"{sign} {bound:.2f}" if bound <= 1 else f"{sign} {bound:g}"
        assert f"| {report.LABELS[name]} | {bar} |" in table, name
    assert f"{gates.N_FACTS} traced facts | ≥ {gates.LOCUS_MIN:.2f} |" in table
    assert f"MEMIT, {gates.N_EDITS} edits, C_Wiki: ES | ≥ {gates.ES_GATE:.2f} |" in table
    monkeypatch.setitem(gates.EDIT_GATES, "alphaedit_ES", (">=", 0.77))
    assert f"AlphaEdit, {gates.N_EDITS} edits, C_Wiki: ES | ≥ 0.77 |" in book_includes()["pocket_gates.md"]


def test_the_pocket_page_types_no_bar(root: Path):
    from moir_lib.experiments import gates
    from moir_lib.pocket import report

    page = (root / "book" / "pocket.md").read_text()
    bounds = [b for _, b in (*report.GATES.values(), *gates.EDIT_GATES.values())]
    for bound in bounds:
        assert not re.search(rf"[≥≤] {bound:.2f}\b", page), bound
