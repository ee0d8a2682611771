"""The HTML reports in a real headless browser (Debian's chromium driven by Selenium through chromedriver):
every table has rows and every chart decodes (an embedded SVG that is not valid loads with naturalWidth 0).

The reports are built from committed GPU evidence (a one-GPU and a two-GPU mfu run end to end) and from an
empty run. Without chromium the tests skip with a message, except in CI (`.ci/apt-install.sh` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from vast_harness.fleet.run import RunOutcome
from vast_harness.reports.fleet import build_rows, write_fleet_report
from vast_harness.reports.run import write_run_report

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
            pytest.fail("chromium/chromedriver missing in CI: .ci/apt-install.sh should have installed them")
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


RENDER_CHECK = r"""
const tables = [...document.querySelectorAll('table')];
const imgs = [...document.querySelectorAll('img')];
return {
  tables: tables.map(t => ({cls: t.className, rows: t.querySelectorAll('tbody tr').length,
                            height: t.getBoundingClientRect().height})),
  images: imgs.map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                          shown: i.getBoundingClientRect().width})),
  external: [...document.querySelectorAll('[src],link[href]')].map(e => e.getAttribute('src') || e.getAttribute('href'))
            .filter(u => /^[a-z]+:|^\/\//i.test(u) && !u.startsWith('data:')),
  links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  emptyHeaders: [...document.querySelectorAll('thead tr')].filter(r => !r.textContent.trim()).length,
  bodyWidth: document.body.getBoundingClientRect().width,
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
    assert info["emptyHeaders"] == 0  # a label/value table has no header row rather than an empty one


def assert_links_resolve(info: dict, page: Path) -> None:
    """Every link is relative and names a file beside the report (a step log, a run's report), or is an
    instance's page in Vast's console (a real run only)."""
    for href in info["links"]:
        if href.startswith("https://"):
            assert href == "https://cloud.vast.ai/instances/", href
            continue
        assert (page.parent / href).is_file(), href


def copy_runs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, src in EVIDENCE.items():
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        out[name] = dst
    return out


def test_run_report_renders_every_table_and_chart(browser, tmp_path):
    runs = copy_runs(tmp_path)
    path = write_run_report(runs["H200 x2"])  # a record from before the timeline: the rest still renders
    info = render(browser, path)
    # summary, steps, timings, absence, MFU tables; the MFU sweep (mb 8 and 16 at world 2)
    assert_all_rendered(info, min_tables=5, min_images=1)
    assert {t["cls"] for t in info["tables"]} >= {"summary", "steps", "timings", "absence", "mfu"}
    assert any(i["alt"] == "MFU vs micro-batch per world size" for i in info["images"])
    assert_links_resolve(info, path)
    assert any(h.startswith("steps/") for h in info["links"])


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory) -> Path:
    """A real run on the simulator (with the timeline in its record), given the two-GPU sweep's records."""
    from pydantic import SecretStr

    from vast_harness.console.output import Output
    from vast_harness.run.runner import GuardedRun
    from vast_harness.sim import SimServer
    from vast_harness.spec.profile import Step, load_driver_policy
    from vast_harness.spec.resolve import RunOptions, resolve
    from vast_harness.vast.client import VastClient

    tmp = tmp_path_factory.mktemp("fresh")
    key = "sim-browser-key"
    with SimServer(seed=31, rate_scale=0.01, boot_seconds=0.2, num_offers=200) as sim:
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp / "ev", proof_interval_s=0.2), environ={})
        steps = [Step(name="warm-up", run="sleep 1; echo warm", timeout_s=30),
                 Step(name="sweep", run="sleep 2; echo swept", timeout_s=30)]
        spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"steps": steps}),
                                       "api_url": sim.url, "api_key": SecretStr(key)}
                                           ).with_timings(teardown_margin_s=2.0)
        with VastClient(key, base_url=sim.url, pacing_scale=0.01) as client:
            run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
            assert run.execute().exit_code in (0, 4)
    for src in (EVIDENCE["H200 x2"] / "remote").glob("mfu-*.json"):
        shutil.copy(src, run.ev.dir / "remote" / src.name)
    return run.ev.dir


