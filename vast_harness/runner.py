"""The guarded run of docs/architecture.md, read top to bottom in `GuardedRun.execute`.

Whatever happens after the first create (an error, a cap, Ctrl-C, SIGTERM, SIGHUP), the `finally` block
pulls what evidence it can, deletes every instance this run created, proves each absent, and only then
decides the exit code: 3 beats everything when any instance is not proven gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from pydantic import BaseModel

from vast_harness.bundle import Bundle, build_bundle
from vast_harness.client import VastClient
from vast_harness.config import LABEL_PREFIX, DriverPolicy, RunSpec, check_evidence_dir
from vast_harness.errors import (
    AuthError,
    CapReachedError,
    ConfigError,
    HarnessError,
    LedgerWriteError,
    NoOfferError,
    StepFailedError,
    VastError,
)
from vast_harness.evidence import (
    CreatedInstance,
    PullRecord,
    RunEvidence,
    RunRecord,
    StepLog,
    StepRecord,
    overall_absence,
)
from vast_harness.ledger import Ledger, new_run_id
from vast_harness.lifecycle import (
    READ_LAG_WINDOW_S,
    SIM_READ_LAG_WINDOW_S,
    BootFailed,
    CreateUnresolved,
    InstanceTeardown,
    create,
    find_by_label,
    teardown_instance,
    wait_ready,
)
from vast_harness.meter import CostMeter, finite_positive, minimum_cap_s, teardown_budget_s
from vast_harness.models import Instance
from vast_harness.offers import Candidate
from vast_harness.onstart import build_onstart
from vast_harness.output import Output
from vast_harness.plan import RunPlan, choose_offers, plan_run
from vast_harness.report import write_run_report_safely
from vast_harness.ssh import (
    HostSession,
    RunKey,
    SshConnectError,
    StepOutcome,
    TransferAbandoned,
    endpoints_for,
    generate_run_key,
)

REMOTE_DIR = "vh"  # under the host's $HOME
MAX_UNAVAILABLE_REPICKS = 3
# A boot failure that says the offer was sold twice (Vast accepts both buys; one container cannot bind its
# ports): the offer was taken, like no_such_ask, so it costs a re-pick, not one of the boot retries.
_OFFER_CONFLICT_WORDS = ("port is already allocated", "already rented", "no longer available")
NULL_GRACE_S = 60.0  # reads lag creates: tolerate `instances: null` this long after create
# The evidence pull: never longer than this, never more bytes than this (and never more than the cap affords).
PULL_MAX_S = 600.0
PULL_MAX_BYTES = 1 << 30
# In teardown the pull may spend this share of the teardown margin past the work deadline (at most the
# cap): the rest of the margin belongs to DELETE and the absence proof, which a pull never delays.
PULL_GRACE_SHARE = 0.25
PULL_GRACE_MAX_S = 30.0
# An SFTP channel with no byte for this long (a share of the margin, 1-30 s) is a stalled link: closed.
SFTP_STALL_MAX_S = 30.0
# How often (in printed bytes) a step's output re-asks the meter: printed bytes are billed bandwidth.
_METER_EVERY_BYTES = 1 << 20


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP during the run. A BaseException so no `except Exception` can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunCancelled(HarnessError):
    """`GuardedRun.cancel` was called (a fleet's total cap, or a signal the fleet received): stop and tear down."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


class HarnessResult(BaseModel):
    run_id: str
    exit_code: int
    message: str = ""


class _SignalGuard:
    """First signal interrupts the run; any signal during teardown only says teardown is in progress."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, out: Output) -> None:
        self.out = out
        self.in_teardown = False
        self.received: int | None = None
        self.hurry = False  # a signal during teardown: abandon the evidence pull, go straight to DELETE
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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
            signal.signal(sig, handler)  # type: ignore[arg-type]


class _TeardownLedger:
    """The ledger as teardown uses it: an append that fails (disk full) is recorded, never raised."""

    def __init__(self, ledger: Ledger, failures: list[str]) -> None:
        self._ledger, self._failures = ledger, failures

    def append(self, run_id: str, event, label: str, **fields):
        try:
            return self._ledger.append(run_id, event, label, **fields)
        except OSError as exc:
            self._failures.append(f"ledger {event} for {fields.get('instance_id', label)}: {exc.strerror or exc}")
            return None


class GuardedRun:
    def __init__(self, spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, *,
                 run_id: str | None = None) -> None:
        self.spec, self.client, self.drivers, self.out = spec, client, drivers, out
        self.run_id = run_id or new_run_id()
        self.ledger = Ledger.for_spec(spec)
        self.ev = RunEvidence(spec.evidence_dir / self.run_id)
        self.t0 = time.monotonic()
        self.created: list[CreatedInstance] = []
        self.teardowns: list[InstanceTeardown] = []
        self.steps: list[StepRecord] = []
        self.timings: dict[str, float] = {}
        self.session: HostSession | None = None
        self.plan: RunPlan | None = None
        self.candidate: Candidate | None = None
        # The one clock: every phase asks it for its deadline; it turns both caps into one.
        self.meter = CostMeter(max_usd=spec.caps.max_usd, max_seconds=spec.max_seconds,
                               teardown_margin_s=spec.teardown_margin_s, t0=self.t0)
        self.evidence_pulled = False
        self.pull: PullRecord | None = None
        self.guard: _SignalGuard | None = None
        self.ledger_write_failures: list[str] = []
        self.t_last_step_end_unix: float | None = None
        self.excluded_machines: set[int] = set()
        # How long one instance's delete + absence proof may take before it is declared unproven (exit 3).
        self.teardown_budget_s = teardown_budget_s(spec.proof_interval_s)
        # Reads may not see an instance this long after its create (lifecycle.READ_LAG_WINDOW_S).
        self.read_lag_window_s = SIM_READ_LAG_WINDOW_S if spec.sim else READ_LAG_WINDOW_S
        self.create_attempts: list[tuple[str, float]] = []  # (label, t_unix the PUT was sent)
        self.unresolved_labels: set[str] = set()  # creates whose outcome no read has settled
        # Set by `cancel` from another thread; checked wherever the cap deadline is, and by a running step.
        self.cancelled = threading.Event()
        self.cancel_reason, self.cancel_exit_code = "", 6

    def cancel(self, reason: str, *, exit_code: int = 6) -> None:
        """Thread-safe: stop at the next phase boundary (a running step within its poll interval), then the
        usual teardown. exit_code 6 for a cap, 130 for a signal. A run that already finished is unaffected."""
        if not self.cancelled.is_set():
            self.cancel_reason, self.cancel_exit_code = reason, exit_code
            self.cancelled.set()

    def _check_cancelled(self, *_: object) -> None:
        if self.cancelled.is_set():
            raise RunCancelled(f"cancelled: {self.cancel_reason}", self.cancel_exit_code)

    # ------------------------------------------------------------------------------------------- run
    def execute(self) -> HarnessResult:
        guard = self.guard = _SignalGuard(self.out)
        code, message = 1, ""
        key: RunKey | None = None
        with guard, tempfile.TemporaryDirectory(prefix=self.ledger.key_dir_prefix(self.run_id)) as key_dir:
            try:
                self._check_minimum_cap()
                check_evidence_dir(self.spec.evidence_dir)  # a full or read-only evidence dir: rent nothing
                bundle = build_bundle()
                self.plan = self._timed("plan", lambda: plan_run(self.spec, self.client, self.drivers, bundle))
                self.ev.write_json("offer-quote.json", self.plan.summary())
                if self.ev.write_failures:  # a full or read-only evidence dir: rent nothing
                    raise ConfigError(f"--evidence-dir {self.ev.dir} cannot be written "
                                      f"({'; '.join(self.ev.write_failures)}): nothing rented")
                self._check_cancelled()
                key = generate_run_key(Path(key_dir))
                self._rent_and_connect(key)
                self._timed("upload", lambda: self._upload(bundle))
                with self._price_watch():
                    self._run_steps()
                self._pull_evidence(in_teardown=False)
                qualified = self.candidate.driver_qualified if self.candidate else False
                code, message = (0, "passed") if qualified else (4, "passed on a driver outside the qualified list")
            except Interrupted as exc:
                code, message = 130, f"interrupted by {exc}"
            except NoOfferError as exc:
                code, message = exc.exit_code, str(exc)
                if exc.rejected:
                    self.out.rejections(exc.rejected, title="Closest offers and why each was rejected")
            except (ConfigError, AuthError) as exc:
                code, message = 2, str(exc)
            except RunCancelled as exc:
                code, message = exc.exit_code, str(exc)
            except CapReachedError as exc:
                code, message = 6, str(exc)
            except (StepFailedError, BootFailed, SshConnectError) as exc:
                code, message = 1, str(exc)
            except (VastError, HarnessError) as exc:
                code, message = 1, str(exc)
            except Exception as exc:  # a bug must still end in teardown and an exit code, never past them
                code, message = 1, f"unexpected {type(exc).__name__}: {exc}"
            finally:
                guard.in_teardown = True
                code, message = self._finish(code, message, key)
        return HarnessResult(run_id=self.run_id, exit_code=code, message=message)

    def _check_minimum_cap(self) -> None:
        minimum_s = minimum_cap_s(teardown_margin_s=self.spec.teardown_margin_s, sim=self.spec.sim)
        if self.spec.max_seconds < minimum_s:
            raise ConfigError(
                f"--max-minutes {self.spec.caps.max_minutes:g} cannot cover boot and teardown: the minimum is "
                f"{minimum_s / 60:.3g} min ({minimum_s - self.spec.teardown_margin_s:g} s to boot + "
                f"{self.spec.teardown_margin_s:g} s teardown margin); nothing rented")

    # The meter's figures under the names the chaos suite and the evidence read.
    @property
    def cap_deadline(self) -> float:
        return self.meter.work_deadline()

    @property
    def bytes_up(self) -> int:
        return self.meter.bytes_up

    @property
    def bytes_down(self) -> int:
        return self.meter.bytes_down

    def _timed(self, name: str, fn):
        start = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[f"{name}_s"] = round(time.monotonic() - start, 3)

    # ------------------------------------------------------------------------------- rent + connect
    def _candidates(self):
        assert self.plan is not None
        for cand in [self.plan.chosen, *self.plan.alternatives]:
            self.meter.check("renting")  # each create asks the clock first
            yield cand
        # The plan's list ran out: search again, excluding machines that failed to boot in this run.
        try:
            credit = self.client.current_user().available_usd
            choice = choose_offers(self.spec, self.client, self.drivers, build_bundle(), credit_usd=credit,
                                   exclude_machine_ids=self.excluded_machines)
        except NoOfferError:
            return
        for cand in choice.ranked:
            self.meter.check("renting")
            yield cand

    def _rent_and_connect(self, key: RunKey) -> None:
        boots_left = self.spec.boot_retries + 1
        repicks_left = MAX_UNAVAILABLE_REPICKS
        tried: set[int] = set()
        start = time.monotonic()

        def repick(why: str) -> None:
            nonlocal repicks_left
            repicks_left -= 1
            if repicks_left < 0:
                if self.created:
                    raise BootFailed(f"every further offer was taken or refused before it could be rented ({why})")
                raise NoOfferError(f"every offer tried was taken or refused before it could be rented ({why})")

        for cand in self._candidates():
            if cand.offer.id in tried or cand.offer.machine_id in self.excluded_machines:
                continue
            tried.add(cand.offer.id)
            self._check_cancelled()
            # One label per create attempt, so a late instance of an earlier attempt is told apart.
            n = len(self.create_attempts)
            label = LABEL_PREFIX + self.run_id + (f"-r{n}" if n else "")
            inst = self._create(cand, label, key)
            if isinstance(inst, str):
                repick(inst)
                continue
            try:
                if inst.status == "created_with_error":
                    raise BootFailed(f"create answered an error but created instance {inst.instance_id} "
                                     f"(stopped, billing storage): {inst.detail}")
                self._boot(inst, key)
                self.candidate = cand
                self.timings["rent_and_connect_s"] = round(time.monotonic() - start, 3)
                return
            except (BootFailed, SshConnectError) as exc:
                self.out.warn(f"instance {inst.instance_id} did not come up: {exc}")
                self._teardown_one(inst)
                if inst.machine_id is not None:
                    self.excluded_machines.add(inst.machine_id)
                if any(w in str(exc).lower() for w in _OFFER_CONFLICT_WORDS):
                    repick(f"offer {cand.offer.id} was sold twice: {exc}")
                    continue
                boots_left -= 1
                if boots_left <= 0:
                    raise BootFailed(f"no host came up after {self.spec.boot_retries + 1} attempt(s): {exc}") from None
        if self.created:  # something was rented (and deleted): "nothing rented" (exit 5) would be untrue
            raise BootFailed("no further offer to try after boot failures")
        raise NoOfferError("no further offer to try after boot failures")

    def _create(self, cand: Candidate, label: str, key: RunKey) -> CreatedInstance | str:
        """The created instance, or why nothing was created (the caller tries the next offer). An unknown
        outcome that no read settles raises CreateUnresolved (exit 3 unless the final sweep finds it)."""
        deadman_s = int(self.spec.max_seconds + self.spec.deadman_grace_s)
        body = {
            "client_id": "me",
            "image": self.spec.profile.image,
            "disk": self.spec.profile.disk_gb,
            "label": label,
            "runtype": "ssh_direct",
            "onstart": build_onstart(public_key=key.public_openssh, api_url=self.spec.api_url,
                                     deadman_after_s=deadman_s),
            "cancel_unavail": True,
            "target_state": "running",
        }
        self.out.info(f"renting offer {cand.offer.id} ({cand.offer.num_gpus}x {cand.offer.gpu_name}, "
                      f"${cand.quote.dph_at_disk_usd:.3f}/h) as {label}")
        self.create_attempts.append((label, time.time()))
        self.unresolved_labels.add(label)  # until an answer or a read settles it (an interrupt leaves it)
        try:
            outcome = create(self.client, self.ledger, run_id=self.run_id, label=label, offer_id=cand.offer.id,
                             body=body, lag_wait_s=max(self.spec.poll_s, 0.2), lag_window_s=self.read_lag_window_s)
        except LedgerWriteError:  # the intent never reached the disk, so no PUT was sent: nothing to look for
            self.unresolved_labels.discard(label)
            self.create_attempts.pop()
            raise
        if outcome.status == "unresolved":
            raise CreateUnresolved(f"create of offer {cand.offer.id} has an unknown outcome: {outcome.detail}",
                                   label=label)
        self.unresolved_labels.discard(label)
        if outcome.instance_id is None:
            self.out.warn(f"offer {cand.offer.id}: nothing rented ({outcome.status}): {outcome.detail}")
            return f"offer {cand.offer.id}: {outcome.status}: {outcome.detail[:200]}"
        inst = CreatedInstance(instance_id=outcome.instance_id, label=label, offer_id=cand.offer.id,
                               machine_id=cand.offer.machine_id, dph_usd=cand.quote.dph_at_disk_usd,
                               t_created_mono=time.monotonic(), status=outcome.status, detail=outcome.detail[:300])
        self.created.append(inst)
        self._start_meter(inst, cand)  # the money clock starts now, at this offer's price
        return inst

    def _start_meter(self, inst: CreatedInstance, cand: Candidate) -> None:
        q = cand.quote
        self.meter.set_transfer(inet_down_cost_usd_per_gb=cand.offer.inet_down_cost_usd_per_gb,
                                inet_up_cost_usd_per_gb=cand.offer.inet_up_cost_usd_per_gb,
                                expected_up_bytes=int(q.upload_gb * 1e9), expected_down_bytes=int(q.download_gb * 1e9))
        self.meter.start_instance(inst.instance_id, inst.dph_usd, inst.t_created_mono)

    @contextlib.contextmanager
    def _price_watch(self):
        """While the steps run, re-read the rented instance's price every poll interval (hosts re-price running
        contracts): a higher price re-prices the meter; one that breaks the cap, or moves the work deadline into
        the past, cancels the run (exit 6) and the running step is cut."""
        inst = self.created[-1] if self.created else None
        stop = threading.Event()

        def watch() -> None:
            while inst is not None and not stop.wait(self.spec.poll_s):
                try:
                    read = self.client.get_instance(inst.instance_id)
                except VastError:
                    continue  # a failed read changes nothing: the known price stands
                try:
                    self._on_instance_read(inst, read)
                    if time.monotonic() >= self.meter.work_deadline():
                        raise CapReachedError(f"instance {inst.instance_id} now bills ${inst.dph_usd:.4f}/h: "
                                              "the cap is reached")
                except CapReachedError as exc:
                    self.cancel(str(exc), exit_code=6)
                    return

        thread = threading.Thread(target=watch, name=f"vh-price-{self.run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5.0)

    def _on_poll(self, inst: CreatedInstance, read: Instance | None) -> None:
        self._check_cancelled()
        self._on_instance_read(inst, read)

    def _on_instance_read(self, inst: CreatedInstance, read: Instance | None) -> None:
        """Every per-id read of the rented instance: its own price replaces the search's when higher."""
        if read is None or read.dph_total is None:
            return  # no price sent: the search's stands
        if finite_positive(read.dph_total) and read.dph_total > inst.dph_usd:
            self.out.warn(f"instance {inst.instance_id} bills ${read.dph_total:.4f}/h, not the "
                          f"${inst.dph_usd:.4f}/h the search showed: the cap deadline moves earlier")
            inst.dph_usd = read.dph_total
        self.meter.reprice(inst.instance_id, read.dph_total)  # raises CapReachedError when it breaks the cap

    def _boot(self, inst: CreatedInstance, key: RunKey) -> None:
        boot_deadline = self.meter.deadline(self.spec.profile.boot_timeout_s)
        try:
            ready = wait_ready(self.client, inst.instance_id, deadline=boot_deadline, poll_s=self.spec.poll_s,
                               null_grace_s=NULL_GRACE_S, on_poll=lambda read: self._on_poll(inst, read))
            self._on_instance_read(inst, ready)
            self._check_cancelled()
            # The price may have moved the deadline: SSH gets what is left of the boot's, never more.
            boot_deadline = min(boot_deadline, self.meter.deadline())
            self.out.info(f"instance {inst.instance_id} running; connecting over SSH")
            self.session = HostSession.connect(endpoints_for(ready), key, deadline_monotonic=boot_deadline,
                                               retry_wait_s=min(2.0, max(self.spec.poll_s, 0.2)))
            self.session.stall_timeout_s = min(SFTP_STALL_MAX_S, max(1.0, PULL_GRACE_SHARE * self.spec.teardown_margin_s))
        except (BootFailed, SshConnectError) as exc:
            # When the cap, not the boot timeout, cut the wait, the run stopped at its cap (exit 6): trying
            # another host would only spend past it.
            if time.monotonic() >= self.meter.work_deadline() - 0.05:
                raise CapReachedError(f"cap reached while instance {inst.instance_id} was booting: {exc}") from exc
            raise

    # ---------------------------------------------------------------------------------- host work
    def _upload(self, bundle: Bundle) -> None:
        assert self.session is not None
        self._check_cancelled()
        self.meter.check("the upload")
        deadline = self.meter.deadline()
        if bundle.size_bytes > self.meter.affordable_up_bytes(deadline):
            raise CapReachedError(f"the {bundle.size_bytes}-byte bundle would cost more than the cap leaves")
        reported = [0]

        def progress(done: int, total: int) -> None:
            self.meter.add_bytes(up=done - reported[0])
            reported[0] = done

        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as fh:
            fh.write(bundle.data)
            fh.flush()
            try:
                sent = self.session.put(Path(fh.name), "vh-bundle.tar.gz", on_progress=progress, deadline=deadline)
            except TransferAbandoned as exc:
                raise CapReachedError(f"cap reached during the upload ({reported[0]} of {bundle.size_bytes} "
                                      f"bytes sent): {exc}") from exc
        self.meter.add_bytes(up=max(0, sent - reported[0]))
        self.meter.check("unpacking the bundle")
        outcome = self.session.run(
            f"rm -rf ~/{REMOTE_DIR} && mkdir -p ~/{REMOTE_DIR}/evidence && tar -xzf ~/vh-bundle.tar.gz -C ~/{REMOTE_DIR}"
            f" && echo \"bundle sha256 $(sha256sum ~/vh-bundle.tar.gz | cut -c1-64)\"",
            on_line=lambda stream, line: self.out.info(f"[setup] {line}"),
            timeout_s=max(0.05, self.meter.deadline(120.0) - time.monotonic()),
        )
        if outcome.timed_out and time.monotonic() >= self.meter.work_deadline() - 0.05:
            raise CapReachedError("cap reached while unpacking the bundle")
        if not outcome.ok:
            raise StepFailedError(f"unpacking the bundle failed: rc={outcome.rc} {outcome.detail}", step="setup")

    def _step_printer(self, name: str, log: StepLog, started: float, scrub: list[str]):
        """The step's on_line: capped log, live console for the log's head, bytes into the meter."""
        state = {"unmetered": 0, "said_cut": False}

        def on_line(stream: str, line: str) -> None:
            for value in scrub:  # a --remote-env value a step prints is neither logged nor shown
                line = line.replace(value, "***")
            shown = log.write(line)
            state["unmetered"] += len(line) + 1
            if shown:
                self.out.step_line(name, time.monotonic() - started, self.meter.accrued_usd(), stream, line)
            elif not state["said_cut"]:
                state["said_cut"] = True
                self.out.warn(f"step {name}: output past {self.ev.step_log_head_bytes} bytes is no longer shown; "
                              "its log keeps the last part")
            if state["unmetered"] >= _METER_EVERY_BYTES:
                # Printed bytes leave the host and are billed: they can move the money deadline earlier.
                self.meter.add_bytes(down=state["unmetered"])
                state["unmetered"] = 0
                if time.monotonic() >= self.meter.work_deadline():
                    raise CapReachedError(f"step {name} stopped at the cap (its output is billed bandwidth)")

        def settle() -> None:
            self.meter.add_bytes(down=state["unmetered"])
            state["unmetered"] = 0

        return on_line, settle

    def _run_steps(self) -> None:
        assert self.session is not None
        # VH_MASKED_ENV names the --remote-env variables whose values host-side evidence must mask
        env = dict(self.spec.remote_env) | {"VH_RUN_ID": self.run_id, "VH_MASKED_ENV": " ".join(self.spec.remote_env)}
        # longest first; values under 4 characters ("1", "on") would blank ordinary output and stay visible
        scrub = sorted({v for v in self.spec.remote_env.values() if len(v) >= 4}, key=len, reverse=True)
        for step in self.spec.profile.steps:
            self._check_cancelled()
            self.meter.check(f"step {step.name}")
            started = time.monotonic()
            timeout = max(0.05, self.meter.deadline(step.timeout_s) - started)
            log = self.ev.step_log(step.name)
            on_line, settle = self._step_printer(step.name, log, started, scrub)
            self.out.info(f"step {step.name} (timeout {timeout:.0f} s)")
            cut: CapReachedError | None = None
            try:
                outcome = self.session.run(f"cd ~/{REMOTE_DIR} && {step.run}", on_line=on_line, timeout_s=timeout,
                                           env=env, stop=self.cancelled)
            except CapReachedError as exc:  # raised from inside the drain: the channel is closed already
                cut = exc
                outcome = StepOutcome(rc=None, seconds=time.monotonic() - started, timed_out=True, detail=str(exc))
            finally:
                settle()
                log.close()
            record = StepRecord(name=step.name, rc=outcome.rc, seconds=round(outcome.seconds, 3),
                                timed_out=outcome.timed_out, connection_lost=outcome.connection_lost,
                                workload=step.workload, detail=outcome.detail, log_bytes=log.total_bytes,
                                log_dropped_bytes=log.dropped_bytes)
            if outcome.connection_lost and not self.cancelled.is_set():
                record.reconnect_ok = self.session.reconnect_probe()
            self.steps.append(record)
            self.t_last_step_end_unix = time.time()
            self.ev.append_step_tsv(record.name, record.rc, record.seconds)
            if cut is not None:
                raise cut
            self._check_cancelled()
            if outcome.timed_out and (timeout < step.timeout_s or time.monotonic() >= self.meter.work_deadline()):
                raise CapReachedError(f"step {step.name} stopped at the cap (time/cost) after {outcome.seconds:.0f} s")
            if outcome.timed_out:
                raise StepFailedError(f"step {step.name} timed out after {step.timeout_s:g} s", step=step.name)
            if outcome.connection_lost:
                raise StepFailedError(f"step {step.name}: connection lost ({outcome.detail}); reconnect "
                                      f"{'succeeded' if record.reconnect_ok else 'failed'}; not re-run",
                                      step=step.name)
            if outcome.rc != 0:
                raise StepFailedError(f"step {step.name} failed with rc={outcome.rc}", step=step.name, rc=outcome.rc)

    def _pull_evidence(self, *, in_teardown: bool) -> None:
        """Pull the host's evidence with a deadline and a size budget, both from the meter.

        In the run, a pull the cap cuts is a cap stop (exit 6). In teardown it is best effort: it may use a
        share of the teardown margin, a signal abandons it, and it never delays the DELETE beyond that.
        """
        if self.evidence_pulled or self.session is None or not self.session.is_active():
            return
        if not in_teardown:
            self.meter.check("the evidence pull")  # before marking it done: the teardown still tries, briefly
        self.evidence_pulled = True
        start = time.monotonic()
        work_deadline = self.meter.work_deadline(start)
        if in_teardown:
            grace_s = min(PULL_GRACE_MAX_S, PULL_GRACE_SHARE * self.spec.teardown_margin_s)
            deadline = min(start + PULL_MAX_S, max(work_deadline, start) + grace_s,
                           self.meter.hard_deadline(start) - 0.5 * self.spec.teardown_margin_s)
        else:
            deadline = min(start + PULL_MAX_S, work_deadline)
        affordable = self.meter.affordable_down_bytes(deadline)
        budget = min(float(PULL_MAX_BYTES), affordable)
        self.pull = PullRecord(deadline_s=round(deadline - start, 3), max_bytes=budget)
        if deadline <= start:
            self.pull.detail = "no time left for the pull before the teardown"
            self.out.warn("no time left to pull the host's evidence; going straight to teardown")
            return
        abandon = (lambda: bool(self.guard and self.guard.hurry)) if in_teardown else None
        try:
            pulled = self.session.pull_tree(f"{REMOTE_DIR}/evidence", self.ev.dir / "remote", deadline=deadline,
                                            max_bytes=budget, on_bytes=lambda n: self.meter.add_bytes(down=n),
                                            abandon=abandon)
        except Exception as exc:  # noqa: BLE001 - evidence is best effort; the teardown must still run
            self.pull.detail = f"{type(exc).__name__}: {exc}"
            self.out.warn(f"could not pull the host's evidence: {exc}")
            return
        finally:
            self.timings["pull_s"] = round(time.monotonic() - start, 3)
        self.pull = self.pull.model_copy(update={"files": len(pulled.files), "bytes": pulled.bytes,
                                                 "skipped": pulled.skipped, "complete": pulled.complete,
                                                 "detail": pulled.detail})
        self.out.info(f"pulled {len(pulled.files)} evidence file(s), {pulled.bytes} bytes"
                      + ("" if pulled.complete else f"; incomplete: {pulled.detail}"))
        if pulled.complete or in_teardown:
            return
        if time.monotonic() >= deadline - 0.05 or (pulled.skipped and affordable < PULL_MAX_BYTES):
            raise CapReachedError(f"cap reached during the evidence pull ({len(pulled.files)} file(s) pulled, "
                                  f"{len(pulled.skipped)} left on the host): {pulled.detail}")
        if pulled.skipped:
            raise HarnessError(f"the host's evidence is over the {PULL_MAX_BYTES}-byte pull budget: "
                               f"{len(pulled.skipped)} file(s) left on the host")
        # A link that broke or stalled: the workload passed, but its evidence did not all come back.
        raise HarnessError(f"the host's evidence pull broke off ({len(pulled.files)} file(s) pulled): "
                           f"{pulled.detail}")

    # ---------------------------------------------------------------------------------- teardown
    def accrued_usd(self) -> float:
        return self.meter.accrued_usd()

    def _teardown_one(self, inst: CreatedInstance) -> InstanceTeardown:
        deadline = time.monotonic() + self.teardown_budget_s
        # A full disk must not stop a DELETE or its proof: ledger writes here are recorded when they fail.
        ledger = _TeardownLedger(self.ledger, self.ledger_write_failures)
        report = teardown_instance(self.client, ledger, run_id=self.run_id, label=inst.label,  # type: ignore[arg-type]
                                   instance_id=inst.instance_id, interval_s=self.spec.proof_interval_s,
                                   deadline=deadline, created_unix=inst.t_created_unix,
                                   lag_window_s=self.read_lag_window_s)
        acks = [d for d in report.deletes if d.acknowledged]
        if acks:
            inst.t_deleted_mono = inst.t_created_mono + max(0.0, acks[0].t_ack_unix - inst.t_created_unix)
            self.meter.stop_instance(inst.instance_id, inst.t_deleted_mono)
        inst.absence = report.verdict
        self.teardowns.append(report)
        return report

    def _write_failures(self) -> list[str]:
        """Every evidence or ledger write that did not reach the disk (the ledger records its own best-effort ones)."""
        return (self.ev.write_failures + self.ledger_write_failures
                + [f"ledger {f}" for f in self.ledger.write_failures])

    def _finish(self, code: int, message: str, key: RunKey | None) -> tuple[int, str]:
        # "After the last step" counts from the step's end when one ran (evidence pull included), else from now.
        t_last_step_end_unix = self.t_last_step_end_unix or time.time()
        self._pull_evidence(in_teardown=True)
        if self.session is not None:
            self.session.close()  # transport first: a stalled link cannot hold this
        start = time.monotonic()
        for inst in self.created:
            if not any(t.instance_id == inst.instance_id for t in self.teardowns):
                report = self._teardown_one(inst)
                acks = [d.t_ack_unix for d in report.deletes if d.acknowledged and d.t_ack_unix]
                if acks:  # to the DELETE's acknowledgement, not to the end of the absence proof
                    self.timings.setdefault("delete_ack_after_last_step_s", round(acks[0] - t_last_step_end_unix, 3))
                if report.proof and report.proof.rounds and acks:
                    self.timings.setdefault("absence_proven_after_delete_s",
                                            round(report.proof.rounds[-1].t_unix - acks[0], 3))
        self._sweep_labels()
        self.timings["teardown_s"] = round(time.monotonic() - start, 3)
        if key is not None:
            key.delete()
        code, message = self._verdict(code, message)
        self.timings["total_s"] = round(time.monotonic() - self.t0, 3)
        self.ev.write_result(self._record(code, message), self.teardowns, self.spec.proof_interval_s)
        code, message = self._verdict(code, message)  # the result file's own write may have failed
        write_run_report_safely(self.ev.dir, self.out.warn)
        self.out.result(self.run_id, code, message, self.ev.dir, self.steps, self.teardowns, self.accrued_usd())
        return code, message

    def _verdict(self, code: int, message: str) -> tuple[int, str]:
        """The exit code from what is known: unproven teardown (3) beats a cap overrun (6) beats lost evidence."""
        unproven = [t.instance_id for t in self.teardowns if t.verdict != "gone"]
        if unproven:
            if code != 3:
                message = (f"teardown NOT proven for instance(s) {unproven}: they may still bill. "
                           f"The ledger names them; run `vast-e2e reap`. ({message})")
            return 3, message
        if self.unresolved_labels:  # a create that may yet appear: the ledger's create_unresolved names it
            if code != 3:
                message = (f"create outcome unknown for label(s) {sorted(self.unresolved_labels)}: an instance "
                           f"may appear and bill. Run `vast-e2e reap`, which keeps looking for them. ({message})")
            return 3, message
        over = self.meter.over_cap()
        if over and code in (0, 1, 4):
            return 6, f"over the cap: {over} ({message})"
        failures = self._write_failures()
        if failures and code in (0, 4):
            return 1, (f"the instance is deleted and proven absent, but {len(failures)} evidence/ledger write(s) "
                       f"failed, so the evidence is incomplete: {'; '.join(failures[:3])} ({message})")
        return code, message

    def _record(self, code: int, message: str) -> RunRecord:
        spec, plan = self.spec, self.plan
        cand = self.candidate or (plan.chosen if plan else None)
        workload_s = sum(s.seconds for s in self.steps if s.workload)
        return RunRecord(
            run_id=self.run_id, profile=spec.profile.name, image=spec.profile.image, api_url=spec.api_url,
            sim=spec.sim, offer=plan.summary()["offer"] if plan else None,
            driver_qualified=cand.driver_qualified if cand else None, any_driver=spec.any_driver,
            caps={"max_usd": spec.caps.max_usd, "max_minutes": spec.caps.max_minutes,
                  "teardown_margin_s": spec.teardown_margin_s,
                  "minimum_cap_s": minimum_cap_s(teardown_margin_s=spec.teardown_margin_s, sim=spec.sim)},
            worst_case_usd=cand.quote.worst_case_usd if cand else None,
            accrued_usd=round(self.meter.accrued_usd(), 6), over_cap=self.meter.over_cap(),
            bytes={"uploaded": self.meter.bytes_up, "downloaded": self.meter.bytes_down},
            bundle_sha256=plan.bundle_sha256 if plan else None,
            host_key=({"fingerprint": self.session.host_key_fingerprint, "type": self.session.host_key_type,
                       "endpoint": str(self.session.endpoint)} if self.session else None),
            remote_env=spec.masked_remote_env,
            instances=[i.model_dump(exclude={"t_created_mono", "t_deleted_mono"}) for i in self.created],
            price_changes=[p.model_dump() for p in self.meter.price_changes],
            steps=self.steps, pull=self.pull,
            timings=self.timings | {"workload_steps_s": round(workload_s, 3)},
            absence=overall_absence(self.teardowns), api_calls=dataclasses.asdict(self.client.stats),
            evidence_write_failures=self._write_failures(),
            exit_code=code, message=message,
            harness={"python": sys.version.split()[0], "platform": platform.platform()},
        )

    def _sweep_labels(self) -> None:
        """Catch what the run did not know it created (a create whose answer was lost or interrupted, a 5xx
        that created, an instance that appeared late): every label this run sent, scanned once the read-lag
        window after its create has passed (bounded by the teardown budget)."""
        known = {t.instance_id for t in self.teardowns}
        sent = dict(self.create_attempts)
        labels = set(sent) | {i.label for i in self.created} | {LABEL_PREFIX + self.run_id}
        give_up = time.monotonic() + self.teardown_budget_s
        for label in sorted(labels):
            ready_at = sent.get(label, 0.0) + self.read_lag_window_s
            wait_s = min(ready_at - time.time(), give_up - time.monotonic())
            if wait_s > 0:
                time.sleep(wait_s)
            found = find_by_label(self.client, label, attempts=2, wait_s=self.spec.proof_interval_s, sleep=time.sleep)
            if found:
                self.unresolved_labels.discard(label)
            for instance_id in found:
                if instance_id not in known:
                    self.out.warn(f"found instance {instance_id} with this run's label {label}; deleting it")
                    self.ledger.append(self.run_id, "created", label, instance_id=instance_id, detail="found by sweep")
                    stray = CreatedInstance(instance_id=instance_id, label=label, offer_id=-1, machine_id=None,
                                            dph_usd=0.0, t_created_mono=self.t0, status="found by label",
                                            t_created_unix=sent.get(label, time.time()))
                    self.created.append(stray)
                    self._teardown_one(stray)
                    known.add(instance_id)


def run_guarded(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output) -> HarnessResult:
    return GuardedRun(spec, client, drivers, out).execute()
