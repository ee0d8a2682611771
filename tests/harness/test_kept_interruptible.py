"""`vast-e2e up --interruptible` (docs/kept-host.md, docs/interruptible.md): a kept host on a bid instance on the
simulator over loopback, with real SSH hosts and the real onstart switch: bad input refused before renting, an
outbid while a command runs and between two (the husk salvaged, deleted and proven gone, a replacement set up
and the record moved to it), `down` of an outbid host, and k+1 outbids ending the hold with every husk gone."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clirun import SIM_PACING_SCALE, cli
from tests.tools import require_rsync
from vast_harness.errors import ExitCode
from vast_harness.sim import SimServer
from vast_harness.state.held import HeldHost, HeldStore

SIM_OPTIONS = dict(seed=12, rate_scale=0.01, num_offers=300, boot_seconds=0.2)
KEY = "kept-bid-key-1"
FAST = ("--proof-interval", "0.3", "--poll-interval", "0.2")

# Counts steps into ckpt/step.txt, starting from what the folder holds.
TRAIN = """\
import os, sys, time
os.makedirs("ckpt", exist_ok=True)
path = os.path.join("ckpt", "step.txt")
start = int(open(path).read()) if os.path.exists(path) else 0
print(f"start step {start}", flush=True)
for step in range(start + 1, int(sys.argv[1]) + 1):
    time.sleep(float(sys.argv[2]))
    with open(path + ".tmp", "w") as fh:
        fh.write(str(step))
    os.replace(path + ".tmp", path)
    print(f"step {step}", flush=True)
"""


@pytest.fixture
def rsync() -> str:
    return require_rsync()


def api(sim: SimServer) -> tuple[str, ...]:
    return ("--api-url", sim.url, "--pacing-scale", SIM_PACING_SCALE)


def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text(TRAIN)
    return wd


def up(home: Path, wd: Path, sim: SimServer, *extra: str, name: str = "bid") -> Any:
    return cli("up", name, "--workdir", str(wd), "--max-minutes", "4", "--idle-minutes", "1", "--interruptible",
               "--checkpoint", "ckpt", *FAST, *api(sim), *extra, home=home, key=KEY)


def run_exec(home: Path, *command: str, name: str = "bid") -> Any:
    return cli("exec", name, "--poll-interval", "0.2", "--", *command, home=home, key=KEY)


def record(home: Path, name: str = "bid") -> HeldHost | None:
    return HeldStore(home / "state").load(name)


def mine(sim: SimServer, hold_id: str) -> list[dict[str, Any]]:
    return [i for i in sim.state()["instances"] if i["label"] and hold_id in i["label"]]


def judge(sim: SimServer, held: HeldHost) -> list[str]:
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
def test_up_interruptible_bad_input_is_exit_2_before_renting(tmp_path: Path, sim: SimServer, flags: list[str],
                                                             said: str) -> None:
    wd = workdir(tmp_path)
    got = cli("up", "box", "--workdir", str(wd), "--interruptible", *flags, *api(sim), home=tmp_path, key=KEY)
    assert got.returncode == ExitCode.BAD_INPUT, got.stderr
    assert said in " ".join((got.stdout + got.stderr).split())
    assert record(tmp_path, "box") is None


def test_up_interruptible_dry_run_covers_the_hold_with_k_outbids(tmp_path: Path, sim: SimServer) -> None:
    wd = workdir(tmp_path)
    got = cli("up", "box", "--dry-run", "--workdir", str(wd), "--interruptible", "--checkpoint", "ckpt",
              "--max-interruptions", "3", *api(sim), home=tmp_path, key=KEY)
    assert got.returncode == 0, got.stderr
    words = " ".join((got.stdout + got.stderr).split())
    assert "3 interruption(s)" in words and "covers 3 outbid(s) of its host over the whole hold" in words


def test_outbid_between_execs_is_salvaged_replaced_and_the_next_exec_resumes(tmp_path: Path, sim: SimServer,
                                                                            rsync: str) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    got = up(home, wd, sim, "--setup", "echo setup-ran >> setup.log")
    assert got.returncode == 0, got.stderr[-3000:]
    held = record(home)
    assert held is not None and held.bid is not None and held.instance_id is not None
    assert held.bid.worst_case_usd and held.attempts and held.up_options["interruptible"]
    got = run_exec(home, "python3", "train.py", "3", "0.05")
    assert got.returncode == 0 and "step 3" in got.stdout + got.stderr, got.stderr[-3000:]
    first = held.instance_id
    assert sim.outbid(first)
    got = run_exec(home, "python3", "train.py", "6", "0.05")
    text = got.stdout + got.stderr
    assert got.returncode == 0, text[-3000:]
    assert "start step 3" in text and "step 6" in text, text[-3000:]
    held = record(home)
    assert held is not None and held.state == "held" and held.instance_id != first
    assert [a.instance_id for a in held.attempts][0] == first and held.attempts[0].ended.startswith("outbid")
    assert held.settled_usd > 0
    rows = {i["id"]: i for i in mine(sim, held.hold_id)}
    assert not rows[first]["live"] and rows[held.instance_id]["live"]
    steps = (Path(held.evidence_dir) / "steps.tsv").read_text()
    assert "setup-1.r1" in steps, steps
    got = cli("down", "bid", home=home, key=KEY)
    assert got.returncode == 0, got.stderr[-3000:]
    assert record(home) is None
    assert not [i for i in mine(sim, held.hold_id) if i["live"]]
    assert judge(sim, held) == []
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert len(result["attempts"]) == 2


def test_outbid_during_an_exec_reruns_its_command_on_the_replacement(tmp_path: Path, sim: SimServer,
                                                                    rsync: str) -> None:
    home, wd = tmp_path, workdir(tmp_path)
    got = up(home, wd, sim)
    assert got.returncode == 0, got.stderr[-3000:]
    held = record(home)
    assert held is not None and held.instance_id is not None
    first = held.instance_id

    def outbid_once_it_checkpointed() -> None:
        deadline = time.monotonic() + 30
        log = Path(held.evidence_dir) / "steps" / "exec-1.log"
        while time.monotonic() < deadline:
            if log.exists() and "step 4" in log.read_text(errors="replace"):
                sim.outbid(first)
                return
            time.sleep(0.05)

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
    started = int(log.split("start step ")[1].split()[0])
    assert started >= 4 and "step 20" in log
    assert cli("down", "bid", home=home, key=KEY).returncode == 0
    assert judge(sim, held) == [] and not [i for i in mine(sim, held.hold_id) if i["live"]]
