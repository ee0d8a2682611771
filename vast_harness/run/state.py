"""What one guarded run is made of: its stages in order, the state it learns as it goes (declared once, in
`RunState`), and the tools it works with (built once, in `build_tools`). The stages are functions of
(tools, state), in `run/rent.py` and `run/teardown.py`; `GuardedRun.execute` calls them in `Stage` order."""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter, expected_teardown_s, teardown_budget_s
from vast_harness.console.live import PhaseLog, Snapshot
from vast_harness.console.output import Output
from vast_harness.errors import ExitCode, RunCancelled, VastError
from vast_harness.evidence.run import RunEvidence
from vast_harness.host.deadman import DeadmanStatus
from vast_harness.host.ssh import HostSession, RunKey
from vast_harness.instance.lifecycle import destroy
from vast_harness.market.offers import Candidate
from vast_harness.market.plan import RunPlan
from vast_harness.records import CreatedInstance, DeleteAck, HostGpus, WorkdirRecord
from vast_harness.run.host_work import HostWork
from vast_harness.run.instance_reads import InstanceReads
from vast_harness.run.ownership import foreign_label, record_disowned
from vast_harness.run.rent_book import RentBook
from vast_harness.run.signals import SignalGuard
from vast_harness.run.stuck import STUCK_GRACE_S, StuckRunWatch
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.ledger import Ledger
from vast_harness.state.registry import HeldRegistration
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import VastClient
from vast_harness.vast.server_clock import ServerClock

OWNERSHIP_GUARD_READ_S = 1.0  # the cap guard's read of a never-read instance's label, at most

Clock = Callable[[], float]
# Wraps the boot of one instance (the canary observes reads around it): called with the instance and the boot.
AroundBoot = Callable[[CreatedInstance, Callable[[], None]], None]


class Stage(enum.Enum):
    """The run's stages, in the order `GuardedRun.execute` runs them. Whatever ends the work (an error, a cap,
    a signal), TEARDOWN and VERDICT run."""

    PREFLIGHT = "preflight"  # caps, evidence dir, registration, the plan and its quote, the run's key
    RENT = "rent"  # create -> boot -> SSH connect; the next offer after a host that does not come up
    DEADMAN = "deadman"  # the dead-man switch proven able to act before any workload minute
    UPLOAD = "upload"  # the bundle, unpacked on the host
    STEPS = "steps"  # the profile's steps, in order
    PULL = "pull"  # the host's evidence, back under the meter's deadline
    TEARDOWN = "teardown"  # last reads and pull, then DELETE + absence proof per instance, then the label sweep
    VERDICT = "verdict"  # the exit code, the record, the report


@dataclass
class RunState:
    """Everything the run learns as it goes: the stages write it, the verdict and the record read it."""

    run_id: str
    teardown_budget_s: float  # one instance's delete + absence proof before it is declared unproven (exit 3)
    read_lag_window_s: float  # reads may not see an instance this long after its create
    # The meter's t0 on the wall clock (set as the meter starts): where the time cap starts for a judge outside
    # the process (the chaos suite, tests). Recorded, never compared here: deadlines are on the monotonic clock.
    t0_unix: float = 0.0
    stage: Stage = Stage.PREFLIGHT
    timings: dict[str, float] = field(default_factory=dict)
    registration: HeldRegistration | None = None  # held (locked) from before the first create to the end
    plan: RunPlan | None = None
    candidate: Candidate | None = None  # the offer whose host came up
    key: RunKey | None = None
    session: HostSession | None = None
    work: HostWork | None = None  # the host's phases, once SSH is up
    deadman: DeadmanStatus | None = None  # the switch as the first SSH found it
    workdir: WorkdirRecord | None = None  # a `run`'s uploaded workdir (its sha256), from the bundle
    host_gpus: HostGpus | None = None  # the GPUs of the host that came up, read and matched after SSH
    gpu_refused: list[HostGpus] = field(default_factory=list)  # hosts deleted as not what was offered
    # Set by `cancel` from another thread; checked wherever the cap deadline is, and by a running step.
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    cancel_exit_code: ExitCode = ExitCode.CAP_REACHED

    def cancel(self, reason: str, exit_code: ExitCode = ExitCode.CAP_REACHED) -> None:
        """Thread-safe: stop at the next stage boundary; the first reason stands."""
        if not self.cancelled.is_set():
            self.cancel_reason, self.cancel_exit_code = reason, exit_code
            self.cancelled.set()

    def check_cancelled(self, *_: object) -> None:
        if self.cancelled.is_set():
            raise RunCancelled(f"cancelled: {self.cancel_reason}", self.cancel_exit_code)


