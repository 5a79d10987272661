"""The built docs site as a reader sees it, in headless Chromium at 1280 px.

The site is the one ``.ci/run`` builds (``mkdocs build --strict``): its
folder is named by ``SCIO_DOCS_SITE``; without it (or without a browser)
the test is skipped, saying so. Each main page is served over HTTP on
127.0.0.1 and loaded as a reader would; the test checks what the build's
own checks (``docs/hooks.py``: raw roles, unexecuted notebooks) cannot see:

* no console error, no failed request, nothing asked of another host (the
  site works offline: no web fonts, no CDN);
* every image loaded;
* no line wider than the page: the page does not scroll sideways, and no
  code block, signature, table or shown output (a notebook's included) is
  wider than its column;
* a screenshot that is not blank (written to ``SCIO_SCREENSHOTS``, when
  set, for a person to look at: ``--screenshot``-style full pages).
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from tests import browser

PAGES = (
    "",
    "start/",
    "labels/",
    "ood/",
    "explain/",
    "transformers/",
    "plot/",
    "views/",
    "benchmarks/",
    "migrate/transformerlens/",
    "migrate/pytorch-ood/",
    "notebooks/ood/",
    "notebooks/graph/",
    "notebooks/transformers/",
    "api/recorder/",
    "api/ood/",
    "api/ood-detectors/",
    "api/ood-features/",
    "api/views/",
)
"""The main pages: the home page, the guides, a notebook, the API."""


class Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the site's folder without a log line per request."""

    def log_message(self, *args: object) -> None:
        pass


_LAYOUT = """(() => {
  const page = document.documentElement.scrollWidth;
  const wide = [];
  for (const e of document.querySelectorAll('pre, .doc-signature, .md-typeset table')) {
    const box = e.closest('.md-typeset__scrollwrap') || e;
    if (e.scrollWidth > box.clientWidth + 2) {
      wide.push(`${e.tagName} ${e.scrollWidth} px > ${box.clientWidth} px: `
        + e.textContent.trim().slice(0, 60));
    }
  }
  const broken = [...document.images]
    .filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.src);
  return {page, width: window.innerWidth, wide, broken};
})()"""


@pytest.fixture(scope="module")
def site():
    folder = os.environ.get("SCIO_DOCS_SITE")
    if not folder or not (Path(folder) / "index.html").is_file():
        pytest.skip(
            "no built site: `mkdocs build --strict --site-dir DIR`, then "
            "SCIO_DOCS_SITE=DIR (.ci/run does both)"
        )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=folder)
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def chromium():
    found = browser.start()
    if found is None:
        pytest.skip("no headless Chromium starts here: the site is not checked")
    yield found
    found.close()


@pytest.mark.slow
def test_main_pages_load_offline_whole_and_within_the_page_width(site, chromium):
    """Each main page: no error, nothing from elsewhere, images, width, not blank."""
    shots = os.environ.get("SCIO_SCREENSHOTS")
    problems = []
    for path in PAGES:
        page = chromium.page(1280, 900)
        page.load(site + path)
        where = f"/{path}"
        problems += [f"{where}: {error}" for error in page.errors()]
        elsewhere = [
            url
            for url in page.requested()
            if not url.startswith((site, "data:", "blob:", "about:"))
        ]
        problems += [f"{where}: asks another host for {url}" for url in elsewhere]
        layout = page.evaluate(_LAYOUT)
        if layout["page"] > layout["width"]:
            problems.append(f"{where}: {layout['page']} px wide at {layout['width']}")
        problems += [f"{where}: wider than its column: {w}" for w in layout["wide"]]
        problems += [f"{where}: image not loaded: {src}" for src in layout["broken"]]
        png = page.screenshot(full=bool(shots))  # the whole page, to look at
        if browser.inked(png) < 0.01:  # a blank page
            problems.append(f"{where}: the screenshot is blank")
        if shots:
            name = path.strip("/").replace("/", "-") or "index"
            Path(shots).mkdir(parents=True, exist_ok=True)
            (Path(shots) / f"{name}.png").write_bytes(png)
        page.send("Page.close")
    assert problems == []


DEEP_PAGES = ("api/hallucination/", "api/views/", "changelog/")
"""Pages far down the navigation: their sidebar opens scrolled to their link."""

_NAV_UNDER_TITLE = """(() => {
  const nav = document.querySelector('.md-sidebar--primary .md-nav--primary');
  const title = nav.querySelector(':scope > .md-nav__title');
  const t = title.getBoundingClientRect();
  const scroller = nav.closest('.md-sidebar__scrollwrap');
  // scrolled a little, as on a page far down the list: an entry then passes
  // where a sticky title sits
  scroller.scrollTop = Math.min(60, scroller.scrollHeight - scroller.clientHeight);
  const wrap = scroller.getBoundingClientRect();
  const under = [];
  for (const link of nav.querySelectorAll('.md-nav__link')) {
    const r = link.getBoundingClientRect();
    const shown = r.height > 0 && r.bottom > wrap.top && r.top < wrap.bottom;
    if (shown && r.top < t.bottom - 0.5 && r.bottom > t.top + 0.5) {
      under.push(`"${link.textContent.trim()}" at ${r.top}-${r.bottom} px,`
        + ` the title at ${t.top}-${t.bottom} px`);
    }
  }
  return {scrolled: scroller.scrollTop, under};
})()"""


@pytest.mark.slow
def test_no_nav_entry_hides_under_the_navigations_title_on_deep_pages(site, chromium):
    """On a deep page the left navigation is scrolled (to the page's link).

    Its title (the site's name) was sticky: the entry scrolled under it
    showed as a sliver below it. With the navigation scrolled, no entry's
    box may overlap the title's.
    """
    problems = []
    for width in (1280, 1600):
        for path in DEEP_PAGES:
            page = chromium.page(width, 900)
            page.load(site + path)
            found = page.evaluate(_NAV_UNDER_TITLE)
            assert found["scrolled"] > 0, f"/{path}: the navigation does not scroll"
            problems += [f"/{path} at {width} px: {u}" for u in found["under"]]
            page.send("Page.close")
    assert problems == []
