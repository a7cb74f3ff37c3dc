"""The built course site (`make site`, build/site) served on 127.0.0.1 and crawled
in headless Chromium from its front page: each page's console errors, links, element
ids and images, as the tests in this folder check them."""

from __future__ import annotations

import functools
import http.server
import threading
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"

# What a page holds, read in the browser once it has loaded.
PAGE_SCRIPT = """
const loaded = img => img.complete && img.naturalWidth > 0;
return {
  links: Array.from(document.querySelectorAll('a[href]'), a => a.href),
  ids: Array.from(document.querySelectorAll('[id]'), e => e.id).concat(
       Array.from(document.querySelectorAll('a[name]'), a => a.name)),
  images: Array.from(document.images, i => [i.currentSrc || i.src, loaded(i)]),
  outputImages: Array.from(document.querySelectorAll('.cell_output img'),
                           i => [i.currentSrc || i.src, loaded(i)]),
  sidebar: Array.from(document.querySelectorAll('nav.bd-docs-nav a.reference'),
                      a => a.href),
};
"""

# Formulas are typeset after the page has loaded: wait for MathJax 2's queue to empty.
MATHJAX_DONE = """
const done = arguments[arguments.length - 1];
if (window.MathJax && MathJax.Hub) { MathJax.Hub.Queue(() => done(true)); }
else { done(false); }
"""


@dataclass
class Page:
    """One crawled page, as Chromium showed it."""

    url: str
    errors: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    images: list[tuple[str, bool]] = field(default_factory=list)
    output_images: list[tuple[str, bool]] = field(default_factory=list)
    sidebar: list[str] = field(default_factory=list)


class SiteServer:
    """build/site over HTTP on 127.0.0.1 (an OS-chosen port), in a thread."""

    def __init__(self, folder: Path):
        handler = functools.partial(Quiet, directory=str(folder))
        self.httpd = QuietServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> SiteServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a browser that moves on closes its connections early: not an error


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request in pytest's output
        pass


def chromium(browser: str, driver: str):
    """A headless Chromium (1400×1000) that keeps the console's messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def is_page(url: str) -> bool:
    path = urlsplit(url).path
    return path.endswith((".html", "/"))


def visit(driver, url: str) -> Page:
    """Load `url`, wait until it has loaded, and read what it holds."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(url)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    driver.execute_async_script(MATHJAX_DONE)
    found = driver.execute_script(PAGE_SCRIPT)
    errors = [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE"
    ]
    return Page(
        url=url,
        errors=errors,
        links=found["links"],
        ids=set(found["ids"]),
        images=[tuple(image) for image in found["images"]],
        output_images=[tuple(image) for image in found["outputImages"]],
        sidebar=found["sidebar"],
    )


@functools.cache
def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@dataclass
class Crawl:
    """Every page reached from the front page, and every internal link's fate."""

    pages: dict[str, Page]
    broken: list[tuple[str, str]]  # (page, link) whose target is missing
    missing_anchors: list[tuple[str, str]]  # (page, link) whose #id is not there
    files: dict[str, int]  # other internal targets (images, downloads): status


def crawl(driver, base: str) -> Crawl:
    """Breadth-first from `base` over every internal link, in one browser."""
    host = urlsplit(base).netloc
    pages: dict[str, Page] = {}
    files: dict[str, int] = {}
    queue = deque([base + "index.html"])
    anchors: list[tuple[str, str, str]] = []  # (page, target page, fragment)
    broken = []
    while queue:
        url = queue.popleft()
        if url in pages:
            continue
        pages[url] = page = visit(driver, url)
        for link in page.links:
            if urlsplit(link).netloc != host:
                continue  # outside the site: not followed
            target, fragment = urldefrag(link)
            if is_page(target):
                if target.endswith("/"):
                    target += "index.html"
                if http_status(target) != 200:
                    broken.append((url, link))
                    continue
                if fragment:
                    anchors.append((url, target, unquote(fragment)))
                queue.append(target)
            else:
                if target not in files:
                    files[target] = http_status(target)
                if files[target] != 200:
                    broken.append((url, link))
    missing = [
        (url, f"{target}#{fragment}")
        for url, target, fragment in anchors
        if target in pages and fragment not in pages[target].ids
    ]
    return Crawl(pages, broken, missing, files)
