"""The kept host's interruptible families: whole `up --interruptible`, `exec` and `down` sequences on the hold's
own simulator (`up --sim`, real SSH hosts, the real watcher), outbid at the family's moment, judged.

Each family outbids the held instance (`POST /_sim/outbid/<id>`) or arms the bid book's faults (`PUT
/_sim/faults`: `outbid_delete`, `outbid_resume`, `delete_noop`) at one moment of a hold: during the `up`'s
`--setup`, during an `exec`, between two execs (the watcher alive, or killed -9), during `down`, more times than
`--max-interruptions`, and a husk that resumes by itself after its DELETE deleted nothing. The judge's rules are
the run's (`chaos/interrupt.py`), over the whole hold:

- never two live instances of the hold at once (the simulator's create and destroy times, per instance);
- no husk left: every instance of the hold destroyed once `down` (or the hold's end) returned;
- every start >= the last checkpoint: no exec's command starts behind a step checkpointed before it, and the
  last start after an outbid is at or after the last salvaged step;
- the simulator's bill <= the hold's cap and <= the `up`'s dry-run worst case (`HeldBid.worst_case_usd`);
- the hold's record (`harness-result.json`, written by its last command) lists one attempt per instance.

The commands run through `Commands` (`vast-e2e ARGS` in the family's home: a process each by default; tests
pass their in-process runner). The hold's simulator is kept past the hold's end for the judge (a second,
`ending` record on it, which `down` reads as another hold using it) and stopped when the family is done.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vast_harness.chaos.interrupt import TRAIN, json_or_empty, read_or_empty
from vast_harness.clock import now_s
from vast_harness.kept.watcher_proc import watcher_running
from vast_harness.run.interrupt import SALVAGE_DIR
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.views.logs import step_logs

Commands = Callable[[Sequence[str]], tuple[int, str]]  # `vast-e2e ARGS` -> (exit code, stdout and stderr)

NAME = "chaos"
PIN = "chaos-pin"
FAST = ("--proof-interval", "0.3", "--poll-interval", "0.2")
SETUP_MARK = "setup-begin"
WAIT_S = 30.0


def process_commands(home: Path) -> Commands:
    """`vast-e2e ARGS` as a process of its own, HOME and the state and config dirs under `home`."""
    env = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "VAST_URL")}
    env |= {"HOME": str(home), "VAST_HARNESS_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "config")}

    def run(args: Sequence[str]) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-c", "from vast_harness.cli import main; main()", *args], env=env,
                              cwd=str(home), capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout + done.stderr

    return run


@dataclass
class KeptOutcome:
    family: str
    exits: list[tuple[str, int]] = field(default_factory=list)  # each command and its exit code, in order
    violations: list[str] = field(default_factory=list)
    max_usd: float = 0.0
    worst_case_usd: float = 0.0
    billed_usd: float = 0.0
    instances: int = 0
    outbids: int = 0  # times the simulator paused one of the hold's instances
    resumed: int = 0  # times a paused one resumed by itself
    starts: list[int] = field(default_factory=list)  # the step each exec's command started at, in order
    salvaged: list[int] = field(default_factory=list)  # the step each salvaged checkpoint holds
    resumes: list[tuple[int, int | None]] = field(default_factory=list)  # (salvaged step, the next exec's start)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # the hold's record's, at its end
    output: str = ""
    evidence_dir: Path | None = None


class KeptHold:
    """One family's hold: its commands, its simulator (pinned past the hold's end) and the moments to outbid."""

    def __init__(self, work: Path, commands: Commands, outcome: KeptOutcome) -> None:
        self.work, self.commands, self.outcome = work, commands, outcome
        self.store = HeldStore(work / "state" / "sim")
        self.wd = work / "wd"
        self.wd.mkdir(parents=True, exist_ok=True)
        (self.wd / "train.py").write_text(TRAIN)
        self.sim_url: str | None = None
        self.sim_pid: int | None = None
        self.hold: HeldHost | None = None  # the record as the `up` left it (hold id, caps, worst case)
        self.errors: list[str] = []  # what a background outbid could not do

    # ---------------------------------------------------------------------------------------- commands
    def cli(self, *args: str) -> int:
        code, text = self.commands(args)
        self.outcome.exits.append((args[0], code))
        self.outcome.output += f"$ vast-e2e {' '.join(args)}  -> exit {code}\n{text}\n"
        return code

    def up(self, *extra: str, setup: str = "echo setup-ran >> setup.log") -> int:
        code = self.cli("up", NAME, "--sim", "--workdir", str(self.wd), "--max-minutes", "4", "--idle-minutes", "1",
                        "--interruptible", "--checkpoint", "ckpt", "--setup", setup, *FAST, *extra)
        held = self.store.load(NAME)
        if held is not None:
            self.pin(held)
        return code

    def exec(self, steps: int, step_s: float = 0.05) -> int:
        return self.cli("exec", NAME, *FAST, "--", "python3", "train.py", str(steps), str(step_s))

    def down(self) -> int:
        return self.cli("down", NAME)

    # ---------------------------------------------------------------------------------------- the simulator
    def pin(self, held: HeldHost) -> None:
        """Keep the hold's simulator past the hold's end, for the judge."""
        self.hold = held
        if held.sim_pid is None or self.sim_pid is not None:
            return
        self.sim_url, self.sim_pid = held.api_url, held.sim_pid
        self.store.save(held.model_copy(update={"name": PIN, "state": "ending", "bid": None}))

    def state(self) -> dict[str, Any]:
        assert self.sim_url is not None
        return dict(httpx.get(f"{self.sim_url}/_sim/state", timeout=10).json())

    def outbid(self, instance_id: int, url: str | None = None) -> bool:
        answer = httpx.post(f"{url or self.sim_url}/_sim/outbid/{instance_id}", timeout=10)
        return bool(answer.json().get("success"))

    def faults(self, spec: str) -> None:
        assert self.sim_url is not None
        httpx.put(f"{self.sim_url}/_sim/faults", json={"spec": spec}, timeout=10).raise_for_status()

    def outbid_now(self) -> int | None:
        held = self.store.load(NAME)
        if held is None or held.instance_id is None or not self.outbid(held.instance_id, held.api_url):
            self.errors.append("the held instance could not be outbid: the family did not happen")
            return None
        return held.instance_id

    def outbid_when(self, step: str, text: str) -> threading.Thread:
        """Outbid the held instance once step `step`'s log says `text` (in the background: a command runs)."""
        def watch() -> None:
            try:
                held = _wait(lambda: _log_says(self.store.load(NAME), step, text), WAIT_S)
                if held is None or held.instance_id is None or not self.outbid(held.instance_id, held.api_url):
                    self.errors.append(f"{step} never said {text!r} on a held instance: the family did not happen")
            except (httpx.HTTPError, OSError) as exc:
                self.errors.append(f"the outbid during {step} failed: {exc}")

        thread = threading.Thread(target=watch, daemon=True, name=f"outbid-{step}")
        thread.start()
        return thread

    def kill_watcher(self) -> None:
        held = _wait(lambda: (r := self.store.load(NAME)) is not None and watcher_running(r) and r, 10)
        if held is None or held.watcher_pid is None:
            self.errors.append("the hold's watcher never ran")
            return
        os.kill(held.watcher_pid, signal.SIGKILL)
        _wait(lambda: not watcher_running(held), 10)

    def wait_state(self, state: str) -> bool:
        return _wait(lambda: (r := self.store.load(NAME)) is not None and r.state == state, WAIT_S) is not None

    def close(self) -> None:
        if self.sim_pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.sim_pid, signal.SIGTERM)
        with contextlib.suppress(OSError):
            (self.store.dir / f"{PIN}.json").unlink()


