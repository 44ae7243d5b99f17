"""The HTML book builds from executed runs, holds every chapter and embeds its plotly figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moir_lib import runs


@pytest.fixture(scope="module")
def built_book(root, g_cancellation_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    return runs.build_book(root, run_dir=g_cancellation_run.parent, path_output=out, execute=False,
                           allow_missing=True)


def test_executed_chapters_are_in_the_book_and_the_rest_listed(root, built_book):
    assert (built_book / "index.html").is_file()
    assert (built_book / "notebooks" / "04_g_cancellation.html").is_file()
    intro = (built_book / "book" / "intro.html").read_text()
    for chapter in runs.toc_chapters(root):
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


def test_broken_reference_fails_the_build(root, g_cancellation_run, tmp_path):
    """Warnings are errors: a dangling cross-reference in a page must fail the build."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(root / "book", src / "book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(root / name, src / name)
    (src / "book" / "intro.md").write_text("# Intro\n\nSee {doc}`no_such_page`.\n")
    with pytest.raises(RuntimeError, match="jupyter-book build failed"):
        runs.build_book(src, run_dir=g_cancellation_run.parent, path_output=tmp_path / "out", execute=False,
                        allow_missing=True)


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
