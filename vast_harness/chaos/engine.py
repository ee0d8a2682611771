"""Chaos: seeded random compositions of simulator faults, caps and boot retries, each driving one guarded run.

A scenario is drawn from `random.Random(seed)` alone (`draw_scenario`), so any seed replays its plan. It runs
one `GuardedRun` in-process against its own `SimServer` with every clock scaled down (rate limits, pacing,
retry waits, proof interval, teardown margin), then `check_scenario` judges the run by the simulator's own
record, never by the harness's word:

* leak           an instance still live at the end, unless the run exited 3 and the ledger names it
* false_absence  'gone' claimed (ledger `absence gone`, harness-result) while the simulator had it live
* over_cap_usd   dollars billed by the simulator above `max_usd` (runs that exit 3 may still bill: skipped)
* over_cap_time  an instance destroyed later than run start + the time cap (same exception)
* exit_mismatch  an exit code that does not fit what happened (design.md, "Exit codes")
* reap_failed    after an exit 3, `reap` (faults cleared) did not exit 0 with nothing live
* hang / crash   a scenario over its wall bound, or an exception out of `GuardedRun.execute`

Kill scenarios (`run_kill9`) run the real CLI as a subprocess against a standalone simulator,
SIGKILL it at a drawn moment, run `vast-e2e reap`, and check the same record.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Literal

import httpx
from pydantic import BaseModel, Field, SecretStr
from rich.console import Console

from vast_harness.bundle import build_bundle
from vast_harness.client import Timeouts, VastClient
from vast_harness.config import RunSpec, Step, load_driver_policy, resolve
from vast_harness.ledger import Ledger
from vast_harness.output import Output
from vast_harness.plan import plan_run
from vast_harness.reap import reap_all
from vast_harness.runner import GuardedRun
from vast_harness.sim.server import SimServer, spawn_standalone

SCALE = 0.01  # simulator rate limits and client pacing: a hundredth of Vast's intervals
TEARDOWN_MARGIN_S = 2.0  # the cap deadline keeps this much for DELETE (retries included)
TEARDOWN_BUDGET_S = 4.0  # one instance's delete + proof before it is declared unproven (exit 3)
BOOT_TIMEOUT_S = 3.0
SCENARIO_WALL_LIMIT_S = 90.0
CLIENT_MAX_RETRY_S = 1.5  # under the margin: a DELETE that keeps failing gives up before the cap
CLIENT_TIMEOUTS = Timeouts(connect_s=2.0, read_s=2.0, write_s=2.0, pool_s=2.0)
MAX_HANG_S = 0.5  # hangs stay well under the client's read timeout
KEY = "sim-chaos-key"
ENDPOINTS = ("search", "create", "show", "list", "destroy", "user", "any")
FAULT_KINDS = ("429", "5xx", "hang", "create_timeout", "create_stopped", "offer_taken", "delete_fail",
               "read_lag", "boot_stall", "offline", "ssh_refuse", "ssh_drop", "slow_sftp")
VIOLATION_KINDS = ("leak", "false_absence", "over_cap_usd", "over_cap_time", "exit_mismatch", "reap_failed",
                   "hang", "crash")
CapMode = Literal["generous", "time", "cost", "unrentable"]


class Violation(BaseModel):
    kind: str
    detail: str
    known: str | None = None  # the KNOWN_ISSUES entry it matches: reported, not counted


# Harness bugs this suite found, each pinned by an xfail(strict=True) test in tests/harness/test_chaos.py.
# A matching violation is reported as known and not counted. When a fix lands, its xfail test passes, which
# strict mode turns into a failure: then delete the entry here too.
KNOWN_ISSUES: dict[str, tuple[str, re.Pattern[str]]] = {}


def classify(violation: Violation) -> Violation:
    for name, (kind, pattern) in KNOWN_ISSUES.items():
        if violation.kind == kind and pattern.search(violation.detail):
            return violation.model_copy(update={"known": name})
    return violation


class ScenarioPlan(BaseModel):
    """Everything a scenario does, drawn from its seed. `faults` is a simulator SPEC (usable with --faults)."""

    seed: int
    faults: str
    cap_mode: CapMode
    max_minutes: float
    usd_factor: float | None = None  # cost/unrentable: max_usd = worst case of the plan's chosen offer x this
    boot_retries: int
    proof_interval_s: float
    step_sleep_s: float
    step_rc: int
    steps: int

    @property
    def fault_kinds(self) -> set[str]:
        return {item.split(":")[0].split("@")[0] for item in self.faults.split(";") if item and "=" not in item}


class ScenarioOutcome(BaseModel):
    seed: int
    plan: ScenarioPlan
    exit_code: int | None = None
    message: str = ""
    wall_s: float = 0.0
    max_usd: float | None = None
    billed_usd: float = 0.0
    instances: int = 0
    faults_fired: dict[str, int] = Field(default_factory=dict)
    violations: list[Violation] = Field(default_factory=list)
    log: str = ""


def scenario_seed(suite_seed: int, index: int) -> int:
    """The seed of scenario `index` of a suite: what `--replay` takes."""
    return (suite_seed * 1_000_003 + index) % (2**31)


def _draw_rule(rng: random.Random) -> str:
    kind = rng.choice(FAULT_KINDS)
    count = rng.randint(1, 3)
    match kind:
        case "429":
            item = f"429:{rng.choice(ENDPOINTS)}:{count}"
        case "5xx":
            item = f"5xx:{rng.choice(ENDPOINTS)}:{count}"
        case "hang":
            item = f"hang:{rng.choice(ENDPOINTS)}:{rng.uniform(0.05, MAX_HANG_S):.2f}:{rng.randint(1, 2)}"
        case "create_timeout":
            item = f"create_timeout:1:{rng.uniform(0.0, 0.3):.2f}"
        case "create_stopped" | "boot_stall":
            item = f"{kind}:1"
        case "offer_taken":
            item = f"offer_taken:{rng.randint(1, 2)}"
        case "delete_fail":
            item = f"delete_fail:{count}:{rng.choice((429, 500, 502, 503, 504))}"
        case "read_lag":
            item = f"read_lag:{rng.uniform(0.1, 1.0):.2f}:{rng.randint(1, 2)}"
        case "offline":
            item = f"offline:{rng.uniform(0.0, 1.0):.2f}:1"
        case "ssh_refuse":
            item = f"ssh_refuse:{count}"
        case "ssh_drop":
            item = f"ssh_drop:{rng.uniform(0.05, 0.4):.2f}:1"
        case _:  # slow_sftp: the bundle (a few hundred kB) takes a fraction of a second to a few seconds
            item = f"slow_sftp:{rng.randint(200_000, 4_000_000)}:1"
    # Some rules fire only sometimes: the draw comes from the simulator's seeded RNG (seed= below).
    return item + (f"@{rng.choice((0.3, 0.5, 0.8))}" if rng.random() < 0.15 else "")


def draw_scenario(seed: int) -> ScenarioPlan:
    rng = random.Random(seed)
    rules = [] if rng.random() < 0.1 else [_draw_rule(rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.03:
        rules.append("delete_fail:*:503")  # DELETE never succeeds: the run must exit 3 and reap must clean up
    cap_mode: CapMode = rng.choices(("generous", "time", "cost", "unrentable"), weights=(70, 15, 10, 5))[0]
    step_sleep_s = round(rng.uniform(0.0, 0.3), 2)
    max_minutes, usd_factor = 1.0, None
    if cap_mode in ("time", "cost"):
        headroom_s = rng.uniform(1.0, 4.0)  # seconds between run start and the cap deadline
        max_minutes = round((TEARDOWN_MARGIN_S + headroom_s) / 60.0, 4)
        step_sleep_s = round(headroom_s + 3.0, 2)  # the step outlives the deadline
    if cap_mode == "cost":
        usd_factor = round(rng.uniform(1.001, 1.05), 4)
    elif cap_mode == "unrentable":
        usd_factor = round(rng.uniform(0.3, 0.95), 4)
    rules.append(f"seed={seed}")
    return ScenarioPlan(seed=seed, faults=";".join(rules), cap_mode=cap_mode, max_minutes=max_minutes,
                        usd_factor=usd_factor, boot_retries=rng.choice((0, 1, 1, 2)),
                        proof_interval_s=round(rng.uniform(0.05, 0.2), 3), step_sleep_s=step_sleep_s,
                        step_rc=rng.choice((3, 7)) if rng.random() < 0.1 else 0, steps=rng.choice((1, 1, 2)))


# ------------------------------------------------------------------------------------------ in-process run


def _client(url: str) -> VastClient:
    return VastClient(KEY, base_url=url, pacing_scale=SCALE, timeouts=CLIENT_TIMEOUTS, retry_wait_min_s=0.02,
                      retry_wait_max_s=0.2, max_retry_s=CLIENT_MAX_RETRY_S)


def _output(buf: io.StringIO) -> Output:
    out = Output(quiet=False)
    out.out = Console(file=buf, highlight=False, width=140)
    out.err = out.out
    return out


def build_spec(plan: ScenarioPlan, sim: SimServer, evidence_dir: Path) -> RunSpec:
    base = resolve(profile="smoke", sim=True, environ={}, evidence_dir=evidence_dir,
                   proof_interval_s=plan.proof_interval_s, poll_s=0.05, boot_retries=plan.boot_retries,
                   max_minutes=plan.max_minutes)
    steps = [Step(name=f"chaos-{i}", run=f"echo chaos step {i}; sleep {plan.step_sleep_s}"
                  + (f"; exit {plan.step_rc}" if i == plan.steps - 1 and plan.step_rc else ""),
                  timeout_s=30) for i in range(plan.steps)]
    profile = base.profile.model_copy(update={"steps": steps, "boot_timeout_s": BOOT_TIMEOUT_S})
    spec = base.model_copy(update={"profile": profile, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "teardown_margin_s": TEARDOWN_MARGIN_S})
    if plan.usd_factor is None:
        return spec
    # Quote the run fault-free first: the cap is a fraction of the offer the run will choose.
    with _client(sim.url) as client:
        worst_usd = plan_run(spec, client, load_driver_policy(), build_bundle()).chosen.quote.worst_case_usd
    sim.reset()
    return spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": worst_usd * plan.usd_factor})})


def run_scenario(plan: ScenarioPlan, workdir: Path) -> ScenarioOutcome:
    """One guarded run under `plan`'s faults, then every check. Never raises for a harness failure."""
    outcome = ScenarioOutcome(seed=plan.seed, plan=plan)
    buf = io.StringIO()
    started = time.monotonic()
    with SimServer(seed=plan.seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim:
        spec = build_spec(plan, sim, workdir / "ev")
        outcome.max_usd = spec.caps.max_usd
        sim.set_faults(plan.faults)
        run: GuardedRun | None = None
        start_unix = time.time()
        try:
            with _client(sim.url) as client:
                run = GuardedRun(spec, client, load_driver_policy(), _output(buf))
                run.teardown_budget_s = TEARDOWN_BUDGET_S
                result = run.execute()
            outcome.exit_code, outcome.message = result.exit_code, result.message
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported with the rest
            where = traceback.format_exc(limit=-4)[-1500:]
            outcome.violations.append(classify(Violation(kind="crash",
                                                         detail=f"{type(exc).__name__}: {exc}\n{where}")))
        state = sim.state()
        outcome.faults_fired = _fired(state)
        outcome.violations += check_scenario(plan, spec, outcome, state, run, start_unix)
        if outcome.exit_code == 3:
            outcome.violations += _reap_and_check(spec, sim, buf)
    outcome.wall_s = round(time.monotonic() - started, 3)
    outcome.log = buf.getvalue()[-6000:]
    return outcome


def _fired(state: dict[str, Any]) -> dict[str, int]:
    fired: Counter[str] = Counter()
    for rule in state["faults"]["rules"]:
        fired[rule["kind"]] += rule["fired"]
    return {k: v for k, v in fired.items() if v}


def _reap_and_check(spec: RunSpec, sim: SimServer, buf: io.StringIO) -> list[Violation]:
    sim.set_faults(None)
    with _client(sim.url) as client:
        code = reap_all(spec, client, _output(buf))
    live = [i["id"] for i in sim.state()["instances"] if i["live"]]
    if code != 0 or live:
        return [Violation(kind="reap_failed", detail=f"reap exited {code}; live after reap: {live}")]
    return []


def check_scenario(plan: ScenarioPlan, spec: RunSpec, outcome: ScenarioOutcome, state: dict[str, Any],
                   run: GuardedRun | None, start_unix: float) -> list[Violation]:
    """The invariants, judged from the simulator's record (`state`) and what the run left on disk."""
    instances = state["instances"]
    outcome.instances = len(instances)
    outcome.billed_usd = sum(i["billed_usd"] for i in instances)
    ledger = Ledger(spec.evidence_dir / "ledger.jsonl")
    pending, unknown_labels = ledger.unproven()
    live = [i for i in instances if i["live"]]
    found: list[Violation] = []
    for inst in live:
        named = inst["id"] in pending or inst["label"] in unknown_labels
        if outcome.exit_code not in (3, None) or not named:  # None: a crash, reported as such
            found.append(Violation(kind="leak", detail=f"instance {inst['id']} live at the end (exit "
                                   f"{outcome.exit_code}, named by the ledger: {named})"))
    found += false_absences(instances, spec.evidence_dir)
    # Exit 3 says "may still bill" (so may a crash that left one live): the caps cannot be judged then.
    if outcome.exit_code != 3 and not (outcome.exit_code is None and live):
        if outcome.billed_usd > spec.caps.max_usd:
            found.append(Violation(kind="over_cap_usd", detail=f"billed ${outcome.billed_usd:.6f} > cap "
                                   f"${spec.caps.max_usd:.6f}"))
        for inst in instances:
            late_s = (inst["destroyed_at"] or state["now"]) - start_unix - spec.max_seconds
            if late_s > 0:
                found.append(Violation(kind="over_cap_time", detail=f"instance {inst['id']} lived {late_s:.2f} s "
                                       f"past the {spec.max_seconds:.1f} s cap"))
    found += [Violation(kind="exit_mismatch", detail=d) for d in exit_mismatches(plan, outcome, run)]
    return [classify(v) for v in found]


def false_absences(instances: list[dict[str, Any]], evidence_dir: Path) -> list[Violation]:
    """'gone' claimed (ledger `absence gone`, harness-result.json) while the simulator still had it live."""
    by_id = {i["id"]: i for i in instances}
    claims = [(e.instance_id, e.t_unix, "ledger") for e in Ledger(evidence_dir / "ledger.jsonl").entries()
              if e.event == "absence" and e.verdict == "gone"]
    for path in evidence_dir.glob("*/harness-result.json"):
        result = json.loads(path.read_text())
        claims += [(int(i), result["finished_unix"], path.parent.name)
                   for i, verdict in result["absence"]["per_instance"].items() if verdict == "gone"]
    found = []
    for instance_id, t_unix, source in claims:
        if instance_id not in by_id:
            continue  # never created: nothing to be wrong about
        destroyed = by_id[instance_id]["destroyed_at"]
        if destroyed is None or destroyed > t_unix:
            found.append(Violation(kind="false_absence", detail=f"{source} says {instance_id} gone at {t_unix:.3f}; "
                                   f"the simulator destroyed it at {destroyed}"))
    return found


def exit_mismatches(plan: ScenarioPlan, outcome: ScenarioOutcome, run: GuardedRun | None) -> list[str]:
    code = outcome.exit_code
    if code is None:
        return []  # a crash, reported as such
    why = []
    if code not in (0, 1, 3, 4, 5, 6):
        why.append(f"exit {code} cannot happen in-process with valid input")
    steps = run.steps if run else []
    if code in (0, 4) and (len(steps) != plan.steps or any(s.rc != 0 for s in steps) or plan.step_rc):
        why.append(f"exit {code} but the steps were {[(s.name, s.rc) for s in steps]} (plan rc {plan.step_rc})")
    if code == 5 and outcome.instances:
        why.append(f"exit 5 (nothing rented) but the simulator has {outcome.instances} instance(s)")
    if code == 1 and run and run.created and "before the deadline" in outcome.message \
            and run.created[-1].t_created_mono + BOOT_TIMEOUT_S > run.cap_deadline:
        why.append(f"exit 1 though the cap deadline cut the boot (expected 6): {outcome.message[:200]}")
    if code == 6 and plan.cap_mode not in ("time", "cost"):
        why.append("exit 6 with generous caps")
    if plan.cap_mode == "unrentable" and code != 5:
        why.append(f"cap below every offer's worst case, yet exit {code} (expected 5)")
    if code == 3 and run and all(t.verdict == "gone" for t in run.teardowns):
        why.append("exit 3 though every teardown was proven")
    if code != 3 and run and any(t.verdict != "gone" for t in run.teardowns):
        why.append(f"exit {code} though a teardown was not proven")
    if plan.fault_kinds == set() and plan.cap_mode == "generous" and not plan.step_rc and code not in (0, 4):
        why.append(f"fault-free run with generous caps exited {code}: {outcome.message}")
    return why


# ------------------------------------------------------------------------------------- kill -9 of the CLI

Trigger = Literal["time", "intent", "created", "delete_ack"]
REPO_ROOT = Path(__file__).resolve().parents[2]
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


def _cli(*args: str, url: str, evidence: Path) -> list[str]:
    return [sys.executable, "scripts/vast_e2e.py", *args, "--api-url", url, "--evidence-dir", str(evidence),
            "--proof-interval", str(KILL9_PROOF_INTERVAL_S), "--pacing-scale", str(SCALE)]


def _wait_trigger(proc: subprocess.Popen[bytes], plan: Kill9Plan, ledger: Ledger, started: float) -> bool:
    """Block until the kill moment; False when the run ended first."""
    while time.monotonic() - started < KILL9_HARNESS_LIMIT_S:
        if proc.poll() is not None:
            return False
        if plan.trigger == "time":
            if time.monotonic() - started >= plan.delay_s:
                return True
        elif any(e.event == plan.trigger for e in ledger.entries()):
            time.sleep(plan.delay_s)
            return proc.poll() is None
        time.sleep(0.02)
    return proc.poll() is None  # over the limit: kill it anyway (the check then sees what it left)


def run_kill9(plan: Kill9Plan) -> Kill9Outcome:
    """The CLI against a standalone simulator, SIGKILLed at the drawn moment, then `reap`; then the checks."""
    outcome = Kill9Outcome(seed=plan.seed, plan=plan)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"vh-kill9-{plan.seed}-") as tmp, \
            (Path(tmp) / "sim.log").open("w") as sim_log:
        work = Path(tmp)
        sim, url = _start_sim(plan, sim_log)
        env = dict(os.environ, VAST_API_KEY=KEY)
        ledger = Ledger(work / "ev" / "ledger.jsonl")
        try:
            with (work / "harness.log").open("wb") as log:
                harness = subprocess.Popen(
                    _cli("--profile", "smoke", "--poll-interval", "0.1", url=url, evidence=work / "ev"),
                    cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                t_start_unix = time.time()
                outcome.killed = _wait_trigger(harness, plan, ledger, time.monotonic())
                if outcome.killed:
                    harness.send_signal(signal.SIGKILL)
                    outcome.t_kill_s = round(time.time() - t_start_unix, 3)
                outcome.harness_rc = harness.wait(timeout=30)
                if outcome.killed:
                    outcome.harness_rc = None
            reap = subprocess.run(_cli("reap", url=url, evidence=work / "ev"), cwd=REPO_ROOT, env=env, check=False,
                                  capture_output=True, text=True, timeout=KILL9_REAP_LIMIT_S)
            outcome.reap_rc = reap.returncode
            state = httpx.get(f"{url}/_sim/state", timeout=10).json()
        finally:
            sim.terminate()
            sim.wait(timeout=30)
            if sim.stdout is not None:
                sim.stdout.close()
        outcome.violations += _check_kill9(outcome, state, ledger, reap.stdout + reap.stderr)
        outcome.ledger_events = [f"{e.event}@{e.t_unix - t_start_unix:.2f}" for e in ledger.entries()]
    outcome.wall_s = round(time.monotonic() - started, 2)
    return outcome


def _check_kill9(outcome: Kill9Outcome, state: dict[str, Any], ledger: Ledger, reap_log: str) -> list[Violation]:
    instances = state["instances"]
    outcome.instances = len(instances)
    found = [Violation(kind="leak", detail=f"instance {i['id']} ({i['label']}) live after reap")
             for i in instances if i["live"]]
    if outcome.reap_rc != 0:
        found.append(Violation(kind="reap_failed", detail=f"reap exited {outcome.reap_rc}: {reap_log[-800:]}"))
    if ledger.unproven()[0]:
        found.append(Violation(kind="reap_failed", detail=f"ledger still pending: {sorted(ledger.unproven()[0])}"))
    found += false_absences(instances, ledger.path.parent)
    if not outcome.killed and outcome.harness_rc not in (0, 1, 4):
        found.append(Violation(kind="exit_mismatch", detail=f"fault-free run ended with {outcome.harness_rc}"))
    return found


# ------------------------------------------------------------------------------------------- the suite


def run_bounded(plan: ScenarioPlan, limit_s: float = SCENARIO_WALL_LIMIT_S) -> ScenarioOutcome:
    """`run_scenario` in its own thread; past `limit_s` it is reported as a hang and left behind (daemon)."""
    _quiet_paramiko()
    box: dict[str, ScenarioOutcome] = {}
    with tempfile.TemporaryDirectory(prefix=f"vh-chaos-{plan.seed}-") as tmp:
        def target() -> None:
            try:
                box["out"] = run_scenario(plan, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - the engine's own failure, reported, not raised
                detail = f"chaos engine: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}"
                box["out"] = ScenarioOutcome(seed=plan.seed, plan=plan, violations=[Violation(kind="crash",
                                                                                         detail=detail)])

        worker = threading.Thread(target=target, daemon=True, name=f"chaos-{plan.seed}")
        worker.start()
        worker.join(limit_s)
        if "out" in box:
            return box["out"]
        return ScenarioOutcome(seed=plan.seed, plan=plan, wall_s=limit_s,
                               violations=[Violation(kind="hang", detail=f"still running after {limit_s:g} s")])


def _quiet_paramiko() -> None:
    """Dropped connections are the point here; paramiko's transport threads would print each to stderr."""
    logger = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


class SuiteReport(BaseModel):
    suite_seed: int
    wall_s: float = 0.0
    scenarios: list[ScenarioOutcome] = Field(default_factory=list)
    kill9: list[Kill9Outcome] = Field(default_factory=list)

    def violations(self) -> Counter[str]:
        """Violations by kind, known issues left out (see `known`)."""
        found: Counter[str] = Counter({kind: 0 for kind in VIOLATION_KINDS})
        for o in [*self.scenarios, *self.kill9]:
            found.update(v.kind for v in o.violations if v.known is None)
        return found

    def known(self) -> Counter[str]:
        return Counter(v.known for o in [*self.scenarios, *self.kill9] for v in o.violations if v.known)

    def exit_codes(self) -> Counter[str]:
        return Counter(str(o.exit_code) for o in self.scenarios)

    def faults(self) -> dict[str, tuple[int, int, int]]:
        """kind -> (scenarios that drew it, scenarios where it fired, total fires)."""
        table = {}
        for kind in FAULT_KINDS:
            drawn = sum(kind in o.plan.fault_kinds for o in self.scenarios)
            hit = [o.faults_fired.get(kind, 0) for o in self.scenarios]
            table[kind] = (drawn, sum(1 for h in hit if h), sum(hit))
        return table


def run_suite(count: int, suite_seed: int, *, workers: int = 4, kill9: int = 0,
              progress: Callable[[str], None] | None = None) -> SuiteReport:
    report = SuiteReport(suite_seed=suite_seed)
    started = time.monotonic()
    plans = [draw_scenario(scenario_seed(suite_seed, i)) for i in range(count)]
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="chaos") as pool:
        for outcome in pool.map(run_bounded, plans):
            report.scenarios.append(outcome)
            if progress:
                progress(_progress_line(len(report.scenarios), count, outcome))
    for k in range(kill9):
        outcome = run_kill9(draw_kill9(scenario_seed(suite_seed, 1_000_000 + k)))
        report.kill9.append(outcome)
        if progress:
            progress(f"kill9 {k + 1}/{kill9} seed {outcome.seed}: {outcome.summary()}")
    report.wall_s = round(time.monotonic() - started, 2)
    return report


def _progress_line(done: int, total: int, o: ScenarioOutcome) -> str:
    flags = ",".join(v.kind for v in o.violations) or "ok"
    return f"[{done}/{total}] seed {o.seed} exit {o.exit_code} {o.wall_s:.1f}s {o.plan.cap_mode} {flags}"
