"""`vast-e2e report`, `logs` and `costs` as a user runs them, on evidence a real simulated run
wrote, plus a run only the ledger knows (killed before its record) and hostile step output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.clirun import ROOT, cli
from vast_harness.state.ledger import Ledger


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One smoke run on the simulator whose step prints an escape sequence, in the state dir's sim/ part."""
    work = tmp_path_factory.mktemp("work")
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    text = text[: text.index("[[steps]]")] + ('[[steps]]\nname = "hello"\n'
                                              'run = "printf \'hi \\\\033]0;pwned\\\\007 there\\\\n\'"\ntimeout_s = 30\n')
    (work / "p.toml").write_text(text.replace('name = "smoke"', 'name = "hello-profile"'))
    done = cli("--profile", "p.toml", "--sim", home=work)
    assert done.returncode == 0, done.stderr[-2000:]
    return work


def run_id(work: Path) -> str:
    return next((work / "state" / "sim").glob("2*/harness-result.json")).parent.name


@pytest.mark.slow
def test_report_rebuilds_and_prints_the_path(work):
    rid = run_id(work)
    report = work / "state" / "sim" / rid / "report.html"
    report.unlink()
    done = cli("report", rid[-6:], home=work)  # a unique part of the id is enough
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(report) and report.is_file()
    check = subprocess.run(["sha256sum", "--strict", "-c", "manifest.sha256"], cwd=report.parent, capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # the manifest's report line follows the rebuild
    missing = cli("report", "nope", home=work)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


@pytest.mark.slow
def test_logs_lists_and_prints_a_step_escaped_unless_raw(work):
    rid = run_id(work)
    listed = cli("logs", rid, "--json", home=work)
    assert listed.returncode == 0, listed.stderr
    assert [r["step"] for r in json.loads(listed.stdout)["logs"]] == ["hello"]
    shown = cli("logs", rid, "hello", home=work)
    assert shown.returncode == 0 and "hi \\x1b]0;pwned\\x07 there" in shown.stdout and "\x1b" not in shown.stdout
    raw = cli("logs", rid, "hello", "--raw", home=work)
    assert "\x1b]0;pwned\x07" in raw.stdout
    bad = cli("logs", rid, "nosuch", home=work)
    assert bad.returncode == 2 and "steps: hello" in bad.stderr


@pytest.mark.slow
def test_costs_per_run_day_profile_and_totals(work):
    ev = work / "state" / "sim"
    record = json.loads(next(ev.glob("2*/harness-result.json")).read_text())
    # a run killed before its record: the ledger alone names its instance
    Ledger(ev / "ledger.jsonl").append("20260101T000000Z-dead00", "intent", "vh-dead", offer_id=1,
                                       api_url="https://console.vast.ai", account="acct")
    Ledger(ev / "ledger.jsonl").append("20260101T000000Z-dead00", "created", "vh-dead", offer_id=1, instance_id=99,
                                       api_url="https://console.vast.ai", account="acct")
    # ... and a reap that deleted it: its lines name the instance but it is not a run (not counted as one)
    Ledger(ev / "ledger.jsonl").append("reap-20260101T000100Z-abcdef", "delete_ack", "vh-dead", instance_id=99,
                                       api_url="https://console.vast.ai", account="acct")
    done = cli("costs", "--json", home=work)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    runs = {r["run_id"]: r for r in data["runs"]}
    assert not [r for r in runs if r.startswith("reap-")]
    mine = runs[record["run_id"]]
    assert mine["accrued_usd"] == pytest.approx(record["accrued_usd"]) and mine["sim"] is True
    assert mine["profile"] == "hello-profile" and mine["day"] == time.strftime("%Y-%m-%d", time.gmtime())
    dead = runs["20260101T000000Z-dead00"]
    assert dead["accrued_usd"] is None and dead["instances"] == [99] and dead["sim"] is False
    assert data["total"]["sim"]["accrued_usd"] == pytest.approx(record["accrued_usd"], abs=1e-6)
    assert data["total"]["real"] == {"runs": 1, "accrued_usd": 0.0, "unrecorded_runs": 1, "estimated_runs": 0}
    assert data["per_profile"]["sim"]["hello-profile"]["runs"] == 1
    human = cli("costs", home=work)
    assert human.returncode == 0 and "unrecorded" in human.stdout and "Per day" in human.stdout


def test_a_full_disk_leaves_old_evidence_files_whole_and_no_tmp_behind(tmp_path, monkeypatch):
    # On a 64 KiB disk: no 0-byte manifest.sha256 (it is never written in place), no report.html.tmp left.
    import errno

    from vast_harness.evidence.run import RunEvidence
    from vast_harness.reports.run import REPORT_NAME, write_run_report_safely

    ev = RunEvidence(tmp_path)
    ev.write_json("harness-result.json", {"run_id": "r1", "exit_code": 0})
    ev.write_manifest()
    manifest = (tmp_path / "manifest.sha256").read_text()
    assert "harness-result.json" in manifest

    def full(self: Path, *args, **kwargs):
        self.open("w").close()  # opened (created or truncated), then the write finds no room
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    warned: list[str] = []
    assert write_run_report_safely(tmp_path, warned.append) is None
    assert len(warned) == 1 and f"vast-e2e report {tmp_path.name}" in warned[0], warned
    ev.write_manifest()
    ev.write_json("harness-result.json", {"run_id": "r1", "exit_code": 1})
    assert (tmp_path / "manifest.sha256").read_text() == manifest
    assert json.loads((tmp_path / "harness-result.json").read_text())["exit_code"] == 0
    assert not (tmp_path / REPORT_NAME).exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["harness-result.json", "manifest.sha256"]
    assert [f.split(":")[0] for f in ev.write_failures] == ["manifest.sha256", "harness-result.json"]


def test_a_report_the_manifest_cannot_list_is_removed_and_said(tmp_path, monkeypatch):
    import errno

    from vast_harness.evidence import run as evidence
    from vast_harness.evidence.run import RunEvidence
    from vast_harness.reports.run import REPORT_NAME, write_run_report_safely

    ev = RunEvidence(tmp_path)
    ev.write_json("harness-result.json", {"run_id": "r1", "exit_code": 0})
    ev.write_manifest()
    real = evidence.write_whole

    def manifest_fails(path: Path, text: str, errors: str = "strict") -> None:
        if path.name == "manifest.sha256":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, text, errors)

    monkeypatch.setattr(evidence, "write_whole", manifest_fails)
    warned: list[str] = []
    assert write_run_report_safely(tmp_path, warned.append) is None
    assert not (tmp_path / REPORT_NAME).exists()
    assert len(warned) == 1 and "manifest" in warned[0] and "vast-e2e report" in warned[0], warned


