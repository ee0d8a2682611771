"""The job summary (`vast-e2e summary`, reports/markdown.py) of real runs on the simulator: what it says (the
verdict, cost against the caps, the GPU that ran, the receipt, the steps, the absence proof, the artifacts, the
notifications, the reap), how it reads when the run was refused or killed, the outputs file, that nothing a host
or a user wrote can open markup in it, and how it looks: rendered as a Markdown previewer renders it (markdown-it,
GitHub's table extension) in headless chromium, with a screenshot written to the test output directory
(`$VH_TEST_OUTPUT_DIR`, else pytest's base temp directory; the path is printed).
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.harness.clirun import cli, spawn
from tests.harness.receiver import Receiver
from tests.harness.test_report_browser import browser  # noqa: F401 - the fixture
from vast_harness.reports.markdown import MAX_PAGE_CHARS, code_span, md

KEY = "vhkey-SUMMARY-1a2b3c4d5e"
SECRET = "summary-secret-9z8y7x"

GITHUB_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;font-size:14px;
line-height:1.5;color:#1f2328;max-width:1012px;margin:24px auto;padding:0 16px}
h3{font-size:1.25em;margin-top:24px;margin-bottom:16px}h4{font-size:1em;margin-top:24px;margin-bottom:16px}
table{border-spacing:0;border-collapse:collapse;margin-bottom:16px;display:block;width:max-content;max-width:100%;
overflow:auto}th,td{padding:6px 13px;border:1px solid #d1d9e0}th{font-weight:600}tr:nth-child(2n){background:#f6f8fa}
code{padding:.2em .4em;font-size:85%;background:rgba(175,184,193,.2);border-radius:6px;
font-family:ui-monospace,SFMono-Regular,Menlo,monospace}ul{padding-left:2em}
"""