# ------------------------------------------------------------------------------------------------ the families
def outbid_during_setup(h: KeptHold) -> None:
    """The `up`'s `--setup` is cut: the up salvages, deletes, proves, rents again and runs the setup again."""
    thread = h.outbid_when("setup-1", SETUP_MARK)
    h.up(setup=f"echo {SETUP_MARK}; sleep 3; echo setup-ran >> setup.log")
    thread.join()
    h.exec(3)
    h.down()


def outbid_during_exec(h: KeptHold) -> None:
    h.up()
    thread = h.outbid_when("exec-1", "step 4")
    h.exec(20, 0.1)
    thread.join()
    h.down()


def outbid_between_execs(h: KeptHold) -> None:
    """The watcher salvages, deletes and proves the husk; the next exec rents (lazily)."""
    h.up()
    h.exec(2)
    h.outbid_now()
    if not h.wait_state("outbid"):
        h.errors.append("the watcher never marked the hold outbid")
    h.exec(4)
    h.down()


def outbid_between_execs_watcher_killed(h: KeptHold) -> None:
    """Nothing of ours runs while it is outbid: the next exec finds the husk and recovers."""
    h.up()
    h.exec(3)
    h.kill_watcher()
    h.outbid_now()
    h.exec(6)
    h.down()


def outbid_during_down(h: KeptHold) -> None:
    """`down`'s DELETE races an outbid: answered 200, nothing deleted, the instance paused; down proves it."""
    h.up()
    h.exec(2)
    h.kill_watcher()
    h.faults("outbid_delete")
    h.down()


def outbid_past_the_limit(h: KeptHold) -> None:
    """k+1 outbids (k = 1): the second ends the hold, every husk gone."""
    h.up("--max-interruptions", "1")
    h.kill_watcher()
    h.outbid_now()
    h.exec(2)
    h.kill_watcher()
    h.outbid_now()
    h.exec(4)


def husk_resumes_after_delete(h: KeptHold) -> None:
    """The husk's DELETE deletes nothing and the husk resumes by itself: deleted again, never two live at once."""
    h.up()
    h.exec(2)
    h.kill_watcher()
    h.faults("outbid_resume:0.3;delete_noop")
    h.outbid_now()
    h.exec(4)
    h.down()


FAMILIES: dict[str, Callable[[KeptHold], None]] = {
    "outbid_during_setup": outbid_during_setup,
    "outbid_during_exec": outbid_during_exec,
    "outbid_between_execs": outbid_between_execs,
    "outbid_between_execs_watcher_killed": outbid_between_execs_watcher_killed,
    "outbid_during_down": outbid_during_down,
    "outbid_past_the_limit": outbid_past_the_limit,
    "husk_resumes_after_delete": husk_resumes_after_delete,
}


