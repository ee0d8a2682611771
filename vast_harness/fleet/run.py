"""`vast-e2e fleet`: one guarded run per GPU type, up to K at once, under one total dollar cap.

The preflight (`fleet/plan.py`) picks, per GPU type, the offer a single run would and refuses the fleet before
anything is rented when it cannot fit. Then the runs, each a normal `GuardedRun` (own label
`vh-<run_id>-d<deadline>`, own registration, own stamped lines in the user's ledger that `reap` reads, own
evidence directory and absence proof) under `<evidence-dir>/fleet-<id>/`, beside the fleet ledger `fleet.jsonl`.
While they run, a monitor on the calling thread sums the runs' accrued dollars plus a teardown reserve per live
instance and cancels every run when that reaches the total cap. The runs share one client, serialised per
endpoint (`VastClient.serialize_endpoints`): the fleet never has two requests to one Vast endpoint in flight.

Policies: a run's failure does not stop the others (the shared cap is what they share, and the monitor guards
it; an instance left unproven keeps counting as billing). SIGINT/SIGTERM/SIGHUP cancel every run (exit 130
each); a second signal only says teardown is in progress. The fleet's exit code is the worst run's by
errors.PRECEDENCE: 3 (an instance may still bill) beats everything. A fleet-ledger line that cannot be written
(disk full, read-only) never stops the monitor or a teardown: it is recorded, and a fleet that would pass exits 1
(its evidence is incomplete), as a single run does for its own lost writes.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from vast_harness.caps.meter import usd_up
from vast_harness.console.output import Output, RunOutput
from vast_harness.console.terminal import line
from vast_harness.errors import PRECEDENCE, ExitCode, LedgerWriteError, NoOfferError, describe, exit_code_for, worst
from vast_harness.fleet.plan import SIM_PEAK_SCALE, FleetEntry, Preflight, preflight, print_preflight
from vast_harness.host.bundle import bundle_for
from vast_harness.run.runner import GuardedRun
from vast_harness.run.signals import SignalHandler
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.ledger import new_run_id, write_line
from vast_harness.vast.client import VastClient

MONITOR_INTERVAL_S = 0.2
FLEET_LEDGER_FILE = "fleet.jsonl"
PASSING = (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER)


class FleetLedger:
    """`fleet.jsonl`: one line per fleet event (start, each run's start and end, cancels, end), written as the
    user's ledger is (`ledger.write_line`: whole, under `flock`, fsync'd, never swallowed by a torn line).

    Best effort: a line that did not reach the disk is kept in `write_failures`, never raised. The monitor and
    the runs' teardowns must go on whatever the disk does; money-safety rests on the user's ledger, which each
    run writes itself. The fleet's exit then says its record is incomplete.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.write_failures: list[str] = []
        self._lock = threading.Lock()

    def append(self, event: str, **fields: Any) -> bool:
        """Whether the line reached the disk."""
        data = (json.dumps({"t_unix": time.time(), "event": event, **fields}, default=str) + "\n").encode()
        try:
            write_line(self.path, data, what="the fleet ledger")
        except LedgerWriteError as exc:
            with self._lock:
                self.write_failures.append(f"{event}: {exc}")
            return False
        return True


@dataclass
class RunOutcome:
    gpu: str
    run_id: str | None
    exit_code: ExitCode
    message: str
    evidence_dir: Path | None = None
    accrued_usd: float = 0.0


