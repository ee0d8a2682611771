"""What a guarded run works with: `RunTools`, built once by `build_tools` from the run's spec, client and output.
Every tool is made here and handed its collaborators; the stages (`run/rent.py`, `run/teardown.py`) only use
them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter, expected_teardown_s
from vast_harness.console.live import PhaseLog, Snapshot
from vast_harness.console.output import Output
from vast_harness.errors import ExitCode, VastError
from vast_harness.evidence.run import RunEvidence
from vast_harness.instance.lifecycle import destroy
from vast_harness.records import CreatedInstance, DeleteAck
from vast_harness.run.host_work import HostWork
from vast_harness.run.instance_reads import InstanceReads
from vast_harness.run.ownership import foreign_label, record_disowned
from vast_harness.run.rent_book import RentBook
from vast_harness.run.signals import SignalGuard
from vast_harness.run.state import RunState
from vast_harness.run.stuck import STUCK_GRACE_S, StuckRunWatch
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.ledger import Ledger
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import VastClient
from vast_harness.vast.server_clock import ServerClock

OWNERSHIP_GUARD_READ_S = 1.0  # the cap guard's read of a never-read instance's label, at most

Clock = Callable[[], float]
# Wraps the boot of one instance (the canary observes reads around it): called with the instance and the boot.
AroundBoot = Callable[[CreatedInstance, Callable[[], None]], None]


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