def render_html(markdown: str) -> str:
    """As a Markdown previewer shows it: CommonMark with GitHub's tables, raw HTML off (GitHub strips it too)."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough").render(markdown)
    return f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{GITHUB_CSS}</style></head><body>{body}</body></html>'


def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = Path(os.environ.get("VH_TEST_OUTPUT_DIR") or tmp_path_factory.getbasetemp() / "test-output")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A `vast-e2e run --sim` with an artifact, a secret, a receiver that answers and one that fails, and its
    `--json` result: what the action's summary step reads."""
    home = tmp_path_factory.mktemp("summary")
    work = home / "project"
    work.mkdir()
    (work / "train.py").write_text("import os\nos.makedirs('out', exist_ok=True)\nopen('out/m.json','w').write('{}')\n"
                                   "print('token', os.environ['TRACKER_TOKEN'])\n")
    with Receiver() as rx:
        done = cli("run", "--sim", "--workdir", str(work), "--artifact", "out/**", "--json",
                   "--remote-secret", f"TRACKER_TOKEN={SECRET}", "--notify", rx.url("/ok/tok-a"),
                   "--notify", rx.url("/fail/tok-b"), "--evidence-dir", str(home / "ev"), "--",
                   "python", "train.py", home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    (home / "result.json").write_text(done.stdout)
    return {"home": home, "result": home / "result.json", "run": Path(json.loads(done.stdout)["evidence_dir"])}


def summary(ran: dict[str, Path], *args: str, env: dict[str, str] | None = None) -> tuple[str, str, int]:
    done = cli("summary", "--evidence-dir", str(ran["home"] / "ev"), *args, home=ran["home"], env=env)
    return done.stdout, done.stderr, done.returncode


def test_the_summary_says_the_verdict_the_cost_against_the_caps_the_gpu_the_steps_and_the_absence(ran):
    page, err, code = summary(ran, "--result", str(ran["result"]), "--outputs", str(ran["home"] / "out.txt"))
    assert code == 0, err
    record = json.loads((ran["run"] / "harness-result.json").read_text())
    for said in ("**exit 0 PASSED**: passed", f"`{record['run_id']}`",
                 f"of the ${record['caps']['max_usd']:.2f} cap", f"of the {record['caps']['max_minutes']:g} min cap",
                 "NVIDIA GeForce", "(simulated: from the offer)", "- **receipt**: passed", "#### Receipt",
                 "| run | 0 |", "#### Absence proof", "| deleted |", "**gone**: every instance deleted and proven absent",
                 "1 file(s)", "2 event(s) to 2 receiver(s): 2 of 4 deliveries answered 2xx",
                 "the receiver answered 500", "open `report.html` in it"):
        assert said in page, (said, page)
    assert SECRET not in page and "tok-a" not in page and "tok-b" not in page
    outputs = dict(line.split("=", 1) for line in (ran["home"] / "out.txt").read_text().splitlines())
    assert outputs == {"exit-code": "0", "accrued-usd": f"{record['accrued_usd']:.6f}", "run-id": record["run_id"],
                       "evidence-dir": str(ran["run"]), "absence": "gone"}
    assert len(page) < MAX_PAGE_CHARS


def test_a_refused_run_and_a_killed_run_still_get_a_page_that_says_so(ran, tmp_path):
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"run_id": "x", "exit_code": 2, "message": "--max-usd must be > 0",
                                   "evidence_dir": None, "accrued_usd": 0.0, "steps": [], "absence": {}}))
    page, _, code = summary(ran, "--result", str(refused), "--outputs", str(tmp_path / "o.txt"))
    assert code == 0 and "**exit 2 BAD_INPUT**: \\-\\-max-usd" not in page  # text, not code: dashes stay
    assert "**exit 2 BAD_INPUT**: --max-usd must be &gt; 0" in page and "Nothing was rented" in page
    assert "absence=nothing-created" in (tmp_path / "o.txt").read_text()
    killed = tmp_path / "killed.json"
    killed.write_text("")  # the run step was killed before it printed its result, and before its record
    started = calendar.timegm(time.strptime(ran["run"].name[:16], "%Y%m%dT%H%M%SZ"))
    os.utime(killed, (started - 1, started - 1))  # the shell's `> FILE` opened it just before the run started
    run = tmp_path / "ev" / ran["run"].name
    shutil.copytree(ran["run"], run)
    for name in ("harness-result.json", "absence-proof.json", "report.html"):
        (run / name).unlink()
    page, _, code = summary(ran, "--result", str(killed), "--evidence-dir", str(tmp_path / "ev"))
    assert code == 0 and "**no verdict**" in page and f"`{run.name}`" in page and "| run | 0 |" in page
    assert "not known from this run's files" in page and "`vast-e2e report` builds its `report.html`" in page
    assert "of the $1.00 cap" in page  # the caps from its plan (offer-quote.json)
    page, err, code = summary(ran, "--result", str(tmp_path / "nothing-here.json"), "--evidence-dir",
                              str(tmp_path / "empty"))
    assert code == 0 and "**no verdict**" in page and "no run found" in err


@pytest.mark.parametrize(("content", "says"), [
    (b"", "is empty: the run was killed"), (b"\x00\x9f\xfe binary \xff", "is unreadable (binary, not JSON)"),
    (b"null", "is unreadable (JSON null"), (b"[1,2,3]", "is unreadable (JSON an array"),
    (b'{"exit_code": 0, "message": "pas', "is unreadable (not JSON (cut short?))")])
def test_a_result_that_says_nothing_is_no_verdict_never_an_earlier_runs_pass(ran, tmp_path, content, says):
    """The evidence dir holds an earlier run that passed; this run's result was written after it and says
    nothing: the page and the outputs are this run's, "no verdict", its exit code and absence unknown."""
    result = tmp_path / "k.json"
    result.write_bytes(content)
    page, _, code = summary(ran, "--result", str(result), "--outputs", str(tmp_path / "o.txt"))
    assert code == 0 and "**no verdict**" in page and says in page, page
    assert "PASSED" not in page and ran["run"].name not in page and "| run | 0 |" not in page
    assert "No evidence of this run was found" in page
    outputs = dict(line.split("=", 1) for line in (tmp_path / "o.txt").read_text().splitlines())
    assert outputs == {"exit-code": "unknown", "accrued-usd": "unknown", "run-id": "unknown",
                       "evidence-dir": "unknown", "absence": "unknown"}


