"""In-process chaos: seeded random compositions of simulator faults, caps and boot retries, each one guarded run.

A scenario is drawn from `random.Random(seed)` alone (`draw_scenario`), so any seed replays its plan. It runs
one `GuardedRun` in-process against its own `SimServer` with every clock scaled down (rate limits, pacing,
retry waits, proof interval, teardown margin), then `check_scenario` judges the run by the simulator's own
record (see `judge`). A crash is an exception out of `GuardedRun.execute`; a hang a run over its wall bound.

The simulator's fault grammar is the mix: `SIM_RULES` maps each fault kind to a one-line generator of a
SPEC item (`python -m vast_harness.sim --help`). A new simulator fault joins the suite with one line there.
"""

from __future__ import annotations

import io
import logging
import random
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr
from rich.console import Console

from vast_harness.actions.reap import reap_all
from vast_harness.chaos.judge import (
    Violation,
    cap_violations,
    classify,
    false_absences,
    gpu_liar_violations,
    receipt_violations,
    sim_bugs,
)
from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.host.bundle import build_bundle
from vast_harness.market.plan import plan_run
from vast_harness.run.runner import GuardedRun
from vast_harness.sim.server import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.ledger import LEDGER_FILE, Ledger
from vast_harness.vast.client import Timeouts, VastClient

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
CapMode = Literal["generous", "time", "cost", "unrentable"]
Draw = Callable[[random.Random, int], str]  # (rng, a drawn count 1..3) -> SPEC item