@dataclass(frozen=True)
class RunTools:
    """What the run works with, built once by `build_tools`. The hooks are how tests and the canary reach in:
    `host_work` makes the host's phases once SSH is up, `on_created` is told of each instance as soon as its
    create answered, `around_boot` wraps each boot."""

    spec: RunSpec
    client: VastClient
    drivers: DriverPolicy
    out: Output
    ledger: Ledger
    ev: RunEvidence
    meter: CostMeter  # the one clock: every stage asks it for its deadline; it turns both caps into one
    budget: TeardownBudget
    book: RentBook  # what was sent, rented, proven gone: teardown and the verdict read it
    phases: PhaseLog  # the timeline and the live view's phase
    cap_guard: CapGuard  # deletes the run's instances itself if the teardown has not begun near the cap
    reads: InstanceReads  # what every read of the rented instance tells the run
    signals: SignalGuard
    server_clock: ServerClock | None  # the API's Date headers
    host_work: type[HostWork]
    on_created: Callable[[CreatedInstance], None] | None
    around_boot: AroundBoot | None
    stuck: StuckRunWatch  # ends a run whose main thread does not come back after the guard's DELETE

    def clock(self) -> float:
        """The run's monotonic clock (the meter's): every deadline of every stage is on it."""
        return self.meter.now()


def new_state(spec: RunSpec, run_id: str) -> RunState:
    return RunState(run_id=run_id, teardown_budget_s=teardown_budget_s(spec.proof_interval_s),
                    read_lag_window_s=spec.timings.read_lag_window_s)