@dataclass
class Fleet:
    """The running fleet: workers execute runs, the calling thread monitors the total and handles signals."""

    pre: Preflight
    client: VastClient
    drivers: DriverPolicy
    root: Path  # the evidence directory: the fleet's own directory goes under it
    parallel: int
    fleet_id: str = field(default_factory=lambda: new_fleet_id())
    quiet: bool = False
    err: Output = field(default_factory=lambda: Output(json_mode=True))
    runs: dict[str, GuardedRun] = field(default_factory=dict)
    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    stop_reason: str = ""
    stop_code: ExitCode = ExitCode.PASSED
    cap_events: list[dict[str, float]] = field(default_factory=list)
    message: str = ""  # what the exit code alone does not say (an incomplete fleet ledger)

    def __post_init__(self) -> None:
        self.dir = self.root / self.fleet_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = FleetLedger(self.dir / FLEET_LEDGER_FILE)
        # Before any worker starts: the runs' lifecycles share this client, one request per endpoint at a time.
        self.client.serialize_endpoints()
        self._lock = threading.Lock()
        self._signal: int | None = None
        self._signals_seen = 0

    def _record(self, event: str, **fields: Any) -> None:
        """A fleet-ledger line; the first that fails says so on stderr, and the fleet goes on."""
        if not self.ledger.append(event, **fields) and len(self.ledger.write_failures) == 1:
            self.err.warn(f"{self.ledger.write_failures[0]}; the fleet goes on (every run still tears down), "
                          "and its exit will say the fleet ledger is incomplete")

    def _verdict(self, code: ExitCode) -> tuple[ExitCode, str]:
        """The worst run's code, unless the fleet's own record is incomplete: then a pass is a failure (exit 1)."""
        failures = self.ledger.write_failures
        if not failures:
            return code, ""
        what = (f"the fleet ledger {self.ledger.path} is incomplete: {len(failures)} write(s) failed: "
                f"{'; '.join(failures[:3])}" + ("; ..." if len(failures) > 3 else ""))
        if code in PASSING:
            return ExitCode.FAILED, f"every run passed and is proven absent, but {what}"
        return code, what

    # ---------------------------------------------------------------------------------- the total cap
    def accrued_usd(self) -> float:
        with self._lock:
            runs = list(self.runs.values())
        return sum(r.accrued_usd() for r in runs)

    def teardown_reserve_usd(self) -> float:
        """What the live instances will still cost until their teardown ends (the runs' own margin)."""
        with self._lock:
            runs = list(self.runs.values())
        return sum(r.spec.teardown_margin_s * i.dph_usd / 3600.0 for r in runs for i in list(r.created)
                   if i.absence is None)

    def cancel_all(self, reason: str, exit_code: ExitCode) -> None:
        with self._lock:
            first = not self.stop_reason
            if first:
                self.stop_reason, self.stop_code = reason, exit_code
            runs = list(self.runs.values())
        if first:
            self._record("cancel", reason=reason, exit_code=exit_code)
            self.err.err.print(line(("fleet:", "bold red"), f" {reason}: cancelling {len(runs)} run(s); each is "
                                    "deleted and proven absent"))
        for run in runs:
            run.cancel(reason, exit_code=exit_code)

    def _check_cap(self) -> None:
        spent, reserve = self.accrued_usd(), self.teardown_reserve_usd()
        if spent + reserve >= self.pre.total_usd and not self.stop_reason:
            self.cap_events.append({"t_unix": time.time(), "accrued_usd": spent, "reserve_usd": reserve})
            self.cancel_all(f"fleet total cap ${self.pre.total_usd:.4f} reached (accrued ${spent:.4f} + teardown "
                            f"reserve ${reserve:.4f})", ExitCode.CAP_REACHED)

    # ---------------------------------------------------------------------------------- the runs
    def _worker(self, work: queue.Queue[FleetEntry]) -> None:
        while True:
            try:
                entry = work.get_nowait()
            except queue.Empty:
                return
            self._one(entry)

    def _one(self, entry: FleetEntry) -> None:
        run_spec = entry.spec.model_copy(update={"evidence_dir": self.dir})
        with self._lock:  # registered under the lock, so a cancel_all either sees this run or stops it here
            stopped = self.stop_reason
            if not stopped:
                # Its lines go to the user's ledger (the state dir's), stamped like any run's: `reap` finds them.
                run = GuardedRun(run_spec, self.client, self.drivers, RunOutput(entry.gpu, quiet=self.quiet),
                                 run_id=new_run_id())
                self.runs[entry.gpu] = run
        if stopped:
            self.outcomes[entry.gpu] = RunOutcome(entry.gpu, None, self.stop_code, f"not started: {stopped}")
            self._record("run-skipped", gpu=entry.gpu, reason=stopped)
            return
        self._record("run-start", gpu=entry.gpu, run_id=run.run_id, label_prefix=f"vh-{run.run_id}-",
                     evidence_dir=str(run.ev.dir), planned_offer=entry.row())
        try:
            result = run.execute()
            code, message = result.exit_code, result.message
        except Exception as exc:  # noqa: BLE001 - execute already tore down; record, never lose the outcome
            code, message = exit_code_for(exc), describe(exc)
        accrued = run.accrued_usd()
        self.outcomes[entry.gpu] = RunOutcome(entry.gpu, run.run_id, code, message, run.ev.dir, accrued)
        self._record("run-end", gpu=entry.gpu, run_id=run.run_id, exit_code=code, message=message,
                     accrued_usd=usd_up(accrued), absence={t.instance_id: t.verdict for t in run.teardowns})

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self._signals_seen > 1:
            self.err.err.print(line((f"{signal.Signals(signum).name}: teardown is in progress and will finish; "
                                     "it cannot be skipped", "yellow")))
            return
        self._signal = signum  # acted on by the monitor loop (never take a lock inside a handler)

    def run(self) -> ExitCode:
        self._record("fleet-start", fleet_id=self.fleet_id, parallel=self.parallel, **self.pre.summary())
        work: queue.Queue[FleetEntry] = queue.Queue()
        for entry in self.pre.entries:
            work.put(entry)
        workers = [threading.Thread(target=self._worker, args=(work,), name=f"fleet-worker-{i}")
                   for i in range(max(1, min(self.parallel, len(self.pre.entries))))]
        previous: dict[signal.Signals, SignalHandler] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            for w in workers:
                w.start()
            while any(w.is_alive() for w in workers):
                if self._signal is not None and not self.stop_reason:
                    self.cancel_all(f"interrupted by {signal.Signals(self._signal).name}", ExitCode.INTERRUPTED)
                self._check_cap()
                for w in workers:
                    w.join(timeout=MONITOR_INTERVAL_S / max(1, len(workers)))
        finally:
            for w in workers:  # only reached early by a bug in the loop: the runs still finish their teardown
                w.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        runs_code = worst([o.exit_code for o in self.outcomes.values()])
        code, self.message = self._verdict(runs_code)
        self._record("fleet-end", exit_code=code, accrued_usd=usd_up(self.accrued_usd()),
                     outcomes={g: o.exit_code for g, o in self.outcomes.items()})
        code, self.message = self._verdict(runs_code)  # the end line itself may be the one that failed
        return code


