"""The site check's set-up (`make test-site`): build/site served on 127.0.0.1, one
headless Chromium, and one crawl from the front page shared by every test. Skipped
unless MULTIGPU_SITE=1, selenium, Chromium, chromedriver and a built site are here."""

from __future__ import annotations

import os

import pytest

from tests.chromium import chromium_missing, find_chromium
from tests.site.crawl import SITE, SiteServer, chromium, crawl

OPT_IN = "MULTIGPU_SITE"


def skip_reason() -> str | None:
    """Why the site check cannot run here (None when it can)."""
    if os.environ.get(OPT_IN) != "1":
        return f"the site check is `make test-site` (sets {OPT_IN}=1)"
    if not (SITE / "index.html").exists():
        return f"no built site in {SITE} (run `make site`)"
    return chromium_missing()


@pytest.fixture(scope="session")
def site_server():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("selenium", reason="selenium: `make test-site` installs it")
    with SiteServer(SITE) as server:
        yield server


@pytest.fixture(scope="session")
def browser(site_server):
    driver = chromium(*find_chromium())
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def site(site_server, browser):
    """The crawl of the whole site from its front page."""
    return crawl(browser, site_server.base)
