"""`vast-e2e fleet`: one guarded run per GPU type, up to K at once, under one total dollar cap.

Order: per GPU type, the offer a single run would pick (same filters, driver qualification and quote); the
fleet is refused before anything is rented when the summed worst cases exceed the total cap or the credit
(exit 5, with the table). Then the runs, each a normal `GuardedRun` (own label `vh-<run_id>-d<deadline>`, own
registration, own stamped lines in the user's ledger that `reap` reads, own evidence directory and absence proof) under `<evidence-dir>/fleet-<id>/`,
beside the fleet ledger `fleet.jsonl`. While they run, a monitor on the calling thread sums the runs' accrued
dollars plus a teardown reserve per live instance and cancels every run when that reaches the total cap.

Policies: a run's failure does not stop the others (the shared cap is what they share, and the monitor guards
it; an instance left unproven keeps counting as billing). SIGINT/SIGTERM/SIGHUP cancel every run (exit 130
each); a second signal only says teardown is in progress. The fleet's exit code is the worst run's by
errors.PRECEDENCE: 3 (an instance may still bill) beats everything.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.text import Text

from vast_harness.bundle import Bundle, build_bundle
from vast_harness.client import VastClient
from vast_harness.config import Caps, DriverPolicy, RunSpec, load_profile
from vast_harness.endpoints import ENDPOINT_PATHS
from vast_harness.errors import PRECEDENCE, ConfigError, ExitCode, NoOfferError, describe, exit_code_for, worst
from vast_harness.evidence import StepRecord
from vast_harness.ledger import new_run_id
from vast_harness.lifecycle import InstanceTeardown
from vast_harness.output import Output, line, safe_cells, safe_text
from vast_harness.pacing import endpoint_key
from vast_harness.plan import RunPlan, account_credit_usd, plan_run
from vast_harness.resources import data_root
from vast_harness.runner import GuardedRun, SignalHandler

MONITOR_INTERVAL_S = 0.2
# On --sim the tiny CPU round stands in for the GPU workload; its MFU is against a nominal peak per GPU type
# (the sourced bf16 peak scaled down to what one CPU core reaches), so the figures differ per type.
SIM_PEAK_SCALE = 2e-4
SIM_FALLBACK_PEAK_TFLOPS = 100.0


def parse_gpus(text: str) -> list[str]:
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise ConfigError('--gpus: give one or more GPU names separated by commas, e.g. "RTX 4090,H100 SXM"')
    return names


def sim_peak_table() -> list[tuple[list[str], float]]:
    """The workload's sourced peak table, read as data (`remote/peaks.json`): the control plane never imports
    `remote/`, which ships to the host as files and is not installed as a package."""
    doc = json.loads((data_root() / "remote" / "peaks.json").read_text())
    return [([str(n) for n in row["match_all"]], float(row["tflops"])) for row in doc["peaks"]]


def nominal_sim_peak_tflops(gpu: str) -> float:
    """The sourced bf16 peak (matched as remote/mfu.py matches it) scaled down to what one CPU core reaches;
    a GPU with no sourced peak gets SIM_FALLBACK_PEAK_TFLOPS."""
    name = gpu.lower()
    peak = SIM_FALLBACK_PEAK_TFLOPS
    for needles, tflops in sim_peak_table():
        if all(n in name for n in needles):
            peak = tflops if tflops > 0 else SIM_FALLBACK_PEAK_TFLOPS
            break
    return round(peak * SIM_PEAK_SCALE, 6)


def spec_for_gpu(base: RunSpec, gpu: str, per_run_usd: float) -> RunSpec:
    """The single run's spec for one GPU type: the base filters with this GPU name, the per-run cost cap."""
    spec = base.model_copy(update={"filters": base.filters.model_copy(update={"gpu_names": [gpu]}),
                                   "caps": Caps(max_usd=per_run_usd, max_minutes=base.caps.max_minutes)})
    if not base.sim:
        return spec
    # Simulated hosts have no GPU: run the smoke profile's tiny CPU steps (same filters, image and caps).
    profile = spec.profile
    if profile.require_gpu:
        smoke = load_profile("smoke")
        profile = profile.model_copy(update={"name": f"{profile.name} (--sim: the smoke steps)", "steps": smoke.steps,
                                             "require_gpu": False,
                                             "pytest_node_ids": [], "transfer": smoke.transfer})
    env = dict(spec.remote_env) | {"VH_PEAK_TFLOPS": str(nominal_sim_peak_tflops(gpu))}
    return spec.model_copy(update={"profile": profile, "remote_env": env})


