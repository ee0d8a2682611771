"""What a guarded run works with: `RunTools`, built once by `build_tools` from the run's spec, client and output.
Every tool is made here and handed its collaborators; the stages (`run/rent.py`, `run/teardown.py`) only use
them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter, expected_teardown_s
from vast_harness.console.live import PhaseLog, Snapshot
from vast_harness.console.output import Output
from vast_harness.errors import ExitCode
from vast_harness.evidence.run import RunEvidence
from vast_harness.records import CreatedInstance
from vast_harness.run.host_work import HostWork
from vast_harness.run.instance_reads import InstanceReads
from vast_harness.run.instances import RunInstances
from vast_harness.run.notify import RunNotifier
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

Clock = Callable[[], float]
# Wraps the boot of one instance (the canary observes reads around it): called with the instance and the boot.
AroundBoot = Callable[[CreatedInstance, Callable[[], None]], None]


@dataclass(frozen=True)
class Adopted:
    """A kept host's instance as a later command takes it over (`run/hold.py` reads it from the held record):
    the instance (its create on this process's clock), and where the hold's meter stands: its start, the price
    it bills, the transfer rate and the bytes moved so far. The command's meter goes on from there, not from 0."""

    instance: CreatedInstance | None  # None: the `up` was killed before a create named one
    labels: dict[str, float]  # every label a create of the hold sent -> when (this clock): the label sweep's
    t0_mono: float  # the hold's start on this process's clock: the time cap counts from here
    t0_unix: float
    dph_usd: float
    usd_per_gb: float  # transfers, both ways
    bytes_up: int
    bytes_down: int
    settled_usd: float = 0.0  # what the hold's earlier hosts (outbid, proven gone) accrued


@dataclass(frozen=True)
class HoldTerms:
    """What a kept host changes in a run's tools (`vast-e2e up` and the commands after it; `run/hold.py`). Its
    run id is the hold's, so is its evidence directory: every command of a hold writes into one run's.

    * `switch_allowance_s`: the dead-man switch's cap: the time cap, less `TeardownBudget.switch_s` (no grace:
      between commands no teardown is waited for, the switch is the cap, and its DELETE lands before it);
    * `switch_recheck_s`: how often the switch re-reads its deadlines (the idle one may move earlier);
    * `idle_first_s`: `up`'s first idle allowance, written by the onstart (the `up` pushes it at its first SSH);
    * `adopt`: the held instance a later command takes over, instead of renting one;
    * `signal_deletes`: whether a signal makes the cap guard delete within a second (an `up`: yes; a later
      command: no, Ctrl-C stops the command, the host stays held)."""

    switch_allowance_s: int
    switch_recheck_s: int
    idle_first_s: int | None = None
    adopt: Adopted | None = None
    signal_deletes: bool = True


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
    instances: RunInstances  # what was rented, which of it is the run's, what the cap guard may delete
    phases: PhaseLog  # the timeline and the live view's phase
    reads: InstanceReads  # what every read of the rented instance tells the run
    signals: SignalGuard
    server_clock: ServerClock | None  # the API's Date headers
    host_work: type[HostWork]
    on_created: Callable[[CreatedInstance], None] | None
    around_boot: AroundBoot | None
    stuck: StuckRunWatch  # ends a run whose main thread does not come back after the guard's DELETE
    notify: RunNotifier  # the run's events to its --notify URLs: posted, never waited on
    hold: HoldTerms | None = None  # a kept host's command (run/hold.py)

    def clock(self) -> float:
        """The run's monotonic clock (the meter's): every deadline of every stage is on it."""
        return self.meter.now()

    @property
    def book(self) -> RentBook:
        """What was sent, rented, proven gone: the teardown and the verdict read it (the instances' owner's)."""
        return self.instances.book

    @property
    def cap_guard(self) -> CapGuard:
        """Deletes the run's instances itself if the teardown has not begun near the cap (the owner's)."""
        return self.instances.guard


class GuardFired:
    """The run's side of its cap guard firing (the guard's `on_fire`, told before its first DELETE): the run is
    cancelled (exit 6), the user told, and the stuck-run watch armed: from then on the run has a whole teardown's
    time to finish."""

    def __init__(self, state: RunState, out: Output, meter: CostMeter, notify: RunNotifier) -> None:
        self._state, self._out, self._meter, self._notify = state, out, meter, notify
        self.stuck: StuckRunWatch | None = None  # it watches the guard that calls this, so it is made after it

    def __call__(self, reason: str) -> None:
        self._state.timings["cap_guard_fired_s"] = round(self._meter.now() - self._meter.t0, 3)
        self._state.cancel(reason, ExitCode.CAP_REACHED)
        self._out.warn(reason)
        self._notify.cap_reached(reason)  # queued: the guard's DELETE does not wait for it
        if self.stuck is not None:
            self.stuck.arm()


def build_tools(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, state: RunState, *,
                clock: Clock, host_work: type[HostWork], on_created: Callable[[CreatedInstance], None] | None,
                around_boot: AroundBoot | None, hold: HoldTerms | None = None) -> RunTools:
    spec.teach_masker()  # the key this run uses (the simulator's too) and its secrets, before anything is written
    server_clock: ServerClock | None = getattr(client, "server_clock", None)
    ledger = Ledger.for_spec(spec, server_clock.now if server_clock else None,
                             evidence_dir=spec.evidence_dir / state.run_id)
    ev = RunEvidence(spec.evidence_dir / state.run_id)
    adopt = hold.adopt if hold else None
    meter = CostMeter(max_usd=spec.caps.max_usd, max_seconds=spec.max_seconds,
                      teardown_margin_s=spec.teardown_margin_s, clock=clock,
                      t0=adopt.t0_mono if adopt else None, on_raise=lambda change: reads.record_raise(change))
    state.t0_unix = adopt.t0_unix if adopt else time.time()
    phases = PhaseLog(meter.accrued_usd, clock=meter.now)
    notify = RunNotifier(spec, state.run_id, meter)
    guard_fired = GuardFired(state, out, meter, notify)
    instances = RunInstances(client=client, ledger=ledger, run_id=state.run_id, meter=meter, out=out,
                             on_guard_fired=guard_fired, describe_now=lambda: phases.current,
                             book=_adopted_book(adopt) if adopt else None)
    if adopt is not None:  # the hold's meter goes on: its price from the create, the bytes moved so far
        meter.set_transfer(inet_down_cost_usd_per_gb=adopt.usd_per_gb, inet_up_cost_usd_per_gb=adopt.usd_per_gb)
        if adopt.instance is not None:
            meter.start_instance(adopt.instance.instance_id, adopt.dph_usd, adopt.instance.t_created_mono)
        meter.add_bytes(up=adopt.bytes_up, down=adopt.bytes_down)
        meter.add_settled(adopt.settled_usd)
    book, cap_guard = instances.book, instances.guard
    stuck = StuckRunWatch(guard=cap_guard, client=client, book=book, clock=meter.now,
                          bound_s=lambda: (len(book.created) + 2) * state.teardown_budget_s + STUCK_GRACE_S,
                          proof_interval_s=spec.proof_interval_s, proof_budget_s=lambda: state.teardown_budget_s,
                          accrued_usd=meter.accrued_usd)
    guard_fired.stuck = stuck
    reads = InstanceReads(client=client, ledger=ledger, run_id=state.run_id, meter=meter, book=book, out=out,
                          poll_s=spec.poll_s, cancel=state.cancel, deleting=cap_guard.is_claimed,
                          switch_allowance_s=hold.switch_allowance_s if hold else spec.deadman_allowance_s,
                          on_outbid=(lambda inst, why: state.outbid(f"instance {inst.instance_id} {why}"))
                          if spec.interruptible is not None else None)
    within_s = TeardownBudget.SIGNAL_DELETE_WITHIN_S

    def on_signal(name: str) -> None:
        if hold is None or hold.signal_deletes:
            cap_guard.fire_by(meter.now() + within_s, f"{name} arrived {within_s:g} s ago")

    signals = SignalGuard(out, on_signal=on_signal)
    return RunTools(spec=spec, client=client, drivers=drivers, out=out, ledger=ledger,
                    ev=ev, meter=meter, budget=meter.budget, instances=instances,
                    phases=phases, reads=reads, signals=signals, server_clock=server_clock,
                    host_work=host_work, on_created=on_created, around_boot=around_boot, stuck=stuck,
                    notify=notify, hold=hold)


def _adopted_book(adopt: Adopted) -> RentBook:
    """A held instance's book, as the `up` that rented it left it: the instance (read as the hold's: it carries
    the label), and the labels its creates sent (settled: the label sweep still looks for each)."""
    book = RentBook(attempts=dict(adopt.labels))
    if adopt.instance is not None:
        book.rented(adopt.instance)
    return book


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
