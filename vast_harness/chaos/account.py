"""Account scenarios: several runs, reaps, state directories and clocks on one simulated account.

Each kind is the way issue 20 found a promise broken when more than one run shares an account:

* ``two_runs_reap``   two runs (own processes, own state dirs) in a step, and `reap` from a third directory
                      with the first run's state dir, the second's, or a fresh one: both runs exit 0, the
                      reap exits 0, no instance of a live run is deleted by it (a run that loses its host
                      exits 1).
* ``clock_ahead``     the run's wall clock steps +2 h right after a create whose reads lag: no false absence
                      (the run exits 3, the ledger names it), a reap with the same stepped clock does not call
                      it gone either; once the lag is over a plain reap proves it gone.
* ``clock_behind``    the wall clock steps -2 h after create, no lag: the run still passes (exit 0).
* ``boot_fail_delete_fail``  the host fails to boot and every DELETE fails: exactly one instance is ever
                      created (no next offer while the first is unproven), exit 3; reap cleans up.
* ``fleet_reprice``   a three-run fleet whose contracts are re-priced 50x mid-step (``reprice_silent``, what
                      Vast's docs say cannot happen: the defence) and cancelled at its total cap: every run
                      exits 6 (never 0), and the accrual it reports is at least what the simulator billed
                      up to each DELETE (no run hides the new price).

The judge is the simulator's record (`/_sim/state`), as for every chaos family.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr
from rich.console import Console

from vast_harness.chaos.engine import KEY, SCALE, ChildJob, _client, chaos_spec, quiet_paramiko
from vast_harness.chaos.judge import Violation, classify, false_absences, sim_bugs, traceback_violations
from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.resources import data_root
from vast_harness.sim.server import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.state.ledger import LEDGER_FILE, Ledger

AccountKind = Literal["two_runs_reap", "clock_ahead", "clock_behind", "boot_fail_delete_fail", "fleet_reprice",
                      "suspend", "date_skew", "decoy", "registration_tamper", "credentials_in_workdir",
                      "daemon_command", "secret_artifact"]
ACCOUNT_KINDS: tuple[AccountKind, ...] = ("two_runs_reap", "clock_ahead", "two_runs_reap", "boot_fail_delete_fail",
                                          "clock_behind", "fleet_reprice",
                                          # issue 35's families (chaos/trust.py)
                                          "suspend", "date_skew", "decoy", "registration_tamper",
                                          # issue 43's (chaos/upload.py, chaos/artifacts.py)
                                          "credentials_in_workdir", "daemon_command", "secret_artifact")
CHILD_LIMIT_S = 120.0
STEP_S = 2.5
# Past all the run waits for a row it cannot read (its 3 s boot timeout, the failed boot's wait for the label, its
# teardown's look and the label sweep, each bounded by its 4 s budget: about 12 s): the run cannot see its instance
READ_LAG_S = 24.0
CLOCK_STEP_S = 7200.0


class AccountPlan(BaseModel):
    seed: int
    kind: AccountKind
    reap_state: Literal["first", "second", "fresh"] = "fresh"  # two_runs_reap: whose state dir the reap uses
    variant: str = ""  # the trust kinds' (chaos/trust.py TRUST_VARIANTS): where, how or what


class AccountOutcome(BaseModel):
    seed: int
    plan: AccountPlan
    exit_codes: list[int | None] = Field(default_factory=list)  # the runs'
    reap_codes: list[int] = Field(default_factory=list)
    instances: int = 0
    billed_usd: float = 0.0
    reported_usd: float | None = None
    wall_s: float = 0.0
    violations: list[Violation] = Field(default_factory=list)
    log: str = ""

    @property
    def exit_code(self) -> int | None:
        return max((c for c in self.exit_codes if c is not None), default=None)

    def summary(self) -> str:
        flags = ",".join(v.kind for v in self.violations) or "ok"
        return f"{self.plan.kind}{f' {self.plan.variant}' if self.plan.variant else ''}: runs {self.exit_codes}, reaps {self.reap_codes}, {self.instances} instance(s); {flags}"


# Kinds another module runs with this one's processes (chaos/trust.py adds issue 35's, chaos/upload.py and chaos/artifacts.py issue 43's:
# each imports this module, so it registers them here rather than being imported), and the variants a kind cycles
# through with the seed.
MORE_KINDS: dict[str, Callable[[AccountPlan, SimServer, Path, AccountOutcome], None]] = {}
VARIANTS: dict[str, tuple[str, ...]] = {
    "suspend": ("step", "boot", "teardown", "short", "deadman"),
    "date_skew": ("behind", "ahead", "flip", "reap_ahead"),
    "decoy": ("prod-database", "unlabelled", "other_run"),
    "registration_tamper": ("replace", "move_back", "delete", "symlink", "garbage"),
    "secret_artifact": ("zip", "raw", "account_key"),
}


def draw_variant(kind: str, seed: int) -> str:
    """A kind's variant: it cycles with the seed's round through ACCOUNT_KINDS, so a suite covers them all."""
    variants = VARIANTS.get(kind, ("",))
    return variants[(seed // len(ACCOUNT_KINDS)) % len(variants)]


def draw_account(seed: int) -> AccountPlan:
    """The kind cycles with the seed (a suite's consecutive seeds cover every kind); the rest is drawn."""
    rng = random.Random(seed)
    kind = ACCOUNT_KINDS[seed % len(ACCOUNT_KINDS)]
    return AccountPlan(seed=seed, kind=kind, reap_state=rng.choice(("first", "second", "fresh")),
                       variant=draw_variant(kind, seed))


# ------------------------------------------------------------------------------------------ processes
def _child_job(work: Path, name: str, url: str, *, steps: list[Step], state: Path, boot_retries: int = 0,
               wall_step_s: float = 0.0) -> Path:
    job = ChildJob(api_url=url, evidence_dir=state, state_dir=state, steps=steps, max_minutes=1.0, max_usd=None,
                   boot_retries=boot_retries, proof_interval_s=0.1, t0_file=work / f"{name}.t0",
                   wall_step_s=wall_step_s)
    path = work / f"{name}.json"
    path.write_text(job.model_dump_json())
    return path


def _spawn_run(job: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "vast_harness.chaos.child", str(job)], cwd=data_root(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _reap(url: str, state: Path, cwd: Path, *, wall_step_s: float = 0.0) -> tuple[int, str]:
    """The real `vast-e2e reap` from `cwd` with `state` as the user's state dir (no --evidence-dir)."""
    cwd.mkdir(parents=True, exist_ok=True)
    step = ["--wall-step", str(wall_step_s)] if wall_step_s else []
    cmd = [sys.executable, "-m", "vast_harness.chaos.child", "--cli", *step, "--", "reap", "--api-url", url,
           "--pacing-scale", str(SCALE), "--proof-interval", "0.1"]
    env = dict(os.environ, VAST_API_KEY=KEY, VAST_HARNESS_HOME=str(state), PYTHONPATH=str(data_root()))
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=CHILD_LIMIT_S, check=False)
    return p.returncode, p.stdout + p.stderr


def _recorded_reap(outcome: AccountOutcome, url: str, state: Path, work: Path, log_name: str, *,
                   wall_step_s: float = 0.0) -> tuple[int, str]:
    """A reap from another directory, its output kept as `log_name` and its exit code in the outcome."""
    code, text = _reap(url, state, work / "elsewhere", wall_step_s=wall_step_s)
    (work / log_name).write_text(text)
    outcome.reap_codes.append(code)
    return code, text


def _wait(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(timeout=CHILD_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _wait_for(pred: Any, limit_s: float) -> bool:
    end = now_s() + limit_s
    while now_s() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _seen(state: Path) -> bool:
    return any(e.event == "seen" for e in Ledger(state / LEDGER_FILE).entries())


# ------------------------------------------------------------------------------------------ scenarios
def run_account(plan: AccountPlan) -> AccountOutcome:
    quiet_paramiko()
    outcome = AccountOutcome(seed=plan.seed, plan=plan)
    started = now_s()
    with tempfile.TemporaryDirectory(prefix=f"vh-account-{plan.seed}-") as tmp, \
            SimServer(seed=plan.seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim:
        work = Path(tmp)
        try:
            {"two_runs_reap": _two_runs_reap, "clock_ahead": _clock_ahead, "clock_behind": _clock_behind,
             "boot_fail_delete_fail": _boot_fail_delete_fail, "fleet_reprice": _fleet_reprice,
             **MORE_KINDS}[plan.kind](plan, sim, work, outcome)
        except Exception as exc:  # noqa: BLE001 - the engine's own failure, reported, not raised
            outcome.violations.append(Violation(kind="crash", detail=f"account engine: {type(exc).__name__}: {exc}"))
        state = sim.state()
        outcome.instances = len(state["instances"])
        outcome.billed_usd = sum(i["billed_usd"] for i in state["instances"])
        outcome.violations += [Violation(kind="leak", detail=f"instance {i['id']} ({i['label']}) live at the end")
                               for i in state["instances"] if i["live"]]
        # claims made after a step carry the stepped clock (clock_ahead judges its stepped claims itself,
        # before the final reap, whose claims carry the true time)
        offset = -CLOCK_STEP_S if plan.kind == "clock_behind" else 0.0
        for sub in work.glob("state-*"):
            outcome.violations += false_absences(state["instances"], sub, wall_offset_s=offset)
        outcome.violations += sim_bugs(state)
        for log in work.glob("*.log"):
            text = log.read_text(errors="replace")
            outcome.violations += traceback_violations(text, log.name)
            outcome.log += f"--- {log.name}\n{text[-1500:]}\n"
    outcome.violations = [classify(v) for v in outcome.violations]
    outcome.wall_s = round(now_s() - started, 2)
    return outcome


def _mismatch(outcome: AccountOutcome, detail: str) -> None:
    outcome.violations.append(Violation(kind="exit_mismatch", detail=detail))


def _two_runs_reap(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    steps = [Step(name="long", run=f"echo working; sleep {STEP_S}", timeout_s=30)]
    states = [work / "state-a", work / "state-b"]
    runs = [_spawn_run(_child_job(work, n, sim.url, steps=steps, state=s), work / f"{n}.log")
            for n, s in zip(("a", "b"), states, strict=True)]
    both_up = _wait_for(lambda: all(_seen(s) for s in states), 30.0)
    reap_state = {"first": states[0], "second": states[1], "fresh": work / "state-fresh"}[plan.reap_state]
    code, text = _recorded_reap(outcome, sim.url, reap_state, work, "reap.log")  # while both are in their step
    outcome.exit_codes = [_wait(p) for p in runs]
    if not both_up:
        _mismatch(outcome, "the runs never both reached their step: nothing tested")
    if outcome.exit_codes != [0, 0]:
        _mismatch(outcome, f"a reap from another directory ({plan.reap_state} state dir) during two live runs: "
                  f"runs exited {outcome.exit_codes} (a live run's host deleted?)")
    if code != 0:
        _mismatch(outcome, f"reap exited {code} with only live runs on the account: {text[-600:]}")


def _clock_ahead(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    sim.set_faults(f"read_lag:{READ_LAG_S}:1")
    state = work / "state-a"
    steps = [Step(name="quick", run="echo hi", timeout_s=30)]
    run = _spawn_run(_child_job(work, "a", sim.url, steps=steps, state=state, wall_step_s=CLOCK_STEP_S),
                     work / "a.log")
    t_spawn = now_s()
    outcome.exit_codes = [_wait(run)]
    # the same stepped machine
    code, text = _recorded_reap(outcome, sim.url, state, work, "reap-stepped.log", wall_step_s=CLOCK_STEP_S)
    live = [i for i in sim.state()["instances"] if i["live"]]
    if outcome.exit_codes != [3]:
        _mismatch(outcome, f"+2 h clock step after a lagging create: run exited {outcome.exit_codes}, expected 3 "
                  "(its instance unseen, not proven gone)")
    if live and code == 0:
        _mismatch(outcome, f"a reap with the clock stepped +2 h said all proven absent while {len(live)} instance(s) "
                  "were live")
    outcome.violations += false_absences(sim.state()["instances"], state, wall_offset_s=CLOCK_STEP_S)
    pending, _ = Ledger(state / LEDGER_FILE).unproven()
    if live and not {i["id"] for i in live} <= set(pending):
        _mismatch(outcome, "a live instance the ledger does not name after the clock step")
    time.sleep(max(0.0, READ_LAG_S + 1.0 - (now_s() - t_spawn)))  # the lag is over: reads see it
    code, text = _recorded_reap(outcome, sim.url, state, work, "reap-after.log")
    if code != 0:
        _mismatch(outcome, f"reap after the read lag exited {code}: {text[-600:]}")


def _clock_behind(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    state = work / "state-a"
    steps = [Step(name="quick", run="echo hi; sleep 0.5", timeout_s=30)]
    run = _spawn_run(_child_job(work, "a", sim.url, steps=steps, state=state, wall_step_s=-CLOCK_STEP_S),
                     work / "a.log")
    outcome.exit_codes = [_wait(run)]
    if outcome.exit_codes != [0]:
        _mismatch(outcome, f"-2 h clock step after create, no fault: run exited {outcome.exit_codes}, expected 0")


def _boot_fail_delete_fail(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    sim.set_faults("oci_fail:1;delete_fail:*:503")
    state = work / "state-a"
    steps = [Step(name="quick", run="echo hi", timeout_s=30)]
    run = _spawn_run(_child_job(work, "a", sim.url, steps=steps, state=state, boot_retries=2), work / "a.log")
    outcome.exit_codes = [_wait(run)]
    created = len(sim.state()["instances"])
    if created != 1:
        _mismatch(outcome, f"a failed boot whose DELETE fails: {created} instances created (expected exactly 1)")
    if outcome.exit_codes != [3]:
        _mismatch(outcome, f"a failed boot whose DELETE fails: run exited {outcome.exit_codes}, expected 3")
    sim.set_faults(None)
    code, text = _recorded_reap(outcome, sim.url, state, work, "reap.log")
    if code != 0:
        _mismatch(outcome, f"reap of the unproven host exited {code}: {text[-600:]}")


def _fleet_reprice(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    from vast_harness.fleet.run import run_fleet

    state = work / "state-a"
    steps = [Step(name="long", run="echo working; sleep 8", timeout_s=30)]
    base = chaos_spec(api_url=sim.url, evidence_dir=state, steps=steps, max_minutes=1.0, boot_retries=0,
                      proof_interval_s=0.1).model_copy(update={"api_key": SecretStr(KEY)})
    per_run = 1.0
    with _client(sim.url) as probe:  # a total cap a little above three runs' first seconds
        offers = probe.search_offers({"limit": 1000})
        dph = sorted(o.dph_total or 0.0 for o in offers[:64])
    # The three GPU types this seed's market offers most (a fixed list once drew a market without one of
    # them: the fleet refused before renting and nothing was tested).
    counts = Counter(o.gpu_name for o in offers if o.gpu_name and o.num_gpus == base.filters.num_gpus)
    gpus = sorted(name for name, _ in counts.most_common(3))
    total = max(1e-4, 3 * (dph[len(dph) // 2] if dph else 0.5) * 6.0 / 3600.0)
    sim.set_faults("reprice_silent:50:1.5:3")  # the contract's own price: the defence (docs/vast-behaviours.md)
    out = Output(json_mode=True, quiet=True)
    sink = io.StringIO()  # the fleet's JSON and tables are not this suite's output
    out.out = out.err = Console(file=sink)
    out.stdout.write = sink.write  # type: ignore[method-assign,assignment]
    with _client(sim.url) as client:
        code = run_fleet(base, gpus, client, load_driver_policy(), out, total_usd=total, per_run_usd=per_run,
                         parallel=3, allow_overcommit=True)
    outcome.exit_codes = [int(code)]
    result = next(state.glob("fleet-*/fleet-result.json"), None)
    doc = json.loads(result.read_text()) if result else {}
    outcome.reported_usd = doc.get("accrued_usd")
    after = sim.state()
    billed = sum(i["billed_usd"] for i in after["instances"])
    if not sum(r["fired"] for r in after["faults"]["rules"] if r["kind"] == "reprice_silent"):
        _mismatch(outcome, "the re-price never fired: nothing tested")
    if code == 0:
        _mismatch(outcome, "a fleet re-priced 50x past its total cap exited 0")
    if outcome.reported_usd is None or outcome.reported_usd < 0.9 * billed:
        _mismatch(outcome, f"the fleet reported ${outcome.reported_usd} accrued while the simulator billed "
                  f"${billed:.6f}: a cancelled run did not read its final price")