def build_tools(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, state: RunState, *,
                clock: Clock, host_work: type[HostWork], on_created: Callable[[CreatedInstance], None] | None,
                around_boot: AroundBoot | None) -> RunTools:
    server_clock: ServerClock | None = getattr(client, "server_clock", None)
    ledger = Ledger.for_spec(spec, server_clock.now if server_clock else None,
                             evidence_dir=spec.evidence_dir / state.run_id)
    ev = RunEvidence(spec.evidence_dir / state.run_id, mask=spec.redactor.text if spec.redactor else None)
    meter = CostMeter(max_usd=spec.caps.max_usd, max_seconds=spec.max_seconds,
                      teardown_margin_s=spec.teardown_margin_s, clock=clock,
                      on_raise=lambda change: reads.record_raise(change))
    state.t0_unix = time.time()
    book = RentBook()
    phases = PhaseLog(meter.accrued_usd, clock=meter.now)

    def guard_delete(instance_id: int, land_by_mono: float) -> DeleteAck:
        return destroy(client, instance_id, max_retry_s=max(1.0, land_by_mono - meter.now()),
                       land_by_mono=land_by_mono, clock=meter.now)

    def guard_fired(reason: str) -> None:
        state.timings["cap_guard_fired_s"] = round(meter.now() - meter.t0, 3)
        state.cancel(reason, ExitCode.CAP_REACHED)
        out.warn(reason)
        stuck.arm()  # from now on the run has a whole teardown's time to finish

    def guard_owns(instance_id: int) -> bool:
        """An instance no read has shown with the run's label is read once, briefly (the cap is near), before the
        guard deletes it (run/ownership.py)."""
        inst = next((i for i in book.created if i.instance_id == instance_id), None)
        if inst is None or inst.seen or inst.label_seen:  # a row with the run's label was read: the run's
            return True
        within_s = max(0.2, min(OWNERSHIP_GUARD_READ_S, (meter.hard_deadline() - meter.now()) / 3))
        label = foreign_label(client, inst, within_s=within_s, clock=meter.now,
                              on_own_row=lambda row: reads.on_own_row(inst, row, source="ownership read"))
        if label is None:
            return True
        book.disown(inst, label)
        record_disowned(ledger, state.run_id, inst, label)
        out.warn(f"instance {instance_id}, which the create answer named, carries "
                 f"{f'the label {label!r}' if label else 'no label'}, not this run's: the cap guard leaves it alone")
        # What carries the run's label is the run's, whatever the create answered: the guard deletes it next.
        with contextlib.suppress(VastError):
            for row in client.list_instances(label=inst.label, within_s=within_s):
                if row.label == inst.label:
                    cap_guard.note(row.id)
        return False

    cap_guard = CapGuard(meter=meter, live=lambda: [i.instance_id for i in book.live()], delete=guard_delete,
                         on_fire=guard_fired, describe_now=lambda: phases.current, owned=guard_owns)
    stuck = StuckRunWatch(guard=cap_guard, client=client, book=book, clock=meter.now,
                          bound_s=lambda: (len(book.created) + 2) * state.teardown_budget_s + STUCK_GRACE_S,
                          proof_interval_s=spec.proof_interval_s, proof_budget_s=lambda: state.teardown_budget_s,
                          accrued_usd=meter.accrued_usd)
    reads = InstanceReads(client=client, ledger=ledger, run_id=state.run_id, meter=meter, book=book, out=out,
                          poll_s=spec.poll_s, cancel=state.cancel, deleting=cap_guard.is_claimed,
                          switch_allowance_s=spec.deadman_allowance_s)
    within_s = TeardownBudget.SIGNAL_DELETE_WITHIN_S
    signals = SignalGuard(out, on_signal=lambda name: cap_guard.fire_by(meter.now() + within_s,
                                                                        f"{name} arrived {within_s:g} s ago"))
    return RunTools(spec=spec, client=client, drivers=drivers, out=out, ledger=ledger,
                    ev=ev, meter=meter, budget=meter.budget, book=book,
                    phases=phases, cap_guard=cap_guard, reads=reads, signals=signals, server_clock=server_clock,
                    host_work=host_work, on_created=on_created, around_boot=around_boot, stuck=stuck)


def snapshot(t: RunTools) -> Snapshot:
    """What the live view shows."""
    phase = t.phases.current
    steps = [step.name for step in t.spec.profile.steps]
    step = phase.removeprefix("step ")
    number = steps.index(step) + 1 if phase.startswith("step ") and step in steps else None
    guard_fired = t.cap_guard.fired_reason is not None
    if guard_fired:  # the instance is deleted; the run's own thread has not caught up
        phase = f"{phase or 'run'}: cap guard sent the DELETE, the run's teardown has not yet taken over"
    instances = max(1, len(t.book.created))
    return Snapshot(phase=phase, phase_elapsed_s=t.clock() - t.phases.current_started_mono,
                    accrued_usd=t.meter.accrued_usd(), max_usd=t.spec.caps.max_usd,
                    elapsed_s=t.meter.elapsed_s(), max_s=t.spec.max_seconds, step_number=number,
                    step_count=len(steps), tearing_down=guard_fired or phase == "teardown",
                    teardown_expected_s=instances * expected_teardown_s(t.spec.proof_interval_s,
                                                                        t.spec.timings.pacing_scale))


def signalled(t: RunTools) -> bool:
    """A signal arrived: the DELETE goes first, before any read or pull that could wait."""
    return t.signals.received is not None
