"""`vast-e2e logs` as a user reads a run (issue 31 item 4): every step in order under headers, `--list` for the
table, no RUN for the latest, carriage-return progress shown as a terminal leaves it, and `logs -f` following
a simulated run from another process until it ends, or until its process is killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.clirun import ROOT, cli, spawn
from vast_harness.console.carriage import shown_segment
from vast_harness.console.output import Output
from vast_harness.views.follow import run_end
from vast_harness.views.logs import show_logs


def fake_run(root: Path, run_id: str, logs: dict[str, bytes], *, record: bool = True) -> Path:
    run = root / run_id
    (run / "steps").mkdir(parents=True)
    for name, data in logs.items():
        (run / "steps" / f"{name}.log").write_bytes(data)
    (run / "steps.tsv").write_text("".join(f"{n}\t0\n" for n in logs))
    if record:
        (run / "harness-result.json").write_text('{"run_id": "%s", "exit_code": 0}' % run_id)
    return run


def test_a_carriage_return_run_is_shown_as_the_terminal_leaves_it():
    assert shown_segment("10%\r55%\r100% done") == "100% done"
    assert shown_segment("downloading 12345\rok   ") == "ok   "
    assert shown_segment("line\r") == "line"  # CRLF
    assert shown_segment("plain") == "plain"


def test_logs_prints_every_step_in_order_under_headers(tmp_path, capsys):
    run = fake_run(tmp_path, "20260101T000000Z-aaaaaa", {
        "second": b"b1\n", "first": b"a1\n\x1b[2Jprogress 1%\r\x1b[2Jprogress 100%\n"})
    (run / "steps.tsv").write_text("first\t0\nsecond\t0\n")  # the order the steps ran
    assert show_logs(Output(), run, None) == 0
    shown = capsys.readouterr().out.split("\n")
    assert shown[0].startswith("==> step first (") and shown[3].startswith("==> step second (")
    assert shown[1:3] == ["a1", "\\x1b[2Jprogress 100%"] and shown[4] == "b1"
    assert show_logs(Output(), run, None, list_only=True) == 0
    table = capsys.readouterr().out
    assert "Step logs of" in table and "progress" not in table
    assert show_logs(Output(), run, None, raw=True) == 0
    assert "\x1b[2Jprogress 1%\r\x1b[2Jprogress 100%" in capsys.readouterr().out


def test_logs_without_a_run_reads_the_latest_and_report_too(tmp_path):
    ev = tmp_path / "state" / "sim"
    fake_run(ev, "20260101T000000Z-aaaaaa", {"s": b"old\n"})
    fake_run(ev, "20260102T000000Z-bbbbbb", {"s": b"new\n"})
    reap = ev / "reap-20260103T000000Z-dddddd"  # a later reap's record is not "the latest run" (red team)
    reap.mkdir()
    (reap / "harness-result.json").write_text("{}")
    done = cli("logs", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "new" in done.stdout and "old" not in done.stdout
    listed = cli("logs", "--list", home=tmp_path)
    assert listed.returncode == 0 and "20260102T000000Z-bbbbbb" in listed.stdout
    usage = cli("logs", "-h", home=tmp_path).stdout
    assert "Usage: vast-e2e logs [OPTIONS] [RUN] [STEP]" in usage and "{" not in usage.splitlines()[0]
    (tmp_path / "none").mkdir()
    empty = cli("logs", home=tmp_path / "none")
    assert empty.returncode == 2 and "no run in" in empty.stderr


def test_run_end_names_a_dead_owner_and_a_record(tmp_path):
    from vast_harness.state.registry import Registration, RunRegistry

    state = tmp_path / "state"
    run = fake_run(tmp_path / "ev", "20260101T000000Z-cccccc", {"s": b"x\n"}, record=False)
    held = RunRegistry(state).register(Registration(
        run_id=run.name, pid=os.getpid(), host=os.uname().nodename, started_unix=time.time(), api_url="http://x",
        profile="smoke", max_usd=1, max_minutes=5, deadline_unix=time.time() + 300))
    assert run_end(run, [state]) is None  # registered and locked: running
    # the lock dropped (as a kill -9 drops it) and the process named is not running: dead
    held.update(pid=2**22 + 7, pid_start="1")
    os.close(held._fd)  # the kernel drops the lock as it would for a killed process
    held._fd = -1
    assert "killed" in (run_end(run, [state]) or "")
    (run / "harness-result.json").write_text('{"exit_code": 6}')
    assert run_end(run, [state]) == f"run {run.name} ended with exit 6"


SLOW_PROFILE_STEPS = ('[[steps]]\nname = "count"\nrun = "for i in 1 2 3 4 5 6; do echo tick$i; printf \'pct 10\\\\rpct 99\\\\n\'; '
                      'sleep 1; done"\ntimeout_s = 60\nworkload = false\n')


def slow_profile(home: Path) -> Path:
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    path = home / "slow.toml"
    path.write_text(text[: text.index("[[steps]]")] + SLOW_PROFILE_STEPS)
    return path


def wait_for_step_log(home: Path, timeout_s: float = 60) -> Path:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = [p for p in (home / "state" / "sim").glob("2*/steps/count.log") if p.stat().st_size]
        if found:
            return found[0].parent.parent
        time.sleep(0.2)
    raise AssertionError("the run's step log never appeared")


@pytest.mark.slow
def test_logs_follow_prints_a_live_run_until_it_ends(tmp_path):
    err_path = tmp_path / "run.err"
    with err_path.open("wb") as err:
        run = spawn("--profile", str(slow_profile(tmp_path)), "--sim", home=tmp_path, stdout=subprocess.DEVNULL,
                    stderr=err)
    try:
        run_dir = wait_for_step_log(tmp_path)
        follow = cli("logs", "-f", home=tmp_path)  # no RUN: the latest, which is the one running
        code = run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert code == 0, err_path.read_text()[-2000:]
    assert follow.returncode == 0, follow.stderr
    lines = follow.stdout.splitlines()
    assert lines[0] == "==> step count <=="
    assert [ln for ln in lines if ln.startswith("tick")] == [f"tick{i}" for i in range(1, 7)]
    assert "pct 99" in lines and "pct 10" not in follow.stdout  # the progress line's last frame
    assert f"run {run_dir.name} ended with exit 0" in follow.stderr


@pytest.mark.slow
def test_logs_follow_ends_when_the_run_is_killed_with_9(tmp_path):
    run = spawn("--profile", str(slow_profile(tmp_path)), "--sim", home=tmp_path, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for_step_log(tmp_path)
        follow = spawn("logs", "-f", run_dir.name, home=tmp_path)
        time.sleep(1.5)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()  # reaped, as a shell reaps it (a zombie still has its pid)
        out, err = follow.communicate(timeout=30)  # ends by itself: the owner is gone
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()
    assert follow.returncode == 0, err
    assert "tick1" in out and "killed" in err and "reap" in err
