"""Trust scenarios (issue 35): what a laptop, a wrong clock and a shared account break, as account kinds.

Each is one `AccountPlan` kind (`account.py` runs it; its variant cycles with the seed), judged by the simulator's
record (`/_sim/state`) like every chaos family:

* ``suspend``       the run (its own process) is SIGSTOPped and resumed as a suspended laptop is: on SIGCONT its
                    `time.monotonic` loses the stopped seconds, its CLOCK_BOOTTIME and wall clock do not, and the
                    host, the API and the bill ran on. In the step or the boot wait, past the cap: exit 6 (never
                    0), the instance destroyed within `RESUME_DELETE_S` of the resume, and the accrued dollars the
                    run reports at least what was billed; the same when the sleep outlasts the host's dead-man
                    grace and the host deletes itself (`deadman`). A short suspend under the cap, or one in the
                    teardown's proof, changes nothing: no leak, no false absence.
* ``date_skew``     the answers' `Date` is 2 h off for the run (behind, ahead, or flipping sign mid-run), and for a
                    reap from another state dir (another machine) during the run's step: the run passes (exit 0:
                    its host was not reaped), the reap exits 0, a reap afterwards proves everything gone.
* ``decoy``         an instance of the account that is not the run's (labelled `prod-database`, unlabelled, or
                    `vh-` of another run whose cap is ahead) is named by the run's create answer
                    (`wrong_contract`), and afterwards a ledger line names it under the run's exact label: it is
                    never deleted (no DELETE on its id, by the run or the reap), and nothing of the run's leaks.
* ``registration_tamper``  while the run is in its step its registration file is replaced (new inode), moved
                    and copied back, deleted, made a symlink, or overwritten with garbage; a reap from another
                    directory with the same state dir follows: the run passes (exit 0), the reap exits 0, and
                    `status` shows the run's instance as running, not as an orphan.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vast_harness.chaos.account import (
    CHILD_LIMIT_S,
    MORE_KINDS,
    AccountOutcome,
    AccountPlan,
    _mismatch,
    _recorded_reap,
    _seen,
    _spawn_run,
    _wait,
    _wait_for,
)
from vast_harness.chaos.engine import KEY, SCALE, ChildJob, _client, decoy_violations, rent_decoy
from vast_harness.chaos.judge import Violation
from vast_harness.resources import data_root
from vast_harness.sim.server import SimServer
from vast_harness.spec.profile import Step
from vast_harness.state.ledger import LEDGER_FILE, Ledger
from vast_harness.state.registry import LIVE_DIR, make_label

SKEW_S = 7200.0
SUSPEND_CAP_S = 14.0  # the suspended run's time cap: its step fits with room, a long suspend does not
SUSPEND_LONG_S = 16.0  # past the cap from anywhere in the boot or the step
SUSPEND_SHORT_S = 2.0
SUSPEND_DEADMAN_S = 50.0  # past the cap and the host's dead-man grace (30 s on the simulator): the host deletes
RESUME_DELETE_S = 4.0  # a resumed run past its cap DELETEs at once: its instance is gone this soon after
GATED_STEP_MINUTES = 1.5  # a gated step's run: its cap bounds the step if the gate is never opened


def _gated_step(work: Path) -> Step:
    """A step that runs until the engine opens its gate (the simulator's hosts run on this machine): a reap or
    `status` of another process lands in it however slowly a loaded machine starts them."""
    gate = work / "gate-open"
    return Step(name="gated", run=f"echo working; while [ ! -e {gate} ]; do sleep 0.1; done", timeout_s=120)


def _open_gate(work: Path) -> None:
    (work / "gate-open").touch()


def _job(work: Path, name: str, url: str, *, steps: list[Step], state: Path, max_minutes: float = 1.0,
         suspend: bool = False, blind: bool = False) -> Path:
    job = ChildJob(api_url=url, evidence_dir=state, state_dir=state, steps=steps, max_minutes=max_minutes,
                   max_usd=None, boot_retries=0, proof_interval_s=0.1, t0_file=work / f"{name}.t0",
                   suspend_file=work / f"{name}.suspended" if suspend else None, suspend_blind=blind)
    path = work / f"{name}.json"
    path.write_text(job.model_dump_json())
    return path


def _events(state: Path, event: str) -> list[Any]:
    return [e for e in Ledger(state / LEDGER_FILE).entries() if e.event == event]


def _run_instances(sim: SimServer, state: Path) -> list[dict[str, Any]]:
    """The simulator's rows of the run's own instances (by the labels its ledger wrote)."""
    labels = {e.label for e in Ledger(state / LEDGER_FILE).entries()}
    return [i for i in sim.state()["instances"] if i["label"] in labels]


def _result(state: Path) -> dict[str, Any]:
    for path in state.glob("*/harness-result.json"):
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(path.read_text()))
    return {}


# ------------------------------------------------------------------------------------------ suspend
def run_suspend(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome, *,
                blind: bool = False) -> None:
    moment = plan.variant or "step"
    state = work / "state-a"
    if moment == "boot":
        sim.set_faults("scheduling:2.5")  # the boot wait lasts long enough to be suspended in
    steps = [Step(name="work", run="echo working; sleep 2", timeout_s=60)]
    proc = _spawn_run(_job(work, "a", sim.url, steps=steps, state=state, max_minutes=SUSPEND_CAP_S / 60.0,
                           suspend=True, blind=blind), work / "a.log")
    trigger = {"boot": "created", "teardown": "delete_ack"}.get(moment, "seen")
    delay_s = {"step": 0.8, "short": 0.8, "deadman": 0.8, "boot": 0.2}.get(moment, 0.0)
    suspend_s = {"short": SUSPEND_SHORT_S, "teardown": SUSPEND_SHORT_S, "deadman": SUSPEND_DEADMAN_S}.get(
        moment, SUSPEND_LONG_S)
    reached = _wait_for(lambda: bool(_events(state, trigger)) or proc.poll() is not None, 60.0)
    time.sleep(delay_s)
    t0_unix = float((work / "a.t0").read_text()) if (work / "a.t0").exists() else time.time()
    if not reached or proc.poll() is not None:
        _mismatch(outcome, f"suspend at {moment}: the run ended (or never reached {trigger}) first: nothing tested")
        outcome.exit_codes = [_wait(proc)]
        return
    t_stop = time.time()
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(suspend_s)
    (work / "a.suspended").write_text(repr(time.time() - t_stop))
    t_resume = time.time()
    os.kill(proc.pid, signal.SIGCONT)
    outcome.exit_codes = [_wait(proc)]
    outcome.log += f"suspend at {moment}: stopped {t_resume - t_stop:.1f} s, {t_stop - t0_unix:.1f} s into the run\n"
    code = outcome.exit_codes[0]
    ours = _run_instances(sim, state)
    crossed = moment in ("step", "boot", "deadman") and t_resume - t0_unix > SUSPEND_CAP_S
    if crossed:
        if code != 6:
            _mismatch(outcome, f"a suspend of {suspend_s:.0f} s in the {moment} crossed the {SUSPEND_CAP_S:.0f} s "
                      f"cap: run exited {code}, expected 6")
        for inst in ours:
            gone_at = inst["destroyed_at"]
            if gone_at is None or gone_at - max(t_resume, inst["created_at"]) > RESUME_DELETE_S:
                late = "still live" if gone_at is None else f"destroyed {gone_at - t_resume:.1f} s after the resume"
                outcome.violations.append(Violation(
                    kind="over_cap_time", detail=f"instance {inst['id']} resumed past its cap, {late} (bound "
                    f"{RESUME_DELETE_S:.0f} s)"))
    elif moment == "short" and code != 0:
        _mismatch(outcome, f"a {suspend_s:.0f} s suspend well under the cap: run exited {code}, expected 0")
    billed = sum(i["billed_usd"] for i in ours)
    reported = _result(state).get("accrued_usd")
    outcome.reported_usd = reported
    if ours and moment != "teardown" and (not isinstance(reported, (int, float)) or reported < 0.9 * billed):
        outcome.violations.append(Violation(
            kind="under_reported", detail=f"suspend at {moment}: the run reported ${reported} accrued, the "
            f"simulator billed ${billed:.6f}"))


# ------------------------------------------------------------------------------------------ Date skew
def run_date_skew(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "behind"
    run_faults = {"behind": f"date_behind:{SKEW_S:g}", "ahead": f"date_ahead:{SKEW_S:g}",
                  "flip": f"date_ahead:{SKEW_S:g}:6;date_behind:{SKEW_S:g}", "reap_ahead": ""}[variant]
    reap_faults = {"flip": f"date_behind:{SKEW_S:g}", "reap_ahead": f"date_ahead:{SKEW_S:g}"}.get(variant, "")
    sim.set_faults(run_faults or None)
    state = work / "state-a"
    proc = _spawn_run(_job(work, "a", sim.url, steps=[_gated_step(work)], state=state,
                           max_minutes=GATED_STEP_MINUTES), work / "a.log")
    up = _wait_for(lambda: _seen(state) or proc.poll() is not None, 40.0)
    sim.set_faults(reap_faults or None)
    code, text = _recorded_reap(outcome, sim.url, work / "state-other", work, "reap-other.log")
    _open_gate(work)
    outcome.exit_codes = [_wait(proc)]
    sim.set_faults(None)
    if not up or not _events(state, "seen"):
        _mismatch(outcome, f"date skew {variant}: the run never reached its step: nothing tested")
    if outcome.exit_codes != [0]:
        _mismatch(outcome, f"date skew {variant}: the run exited {outcome.exit_codes} after another machine's reap "
                  "in its step (expected 0: a live run is not an orphan)")
    if code != 0:
        _mismatch(outcome, f"date skew {variant}: another machine's reap during a live run exited {code}: "
                  f"{text[-600:]}")
    code, text = _recorded_reap(outcome, sim.url, work / "state-after", work, "reap-after.log")
    if code != 0:
        _mismatch(outcome, f"date skew {variant}: a reap after the run exited {code}: {text[-600:]}")


# ------------------------------------------------------------------------------------------ decoy
def run_decoy(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "prod-database"
    label = {"prod-database": "prod-database", "unlabelled": None,
             "other_run": make_label("20261203T000000Z-0d0c0e", 0, time.time() + 3600, left_s=3600)}[variant]
    decoy = rent_decoy(sim.url, plan.seed, label)
    sim.set_faults("wrong_contract")
    state = work / "state-a"
    proc = _spawn_run(_job(work, "a", sim.url, steps=[Step(name="quick", run="echo hi", timeout_s=30)],
                           state=state), work / "a.log")
    outcome.exit_codes = [_wait(proc)]
    sim.set_faults(None)
    mine = {e.label for e in Ledger(state / LEDGER_FILE).entries()}
    if mine:  # a ledger line naming the decoy under the run's exact label (forged, or a create answer's)
        Ledger(state / LEDGER_FILE).append("20261203T000000Z-f0f0f0", "created", sorted(mine)[0], offer_id=1,
                                           instance_id=decoy)
    _recorded_reap(outcome, sim.url, state, work, "reap.log")
    outcome.violations += decoy_violations(sim.state(), decoy)
    if any(e.instance_id == decoy for e in _events(state, "delete_ack")):
        outcome.violations.append(Violation(kind="not_ours", detail=f"the ledger records a DELETE of the decoy {decoy}"))
    with _client(sim.url) as client:  # the decoy is the user's: the test's own cleanup, not the harness's
        client.destroy_instance(decoy)


# ------------------------------------------------------------------------------------------ registration tamper
def _tamper(path: Path, variant: str, work: Path) -> None:
    content = path.read_bytes()
    if variant == "replace":  # an editor's save: the same bytes on a new inode that no process locks
        tmp = path.with_suffix(".new")
        tmp.write_bytes(content)
        tmp.replace(path)
    elif variant == "move_back":
        shutil.move(path, work / "moved.json")
        shutil.copy(work / "moved.json", path)
    elif variant == "delete":
        path.unlink()
    elif variant == "symlink":
        (work / "copy.json").write_bytes(content)
        path.unlink()
        path.symlink_to(work / "copy.json")
    elif variant == "garbage":  # a backup tool's half-copy: not a registration any more
        tmp = path.with_suffix(".new")
        tmp.write_bytes(content[: len(content) // 3])
        tmp.replace(path)


def _start_status(url: str, state: Path, cwd: Path) -> subprocess.Popen[str]:
    """`vast-e2e status --json` with `state` as the user's state dir, started now."""
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "vast_harness.chaos.child", "--cli", "--", "status", "--api-url", url, "--json",
           "--pacing-scale", str(SCALE)]
    env = dict(os.environ, VAST_API_KEY=KEY, VAST_HARNESS_HOME=str(state), PYTHONPATH=str(data_root()))
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _status_doc(proc: subprocess.Popen[str]) -> tuple[int | None, dict[str, Any], str]:
    try:
        out, err = proc.communicate(timeout=CHILD_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {}
    return proc.returncode, doc if isinstance(doc, dict) else {}, out + err


def run_registration_tamper(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "replace"
    state = work / "state-a"
    proc = _spawn_run(_job(work, "a", sim.url, steps=[_gated_step(work)], state=state,
                           max_minutes=GATED_STEP_MINUTES), work / "a.log")
    up = _wait_for(lambda: _seen(state) or proc.poll() is not None, 40.0)
    regs = list((state / LIVE_DIR).glob("*.json"))
    if not up or proc.poll() is not None or len(regs) != 1:
        _open_gate(work)
        outcome.exit_codes = [_wait(proc)]
        _mismatch(outcome, f"registration {variant}: the run never reached its step with one registration: "
                  "nothing tested")
        return
    _tamper(regs[0], variant, work)
    run_id = regs[0].name[: -len(".json")]
    status = _start_status(sim.url, state, work / "elsewhere")  # read-only: alongside the reap, in the step
    t_tamper = time.time()
    code, text = _recorded_reap(outcome, sim.url, state, work, "reap.log")
    status_rc, doc, status_text = _status_doc(status)
    _open_gate(work)
    outcome.log += f"registration {variant}: reap and status done {time.time() - t_tamper:.1f} s after the tamper\n"
    (work / "status.log").write_text(status_text)
    outcome.exit_codes = [_wait(proc)]
    if outcome.exit_codes != [0]:
        _mismatch(outcome, f"registration {variant} in the step, then a reap on the same machine: the run exited "
                  f"{outcome.exit_codes} (expected 0: its host was reaped?)")
    if code != 0:
        _mismatch(outcome, f"registration {variant}: the reap during the live run exited {code}: {text[-600:]}")
    rows = [r for r in doc.get("rows", []) if r.get("run_id") == run_id]
    if not rows or any(r.get("state") == "orphan" for r in rows):
        _mismatch(outcome, f"registration {variant}: status (rc {status_rc}) does not show the live run {run_id} "
                  f"as running: {[(r.get('run_id'), r.get('state')) for r in doc.get('rows', [])]}")


TRUST_SCENARIOS = {"suspend": run_suspend, "date_skew": run_date_skew, "decoy": run_decoy,
                   "registration_tamper": run_registration_tamper}
MORE_KINDS.update(TRUST_SCENARIOS)  # account.run_account runs them (the package imports this module)
