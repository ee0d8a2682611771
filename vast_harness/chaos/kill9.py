"""Kill -9 scenarios: the real CLI against a standalone simulator, SIGKILLed at a drawn moment, then `reap`.

The trigger is a time after start or the ledger's first event of a kind (intent, created, delete_ack); the
checks are the judge's (no instance live after reap, no false absence, the ledger left with nothing pending).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Literal

import httpx
from pydantic import BaseModel, Field

from vast_harness.chaos.engine import KEY, SCALE
from vast_harness.chaos.judge import Violation, classify, false_absences, sim_bugs, traceback_violations
from vast_harness.clock import now_s
from vast_harness.resources import data_root
from vast_harness.sim.server import spawn_standalone
from vast_harness.state.ledger import LEDGER_FILE, Ledger

Trigger = Literal["time", "intent", "created", "delete_ack"]
KILL9_HARNESS_LIMIT_S = 120.0
KILL9_REAP_LIMIT_S = 120.0
KILL9_PROOF_INTERVAL_S = 0.5  # long enough that a kill drawn after delete_ack lands inside the proof


class Kill9Plan(BaseModel):
    """SIGKILL the CLI `delay_s` after run start (time) or after the ledger's first `trigger` event."""

    seed: int
    trigger: Trigger
    delay_s: float


class Kill9Outcome(BaseModel):
    seed: int
    plan: Kill9Plan
    killed: bool = False
    harness_rc: int | None = None  # set only when the run ended before the kill
    reap_rc: int | None = None
    instances: int = 0
    ledger_events: list[str] = Field(default_factory=list)  # "event@seconds after the CLI started"
    t_kill_s: float | None = None  # seconds after the CLI started
    wall_s: float = 0.0
    violations: list[Violation] = Field(default_factory=list)

    def summary(self) -> str:
        what = f"killed at {self.t_kill_s}s ({self.plan.trigger}+{self.plan.delay_s:.2f}s)" if self.killed else \
            f"finished first (rc {self.harness_rc}; ledger {' '.join(self.ledger_events)})"
        flags = ",".join(v.kind for v in self.violations) or "ok"
        return f"{what}; {self.instances} instance(s); reap rc {self.reap_rc}; {flags}"


TRIGGERS: tuple[Trigger, ...] = ("intent", "created", "time", "delete_ack")


def draw_kill9(seed: int) -> Kill9Plan:
    """The trigger cycles with the seed, so a suite's consecutive kill seeds cover every window."""
    rng = random.Random(seed)
    trigger = TRIGGERS[seed % len(TRIGGERS)]
    # time: from the CLI's start, across startup, plan, create, boot, upload and the smoke steps (~5 s here)
    delay_s = rng.uniform(0.3, 3.5) if trigger == "time" else rng.uniform(0.0, 0.4)
    return Kill9Plan(seed=seed, trigger=trigger, delay_s=round(delay_s, 3))


def _start_sim(plan: Kill9Plan, log: IO[str]) -> tuple[subprocess.Popen[str], str]:
    args = ["--seed", str(plan.seed), "--rate-scale", str(SCALE), "--boot-seconds", "0.2", "--offers", "1000"]
    if plan.trigger == "intent":  # the create stalls, so the kill lands between the intent and its outcome
        args += ["--faults", "create_timeout:1:3"]
    try:
        return spawn_standalone(args, stderr=log)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {log.name}") from None


def _cli(*args: str, url: str) -> list[str]:
    """The CLI with no --evidence-dir: the ledger and evidence go to the state dir ($VAST_HARNESS_HOME)."""
    return [sys.executable, str(data_root() / "scripts" / "vast_e2e.py"), *args, "--api-url", url,
            "--proof-interval", str(KILL9_PROOF_INTERVAL_S), "--pacing-scale", str(SCALE)]


def _wait_trigger(proc: subprocess.Popen[bytes], plan: Kill9Plan, ledger: Ledger, started: float) -> bool:
    """Block until the kill moment; False when the run ended first."""
    while now_s() - started < KILL9_HARNESS_LIMIT_S:
        if proc.poll() is not None:
            return False
        if plan.trigger == "time":
            if now_s() - started >= plan.delay_s:
                return True
        elif any(e.event == plan.trigger for e in ledger.entries()):
            time.sleep(plan.delay_s)
            return proc.poll() is None
        time.sleep(0.02)
    return proc.poll() is None  # over the limit: kill it anyway (the check then sees what it left)


