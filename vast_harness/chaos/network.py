"""Network scenarios: the harness in its own process, pointed at a fault proxy in front of the simulator.

Each scenario draws one primary kind from `NET_KINDS` (plus, sometimes, a second network rule and a simulator
rule), runs `vast_harness.chaos.child` against `FaultProxy.url` with the scenario's steps, kills it past its
budget (caps + a teardown allowance: a hang), and judges it from the simulator's record read directly:
leaks, false absences, bills over the caps, tracebacks anywhere in its output, and an exit code that fits.

`NET_KINDS` is the mix: one line per kind, a function of the scenario's RNG returning a `Mix` (proxy SPEC
items, simulator SPEC items, steps, local disk). A new fault joins the suite with one line there.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from vast_harness.actions.reap import reap_all
from vast_harness.chaos.engine import (
    KEY,
    SCALE,
    SIM_RULES,
    TEARDOWN_BUDGET_S,
    TEARDOWN_MARGIN_S,
    ChildJob,
    _client,
    _draw_rule,
    _output,
    chaos_spec,
    quiet_paramiko,
    quote_cap_usd,
)
from vast_harness.chaos.judge import (
    Violation,
    cap_violations,
    classify,
    false_absences,
    sim_bugs,
    traceback_violations,
)
from vast_harness.chaos.netproxy import FaultProxy, NetFaultPlan
from vast_harness.clock import now_s
from vast_harness.resources import data_root
from vast_harness.sim.server import SimServer
from vast_harness.spec.profile import Step
from vast_harness.state.ledger import LEDGER_FILE, Ledger

API_EPS = ("search", "create", "show", "list", "destroy", "user", "any")
STARTUP_ALLOWANCE_S = 12.0  # interpreter start and imports of the child on a loaded 2-core machine
FLOOD_BYTES = 100_000_000
DISK_BYTES = 2 * 1024 * 1024
GENEROUS_MINUTES = 0.35  # 21 s: the steps take < 1 s; faults add seconds, not tens of them
Disk = Literal["full_at_start", "fills_mid_run"]
CapMode = Literal["generous", "time", "cost", "unrentable"]
CAP_MODES: tuple[CapMode, ...] = ("generous", "time", "cost", "unrentable")


class Mix(BaseModel):
    """What one kind adds to a scenario."""

    net: list[str] = Field(default_factory=list)  # FaultProxy SPEC items
    sim: list[str] = Field(default_factory=list)  # simulator SPEC items
    step: str | None = None  # a command run as the scenario's last step
    disk: Disk | None = None
    cap_mode: Literal["generous", "time"] | None = None  # forced; else drawn


def _ep(r: random.Random) -> str:
    return r.choice(API_EPS)


def _ssh_stall(r: random.Random) -> str:
    return f"ssh_stall:{r.choice(('up', 'down', 'both'))}:{r.uniform(0.0, 2.0):.2f}:{r.choice(('1', '1', '*'))}"


CAPS: tuple[Literal["generous", "time"], ...] = ("generous", "time")


def _flood() -> str:
    return f"yes 'chaos flood 0123456789abcdef0123456789abcdef' | head -c {FLOOD_BYTES}"


# One line per network kind. The draw order is this dict's order (a new line shifts later seeds' draws;
# each seed still replays its own plan with the same --kinds).
NET_KINDS: dict[str, Callable[[random.Random], Mix]] = {
    "clean": lambda r: Mix(),
    "api_stall": lambda r: Mix(net=[f"stall:{_ep(r)}:{r.randint(1, 2)}"]),
    "api_lost": lambda r: Mix(net=[f"lost:{r.choice(('create', 'destroy', 'show', 'list'))}:1"]),
    "api_stall_body": lambda r: Mix(net=[f"stall_body:{_ep(r)}:{r.randint(1, 2)}"]),
    "api_lag": lambda r: Mix(net=[f"lag:{_ep(r)}:{r.uniform(0.2, 3.0):.2f}:{r.randint(1, 3)}"]),
    "api_slow": lambda r: Mix(net=[f"throttle:{_ep(r)}:{r.randint(2_000, 50_000)}:{r.randint(1, 3)}"]),
    "api_reset": lambda r: Mix(net=[f"reset:{_ep(r)}:{r.randint(1, 2)}"]),
    "odd_truncate": lambda r: Mix(net=[f"truncate:{_ep(r)}:{r.randint(1, 2)}"]),
    "odd_html": lambda r: Mix(net=[f"html:{_ep(r)}:{r.randint(1, 2)}"]),
    "odd_empty": lambda r: Mix(net=[f"empty:{_ep(r)}:{r.randint(1, 2)}"]),
    "odd_nested": lambda r: Mix(net=[f"nested:{_ep(r)}:{r.randint(1, 2)}"]),
    "odd_huge": lambda r: Mix(net=[f"huge:{_ep(r)}:1"]),
    "odd_ctype": lambda r: Mix(net=[f"ctype:{_ep(r)}:{r.randint(1, 3)}"]),
    "odd_nan": lambda r: Mix(net=[f"nan:{r.choice(('search', 'search', 'show', 'list'))}:{r.randint(1, 3)}"]),
    "odd_dupkeys": lambda r: Mix(net=[f"dupkeys:{_ep(r)}:{r.randint(1, 2)}"]),
    "ssh_stall": lambda r: Mix(net=[_ssh_stall(r)]),
    "ssh_slow": lambda r: Mix(net=[f"ssh_slow:{r.randint(2_000, 40_000)}:*"], cap_mode=r.choice(CAPS)),
    "ssh_reset": lambda r: Mix(net=[f"ssh_reset:{r.uniform(0.05, 2.0):.2f}:{r.randint(1, 2)}"]),
    "flood": lambda r: Mix(step=_flood(), cap_mode=r.choice(CAPS)),
    "big_evidence": lambda r: Mix(step=f"head -c {r.randint(5, 40)}000000 /dev/urandom > evidence/big.bin",
                                  net=[f"ssh_slow:{r.randint(100_000, 400_000)}:*"]),
    "disk_full_start": lambda r: Mix(disk="full_at_start"),
    "disk_full_mid": lambda r: Mix(disk="fills_mid_run", step="yes 'chaos disk filler line' | head -c 3000000"),
}
# Relative weights; the heavy kinds (100 MB floods, 40 MB pulls, tmpfs mounts) are drawn less often.
WEIGHTS: dict[str, float] = {"clean": 0.5, "flood": 0.4, "big_evidence": 0.4, "disk_full_start": 0.3,
                             "disk_full_mid": 0.4, "odd_huge": 0.6}


class NetPlan(BaseModel):
    seed: int
    kind: str
    net: str  # FaultProxy SPEC
    faults: str  # simulator SPEC
    steps: list[str]
    disk: Disk | None = None
    cap_mode: CapMode
    max_minutes: float
    usd_factor: float | None = None
    boot_retries: int
    proof_interval_s: float

    @property
    def faulted(self) -> bool:
        return self.kind != "clean"  # a clean scenario gets no extra rule either


class NetOutcome(BaseModel):
    seed: int
    plan: NetPlan
    exit_code: int | None = None  # None: killed as a hang
    skipped: str | None = None
    wall_s: float = 0.0
    budget_s: float = 0.0
    max_usd: float | None = None
    billed_usd: float = 0.0
    instances: int = 0
    live_at_exit: list[int] = Field(default_factory=list)
    net_fired: dict[str, int] = Field(default_factory=dict)
    sim_fired: dict[str, int] = Field(default_factory=dict)
    violations: list[Violation] = Field(default_factory=list)
    log: str = ""


def draw_net(seed: int, kinds: tuple[str, ...] | None = None) -> NetPlan:
    rng = random.Random(seed)
    names = [k for k in NET_KINDS if kinds is None or k in kinds]
    if not names:
        raise ValueError(f"no network kind selected (known: {', '.join(NET_KINDS)})")
    # Half the draws cycle through the kinds with the seed (a suite's consecutive seeds cover every kind),
    # half are weighted (the heavy kinds less often).
    cycle = rng.random() < 0.5
    kind = names[seed % len(names)] if cycle else rng.choices(names, weights=[WEIGHTS.get(k, 1.0) for k in names])[0]
    mix = NET_KINDS[kind](rng)
    net, sim, steps = list(mix.net), list(mix.sim), [f"echo chaos step; sleep {rng.uniform(0.0, 0.3):.2f}"]
    if kind != "clean" and rng.random() < 0.25:  # a second network rule alongside
        extra = rng.choice([k for k in NET_KINDS if k.startswith(("api_", "odd_", "ssh_")) and k != "odd_huge"])
        net += NET_KINDS[extra](rng).net
    if kind != "clean" and rng.random() < 0.2:
        sim.append(_draw_rule(rng, SIM_RULES))
    if mix.step:
        steps.append(mix.step)
    cap_mode = mix.cap_mode or rng.choices(CAP_MODES, weights=(75, 12, 10, 3))[0]
    max_minutes, usd_factor = GENEROUS_MINUTES, None
    if cap_mode in ("time", "cost"):
        max_minutes = round((TEARDOWN_MARGIN_S + rng.uniform(2.0, 5.0)) / 60.0, 4)
        steps.append("sleep 8")  # outlives the cap deadline
    if cap_mode == "cost":
        usd_factor = round(rng.uniform(1.001, 1.05), 4)
    elif cap_mode == "unrentable":
        usd_factor = round(rng.uniform(0.3, 0.95), 4)
    return NetPlan(seed=seed, kind=kind, net=";".join([*net, f"seed={seed}"]), faults=";".join([*sim, f"seed={seed}"]),
                   steps=steps, disk=mix.disk, cap_mode=cap_mode, max_minutes=max_minutes, usd_factor=usd_factor,
                   boot_retries=rng.choice((0, 1, 1, 2)), proof_interval_s=round(rng.uniform(0.05, 0.2), 3))


def budget_s(plan: NetPlan) -> float:
    """Wall time the run may take: its time cap, one teardown per instance it may rent, and start-up."""
    teardowns_s = TEARDOWN_BUDGET_S * (plan.boot_retries + 2) + 4 * plan.proof_interval_s
    return round(STARTUP_ALLOWANCE_S + plan.max_minutes * 60.0 + teardowns_s + 5.0, 1)


@contextlib.contextmanager
def _small_disk(path: Path, plan: NetPlan) -> Iterator[str | None]:
    """`path` on a 2 MB tmpfs (full at start: filled to the last byte). Yields a skip reason, or None."""
    path.mkdir(parents=True, exist_ok=True)
    if plan.disk is None:
        yield None
        return
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs", str(path)],
                           capture_output=True, text=True, check=False)
    if mount.returncode != 0:
        yield f"cannot mount a small tmpfs (needs root): {mount.stderr.strip()[:200]}"
        return
    try:
        if plan.disk == "full_at_start":
            with contextlib.suppress(OSError), (path / "filler").open("wb") as f:
                while True:
                    f.write(b"\0" * 65536)
        yield None
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def run_net(plan: NetPlan) -> NetOutcome:
    """One network scenario, judged. Never raises for a harness failure."""
    quiet_paramiko()
    outcome = NetOutcome(seed=plan.seed, plan=plan, budget_s=budget_s(plan))
    started = now_s()
    with tempfile.TemporaryDirectory(prefix=f"vh-net-{plan.seed}-") as tmp:
        work = Path(tmp)
        with _small_disk(work / "ev", plan) as skip:
            if skip:
                outcome.skipped = skip
                return outcome
            with SimServer(seed=plan.seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim, \
                    FaultProxy(sim.url, plan.net) as proxy:
                _run_child(plan, sim, proxy, work, outcome)
    outcome.wall_s = round(now_s() - started, 3)
    return outcome


def _run_child(plan: NetPlan, sim: SimServer, proxy: FaultProxy, work: Path, outcome: NetOutcome) -> None:
    steps = [Step(name=f"chaos-{i}", run=cmd, timeout_s=30) for i, cmd in enumerate(plan.steps)]
    job = ChildJob(api_url=proxy.url, evidence_dir=work / "ev", steps=steps, max_minutes=plan.max_minutes,
                   max_usd=None, boot_retries=plan.boot_retries, proof_interval_s=plan.proof_interval_s,
                   t0_file=work / "t0")
    spec = chaos_spec(api_url=sim.url, evidence_dir=job.evidence_dir, steps=steps, max_minutes=plan.max_minutes,
                      boot_retries=plan.boot_retries, proof_interval_s=plan.proof_interval_s)
    if plan.usd_factor is not None:  # quoted against the simulator itself, fault-free
        job.max_usd = quote_cap_usd(spec, sim, plan.usd_factor)
        spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": job.max_usd})})
    outcome.max_usd = spec.caps.max_usd
    sim.set_faults(plan.faults)
    (work / "job.json").write_text(job.model_dump_json())
    launched_unix = time.time()
    with (work / "stdout").open("wb") as out, (work / "stderr").open("wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "vast_harness.chaos.child", str(work / "job.json")],
                                 cwd=data_root(), stdout=out, stderr=err, start_new_session=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            outcome.exit_code = child.wait(timeout=outcome.budget_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            outcome.violations.append(Violation(kind="hang", detail=f"still running after its {outcome.budget_s:g} s "
                                                f"budget; killed"))
    at_exit = sim.state()
    outcome.net_fired = proxy.fired()
    outcome.sim_fired = {k: v for r in at_exit["faults"]["rules"] for k, v in [(r["kind"], r["fired"])] if v}
    text = (work / "stdout").read_bytes()[-200_000:].decode(errors="replace") + "\n" + \
        (work / "stderr").read_bytes()[-200_000:].decode(errors="replace")
    outcome.log = text[-6000:]
    try:
        start_unix = float((work / "t0").read_text())
    except (OSError, ValueError):
        start_unix = launched_unix
    proxy.plan = NetFaultPlan("")  # reap goes through the same API URL the run's ledger names, faults off
    judge_net(plan, spec, outcome, at_exit, start_unix, text, sim, reap_url=proxy.url)


def judge_net(plan: NetPlan, spec: Any, outcome: NetOutcome, at_exit: dict[str, Any], start_unix: float,
              text: str, sim: SimServer | None, reap_url: str | None = None) -> None:
    instances = at_exit["instances"]
    outcome.instances = len(instances)
    outcome.billed_usd = sum(i["billed_usd"] for i in instances)
    outcome.live_at_exit = [i["id"] for i in instances if i["live"]]
    code = outcome.exit_code
    found: list[Violation] = []
    may_bill = code in (3, None)  # exit 3 ("may still bill") or a hang killed: reap, then judge leaks
    if outcome.live_at_exit and not may_bill:
        found.append(Violation(kind="leak", detail=f"instance(s) {outcome.live_at_exit} live at exit {code}"))
    final = at_exit
    if may_bill and outcome.live_at_exit and sim is not None:
        found += _reap(spec, sim, reap_url or sim.url)
        final = sim.state()
    found += false_absences(final["instances"], spec.evidence_dir)
    found += sim_bugs(final)
    if not (may_bill and outcome.live_at_exit):  # one left live bills on: the caps cannot be judged then
        found += cap_violations(instances, at_exit["now"], start_unix, spec.caps.max_usd, spec.max_seconds,
                                spec.evidence_dir)
    found += traceback_violations(text, "harness output")
    found += [Violation(kind="exit_mismatch", detail=d) for d in net_exit_mismatches(plan, outcome, spec)]
    outcome.violations += [classify(v) for v in found]


def _reap(spec: Any, sim: SimServer, url: str) -> list[Violation]:
    """`reap` at `url` (the run's own API URL: the ledger binds instances to it), faults cleared; anything
    still live then is a leak."""
    sim.set_faults(None)
    buf_code: int | None = None
    try:
        import io

        with _client(url) as client:
            buf_code = reap_all(spec.model_copy(update={"api_url": url}), client, _output(io.StringIO()))
    except Exception as exc:  # noqa: BLE001 - reap's own failure is a finding
        return [Violation(kind="reap_failed", detail=f"reap raised {type(exc).__name__}: {exc}")]
    live = [i["id"] for i in sim.state()["instances"] if i["live"]]
    found = []
    if live:
        found.append(Violation(kind="leak", detail=f"instance(s) {live} live after reap"))
    if buf_code != 0:
        found.append(Violation(kind="reap_failed", detail=f"reap exited {buf_code}; live after reap: {live}"))
    return found


def net_exit_mismatches(plan: NetPlan, outcome: NetOutcome, spec: Any) -> list[str]:
    code = outcome.exit_code
    if code is None:
        return []  # a hang, reported as such
    why = []
    if code not in (0, 1, 2, 3, 4, 5, 6):
        why.append(f"exit {code}: not an exit code of a run (a signal or an unhandled error)")
    if code == 2 and (outcome.instances or plan.disk is None):
        why.append(f"exit 2 (bad input, nothing rented) with {outcome.instances} instance(s), disk {plan.disk}")
    if code in (0, 4):
        if outcome.max_usd is not None and outcome.billed_usd > outcome.max_usd:
            why.append(f"exit {code} with ${outcome.billed_usd:.6f} billed over the ${outcome.max_usd:.6f} cap")
        if outcome.live_at_exit:
            why.append(f"exit {code} with instance(s) {outcome.live_at_exit} live")
        if plan.disk == "full_at_start":
            why.append(f"exit {code} with a full evidence disk: the evidence cannot have been written")
        pending, labels = _unproven(spec.evidence_dir)
        if pending or labels:
            why.append(f"exit {code} with the ledger naming unproven instances {sorted(pending)} {sorted(labels)}")
    if code == 5 and outcome.instances:
        why.append(f"exit 5 (nothing rented) but the simulator has {outcome.instances} instance(s)")
    if code == 6 and plan.cap_mode not in ("time", "cost") and not plan.faulted:
        why.append("exit 6 with generous caps and no fault")
    # Under a fault the preflight may get no answer at all: exit 1 naming the API is then the honest outcome.
    api_silent = code == 1 and plan.faulted and "gave no usable answer" in outcome.log
    if plan.cap_mode == "unrentable" and code not in (2, 5) and not api_silent:
        why.append(f"cap below every offer's worst case, yet exit {code} (expected 5)")
    if plan.disk == "full_at_start" and code != 2:
        why.append(f"evidence disk full at start, yet exit {code} (expected 2, nothing rented)")
    if not plan.faulted and plan.cap_mode == "generous" and code not in (0, 4):
        why.append(f"fault-free run with generous caps exited {code}")
    return why


def _unproven(evidence_dir: Path) -> tuple[set[int], set[str]]:
    """Ids of the instances the ledger names as never proven gone, and labels whose create is unknown."""
    try:
        pending, labels = Ledger(evidence_dir / LEDGER_FILE).unproven()
    except (OSError, ValueError):
        return set(), set()
    return set(pending), labels


__all__ = ["KEY", "NET_KINDS", "NetOutcome", "NetPlan", "budget_s", "draw_net", "judge_net", "run_net"]
