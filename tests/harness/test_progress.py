"""Watching a run as a user does: the live view under a real pseudo-terminal (a heartbeat in a quiet step, the
cap bars, a line per finished step, where the report is), plain heartbeat lines when stderr is a pipe, and a
step cut by Ctrl-C recorded in the steps table, steps.tsv and the record."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.harness.clirun import SCRIPT, cli, cli_env, spawn

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def quiet_profile(tmp_path: Path, run: str) -> Path:
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    text = text[: text.index("[[steps]]")] + f'[[steps]]\nname = "quiet"\nrun = "{run}"\ntimeout_s = 60\n'
    path = tmp_path / "quiet.toml"
    path.write_text(text.replace('name = "smoke"', 'name = "quiet"'))
    return path


def args(tmp_path: Path, run: str) -> list[str]:
    return ["--profile", str(quiet_profile(tmp_path, run)), "--sim", "--evidence-dir", str(tmp_path / "ev")]


def argv(tmp_path: Path, run: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *args(tmp_path, run)]


def env() -> dict[str, str]:
    return cli_env(env={"COLUMNS": "120"})


def run_in_pty(args: list[str], timeout_s: float = 120) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with a terminal on stdin, stdout and stderr
        os.execve(args[0], args, env())
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), ANSI.sub("", out.decode("utf-8", "replace"))


@pytest.mark.slow
def test_the_live_view_shows_a_heartbeat_in_a_quiet_step_and_the_cap_bars(tmp_path):
    """A quiet step still shows a heartbeat: without one, a 40-minute sweep would look hung."""
    code, screen = run_in_pty(argv(tmp_path, "sleep 4; echo done"))
    assert code == 0, screen[-3000:]
    quiet = [int(n) for n in re.findall(r"step 1 of 1: quiet\s+[\d.]+ s\s+\$[\d.]+\s+quiet (\d+) s", screen)]
    assert quiet and max(quiet) >= 3, screen[-3000:]
    assert "dollar cap" in screen and "of $0.50" in screen and "time cap" in screen and "of 15 min" in screen
    assert re.search(r"1[45] m \d\d s left", screen)  # the time left to the cap, in minutes and seconds
    assert "✓ step quiet: rc 0" in screen
    assert "tearing down" in screen
    report = re.search(r"report (\S+report\.html)", screen)
    assert report and Path(report.group(1)).is_file()


@pytest.mark.slow
def test_a_progress_bar_moves_in_the_live_view_and_ends_as_one_line(tmp_path):
    """tqdm-style output (each drawing after a \\r, green, no newline until the end) under a real terminal."""
    bar = "for i in 1 2 3 4 5 6; do printf '\\\\r\\\\033[32mtrain %s/6\\\\033[0m' $i; sleep 0.7; done; echo"
    code, screen = run_in_pty(argv(tmp_path, bar))
    assert code == 0, screen[-3000:]
    drawn = set(re.findall(r"train ([1-5])/6", screen))
    assert len(drawn) >= 2, screen[-3000:]  # seen while the line was still being drawn
    assert re.search(r"\[quiet +[\d.]+s \$[\d.]+\] train 6/6", screen), screen[-3000:]  # its last drawing
    assert "\\x0d" not in screen and "\\x1b[32m" not in screen  # not one line of escapes
    log = next((tmp_path / "ev").glob("2*/steps/quiet.log")).read_bytes()
    assert b"\r\x1b[32mtrain 1/6\x1b[0m\r" in log  # the log keeps the bytes


@pytest.mark.slow
def test_without_a_terminal_a_quiet_step_prints_plain_heartbeat_lines(tmp_path):
    done = cli(*args(tmp_path, "sleep 4; echo done"), env={"COLUMNS": "120", "VH_HEARTBEAT_S": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    beats = re.findall(r"\[step 1 of 1: quiet +[\d.]+s \$[\d.]+\] still running, no output for (\d+) s", done.stderr)
    assert len(beats) >= 2, done.stderr[-2000:]
    assert "\x1b" not in done.stderr  # no live region, no cursor movement in a log
    assert "report " in done.stdout


@pytest.mark.slow
def test_the_step_ctrl_c_cut_is_recorded(tmp_path):
    """The cut is in the steps table, steps.tsv and the record."""
    proc = spawn(*args(tmp_path, "echo started; sleep 60"), env={"COLUMNS": "120"})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not list((tmp_path / "ev").glob("*/steps/quiet.log")):
        time.sleep(0.2)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err[-2000:]
    run_dir = next((tmp_path / "ev").glob("2*"))
    assert (run_dir / "steps.tsv").read_text().startswith("quiet\tNA\t")
    record = json.loads((run_dir / "harness-result.json").read_text())
    step = record["steps"][0]
    assert step["name"] == "quiet" and step["interrupted"] is True and step["rc"] is None
    assert "SIGINT" in step["detail"]
    assert re.search(r"quiet\s+│\s+NA\s+│\s+[\d.]+\s+│\s+interrupted", out), out
    assert record["absence"]["verdict"] == "gone"
    names = [p["name"] for p in record["phases"]]
    assert names[-3:] == ["step quiet", "pull", "teardown"]  # the teardown still tries a brief pull


@pytest.mark.parametrize("phase", ["plan", "create", "boot", "upload", "step quiet", "pull", "teardown"])
@pytest.mark.slow
def test_the_record_carries_the_timeline(tmp_path_factory, phase):
    cache = tmp_path_factory.getbasetemp() / "timeline"
    if not cache.exists():
        cache.mkdir()
        done = cli(*args(cache, "echo hi"), env={"COLUMNS": "120"})
        assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(next((cache / "ev").glob("2*/harness-result.json")).read_text())
    phases = {p["name"]: p for p in record["phases"]}
    assert phase in phases
    p = phases[phase]
    assert p["t_end_unix"] >= p["t_start_unix"] and p["usd_end"] >= 0