@dataclass
class FleetEntry:
    gpu: str
    spec: RunSpec
    plan: RunPlan | None = None
    no_offer: str = ""  # why this GPU type has no offer

    @property
    def worst_case_usd(self) -> float:
        return self.plan.chosen.quote.worst_case_usd if self.plan else 0.0

    def row(self) -> dict[str, Any]:
        if self.plan is None:
            return {"gpu": self.gpu, "offer_id": None, "no_offer": self.no_offer}
        o, q = self.plan.chosen.offer, self.plan.chosen.quote
        return {"gpu": self.gpu, "offer_id": o.id, "num_gpus": o.num_gpus, "dph_usd": round(q.dph_at_disk_usd, 6),
                "driver": o.driver_version, "driver_qualified": self.plan.chosen.driver_qualified,
                "worst_case_usd": round(q.worst_case_usd, 6), "location": o.geolocation}


@dataclass
class Preflight:
    entries: list[FleetEntry]
    total_usd: float
    per_run_usd: float
    credit_usd: float
    allow_overcommit: bool = False

    @property
    def worst_case_sum_usd(self) -> float:
        return sum(e.worst_case_usd for e in self.entries)

    def refusal(self) -> str | None:
        missing = [e for e in self.entries if e.plan is None]
        if missing:
            return "no offer for " + "; ".join(f"{e.gpu}: {e.no_offer}" for e in missing)
        total = self.worst_case_sum_usd
        if total > self.credit_usd:
            return f"the summed worst cases ${total:.4f} exceed the credit ${self.credit_usd:.2f}"
        if total > self.total_usd and not self.allow_overcommit:
            return (f"the summed worst cases ${total:.4f} exceed the total cap --max-usd ${self.total_usd:.2f} "
                    "(raise it, drop a GPU type, shorten --max-minutes, or --allow-overcommit to let the live "
                    "monitor hold the total)")
        return None

    def summary(self) -> dict[str, Any]:
        return {"rows": [e.row() for e in self.entries], "worst_case_sum_usd": round(self.worst_case_sum_usd, 6),
                "total_cap_usd": self.total_usd, "per_run_usd": self.per_run_usd, "credit_usd": self.credit_usd,
                "allow_overcommit": self.allow_overcommit, "refused": self.refusal()}


def preflight(base: RunSpec, gpus: list[str], client: VastClient, drivers: DriverPolicy, bundle: Bundle, *,
              total_usd: float, per_run_usd: float, allow_overcommit: bool = False) -> Preflight:
    """Read-only: the offer each GPU type's run would pick, and whether the fleet fits its caps."""
    entries = []
    for gpu in gpus:
        entry = FleetEntry(gpu=gpu, spec=spec_for_gpu(base, gpu, per_run_usd))
        try:
            entry.plan = plan_run(entry.spec, client, drivers, bundle)
        except NoOfferError as exc:
            closest = exc.rejected[0].reasons if exc.rejected else []
            entry.no_offer = str(exc) + (f"; closest offer: {'; '.join(closest)}" if closest else "")
        entries.append(entry)
    credit = account_credit_usd(client)
    return Preflight(entries, total_usd, per_run_usd, credit, allow_overcommit)


