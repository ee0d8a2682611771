"""The interruptible family: whole `vast-e2e run --interruptible` runs under the bid book's faults, judged.

Each scenario runs a checkpointing command (it resumes from `ckpt/step.txt` when the folder is there) on the
simulator with one of the families of docs/interruptible.md: outbid while running, during boot, twice in a row,
during the copy of the checkpoint, a husk that resumes by itself after it was deleted. The judge's rules:

- never two live instances of the run at once (the simulator's create and destroy times, per instance);
- no husk left: every instance of the run destroyed;
- the resumed step >= the last checkpoint: each resume starts from the step the salvaged folder holds;
- the total billed (the simulator's) <= the cap and <= the dry run's worst case, and the run's own figure is an
  upper bound of it.
"""

from __future__ import annotations

import io
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from vast_harness.actions.reap import reap_all
from vast_harness.chaos.engine import BOOT_TIMEOUT_S, KEY, SCALE, TEARDOWN_MARGIN_S, _client, _output
from vast_harness.clock import now_s
from vast_harness.errors import ExitCode
from vast_harness.host.bundle import bundle_for
from vast_harness.host.onstart import build_onstart
from vast_harness.market.plan import plan_run
from vast_harness.run.interrupt import SALVAGE_DIR
from vast_harness.run.runner import GuardedRun
from vast_harness.sim.server import SimServer
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.ledger import Ledger
from vast_harness.state.registry import make_label

# The user's command: N steps, a checkpoint after each, resuming from the folder when it is there.
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

FAMILIES: dict[str, str] = {
    "outbid_running": "outbid:2.0",
    "outbid_boot": "outbid_boot:0.02",
    "outbid_twice": "outbid:2.0:2",
    "outbid_during_copy": "outbid:2.0;outbid:0.3",  # the replacement is outbid while the checkpoint goes up
    "husk_resumes_after_delete": "outbid:2.0;outbid_resume:0.3;delete_noop",
    "outbid_past_the_limit": "outbid:2.0:4",
    # the final teardown's DELETE races an outbid: answered 200, the instance paused and still there
    "outbid_during_delete": "outbid_delete",
    "outbid_during_delete_then_resume": "outbid_delete;outbid_resume:0.0",
    # --on-outbid wait: the husk resumes within the wait (the run goes on there), or does not (replaced)
    "outbid_wait_resumes": "outbid:2.0;outbid_resume:0.5",
    "outbid_wait_runs_out": "outbid:2.0",
}
ON_OUTBID: dict[str, str] = {"outbid_wait_resumes": "wait:1", "outbid_wait_runs_out": "wait:0.02"}


@dataclass
class InterruptOutcome:
    family: str
    seed: int
    exit_code: ExitCode
    message: str
    violations: list[str] = field(default_factory=list)
    worst_case_usd: float = 0.0
    billed_usd: float = 0.0
    accrued_usd: float = 0.0
    instances: int = 0
    outbids: int = 0  # times the simulator paused one of the run's instances
    resumed: int = 0  # times a paused one resumed by itself
    deletes: int = 0  # DELETE calls the simulator answered
    resumes: list[tuple[int, int]] = field(default_factory=list)  # (salvaged step, step the resume started at)
    starts: list[int] = field(default_factory=list)  # the step each later host (or the same, resumed) started at
    output: str = ""
    run_dir: Path | None = None  # the run's evidence (harness-result.json, report.html, salvaged/)


def interrupt_spec(url: str, work: Path, *, steps: int, step_s: float, max_interruptions: int,
                   max_usd: float | None = None, max_minutes: float = 2.0, on_outbid: str | None = None) -> RunSpec:
    """`vast-e2e run --interruptible --checkpoint ckpt -- python train.py` with every clock scaled down."""
    wd = work / "wd"
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "train.py").write_text(TRAIN)
    options = RunOptions(sim=True, evidence_dir=work / "ev", state_dir=work / "ev", max_usd=max_usd,
                         proof_interval_s=0.1, poll_s=0.05, boot_retries=1, max_minutes=max_minutes, dry_run=True,
                         command=["python3", "train.py", str(steps), str(step_s)], workdir=str(wd),
                         artifact=["ckpt"], interruptible=True, max_interruptions=max_interruptions,
                         checkpoint="ckpt", on_outbid=on_outbid)
    base = resolve(options, environ={"HOME": str(work)})
    profile = base.profile.model_copy(update={"boot_timeout_s": BOOT_TIMEOUT_S})
    return base.model_copy(update={"profile": profile, "api_url": url, "api_key": SecretStr(KEY),
                                   "dry_run": False}).with_timings(teardown_margin_s=TEARDOWN_MARGIN_S)