# One line per simulator fault kind: how a scenario draws a SPEC item of it. The draw order is this dict's
# order (a new line changes which rules later seeds draw; each seed still replays its own plan).
SIM_RULES: dict[str, Draw] = {
    "429": lambda r, n: f"429:{r.choice(ENDPOINTS)}:{n}",
    "5xx": lambda r, n: f"5xx:{r.choice(ENDPOINTS)}:{n}",
    "hang": lambda r, n: f"hang:{r.choice(ENDPOINTS)}:{r.uniform(0.05, MAX_HANG_S):.2f}:{r.randint(1, 2)}",
    "create_timeout": lambda r, n: f"create_timeout:1:{r.uniform(0.0, 0.3):.2f}",
    "create_stopped": lambda r, n: "create_stopped:1",
    "offer_taken": lambda r, n: f"offer_taken:{r.randint(1, 2)}",
    "delete_fail": lambda r, n: f"delete_fail:{n}:{r.choice((429, 500, 502, 503, 504))}",
    "read_lag": lambda r, n: f"read_lag:{r.uniform(0.1, 1.0):.2f}:{r.randint(1, 2)}",
    "boot_stall": lambda r, n: "boot_stall:1",
    "offline": lambda r, n: f"offline:{r.uniform(0.0, 1.0):.2f}:1",
    "ssh_refuse": lambda r, n: f"ssh_refuse:{n}",
    "ssh_drop": lambda r, n: f"ssh_drop:{r.uniform(0.05, 0.4):.2f}:1",
    # the bundle (a few hundred kB) takes a fraction of a second to a few seconds
    "slow_sftp": lambda r, n: f"slow_sftp:{r.randint(200_000, 4_000_000)}:1",
    # Vast's real-market behaviours (docs/vast-behaviours.md)
    "linger": lambda r, n: f"linger:{r.uniform(0.2, 2.0):.1f}",
    "create_5xx": lambda r, n: f"create_5xx:1:{r.choice((502, 503, 504))}",
    "create_hold": lambda r, n: f"create_hold:{r.uniform(0.1, 1.0):.2f}",
    "double_accept": lambda r, n: "double_accept:1",
    "oci_fail": lambda r, n: "oci_fail:1",
    "manifest_missing": lambda r, n: "manifest_missing:1",
    "exit": lambda r, n: f"exit:{r.uniform(0.0, 1.0):.2f}:1",
    "credit_zero": lambda r, n: f"credit_zero:{r.uniform(0.0, 1.0):.2f}:1",
    "reprice_offer": lambda r, n: f"reprice_offer:{r.choice((1.5, 3.0, 10.0))}",
    # a host raising its price mid-run, as Vast allows it (a pending increase: the contract's price holds), and
    # the running contract's own price raised, which Vast's docs say cannot happen (the defence: every read)
    "reprice": lambda r, n: f"reprice:{r.choice((1.5, 3.0, 10.0))}:{r.uniform(0.0, 1.0):.2f}",
    "reprice_silent": lambda r, n: f"reprice_silent:{r.choice((1.5, 3.0, 10.0))}:{r.uniform(0.0, 1.0):.2f}",
    # issue 21: the dead-man switch's key refused, the v0 instance paths retired (for a few calls, or for good:
    # exit 3, then reap), Scheduling, a negative balance that Vast resolves by stopping and destroying
    "container_key_refused": lambda r, n: "container_key_refused:1",
    "v0_deprecated": lambda r, n: f"v0_deprecated:{r.choice((str(n), str(n + 3), '*'))}",
    "scheduling": lambda r, n: f"scheduling:{r.uniform(0.1, 1.5):.2f}",
    "negative_balance": lambda r, n: f"negative_balance:{r.uniform(0.0, 1.0):.2f}:1",
    # issue 33: the per-id read as Vast's own QA tool sees it (a one-element list, no ports), `error`, Vast
    # refreshing the host's authorized keys, a DELETE that answers 200 and deletes nothing
    "show_list": lambda r, n: f"show_list:{r.choice((str(n), '*'))}",
    "show_no_ports": lambda r, n: f"show_no_ports:{r.choice((str(n), '*'))}",
    "error_status": lambda r, n: "error_status:1",
    "key_reset": lambda r, n: f"key_reset:{r.uniform(0.0, 1.0):.2f}:1",
    "delete_noop": lambda r, n: f"delete_noop:{n}",
    # issue 31: a host whose nvidia-smi names another GPU than its offer (refused after SSH, deleted)
    "gpu_mismatch": lambda r, n: f"gpu_mismatch:{r.randint(1, 2)}",
    # issue 35: a server clock hours off in `Date` (ahead, or ahead then behind: its sign flips mid-run), a row
    # whose start_date is older than its create, a create answer naming the account's decoy (run_scenario rents
    # one whenever wrong_contract is drawn; the judge's `not_ours`)
    "date_ahead": lambda r, n: f"date_ahead:{r.choice((90, 7200))}" + ("" if r.random() < 0.5 else f":{3 * n}"),
    "date_behind": lambda r, n: (f"date_ahead:7200:{3 * n};" if r.random() < 0.3 else "")
    + f"date_behind:{r.choice((90, 7200))}",
    "started_earlier": lambda r, n: f"started_earlier:{r.choice((60, 7200, 86400))}",
    "wrong_contract": lambda r, n: "wrong_contract:1",
    # issue 44: hosts whose receipt lies (slower than the gates allow, well past the ±3% noise): refused after
    # their receipt, deleted, the next offer rented; the judge's `receipt_failed_used` and `healthy_refused`
    "pcie_slow": lambda r, n: f"pcie_slow:{r.uniform(0.2, 0.6):.2f}:{r.randint(1, 2)}",
    "gpu_slow": lambda r, n: f"gpu_slow:{r.uniform(0.3, 0.8):.2f}:{r.randint(1, 2)}",
    "hbm_slow": lambda r, n: f"hbm_slow:{r.uniform(0.2, 0.6):.2f}:{r.randint(1, 2)}",
    "throttle": lambda r, n: f"throttle:{r.uniform(0.0, 15.0):.1f}:{r.randint(1, 2)}",
    "ecc_error": lambda r, n: f"ecc_error:{r.randint(1, 2)}",
}
FAULT_KINDS = tuple(SIM_RULES)


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


def _draw_rule(rng: random.Random, rules: dict[str, Draw] | None = None) -> str:
    rules = SIM_RULES if rules is None else rules
    kind = rng.choice(tuple(rules))
    item = rules[kind](rng, rng.randint(1, 3))
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


def chaos_spec(*, api_url: str, evidence_dir: Path, steps: list[Step], max_minutes: float, boot_retries: int,
               proof_interval_s: float, max_usd: float | None = None, state_dir: Path | None = None,
               command: CommandJob | None = None) -> RunSpec:
    """The smoke profile with the scenario's steps and every clock scaled down (also built by `child`), or
    `vast-e2e run`'s profile for `command` (its workdir, setup and key file, resolved in its environment). The
    ledger and registrations go to `state_dir` (default: the evidence dir, so each scenario has its own)."""
    options = RunOptions(profile=None if command else "smoke", sim=True, evidence_dir=evidence_dir,
                         state_dir=state_dir or evidence_dir, max_usd=max_usd, proof_interval_s=proof_interval_s,
                         poll_s=0.05, boot_retries=boot_retries, max_minutes=max_minutes,
                         dry_run=True)  # the run itself checks its evidence dir (disk kinds)
    if command is not None:
        options = options.model_copy(update={"command": command.command, "workdir": command.workdir,
                                              "setup": command.setup, "key_file": command.key_file})
    base = resolve(options, environ=command.environ if command else {})
    profile = base.profile.model_copy(update={"steps": base.profile.steps if command else steps,
                                              "boot_timeout_s": BOOT_TIMEOUT_S})
    return base.model_copy(update={"profile": profile, "api_url": api_url, "api_key": SecretStr(KEY),
                                   "dry_run": False}).with_timings(
        # The simulated host answers its receipt at once: no least budget or grace of seconds, so a time cap of a
        # few seconds (cap_mode "time") still reaches boot and the steps rather than being refused as too short
        teardown_margin_s=TEARDOWN_MARGIN_S, receipt_min_s=0.0, receipt_grace_s=0.0)


