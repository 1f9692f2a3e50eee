"""Headless Chromium from the OS packages (``/usr/bin/chromium``, which ``.ci/run`` installs), driven by Playwright's
Python package: never a browser Playwright downloads. Reports are opened from disk as a user opens them."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BOKEH_IDLE = "window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"


def require_chromium() -> None:
    """The set-up installs the browser; a missing one fails the test naming the command (no test skips for a missing
    environment)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh chromium (as root: apt-get install -y chromium)")


@contextmanager
def chromium() -> Iterator:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class OpenedReport:
    page: object
    console_errors: list[str] = field(default_factory=list)
    network_requests: list[str] = field(default_factory=list)  # requests beyond the file itself (offline: refused)


def open_report(browser, path: Path, *, offline: bool = False, width: int = 1400, height: int = 900) -> OpenedReport:
    """Open ``path`` from disk and wait until Bokeh has rendered every chart. ``offline``: the context has no
    network and refuses every request other than the file itself, recording each attempt."""
    context = browser.new_context(viewport={"width": width, "height": height}, offline=offline)
    opened = OpenedReport(page=None)
    if offline:

        def refuse(route) -> None:
            if route.request.url == path.resolve().as_uri():
                route.continue_()
            else:
                opened.network_requests.append(route.request.url)
                route.abort()

        context.route("**/*", refuse)
    page = context.new_page()
    page.on("console", lambda message: opened.console_errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: opened.console_errors.append(str(error)))
    page.on("request", lambda request: None if request.url.startswith(("file:", "data:", "blob:"))
            else opened.network_requests.append(request.url))  # fmt: skip
    page.goto(path.resolve().as_uri())
    page.wait_for_function(BOKEH_IDLE, timeout=60_000)
    opened.page = page
    return opened


RENDERED_FIGURES = """() => {
  const doc = Bokeh.documents[0];
  const figures = doc.roots().filter((model) => model.type === "Figure" || model.constructor.name === "Figure");
  const views = Object.values(Bokeh.index).filter((view) => view.constructor.name === "FigureView");
  const drawn = views.filter((view) => {
    const canvases = view.canvas_view.el.shadowRoot ? view.canvas_view.el.shadowRoot.querySelectorAll("canvas") : [];
    const box = view.canvas_view.el.getBoundingClientRect();
    return canvases.length > 0 && box.width > 0 && box.height > 0;
  });
  return {figures: figures.map((f) => f.title ? f.title.text : ""), drawn: drawn.map((v) => v.model.title.text)};
}"""


CELL_POSITION = """([gridIndex, key]) => {
  const source = Bokeh.documents[0].get_model_by_name("grid_source_" + gridIndex);
  const index = source.data.key.indexOf(key);
  const view = Object.values(Bokeh.index).find((v) => v.model.y_range.name === "grid_rows_" + gridIndex);
  view.el.scrollIntoView({block: "center"});
  const x = view.frame.x_scale.compute(view.model.x_range.synthetic(source.data.sample[index]));
  const y = view.frame.y_scale.compute(view.model.y_range.synthetic(source.data.row[index]));
  const box = view.canvas_view.el.getBoundingClientRect();
  return {x: box.left + x, y: box.top + y};
}"""


def click_cell(page, grid_index: int, key: str) -> None:
    """Click the grid cell of episode ``key`` where it is drawn on the canvas (a real mouse click), at a person's pace:
    Bokeh reads two taps within its double-tap interval as one gesture and fires no tap callback for the second
    (clicking two cells 0.1 s apart opened the second 1 time in 4 here; after 0.4 s, 4 in 4)."""
    page.wait_for_timeout(400)
    position = page.evaluate(CELL_POSITION, [grid_index, key])
    page.mouse.click(position["x"], position["y"])
