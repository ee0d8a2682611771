"""`vast-e2e up --interruptible` (docs/kept-host.md, docs/interruptible.md): a kept host on a bid instance on the
simulator over loopback, with real SSH hosts and the real onstart switch: bad input refused before renting, an
outbid while a command runs and between two (the husk salvaged, deleted and proven gone, a replacement set up
and the record moved to it), `down` of an outbid host, and k+1 outbids ending the hold with every husk gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clirun import cli
from tests.tools import require_rsync
from vast_harness.chaos.interrupt import TRAIN  # the user's command: N steps, a checkpoint after each
from vast_harness.errors import ExitCode
from vast_harness.kept.watcher_proc import watcher_running
from vast_harness.state.held import HeldHost, HeldStore

FAST = ("--proof-interval", "0.3", "--poll-interval", "0.2")


@pytest.fixture
def rsync() -> str:
    return require_rsync()


def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text(TRAIN)
    return wd


def up(home: Path, wd: Path, *extra: str, name: str = "bid") -> Any:
    """`up --sim`: the hold's own detached simulator (its timings: proofs in a second or two)."""
    return cli("up", name, "--sim", "--workdir", str(wd), "--max-minutes", "4", "--idle-minutes", "1",
               "--interruptible", "--checkpoint", "ckpt", *FAST, *extra, home=home)


def run_exec(home: Path, *command: str, name: str = "bid") -> Any:
    return cli("exec", name, *FAST, "--", *command, home=home)


def record(home: Path, name: str = "bid") -> HeldHost | None:
    return HeldStore(home / "state" / "sim").load(name)


