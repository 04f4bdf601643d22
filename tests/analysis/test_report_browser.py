"""report/index.html in a real browser (issue 37, item 7): the page users open and share.

Chromium (Debian's chromium and chromium-driver; scripts/test.sh installs them as root), driven
by Selenium at a laptop's 1366×768, opens the report of a small CPU sweep folder (the demo's
shape: flags, a check-failed run, an empty cell left out by the budget, a search table) and the
report of a sweep with no successful run. On each: every figure loads (a non-zero natural size),
every link and anchor resolves, the console has no error, the tables and the flags are there
and readable (no horizontal overflow of the page, no text cut off or outside the window). The
checks themselves are shown to catch a broken page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from analysis.sweep_report import report_sweep
from sweep.collect.attempts import RUNS_FILE, write_runs
from sweep.collect.schema import to_table
from sweep.core.state import BUDGET_LEFT_OUT_FILE, SEARCH_PROGRESS_FILE
from sweep.plan.plan_file import PLAN_FILE

WIDTH, HEIGHT = 1366, 768
MIN_FONT_PX = 10.0  # smallest text a reader is asked to read


def _browser() -> tuple[str, str]:
    """Chromium and its driver; skip only where they are missing and cannot be installed."""
    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
    driver = shutil.which("chromedriver")
    if binary and driver:
        return binary, driver
    if os.geteuid() == 0:
        pytest.fail("Chromium or chromedriver is missing, yet this is root: scripts/test.sh installs "
                    "them (apt-get install chromium chromium-driver)")
    pytest.skip("Chromium and chromium-driver are not installed and this is not root, so "
                "scripts/test.sh cannot install them: apt-get install chromium chromium-driver")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    binary, driver_path = _browser()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={WIDTH},{HEIGHT}", "--allow-file-access-from-files"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _demo_folder(rows: list[dict[str, Any]], folder: Path) -> Path:
    """A sweep folder as a capped search leaves it: runs.parquet, the plan, the runs the budget
    left out, the search's progress per cell."""
    folder.mkdir(parents=True)
    write_runs(to_table(rows), folder / RUNS_FILE)
    plan = pd.DataFrame([{"model": "tiny-4l", "nodes": n, "run_id": r, "status": "kept",
                          "prune_rule": None}
                         for n, r in ((1, "impossible"), (1, "disputed"), (1, "clean"),
                                      (2, "two-node"), (2, "oom"), (4, "four-a"), (4, "four-b"))])
    plan.to_parquet(folder / PLAN_FILE, index=False)
    (folder / BUDGET_LEFT_OUT_FILE).write_text("four-a\nfour-b\n")
    pd.DataFrame([{"cell": f"tiny-4l|{n}", "candidates": c, "launched": launched,
                   "completed": done, "failed": launched - done,
                   "best_tokens_per_s_per_gpu": best, "rounds": 2, "closed_at_round": 2.0,
                   "regret_bound_at_close": 0.0, "forced_by_floor": 0,
                   "skipped:dominated by a completed layout": skipped, "skipped:oom rule": 0}
                  for n, c, launched, done, best, skipped in ((1, 3, 3, 3, 1000.0, 0),
                                                              (2, 2, 2, 1, 800.0, 0),
                                                              (4, 2, 0, 0, None, 2))]
                 ).to_csv(folder / SEARCH_PROGRESS_FILE, index=False)
    return folder


@pytest.fixture(scope="module")
def reports(tmp_path_factory, demo_rows) -> dict[str, Path]:
    """index.html of the demo-shaped sweep folder and of one without a successful run."""
    run_row, rows = demo_rows
    root = tmp_path_factory.mktemp("browser")
    demo = report_sweep(_demo_folder(rows, root / "demo") / RUNS_FILE)
    failed = [run_row("a", None, outcome="oom"), run_row("b", None, nodes=2, outcome="oom"),
              run_row("c", None, nodes=2, outcome="timeout")]
    folder = root / "empty"
    folder.mkdir()
    write_runs(to_table(failed), folder / RUNS_FILE)
    empty = report_sweep(folder / RUNS_FILE)
    assert demo.flags and not empty.best["run_id"].notna().any()
    return {"demo": demo.out_dir / "index.html", "empty": empty.out_dir / "index.html"}


_IMAGES_LOADED = """
const done = arguments[arguments.length - 1];
Promise.all([...document.images].map(img => img.complete ? null :
  new Promise(ok => { img.onload = ok; img.onerror = ok; })))
  .then(() => done([...document.images].map(img =>
    [img.getAttribute('src'), img.naturalWidth, img.naturalHeight])));
"""

_LAYOUT = """
const view = document.documentElement.clientWidth;
const out = {view: view, page: document.documentElement.scrollWidth,
             body: document.body.scrollWidth, outside: [], clipped: [], small: []};
for (const el of document.body.querySelectorAll('*')) {
  const r = el.getBoundingClientRect();
  const text = (el.innerText || '').trim().slice(0, 60);
  if (r.width === 0 && r.height === 0) continue;
  if (r.left < -0.5 || r.right > view + 0.5) out.outside.push([el.tagName, text, r.left, r.right]);
  if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0 && el.tagName !== 'IMG')
    out.clipped.push([el.tagName, text, el.scrollWidth, el.clientWidth]);
  const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  if (own && parseFloat(getComputedStyle(el).fontSize) < arguments[0])
    out.small.push([el.tagName, text, getComputedStyle(el).fontSize]);
}
out.tables = [...document.querySelectorAll('table')].map(t =>
  [t.rows.length, t.rows[0] ? t.rows[0].innerText : '', t.getBoundingClientRect().width]);
out.flags = [...document.querySelectorAll('.flag')].map(f => f.innerText);
return out;
"""