class SerialClient:
    """The fleet's one client, shared by its runs, with one request per endpoint in flight at a time.

    Vast limits calls per endpoint and key as a minimum interval between arrivals. The client's pacer spaces a
    request from the *completion* of the previous one only when they do not overlap; runs on several threads
    would overlap (two creates reserved 4.5 s apart, the first sent late, both arriving closer than 4.5 s: a
    429 on a create, which is not retried). Holding a per-endpoint lock across each call keeps them in line.
    """

    def __init__(self, inner: VastClient) -> None:
        self._inner = inner
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock_for(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_") or name in ("close",):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "exchange":
                method = kwargs.get("method", args[0] if args else "")
                path = kwargs.get("path", args[1] if len(args) > 1 else "")
                key = endpoint_key(str(method), str(path)).split(" ", 1)[1]
            else:
                key = ENDPOINT_PATHS.get(name, name)
            with self._lock_for(key):
                return attr(*args, **kwargs)

        return call


class FleetLedger:
    """`fleet.jsonl`: one fsync'd line per fleet event (start, each run's start and end, cancels, end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, event: str, **fields: Any) -> None:
        line = (json.dumps({"t_unix": time.time(), "event": event, **fields}, default=str) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)


class RunOutput(Output):
    """A fleet run's progress: every line tagged with its GPU type, all on stderr (stdout is the fleet's)."""

    def __init__(self, tag: str, *, quiet: bool = False) -> None:
        super().__init__(json_mode=True, quiet=quiet, progress=False)  # several runs at once: tagged lines only
        self.tag = f"[{tag}]"

    def info(self, message: str) -> None:
        if not self.quiet:
            self.err.print(line((self.tag, "cyan"), " ", message))

    def warn(self, message: str) -> None:
        self.err.print(line((self.tag, "cyan"), " ", ("warning:", "yellow"), " ", message))

    def step_line(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, text: str) -> None:
        if not self.quiet:
            prefix = f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]"
            self.err.print(line((self.tag, "cyan"), (prefix, "dim"), " ", text))

    def result(self, run_id: str, code: int, message: str, evidence_dir: Path, steps: Sequence[StepRecord],
               teardowns: Sequence[InstanceTeardown], accrued_usd: float, report: Path | None = None) -> None:
        verdicts = ", ".join(f"{t.instance_id} {t.verdict}" for t in teardowns) or "nothing rented"
        color = "green" if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) else "red"
        self.err.print(line((self.tag, "cyan"), " ", (f"exit {code}", color),
                            f": {message}; {verdicts}; accrued ${accrued_usd:.4f}"
                            + (f"; report {report}" if report else "")))

    def step_done(self, step: StepRecord, accrued_usd: float) -> None:
        how = "interrupted" if step.interrupted else "timed out" if step.timed_out else f"rc {step.rc}"
        if not self.quiet:
            self.err.print(line((self.tag, "cyan"), f" step {step.name}: {how} in {step.seconds:.1f} s; "
                                                    f"accrued ${accrued_usd:.4f}"))

    def rejections(self, rejected: Sequence[Any], *, title: str) -> None:
        self.err.print(line((self.tag, "cyan"), f" {title}: {len(rejected)} offer(s)"))


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

    def __post_init__(self) -> None:
        self.dir = self.root / self.fleet_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = FleetLedger(self.dir / "fleet.jsonl")
        self._lock = threading.Lock()
        self._signal: int | None = None
        self._signals_seen = 0

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
            self.ledger.append("cancel", reason=reason, exit_code=exit_code)
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
            self.ledger.append("run-skipped", gpu=entry.gpu, reason=stopped)
            return
        self.ledger.append("run-start", gpu=entry.gpu, run_id=run.run_id, label_prefix=f"vh-{run.run_id}-",
                           evidence_dir=str(run.ev.dir), planned_offer=entry.row())
        try:
            result = run.execute()
            code, message = result.exit_code, result.message
        except Exception as exc:  # noqa: BLE001 - execute already tore down; record, never lose the outcome
            code, message = exit_code_for(exc), describe(exc)
        accrued = run.accrued_usd()
        self.outcomes[entry.gpu] = RunOutcome(entry.gpu, run.run_id, code, message, run.ev.dir, accrued)
        self.ledger.append("run-end", gpu=entry.gpu, run_id=run.run_id, exit_code=code, message=message,
                           accrued_usd=round(accrued, 6),
                           absence={t.instance_id: t.verdict for t in run.teardowns})

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self._signals_seen > 1:
            self.err.err.print(line((f"{signal.Signals(signum).name}: teardown is in progress and will finish; "
                                     "it cannot be skipped", "yellow")))
            return
        self._signal = signum  # acted on by the monitor loop (never take a lock inside a handler)

    def run(self) -> ExitCode:
        self.ledger.append("fleet-start", fleet_id=self.fleet_id, parallel=self.parallel, **self.pre.summary())
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
        codes = [o.exit_code for o in self.outcomes.values()]
        code = worst(codes)
        self.ledger.append("fleet-end", exit_code=code, accrued_usd=round(self.accrued_usd(), 6),
                           outcomes={g: o.exit_code for g, o in self.outcomes.items()})
        return code


def new_fleet_id() -> str:
    return new_run_id("fleet-")


def print_preflight(out: Output, pre: Preflight, *, title: str) -> None:
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in ("GPU", "offer", "n", "$/h", "driver", "qualified", "worst case $", "location / why no offer"):
        t.add_column(col, overflow="fold")
    for e in pre.entries:
        r = e.row()
        if e.plan is None:
            t.add_row(*safe_cells(e.gpu, "–", "–", "–", "–", "–", "–", safe_text(e.no_offer, "red")))
            continue
        t.add_row(*safe_cells(e.gpu, r["offer_id"], r["num_gpus"], f"{r['dph_usd']:.4f}", r["driver"],
                              "yes" if r["driver_qualified"] else Text("no", style="yellow"),
                              f"{r['worst_case_usd']:.4f}", r["location"]))
    console = out.err if out.json_mode else out.out
    console.print(t)
    console.print(line(("Summed worst case", "bold"), f" ${pre.worst_case_sum_usd:.4f} · total cap ${pre.total_usd:.2f} · "
                       f"per run ${pre.per_run_usd:.2f} · credit ${pre.credit_usd:.2f}"))


def run_fleet(base: RunSpec, gpus: list[str], client: VastClient, drivers: DriverPolicy, out: Output, *,
              total_usd: float, per_run_usd: float, parallel: int, allow_overcommit: bool = False) -> ExitCode:
    """The whole `fleet` command after validation: preflight, (dry run stops), runs, report. Returns the exit."""
    from vast_harness.fleet_report import build_rows, print_table, write_fleet_report

    pre = preflight(base, gpus, client, drivers, build_bundle(), total_usd=total_usd, per_run_usd=per_run_usd,
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
    fleet = Fleet(pre, SerialClient(client), drivers, base.evidence_dir, parallel,  # type: ignore[arg-type]
                  quiet=out.quiet)
    out.info(f"fleet {fleet.fleet_id}: {len(pre.entries)} run(s), {parallel} at once; evidence in {fleet.dir}")
    code = fleet.run()
    rows = build_rows(list(fleet.outcomes.values()))
    summary = {"fleet_id": fleet.fleet_id, "dir": str(fleet.dir), "exit_code": code, "total_cap_usd": total_usd,
               "per_run_usd": per_run_usd, "accrued_usd": round(fleet.accrued_usd(), 6),
               "stop_reason": fleet.stop_reason or None, "cap_events": fleet.cap_events, "sim": base.sim,
               "preflight": pre.summary(), "exit_precedence": [int(c) for c in PRECEDENCE]}
    report = write_fleet_report(fleet.dir, fleet.fleet_id, rows, summary)
    print_table(out, rows, title=f"Fleet {fleet.fleet_id}: ranked by $ per million training tokens")
    if out.json_mode:
        from dataclasses import asdict

        out.emit_json(summary | {"report": str(report), "rows": [asdict(r) for r in rows]})
    else:
        color = "green" if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) else "red"
        out.out.print(line((f"fleet exit {code}", color),
                           f" (worst run by {'>'.join(str(int(c)) for c in PRECEDENCE)}); "
                           f"accrued ${summary['accrued_usd']:.4f} of ${total_usd:.2f}; report {report}"))
    return code
