"""Kept hosts attacked from outside, as a user with two terminals could: `kill -9` of `up` mid-boot and of `exec`
mid-step, SIGSTOP, two `exec`s at once, two `up`s of one name, `down` while an exec runs, a Ctrl-C, and a clock
that jumps (this machine's wall clock, through the chaos suite's clock-step child; the API's `Date`, through the
simulator's `date_ahead` fault). Each ends with no instance left live on the simulator and none over its caps.

Every test runs `up --sim`: the hold's own simulator (a process of its own, the simulator's timings). `reap` is
pointed at it as at any standalone simulator: `--api-url` its URL, the hold's simulator key, and the `--sim`
state directory.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clirun import ROOT, cli, cli_env
from tests.harness.clirun import spawn as spawn_cli
from vast_harness.clock import now_s
from vast_harness.state.held import HeldHost, HeldStore

IDLE = "0.5"  # minutes: the switch deletes a host 30 s after the last push (a loaded machine's CLI starts slowly)
HOLD_SIM_PACING = "0.1"  # a --sim hold's simulator keeps Vast's rate limits at a tenth (Timings.sim().pacing_scale)


def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    (wd / "job.sh").write_text("echo started\nsleep \"${1:-60}\"\necho finished\n")
    return wd


def store(home: Path) -> HeldStore:
    return HeldStore(home / "state" / "sim")


def record(home: Path, name: str = "box") -> HeldHost | None:
    return store(home).load(name)


def sim_state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_sim/state", timeout=10) as answer:
        result: dict[str, Any] = json.load(answer)
        return result


def live(url: str) -> list[dict[str, Any]]:
    return [i for i in sim_state(url)["instances"] if i["live"]]


def up(home: Path, *extra: str, idle: str = IDLE, minutes: str = "5") -> subprocess.CompletedProcess[str]:
    p = cli("up", "box", "--sim", "--workdir", str(workdir(home)), "--max-minutes", minutes, "--idle-minutes",
            idle, *extra, home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def up_held(home: Path, stop_sims: list[int], *extra: str, idle: str = IDLE, minutes: str = "5") -> HeldHost:
    """`up` that holds; its simulator left to `stop_sims` to stop; the hold's record."""
    up(home, *extra, idle=idle, minutes=minutes)
    held = record(home)
    assert held is not None and held.sim_pid is not None
    stop_sims.append(held.sim_pid)
    return held


def reap(home: Path, held: HeldHost, *extra: str) -> subprocess.CompletedProcess[str]:
    """`reap` against the hold's own simulator, as against any standalone one."""
    assert held.sim_key is not None
    return cli("reap", "--api-url", held.api_url, "--pacing-scale", HOLD_SIM_PACING, "--proof-interval", "0.5",
               *extra, home=home, key=held.sim_key, env={"VAST_HARNESS_HOME": str(home / "state" / "sim")})


