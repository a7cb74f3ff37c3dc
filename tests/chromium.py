"""Finding headless Chromium and chromedriver for the opt-in browser checks
(tests/browser, `make test-browser`; tests/site, `make test-site`)."""

from __future__ import annotations

import os
import shutil

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
INSTALL_HINT = "on Debian: apt-get install -y chromium chromium-driver"


def find_chromium() -> tuple[str | None, str | None]:
    """The browser and its driver: $CHROME_BIN/$CHROMEDRIVER, else on PATH."""
    browsers = [os.environ.get("CHROME_BIN") or "", *CHROMIUM_NAMES]
    browser = next(filter(None, map(shutil.which, filter(None, browsers))), None)
    driver = shutil.which(os.environ.get("CHROMEDRIVER") or "chromedriver")
    return browser, driver


def chromium_missing() -> str | None:
    """Why no headless Chromium can run here (None when it can)."""
    browser, driver = find_chromium()
    if browser is None:
        return f"Chromium not found ({INSTALL_HINT})"
    if driver is None:
        return f"chromedriver not found ({INSTALL_HINT})"
    return None
