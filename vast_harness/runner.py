"""The guarded run, steps 2-11 of design.md, read top to bottom in `GuardedRun.execute`.

Whatever happens after the first create (an error, a cap, Ctrl-C, SIGTERM, SIGHUP), the `finally` block
pulls what evidence it can, deletes every instance this run created, proves each absent, and only then
decides the exit code: 3 beats everything when any instance is not proven gone.
"""

from __future__ import annotations

import secrets
import signal
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from pydantic import BaseModel, Field

from vast_harness.bundle import Bundle, build_bundle
from vast_harness.client import VastClient
from vast_harness.config import LABEL_PREFIX, DriverPolicy, RunSpec
from vast_harness.errors import (
    AuthError,
    CapReachedError,
    ConfigError,
    HarnessError,
    NoOfferError,
    StepFailedError,
    VastError,
)
from vast_harness.evidence import RunEvidence
from vast_harness.ledger import Ledger
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
from vast_harness.offers import Candidate
from vast_harness.onstart import build_onstart
from vast_harness.output import Output
from vast_harness.plan import RunPlan, choose_offers, plan_run
from vast_harness.ssh import HostSession, RunKey, SshConnectError, endpoints_for, generate_run_key

REMOTE_DIR = "vh"  # under the host's $HOME
MAX_UNAVAILABLE_REPICKS = 3
# A boot failure that says the offer was sold twice (Vast accepts both buys; one container cannot bind its
# ports): the offer was taken, like no_such_ask, so it costs a re-pick, not one of the boot retries.
_OFFER_CONFLICT_WORDS = ("port is already allocated", "already rented", "no longer available")
NULL_GRACE_S = 60.0  # reads lag creates: tolerate `instances: null` this long after create


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP during the run. A BaseException so no `except Exception` can swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StepRecord(BaseModel):
    name: str
    rc: int | None
    seconds: float
    timed_out: bool = False
    connection_lost: bool = False
    reconnect_ok: bool | None = None
    workload: bool = True
    detail: str = ""


class CreatedInstance(BaseModel):
    instance_id: int
    label: str
    offer_id: int
    machine_id: int | None
    dph_usd: float
    t_created_mono: float
    t_created_unix: float = Field(default_factory=time.time)
    t_deleted_mono: float | None = None
    status: str = "created"  # the create outcome (created, created_with_error, found_after_unknown, ...)
    detail: str = ""
    absence: str | None = None  # the teardown's verdict: gone, present or unknown


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
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.in_teardown or self.received is not None:
            self.out.err.print(f"[yellow]{signal.Signals(signum).name}: teardown is in progress and will finish; "
                               "it cannot be skipped[/]")
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


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