def test_a_run_killed_before_renting_has_a_value_for_every_output(tmp_path):
    """Red team r47 F8: a run killed before it rented leaves an empty result and no run directory; every
    output still has a value (`unknown`), as GitHub's expressions read an empty one as 0 or false."""
    result, ev, out = tmp_path / "result.json", tmp_path / "ev", tmp_path / "o.txt"
    result.write_text("")  # the shell's `> FILE` made it; the run was killed before it printed
    done = cli("summary", "--result", str(result), "--evidence-dir", str(ev), "--outputs", str(out), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "**no verdict**" in done.stdout and "No evidence of this run was found" in done.stdout, done.stdout
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs == {"exit-code": "unknown", "accrued-usd": "unknown", "run-id": "unknown",
                       "evidence-dir": "unknown", "absence": "unknown"}


def test_a_result_naming_a_run_id_is_that_runs_only(ran, tmp_path):
    other = tmp_path / "other.json"  # a run of another evidence dir, or one whose directory is gone
    other.write_text(json.dumps({"run_id": "20991231T235959Z-0ther1", "exit_code": 1, "message": "failed",
                                 "evidence_dir": str(tmp_path / "not-here"), "accrued_usd": 0.01}))
    page, _, code = summary(ran, "--result", str(other), "--outputs", str(tmp_path / "o.txt"))
    assert code == 0 and "**exit 1 FAILED**: failed" in page and "`20991231T235959Z-0ther1`" in page
    assert ran["run"].name not in page and "| run | 0 |" not in page
    outputs = dict(line.split("=", 1) for line in (tmp_path / "o.txt").read_text().splitlines())
    assert outputs["run-id"] == "20991231T235959Z-0ther1" and outputs["evidence-dir"] == "unknown"
    assert outputs["absence"] == "unknown"
    cut = tmp_path / "cut.json"  # cut short by a kill, after its run id: that run's directory, found by its id
    cut.write_text(f'{{"schema_version": 2, "run_id": "{ran["run"].name}", "exit_c')
    page, _, code = summary(ran, "--result", str(cut))
    assert code == 0 and "**exit 0 PASSED**" in page and f"`{ran['run'].name}`" in page


def test_nothing_a_host_or_a_user_wrote_opens_markup_and_every_secret_is_masked(ran, tmp_path):
    run = tmp_path / ran["run"].name
    shutil.copytree(ran["run"], run)
    record = json.loads((run / "harness-result.json").read_text())
    record["steps"][0]["name"] = "x|y<script>alert(1)</script>*bold*[link](https://evil.example)`tick`"
    record["message"] = f"host said ![img](https://evil.example/i.png) <b>hi</b> and {KEY}\nsecond line ~~s~~"
    (run / "harness-result.json").write_text(json.dumps(record))
    page, _, code = summary(ran, str(run), env={"VAST_API_KEY": KEY})
    assert code == 0 and KEY not in page
    html = render_html(page)
    assert "<script>" not in html and "<b>" not in html and "<img" not in html and "<a href" not in html
    assert "<del>" not in html and "<em>" not in html.split("Steps", 1)[1].split("Absence", 1)[0]
    assert "x|y&lt;script&gt;" in html  # shown as written, in one cell
    assert md("a|b") == "a\\|b" and code_span("a`b") == "``a`b``"


def test_the_page_renders_as_a_person_reads_it(ran, browser, tmp_path_factory):  # noqa: F811 - the fixture
    out = output_dir(tmp_path_factory)
    reap = out / "reap-result.json"  # what the reap step leaves after a cancel that killed the run mid-proof
    reap.write_text(json.dumps({"exit_code": 0, "reaped": {"25506161": "gone"}, "live": [], "not_proven": []}))
    page, _, _ = summary(ran, "--result", str(ran["result"]), "--reap-result", str(reap), "--artifact-name",
                         "vast-harness-gpu-4242-1")
    (out / "job-summary.md").write_text(page)
    html = out / "job-summary.html"
    html.write_text(render_html(page))
    browser.set_window_size(1100, 1800)
    browser.get(html.as_uri())
    shape = browser.execute_script(
        "return {tables: [...document.querySelectorAll('table')].map(t => t.querySelectorAll('tbody tr').length),"
        " headings: [...document.querySelectorAll('h3,h4')].map(h => h.textContent),"
        " bold: [...document.querySelectorAll('strong')].map(s => s.textContent),"
        " height: document.body.scrollHeight}")
    assert shape["headings"][:1] == ["vast-harness"]
    assert {"Steps", "Absence proof", "Receipt", "Follow-up reap"} <= set(shape["headings"])
    assert len(shape["tables"]) >= 3 and all(rows >= 1 for rows in shape["tables"]), shape
    assert "exit 0 PASSED" in shape["bold"] and "gone" in shape["bold"]
    browser.set_window_size(1100, min(4000, shape["height"] + 300))  # the window, not only the page, is that tall
    png = out / "job-summary.png"
    browser.save_screenshot(str(png))
    assert png.stat().st_size > 20_000
    print(f"job summary screenshot: {png}")


def test_a_kept_hosts_summary_is_the_holds_so_far_and_a_lost_steps_note(tmp_path):
    """A hold (docs/kept-host.md): while held, its state, its dollars and seconds from the hold's record (not its
    last command's), the GPUs of the up's host, and one absence word in the page and the outputs; after a `down`
    that cut an exec, that exec's row says its connection was lost."""
    from vast_harness.state.held import HeldStore

    home, wd = tmp_path, tmp_path / "wd"
    wd.mkdir()
    (wd / "t.py").write_text("print(1)\n")
    done = cli("up", "box", "--sim", "--workdir", str(wd), "--max-minutes", "5", "--idle-minutes", "2", home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    assert cli("exec", "box", "--", "python", "t.py", home=home).returncode == 0
    store = HeldStore(home / "state" / "sim")
    held = store.load("box")
    assert held is not None and held.created is not None
    hold_dir = Path(held.evidence_dir)
    record = json.loads((hold_dir / "harness-result.json").read_text())

    def earlier(r):  # the hold began 100 s ago: what it billed since, its last command did not see
        r.t0, r.created, r.cap_deadline = r.t0.plus(-100), r.created.plus(-100), r.cap_deadline.plus(-100)

    store.update("box", earlier)
    out = tmp_path / "o.txt"
    done = cli("summary", str(hold_dir), "--outputs", str(out), home=home)
    page = done.stdout
    assert done.returncode == 0, done.stderr
    floor_usd = 100 * held.dph_usd / 3600
    cost = next(line for line in page.splitlines() if line.startswith("- **cost**"))
    assert " so far" in cost and float(cost.split("$")[1].split()[0]) >= round(floor_usd, 4) > record["accrued_usd"]
    took = next(line for line in page.splitlines() if line.startswith("- **time**"))
    assert float(took.split(": ")[1].split()[0]) >= 100 and "of the 5 min cap" in took and "so far" in took
    assert "- **kept host**: box: held" in page and "held: not deleted yet" in page
    assert "record is missing" not in page and "none ran" not in page and "1x RTX" in page, page
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs["absence"] == "held" and float(outputs["accrued-usd"]) >= floor_usd
    # a down while an exec runs: the exec's connection is lost; the page's row for it says so
    proc = spawn("exec", "box", "--", "sh", "-c", "echo started; sleep 30", home=home)
    log, deadline = hold_dir / "steps" / "exec-2.log", time.monotonic() + 60
    while not (log.exists() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)  # the command runs on the host
    assert cli("down", "box", home=home).returncode == 0
    proc.communicate(timeout=60)
    page = cli("summary", str(hold_dir), home=home).stdout
    assert "- **kept host**: ended" in page and "**gone**" in page and "so far" not in page, page
    row = next(line for line in page.splitlines() if line.startswith("| exec-2 |"))
    assert row.rstrip(" |").endswith("connection lost"), row
    assert "| exec-1 | 0 |" in page


def test_a_run_killed_mid_step_is_shown_from_its_own_files(tmp_path):
    """A run killed with SIGKILL while its step prints (red team r46 F6): its result is empty, its record never
    written; the page says what its files say (the step that has a log, cut off with no exit code; the GPU of
    the host's receipt) and every output has a value. Once a reap's lines close its instance's span, its
    dollars are the ledger's estimate (as `costs` gives it)."""
    from vast_harness.state.ledger import Ledger

    home, wd, ev = tmp_path, tmp_path / "wd", tmp_path / "ev"
    wd.mkdir()
    (wd / "long.py").write_text("import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(1)\n")
    result = tmp_path / "r.json"
    with result.open("w") as fh:
        proc = spawn("run", "--sim", "--workdir", str(wd), "--max-minutes", "5", "--evidence-dir", str(ev), "--json",
                     "--", "python", "long.py", home=home, stdout=fh)
        deadline = time.monotonic() + 90
        logs: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list(ev.glob("*/steps/run.log"))
            if logs and "0\n" in logs[0].read_text(errors="replace"):
                break
            time.sleep(0.2)
        proc.kill()
        proc.communicate(timeout=30)
    assert logs and "0\n" in logs[0].read_text(), "the step never printed"
    run = logs[0].parent.parent
    assert not (run / "harness-result.json").exists() and result.read_text() == ""
    receipt = json.loads(next((run / "receipts").glob("*.json")).read_text())
    instance = next((run / "receipts").glob("*.json")).stem
    out = tmp_path / "o.txt"
    done = cli("summary", "--result", str(result), "--evidence-dir", str(ev), "--outputs", str(out), home=home)
    page = done.stdout
    assert done.returncode == 0, done.stderr
    assert "**no verdict**" in page and "is empty: the run was killed" in page, page
    assert "No step ran" not in page and "none ran" not in page, page
    row = next(line for line in page.splitlines() if line.startswith("| run |"))
    assert "cut off" in row and "| 0 |" not in row and "NA" not in row, row
    gpus = next(line for line in page.splitlines() if line.startswith("- **GPUs that ran**"))
    assert receipt["gpus"][0]["name"] in gpus and instance in gpus, gpus
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs == {"exit-code": "unknown", "accrued-usd": "unknown", "run-id": run.name,
                       "evidence-dir": str(run), "absence": "unknown"}
    # the follow-up reap deletes it and proves it gone (the lines a reap writes): the span is the ledger's
    ledger = Ledger(home / "state" / "sim" / "ledger.jsonl")
    lines = [e for e in ledger.entries() if e.run_id == run.name]
    created, price = next(e for e in lines if e.event == "created"), next(e for e in lines if e.event == "intent")
    assert created.instance_id == int(instance) and price.dph_usd
    ledger.append("reap-x", "delete_ack", created.label, instance_id=int(instance))
    gone = ledger.append("reap-x", "absence", created.label, instance_id=int(instance), verdict="gone")
    out.unlink()
    page = cli("summary", "--result", str(result), "--evidence-dir", str(ev), "--outputs", str(out), home=home).stdout
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    spent_usd = (gone.t_unix - created.t_unix) * price.dph_usd / 3600
    assert float(outputs["accrued-usd"]) == pytest.approx(spent_usd, rel=1e-3, abs=1e-6), outputs
    cost = next(line for line in page.splitlines() if line.startswith("- **cost**"))
    assert "estimated from the ledger" in cost, cost