@pytest.mark.slow
def test_a_rebuilt_report_of_a_run_without_its_record_never_says_nothing_was_rented(work, tmp_path):
    # The run filled the disk before harness-result.json, absence-proof.json and the manifest: the rebuilt
    # report must not say "nothing was rented" (nor absence "nothing-created") for a run that rented and deleted.
    import shutil

    src = next((work / "state" / "sim").glob("2*/harness-result.json")).parent
    run = tmp_path / "state" / "sim" / src.name
    shutil.copytree(src, run)
    for name in ("harness-result.json", "absence-proof.json", "manifest.sha256", "report.html"):
        (run / name).unlink()
    done = cli("report", str(run), home=tmp_path)
    assert done.returncode == 0, done.stderr
    html = (run / "report.html").read_text()
    assert "nothing was rented" not in html and "nothing-created" not in html
    assert "harness-result.json is missing" in html and "absence-proof.json is missing" in html
    assert "no manifest.sha256" in done.stderr


@pytest.mark.slow
def test_a_report_that_cannot_be_written_is_an_error_not_a_traceback(work, tmp_path, monkeypatch, capsys):
    import errno

    from vast_harness.cli import app as vast_cli
    from vast_harness.evidence import run as evidence

    rid = run_id(work)

    def full(path, text, errors="strict"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(evidence, "write_whole", full)
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "report", str(work / "state" / "sim" / rid)])
    with pytest.raises(SystemExit) as exited:
        vast_cli.main()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "No space left on device" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_costs_with_nothing_to_read_says_so_rather_than_a_plain_zero(tmp_path):
    # A mistyped VAST_HARNESS_HOME reads nothing: "Total against Vast: $0.0000" with exit 0 would read as
    # "nothing was spent".
    def costs(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return cli("costs", *args, home=tmp_path, env={"VAST_HARNESS_HOME": str(home)})

    missing = tmp_path / "no-such-home"
    human = costs(missing)
    assert human.returncode == 0, human.stderr
    assert "nothing recorded" in human.stderr and str(missing) in human.stderr and "$0" not in human.stdout
    data = json.loads(costs(missing, "--json").stdout)
    assert data["runs"] == [] and data["ledgers"] == [] and data["evidence_dir_found"] is False
    assert not missing.exists()  # a read-only command creates nothing
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    refused = costs(a_file)
    assert refused.returncode == 2 and "not a directory" in refused.stderr and str(a_file) in refused.stderr


@pytest.mark.slow
def test_status_with_a_state_dir_that_is_a_file_is_exit_2_before_any_call(tmp_path):
    # Not exit 0 with a table titled with the file (a live run of this machine would show as "elsewhere").
    a_file = tmp_path / "f"
    a_file.write_text("hi")
    env = {"VAST_HARNESS_HOME": str(a_file), "VAST_API_KEY": "k", "VAST_URL": "http://127.0.0.1:9"}
    done = cli("status", home=tmp_path, env=env)
    assert done.returncode == 2 and "not a directory" in done.stderr and str(a_file) in done.stderr, done.stderr
    assert "retrying" not in done.stderr  # refused before any API call
    # a path under that file, and `logs` with it (which said "no run 'foo'")
    for args, home in ((["status"], a_file / "sub"), (["logs", "foo"], a_file)):
        done = cli(*args, home=tmp_path, env=env | {"VAST_HARNESS_HOME": str(home)})
        assert done.returncode == 2 and "not a directory" in done.stderr, (args, done.stderr)


def test_logs_breaks_lines_only_at_newlines(tmp_path, capsys):
    # `logs RUN STEP` splits at newlines only, not at U+2028, U+2029, U+0085, VT and FF (str.splitlines): a host
    # could forge lines such as a fake "✓ step" out of characters the console shows escaped.
    from vast_harness.console.output import Output
    from vast_harness.views.logs import show_logs

    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "s.log").write_text("L<\u2028>R\nA<\u2029\x85\x0b\x0c\x1c>B\nend\n", encoding="utf-8")
    assert show_logs(Output(), tmp_path, "s") == 0
    shown = capsys.readouterr().out
    assert shown.split("\n") == ["L<\\u2028>R", "A<\\u2029\\x85\\x0b\\x0c\\x1c>B", "end", ""], shown
