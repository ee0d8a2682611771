"""The guarded run of docs/architecture.md, read top to bottom in `GuardedRun.execute`.

Whatever happens after the first create (an error, a cap, Ctrl-C, SIGTERM, SIGHUP), the `finally` block
pulls what evidence it can, deletes every instance this run created, proves each absent, and only then
decides the exit code: 3 beats everything when any instance is not proven gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from pydantic import BaseModel

from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter, check_minimum_cap, minimum_cap_s, teardown_budget_s
from vast_harness.console.live import PhaseLog, Snapshot
from vast_harness.console.output import Output
from vast_harness.errors import (
    BootFailed,
    CapReachedError,
    ConfigError,
    CreateUnresolved,
    ExitCode,
    Interrupted,
    LedgerWriteError,
    NoOfferError,
    RunCancelled,
    SshConnectError,
    TeardownUnproven,
    VastError,
    describe,
    exit_code_for,
)
from vast_harness.evidence.run import RunEvidence, overall_absence
from vast_harness.host.bundle import Bundle, build_bundle
from vast_harness.host.deadman import DeadmanStatus, DeadmanUnarmed, check_armed, read_log
from vast_harness.host.onstart import build_onstart
from vast_harness.host.ssh import (
    HostSession,
    RunKey,
    endpoints_for,
    generate_run_key,
    run_key_dir_prefix,
)
from vast_harness.instance.lifecycle import CreateRequest, create, destroy, find_by_label, teardown_instance, wait_ready
from vast_harness.market.offers import Candidate
from vast_harness.market.plan import RunPlan, account_credit_usd, choose_offers, plan_run
from vast_harness.records import (
    ByteCounts,
    CreatedInstance,
    DeleteAck,
    HostKeyRecord,
    InstanceTeardown,
    PullRecord,
    RecordCaps,
    RunRecord,
    StepRecord,
)
from vast_harness.reports.run import write_run_report_safely
from vast_harness.run.host_work import HostWork
from vast_harness.run.instance_reads import InstanceReads
from vast_harness.run.rent_book import CreateOutcome, NotRented, RentBook, Rented
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.spec.values import check_evidence_dir
from vast_harness.state.ledger import Ledger, new_run_id
from vast_harness.state.registry import HeldRegistration, Registration, RunRegistry, make_label, this_host
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance

MAX_UNAVAILABLE_REPICKS = 3
# An offer sold twice is accepted for both buyers and "this error never propagates back" (SkyPilot PR 9117):
# the second buyer's instance just never becomes reachable. No message says so, so none is matched: the boot
# deadline ends it like any host that does not come up (deleted, machine excluded, a boot retry spent).
DEADMAN_CHECK_MAX_S = 60.0  # the dead-man check at the first SSH (it waits up to 50 s for the arm probe)
DEADMAN_LOG_READ_S = 3.0  # reading the switch's log back at teardown: brief, DELETE comes next
NULL_GRACE_S = 60.0  # reads lag creates: tolerate `instances: null` this long after create
CANCEL_PRICE_READ_RETRY_S = 2.0  # the price read of a run a cap cancelled (a signal skips it: DELETE first)
STRAY_PRICE_READ_S = 3.0  # reading the price of an instance the label sweep found (then it is deleted)
_T = TypeVar("_T")
# What signal.signal takes and returns (typeshed's private _HANDLER).
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class HarnessResult(BaseModel):
    run_id: str
    exit_code: ExitCode
    message: str = ""


class _SignalGuard:
    """First signal interrupts the run; any signal during teardown only says teardown is in progress."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, out: Output, on_signal: Callable[[str], None] = lambda _name: None) -> None:
        self.out = out
        self.on_signal = on_signal  # told of every signal, first thing (the cap guard deletes within a second)
        self.in_teardown = False
        self.received: int | None = None
        self.hurry = False  # a signal during teardown: abandon the evidence pull, go straight to DELETE
        self._previous: dict[signal.Signals, SignalHandler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.on_signal(signal.Signals(signum).name)
        if self.in_teardown or self.received is not None:
            self.hurry = True
            self.out.warn(f"{signal.Signals(signum).name}: teardown is in progress and will finish; it cannot be skipped")
            return
        self.received = signum
        raise Interrupted(signum)

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


Clock = Callable[[], float]


class GuardedRun:
    """One guarded run. `clock` is the run's monotonic clock (the meter's: every deadline of every phase, the
    lifecycle's waits and the SSH session's, is on it); `host_work` makes the host phases once SSH is up;
    `on_created` is called with each instance as soon as its create answered (the chaos suite steps the wall
    clock there). Tests swap these rather than override private methods."""

    def __init__(self, spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, *,
                 run_id: str | None = None, clock: Clock = time.monotonic,
                 host_work: type[HostWork] = HostWork,
                 on_created: Callable[[CreatedInstance], None] | None = None) -> None:
        self.spec, self.client, self.drivers, self.out = spec, client, drivers, out
        self.run_id = run_id or new_run_id()
        self.server_clock = getattr(client, "server_clock", None)  # the API's Date headers (servertime.py)
        self.ledger = Ledger.for_spec(spec, self.server_clock.now if self.server_clock else None)
        self.registration: HeldRegistration | None = None  # held (locked) from before the first create to the end
        self.ev = RunEvidence(spec.evidence_dir / self.run_id)
        # The one clock: every phase asks it for its deadline; it turns both caps into one.
        self.meter = CostMeter(max_usd=spec.caps.max_usd, max_seconds=spec.max_seconds,
                               teardown_margin_s=spec.teardown_margin_s, clock=clock)
        self.clock = self.meter.now
        # The same instant on the wall clock: where the time cap starts for a judge outside the process (the
        # chaos suite, tests). Recorded, never compared here: the run's deadlines are on the monotonic clock.
        self.t0_unix = time.time()
        self.book = RentBook()  # what was sent, rented, proven gone: teardown and the verdict read it
        self.timings: dict[str, float] = {}
        self.session: HostSession | None = None
        self.plan: RunPlan | None = None
        self.candidate: Candidate | None = None
        self._host_work, self._on_created = host_work, on_created
        self.work: HostWork | None = None  # the host's phases, once SSH is up
        self.deadman: DeadmanStatus | None = None  # the switch as the first SSH found it
        self.guard: _SignalGuard | None = None
        # How long one instance's delete + absence proof may take before it is declared unproven (exit 3).
        self.teardown_budget_s = teardown_budget_s(spec.proof_interval_s)
        # Reads may not see an instance this long after its create (Timings.read_lag_window_s).
        self.read_lag_window_s = spec.timings.read_lag_window_s
        # Set by `cancel` from another thread; checked wherever the cap deadline is, and by a running step.
        self.cancelled = threading.Event()
        self.cancel_reason, self.cancel_exit_code = "", ExitCode.CAP_REACHED
        self.phases = PhaseLog(self.accrued_usd, clock=self.clock)  # the timeline and the live view's phase
        # Deletes the run's instances itself if the main thread has not begun their teardown near the cap.
        self.cap_guard = CapGuard(meter=self.meter, live=lambda: [i.instance_id for i in self.book.live()],
                                  delete=self._guard_delete,
                                  on_fire=self._guard_fired, describe_now=lambda: self.phases.current)
        # First sight, the host's own price, a delete not ours: what every read of the instance tells the run.
        self.reads = InstanceReads(client=client, ledger=self.ledger, run_id=self.run_id, meter=self.meter,
                                   book=self.book, out=out, poll_s=spec.poll_s,
                                   cancel=lambda why, code: self.cancel(why, exit_code=code),
                                   deleting=self.cap_guard.is_claimed)

    # What the run rented and what became of it (the record, the fleet, the chaos suite and tests read these).
    @property
    def created(self) -> list[CreatedInstance]:
        return self.book.created

    @property
    def teardowns(self) -> list[InstanceTeardown]:
        return self.book.teardowns

    @property
    def t0(self) -> float:
        return self.meter.t0

    def cancel(self, reason: str, *, exit_code: ExitCode = ExitCode.CAP_REACHED) -> None:
        """Thread-safe: stop at the next phase boundary (a running step within its poll interval), then the
        usual teardown: CAP_REACHED for a cap, INTERRUPTED for a signal. A finished run is unaffected."""
        if not self.cancelled.is_set():
            self.cancel_reason, self.cancel_exit_code = reason, exit_code
            self.cancelled.set()

    def _guard_delete(self, instance_id: int, land_by_mono: float) -> DeleteAck:
        return destroy(self.client, instance_id, max_retry_s=max(1.0, land_by_mono - self.clock()),
                       land_by_mono=land_by_mono, clock=self.clock)

    def _guard_fired(self, reason: str) -> None:
        self.timings["cap_guard_fired_s"] = round(self.clock() - self.t0, 3)
        self.cancel(reason, exit_code=ExitCode.CAP_REACHED)
        self.out.warn(reason)

    def _with_guard(self, code: ExitCode, message: str, *, after_outcome: bool = False) -> tuple[ExitCode, str]:
        """The run's outcome once the cap guard has sent its DELETE under it: a pass is not one, and a failure
        that followed (the host gone mid-step) is the cap's: exit 6, naming the guard. `after_outcome`: the
        guard fired after the run had its outcome (in the teardown's prelude): a failure keeps its code."""
        why = self.cap_guard.fired_reason
        if why is None or why in message:
            return code, message
        if code == ExitCode.INTERRUPTED:  # the signal's own code; the guard only sent its DELETE for it
            return code, f"{message}; {why}"
        if after_outcome:
            if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER):
                return ExitCode.CAP_REACHED, why
            return code, f"{message}; then {why}"
        return ExitCode.CAP_REACHED, why if message in ("", "passed") else f"{why}; then {message}"

    def _snapshot(self) -> Snapshot:
        return Snapshot(phase=self.phases.current, phase_elapsed_s=self.clock() - self.phases.current_started_mono,
                        accrued_usd=self.accrued_usd(), max_usd=self.spec.caps.max_usd,
                        elapsed_s=self.meter.elapsed_s(), max_s=self.spec.max_seconds)

    def _check_cancelled(self, *_: object) -> None:
        if self.cancelled.is_set():
            raise RunCancelled(f"cancelled: {self.cancel_reason}", self.cancel_exit_code)

    # ------------------------------------------------------------------------------------------- run
    def execute(self) -> HarnessResult:
        guard = self.guard = _SignalGuard(self.out, on_signal=lambda name: self.cap_guard.fire_by(
            self.clock() + TeardownBudget.SIGNAL_DELETE_WITHIN_S,
            f"{name} arrived {TeardownBudget.SIGNAL_DELETE_WITHIN_S:g} s ago"))
        code, message = ExitCode.FAILED, ""
        key: RunKey | None = None
        with guard, tempfile.TemporaryDirectory(prefix=run_key_dir_prefix(self.run_id)) as key_dir:
            try:
                self.out.start_view(self._snapshot)  # inside: a Ctrl-C here too is exit 130, not a traceback
                self.phases.start("plan")
                check_minimum_cap(self.spec.caps.max_minutes, self.spec.timings)
                check_evidence_dir(self.spec.evidence_dir, "the evidence dir")  # full or read-only: rent nothing
                self._register()  # before anything is rented: from now on a reap sees this run as live
                bundle = build_bundle()
                self.plan = self._timed("plan", lambda: plan_run(self.spec, self.client, self.drivers, bundle))
                self.ev.write_json("offer-quote.json", self.plan.summary())
                if self.ev.write_failures:  # a full or read-only evidence dir: rent nothing
                    raise ConfigError(f"the evidence dir {self.ev.dir} cannot be written "
                                      f"({'; '.join(self.ev.write_failures)}): nothing rented")
                self._check_cancelled()
                key = generate_run_key(Path(key_dir))
                self.cap_guard.start()
                self._rent_and_connect(key)
                self._timed("deadman_check", self._check_deadman)
                # The host may re-price while anything runs on it, a slow upload or pull as much as a step.
                with self.reads.watch_prices(self.book.latest(), cancelled=self.cancelled):
                    self._timed("upload", lambda: self._upload(bundle))
                    self._run_steps()
                    self._pull_evidence(in_teardown=False)
                qualified = self.candidate.driver_qualified if self.candidate else False
                code, message = ((ExitCode.PASSED, "passed") if qualified else
                                 (ExitCode.UNQUALIFIED_DRIVER, "passed on a driver outside the qualified list"))
                code, message = self._with_guard(code, message)
            except (Exception, Interrupted) as exc:  # a bug too must end in teardown and an exit code
                code, message = self._with_guard(exit_code_for(exc), describe(exc))
                if isinstance(exc, NoOfferError) and exc.rejected:
                    self.out.rejections([r.row() for r in exc.rejected], title="Closest offers and why each was rejected")
            finally:
                guard.in_teardown = True
                try:
                    code, message = self._finish(code, message, key)
                finally:
                    if self.registration is not None:
                        self.registration.release()  # the run is over: a reap may now judge what is left
        return HarnessResult(run_id=self.run_id, exit_code=code, message=message)

    def cap_deadline_unix(self) -> tuple[float, str]:
        """When the time cap ends this run, on the API server's clock once it has answered (else the wall
        clock), and which clock it is: what the labels and the registration tell other processes."""
        end_mono = self.meter.t0 + self.spec.max_seconds
        server = self.server_clock.to_server(end_mono) if self.server_clock else None
        if server is not None:
            return server, "server"
        return time.time() + (end_mono - self.clock()), "local wall clock"

    def _register(self) -> None:
        deadline, clock = self.cap_deadline_unix()
        target = self.ledger.target
        self.registration = RunRegistry(self.spec.state_dir).register(Registration(
            run_id=self.run_id, pid=os.getpid(), host=this_host(), started_unix=time.time(),
            api_url=self.spec.api_url, account=target.account if target else None, profile=self.spec.profile.name,
            gpu=", ".join(self.spec.filters.gpu_names) or None, max_usd=self.spec.caps.max_usd,
            max_minutes=self.spec.caps.max_minutes, deadline_unix=deadline,
            deadline_clock="server" if clock == "server" else "local wall clock"))

    def _timed(self, name: str, fn: Callable[[], _T]) -> _T:
        start = self.clock()
        try:
            return fn()
        finally:
            self.timings[f"{name}_s"] = round(self.clock() - start, 3)

    # ------------------------------------------------------------------------------- rent + connect
    def _candidates(self) -> Iterator[Candidate]:
        assert self.plan is not None
        for cand in [self.plan.chosen, *self.plan.alternatives]:
            self.meter.check("renting")  # each create asks the clock first
            yield cand
        # The plan's list ran out: search again, excluding machines that failed to boot in this run.
        try:
            credit = account_credit_usd(self.client)
            choice = choose_offers(self.spec, self.client, self.drivers, build_bundle(), credit_usd=credit,
                                   exclude_machine_ids=self.book.excluded_machines)
        except NoOfferError:
            return
        for cand in choice.ranked:
            self.meter.check("renting")
            yield cand

    def _rent_and_connect(self, key: RunKey) -> None:
        boots_left = self.spec.boot_retries + 1
        repicks_left = MAX_UNAVAILABLE_REPICKS
        tried: set[int] = set()
        start = self.clock()
        book = self.book

        def repick(why: str) -> None:
            nonlocal repicks_left
            repicks_left -= 1
            if repicks_left < 0:
                if book.created:
                    raise BootFailed(f"every further offer was taken or refused before it could be rented ({why})")
                raise NoOfferError(f"every offer tried was taken or refused before it could be rented ({why})")

        for cand in self._candidates():
            if cand.offer.id in tried or cand.offer.machine_id in book.excluded_machines:
                continue
            tried.add(cand.offer.id)
            self._check_cancelled()
            # One label per create attempt, so a late instance of an earlier attempt is told apart; it carries
            # the run's cap deadline (server clock), so a reap on another machine can tell a live run's host
            # from an orphan.
            deadline, clock = self.cap_deadline_unix()
            label = make_label(self.run_id, len(book.attempts), deadline)
            if self.registration is not None:
                self.registration.update(labels=[*self.registration.reg.labels, label], deadline_unix=deadline,
                                         deadline_clock=clock)
            outcome = self._create(cand, label, key)
            if isinstance(outcome, NotRented):
                repick(outcome.why)
                continue
            inst = outcome.instance
            try:
                if inst.status == "created_with_error":
                    raise BootFailed(f"create answered an error but created instance {inst.instance_id} "
                                     f"(stopped, billing storage): {inst.detail}")
                self._boot(inst, key)
                self.candidate = cand
                self.timings["rent_and_connect_s"] = round(self.clock() - start, 3)
                return
            except (BootFailed, SshConnectError) as exc:
                self.out.warn(f"instance {inst.instance_id} did not come up: {exc}")
                report = self._teardown_one(inst)
                if report.verdict != "gone":  # never two instances at once: the next create waits for a proof
                    raise TeardownUnproven(
                        f"instance {inst.instance_id} did not come up ({exc}) and its teardown is not proven "
                        f"({report.verdict}); no further offer is rented while it may still bill") from None
                if inst.machine_id is not None:
                    book.excluded_machines.add(inst.machine_id)
                boots_left -= 1
                if boots_left <= 0:
                    raise BootFailed(f"no host came up after {self.spec.boot_retries + 1} attempt(s): {exc}") from None
        if book.created:  # something was rented (and deleted): "nothing rented" (exit 5) would be untrue
            raise BootFailed("no further offer to try after boot failures")
        raise NoOfferError("no further offer to try after boot failures")

    def _create(self, cand: Candidate, label: str, key: RunKey) -> CreateOutcome:
        """Rented (the instance), or NotRented (why; the caller tries the next offer). An unknown outcome
        that no read settles raises CreateUnresolved (exit 3 unless the final sweep finds it)."""
        deadman_s = int(self.spec.max_seconds + self.spec.deadman_grace_s)
        request = CreateRequest(
            image=self.spec.profile.image_ref.create_form, disk=self.spec.profile.disk_gb, label=label,
            onstart=build_onstart(public_key=key.public_openssh, api_url=self.spec.api_url, deadman_after_s=deadman_s),
        )
        self.phases.start("create")
        self.out.info(f"renting offer {cand.offer.id} ({cand.offer.num_gpus}x {cand.offer.gpu_name}, "
                      f"${cand.quote.dph_at_disk_usd:.3f}/h) as {label}")
        t_put_mono = self.clock()  # billing may start as the PUT lands: the meter starts here, not at the answer
        # unresolved until an answer or a read settles it (an interrupt leaves it)
        self.book.attempt(label, t_put_mono, (cand.offer.id, cand.quote.dph_at_disk_usd))
        try:
            outcome = create(self.client, self.ledger, run_id=self.run_id, offer_id=cand.offer.id,
                             request=request, lag_wait_s=max(self.spec.poll_s, 0.2),
                             lag_window_s=self.read_lag_window_s, clock=self.clock, on_named=self.cap_guard.note)
        except LedgerWriteError as exc:  # the intent never reached the disk, so no PUT was sent: nothing to look for
            self.book.withdraw(label)
            raise LedgerWriteError(f"{exc}: the create was not sent, nothing was rented") from None
        if outcome.status == "unresolved":
            raise CreateUnresolved(f"create of offer {cand.offer.id} has an unknown outcome: {outcome.detail}",
                                   label=label)
        self.book.settle(label)
        if outcome.instance_id is None:
            self.out.warn(f"offer {cand.offer.id}: nothing rented ({outcome.status}): {outcome.detail}")
            return NotRented(f"offer {cand.offer.id}: {outcome.status}: {outcome.detail[:200]}")
        inst = CreatedInstance(instance_id=outcome.instance_id, label=label, offer_id=cand.offer.id,
                               machine_id=cand.offer.machine_id, dph_usd=cand.quote.dph_at_disk_usd,
                               t_created_mono=t_put_mono, status=outcome.status, detail=outcome.detail[:300],
                               seen=outcome.status == "found_after_unknown")  # found in the list by label
        self.book.rented(inst)
        self._start_meter(inst, cand)  # the money clock starts now, at this offer's price
        if self._on_created is not None:
            self._on_created(inst)
        return Rented(inst)

    def _start_meter(self, inst: CreatedInstance, cand: Candidate) -> None:
        q = cand.quote
        self.meter.set_transfer(inet_down_cost_usd_per_gb=cand.offer.inet_down_cost_usd_per_gb,
                                inet_up_cost_usd_per_gb=cand.offer.inet_up_cost_usd_per_gb,
                                expected_up_bytes=int(q.upload_gb * 1e9), expected_down_bytes=int(q.download_gb * 1e9))
        self.meter.start_instance(inst.instance_id, inst.dph_usd, inst.t_created_mono)

    def _cancelled_price_reads(self) -> None:
        """A run a cap cancelled (a fleet's total) reads its live instances' final price before its verdict,
        so the accrual it reports, and the fleet sums, is what the host billed. A signal skips this: its
        DELETE goes first."""
        if not self.cancelled.is_set() or self.cancel_exit_code != ExitCode.CAP_REACHED:
            return
        for inst in self.book.live():
            self.reads.last_price_read(inst, max_retry_s=CANCEL_PRICE_READ_RETRY_S)

    def _on_poll(self, inst: CreatedInstance, read: Instance | None) -> None:
        self.reads.check_gone(inst, read)
        self._check_cancelled()
        self.reads.on_read(inst, read)

    def _boot(self, inst: CreatedInstance, key: RunKey) -> None:
        self.phases.start("boot")
        boot_deadline = self.meter.deadline(self.spec.profile.boot_timeout_s)
        try:
            ready = wait_ready(self.client, inst.instance_id, deadline=boot_deadline, poll_s=self.spec.poll_s,
                               null_grace_s=NULL_GRACE_S, on_poll=lambda read: self._on_poll(inst, read),
                               clock=self.clock)
            self.reads.on_read(inst, ready)
            self._check_cancelled()
            # The price may have moved the deadline: SSH gets what is left of the boot's, never more.
            boot_deadline = min(boot_deadline, self.meter.deadline())
            self.out.info(f"instance {inst.instance_id} running; connecting over SSH")
            self.session = HostSession.connect(endpoints_for(ready), key, deadline_monotonic=boot_deadline,
                                               retry_wait_s=min(2.0, max(self.spec.poll_s, 0.2)), clock=self.clock)
            self.session.stall_timeout_s = self.meter.budget.sftp_stall_s
            self.work = self._host_work(self.session, spec=self.spec, meter=self.meter, ev=self.ev, out=self.out,
                                 run_id=self.run_id, cancelled=self.cancelled, check_cancelled=self._check_cancelled,
                                 hurry=lambda: bool(self.guard and self.guard.hurry), timings=self.timings,
                                 on_phase=self.phases.start)
        except (BootFailed, SshConnectError) as exc:
            # When the cap, not the boot timeout, cut the wait, the run stopped at its cap (exit 6): trying
            # another host would only spend past it. A connect gives up once an attempt no longer fits.
            ends_early_s = TeardownBudget.CONNECT_ATTEMPT_MIN_S if isinstance(exc, SshConnectError) else 0.0
            if self.meter.cut_by_cap(ends_early_s=ends_early_s):
                raise CapReachedError(f"cap reached while instance {inst.instance_id} was booting: {exc}") from exc
            raise

    def _check_deadman(self) -> None:
        """Prove the dead-man switch can act before any workload minute (deadman.py); fail closed unless
        --allow-unarmed-deadman. The host clock's skew and the deadline go into the evidence either way."""
        inst = self.book.latest()
        assert self.session is not None and inst is not None
        timeout_s = min(DEADMAN_CHECK_MAX_S, self.meter.deadline() - self.clock())
        if timeout_s <= 1.0:
            raise CapReachedError("cap reached before the dead-man switch could be checked")
        allowance_s = int(self.spec.max_seconds + self.spec.deadman_grace_s)
        status = check_armed(self.session, instance_id=inst.instance_id, allowance_s=allowance_s,
                             elapsed_s=self.clock() - inst.t_created_mono, timeout_s=timeout_s,
                             allow_unarmed=self.spec.allow_unarmed_deadman)
        self.deadman = status
        if status.skew_large:
            self.out.warn(f"the host's clock is {status.host_clock_skew_s:+.0f} s from this machine's; the "
                          "dead-man switch counts on the host's clock only, so it still fires on time")
        if status.armed:
            self.out.info(status.line())
            return
        if self.meter.cut_by_cap():  # the cap, not the host, ended the check: exit 6 like any phase it cuts
            raise CapReachedError(f"{self.meter.cap_reached()} while the dead-man switch was being checked on "
                                  f"instance {inst.instance_id}: {status.problem}")
        if not status.allowed_unarmed:
            raise DeadmanUnarmed(f"the dead-man switch cannot act on instance {inst.instance_id}: {status.problem}. "
                                 "Without it nothing deletes the host if the harness dies, so the run stops here "
                                 "(--allow-unarmed-deadman runs anyway and records it)")
        self.out.warn(status.line())

    def _read_deadman_log(self) -> None:
        """The switch's log (every attempt it made) into the evidence, read once more at teardown."""
        if self.session is None or self.deadman is None:
            return
        # Bounded by the meter's prelude deadline too: the DELETE keeps its half of the teardown margin. After a
        # signal the DELETE goes first: the tail the check read stands.
        signalled = self.guard is not None and self.guard.received is not None
        timeout_s = 0.0 if signalled else min(DEADMAN_LOG_READ_S, self.meter.prelude_deadline() - self.clock())
        text = (read_log(self.session, timeout_s=timeout_s) if self.session.is_active() and timeout_s > 0 else "") \
            or self.deadman.log_tail
        self.ev.guarded("deadman.log", lambda: (self.ev.dir / "deadman.log").write_text(text + "\n", encoding="utf-8"))

    # ---------------------------------------------------------------------------------- host work
    # The phases on the host (hostwork.py); thin here so the run reads top to bottom in `execute`.
    def _upload(self, bundle: Bundle) -> None:
        assert self.work is not None
        self.work.upload(bundle)

    def _run_steps(self) -> None:
        assert self.work is not None
        self.work.run_steps()

    def _pull_evidence(self, *, in_teardown: bool) -> None:
        if self.work is not None:
            signalled = in_teardown and self.guard is not None and self.guard.received is not None
            self.work.pull_evidence(in_teardown=in_teardown, max_s=TeardownBudget.SIGNAL_PULL_MAX_S if signalled else None)

    @property
    def steps(self) -> list[StepRecord]:
        return self.work.steps if self.work else []

    @property
    def pull(self) -> PullRecord | None:
        return self.work.pull if self.work else None

    # ---------------------------------------------------------------------------------- teardown
    def accrued_usd(self) -> float:
        return self.meter.accrued_usd()

    def _teardown_one(self, inst: CreatedInstance) -> InstanceTeardown:
        guard_ack = self.cap_guard.claim(inst.instance_id)  # from here the guard leaves it to us
        deadline = self.clock() + self.teardown_budget_s
        # A full disk must not stop a DELETE or its proof: the ledger records a failed write and goes on.
        report = teardown_instance(self.client, self.ledger, run_id=self.run_id, label=inst.label,
                                   instance_id=inst.instance_id, interval_s=self.spec.proof_interval_s,
                                   deadline=deadline, created_mono=inst.t_created_mono,
                                   lag_window_s=self.read_lag_window_s, seen=inst.seen, clock=self.clock,
                                   land_by_mono=self.meter.hard_deadline(),
                                   while_deleting=lambda: self.reads.watch_while_deleting(inst),
                                   first_ack=guard_ack)
        seen_before, inst.seen = inst.seen, report.seen
        acks = [d for d in report.deletes if d.acknowledged]
        ours = [d for d in acks if d.outcome == "deleted"]  # a DELETE of ours that deleted it
        # "Already gone" is someone else's delete only for an instance a read had shown and that none of our
        # DELETEs then deleted: a not-found answer while reads still lag the create is not (red team, 2026-12-01).
        if acks and acks[0].outcome == "already_gone" and seen_before and not ours:
            self.reads.vanished(inst, "our first DELETE found it already gone")
        if acks:  # billing ends at the DELETE that deleted it (else at the first that found it gone)
            inst.t_deleted_mono = (ours or acks)[0].t_ack_mono or self.clock()
            self.meter.stop_instance(inst.instance_id, inst.t_deleted_mono)
        inst.absence = report.verdict
        self.book.torn_down(report)
        return report

    def _write_failures(self) -> list[str]:
        """Every evidence or ledger write that did not reach the disk (each keeps its own list of them)."""
        return self.ev.write_failures + [f"ledger {f}" for f in self.ledger.write_failures]

    def _finish(self, code: ExitCode, message: str, key: RunKey | None) -> tuple[ExitCode, str]:
        # "May still bill" is decided by `_verdict` from the teardowns and the sweep, not by the error that
        # stopped the run: a create of unknown outcome that the sweep then finds and deletes is a failure.
        if code == ExitCode.NOT_PROVEN_GONE:
            code = ExitCode.FAILED
        # "After the last step" counts from the step's end when one ran (evidence pull included), else from now.
        t_last_step_end = (self.work and self.work.t_last_step_end_mono) or self.clock()
        self._cancelled_price_reads()
        self._pull_evidence(in_teardown=True)
        self._read_deadman_log()
        if self.session is not None:
            self.session.close()  # transport first: a stalled link cannot hold this
        start = self.clock()
        self.phases.start("teardown")
        if self.book.created:
            self.out.info("tearing down: deleting every instance of this run and proving it absent…")
        for inst in self.book.pending():
            report = self._teardown_one(inst)
            acks = [d.t_ack_mono for d in report.deletes if d.acknowledged and d.t_ack_mono]
            if acks:  # to the DELETE's acknowledgement, not to the end of the absence proof
                self.timings.setdefault("delete_ack_after_last_step_s", round(acks[0] - t_last_step_end, 3))
            if report.proof and report.proof.rounds and acks:
                self.timings.setdefault("absence_proven_after_delete_s",
                                        round(report.proof.rounds[-1].t_mono - acks[0], 3))
        self.cap_guard.stop()
        self._sweep_labels()
        self.timings["teardown_s"] = round(self.clock() - start, 3)
        if key is not None:
            key.delete()
        code, message = self._with_guard(code, message, after_outcome=True)  # it may have fired in the prelude
        outcome = (code, message)  # the run's own; the verdict adds what the teardown and the writes say
        code, message = self._verdict(*outcome)
        self.phases.end()
        self.timings["total_s"] = round(self.clock() - self.t0, 3)
        self.ev.write_result(self._record(code, message), self.teardowns, self.spec.proof_interval_s)
        final = self._verdict(*outcome)  # those writes may have failed too: each one is named
        if final != (code, message):  # then the result file says what the process says, or is not there
            written, (code, message) = code, final
            if not self.ev.rewrite_result(self._record(code, message)):
                self.out.warn(f"removed {self.ev.dir / 'harness-result.json'}: it said exit {int(written)} "
                              f"and could not be rewritten")
        report_path = write_run_report_safely(self.ev.dir, self.out.warn)
        self.out.stop_view()
        self.out.result(self.run_id, code, message, self.ev.dir, self.steps, self.teardowns, self.accrued_usd(),
                        report=report_path)
        return code, message

    def _verdict(self, code: ExitCode, message: str) -> tuple[ExitCode, str]:
        """The exit code from what is known: unproven teardown beats a cap overrun beats lost evidence."""
        unproven = self.book.unproven()
        if unproven:
            if code != ExitCode.NOT_PROVEN_GONE:
                message = (f"teardown NOT proven for instance(s) {unproven}: they may still bill. "
                           f"The ledger names them; run `vast-e2e reap`. ({message})")
            return ExitCode.NOT_PROVEN_GONE, message
        if self.book.unresolved:  # a create that may yet appear: the ledger's create_unresolved names it
            if code != ExitCode.NOT_PROVEN_GONE:
                message = (f"create outcome unknown for label(s) {sorted(self.book.unresolved)}: an instance "
                           f"may appear and bill. Run `vast-e2e reap`, which keeps looking for them. ({message})")
            return ExitCode.NOT_PROVEN_GONE, message
        if self.book.vanished and "deleted by someone else" not in message:
            who = "; ".join(f"instance {i} was deleted by someone else: no DELETE of ours ({how})"
                            for i, how in sorted(self.book.vanished.items()))
            code = ExitCode.FAILED if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) else code
            message = f"{who}; proven absent since ({message})"
        over = self.meter.over_cap()
        # over a cap is never a pass, nor hidden behind a failure: a signal, bad input or no offer keep theirs
        if over and code in (ExitCode.PASSED, ExitCode.FAILED, ExitCode.UNQUALIFIED_DRIVER):
            return ExitCode.CAP_REACHED, f"over the cap: {over} ({message})"
        failures = self._write_failures()
        if failures and code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER):
            more = failures[3:]  # named all the same: the record itself may be one of the writes that failed
            rest = f"; and {len(more)} more: {', '.join(f.split(':', 1)[0] for f in more)}" if more else ""
            return ExitCode.FAILED, (f"the instance is deleted and proven absent, but {len(failures)} evidence/ledger "
                                     f"write(s) failed, so the evidence is incomplete: {'; '.join(failures[:3])}"
                                     f"{rest} ({message})")
        if code == ExitCode.UNQUALIFIED_DRIVER and self.spec.unqualified_ok:  # driver_qualified: false stays
            return ExitCode.PASSED, f"{message} (exit 0 by --unqualified-ok)"
        return code, message

    def _record(self, code: int, message: str) -> RunRecord:
        spec, plan = self.spec, self.plan
        cand = self.candidate or (plan.chosen if plan else None)
        workload_s = sum(s.seconds for s in self.steps if s.workload)
        return RunRecord(
            run_id=self.run_id, profile=spec.profile.name, image=spec.profile.image, api_url=spec.api_url,
            sim=spec.sim, offer=plan.offer_summary() if plan else None,
            driver_qualified=cand.driver_qualified if cand else None, any_driver=spec.any_driver,
            caps=RecordCaps(max_usd=spec.caps.max_usd, max_minutes=spec.caps.max_minutes,
                            teardown_margin_s=spec.teardown_margin_s,
                            minimum_cap_s=minimum_cap_s(spec.timings)),
            worst_case_usd=cand.quote.worst_case_usd if cand else None,
            accrued_usd=round(self.meter.accrued_usd(), 6), over_cap=self.meter.over_cap(),
            bytes=ByteCounts(uploaded=self.meter.bytes_up, downloaded=self.meter.bytes_down),
            bundle_sha256=plan.bundle_sha256 if plan else None,
            host_key=(HostKeyRecord(fingerprint=self.session.host_key_fingerprint, type=self.session.host_key_type,
                                    endpoint=str(self.session.endpoint)) if self.session else None),
            remote_env=spec.shown_remote_env, remote_secrets=sorted(spec.remote_secrets),
            instances=[i.recorded() for i in self.book.created],
            price_changes=[p.model_copy() for p in self.meter.price_changes],
            steps=self.steps, pull=self.pull,
            timings=self.timings | {"workload_steps_s": round(workload_s, 3)},
            phases=[r.model_copy() for r in self.phases.records],
            absence=overall_absence(self.teardowns, self.book.unresolved), api_calls=dataclasses.asdict(self.client.stats),
            evidence_write_failures=self._write_failures(),
            deadman=self.deadman.model_dump() if self.deadman else None,
            image_sent=spec.profile.image_ref.create_form,
            image_expect_override=spec.image_expect_override.model_dump() if spec.image_expect_override else None,
            exit_code=code, message=message,
            harness={"python": sys.version.split()[0], "platform": platform.platform()},
        )

    def _sweep_labels(self) -> None:
        """Catch what the run did not know it created (a create whose answer was lost or interrupted, a 5xx
        that created, an instance that appeared late): every label this run sent, scanned once the read-lag
        window after its create has passed (bounded by the teardown budget)."""
        book = self.book
        known = book.known_ids()
        sent = book.attempts
        # Only labels a PUT was sent for (each attempt is recorded before its PUT): none sent, nothing to find.
        give_up = self.clock() + self.teardown_budget_s
        for label in sorted(book.labels()):
            ready_at = sent.get(label, 0.0) + self.read_lag_window_s
            wait_s = min(ready_at - self.clock(), give_up - self.clock())
            if wait_s > 0:
                time.sleep(wait_s)
            found = find_by_label(self.client, label, attempts=2, wait_s=self.spec.proof_interval_s, sleep=time.sleep,
                                  clock=self.clock, give_up_mono=give_up)
            if found:
                book.settle(label)
            for instance_id in found:
                if instance_id not in known:
                    self.out.warn(f"found instance {instance_id} with this run's label {label}; deleting it")
                    self.ledger.append(self.run_id, "created", label, instance_id=instance_id, detail="found by sweep")
                    # It billed from its PUT at its offer's price (the instance's own, when a read gives one).
                    offer_id, dph_usd = book.offers.get(label, (-1, 0.0))
                    with contextlib.suppress(VastError):
                        read = self.client.get_instance(instance_id, max_retry_s=STRAY_PRICE_READ_S)
                        if read is not None and read.dph_total:
                            dph_usd = read.dph_total
                    stray = CreatedInstance(instance_id=instance_id, label=label, offer_id=offer_id, machine_id=None,
                                            dph_usd=dph_usd, t_created_mono=sent.get(label, self.t0),
                                            status="found by label", seen=True)
                    book.rented(stray)
                    self.meter.start_instance(instance_id, dph_usd, stray.t_created_mono)
                    self._teardown_one(stray)
                    known.add(instance_id)


def run_guarded(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output) -> HarnessResult:
    return GuardedRun(spec, client, drivers, out).execute()
