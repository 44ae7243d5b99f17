"""The built book in a real browser (headless Chromium through Playwright).

Run by ``make test-book`` after ``make book``; skipped with a reason when the book has not been
built or Chromium / Playwright is missing. Checks every page of ``_toc.yml``: no JavaScript
errors, each plotly figure rendered (an SVG inside its div), and every relative link resolves.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from moir_lib import book

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("Chromium not installed (Debian: apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def browser():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _pages() -> list[Path]:
    pages = [HTML / "index.html", HTML / "book" / "intro.html"]
    return pages + [HTML / f"{c}.html" for c in book.toc_chapters(ROOT)]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(HTML)))
def test_page_renders_without_errors(browser, page):
    assert page.is_file(), f"{page} missing from the built book"
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(page.as_uri(), wait_until="load")
    tab.wait_for_timeout(1500)
    assert errors == [], f"JavaScript errors on {page.name}: {errors}"
    divs = tab.locator("div.plotly-graph-div")
    for i in range(divs.count()):
        assert divs.nth(i).locator("svg.main-svg").count() > 0, f"plotly figure {i} on {page.name} not drawn"
    tab.close()


def test_navigation_links_resolve(browser):
    tab = browser.new_page()
    broken = []
    for page in _pages()[1:]:
        tab.goto(page.as_uri(), wait_until="load")
        for href in tab.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            url = urlparse(href)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            if not target.exists():
                broken.append(f"{page.name} -> {target}")
    tab.close()
    assert broken == []