def test_a_fresh_run_report_shows_the_timeline_the_cap_line_the_sweep_and_log_links(browser, fresh_run):
    path = write_run_report(fresh_run)
    info = render(browser, path)
    assert_all_rendered(info, min_tables=7, min_images=3)
    alts = {i["alt"] for i in info["images"]}
    assert {"timeline of the run's phases", "MFU vs micro-batch per world size"} <= alts
    # one cost chart, at the one useful scale: this run spent <1% of its cap, so its own, the cap named
    assert [a for a in alts if "cost" in a] == ["accrued cost at its own scale, the cap far above"]
    classes = {t["cls"] for t in info["tables"]}
    assert {"timeline", "profile", "plan", "steps"} <= classes
    timeline = next(t for t in info["tables"] if t["cls"] == "timeline")
    assert timeline["rows"] >= 8  # plan, create, boot, upload, 2 steps, pull, teardown (+ DELETE, proof rounds)
    assert_links_resolve(info, path)
    assert {"steps/warm-up.log", "steps/sweep.log"} <= set(info["links"])
    text = browser.find_element("tag name", "body").text
    assert "cap $0.50" not in text  # the cap is in the chart; the page says it as a share
    assert "% of the $0.50 cap" in text and "$0.0" in text
    assert "132,006" in text and "66,002.9" in text  # thousands separators (the sweep's tokens/s)


def test_a_run_report_uses_the_window_and_links_every_evidence_file(browser, fresh_run, tmp_path):
    run = tmp_path / fresh_run.name
    shutil.copytree(fresh_run, run)
    (run / "deadman.log").write_text("armed\n")
    (run / "remote" / "nested").mkdir()
    (run / "remote" / "nested" / "trace.txt").write_text("x\n")
    record = json.loads((run / "harness-result.json").read_text())
    iid = record["instances"][0]["instance_id"]
    path = write_run_report(run)
    info = render(browser, path)
    assert info["bodyWidth"] > 1200  # the window's width (1280), not a 1100 px column
    beside = browser.execute_script(
        "const i = document.querySelector('img.timeline'), t = document.querySelector('table.timeline');"
        "return [i.getBoundingClientRect().top, t.getBoundingClientRect().top,"
        "        i.getBoundingClientRect().right <= t.getBoundingClientRect().left]")
    assert beside[0] == beside[1] and beside[2]  # the timeline's table beside its chart, not under it
    assert {"harness-result.json", "absence-proof.json", "offer-quote.json", "deadman.log", "steps.tsv",
            "remote/nested/trace.txt"} <= set(info["links"])
    assert {f"remote/{p.name}" for p in (run / "remote").glob("mfu-*.json")} <= set(info["links"])
    assert "https://cloud.vast.ai/instances/" not in info["links"]  # a simulated instance is in no console
    assert_links_resolve(info, path)
    record["sim"] = False  # the same record from a real run: its instance in Vast's console
    (run / "harness-result.json").write_text(json.dumps(record))
    info = render(browser, write_run_report(run))
    assert "https://cloud.vast.ai/instances/" in info["links"]
    assert f"instance {iid}" in browser.find_element("tag name", "body").text
    assert_links_resolve(info, path)


def test_a_single_measurement_draws_no_one_bar_chart(browser, tmp_path):
    runs = copy_runs(tmp_path)
    run = runs["H200"]
    measured = sorted((run / "remote").glob("mfu-*.json")) + [run / "remote" / "replay.json"]
    for extra in measured[1:]:
        extra.unlink()
    info = render(browser, write_run_report(run))
    assert not [i for i in info["images"] if i["alt"] == "MFU per measurement"], info["images"]
    assert next(t for t in info["tables"] if t["cls"] == "mfu")["rows"] == 1


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory) -> Path:
    """A real run on the simulator that the time cap stopped mid-step (exit 6)."""
    from pydantic import SecretStr

    from vast_harness.console.output import Output
    from vast_harness.run.runner import GuardedRun
    from vast_harness.sim import SimServer
    from vast_harness.spec.profile import Step, load_driver_policy
    from vast_harness.spec.resolve import RunOptions, resolve
    from vast_harness.vast.client import VastClient

    tmp = tmp_path_factory.mktemp("capped")
    key = "sim-capped-key"
    with SimServer(seed=34, rate_scale=0.01, boot_seconds=0.2, num_offers=200) as sim:
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp / "ev", proof_interval_s=0.2,
                                  max_minutes=0.1), environ={})
        steps = [Step(name="warm-up", run="sleep 1; echo warm", timeout_s=30),
                 Step(name="long", run="sleep 60", timeout_s=120)]
        spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"steps": steps}),
                                       "api_url": sim.url, "api_key": SecretStr(key)}
                               ).with_timings(teardown_margin_s=2.0)
        with VastClient(key, base_url=sim.url, pacing_scale=0.01) as client:
            run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
            assert run.execute().exit_code == 6
    return run.ev.dir