def run_kept_family(family: str, work: Path, commands: Commands | None = None) -> KeptOutcome:
    """One hold under `family`, then the judge's rules."""
    outcome = KeptOutcome(family=family)
    hold = KeptHold(work, commands or process_commands(work), outcome)
    try:
        FAMILIES[family](hold)
        outcome.violations += hold.errors
        if hold.hold is None or hold.sim_url is None:
            outcome.violations.append("the up held nothing: no hold to judge")
            return outcome
        if hold.store.load(NAME) is not None:
            outcome.violations.append("the hold is still held after the family's end")
        state = hold.state()
        outcome.evidence_dir = Path(hold.hold.evidence_dir)
        outcome.violations += judge(outcome, hold.hold, state)
    finally:
        hold.close()
    return outcome


def judge(outcome: KeptOutcome, held: HeldHost, state: dict[str, Any]) -> list[str]:
    found: list[str] = []
    mine = [i for i in state["instances"] if i["label"] and held.hold_id in i["label"]]
    outcome.instances = len(mine)
    outcome.billed_usd = sum(float(i["billed_usd"]) for i in mine)
    outcome.outbids = sum(int(i["outbids"]) for i in mine)
    outcome.resumed = sum(int(i["resumes"]) for i in mine)
    outcome.max_usd = held.max_usd
    outcome.worst_case_usd = held.bid.worst_case_usd or 0.0 if held.bid is not None else 0.0
    spans = sorted((float(i["created_at"]), float(i["destroyed_at"] or 1e18), int(i["id"])) for i in mine)
    for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            found.append(f"two live instances at once: {b} was created before {a} was destroyed")
    for inst in mine:
        if inst["live"]:
            found.append(f"husk left: instance {inst['id']} is still live ({inst['actual_status']})")
    if outcome.billed_usd > held.max_usd + 1e-9:
        found.append(f"billed ${outcome.billed_usd:.6f} over the cap ${held.max_usd:.6f}")
    if not outcome.worst_case_usd:
        found.append("the hold's record has no worst case")
    elif outcome.billed_usd > outcome.worst_case_usd + 1e-9:
        found.append(f"billed ${outcome.billed_usd:.6f} over the up's worst case ${outcome.worst_case_usd:.6f}")
    if not outcome.outbids:
        found.append("no instance of the hold was outbid: the family did not happen")
    evidence = Path(held.evidence_dir)
    record = json_or_empty(evidence / "harness-result.json")
    outcome.attempts = [a for a in record.get("attempts", []) if isinstance(a, dict)]
    if len(outcome.attempts) != len(mine):
        found.append(f"the record lists {len(outcome.attempts)} attempt(s) of {len(mine)} instance(s)")
    return found + judge_starts(outcome, evidence)


def judge_starts(outcome: KeptOutcome, evidence: Path) -> list[str]:
    """No exec's command starts behind a step checkpointed (printed) before it, and the first exec to start
    after a salvage (its log written after the salvaged folder) starts at or after the salvaged step."""
    found: list[str] = []
    logs = [p for p in step_logs(evidence) if p.stem.startswith("exec-")]
    printed = 0  # the command prints a step after its checkpoint is on the disk
    firsts: list[tuple[float, int]] = []  # (the log's last change, its command's first start) per exec log
    for log in logs:
        first = None
        for m in re.finditer(r"(start step|step) (\d+)", read_or_empty(log)):
            step = int(m.group(2))
            if m.group(1) == "start step":
                outcome.starts.append(step)
                first = step if first is None else first
                if step < printed:
                    found.append(f"{log.stem} started at step {step}, behind step {printed} checkpointed before it")
            printed = max(printed, step)
        if first is not None:
            firsts.append((log.stat().st_ctime, first))
    for folder in sorted((evidence / SALVAGE_DIR).glob("*/step.txt"), key=lambda p: int(p.parent.name)):
        step = int(folder.read_text().strip() or 0)
        outcome.salvaged.append(step)
        later = [start for changed, start in firsts if changed > folder.stat().st_ctime]
        outcome.resumes.append((step, later[0] if later else None))
        if later and later[0] < step:
            found.append(f"the exec after salvage {folder.parent.name} started at step {later[0]}, behind the "
                         f"checkpoint {step} salvaged")
    return found


def _log_says(held: HeldHost | None, step: str, text: str) -> HeldHost | None:
    if held is None or held.instance_id is None:
        return None
    return held if text in read_or_empty(Path(held.evidence_dir) / "steps" / f"{step}.log") else None


def _wait(check: Callable[[], Any], within_s: float) -> Any:
    deadline = now_s() + within_s
    while now_s() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    return None


if __name__ == "__main__":  # a quick look: python -m vast_harness.chaos.kept FAMILY DIR
    result = run_kept_family(sys.argv[1], Path(sys.argv[2]))
    print(result.output)
    print(result.exits, result.violations, result.starts, result.resumes)