class HeldSim:
    """The hold's detached simulator, through its control plane."""

    def __init__(self, url: str) -> None:
        self.url = url

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_sim/state", timeout=10) as answer:
            return dict(json.load(answer))

    def outbid(self, instance_id: int) -> bool:
        request = urllib.request.Request(f"{self.url}/_sim/outbid/{instance_id}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return bool(json.load(answer)["success"])


@pytest.fixture
def pin(tmp_path: Path) -> Any:
    """`pin(home)`: the hold's simulator kept past the hold's end, for the judge (a second record on it, which
    `down` reads as another hold using it), stopped at the test's end."""
    pids: list[int] = []

    def pin_sim(home: Path) -> HeldSim:
        held = record(home)
        assert held is not None and held.sim_pid is not None
        HeldStore(home / "state" / "sim").save(held.model_copy(update={"name": "pin", "state": "ending", "bid": None}))
        pids.append(held.sim_pid)
        return HeldSim(held.api_url)

    yield pin_sim
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def mine(sim: HeldSim, hold_id: str) -> list[dict[str, Any]]:
    return [i for i in sim.state()["instances"] if i["label"] and hold_id in i["label"]]


def wait_for(check: Any, within_s: float) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {within_s} s")


def kill_watcher(home: Path) -> None:
    """`kill -9` of the hold's watcher, once it runs."""
    held = wait_for(lambda: (r := record(home)) is not None and watcher_running(r) and r, 10)
    os.kill(held.watcher_pid, signal.SIGKILL)
    wait_for(lambda: not watcher_running(held), 10)


def judge(sim: HeldSim, held: HeldHost) -> list[str]:
    """The interruptible family's rules for a hold: never two live instances at once, no husk left (once the
    hold ended), the bill under the caps and under the `up`'s worst case."""
    found = []
    rows = mine(sim, held.hold_id)
    spans = sorted((float(i["created_at"]), float(i["destroyed_at"] or 1e18), i["id"]) for i in rows)
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            found.append(f"two live instances at once: {b} was created before {a} was destroyed")
    billed = sum(i["billed_usd"] for i in rows)
    if billed > held.max_usd:
        found.append(f"billed ${billed:.6f} over the cap")
    assert held.bid is not None and held.bid.worst_case_usd is not None
    if billed > held.bid.worst_case_usd + 1e-9:
        found.append(f"billed ${billed:.6f} over the worst case ${held.bid.worst_case_usd:.6f}")
    return found


@pytest.mark.parametrize(("flags", "said"), [
    (["--resume", "python r.py"], "--resume has no meaning for up"),
    (["--checkpoint", "../elsewhere"], "outside the workdir"),
    (["--bid", "0.001"], "below the min_bid of every offer"),
    (["--on-outbid", "wait:0"], "minutes must be > 0"),
])
def test_up_interruptible_bad_input_is_exit_2_before_renting(tmp_path: Path, flags: list[str], said: str) -> None:
    wd = workdir(tmp_path)
    got = cli("up", "box", "--sim", "--workdir", str(wd), "--interruptible", *flags, home=tmp_path)
    assert got.returncode == ExitCode.BAD_INPUT, got.stderr
    assert said in " ".join((got.stdout + got.stderr).split())
    assert record(tmp_path, "box") is None and not list(tmp_path.rglob("ledger.jsonl"))


def test_up_interruptible_dry_run_covers_the_hold_with_k_outbids(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    got = cli("up", "box", "--sim", "--dry-run", "--workdir", str(wd), "--interruptible", "--checkpoint", "ckpt",
              "--max-interruptions", "3", home=tmp_path)
    assert got.returncode == 0, got.stderr
    words = " ".join((got.stdout + got.stderr).split())
    assert "3 interruption(s)" in words and "covers 3 outbid(s) of its host over the whole hold" in words


@pytest.mark.slow
def test_outbid_between_execs_with_the_watcher_killed_the_next_exec_recovers(tmp_path: Path, rsync: str,
                                                                             pin: Any) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    got = up(home, wd, "--setup", "echo setup-ran >> setup.log")
    assert got.returncode == 0, got.stderr[-3000:]
    held = wait_for(lambda: (r := record(home)) is not None and watcher_running(r) and r, 10)
    assert held.bid is not None and held.bid.worst_case_usd and held.attempts and held.up_options["interruptible"]
    sim = pin(home)
    got = run_exec(home, "python3", "train.py", "3", "0.05")
    assert got.returncode == 0 and "step 3" in got.stdout + got.stderr, got.stderr[-3000:]
    kill_watcher(home)  # nothing of ours runs while it is outbid: the next command must see it
    first = held.instance_id
    assert first is not None and sim.outbid(first)
    got = run_exec(home, "python3", "train.py", "6", "0.05")
    text = got.stdout + got.stderr
    assert got.returncode == 0, text[-3000:]
    assert "start step 3" in text and "step 6" in text, text[-3000:]
    held = wait_for(lambda: (r := record(home)) is not None and watcher_running(r) and r, 10)  # started again
    assert held.state == "held" and held.instance_id != first
    assert held.attempts[0].instance_id == first and held.attempts[0].ended.startswith("outbid")
    assert held.settled_usd > 0
    rows = {i["id"]: i for i in mine(sim, held.hold_id)}
    assert not rows[first]["live"] and rows[held.instance_id]["live"]
    steps = (Path(held.evidence_dir) / "steps.tsv").read_text()
    assert "setup-1.r1" in steps and "exec-2.r1" in steps, steps
    got = cli("down", "bid", home=home)
    assert got.returncode == 0, got.stderr[-3000:]
    assert record(home) is None
    wait_for(lambda: not watcher_running(held), 10)  # stopped with the hold
    assert judge(sim, held) == [] and not [i for i in mine(sim, held.hold_id) if i["live"]]
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert len(result["attempts"]) == 2


@pytest.mark.slow
def test_the_watcher_deletes_a_husk_outbid_between_execs_and_the_next_exec_rents(tmp_path: Path, rsync: str,
                                                                                 pin: Any) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, wd).returncode == 0
    held = wait_for(lambda: (r := record(home)) is not None and watcher_running(r) and r, 10)
    sim = pin(home)
    assert run_exec(home, "python3", "train.py", "2", "0.05").returncode == 0
    first = held.instance_id
    assert first is not None and sim.outbid(first)
    # lazy: salvaged, deleted and proven gone by the watcher; nothing of the hold live (nothing billed)
    held = wait_for(lambda: (r := record(home)) is not None and r.state == "outbid" and r, 30)
    assert held.instance_id is None and held.salvaged and (Path(held.salvaged) / "step.txt").read_text() == "2"
    assert not [i for i in mine(sim, held.hold_id) if i["live"]]
    got = cli("status", "--sim", home=home)
    assert "outbid" in got.stdout + got.stderr
    got = run_exec(home, "python3", "train.py", "4", "0.05")
    text = got.stdout + got.stderr
    assert got.returncode == 0 and "start step 2" in text and "step 4" in text, text[-3000:]
    held = record(home)
    assert held is not None and held.state == "held" and held.instance_id not in (None, first)
    assert cli("down", "bid", home=home).returncode == 0
    assert judge(sim, held) == [] and not [i for i in mine(sim, held.hold_id) if i["live"]]


@pytest.mark.slow
def test_outbid_during_an_exec_reruns_its_command_on_the_replacement(tmp_path: Path, rsync: str, pin: Any) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, wd).returncode == 0
    held = record(home)
    assert held is not None and held.instance_id is not None
    sim, first = pin(home), held.instance_id

    def outbid_once_it_checkpointed() -> None:
        log = Path(held.evidence_dir) / "steps" / "exec-1.log"
        wait_for(lambda: log.exists() and "step 4" in log.read_text(errors="replace"), 30)
        sim.outbid(first)

    thread = threading.Thread(target=outbid_once_it_checkpointed, daemon=True)
    thread.start()
    got = run_exec(home, "python3", "train.py", "20", "0.1")
    thread.join()
    text = got.stdout + got.stderr
    assert got.returncode == 0, text[-3000:]
    assert "exec-1 was cut by the outbid; run again as exec-1.r1" in text, text[-3000:]
    held = record(home)
    assert held is not None and held.instance_id != first and held.state == "held"
    log = (Path(held.evidence_dir) / "steps" / "exec-1.r1.log").read_text()
    assert int(log.split("start step ")[1].split()[0]) >= 4 and "step 20" in log
    assert cli("down", "bid", home=home).returncode == 0
    assert judge(sim, held) == [] and not [i for i in mine(sim, held.hold_id) if i["live"]]