class GuardedRun:
    def __init__(self, spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, *,
                 run_id: str | None = None) -> None:
        self.spec, self.client, self.drivers, self.out = spec, client, drivers, out
        self.run_id = run_id or new_run_id()
        self.ledger = Ledger(spec.evidence_dir / "ledger.jsonl")
        self.ev = RunEvidence(spec.evidence_dir / self.run_id)
        self.t0 = time.monotonic()
        self.created: list[CreatedInstance] = []
        self.teardowns: list[InstanceTeardown] = []
        self.steps: list[StepRecord] = []
        self.timings: dict[str, float] = {}
        self.session: HostSession | None = None
        self.plan: RunPlan | None = None
        self.candidate: Candidate | None = None
        self.cap_deadline = self.t0 + spec.max_seconds - spec.teardown_margin_s
        self.bytes_up = 0
        self.bytes_down = 0
        self.evidence_pulled = False
        self.t_last_step_end_unix: float | None = None
        self.excluded_machines: set[int] = set()
        # How long one instance's delete + absence proof may take before it is declared unproven (exit 3).
        self.teardown_budget_s = max(60.0, 8 * spec.proof_interval_s + 60.0)
        # Reads may not see an instance this long after its create (lifecycle.READ_LAG_WINDOW_S).
        self.read_lag_window_s = SIM_READ_LAG_WINDOW_S if spec.sim else READ_LAG_WINDOW_S
        self.create_attempts: list[tuple[str, float]] = []  # (label, t_unix the PUT was sent)
        self.unresolved_labels: set[str] = set()  # creates whose outcome no read has settled

    # ------------------------------------------------------------------------------------------- run
    def execute(self) -> HarnessResult:
        guard = _SignalGuard(self.out)
        code, message = 1, ""
        key: RunKey | None = None
        with guard, tempfile.TemporaryDirectory(prefix="vh-key-") as key_dir:
            try:
                bundle = build_bundle()
                self.plan = self._timed("plan", lambda: plan_run(self.spec, self.client, self.drivers, bundle))
                self.ev.write_json("offer-quote.json", self.plan.summary())
                key = generate_run_key(Path(key_dir))
                self._rent_and_connect(key)
                self._timed("upload", lambda: self._upload(bundle))
                self._run_steps()
                self._pull_evidence()
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

    def _timed(self, name: str, fn):
        start = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[f"{name}_s"] = round(time.monotonic() - start, 3)

    # ------------------------------------------------------------------------------- rent + connect
    def _candidates(self):
        assert self.plan is not None
        yield from [self.plan.chosen, *self.plan.alternatives]
        # The plan's list ran out: search again, excluding machines that failed to boot in this run.
        try:
            credit = self.client.current_user().available_usd
            choice = choose_offers(self.spec, self.client, self.drivers, build_bundle(), credit_usd=credit,
                                   exclude_machine_ids=self.excluded_machines)
        except NoOfferError:
            return
        yield from choice.ranked

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
        outcome = create(self.client, self.ledger, run_id=self.run_id, label=label, offer_id=cand.offer.id, body=body,
                         lag_wait_s=max(self.spec.poll_s, 0.2), lag_window_s=self.read_lag_window_s)
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
        # The money clock starts now: the cost cap becomes a deadline at this offer's price.
        self._tighten_cost_deadline()
        return inst

    def _boot(self, inst: CreatedInstance, key: RunKey) -> None:
        boot_deadline = min(self.cap_deadline, time.monotonic() + self.spec.profile.boot_timeout_s)
        try:
            ready = wait_ready(self.client, inst.instance_id, deadline=boot_deadline, poll_s=self.spec.poll_s,
                               null_grace_s=NULL_GRACE_S)
            self.out.info(f"instance {inst.instance_id} running; connecting over SSH")
            self.session = HostSession.connect(endpoints_for(ready), key, deadline_monotonic=boot_deadline,
                                               retry_wait_s=min(2.0, max(self.spec.poll_s, 0.2)))
        except (BootFailed, SshConnectError) as exc:
            # When the cap, not the boot timeout, cut the wait, the run stopped at its cap (exit 6): trying
            # another host would only spend past it.
            if time.monotonic() >= self.cap_deadline - 0.05:
                raise CapReachedError(f"cap reached while instance {inst.instance_id} was booting: {exc}") from exc
            raise

    def _tighten_cost_deadline(self) -> None:
        """Accrued cost must stay under the cap with the teardown margin: turn dollars into a deadline."""
        transfer_usd = self.plan.chosen.quote.upload_usd + self.plan.chosen.quote.download_usd if self.plan else 0.0
        spent = self.accrued_usd()
        dph = self.created[-1].dph_usd
        if dph > 0:
            affordable_s = max(0.0, (self.spec.caps.max_usd - transfer_usd - spent) * 3600.0 / dph)
            margin_usd_s = self.spec.teardown_margin_s
            self.cap_deadline = min(self.cap_deadline, time.monotonic() + affordable_s - margin_usd_s)

    # ---------------------------------------------------------------------------------- host work
    def _upload(self, bundle: Bundle) -> None:
        assert self.session is not None
        if self.cap_deadline - time.monotonic() <= 0:
            raise CapReachedError("cap reached before the bundle could be uploaded")
        with tempfile.NamedTemporaryFile(suffix=".tar.gz") as fh:
            fh.write(bundle.data)
            fh.flush()
            self.bytes_up += self.session.put(Path(fh.name), "vh-bundle.tar.gz")
        outcome = self.session.run(
            f"rm -rf ~/{REMOTE_DIR} && mkdir -p ~/{REMOTE_DIR}/evidence && tar -xzf ~/vh-bundle.tar.gz -C ~/{REMOTE_DIR}"
            f" && echo \"bundle sha256 $(sha256sum ~/vh-bundle.tar.gz | cut -c1-64)\"",
            on_line=lambda stream, line: self.out.info(f"[setup] {line}"),
            timeout_s=max(1.0, min(120.0, self.cap_deadline - time.monotonic())),
        )
        if outcome.timed_out and time.monotonic() >= self.cap_deadline - 0.05:
            raise CapReachedError("cap reached while unpacking the bundle")
        if not outcome.ok:
            raise StepFailedError(f"unpacking the bundle failed: rc={outcome.rc} {outcome.detail}", step="setup")

    def _run_steps(self) -> None:
        assert self.session is not None
        env = dict(self.spec.remote_env) | {"VH_RUN_ID": self.run_id}
        for step in self.spec.profile.steps:
            remaining = self.cap_deadline - time.monotonic()
            if remaining <= 0:
                raise CapReachedError(f"cap reached before step {step.name}: stopping to keep the teardown margin")
            timeout = min(step.timeout_s, remaining)
            log = self.ev.step_log(step.name)
            started = time.monotonic()

            def on_line(stream: str, line: str, _name=step.name, _log=log, _t=started) -> None:
                _log.write(line + "\n")
                _log.flush()
                self.out.step_line(_name, time.monotonic() - _t, self.accrued_usd(), stream, line)

            self.out.info(f"step [bold]{step.name}[/] (timeout {timeout:.0f} s)")
            try:
                outcome = self.session.run(f"cd ~/{REMOTE_DIR} && {step.run}", on_line=on_line, timeout_s=timeout,
                                           env=env)
            finally:
                log.close()
            record = StepRecord(name=step.name, rc=outcome.rc, seconds=round(outcome.seconds, 3),
                                timed_out=outcome.timed_out, connection_lost=outcome.connection_lost,
                                workload=step.workload, detail=outcome.detail)
            if outcome.connection_lost:
                record.reconnect_ok = self.session.reconnect_probe()
            self.steps.append(record)
            self.t_last_step_end_unix = time.time()
            self.ev.append_step_tsv(record.name, record.rc, record.seconds)
            if outcome.timed_out and timeout < step.timeout_s:
                raise CapReachedError(f"step {step.name} stopped at the cap (time/cost) after {outcome.seconds:.0f} s")
            if outcome.timed_out:
                raise StepFailedError(f"step {step.name} timed out after {step.timeout_s:g} s", step=step.name)
            if outcome.connection_lost:
                raise StepFailedError(f"step {step.name}: connection lost ({outcome.detail}); reconnect "
                                      f"{'succeeded' if record.reconnect_ok else 'failed'}; not re-run",
                                      step=step.name)
            if outcome.rc != 0:
                raise StepFailedError(f"step {step.name} failed with rc={outcome.rc}", step=step.name, rc=outcome.rc)

    def _pull_evidence(self) -> None:
        if self.evidence_pulled or self.session is None or not self.session.is_active():
            return
        self.evidence_pulled = True
        try:
            start = time.monotonic()
            files = self.session.get_tree(f"{REMOTE_DIR}/evidence", self.ev.dir / "remote")
            self.bytes_down += sum((self.ev.dir / "remote" / f).stat().st_size for f in files
                                   if (self.ev.dir / "remote" / f).exists())
            self.timings["pull_s"] = round(time.monotonic() - start, 3)
            self.out.info(f"pulled {len(files)} evidence file(s)")
        except Exception as exc:  # evidence is best effort; teardown must still run
            self.out.warn(f"could not pull the host's evidence: {exc}")

    # ---------------------------------------------------------------------------------- teardown
    def accrued_usd(self) -> float:
        now = time.monotonic()
        total = 0.0
        for inst in self.created:
            end = inst.t_deleted_mono or now
            total += (end - inst.t_created_mono) / 3600.0 * inst.dph_usd
        if self.candidate:
            o = self.candidate.offer
            total += self.bytes_up / 1e9 * (o.inet_down_cost_usd_per_gb or 0.0)
            total += self.bytes_down / 1e9 * (o.inet_up_cost_usd_per_gb or 0.0)
        return total

    def _teardown_one(self, inst: CreatedInstance) -> InstanceTeardown:
        deadline = time.monotonic() + self.teardown_budget_s
        report = teardown_instance(self.client, self.ledger, run_id=self.run_id, label=inst.label,
                                   instance_id=inst.instance_id, interval_s=self.spec.proof_interval_s,
                                   deadline=deadline, created_unix=inst.t_created_unix,
                                   lag_window_s=self.read_lag_window_s)
        acks = [d for d in report.deletes if d.acknowledged]
        if acks:
            inst.t_deleted_mono = inst.t_created_mono + max(0.0, acks[0].t_ack_unix - inst.t_created_unix)
        inst.absence = report.verdict
        self.teardowns.append(report)
        return report

    def _finish(self, code: int, message: str, key: RunKey | None) -> tuple[int, str]:
        # "After the last step" counts from the step's end when one ran (evidence pull included), else from now.
        t_last_step_end_unix = self.t_last_step_end_unix or time.time()
        self._pull_evidence()
        if self.session is not None:
            self.session.close()
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
        unproven = [t.instance_id for t in self.teardowns if t.verdict != "gone"]
        if unproven:
            code = 3
            message = (f"teardown NOT proven for instance(s) {unproven}: they may still bill. "
                       f"The ledger names them; run `vast-e2e reap`. ({message})")
        if self.unresolved_labels:  # a create that may yet appear: the ledger's create_unresolved names it
            code = 3
            message = (f"create outcome unknown for label(s) {sorted(self.unresolved_labels)}: an instance may "
                       f"appear and bill. Run `vast-e2e reap`, which keeps looking for them. ({message})")
        self.timings["total_s"] = round(time.monotonic() - self.t0, 3)
        self.ev.write_result(self, code, message)
        self.out.result(self.run_id, code, message, self.ev.dir, self.steps, self.teardowns, self.accrued_usd())
        return code, message

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