def quote_cap_usd(spec: RunSpec, sim: SimServer, usd_factor: float) -> float:
    """A cost cap at `usd_factor` x the worst case of the offer the run will choose, quoted fault-free
    against the simulator itself (which is reset afterwards)."""
    with _client(sim.url) as client:
        worst_usd = plan_run(spec, client, load_driver_policy(), build_bundle()).chosen.quote.worst_case_usd
    sim.reset()
    return worst_usd * usd_factor


def build_spec(plan: ScenarioPlan, sim: SimServer, evidence_dir: Path) -> RunSpec:
    steps = [Step(name=f"chaos-{i}", run=f"echo chaos step {i}; sleep {plan.step_sleep_s}"
                  + (f"; exit {plan.step_rc}" if i == plan.steps - 1 and plan.step_rc else ""),
                  timeout_s=30) for i in range(plan.steps)]
    spec = chaos_spec(api_url=sim.url, evidence_dir=evidence_dir, steps=steps, max_minutes=plan.max_minutes,
                      boot_retries=plan.boot_retries, proof_interval_s=plan.proof_interval_s)
    if plan.usd_factor is None:
        return spec
    max_usd = quote_cap_usd(spec, sim, plan.usd_factor)
    return spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": max_usd})})


def run_scenario(plan: ScenarioPlan, workdir: Path) -> ScenarioOutcome:
    """One guarded run under `plan`'s faults, then every check. Never raises for a harness failure."""
    outcome = ScenarioOutcome(seed=plan.seed, plan=plan)
    buf = io.StringIO()
    started = now_s()
    with SimServer(seed=plan.seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim:
        spec = build_spec(plan, sim, workdir / "ev")
        outcome.max_usd = spec.caps.max_usd
        decoy = rent_decoy(sim.url, plan.seed) if "wrong_contract" in plan.fault_kinds else None
        sim.set_faults(plan.faults)
        run: GuardedRun | None = None
        start_unix = time.time()
        try:
            with _client(sim.url) as client:
                run = GuardedRun(spec, client, load_driver_policy(), _output(buf))
                run.state.teardown_budget_s = TEARDOWN_BUDGET_S
                stuck_exits: list[int] = []  # in-process, the stuck-run watch must not end the suite's process
                run.tools.stuck.exit_process = stuck_exits.append
                result = run.execute()
                if stuck_exits:
                    outcome.violations.append(Violation(kind="hang", detail=f"the stuck-run watch ended the run "
                                                        f"(exit {stuck_exits[0]}): its main thread did not come back"))
            outcome.exit_code, outcome.message = result.exit_code, result.message
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported with the rest
            where = traceback.format_exc(limit=-4)[-1500:]
            outcome.violations.append(classify(Violation(kind="crash",
                                                         detail=f"{type(exc).__name__}: {exc}\n{where}")))
        state = sim.state()
        if decoy is not None:  # the decoy is the user's: judged apart, never counted as the run's
            outcome.violations += decoy_violations(state, decoy)
            state = {**state, "instances": [i for i in state["instances"] if i["id"] != decoy]}
        outcome.faults_fired = _fired(state)
        if run is not None:  # the cap counts from the run's own clock (RunState.t0_unix), not from before it
            start_unix = run.state.t0_unix
        outcome.violations += check_scenario(plan, spec, outcome, state, run, start_unix)
        if outcome.exit_code == 3:
            outcome.violations += _reap_and_check(spec, sim, buf, decoy)
    outcome.wall_s = round(now_s() - started, 3)
    outcome.log = buf.getvalue()[-6000:]
    return outcome


def _fired(state: dict[str, Any]) -> dict[str, int]:
    fired: Counter[str] = Counter()
    for rule in state["faults"]["rules"]:
        fired[rule["kind"]] += rule["fired"]
    return {k: v for k, v in fired.items() if v}


def _reap_and_check(spec: RunSpec, sim: SimServer, buf: io.StringIO, decoy: int | None = None) -> list[Violation]:
    sim.set_faults(None)
    with _client(sim.url) as client:
        code = reap_all(spec, client, _output(buf))
    after = sim.state()
    live = [i["id"] for i in after["instances"] if i["live"] and i["id"] != decoy]
    if decoy is not None and decoy_violations(after, decoy):
        return [v.model_copy(update={"detail": f"reap: {v.detail}"}) for v in decoy_violations(after, decoy)]
    pending, unknown_labels = Ledger(spec.state_dir / LEDGER_FILE).unproven()
    # Exit 3 with nothing live and nothing unproven but a create whose outcome no read has shown (a 5xx that
    # created nothing) is the truth: reap keeps looking for that label until long after its create.
    honest_unknown = code == 3 and not live and not pending and bool(unknown_labels)
    if live or (code != 0 and not honest_unknown):
        return [Violation(kind="reap_failed", detail=f"reap exited {code}; live after reap: {live}")]
    return []


def check_scenario(plan: ScenarioPlan, spec: RunSpec, outcome: ScenarioOutcome, state: dict[str, Any],
                   run: GuardedRun | None, start_unix: float) -> list[Violation]:
    """The invariants, judged from the simulator's record (`state`) and what the run left on disk."""
    instances = state["instances"]
    outcome.instances = len(instances)
    outcome.billed_usd = sum(i["billed_usd"] for i in instances)
    ledger = Ledger(spec.state_dir / LEDGER_FILE)
    pending, unknown_labels = ledger.unproven()
    live = [i for i in instances if i["live"]]
    found: list[Violation] = []
    for inst in live:
        named = inst["id"] in pending or inst["label"] in unknown_labels
        if outcome.exit_code not in (3, None) or not named:  # None: a crash, reported as such
            found.append(Violation(kind="leak", detail=f"instance {inst['id']} live at the end (exit "
                                   f"{outcome.exit_code}, named by the ledger: {named})"))
    found += false_absences(instances, spec.evidence_dir)
    found += sim_bugs(state)
    found += gpu_liar_violations(instances, outcome.exit_code)
    found += receipt_violations(instances, outcome.exit_code, spec.profile.receipt, run.ev.dir if run else None)
    # An instance left live (exit 3 says "may still bill", or a crash) bills on: the caps cannot be judged then.
    if not (outcome.exit_code in (3, None) and live):
        found += cap_violations(instances, state["now"], start_unix, spec.caps.max_usd, spec.max_seconds,
                                spec.evidence_dir)
    found += [Violation(kind="exit_mismatch", detail=d) for d in exit_mismatches(plan, outcome, run)]
    found += under_reports(outcome, run, live)
    return [classify(v) for v in found]


def under_reports(outcome: ScenarioOutcome, run: GuardedRun | None, live: list[dict[str, Any]]) -> list[Violation]:
    """The accrued figure a run reports is an upper bound of the bill: less than the simulator billed (10%
    slack for the two clocks) is a broken promise. A run that left an instance live bills on, unjudged."""
    if run is None or live or outcome.exit_code is None:
        return []
    reported = run.meter.accrued_usd()
    if reported >= 0.9 * outcome.billed_usd:
        return []
    changed = sorted(k for k in outcome.faults_fired if k in PRICE_FAULTS)
    why = f" (the price changed under the run: {', '.join(changed)})" if changed else ""
    return [Violation(kind="under_reported", detail=f"the run reported ${reported:.6f} accrued, the simulator "
                      f"billed ${outcome.billed_usd:.6f}{why}")]


PRICE_FAULTS = ("reprice_silent", "reprice_offer")  # the contract's or the offer's price raised under the run


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
    if code in (0, 4) and outcome.max_usd is not None and outcome.billed_usd > outcome.max_usd:
        why.append(f"exit {code} with ${outcome.billed_usd:.6f} billed over the ${outcome.max_usd:.6f} cap")
    if code == 5 and outcome.instances:
        why.append(f"exit 5 (nothing rented) but the simulator has {outcome.instances} instance(s)")
    if code == 1 and run and run.created and "before the deadline" in outcome.message \
            and run.created[-1].t_created_mono + BOOT_TIMEOUT_S > run.meter.work_deadline():
        why.append(f"exit 1 though the cap deadline cut the boot (expected 6): {outcome.message[:200]}")
    if code == 6 and plan.cap_mode not in ("time", "cost"):
        why.append("exit 6 with generous caps")
    if plan.cap_mode == "unrentable" and code != 5:
        why.append(f"cap below every offer's worst case, yet exit {code} (expected 5)")
    if code == 3 and run and all(t.verdict == "gone" for t in run.teardowns) and not run.book.unresolved:
        why.append("exit 3 though every teardown was proven and every create resolved")
    if code != 3 and run and any(t.verdict != "gone" for t in run.teardowns):
        why.append(f"exit {code} though a teardown was not proven")
    if plan.fault_kinds == set() and plan.cap_mode == "generous" and not plan.step_rc and code not in (0, 4):
        why.append(f"fault-free run with generous caps exited {code}: {outcome.message}")
    return why




DECOY_LABELS = ("prod-database", None, "vh-20261203T000000Z-0d0c0e-dzzzzzz-c2rs")  # the user's; unlabelled; another run's


def rent_decoy(url: str, seed: int, label: str | None | Literal[False] = False) -> int:
    """An instance of the account that is not the run's, on the dearest offer (never the one a run picks):
    labelled by the seed from DECOY_LABELS unless `label` is given (None: no label, as made in the console)."""
    chosen = DECOY_LABELS[seed % len(DECOY_LABELS)] if label is False else label
    with _client(url) as client:
        offer = max(client.search_offers({"limit": 1000}), key=lambda o: o.dph_total or 0.0)
        body: dict[str, Any] = {"image": "img", "disk": 10} | ({"label": chosen} if chosen is not None else {})
        return client.create_instance(offer.id, body).new_contract


def decoy_violations(state: dict[str, Any], decoy: int) -> list[Violation]:
    """The decoy deleted (a DELETE on its id, or gone other than by Vast's own hand: a `negative_balance` fault
    ends every instance of the account, the decoy's included): something not the run's taken for the run's."""
    deletes = [c for c in state["calls"] if c["method"] == "DELETE" and f"/{decoy}/" in f"{c['path']}/"]
    row = next((i for i in state["instances"] if i["id"] == decoy), None)
    if deletes or row is None or (not row["live"] and row.get("destroyed_by") != "vast"):
        return [Violation(kind="not_ours", detail=f"the decoy instance {decoy} ({row and row['label']!r}), not the "
                          f"run's, was deleted: {len(deletes)} DELETE(s), live {row and row['live']}")]
    return []


class CommandJob(BaseModel):
    """`vast-e2e run -- CMD` as a child runs it (chaos/upload.py): the command, its workdir and setup, the key file
    given (with the simulator's clocks the key is not read, but it is never uploaded), and the environment the
    spec is resolved in (HOME and XDG_CONFIG_HOME: where the official CLI's key file and the config are)."""

    command: list[str]
    workdir: str
    setup: list[str] | None = None
    key_file: str | None = None
    environ: dict[str, str] = {}


class ChildJob(BaseModel):
    """What `child` runs: a guarded run in its own process (the network scenarios)."""

    api_url: str
    evidence_dir: Path
    steps: list[Step]
    max_minutes: float
    max_usd: float | None
    boot_retries: int
    proof_interval_s: float
    teardown_budget_s: float = TEARDOWN_BUDGET_S
    t0_file: Path  # the run's start (unix seconds) is written here: the time cap counts from it
    state_dir: Path | None = None  # the user's state dir (default: the evidence dir)
    wall_step_s: float = 0.0  # the wall clock (time.time) steps by this much right after the first create
    # A simulated suspend (chaos/trust.py): the process is SIGSTOPped, and on SIGCONT it reads from this file the
    # seconds it was stopped and sets time.monotonic back by them (CLOCK_MONOTONIC does not count a suspend).
    suspend_file: Path | None = None
    suspend_blind: bool = False  # the negative control: the run's own clock (now_s) stops in the suspend too
    command: CommandJob | None = None  # `vast-e2e run -- CMD` instead of the smoke profile with `steps`


def run_bounded(plan: ScenarioPlan, limit_s: float = SCENARIO_WALL_LIMIT_S) -> ScenarioOutcome:
    """`run_scenario` in its own thread; past `limit_s` it is reported as a hang and left behind (daemon)."""
    quiet_paramiko()
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


def quiet_paramiko() -> None:
    """Dropped connections are the point here; paramiko's transport threads would print each to stderr."""
    logger = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