def new_fleet_id() -> str:
    return new_run_id("fleet-")


def run_fleet(base: RunSpec, gpus: list[str], client: VastClient, drivers: DriverPolicy, out: Output, *,
              total_usd: float, per_run_usd: float, parallel: int, allow_overcommit: bool = False) -> ExitCode:
    """The whole `fleet` command after validation: preflight, (dry run stops), runs, report. Returns the exit."""
    from vast_harness.reports.fleet import (
        FLEET_RESULT_NAME,
        build_rows,
        print_table,
        write_fleet_report,
        write_fleet_result,
    )

    pre = preflight(base, gpus, client, drivers, bundle_for(base), total_usd=total_usd, per_run_usd=per_run_usd,
                    allow_overcommit=allow_overcommit)
    print_preflight(out, pre, title="Fleet: the offer each GPU type's run would rent")
    if base.sim and base.profile.require_gpu:
        out.info(f"--sim: simulated hosts have no GPU; each run executes the smoke profile's tiny CPU steps with "
                 f"a nominal peak per GPU type ({SIM_PEAK_SCALE:g} × its bf16 peak)")
    refusal = pre.refusal()
    if refusal or base.dry_run:
        code = NoOfferError.exit_code if refusal else ExitCode.PASSED
        if refusal:
            out.error(f"fleet refused before renting anything: {refusal}")
        if out.json_mode:
            out.emit_json({"dry_run": base.dry_run, "preflight": pre.summary(), "exit_code": code,
                           **({"error": refusal} if refusal else {})})
        elif not refusal:
            out.out.print(line(("dry run: nothing was created", "dim")))
        return code
    fleet = Fleet(pre, client, drivers, base.evidence_dir, parallel, quiet=out.quiet)
    out.info(f"fleet {fleet.fleet_id}: {len(pre.entries)} run(s), {parallel} at once; evidence in {fleet.dir}")
    code = fleet.run()
    rows = build_rows(list(fleet.outcomes.values()))
    summary = {"fleet_id": fleet.fleet_id, "dir": str(fleet.dir), "exit_code": code, "total_cap_usd": total_usd,
               "per_run_usd": per_run_usd, "accrued_usd": round(fleet.accrued_usd(), 6),
               "stop_reason": fleet.stop_reason or None, "message": fleet.message or None,
               "fleet_ledger_write_failures": fleet.ledger.write_failures, "cap_events": fleet.cap_events,
               "sim": base.sim, "preflight": pre.summary(), "exit_precedence": [int(c) for c in PRECEDENCE]}
    report: Path | None
    try:
        report = write_fleet_report(fleet.dir, fleet.fleet_id, rows, summary)
    except OSError as exc:  # a full or read-only disk: every run has ended and torn down; say what is missing
        report = None
        if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER):  # evidence incomplete is never a pass
            code = ExitCode.FAILED
        why, before = exc.strerror or str(exc), fleet.message

        def said(what: str) -> str:
            lost = f"the fleet's {what} could not be written in {fleet.dir}: {why}"
            return f"{before}; {lost}" if before else lost

        fleet.message = said("report")
        summary["exit_code"], summary["message"] = code, fleet.message
        try:  # the result file (small) must say what the process says, or not exist
            write_fleet_result(fleet.dir, rows, summary)
        except OSError:
            (fleet.dir / FLEET_RESULT_NAME).unlink(missing_ok=True)
            fleet.message = summary["message"] = said("result and report")
    print_table(out, rows, title=f"Fleet {fleet.fleet_id}: ranked by measured TFLOP/s per $/h (the receipt), "
                                            "then $ per million training tokens")
    if fleet.message:
        out.error(fleet.message)
    if out.json_mode:
        from dataclasses import asdict

        out.emit_json(summary | {"report": str(report) if report else None, "rows": [asdict(r) for r in rows]})
    else:
        color = "green" if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) else "red"
        out.out.print(line((f"fleet exit {code}", color),
                           f" (worst run by {'>'.join(str(int(c)) for c in PRECEDENCE)}); "
                           f"accrued ${summary['accrued_usd']:.4f} of ${total_usd:.2f}; report {report or 'not written'}"))
    return code