def random_faults(seed: int) -> tuple[str, int]:
    """A seeded draw of the bid book's faults (outbid timings and counts, during boot or after running, a husk
    that resumes, a DELETE that deleted nothing) and the --max-interruptions asked: the property's inputs."""
    rng = random.Random(seed)
    rules = [f"outbid:{rng.uniform(0.2, 3.0):.2f}:{rng.randint(1, 3)}"]
    if rng.random() < 0.5:
        rules.append(f"outbid:{rng.uniform(0.0, 1.5):.2f}")
    if rng.random() < 0.3:
        rules.append(f"outbid_boot:{rng.uniform(0.0, 0.3):.2f}")
    if rng.random() < 0.3:
        rules += [f"outbid_resume:{rng.uniform(0.1, 1.0):.2f}", "delete_noop"]
    return ";".join(rules), rng.randint(0, 3)


def run_family(family: str, work: Path, *, seed: int = 0, steps: int = 30, step_s: float = 0.1,
               max_interruptions: int = 2) -> InterruptOutcome:
    """One run under `family`'s faults, then the judge's rules."""
    return run_faults(family, FAMILIES[family], work, seed=seed, steps=steps, step_s=step_s,
                      max_interruptions=max_interruptions, on_outbid=ON_OUTBID.get(family))


def run_seeded(seed: int, work: Path, *, steps: int = 600, step_s: float = 0.1,
               max_minutes: float = 0.3) -> InterruptOutcome:
    """One run under `random_faults(seed)`, judged: the property that the dry run's worst case bounds the bill.
    The command outlasts the 18 s cap by default, so a run that survives its outbids bills up to the cap."""
    faults, k = random_faults(seed)
    return run_faults(f"seed {seed}: {faults}, --max-interruptions {k}", faults, work, seed=seed, steps=steps,
                      step_s=step_s, max_interruptions=k, max_minutes=max_minutes)