def test_down_of_an_outbid_host_salvages_deletes_and_ends_the_hold(tmp_path: Path, rsync: str, pin: Any) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, wd).returncode == 0
    held = record(home)
    assert held is not None and held.instance_id is not None
    sim = pin(home)
    assert run_exec(home, "python3", "train.py", "2", "0.05").returncode == 0
    kill_watcher(home)
    assert sim.outbid(held.instance_id)
    shown = cli("status", "--sim", home=home)  # read live on the hold's own simulator, not from the record
    assert shown.returncode == 0 and "outbid (paused)" in shown.stdout, shown.stdout + shown.stderr
    got = cli("down", "bid", home=home)
    assert got.returncode == 0, (got.stdout + got.stderr)[-3000:]
    assert record(home) is None
    assert list(Path(held.evidence_dir).glob("salvaged/*/step.txt"))
    assert not [i for i in mine(sim, held.hold_id) if i["live"]] and judge(sim, held) == []


def test_more_outbids_than_max_interruptions_end_the_hold_with_every_husk_gone(tmp_path: Path, rsync: str,
                                                                              pin: Any) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, wd, "--max-interruptions", "0").returncode == 0
    held = record(home)
    assert held is not None and held.instance_id is not None
    sim = pin(home)
    kill_watcher(home)
    assert sim.outbid(held.instance_id)
    got = run_exec(home, "python3", "train.py", "2", "0.05")
    assert got.returncode == ExitCode.FAILED, got.stderr[-3000:]
    assert "--max-interruptions 0" in " ".join((got.stdout + got.stderr).split())
    assert record(home) is None
    assert not [i for i in mine(sim, held.hold_id) if i["live"]] and judge(sim, held) == []
