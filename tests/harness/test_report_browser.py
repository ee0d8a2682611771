"""The HTML reports in a real headless browser (Debian's chromium driven by Selenium through chromedriver):
every table has rows and every chart decodes (an embedded SVG that is not valid loads with naturalWidth 0).

The reports are built from committed GPU evidence (a one-GPU and a two-GPU mfu run end to end) and from an
empty run. Without chromium the tests skip with a message, except in CI (`.ci/install-chromium.sh` installs it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from vast_harness.fleet import RunOutcome
from vast_harness.fleet_report import build_rows, write_fleet_report
from vast_harness.report import write_run_report

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = {
    "H200": ROOT / ".evidence/h200/mfu-e2e-2026-11-29/20261129T082202Z-2d9d4d",
    "H200 x2": ROOT / ".evidence/h200x2/e2e/20261130T185434Z-10d3f6",
}


def _browser_paths() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists()
                                              else None)
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def browser():
    paths = _browser_paths()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("chromium/chromedriver missing in CI: .ci/install-chromium.sh should have installed them")
        pytest.skip("no chromium + chromedriver here (apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,2000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=opts)
    yield driver
    driver.quit()


RENDER_CHECK = """
const tables = [...document.querySelectorAll('table')];
const imgs = [...document.querySelectorAll('img')];
return {
  tables: tables.map(t => ({cls: t.className, rows: t.querySelectorAll('tbody tr').length,
                            height: t.getBoundingClientRect().height})),
  images: imgs.map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                          shown: i.getBoundingClientRect().width})),
  external: [...document.querySelectorAll('[src],[href]')].map(e => e.getAttribute('src') || e.getAttribute('href'))
            .filter(u => !u.startsWith('data:') && !u.startsWith('#')),
};
"""


def render(browser, path: Path) -> dict:
    browser.get(path.as_uri())
    browser.execute_script("return Promise.all([...document.images].map(i => i.decode().catch(() => null)))")
    return browser.execute_script(RENDER_CHECK)


def assert_all_rendered(info: dict, *, min_tables: int, min_images: int) -> None:
    assert len(info["tables"]) >= min_tables and len(info["images"]) >= min_images, info
    for t in info["tables"]:
        assert t["rows"] >= 1 and t["height"] > 0, t
    for i in info["images"]:
        assert i["complete"] and i["w"] > 0 and i["h"] > 0 and i["shown"] > 0, i
    assert info["external"] == []  # self-contained: readable offline


def copy_runs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, src in EVIDENCE.items():
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        out[name] = dst
    return out


def test_run_report_renders_every_table_and_chart(browser, tmp_path):
    runs = copy_runs(tmp_path)
    info = render(browser, write_run_report(runs["H200 x2"]))
    # summary, steps, timings, absence, MFU tables; the cost-over-time and the MFU charts
    assert_all_rendered(info, min_tables=5, min_images=2)
    assert {t["cls"] for t in info["tables"]} >= {"summary", "steps", "timings", "absence", "mfu"}


def test_report_of_a_run_that_rented_nothing_still_renders(browser, tmp_path):
    run = tmp_path / "20260101T000000Z-000000"
    (run / "remote").mkdir(parents=True)
    (run / "harness-result.json").write_text('{"run_id": "x", "exit_code": 5, "message": "no offer", "steps": []}')
    info = render(browser, write_run_report(run))
    assert_all_rendered(info, min_tables=3, min_images=0)


def test_fleet_report_renders_the_ranking_the_scatter_and_every_run(browser, tmp_path):
    runs = copy_runs(tmp_path)
    outcomes = [RunOutcome(gpu, path.name, 0, "passed", path, 0.0) for gpu, path in runs.items()]
    outcomes.append(RunOutcome("RTX 4090", None, 6, "not started: cap", None))
    rows = build_rows(outcomes)
    assert [r.gpu for r in rows][-1] == "RTX 4090"  # no figure: ranked last
    path = write_fleet_report(tmp_path, "fleet-test", rows, {"exit_code": 6, "total_cap_usd": 5})
    info = render(browser, path)
    # the ranking + per run (summary, steps, timings, absence, mfu); the scatter + per run cost and MFU charts
    assert_all_rendered(info, min_tables=1 + 5 * 2, min_images=1 + 2 * 2)
    assert info["tables"][0]["cls"] == "fleet" and info["tables"][0]["rows"] == 3
    assert info["images"][0]["alt"].startswith("MFU vs")


@pytest.mark.parametrize(("lo", "hi"), [(0.0049, 0.0344), (0.0, 8.7), (3.0, 3.0), (-2.0, 97.0), (0.0, 1e-7)])
def test_axis_ticks_cover_the_data(lo, hi):
    from vast_harness.svgplot import nice_ticks

    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and ticks == sorted(ticks) and len(ticks) <= 12