def wait_for(predicate: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {within_s} s: {what}")


def wait_line(proc: subprocess.Popen[str], needle: str, within_s: float = 60) -> str:
    """Read the process's stdout until a line holds `needle` (the step's output goes there)."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            seen += line
            if needle in line:
                return seen
            if not line and proc.poll() is not None:
                break
    raise AssertionError(f"no {needle!r} from the process: {seen[-2000:]}")


def ends_proven(home: Path, held: HeldHost, within_s: float) -> None:
    """The switch deletes the host by its deadline, within its caps; reap then proves it gone and ends the hold
    (which stops the hold's simulator)."""
    wait_for(lambda: not live(held.api_url), within_s, "the kept host deleted by its switch")
    for inst in sim_state(held.api_url)["instances"]:
        assert inst["billed_seconds"] <= held.max_seconds and inst["billed_usd"] <= held.max_usd
    p = reap(home, held)
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
    assert "deleted by its dead-man switch, proven absent by reap" in p.stdout + p.stderr
    assert record(home) is None


_spawned: list[subprocess.Popen[str]] = []


def spawn(*args: str, home: Path) -> subprocess.Popen[str]:
    """The CLI in a process of its own; closed (killed if it still runs) at the end of the test."""
    proc = spawn_cli(*args, home=home)
    _spawned.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _close_spawned() -> Iterator[None]:
    yield
    while _spawned:
        proc = _spawned.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture
def stop_sims() -> Iterator[list[int]]:
    """The holds' simulators a test leaves (a kill -9 leaves a hold to its switch): stopped at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


@pytest.mark.slow
def test_kill_9_of_up_mid_boot_leaves_the_host_to_its_switch_and_reap(tmp_path, stop_sims):
    home = tmp_path
    proc = spawn("up", "box", "--sim", "--workdir", str(workdir(home)), "--max-minutes", "5", "--idle-minutes", IDLE,
                 home=home)
    wait_for(lambda: (r := record(home)) is not None and r.instance_id is not None, 60, "a create in the record")
    time.sleep(0.5)  # the boot's first reads, before SSH: mid-boot
    proc.kill()
    proc.wait()
    held = record(home)
    assert held is not None and held.state == "starting" and held.instance_id is not None
    assert held.sim_pid is not None
    stop_sims.append(held.sim_pid)
    p = cli("status", "--sim", "--json", home=home)  # status shows it
    (row,) = json.loads(p.stdout)["rows"]
    assert row["held"] == "box" and row["state"] == "starting" and row["instance_id"] == held.instance_id
    p = cli("exec", "box", "--", "true", home=home)  # not usable: its up never finished
    assert p.returncode == 2 and "never finished" in p.stdout + p.stderr
    p = reap(home, held)  # before its deadline: left alone
    assert p.returncode == 0 and live(held.api_url), (p.stdout + p.stderr)[-2000:]
    assert held.idle_deadline is not None
    ends_proven(home, held, within_s=held.idle_deadline.left_s() + 15)


@pytest.mark.slow
def test_kill_9_of_exec_mid_step_leaves_the_host_to_its_idle_switch(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims)
    proc = spawn("exec", "box", "--", "sh", "job.sh", "60", home=home)
    wait_line(proc, "started")
    proc.kill()
    proc.wait()
    after = record(home)
    assert after is not None and after.exec_unfinished and store(home).busy("box") is None
    p = cli("status", "--sim", "--json", home=home)
    (row,) = json.loads(p.stdout)["rows"]
    assert row["state"] == "held" and "did not end" in row["why"]
    assert reap(home, held).returncode == 0 and live(held.api_url)  # before the deadline: left alone
    assert after.idle_deadline is not None
    ends_proven(home, held, within_s=after.idle_deadline.left_s() + after.idle_s / 4 + 15)  # a re-read late at most


def test_the_next_exec_stops_what_a_killed_exec_left_running(tmp_path, stop_sims):
    home = tmp_path
    up_held(home, stop_sims, idle="1")
    token = secrets.token_hex(4)  # this test's command alone: the hosts of tests beside it share the machine
    proc = spawn("exec", "box", "--", "sh", "job.sh", "60", token, home=home)
    wait_line(proc, "started")
    proc.kill()
    proc.wait()
    p = cli("exec", "box", "--", "sh", "-c", f"pgrep -f '[j]ob.sh 60 {token}' || echo none-left", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-2000:]
    assert "the last exec did not end" in text and "none-left" in text
    assert cli("down", "box", home=home).returncode == 0


def test_two_execs_at_once_the_second_is_refused_naming_the_first(tmp_path, stop_sims):
    home = tmp_path
    up_held(home, stop_sims, idle="1")
    first = spawn("exec", "box", "--", "sh", "job.sh", "3", home=home)
    wait_line(first, "started")
    p = cli("exec", "box", "--", "true", home=home)
    assert p.returncode == 2, (p.stdout + p.stderr)[-2000:]
    assert f"`exec` (pid {first.pid}" in p.stdout + p.stderr
    assert first.wait(timeout=60) == 0
    assert cli("exec", "box", "--", "true", home=home).returncode == 0  # the lock went with the first
    assert cli("down", "box", home=home).returncode == 0


def test_two_ups_of_one_name_one_wins_the_other_rents_nothing(tmp_path, stop_sims):
    home = tmp_path
    args = ("up", "box", "--sim", "--workdir", str(workdir(home)), "--max-minutes", "5", "--idle-minutes", "1")
    procs = [spawn(*args, home=home) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], (codes, outs)
    loser = next(o for p, o in zip(procs, outs, strict=True) if p.returncode == 2)
    assert "already a kept host" in loser[0] + loser[1]
    held = record(home)
    assert held is not None and held.state == "held" and held.sim_pid is not None
    stop_sims.append(held.sim_pid)
    assert len(sim_state(held.api_url)["instances"]) == 1  # the winner's; the loser rented nothing
    assert cli("down", "box", home=home).returncode == 0


def test_down_while_an_exec_runs_deletes_and_nothing_brings_the_hold_back(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims, idle="1")
    proc = spawn("exec", "box", "--", "sh", "job.sh", "60", home=home)
    wait_line(proc, "started")
    proc.send_signal(signal.SIGSTOP)  # the exec ends after the down, whose record then must stand
    try:
        p = cli("down", "box", home=home)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert p.returncode == 0 and f"instance {held.instance_id}: gone" in p.stdout, (p.stdout + p.stderr)[-2000:]
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGQUIT)
        code = None
    out, err = proc.communicate()
    assert code == 1, f"the exec whose host went did not end as a failure ({code}): {(out + err)[-4000:]}"
    said = " ".join((out + err).split())  # the verdict line wraps at the console's width
    assert "was taken down meanwhile" in said and "tearing down" not in said, said[-3000:]  # the down's end
    assert record(home) is None  # the exec's end wrote nothing back
    # nor over the hold's result: the down's stands (red team r47 F4: a keep ending later overwrote it)
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert result["exit_code"] == 0 and result["absence"]["verdict"] == "gone", result


def test_ctrl_c_of_exec_stops_the_command_and_keeps_the_host(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims, idle="1")
    token = secrets.token_hex(4)
    proc = spawn("exec", "box", "--", "sh", "job.sh", "60", token, home=home)
    wait_line(proc, "started")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    after = record(home)
    assert after is not None and after.state == "held" and not after.exec_unfinished
    assert live(held.api_url)
    p = cli("exec", "box", "--", "sh", "-c", f"pgrep -f '[j]ob.sh 60 {token}' || echo none-left", home=home)
    assert "none-left" in p.stdout + p.stderr and "did not end" not in p.stdout + p.stderr
    assert cli("down", "box", home=home).returncode == 0


@pytest.mark.slow
def test_sigstop_of_exec_past_its_idle_deadline_the_switch_deletes_and_the_exec_says_so(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims)
    proc = spawn("exec", "box", "--", "sh", "job.sh", "60", home=home)
    wait_line(proc, "started")
    proc.send_signal(signal.SIGSTOP)  # a suspended laptop: no heartbeat, the switch counts on
    try:
        stopped = record(home)  # its last push's idle deadline: the switch deletes by it, a re-read late at most
        assert stopped is not None and stopped.idle_deadline is not None
        within_s = stopped.idle_deadline.left_s() + stopped.idle_s / 4 + 15
        wait_for(lambda: not live(held.api_url), within_s, "the stopped exec's host deleted by its idle switch")
    finally:
        proc.send_signal(signal.SIGCONT)
    assert all(i["billed_usd"] <= held.max_usd for i in sim_state(held.api_url)["instances"])
    code = proc.wait(timeout=120)
    out, err = proc.communicate()
    assert code == 1, (code, (out + err)[-3000:])  # its host went: it says so, and proves it gone
    assert "no DELETE of ours" in out + err
    assert record(home) is None  # the exec's own teardown proved it absent and ended the hold


def _stepped(home: Path, step_s: float, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with this machine's wall clock stepped by `step_s` (the chaos suite's clock-step child)."""
    return subprocess.run([sys.executable, "-m", "vast_harness.chaos.child", "--cli", "--wall-step", str(step_s),
                           "--", *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=cli_env(home=home))


@pytest.mark.slow  # five CLI processes and a reap, 6 s of CPU
def test_a_wall_clock_that_jumps_extends_nothing(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims, idle="1")
    assert held.idle_deadline is not None
    # +2 h: keep pushes the idle deadline by the boot clock (now + idle), never to "now + 2 h"; the cap stays
    p = _stepped(home, 7200, "keep", "box")
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
    after = record(home)
    assert after is not None and after.idle_deadline is not None
    assert after.idle_deadline.mono <= now_s() + after.idle_s + 1
    assert after.cap_deadline == held.cap_deadline and after.host_cap_epoch is not None
    assert held.host_cap_epoch is not None and after.host_cap_epoch <= held.host_cap_epoch
    # +2 h: status and reap still see a held host, not an expired one (nothing judged by the wall clock)
    p = _stepped(home, 7200, "status", "--sim", "--json")
    (row,) = json.loads(p.stdout)["rows"]
    assert row["state"] == "held", row
    assert held.sim_key is not None
    p = subprocess.run([sys.executable, "-m", "vast_harness.chaos.child", "--cli", "--wall-step", "7200", "--",
                        "reap", "--api-url", held.api_url, "--pacing-scale", HOLD_SIM_PACING, "--proof-interval",
                        "0.5"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=cli_env(home=home, key=held.sim_key,
                                   env={"VAST_HARNESS_HOME": str(home / "state" / "sim")}))
    assert p.returncode == 0 and live(held.api_url), (p.stdout + p.stderr)[-2000:]
    # The API's clock 2 h ahead (the simulator's date_ahead): reap still leaves it alone
    req = urllib.request.Request(f"{held.api_url}/_sim/faults", data=json.dumps({"spec": "date_ahead:7200"}).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()
    assert reap(home, held).returncode == 0 and live(held.api_url)
    # -2 h, once the hold is past its deadline: still expired, refused (a clock stepped back revives nothing)
    store(home).update("box", lambda r: setattr(r, "idle_deadline", r.idle_deadline.plus(-3600)))
    p = _stepped(home, -7200, "exec", "box", "--", "true")
    assert p.returncode == 2 and "expired" in p.stdout + p.stderr
    p = _stepped(home, -7200, "status", "--sim", "--json")
    (row,) = json.loads(p.stdout)["rows"]
    assert row["state"] == "expired", row