def run_kill9(plan: Kill9Plan) -> Kill9Outcome:
    """The CLI against a standalone simulator, SIGKILLed at the drawn moment, then `reap`; then the checks."""
    outcome = Kill9Outcome(seed=plan.seed, plan=plan)
    started = now_s()
    with tempfile.TemporaryDirectory(prefix=f"vh-kill9-{plan.seed}-") as tmp, \
            (Path(tmp) / "sim.log").open("w") as sim_log:
        work = Path(tmp)
        sim, url = _start_sim(plan, sim_log)
        # The user's state dir; the run starts in one directory and the reap in another (state follows the user)
        env = dict(os.environ, VAST_API_KEY=KEY, VAST_HARNESS_HOME=str(work / "ev"))
        ledger = Ledger(work / "ev" / LEDGER_FILE)
        elsewhere = work / "elsewhere"
        elsewhere.mkdir()
        try:
            with (work / "harness.log").open("wb") as log:
                harness = subprocess.Popen(
                    _cli("--profile", "smoke", "--poll-interval", "0.1", url=url),
                    cwd=data_root(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                t_start_unix = time.time()
                outcome.killed = _wait_trigger(harness, plan, ledger, now_s())
                if outcome.killed:
                    harness.send_signal(signal.SIGKILL)
                    outcome.t_kill_s = round(time.time() - t_start_unix, 3)
                outcome.harness_rc = harness.wait(timeout=30)
                if outcome.killed:
                    outcome.harness_rc = None
            reap = subprocess.run(_cli("reap", url=url), cwd=elsewhere, env=env, check=False,
                                  capture_output=True, text=True, timeout=KILL9_REAP_LIMIT_S)
            outcome.reap_rc = reap.returncode
            state = httpx.get(f"{url}/_sim/state", timeout=10).json()
        finally:
            sim.terminate()
            sim.wait(timeout=30)
            if sim.stdout is not None:
                sim.stdout.close()
        harness_log = (work / "harness.log").read_text(errors="replace")
        outcome.violations += _check_kill9(outcome, state, ledger, reap.stdout + reap.stderr)
        outcome.violations += traceback_violations(harness_log, "harness")
        outcome.violations += traceback_violations(reap.stdout + reap.stderr, "reap")
        outcome.violations = [classify(v) for v in outcome.violations]
        outcome.ledger_events = [f"{e.event}@{e.t_unix - t_start_unix:.2f}" for e in ledger.entries()]
    outcome.wall_s = round(now_s() - started, 2)
    return outcome


def _check_kill9(outcome: Kill9Outcome, state: dict[str, Any], ledger: Ledger, reap_log: str) -> list[Violation]:
    instances = state["instances"]
    outcome.instances = len(instances)
    found = [Violation(kind="leak", detail=f"instance {i['id']} ({i['label']}) live after reap")
             for i in instances if i["live"]]
    pending_ids, unresolved = ledger.unproven()
    labels_seen = {i["label"] for i in instances}
    # A kill between the intent and an answer leaves a create of unknown outcome: while no instance carries its
    # label, reap's honest answer is "not proven" (exit 3), never "all absent"; only that is accepted here.
    honest_unknown = (outcome.reap_rc == 3 and not pending_ids and unresolved
                      and not unresolved & labels_seen and "unknown outcome" in reap_log)
    if outcome.reap_rc != 0 and not honest_unknown:
        found.append(Violation(kind="reap_failed", detail=f"reap exited {outcome.reap_rc}: {reap_log[-800:]}"))
    if pending_ids:
        found.append(Violation(kind="reap_failed", detail=f"ledger still pending: {sorted(ledger.unproven()[0])}"))
    found += false_absences(instances, ledger.path.parent)
    found += sim_bugs(state)
    if not outcome.killed and outcome.harness_rc not in (0, 1, 4):
        found.append(Violation(kind="exit_mismatch", detail=f"fault-free run ended with {outcome.harness_rc}"))
    return found


