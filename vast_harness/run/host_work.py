"""The run's work on the rented host, each phase under the cost meter's deadlines.

`HostWork` uploads the bundle, runs the profile's steps (output streamed to the console, capped in the
step log, billed as bandwidth) and pulls the host's evidence back. Every phase asks the meter first and
is cut at the cap (exit 6); a stalled link is abandoned, never waited on. The run (`runner.GuardedRun`)
owns the instance and the teardown; this owns nothing that bills.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vast_harness.caps.meter import CostMeter
from vast_harness.console.carriage import CarriageLine, shown_segment
from vast_harness.console.output import LineBudget, Output
from vast_harness.errors import CapReachedError, HarnessError, Interrupted, StepFailedError, TransferAbandoned
from vast_harness.evidence.run import RunEvidence, StepLog
from vast_harness.host.artifacts import pull_artifacts
from vast_harness.host.bundle import WORKDIR_DIR, Bundle
from vast_harness.host.ssh import HostSession, TreePull
from vast_harness.masking import spoken
from vast_harness.records import ArtifactPull, PullRecord, StepOutcome, StepRecord
from vast_harness.spec.profile import Step
from vast_harness.spec.resolve import RunSpec
from vast_harness.spec.workdir import ArtifactGlobs

REMOTE_DIR = "vh"  # under the host's $HOME
# The evidence pull: never longer than this, never more bytes than this (and never more than the cap affords).
PULL_MAX_S = 600.0
PULL_MAX_BYTES = 1 << 30
# How often (in printed bytes) a step's output re-asks the meter: printed bytes are billed bandwidth.
_METER_EVERY_BYTES = 1 << 20


_CONSOLE_LINE_CHARS = 1000  # the most of one line the console shows; the step log keeps it whole
ARTIFACTS_DIR = "artifacts"  # `run --artifact`: <evidence>/<run_id>/artifacts/, the workdir's relative paths kept


class HostWork:
    """Upload, steps and evidence pull on one connected host. `steps`, `pull` and `t_last_step_end_unix`
    are what the run's record reports; `timings` is the run's own dict (phases add their seconds)."""

    def __init__(self, session: HostSession, *, spec: RunSpec, meter: CostMeter, ev: RunEvidence, out: Output,
                 run_id: str, cancelled: threading.Event, check_cancelled: Callable[[], None],
                 hurry: Callable[[], bool], timings: dict[str, float],
                 on_phase: Callable[[str], None] = lambda name: None) -> None:
        self.session, self.spec, self.meter, self.ev, self.out = session, spec, meter, ev, out
        self.run_id = run_id
        self.cancelled = cancelled
        self._check_cancelled = check_cancelled
        self._hurry = hurry  # a signal during teardown: abandon the pull, go straight to DELETE
        self.timings = timings
        self._phase = on_phase  # the run's timeline and live view (console/live.py PhaseLog)
        self.steps: list[StepRecord] = []
        self.step_env: dict[str, str] = {}  # the run's own variables for the steps (VH_RECEIPT: run/receipt.py)
        self.steps_to_run: list[Step] | None = None  # instead of the profile's (a replacement host's resume)
        self.pull: PullRecord | None = None
        self.artifacts: ArtifactPull | None = None  # `run --artifact`: pulled with the evidence
        self.evidence_pulled = False
        self.t_last_step_end_unix: float | None = None  # recorded
        self.t_last_step_end_mono: float | None = None  # compared

    def upload(self, bundle: Bundle) -> None:
        """Send the bundle (cut at the cap) and unpack it under ~/vh on the host."""
        self.send(bundle, "vh-bundle.tar.gz")
        self.unpack(f"rm -rf ~/{REMOTE_DIR} && mkdir -p ~/{REMOTE_DIR}/evidence && tar -xzf ~/vh-bundle.tar.gz -C "
                    f"~/{REMOTE_DIR} && echo \"bundle sha256 $(sha256sum ~/vh-bundle.tar.gz | cut -c1-64)\"")

    def send(self, bundle: Bundle, remote_name: str) -> None:
        """Send `bundle` to `~/remote_name` on the host, its bytes metered, cut at the cap."""
        self._check_cancelled()
        self._phase("upload")
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
            try:  # abandoned too when the run is cancelled (a re-price that breaks the cap, a fleet's total)
                sent = self.session.put(Path(fh.name), remote_name, on_progress=progress, deadline=deadline,
                                        abandon=self.cancelled.is_set)
            except TransferAbandoned as exc:
                self._check_cancelled()
                raise CapReachedError(f"cap reached during the upload ({reported[0]} of {bundle.size_bytes} "
                                      f"bytes sent): {exc}") from exc
        self.meter.add_bytes(up=max(0, sent - reported[0]))

    def unpack(self, command: str) -> None:
        """Run the host command that unpacks what `send` sent (its lines shown as [setup]); bounded by the cap."""
        self.meter.check("unpacking the bundle")
        outcome = self.session.run(
            command, on_line=lambda stream, line: self.out.info(f"[setup] {self.spec.redactor.line(line)}"),
            timeout_s=max(0.05, self.meter.deadline(120.0) - self.meter.now()), stop=self.cancelled,
        )
        self._check_cancelled()
        if outcome.timed_out and self.meter.cut_by_cap():
            raise CapReachedError("cap reached while unpacking the bundle")
        if not outcome.ok:
            raise StepFailedError(f"unpacking the bundle failed: rc={outcome.rc} {outcome.detail}", step="setup")

    def _step_printer(self, name: str, log: StepLog, started: float
                      ) -> tuple[Callable[[str, str], None], Callable[[], None], Callable[[str, str], None]]:
        """The step's on_line: capped log, live console for the log's head, bytes into the meter; its
        on_partial: a progress bar's latest drawing on the console (carriage.py), rate-limited."""
        state = {"unmetered": 0, "said_cut": False}
        redact = self.spec.redactor
        console = LineBudget(clock=self.meter.now)
        drawing = {stream: CarriageLine(min_interval_s=self.out.progress_interval_s, clock=self.meter.now)
                   for stream in ("stdout", "stderr")}

        def on_partial(stream: str, pending: str) -> None:
            if (segment := drawing[stream].update(pending)) is not None:
                self.out.step_progress(name, self.meter.now() - started, self.meter.accrued_usd(), stream,
                                       redact.text(segment)[:_CONSOLE_LINE_CHARS])

        def say_skipped() -> None:
            if skipped := console.take_skipped():
                self.out.step_line(name, self.meter.now() - started, self.meter.accrued_usd(), "stdout",
                                   f"… {skipped} line(s) not shown (too fast to read); `vast-e2e logs {self.run_id} "
                                   f"{name}` has them")

        def on_line(stream: str, raw: str) -> None:
            line = redact.line(raw)  # a secret a step prints is neither logged nor shown, however it is drawn
            shown = log.write(line)
            state["unmetered"] += len(raw) + 1
            drawing[stream].line_ended()
            if "\r" in line or "\x1b[" in line:  # a bar's last drawing, as a terminal leaves it; the log has all
                line = shown_segment(line)
            if shown and console.allow():
                say_skipped()
                if len(line) > _CONSOLE_LINE_CHARS:  # a 30 MB line is one line to the budget: show its start
                    line = f"{line[:_CONSOLE_LINE_CHARS]} … ({len(line) - _CONSOLE_LINE_CHARS} more characters in the log)"
                self.out.step_line(name, self.meter.now() - started, self.meter.accrued_usd(), stream, line)
            else:
                self.out.step_output_seen()  # a flood past the console is output, not silence
            if not shown and not state["said_cut"]:
                state["said_cut"] = True
                self.out.warn(f"step {name}: output past {self.ev.step_log_head_bytes} bytes is no longer shown; "
                              "its log keeps the last part")
            if state["unmetered"] >= _METER_EVERY_BYTES:
                # Printed bytes leave the host and are billed: they can move the money deadline earlier.
                self.meter.add_bytes(down=state["unmetered"])
                state["unmetered"] = 0
                if self.meter.cut_by_cap():  # the bytes, a re-price or the clock: the meter says which cap
                    raise CapReachedError(f"step {name} stopped: {self.meter.cap_reached()}")

        def settle() -> None:
            say_skipped()
            self.meter.add_bytes(down=state["unmetered"])
            state["unmetered"] = 0

        return on_line, settle, on_partial

    def run_steps(self) -> None:
        """The profile's steps in order; the first that fails, times out or meets the cap ends the work."""
        # VH_MASKED_ENV names the secrets, whose values host-side evidence must mask; settings are recorded.
        # Python's stdout to a pipe is block-buffered: unbuffered, its prints arrive in the order printed
        # (unless the user's own settings say otherwise).
        env = ({"PYTHONUNBUFFERED": "1"} | self.spec.host_env | self.step_env
               | {"VH_RUN_ID": self.run_id, "VH_MASKED_ENV": " ".join(self.spec.remote_secrets)})
        for step in self.steps_to_run if self.steps_to_run is not None else self.spec.profile.steps:
            self._check_cancelled()
            self.meter.check(f"step {step.name}")
            started = self.meter.now()
            timeout = max(0.05, self.meter.deadline(step.timeout_s) - started)
            log = self.ev.step_log(step.name)
            on_line, settle, on_partial = self._step_printer(step.name, log, started)
            self._phase(f"step {step.name}")
            self.out.info(f"step {step.name} (timeout {timeout:.0f} s)")
            cut: CapReachedError | None = None
            interrupted: Interrupted | None = None
            try:
                # stderr into stdout on the host: one stream keeps the program's print order (two SSH streams
                # are read apart and interleave as they arrive); the cost is that stderr is no longer told apart
                outcome = self.session.run(f"exec 2>&1; cd {self._step_dir} && {step.run}", on_line=on_line,
                                           timeout_s=timeout, env=env, stop=self.cancelled, on_partial=on_partial)
            except CapReachedError as exc:  # raised from inside the drain: the channel is closed already
                cut = exc
                outcome = StepOutcome(rc=None, seconds=self.meter.now() - started, timed_out=True, detail=str(exc))
            except Interrupted as exc:  # Ctrl-C mid-step: the step is recorded, then the run tears down
                interrupted = exc
                outcome = StepOutcome(rc=None, seconds=self.meter.now() - started, detail=f"interrupted by {exc}")
            finally:
                settle()
                log.close()
            capped = outcome.timed_out and cut is None and (timeout < step.timeout_s or self.meter.cut_by_cap())
            if capped:  # not the step's own timeout: say so where the step is recorded
                outcome = outcome.model_copy(update={"detail": f"stopped after {outcome.seconds:.1f} s: "
                                                               f"{self.meter.cap_reached()} (the step's own "
                                                               f"timeout is {step.timeout_s:g} s)"})
            record = StepRecord(name=step.name, rc=outcome.rc, seconds=round(outcome.seconds, 3),
                                timed_out=outcome.timed_out, connection_lost=outcome.connection_lost,
                                interrupted=interrupted is not None,
                                workload=step.workload, detail=outcome.detail, log_bytes=log.total_bytes,
                                log_dropped_bytes=log.dropped_bytes, output_left_open=outcome.output_left_open)
            if outcome.connection_lost and not self.cancelled.is_set() and interrupted is None:
                why_not = self.session.reopen()  # for the evidence pull; the step is never re-run
                record.reconnect_ok = why_not is None
                if why_not is not None:
                    self.out.warn(f"step {step.name}: {why_not}")
            if outcome.output_left_open:
                self.out.warn(f"step {step.name}: a background process it started kept its output open; the step "
                              f"ended on its exit status (rc {outcome.rc}) and that process runs on until the "
                              "instance is deleted (its later output is not shown)")
            self.steps.append(record)
            self.t_last_step_end_unix = time.time()
            self.t_last_step_end_mono = self.meter.now()
            self.ev.append_step_tsv(record.name, record.rc, record.seconds, end=next(
                (k for k in ("interrupted", "timed_out", "connection_lost") if getattr(record, k)), ""))
            self.out.step_done(record, self.meter.accrued_usd())
            if interrupted is not None:
                raise interrupted
            if cut is not None:
                raise cut
            self._check_cancelled()
            if capped:
                raise CapReachedError(f"step {step.name} {outcome.detail}")
            if outcome.timed_out:
                raise StepFailedError(f"step {step.name} timed out after {step.timeout_s:g} s", step=step.name)
            if outcome.connection_lost:
                raise StepFailedError(f"step {step.name}: connection lost ({outcome.detail}); reconnect "
                                      f"{'succeeded' if record.reconnect_ok else 'failed'}; not re-run",
                                      step=step.name)
            if outcome.rc is None:  # no exit status: what happened instead is the user's only lead
                raise StepFailedError(f"step {step.name} ended without an exit status: {outcome.detail or 'no detail'}",
                                      step=step.name)
            if outcome.rc != 0:
                raise StepFailedError(f"step {step.name} failed with rc={outcome.rc}", step=step.name, rc=outcome.rc)

    @property
    def _step_dir(self) -> str:
        """Where the steps run on the host: the uploaded workdir for a `run`, else the harness's bundle."""
        return f"~/{REMOTE_DIR}/{WORKDIR_DIR}" if self.spec.profile.workdir is not None else f"~/{REMOTE_DIR}"

    def _redact_pulled(self, under: str = "remote", *, contents: bool = True) -> list[str]:
        """Secrets in what the host wrote are masked before anything reads or hashes it (the manifest and the
        report come after), whatever way the pull ended; the names of the files that held one are recorded.
        A file that cannot be masked is an evidence write failure (the run cannot pass with it). Without
        `contents` (artifacts: the user's bytes) only names are masked."""
        redact, root = self.spec.redactor, self.ev.dir / under
        if not redact:
            return []
        changed = []
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            name = path.relative_to(root).as_posix()
            try:
                masked_name = redact.text(name)
                if masked_name != name:  # a secret in a file's name (the host chose it): the name is masked too
                    target = root / masked_name
                    while target.exists():
                        target = target.with_name(target.name + "~")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    path = path.rename(target)
                    name = target.relative_to(root).as_posix()
                    if contents:
                        redact.file(path)
                    changed.append(name)
                elif contents and redact.file(path):
                    changed.append(name)
            except OSError as exc:
                self.ev.write_failures.append(f"{under}/{redact.text(name)}: could not mask a secret "
                                              f"({exc.strerror or exc})")
        # A folder named after a secret: its files moved to the masked name above; the name itself must go too.
        for folder in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
            name = folder.relative_to(root).as_posix()
            if redact.text(name) != name:
                try:
                    if any(folder.iterdir()):  # only what no file of it was moved out of: keep it, masked
                        target = root / redact.text(name)
                        while target.exists():
                            target = target.with_name(target.name + "~")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        folder.rename(target)
                    else:
                        folder.rmdir()
                except OSError as exc:
                    self.ev.write_failures.append(f"{under}/{redact.text(name)}: could not mask a secret in a "
                                                  f"folder's name ({exc.strerror or exc})")
        return changed

    def pull_evidence(self, *, in_teardown: bool, max_s: float | None = None) -> None:
        """Pull the host's evidence with a deadline and a size budget, both from the meter.

        In the run, a pull the cap cuts is a cap stop (exit 6). In teardown it is best effort: it may use a
        share of the teardown margin, a signal abandons it, and it never delays the DELETE beyond that.
        """
        if self.evidence_pulled:
            return
        if not in_teardown:
            self.meter.check("the evidence pull")  # before marking it done: the teardown still tries, briefly
        self.evidence_pulled = True
        self._phase("pull")
        start = self.meter.now()
        work_deadline = self.meter.work_deadline(start)
        if in_teardown:
            deadline = min(start + PULL_MAX_S, max(work_deadline, start) + self.meter.budget.pull_grace_s,
                           self.meter.prelude_deadline(start))
        else:
            deadline = min(start + PULL_MAX_S, work_deadline)
        own_bound_first = start + PULL_MAX_S < work_deadline  # the pull's own bound, not a cap, ends it
        if max_s is not None:  # a signal: the DELETE must not wait for more than this
            deadline = min(deadline, start + max_s)
        affordable = self.meter.affordable_down_bytes(deadline)
        budget = min(float(PULL_MAX_BYTES), affordable)
        self.pull = PullRecord(deadline_s=round(deadline - start, 3), max_bytes=budget)
        if deadline <= start:
            self.pull.detail = "no time left for the pull before the teardown"
            self.out.warn("no time left to pull the host's evidence; going straight to teardown")
            return
        if not self.session.is_active():  # lost in a step (or since): the evidence is still on the host
            why_not = self.session.reopen(timeout_s=deadline - self.meter.now())
            if why_not is not None:
                self.pull.detail = f"the SSH link is down and {why_not}: the host's evidence was not pulled"
                self.out.warn(f"could not pull the host's evidence: {self.pull.detail}")
                return
            self.out.info("the SSH link was lost; pulling the host's evidence over a new connection")
        # In the run a cancel (a re-price that breaks the cap) ends it too; in teardown only a second signal.
        abandon = self._hurry if in_teardown else self.cancelled.is_set
        try:
            pulled = self.session.pull_tree(f"{REMOTE_DIR}/evidence", self.ev.dir / "remote", deadline=deadline,
                                            max_bytes=budget, on_bytes=lambda n: self.meter.add_bytes(down=n),
                                            abandon=abandon)
        except Exception as exc:  # noqa: BLE001 - evidence is best effort; the teardown must still run
            self.pull.detail = f"{type(exc).__name__}: {exc}"
            self.out.warn(f"could not pull the host's evidence: {exc}")
            return
        except Interrupted as exc:
            # Files copied whole are kept. In the run, the teardown's own pull tries once more (briefly: the
            # DELETE goes first) and its record names what stayed on the host.
            self.pull.detail = f"interrupted by {exc}"
            self.evidence_pulled = in_teardown
            raise
        finally:
            self.timings["pull_s"] = round(self.meter.now() - start, 3)
            masked = self._redact_pulled()
            if self.pull is not None:
                self.pull.redacted = masked
        self.pull = self.pull.model_copy(update={"files": len(pulled.files), "bytes": pulled.bytes,
                                                 "skipped": pulled.skipped, "left": pulled.left,
                                                 "renamed": pulled.renamed, "symlink": pulled.symlink,
                                                 "complete": pulled.complete, "detail": pulled.detail})
        if pulled.symlink:
            self.out.warn(f"the host's evidence was not pulled: {pulled.detail}")
        self._pull_artifacts(deadline=deadline, max_bytes=budget - pulled.bytes, abandon=abandon)
        if pulled.renamed:
            self.out.warn(f"{len(pulled.renamed)} host file name(s) held control characters: saved under escaped "
                          "names (harness-result.json pull.renamed maps them)")
        self.out.info(f"pulled {len(pulled.files)} evidence file(s), {pulled.bytes} bytes"
                      + ("" if pulled.complete else f"; incomplete: {pulled.detail}"))
        if in_teardown:
            return
        if pulled.complete:
            self._check_artifacts(deadline, affordable)
            return
        self._check_cancelled()  # cut by a cancel: its reason is the run's
        if pulled.symlink:
            raise HarnessError(f"the host's evidence is incomplete: {pulled.detail}")
        got = f"{len(pulled.files)} file(s), {pulled.bytes} bytes pulled"
        if self.meter.cut_by_cap(deadline) and own_bound_first:
            # e.g. a host file appended to for ever: the pull's bound ended it with money and time to spare
            raise HarnessError(f"the host's evidence is incomplete: the pull's own {PULL_MAX_S:g} s bound ended it "
                               f"({got}); left on the host: {_left_on_host(pulled)}")
        if self.meter.cut_by_cap(deadline) or (pulled.skipped and affordable < PULL_MAX_BYTES):
            raise CapReachedError(f"cap reached during the evidence pull ({got}; left on the host: "
                                  f"{_left_on_host(pulled)}): {pulled.detail}")
        if pulled.skipped:
            raise HarnessError(f"the host's evidence is over the {PULL_MAX_BYTES}-byte pull budget: "
                               f"{len(pulled.skipped)} file(s) left on the host")
        # A link that broke or stalled: the workload passed, but its evidence did not all come back.
        raise HarnessError(f"the host's evidence pull broke off ({len(pulled.files)} file(s) pulled): "
                           f"{pulled.detail}")

    def _pull_artifacts(self, *, deadline: float, max_bytes: float, abandon: Callable[[], bool]) -> None:
        """`run --artifact`: the globs from the host's workdir into <run>/artifacts/, with what is left of the
        evidence pull's deadline and budget, byte for byte (host/artifacts.py); a secret in one is a warning."""
        globs = self.spec.profile.artifacts
        if not globs or self.meter.now() >= deadline:
            if globs:
                self.artifacts = ArtifactPull(globs=list(globs), detail="no time left for the artifact pull")
            return
        got: ArtifactPull | None = None
        try:
            got = pull_artifacts(self.session, f"{REMOTE_DIR}/{WORKDIR_DIR}", ArtifactGlobs(globs),
                                 self.ev.dir / ARTIFACTS_DIR, deadline=deadline, max_bytes=max(0.0, max_bytes),
                                 on_bytes=lambda n: self.meter.add_bytes(down=n), abandon=abandon)
        except Exception as exc:  # noqa: BLE001 - evidence is best effort; the teardown must still run
            got = ArtifactPull(globs=list(globs), detail=f"{type(exc).__name__}: {exc}")
        finally:  # a signal too: what arrived is named and recorded before the teardown goes on
            got = got or ArtifactPull(globs=list(globs), detail="interrupted")
            got.redacted = sorted({*got.redacted, *self._redact_pulled(ARTIFACTS_DIR, contents=False)})  # bytes: the user's
            self.artifacts = got
        self.out.info(f"pulled {len(got.files)} artifact(s), {got.bytes} bytes, into "
                      f"{self.ev.dir / ARTIFACTS_DIR}" + ("" if got.complete else f"; incomplete: {got.detail}"))
        if got.symlink:
            self.out.warn(f"the artifacts were not pulled: {got.detail}")
        for name, secrets in got.secrets_found.items():
            self.out.warn(f"artifact {name} holds {' and '.join(spoken(s) for s in secrets)}: kept byte for byte and private (0600); "
                          "do not share it as it is")
        if got.unverified:
            self.out.warn(f"{len(got.unverified)} artifact(s) not checked against the host's sha256 (the host "
                          f"could not hash them): {', '.join(got.unverified[:5])}")

    def _check_artifacts(self, deadline: float, affordable: float) -> None:
        """An artifact pull that did not bring everything back fails the run, as incomplete evidence does: exit
        6 when the cap cut it, else 1 naming the glob or the files (docs/run.md)."""
        got = self.artifacts
        if got is None or got.complete:
            return
        self._check_cancelled()
        if self.meter.cut_by_cap(deadline) or (got.skipped and affordable < PULL_MAX_BYTES):
            raise CapReachedError(f"cap reached during the artifact pull: {got.detail}")
        raise HarnessError(f"the artifacts are incomplete: {got.detail}")


def _left_on_host(pulled: TreePull, shown: int = 5) -> str:
    """What a cut pull left: the file being copied, the ones over the budget, then those listed but not reached."""
    names = list(dict.fromkeys([*pulled.left[:1], *pulled.skipped, *pulled.left[1:]]))
    if not names:
        return "files not yet listed (the pull was cut before listing them)"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    cut = " (cut while copying)" if pulled.left and names[0] == pulled.left[0] else ""
    return ", ".join([names[0] + cut, *names[1:shown]]) + more