def test_a_run_the_time_cap_stopped_shows_the_cap_and_the_work_deadline_on_its_timeline(browser, capped_run):
    path = write_run_report(capped_run)
    info = render(browser, path)
    assert_all_rendered(info, min_tables=5, min_images=2)
    browser.get(path.as_uri())
    src = browser.execute_script("return document.querySelector('img.timeline').src")
    markers = {t["text"] for t in _svg_texts(browser, src) if t["cls"] == "marker"}
    assert {"time cap", "work deadline"} <= markers, markers


SVG_TEXT_CHECK = """
const svg = document.documentElement;
const vb = svg.viewBox.baseVal;
return [...document.querySelectorAll('text, rect.phase')].map(t => {
  const b = t.getBoundingClientRect();
  return {text: t.textContent, cls: t.getAttribute('class') || '', x0: b.left, y0: b.top, x1: b.right, y1: b.bottom,
          w: vb.width, h: vb.height};
});
"""


def _svg_texts(browser, img_src: str) -> list[dict]:
    browser.get(img_src)
    return browser.execute_script(SVG_TEXT_CHECK)


def _overlap(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] - 0.5 and b["x0"] < a["x1"] - 0.5 and a["y0"] < b["y1"] - 0.5 and b["y0"] < a["y1"] - 0.5


def test_chart_labels_neither_clip_nor_overlap(browser, fresh_run, capped_run, tmp_path):
    """Measured by the browser's own text layout: every label inside its chart; event labels and point
    labels never on top of each other (the cost plot's event labels and the scatter's "H100 SXM" did)."""
    from vast_harness.reports import svg as svgplot

    sources = []
    for run in (fresh_run, capped_run):
        browser.get(write_run_report(run).as_uri())
        sources += browser.execute_script("return [...document.images].map(i => [i.alt, i.src])")
    points = [(0.0068, 29.9, "RTX 4090"), (0.0127, 31.9, "RTX 5090"), (0.0322, 7.1, "H100 SXM"),
              (0.0321, 7.3, "H100 PCIe")]
    scatter = "data:image/svg+xml;base64," + __import__("base64").b64encode(svgplot.scatter(
        points, title="t", xlabel="x", ylabel="y").encode()).decode()
    crowded = svgplot.lines([("a", [(0.0, 0.0), (100.0, 1.0)])], title="t", xlabel="x", ylabel="y",
                            markers=[(10.0, "end one"), (10.4, "end two"), (11.0, "DELETE"), (60.0, "end three")])
    sources.append(["crowded markers", "data:image/svg+xml;base64,"
                    + __import__("base64").b64encode(crowded.encode()).decode()])
    gantt = svgplot.timeline([("step", 0.0, 3.8, "$0.0002"), ("teardown", 3.85, 5.5, "$0.0000")],
                             title="t", xlabel="x", events=[(3.85, "DELETE"), (3.92, "DELETE ack"),
                                                            (3.96, "proof 1: going"), (4.18, "proof 2: gone")])
    sources.append(["crowded timeline", "data:image/svg+xml;base64,"
                    + __import__("base64").b64encode(gantt.encode()).decode()])
    sources.append(["scatter", scatter])
    for alt, src in sources:
        texts = _svg_texts(browser, src)
        assert texts, alt
        for t in texts:
            assert t["x0"] >= -0.5 and t["y0"] >= -0.5 and t["x1"] <= t["w"] + 0.5 and t["y1"] <= t["h"] + 0.5, (alt, t)
        for kind in ("marker", "label"):
            group = [t for t in texts if t["cls"] == kind]
            for i, a in enumerate(group):
                for b in group[i + 1:]:
                    assert not _overlap(a, b), (alt, a, b)
        for a in [t for t in texts if t["cls"] == "marker"]:  # nor on a title, a tick, a legend, a bar or its note
            for b in [t for t in texts if t["cls"] != "marker"]:
                assert not _overlap(a, b), (alt, a, b)


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
    # the ranking, the runs' links + per run (summary, steps, timings, absence, mfu); the scatter + the MFU charts
    assert_all_rendered(info, min_tables=2 + 5 * 2, min_images=1 + 2)
    assert info["tables"][0]["cls"] == "fleet" and info["tables"][0]["rows"] == 3
    assert info["images"][0]["alt"].startswith("MFU vs")
    assert_links_resolve(info, path)


