"""The HTML book builds from executed runs, holds every chapter and embeds its plotly figures; a failed
or interrupted build leaves the previous book whole and does not break the next one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moir_lib import book
from moir_lib.chapters import book_includes


@pytest.fixture(scope="module", autouse=True)
def no_pocket_model(tmp_path_factory):
    """An empty cache: the books here show the pocket report of a model not built, rather than measure
    the report of the one this machine may hold (minutes)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MOIR_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def built_book(root, g_cancellation_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    return book.build_book(root, run_dir=g_cancellation_run.parent, path_output=out,
                           settings=book.BookSettings(execute=False, allow_missing=True,
                                                      includes=book_includes()))


def test_executed_chapters_are_in_the_book_and_the_rest_listed(root, built_book):
    assert (built_book / "index.html").is_file()
    assert (built_book / "notebooks" / "04_g_cancellation.html").is_file()
    intro = (built_book / "book" / "intro.html").read_text()
    for chapter in book.toc_chapters(root):
        if chapter != "notebooks/04_g_cancellation":
            assert not (built_book / f"{chapter}.html").exists()
            assert Path(chapter).name in intro, "a chapter left out must be listed as not run"


def test_plotly_figures_are_embedded_offline(built_book):
    html = (built_book / "notebooks" / "04_g_cancellation.html").read_text()
    divs = re.findall(r'class="plotly-graph-div"', html)
    assert len(divs) >= 4, "each proof-check figure must be a plotly div"
    assert "Plotly.newPlot" in html
    # plotly.js itself is inlined (no CDN needed): its bundle is megabytes of JavaScript.
    assert re.search(r"plotly\.js v\d", html) and len(html) > 1_000_000


def test_head_scripts_are_not_duplicated(built_book):
    """A repeated `const THEBE_JS_URL` is a SyntaxError; a second MathJax load throws."""
    for page in built_book.rglob("*.html"):
        head = page.read_text().split("</head>")[0]
        assert head.count("const THEBE_JS_URL") <= 1, page.name
        assert head.count("mathjax/tex-chtml.js") <= 1, page.name


def test_intro_states_provenance(built_book):
    assert "book/intro.html" in (built_book / "index.html").read_text()
    html = (built_book / "book" / "intro.html").read_text()
    assert "04_g_cancellation" in html and "Numbers in this build come from" in html


def test_code_cells_wrap_at_the_column_edge(built_book):
    """The book's CSS (``book/_static``) wraps code cells, so a parameters cell's long comments stay
    readable; every page links it."""
    css = built_book / "_static" / "moir.css"
    assert "white-space: pre-wrap" in css.read_text() and "div.cell_input pre" in css.read_text()
    head = (built_book / "notebooks" / "04_g_cancellation.html").read_text().split("</head>")[0]
    assert "_static/moir.css" in head


def test_broken_reference_fails_the_build(root, g_cancellation_run, tmp_path):
    """Warnings are errors: a dangling cross-reference in a page must fail the build."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(root / "book", src / "book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, src / name)
    (src / "book" / "intro.md").write_text("# Intro\n\nSee {doc}`no_such_page`.\n")
    previous = tmp_path / "out" / "_build" / "html" / "index.html"
    previous.parent.mkdir(parents=True)
    previous.write_text("the previous book")
    with pytest.raises(RuntimeError, match="(?s)jupyter-book build failed.*no_such_page"):
        book.build_book(src, run_dir=g_cancellation_run.parent, path_output=tmp_path / "out",
                        settings=book.BookSettings(execute=False, allow_missing=True,
                                                   includes=book_includes()))
    assert previous.read_text() == "the previous book", "a failed build leaves the previous book whole"


def test_small_book_renders_in_a_browser(built_book):
    """The same checks as `make test-book`, on the book built above (runs in the default tier)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("Chromium not installed (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    pages = [built_book / "book" / "intro.html", built_book / "notebooks" / "04_g_cancellation.html"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                    "--disable-background-networking"])
        for page in pages:
            tab = browser.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
            tab.goto(page.as_uri(), wait_until="load")
            tab.wait_for_timeout(1000)
            assert errors == [], f"JavaScript errors on {page.name}: {errors}"
            divs = tab.locator("div.plotly-graph-div")
            drawn = sum(divs.nth(i).locator("svg.main-svg").count() > 0 for i in range(divs.count()))
            assert drawn == divs.count(), f"{divs.count() - drawn} plotly figures not drawn on {page.name}"
            tab.close()
        browser.close()


def test_an_interrupted_build_does_not_break_the_next(root, g_cancellation_run, built_book):
    """Ctrl-C while Sphinx writes leaves its environment half-written: here jupyter-book run straight into
    the book's output, as a build that writes there does, then every doctree it wrote cut short. The next
    build succeeds the first time and leaves none of it behind. (Runs last: it rebuilds the module's book.)"""
    import subprocess
    import sys

    build_dir = built_book.parent
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb), "build", str(build_dir / "stage"), "--path-output", str(build_dir.parent),
                    "--builder", "html"], check=True, capture_output=True)
    doctrees = sorted((build_dir / ".doctrees").rglob("*.doctree"))
    assert doctrees and (build_dir / ".doctrees" / "environment.pickle").is_file()
    for doctree in doctrees:
        doctree.write_bytes(doctree.read_bytes()[:100])
    html = book.build_book(root, run_dir=g_cancellation_run.parent, path_output=build_dir.parent,
                           settings=book.BookSettings(execute=False, allow_missing=True,
                                                      includes=book_includes()))
    assert (html / "notebooks" / "04_g_cancellation.html").is_file()
    assert not (build_dir / ".doctrees").exists(), "the half-written environment is cleared"
