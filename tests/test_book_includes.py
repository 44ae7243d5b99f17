"""The book pages computed from the code: the chapter list (``moir_lib.chapters.CHAPTERS``), the pocket
page's gate bars and the methods page's measured calibration, so that none is typed a second time in
``book/`` or the README; and the methods page's statements of the engine's settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


@pytest.fixture
def quick_calibration(monkeypatch, tmp_path):
    """The methods page's simulations at three repetitions, in a cache of their own: the tests that need
    every generated page but not its figures."""
    from moir_lib.chapters import methods

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(methods, "CALIBRATION", {**methods.CALIBRATION, "reps": 3, "n_resamples": 60})


@pytest.mark.usefixtures("quick_calibration")
def test_every_generated_page_is_included_by_a_book_page(root: Path):
    pages = "".join(p.read_text() for p in (root / "book").glob("*.md"))
    for name in book_includes():
        assert f"{{include}} _generated/{name}" in pages, name


@pytest.mark.usefixtures("quick_calibration")
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


# ----------------------------------------------------------------------------- the methods page


def test_the_methods_page_is_the_first_reference_page(root: Path):
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    reference = next(p for p in toc["parts"] if p["caption"] == "Reference")
    assert reference["chapters"][0] == {"file": "book/methods"}
    page = (root / "book" / "methods.md").read_text()
    assert page.startswith("(methods)=\n# How a claim is judged")  # the label the claims table links to
    assert "{include} _generated/calibration.md" in page


def test_the_methods_page_states_the_engine_s_settings(root: Path):
    """What the page says of the procedure is what the engine does: resamples, margin, interval, the
    simulated sizes and repetitions."""
    from moir_lib.chapters.methods import CALIBRATION
    from moir_lib.evaluation import calibration, inference, intervals, uncertainty

    page = (root / "book" / "methods.md").read_text()

    def n(x: int) -> str:
        return f"{x:,}".replace(",", " ")

    assert f"({n(intervals.N_RESAMPLES)} by default, seeded)" in page
    assert f"at least {n(uncertainty.N_JSD_RESAMPLES)} replicates" in page
    assert f"$\\delta = {inference.NONINFERIORITY_MARGIN:g}$" in page
    assert f"is **{inference.INTERVAL_METHOD}**" in page
    b = calibration.BOOK
    sizes = (f"{b.tasks} preservation tasks of {b.items} items, {b.organisms} organisms of {b.samples} edit "
             f"sample and {b.draws} draw{'s' * (b.draws != 1)} of $C$ each")
    assert sizes in page.replace("\n", " ")
    assert f"over {CALIBRATION['reps']} repetitions each" in page
    assert not re.search(r"\b(issue|session|previously|today)\b", page, re.I), "the page must be timeless"


def test_the_methods_page_shows_the_measured_calibration(monkeypatch, tmp_path):
    """``calibration.md`` holds every row of the calibration table (coverage per scenario and interval, the
    half-width interval, false verdicts, power), measured once and read back from the moir cache until the
    engine's source changes."""
    from moir_lib.chapters import methods
    from moir_lib.evaluation import calibration

    monkeypatch.setenv("MOIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(methods, "CALIBRATION", {**methods.CALIBRATION, "reps": 3, "n_resamples": 60})
    text = book_includes()["calibration.md"]
    rows = [r for r in text.splitlines() if r.startswith("| ") and not r.startswith("| check")]
    scenarios = calibration.coverage_scenarios()
    beyond = calibration.beyond_reach()
    assert len(rows) == (4 * len(scenarios) + len(beyond) + len(calibration.FACTORS)
                         + len(calibration.POWER_DESIGNS))
    for name in beyond:
        row = f"| coverage of the true ΔS_p | {name} | — | not simulated: beyond the item model's reach | — |"
        assert row in text
    for name in scenarios:
        assert f"| coverage of the true ΔS_p | {name} | studentized | 0.95 ± 0.03 |" in text
    assert "| studentized × 0.5 | must miss 0.95 ± 0.03 |" in text
    assert "| false verdicts |" in text and "| power of a primary claim |" in text
    assert "| noncentral t: " in text
    assert all(0 <= float(r.rstrip(" |").rsplit("|", 1)[1]) <= 1 for r in rows if "beyond" not in r)
    assert "share of 3 simulated repetitions" in text

    def fails(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(calibration, "calibration_table", fails)
    assert methods.calibration_markdown() == text  # read back from the cache
    changed = tmp_path / "inference.py"
    changed.write_text("# another engine\n")
    monkeypatch.setattr(methods, "engine_sources", lambda: [changed])
    with pytest.raises(AssertionError, match="recomputed"):
        methods.calibration_markdown()


def test_the_calibration_key_covers_the_engine_it_runs(monkeypatch, tmp_path):
    from moir_lib.chapters import methods
    from moir_lib.evaluation import components

    names = {p.name for p in methods.engine_sources()}
    assert {"calibration.py", "inference.py", "bootstrap.py", "intervals.py", "composites.py",
            "components.py", "power.py"} <= names
    assert all(p.is_file() and "moir_lib" in p.parts for p in methods.engine_sources())
    # the components file the simulations read is part of the key
    key = methods._key()["engine"]
    other = tmp_path / "components.json"
    other.write_text(components.COMPONENTS_FILE.read_text() + " ")
    monkeypatch.setattr(components, "COMPONENTS_FILE", other)
    assert methods._key()["engine"] != key


@pytest.mark.usefixtures("quick_calibration")
def test_the_methods_page_shows_the_hierarchy_the_noise_and_the_power():
    """The generated pages come from the chapters' code and the components file: every chapter's primary
    claim, each component and a power row per design."""
    from moir_lib.chapters import diagnosis, editing, generation, methods, nll_jsd

    pages = book_includes()
    for module in (diagnosis, generation, nll_jsd, editing):
        assert f"| {module.CHAPTER} | {module.HIERARCHY.primary} |" in pages["hierarchy.md"]
    assert "| S_p |" in pages["components.md"] and "components.json" in pages["components.md"]
    power = [r for r in pages["power.md"].splitlines()[2:] if r.startswith("| ")]
    assert len(power) == len(methods.DESIGNS)
    assert all(0 <= float(r.split("|")[3]) <= 1 for r in power)
    assert "ΔS_p = 0.15" in pages["power.md"]