def page_problems(driver: webdriver.Chrome, index: Path) -> dict[str, list[Any]]:
    """Everything wrong with `index` as Chromium shows it at WIDTH×HEIGHT; empty lists: nothing."""
    driver.set_window_size(WIDTH, HEIGHT)
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(index.as_uri())
    images = driver.execute_async_script(_IMAGES_LOADED)
    problems: dict[str, list[Any]] = {
        "images": [i for i in images if not (i[1] > 0 and i[2] > 0)] + ([] if images else ["none"])}
    links = driver.execute_script(
        "return [...document.querySelectorAll('a[href]')].map(a => [a.getAttribute('href'), a.href])")
    unresolved = []
    for raw, absolute in links:
        if raw.startswith("#"):
            if not driver.execute_script("return document.getElementById(arguments[0]) !== null",
                                         raw[1:]):
                unresolved.append(raw)
        else:
            url = urlparse(absolute)
            if url.scheme != "file" or not Path(unquote(url.path)).is_file():
                unresolved.append(raw)
    problems["links"] = unresolved + ([] if links else ["none"])
    problems["console"] = [entry["message"] for entry in driver.get_log("browser")
                           if entry["level"] in ("SEVERE", "WARNING")]
    layout = driver.execute_script(_LAYOUT, MIN_FONT_PX)
    problems["overflow"] = ([] if layout["page"] <= layout["view"] and layout["body"] <= layout["view"]
                            else [(layout["page"], layout["body"], layout["view"])])
    problems["outside"], problems["clipped"], problems["small"] = (
        layout["outside"], layout["clipped"], layout["small"])
    problems["tables"] = [] if len(layout["tables"]) >= 2 and all(
        rows >= 2 for rows, _, _ in layout["tables"]) else [layout["tables"]]
    problems["layout"] = [layout]  # for the assertion message; not a problem in itself
    return problems


def _assert_clean(problems: dict[str, list[Any]]) -> None:
    layout = problems.pop("layout")
    assert {k: v for k, v in problems.items() if v} == {}, layout


@pytest.mark.parametrize("name", ["demo", "empty"])
def test_the_report_reads_in_chromium_at_a_laptops_width(browser, reports, name: str) -> None:
    _assert_clean(page_problems(browser, reports[name]))


def test_the_demo_reports_tables_and_flags_are_on_the_page(browser, reports) -> None:
    problems = page_problems(browser, reports["demo"])
    layout = problems["layout"][0]
    headers = [header for _, header, _ in layout["tables"]]
    assert any("Tokens/s/rank" in h and "MFU (%) (ranked)" in h for h in headers), headers
    assert any("completed" in h and "oom" in h for h in headers), headers  # failures
    assert any("launched" in h for h in headers), headers  # the search
    kinds = {flag.split(" ")[0] for flag in layout["flags"]}
    assert {"failed-check", "collect-issues"} <= kinds, layout["flags"]
    text = browser.find_element("tag name", "body").text
    for phrase in ("left out by the budget: 2 planned run(s) over the GPU-hour cap",
                   "MFU divides by a measured CPU peak, not a datasheet figure (measured:matmul)"):
        assert phrase in text, phrase


def test_the_empty_report_says_no_run_succeeded(browser, reports) -> None:
    page_problems(browser, reports["empty"])
    text = browser.find_element("tag name", "body").text
    assert "no successful run: 1 oom, 1 timeout" in text
    assert "No flags" in text or browser.find_elements("css selector", ".flag")


@pytest.fixture
def broken(reports, tmp_path) -> Callable[[Callable[[str], str]], Path]:
    """A copy of the demo report with its index.html edited."""
    def make(edit: Callable[[str], str]) -> Path:
        copy = tmp_path / "copy"
        shutil.copytree(reports["demo"].parent, copy)
        index = copy / "index.html"
        index.write_text(edit(index.read_text(encoding="utf-8")), encoding="utf-8")
        return index
    return make


def test_the_checks_catch_a_broken_page(browser, broken) -> None:
    """A missing figure, a dead link and anchor, a script error and a line too wide to fit:
    each check sees its own."""
    index = broken(lambda page: page.replace(
        "</body>", '<img src="missing.png"><a href="nowhere.csv">x</a><a href="#nowhere">y</a>'
        '<script>undefined_function()</script>'
        '<p style="white-space:nowrap">' + "wide " * 400 + "</p></body>"))
    problems = page_problems(browser, index)
    assert [image[0] for image in problems["images"]] == ["missing.png"]
    assert problems["links"] == ["nowhere.csv", "#nowhere"]
    assert any("undefined_function" in message for message in problems["console"])
    assert problems["overflow"] and any("wide wide" in c[1] for c in problems["clipped"])