def run_faults(family: str, faults: str, work: Path, *, seed: int = 0, steps: int = 30, step_s: float = 0.1,
               max_interruptions: int = 2, max_minutes: float = 2.0,
               on_outbid: str | None = None) -> InterruptOutcome:
    """One run under `faults`, then the judge's rules."""
    buf = io.StringIO()
    with SimServer(seed=seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim:
        spec = interrupt_spec(sim.url, work, steps=steps, step_s=step_s, max_interruptions=max_interruptions,
                              max_minutes=max_minutes, on_outbid=on_outbid)
        with _client(sim.url) as client:
            worst = plan_run(spec, client, load_driver_policy(), bundle_for(spec)).chosen.quote.worst_case_usd
        sim.reset()
        sim.set_faults(f"{faults};seed={seed}")
        run = GuardedRun(spec, _client(sim.url), load_driver_policy(), _output(buf))
        result = run.execute()
        state = sim.state()
    outcome = InterruptOutcome(family=family, seed=seed, exit_code=result.exit_code, message=result.message,
                               worst_case_usd=worst, accrued_usd=run.accrued_usd(), output=buf.getvalue(),
                               run_dir=run.ev.dir)
    mine = [i for i in state["instances"] if i["label"] and run.run_id in i["label"]]
    outcome.instances = len(mine)
    outcome.billed_usd = sum(i["billed_usd"] for i in mine)
    outcome.outbids = sum(int(i["outbids"]) for i in mine)
    outcome.resumed = sum(int(i["resumes"]) for i in mine)
    outcome.deletes = sum(1 for c in state["calls"] if c["method"] == "DELETE")
    outcome.violations = judge(outcome, mine, run.ev.dir, spec)
    return outcome


def judge(outcome: InterruptOutcome, mine: list[dict[str, object]], run_dir: Path, spec: RunSpec) -> list[str]:
    found: list[str] = []
    spans = sorted((float(str(i["created_at"])), float(str(i["destroyed_at"] or 1e18)), int(str(i["id"])))
                   for i in mine)
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            found.append(f"two live instances at once: {b} was created before {a} was destroyed")
    for inst in mine:
        if inst["live"]:
            found.append(f"husk left: instance {inst['id']} is still live ({inst['actual_status']})")
    if outcome.billed_usd > spec.caps.max_usd + 1e-9:
        found.append(f"billed ${outcome.billed_usd:.6f} over the cap ${spec.caps.max_usd:.6f}")
    if outcome.billed_usd > outcome.worst_case_usd + 1e-9:
        found.append(f"billed ${outcome.billed_usd:.6f} over the dry run's worst case ${outcome.worst_case_usd:.6f}")
    if outcome.accrued_usd > outcome.worst_case_usd + 1e-9:
        found.append(f"the run's own figure ${outcome.accrued_usd:.6f} is over the dry run's worst case "
                     f"${outcome.worst_case_usd:.6f}")
    if outcome.accrued_usd + 1e-9 < outcome.billed_usd:
        found.append(f"under-reported: the run says ${outcome.accrued_usd:.6f}, the simulator billed "
                     f"${outcome.billed_usd:.6f}")
    record = json_or_empty(run_dir / "harness-result.json")
    if not record and read_or_empty(run_dir / "harness-result.json"):
        found.append("harness-result.json is there but not a JSON object")
    found += judge_resumes(outcome, run_dir, record)
    if record and len(record.get("attempts", [])) != len(mine):
        found.append(f"the record lists {len(record.get('attempts', []))} attempt(s) of {len(mine)} instance(s)")
    return found


def judge_resumes(outcome: InterruptOutcome, run_dir: Path, record: dict[str, Any]) -> list[str]:
    """The resumed step >= the last checkpoint. Each salvage holds a step; each host's command says where it
    started, in the order the hosts ran (the step logs in the record's order: the first command, then `resume`,
    appended host after host). A start is never behind an earlier start (a checkpoint only moves on), and the
    last host's start, when the run ended on it rather than on an outbid, is at or after every salvaged step."""
    found: list[str] = []
    names = list(dict.fromkeys(str(step["name"]) for step in record.get("steps", [])))
    logs = "".join(read_or_empty(run_dir / "steps" / f"{name}.log") for name in names)
    starts = [int(m) for m in re.findall(r"start step (\d+)", logs)][1:]  # the first start is the fresh one
    salvaged = sorted((run_dir / SALVAGE_DIR).glob("*/step.txt"), key=lambda p: int(p.parent.name))
    steps = [int(p.read_text().strip() or 0) for p in salvaged]
    outcome.resumes = list(zip(steps, starts, strict=False))
    outcome.starts = starts
    printed = 0  # the command prints a step after its checkpoint is on the disk: no start may be behind one
    for m in re.finditer(r"(start step|step) (\d+)", logs):
        step = int(m.group(2))
        if m.group(1) == "start step" and m.start() > 0 and step < printed:
            found.append(f"a host started at step {step}, behind step {printed} checkpointed before it")
        printed = max(printed, step)
    for earlier, later in zip(starts, starts[1:], strict=False):
        if later < earlier:
            found.append(f"a later host started at step {later}, behind an earlier one's start {earlier}")
    attempts = record.get("attempts", [])
    ended_on_a_host = bool(attempts) and not str(attempts[-1].get("ended", "")).startswith("outbid")
    if starts and steps and ended_on_a_host and starts[-1] < max(steps):
        found.append(f"resumed at step {starts[-1]}, behind the last checkpoint {max(steps)}")
    if steps and not starts and ended_on_a_host:
        found.append(f"a checkpoint (step {max(steps)}) was salvaged but no host resumed from it")
    return found


# An outbid during the dead-man switch's countdown, the harness gone (killed -9): the switch's process dies with
# the paused container, so it cannot delete its instance at its deadline. Either the husk stays paused (reap
# must find it, name it a husk and delete it with proof) or it resumes after the deadline (onstart runs again,
# reads the deadline it wrote on the disk, and deletes the instance at once).
SWITCH_FAMILIES: dict[str, str] = {
    "outbid_in_switch_countdown_stays_paused": "outbid:{outbid_s}",
    "outbid_in_switch_countdown_resumes_late": "outbid:{outbid_s};outbid_resume:{resume_s}",
}
SWITCH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOf5m0example vh-switch"  # never used: no SSH in this family


def run_switch_family(family: str, work: Path, *, seed: int = 0, allowance_s: int = 4,
                      outbid_s: float = 0.5) -> InterruptOutcome:
    """A bid instance created as a run creates it (its label, its ledger lines, its onstart with the switch at
    `allowance_s`), whose run is gone; outbid `outbid_s` after it runs, inside the countdown; then the judge."""
    resume_s = allowance_s + 1.5  # after the deadline the switch could not keep
    buf = io.StringIO()
    outcome = InterruptOutcome(family=family, seed=seed, exit_code=ExitCode.PASSED, message="")
    with SimServer(seed=seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim, _client(sim.url) as client:
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=work / "ev", state_dir=work / "ev",
                                  proof_interval_s=0.1), environ={"HOME": str(work)})
        spec = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)})
        offer = next(o for o in client.search_offers({"limit": 50}) if o.min_bid_usd_per_h)
        assert offer.min_bid_usd_per_h is not None
        run_id = f"switch{seed}"
        label = make_label(run_id, 0, time.time() + 3600, left_s=3600)
        ledger = Ledger.for_spec(spec)
        ledger.append(run_id, "intent", label, offer_id=offer.id, dph_usd=offer.dph_total)
        sim.set_faults(SWITCH_FAMILIES[family].format(outbid_s=outbid_s, resume_s=resume_s) + f";seed={seed}")
        created = client.create_instance(offer.id, {
            "client_id": "me", "image": "x@sha256:" + "0" * 64, "disk": 10, "label": label,
            "price": round(offer.min_bid_usd_per_h * 1.1, 4),
            "onstart": build_onstart(public_key=SWITCH_KEY, api_url=sim.url, deadman_after_s=allowance_s)})
        iid = created.new_contract
        ledger.append(run_id, "created", label, offer_id=offer.id, instance_id=iid)  # then the run was killed
        row = _wait(lambda: _row(sim, iid), lambda r: bool(r["outbids"]), 10.0)
        outcome.outbids = int(row["outbids"])
        time.sleep(allowance_s + 0.5)  # the deadline passes while it is paused
        row = _row(sim, iid)
        if not row["live"] and not row["resumes"]:
            outcome.violations.append("a paused instance was deleted at its deadline: the simulator ran the switch "
                                      "of a stopped container")
        if family.endswith("resumes_late"):
            row = _wait(lambda: _row(sim, iid), lambda r: not r["live"], resume_s + 15.0)
            outcome.resumed = int(row["resumes"])
            if not outcome.resumed:
                outcome.violations.append("the husk never resumed: the family did not happen")
            elif row["live"]:
                outcome.violations.append(f"husk left: instance {iid} resumed after its switch's deadline and its "
                                          "switch did not delete it")
            elif row["destroyed_by"] != "api":
                outcome.violations.append(f"instance {iid} ended by {row['destroyed_by']}, not the switch's DELETE")
            elif row["booted_at"] and float(row["destroyed_at"]) - float(row["booted_at"]) >= allowance_s / 2:
                outcome.violations.append(
                    f"the resumed switch deleted instance {iid} {float(row['destroyed_at']) - float(row['booted_at']):.1f}"
                    f" s after its re-boot: it counted afresh instead of keeping the deadline it wrote")
        else:
            out = _output(buf)
            outcome.exit_code = reap_all(spec, client, out)
            row = _row(sim, iid)
            if row["live"]:
                outcome.violations.append(f"husk left: reap did not delete the paused instance {iid}")
            if "husk" not in buf.getvalue():
                outcome.violations.append(f"reap did not name instance {iid} a husk")
            if outcome.exit_code != ExitCode.PASSED:
                outcome.violations.append(f"reap exited {int(outcome.exit_code)}")
        state = sim.state()
    mine = [i for i in state["instances"] if i["label"] and run_id in i["label"]]
    outcome.instances = len(mine)
    outcome.billed_usd = sum(i["billed_usd"] for i in mine)
    outcome.deletes = sum(1 for c in state["calls"] if c["method"] == "DELETE")
    outcome.output = buf.getvalue()
    return outcome


def _row(sim: SimServer, instance_id: int) -> dict[str, Any]:
    return next(dict(i) for i in sim.state()["instances"] if i["id"] == instance_id)


def _wait(read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool],
          timeout_s: float) -> dict[str, Any]:
    deadline = now_s() + timeout_s
    row = read()
    while not done(row) and now_s() < deadline:
        time.sleep(0.1)
        row = read()
    return row


def read_or_empty(path: Path) -> str:
    """A file the run may not have written (or not yet): its text, or "" (the judges read absence as nothing)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object the run may not have written, or written cut short: the object, or {}."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


if __name__ == "__main__":  # a quick look: python -m vast_harness.chaos.interrupt FAMILY DIR
    result = run_family(sys.argv[1], Path(sys.argv[2]))
    print(result.output)
    print(result.exit_code, result.message, result.violations, result.resumes)
