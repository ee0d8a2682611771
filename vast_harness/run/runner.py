"""The guarded run of docs/architecture.md, read top to bottom in `GuardedRun.execute`.

Whatever happens after the first create (an error, a cap, Ctrl-C, SIGTERM, SIGHUP), the `finally` block
pulls what evidence it can, deletes every instance this run created, proves each absent, and only then
decides the exit code: 3 beats everything when any instance is not proven gone.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from vast_harness.caps.meter import CostMeter
from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.errors import ExitCode, Interrupted, NoOfferError, describe, exit_code_for
from vast_harness.evidence.run import RunEvidence, overall_absence
from vast_harness.host.bundle import Bundle
from vast_harness.host.ssh import run_key_dir_prefix
from vast_harness.records import AbsenceSummary, CreatedInstance, InstanceTeardown, PullRecord, RunRecord, StepRecord
from vast_harness.reports.run import write_run_report_safely
from vast_harness.run.host_work import HostWork
from vast_harness.run.interrupt import (
    close_attempt,
    hosts_lines,
    outbid_of,
    recover,
    restore,
    resume_steps,
    wait_for_resume,
)
from vast_harness.run.record import build_record, exit_facts, not_ours_of
from vast_harness.run.rent import preflight, reconnect, rent_and_connect, timed
from vast_harness.run.rent_book import RentBook
from vast_harness.run.state import RunState, Stage, new_state
from vast_harness.run.teardown import delete_all, prelude, pull_evidence
from vast_harness.run.tools import AroundBoot, Clock, HoldTerms, RunTools, build_tools, snapshot
from vast_harness.run.verdict import Outcome, decide_exit, with_guard, work_outcome
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.ledger import new_run_id
from vast_harness.vast.client import VastClient

REFUSED_CODES = (ExitCode.BAD_INPUT, ExitCode.NO_OFFER)  # refused before renting: nothing was


def discard_run_dir(run_dir: Path) -> bool:
    """Remove the directory this run made for itself (named by its fresh run id, so nobody else's); True when
    it is gone."""
    shutil.rmtree(run_dir, ignore_errors=True)
    return not run_dir.exists()


class HarnessResult(BaseModel):
    run_id: str
    exit_code: ExitCode
    message: str = ""


def work_at(s: RunState, stage: Stage) -> HostWork:
    """The host's phases (made once SSH is up), as `stage` begins."""
    assert s.work is not None
    s.stage = stage
    return s.work


class RunStages:
    """What the run does between its start and its end, in `Stage` order: today's run, rent to pull. A kept
    host's commands (`run/hold.py`) replace some of it (adopt the held instance instead of renting one, push its
    deadlines instead of arming a fresh switch) and may keep the instance instead of deleting it; the skeleton
    around (signals, the cap guard, the teardown, the verdict) is `GuardedRun.execute`'s, the same for all."""

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        """Stage.PREFLIGHT: nothing rented until it passes; what to upload (None: no work on the host)."""
        return preflight(t, s, key_dir)

    def connect(self, t: RunTools, s: RunState) -> None:
        """Stage.RENT, DEADMAN, RECEIPT: an instance booted, SSH up (`s.session`, `s.work`), its dead-man switch
        proven able to act and its receipt passed (`rent.qualify`), the next offer after a host that fails."""
        rent_and_connect(t, s)

    def arm(self, t: RunTools, s: RunState) -> None:
        """After `connect`, before the work, the host's price watched: a kept host's deadlines pushed and its
        switch checked; nothing for a run (its switch was proven in `connect`)."""

    def work(self, t: RunTools, s: RunState, bundle: Bundle | None) -> None:
        """Stage.UPLOAD, Stage.STEPS, Stage.PULL."""
        if bundle is None:
            return
        timed(t, s, "upload", lambda: work_at(s, Stage.UPLOAD).upload(bundle))
        work_at(s, Stage.STEPS).run_steps()
        pull_evidence(t, s, in_teardown=False)  # Stage.PULL

    def work_on_host(self, t: RunTools, s: RunState, bundle: Bundle | None, salvaged: Path | None, *,
                     in_place: bool) -> None:
        """The work, on the first host or after an outbid: on an interruptible run's replacement host, the
        upload, the salvaged checkpoint restored and the resume instead; `in_place`: the same host after a
        pause, its workdir and checkpoint on its disk (an upload would wipe them), so only the resume."""
        if not in_place and salvaged is None and not s.steps_before:
            self.work(t, s, bundle)
            return
        if bundle is None:
            return
        if not in_place:
            timed(t, s, "upload", lambda: work_at(s, Stage.UPLOAD).upload(bundle))
            if salvaged is not None:
                restore(t, s, salvaged)
        work_at(s, Stage.UPLOAD).steps_to_run = resume_steps(t)  # the resume (or the command again)
        work_at(s, Stage.STEPS).run_steps()
        pull_evidence(t, s, in_teardown=False)  # Stage.PULL

    def replace_host(self, t: RunTools, s: RunState, salvaged: Path | None) -> None:
        """After an outbid host was salvaged, deleted and proven gone: the next host (`connect` again)."""
        self.connect(t, s)

    def finished(self, t: RunTools, s: RunState) -> None:
        """The work is done: an interruptible run's last host ends "finished"."""
        if s.attempts and (latest := t.book.latest()) is not None:
            close_attempt(t, s, latest.instance_id, "finished")

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        """The outcome of work that all succeeded."""
        return work_outcome(s.candidate.driver_qualified if s.candidate else False)

    def keeps(self, t: RunTools, s: RunState, code: ExitCode) -> bool:
        """Whether the instance outlives the run (a kept host's): never, for a run."""
        return False

    def hand_over(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        """The instance is kept (`keeps`): leave it to the next command; the outcome to report."""
        raise NotImplementedError("a run keeps nothing")

    def not_kept(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        """The outcome once `keeps` said no and the teardown comes (a kept host's command: its hold ends)."""
        return code, message

    def records_result(self, t: RunTools, s: RunState) -> bool:
        """Whether the handed-over run writes its record (a kept host's command that another ended meanwhile
        leaves the record to that one)."""
        return True

    def ended(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> None:
        """After the teardown and the verdict (the instance deleted, proven or not)."""


class GuardedRun:
    """One guarded run: `tools` built once, `state` learnt as it goes, the stages in `Stage` order.

    Hooks (tests and the canary swap these rather than override private methods): `clock`, the run's
    monotonic clock (every deadline is on it); `host_work`, the host's phases once SSH is up; `on_created`,
    told of each instance as soon as its create answered (the chaos suite steps the wall clock there);
    `around_boot`, wraps each instance's boot (the canary watches reads around it); `stages`, what the run
    does between its start and its teardown (a kept host's commands: `run/hold.py`); `hold`, the kept host
    whose instance the tools adopt or keep (`tools.HoldTerms`)."""

    def __init__(self, spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output, *,
                 run_id: str | None = None, clock: Clock = now_s,
                 host_work: type[HostWork] = HostWork,
                 on_created: Callable[[CreatedInstance], None] | None = None,
                 around_boot: AroundBoot | None = None, discard_if_refused: bool = False,
                 stages: RunStages | None = None, hold: HoldTerms | None = None) -> None:
        """`discard_if_refused` (the command line's single run): a run refused before any create was sent
        (exit 2 or 5) leaves no evidence directory, report or steps table, only its message: `logs` and
        `costs` list runs that rented (or tried to)."""
        self.spec = spec
        self.discard_if_refused = discard_if_refused
        self.stages = stages if stages is not None else RunStages()
        self.state: RunState = new_state(spec, run_id or new_run_id())
        self.tools: RunTools = build_tools(spec, client, drivers, out, self.state, clock=clock,
                                           host_work=host_work, on_created=on_created, around_boot=around_boot,
                                           hold=hold)
        self.run_id = self.state.run_id

    def execute(self) -> HarnessResult:
        t, s, stages = self.tools, self.state, self.stages
        code, message = ExitCode.FAILED, ""
        with t.signals, tempfile.TemporaryDirectory(prefix=run_key_dir_prefix(s.run_id)) as key_dir:
            try:
                t.out.start_view(lambda: snapshot(t))  # inside: a Ctrl-C here too is exit 130, not a traceback
                bundle = stages.prepare(t, s, Path(key_dir))  # Stage.PREFLIGHT: nothing rented until it passes
                stages.connect(t, s)  # Stage.RENT, DEADMAN, RECEIPT: the next offer after a host that fails
                salvaged: Path | None = None
                in_place = False  # the host resumed after an outbid it waited out: its disk is as it was
                while True:  # once, unless an interruptible run's host is outbid (run/interrupt.py)
                    try:
                        if in_place:
                            reconnect(t, s)
                        # The host may re-price while anything runs on it, a slow upload or pull as a step.
                        with t.reads.watch_prices(t.book.latest()):
                            stages.arm(t, s)  # a kept host's deadlines pushed (a run's switch: in connect)
                            stages.work_on_host(t, s, bundle, salvaged, in_place=in_place)  # UPLOAD, STEPS, PULL
                        break
                    except (Exception, Interrupted) as exc:
                        why = outbid_of(t, s, exc)
                        if why is None:
                            raise
                        s.steps_before.extend(s.work.steps if s.work else [])
                        s.work = None
                        if wait_for_resume(t, s, why):  # --on-outbid wait: the same host, resumed
                            in_place = True
                            continue
                        # the husk salvaged (or the folder salvaged before kept), deleted and proven gone
                        salvaged = recover(t, s, why, salvaged, waited=t.spec.interruptible is not None
                                           and t.spec.interruptible.wait_minutes is not None)
                        in_place = False
                        s.recovered()
                        s.stage = Stage.RENT
                        stages.replace_host(t, s, salvaged)
                stages.finished(t, s)
                code, message = with_guard(*stages.outcome(t, s), t.cap_guard.fired_reason)
            except (Exception, Interrupted) as exc:  # a bug too must end in teardown and an exit code
                code, message = with_guard(exit_code_for(exc), describe(exc), t.cap_guard.fired_reason)
                self._notify_stop(exc, code, message)  # queued, never waited on: the teardown comes next
                if isinstance(exc, NoOfferError) and exc.rejected:
                    t.out.rejections([r.row() for r in exc.rejected], title="Closest offers and why each was rejected")
            finally:
                t.signals.in_teardown = True
                try:
                    if self._keeps(code):
                        code, message = self._hand_over(code, message)
                    else:
                        code, message = stages.not_kept(t, s, code, message)
                        code, message = self._teardown_and_verdict(code, message)  # Stage.TEARDOWN, VERDICT
                        stages.ended(t, s, code, message)
                finally:
                    t.stuck.finished()
                    if s.registration is not None:
                        s.registration.release()  # the run is over: a reap may now judge what is left
                    t.notify.finish(t.ev, t.out.warn)  # the last events get a moment to leave; each one's fate kept
        return HarnessResult(run_id=s.run_id, exit_code=code, message=message)

    def _keeps(self, code: ExitCode) -> bool:
        """The stages keep the instance, and the cap guard never took it: claimed here, the guard leaves it alone
        from now on; one it took already (its DELETE sent) goes through the teardown like any."""
        t, s = self.tools, self.state
        inst = t.book.latest()
        if inst is None or not self.stages.keeps(t, s, code) or t.meter.over_cap():
            return False
        t.instances.claim(inst)
        return inst.instance_id not in t.cap_guard.deleted_ids()

    def _hand_over(self, code: ExitCode, message: str) -> Outcome:
        """The instance outlives the run: no teardown; the stages leave it to the next command, then the verdict
        and the record, as a teardown's would be written."""
        t, s = self.tools, self.state
        t.cap_guard.stop()
        outcome = self.stages.hand_over(t, s, code, message)
        s.stage = Stage.VERDICT

        def verdict() -> Outcome:
            return decide_exit(*outcome, exit_facts(t).model_copy(update={"held": True}))

        def held_record(code: ExitCode, message: str) -> RunRecord:
            record = build_record(t, s, code, message)
            held = {i.instance_id: "held" for i in record.instances}  # not deleted: neither gone nor unproven
            return record.model_copy(update={
                "instances": [i.model_copy(update={"absence": "held"}) for i in record.instances],
                "absence": AbsenceSummary(verdict="held", per_instance=held)})

        code, message = verdict()
        t.phases.end()
        s.timings["total_s"] = round(t.clock() - t.meter.t0, 3)
        report_path = None
        if self.stages.records_result(t, s):
            t.ev.write_result(held_record(code, message), t.book.teardowns, t.spec.proof_interval_s)
            if (final := verdict()) != (code, message):  # the record's own write failed: never a silent 0
                code, message = final
                if not t.ev.rewrite_result(held_record(code, message)):
                    t.out.warn(f"{t.ev.dir / 'harness-result.json'} could not be written; this command's exit is "
                               f"{int(code)}")
            report_path = write_run_report_safely(t.ev.dir, t.out.warn)
        t.out.stop_view()
        t.out.result(s.run_id, code, message, t.ev.dir, self.steps, t.book.teardowns, t.meter.accrued_usd(),
                     report=report_path, gpu=s.host_gpus.shown() if s.host_gpus else None)
        return code, message

    def _notify_stop(self, exc: BaseException, code: ExitCode, message: str) -> None:
        """What stopped the work, when it is a signal or a cap: its event, before the teardown starts (none before
        any create: nothing was rented, nothing is said)."""
        if not self.tools.book.attempts:
            return
        if isinstance(exc, Interrupted):
            self.tools.notify.interrupted(str(exc))
        elif code == ExitCode.INTERRUPTED:  # a fleet's signal, passed on as a cancel
            self.tools.notify.interrupted(message.removeprefix("cancelled: "))
        elif code == ExitCode.CAP_REACHED:
            self.tools.notify.cap_reached(message)

    def _teardown_and_verdict(self, code: ExitCode, message: str) -> Outcome:
        t, s = self.tools, self.state
        # "May still bill" is decided from the teardowns and the sweep, not by the error that stopped the
        # run: a create of unknown outcome that the sweep then finds and deletes is a failure.
        if code == ExitCode.NOT_PROVEN_GONE:
            code = ExitCode.FAILED
        # "After the last step" counts from the step's end when one ran (evidence pull included), else from now.
        t_last_step_end = (s.work and s.work.t_last_step_end_mono) or t.clock()
        prelude(t, s)  # Stage.TEARDOWN
        delete_all(t, s, t_last_step_end)
        for attempt in s.attempts:  # an interruptible run's host still open ends with the run
            if attempt.ended_unix is None:
                close_attempt(t, s, attempt.instance_id, f"the run ended: {message or code.name.lower()}")
        s.stage = Stage.VERDICT
        outcome = with_guard(code, message, t.cap_guard.fired_reason, after_outcome=True)  # fired in the prelude?
        code, message = decide_exit(*outcome, exit_facts(t))  # the run's own outcome, then what teardown says
        if self.discard_if_refused and code in REFUSED_CODES and not t.book.attempts and not t.book.created:
            t.phases.end()
            t.out.stop_view()
            if not discard_run_dir(t.ev.dir):
                t.out.warn(f"could not remove {t.ev.dir}, the evidence directory of a run that rented nothing")
            t.out.refused(s.run_id, code, message)
            return code, message
        t.phases.end()
        s.timings["total_s"] = round(t.clock() - t.meter.t0, 3)
        t.ev.write_result(build_record(t, s, code, message), t.book.teardowns, t.spec.proof_interval_s)
        final = decide_exit(*outcome, exit_facts(t))  # those writes may have failed too: each one is named
        if final != (code, message):  # then the result file says what the process says, or is not there
            written, (code, message) = code, final
            result_path = t.ev.dir / "harness-result.json"
            was_written = result_path.is_file()  # a write that failed left none (the disk full or read-only)
            if not t.ev.rewrite_result(build_record(t, s, code, message)):
                if result_path.exists():  # nor could it be removed: say which exit it still claims
                    t.out.warn(f"{result_path} still says exit {int(written)}: it could not be rewritten or "
                               f"removed; this run's exit is {int(code)}")
                elif was_written:
                    t.out.warn(f"removed {result_path}: it said exit {int(written)} and could not be rewritten")
        if t.book.attempts:  # a run that sent no create rented nothing: it says nothing (docs/notifications.md)
            if code == ExitCode.CAP_REACHED:  # a cap found only now (the meter over it at the end): said first
                t.notify.cap_reached(message)
            t.notify.ended(code, message,
                           overall_absence(t.book.teardowns, t.book.unresolved, not_ours=not_ours_of(t)))
        report_path = write_run_report_safely(t.ev.dir, t.out.warn)
        t.out.stop_view()
        t.out.result(s.run_id, code, message, t.ev.dir, self.steps, t.book.teardowns, t.meter.accrued_usd(),
                     report=report_path, gpu=s.host_gpus.shown() if s.host_gpus else None,
                     hosts=hosts_lines(t, s))
        return code, message

    def cancel(self, reason: str, *, exit_code: ExitCode = ExitCode.CAP_REACHED) -> None:
        """Thread-safe: stop at the next stage boundary (a running step within its poll interval), then the
        usual teardown: CAP_REACHED for a cap, INTERRUPTED for a signal. A finished run is unaffected."""
        self.state.cancel(reason, exit_code)

    def accrued_usd(self) -> float:
        return self.tools.meter.accrued_usd()

    # What the run rented and what became of it (the fleet, the chaos suite and tests read these).
    @property
    def ev(self) -> RunEvidence:
        return self.tools.ev

    @property
    def meter(self) -> CostMeter:
        return self.tools.meter

    @property
    def book(self) -> RentBook:
        return self.tools.book

    @property
    def created(self) -> list[CreatedInstance]:
        return self.tools.book.created

    @property
    def teardowns(self) -> list[InstanceTeardown]:
        return self.tools.book.teardowns

    @property
    def steps(self) -> list[StepRecord]:
        return self.state.steps_before + (self.state.work.steps if self.state.work else [])

    @property
    def pull(self) -> PullRecord | None:
        return self.state.work.pull if self.state.work else None


def run_guarded(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output) -> HarnessResult:
    return GuardedRun(spec, client, drivers, out, discard_if_refused=True).execute()
