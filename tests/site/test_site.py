"""The built course site in headless Chromium (`make test-site`): every page loads
without console errors, every internal link resolves, every figure a notebook's
stored outputs hold is shown on its page, and the contents follow the series."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.site.crawl import ROOT, SITE

NOTEBOOKS = ROOT / "notebooks"
LESSONS = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
SOLUTIONS = sorted((NOTEBOOKS / "solutions").glob("[0-9]*.ipynb"))


def image_outputs(notebook: Path) -> int:
    """How many stored outputs of `notebook` hold an image."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum(
        any(kind.startswith("image/") for kind in output.get("data", {}))
        for cell in cells
        for output in cell.get("outputs", [])
    )


def page_of(site_server, notebook: Path) -> str:
    return site_server.base + notebook.relative_to(ROOT).with_suffix(".html").as_posix()


def test_every_page_loads_without_console_errors(site):
    errors = {url: page.errors for url, page in site.pages.items() if page.errors}
    assert len(site.pages) >= len(LESSONS) + len(SOLUTIONS) + 1
    assert errors == {}


def test_every_internal_link_resolves(site):
    assert site.broken == []
    assert site.missing_anchors == []
    assert all(status == 200 for status in site.files.values())


def test_every_image_on_every_page_is_loaded(site):
    unloaded = {
        url: [src for src, loaded in page.images if not loaded]
        for url, page in site.pages.items()
    }
    assert {url: srcs for url, srcs in unloaded.items() if srcs} == {}


@pytest.mark.parametrize("notebook", LESSONS + SOLUTIONS, ids=lambda path: path.stem)
def test_every_stored_figure_is_shown(site, site_server, notebook):
    page = site.pages.get(page_of(site_server, notebook))
    assert page is not None, f"{notebook.name}: no page reached from the front page"
    shown = [src for src, loaded in page.output_images if loaded]
    assert len(shown) == image_outputs(notebook)


def test_each_lesson_links_its_solutions_and_its_source(site, site_server):
    for lesson in LESSONS:
        page = site.pages[page_of(site_server, lesson)]
        answers = NOTEBOOKS / "solutions" / f"{lesson.stem}_solutions.ipynb"
        if answers.exists():
            assert page_of(site_server, answers) in page.links, lesson.name
        source = site_server.base + "source/"
        assert any(link.startswith(source) for link in page.links), lesson.name


def test_each_lesson_shows_its_exercises(site, site_server):
    missing = [
        lesson.name
        for lesson in LESSONS
        if not any(
            id_.startswith("exercise")
            for id_ in site.pages[page_of(site_server, lesson)].ids
        )
    ]
    assert missing == []


def test_the_contents_follow_the_series_each_lesson_then_its_solutions(
    site, site_server
):
    numbers = [lesson.name.split("_", 1)[0] for lesson in LESSONS]  # 09 before 09b
    assert numbers == sorted(numbers, key=lambda n: (int(n.rstrip("abcdef")), n))
    sidebar = site.pages[site_server.base + "index.html"].sidebar
    expected = []
    for lesson in LESSONS:
        expected.append(page_of(site_server, lesson))
        answers = NOTEBOOKS / "solutions" / f"{lesson.stem}_solutions.ipynb"
        if answers.exists():
            expected.append(page_of(site_server, answers))
    notebooks = site_server.base + "notebooks/"
    assert [link for link in sidebar if link.startswith(notebooks)] == expected


def test_the_search_page_finds_a_lesson(browser, site_server):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")
    browser.get(site_server.base + "search.html?q=torchrun")
    results = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements("css selector", "#search-results li a")
    )
    hrefs = [result.get_attribute("href") for result in results]
    assert any("notebooks/09_ddp_torchrun" in href for href in hrefs)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_screenshots_of_the_front_page_and_a_lesson(browser, site_server):
    """Saved for a person to look at: SITE_SCREENSHOTS (default build/site-check)."""
    folder = Path(os.environ.get("SITE_SCREENSHOTS", SITE.parent / "site-check"))
    folder.mkdir(parents=True, exist_ok=True)
    browser.get(site_server.base + "index.html")
    assert browser.save_screenshot(str(folder / "site_front.png"))
    lesson = next(path for path in LESSONS if image_outputs(path))
    browser.get(page_of(site_server, lesson))
    assert browser.save_screenshot(str(folder / "site_lesson.png"))
    figure = browser.find_element("css selector", ".cell_output img")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", figure)
    assert browser.save_screenshot(str(folder / "site_figure.png"))