def test_fleet_report_links_each_run_and_draws_the_fleet_cost_against_its_cap(browser, fresh_run, tmp_path):
    fleet_dir = tmp_path / "fleet-x"
    run_dir = fleet_dir / fresh_run.name
    shutil.copytree(fresh_run, run_dir)
    write_run_report(run_dir)
    rows = build_rows([RunOutcome("RTX 4090", run_dir.name, 0, "passed", run_dir, 0.001)])
    # a total cap the fleet came near: its cost is drawn against it (a cheap run is drawn at its own scale)
    path = write_fleet_report(fleet_dir, "fleet-x", rows, {"exit_code": 0, "total_cap_usd": 0.001})
    info = render(browser, path)
    assert_all_rendered(info, min_tables=3, min_images=4)
    assert f"{run_dir.name}/report.html" in info["links"]
    assert f"{run_dir.name}/steps/sweep.log" in info["links"]
    assert_links_resolve(info, path)
    assert "fleet cost against the total cap" in {i["alt"] for i in info["images"]}


@pytest.mark.parametrize(("lo", "hi"), [(0.0049, 0.0344), (0.0, 8.7), (3.0, 3.0), (-2.0, 97.0), (0.0, 1e-7)])
def test_axis_ticks_cover_the_data(lo, hi):
    from vast_harness.reports.svg import nice_ticks

    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and ticks == sorted(ticks) and len(ticks) <= 12


def _simulated_fleet(fresh_run: Path, fleet_dir: Path) -> Path:
    """A fleet directory as `fleet --sim` leaves it: one run (a simulated one), fleet.jsonl, the result, the report."""
    run_dir = fleet_dir / fresh_run.name
    shutil.copytree(fresh_run, run_dir)
    write_run_report(run_dir)
    (fleet_dir / "fleet.jsonl").write_text('{"event": "fleet-start"}\n{"event": "fleet-end"}\n')
    rows = build_rows([RunOutcome("RTX 4090", run_dir.name, 0, "passed", run_dir, 0.001)])
    return write_fleet_report(fleet_dir, fleet_dir.name, rows, {"fleet_id": fleet_dir.name, "exit_code": 0,
                                                                "total_cap_usd": 2.0, "sim": True,
                                                                "dir": str(fleet_dir)})


def test_a_simulated_fleet_says_so_greys_its_cpu_round_figures_and_links_its_files(browser, fresh_run, tmp_path):
    path = _simulated_fleet(fresh_run, tmp_path / "fleet-20260101T000000Z-sim")
    info = render(browser, path)
    assert_links_resolve(info, path)
    assert {"fleet.jsonl", "fleet-result.json"} <= set(info["links"])
    top = browser.execute_script("return document.querySelector('h1').textContent + ' | ' + "
                                 "document.querySelector('p.simulated').textContent")
    assert "SIMULATED" in top and "CPU round" in top, top
    cells = browser.execute_script(
        "const t = document.querySelector('table.fleet'); const heads = [...t.querySelectorAll('th')].map(h => "
        "h.textContent); const row = t.querySelector('tbody tr').children;"
        "return Object.fromEntries(heads.map((h, i) => [h, [row[i].textContent, getComputedStyle(row[i]).color]]))")
    grey = "rgb(153, 153, 153)"
    for column in ("MFU %", "tokens/s per GPU", "tokens/s total", "$ per M tokens"):
        assert cells[column][1] == grey, (column, cells[column])
    assert cells["GPU"][1] != grey and cells["$/h"][1] != grey


def test_report_rebuilds_a_fleet_report_by_its_id(fresh_run, tmp_path):
    """`vast-e2e report FLEET`: the fleet's page again, from fleet-result.json and its runs' evidence, even
    after the directory moved."""
    from tests.harness.clirun import cli

    home = tmp_path / "home"
    first = tmp_path / "elsewhere" / "fleet-20260101T000000Z-abcdef"
    _simulated_fleet(fresh_run, first)
    moved = home / "state" / "sim" / first.name
    moved.parent.mkdir(parents=True)
    shutil.move(first, moved)
    (moved / "fleet-report.html").unlink()
    result_before = (moved / "fleet-result.json").read_bytes()
    done = cli("report", "fleet-20260101T000000Z", home=home)  # a unique part of the id is enough
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(moved / "fleet-report.html")
    html = (moved / "fleet-report.html").read_text()
    assert f'href="{fresh_run.name}/report.html"' in html and "SIMULATED" in html  # the run found beside it
    assert (moved / "fleet-result.json").read_bytes() == result_before  # what the fleet decided stays as it was
    assert json.loads(cli("report", str(moved), "--json", home=home).stdout)["report"] == str(moved / "fleet-report.html")
    missing = cli("report", "fleet-nope", home=home)
    assert missing.returncode == 2 and "no fleet 'fleet-nope'" in missing.stderr
