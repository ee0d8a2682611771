"""`vast-e2e costs`: what every run cost, from the ledger and the evidence, per run, per day, per profile, and in
total, real and simulated apart. Reads files only; calls no API.

A run's dollars are its record's `accrued_usd` (the cost meter: time at the rented price plus billed bytes).
The ledger is the index: every run it names is listed, its record found wherever it was written (the evidence
directory each line names, else the state directory's runs; `state.runs.runs_elsewhere`). A run the ledger
names but no record describes (killed with -9, a full disk) gets an estimate, marked `estimated`: from each
instance's create to its last acknowledged DELETE or proven absence at the price quoted on its create's
intent, or the highest its reads showed (`repriced` lines); without those lines it is `unrecorded`, not $0 (the Vast console's billing is the authority).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from vast_harness.caps.meter import usd_up
from vast_harness.console.output import Output
from vast_harness.console.terminal import line, safe_cells, terminal_safe
from vast_harness.evidence.host_data import number, read_json
from vast_harness.records import Attempt
from vast_harness.state.dirs import state_dir
from vast_harness.state.ledger import Ledger, LedgerEntry
from vast_harness.state.runs import RESULT_NAME, ledger_files, refuse_file_on_path, run_dirs, runs_elsewhere
from vast_harness.vast.url import is_loopback_url


class RunCost(BaseModel):
    run_id: str
    day: str  # UTC date the run started
    profile: str | None
    sim: bool
    accrued_usd: float | None  # None: no record (the ledger alone names it) and no estimate
    estimated: bool = False  # accrued_usd is the ledger's estimate (create -> DELETE x quoted $/h), not a record's
    exit_code: int | None
    instances: list[int]
    dir: str | None
    fleet: str | None = None
    held: bool = False  # a kept host still held: its dollars are its last command's figure, so far
    # An interruptible run's hosts (the record's `attempts`), and the caps its total is held against
    attempts: list[Attempt] = []
    max_usd: float | None = None
    worst_case_usd: float | None = None

    def attempts_line(self) -> str:
        """The run's total against its caps, host by host (an interruptible run's); '' for any other run."""
        if not self.attempts:
            return ""
        parts = [f"{a.instance_id} ({_span_s(a):.0f} s, ${a.accrued_usd:.4f}, {a.ended or 'open'})"
                 for a in self.attempts]
        caps = "".join([f" of the cap ${self.max_usd:.4f}" if self.max_usd is not None else "",
                        f" (worst case ${self.worst_case_usd:.4f})" if self.worst_case_usd is not None else ""])
        total = "unrecorded" if self.accrued_usd is None else f"${self.accrued_usd:.4f}"
        return f"run {self.run_id}: {len(self.attempts)} host(s), {total}{caps}: " + "; ".join(parts)


class Totals(BaseModel):
    runs: int = 0
    accrued_usd: float = 0.0
    unrecorded_runs: int = 0
    estimated_runs: int = 0  # in accrued_usd, as estimates


def _span_s(attempt: Attempt) -> float:
    return max(0.0, (attempt.ended_unix or attempt.started_unix) - attempt.started_unix)


def _attempts(doc: dict[str, Any]) -> list[Attempt]:
    """The record's hosts; a row that does not read as one is left out rather than failing `costs`."""
    rows: list[Any] = doc["attempts"] if isinstance(doc.get("attempts"), list) else []
    out: list[Attempt] = []
    for row in rows:
        try:
            out.append(Attempt.model_validate(row))
        except ValidationError:
            continue
    return out


def _utc(t_unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t_unix)) if t_unix else "–"


def _day(t_unix: float | None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t_unix)) if t_unix else "unknown"


def _from_record(path: Path) -> RunCost | None:
    doc, _ = read_json(path / RESULT_NAME)
    if not isinstance(doc, dict):
        return None
    phases: list[Any] = doc["phases"] if isinstance(doc.get("phases"), list) else []
    started = next((p.get("t_start_unix") for p in phases if isinstance(p, dict)), None) or doc.get("finished_unix")
    insts: list[Any] = doc["instances"] if isinstance(doc.get("instances"), list) else []
    code = doc.get("exit_code")
    caps: dict[str, Any] = doc["caps"] if isinstance(doc.get("caps"), dict) else {}
    attempts = _attempts(doc)
    # every host of the run: a kept host's record is its last command's, whose own instances are the latest host's
    ids = list(dict.fromkeys([a.instance_id for a in attempts] + [i["instance_id"] for i in insts
                                                                   if isinstance(i, dict)
                                                                   and isinstance(i.get("instance_id"), int)]))
    return RunCost(run_id=str(doc.get("run_id") or path.name), day=_day(number(started, low=0, high=1e11).value),
                   profile=doc.get("profile") if isinstance(doc.get("profile"), str) else None,
                   sim=bool(doc.get("sim")) or is_loopback_url(str(doc.get("api_url") or "")),
                   accrued_usd=number(doc.get("accrued_usd"), low=0, high=1e9, low_inclusive=True).value,
                   exit_code=code if isinstance(code, int) else None,
                   instances=ids,
                   dir=str(path), fleet=path.parent.name if path.parent.name.startswith("fleet-") else None,
                   attempts=attempts, max_usd=number(caps.get("max_usd"), low=0, high=1e9).value,
                   worst_case_usd=number(doc.get("worst_case_usd"), low=0, high=1e9, low_inclusive=True).value,
                   held=isinstance(doc.get("absence"), dict) and doc["absence"].get("verdict") == "held")


def ledger_paths(evidence_dir: Path) -> list[Path]:
    """The ledgers `costs` reads: the state dir's (its --sim part beside it); an --evidence-dir may hold an
    older one."""
    return ledger_files(evidence_dir)


def estimate_usd(entries: list[LedgerEntry]) -> float | None:
    """A run's cost from its ledger lines alone, or None when a line it needs is missing: per instance, its
    `created` line to its last `delete_ack` or `absence: gone` under its own label (a reap's included), at
    the $/h its label's intent quoted, or the highest a `repriced` line of it states. The last, not the first: a DELETE answered 200 may have deleted nothing
    (the run, killed before its re-read, never knew; the reap's DELETE did it). Every line's reader writes it
    after the event, so the span errs long, never short."""
    price: dict[str, float] = {}
    intent_t: dict[str, float] = {}
    start: dict[int, tuple[float, str]] = {}
    raised: dict[tuple[int, str], float] = {}  # the highest `repriced` $/h per (instance, label)
    for e in entries:
        if e.event == "intent":
            intent_t.setdefault(e.label, e.t_unix)
            if e.dph_usd is not None:
                price.setdefault(e.label, e.dph_usd)
        if e.instance_id is not None and e.event in ("created", "create_failed"):
            start.setdefault(e.instance_id, (e.t_unix, e.label))
        if e.event == "repriced" and e.instance_id is not None and e.dph_usd is not None:
            key = (e.instance_id, e.label)
            raised[key] = max(raised.get(key, 0.0), e.dph_usd)
    for e in entries:  # no create line names it (killed while its PUT was out): a reap found it by its label
        if e.instance_id is not None and e.instance_id not in start and e.label in intent_t:
            start[e.instance_id] = (intent_t[e.label], e.label)  # its bill began after the intent, not before
    end: dict[int, float] = {}
    for e in entries:
        if e.instance_id in start and e.label == start[e.instance_id][1] and \
                (e.event == "delete_ack" or (e.event == "absence" and e.verdict == "gone")):
            end[e.instance_id] = max(end.get(e.instance_id, e.t_unix), e.t_unix)
    if not start:
        return None
    total = 0.0
    for instance_id, (t0, label) in start.items():
        if instance_id not in end or label not in price:
            return None
        # a higher price the run's reads showed bills from the create, as the meter billed it
        dph_usd = max(price[label], raised.get((instance_id, label), 0.0))
        total += max(0.0, end[instance_id] - t0) / 3600.0 * dph_usd
    return total


def ledger_entries(ledgers: list[Path]) -> list[LedgerEntry]:
    """Every readable line of `ledgers`, oldest first."""
    return sorted((e for path in ledgers for e in Ledger(path).entries()), key=lambda e: e.t_unix)


def run_estimate(run_id: str, entries: list[LedgerEntry]) -> tuple[list[int], float | None]:
    """A run's instances and its cost from the ledgers' lines alone (`estimate_usd`; None when a line it needs
    is missing): for a run no record describes (killed with -9). `entries`: oldest first, every ledger's."""
    # Its instances: those its own lines name, and those a reap found by one of its labels (killed while its
    # PUT was out, the run never learnt the id).
    labels = {e.label for e in entries if e.run_id == run_id and e.event == "intent"}
    instances = sorted({e.instance_id for e in entries if e.instance_id is not None
                        and (e.run_id == run_id or (e.run_id.startswith("reap-") and e.label in labels))})
    if not instances:
        return [], None
    # Every line of a run, the reaps' included, is needed for the span: a reap deletes a killed run's host.
    return instances, estimate_usd([e for e in entries if e.run_id == run_id
                                    or (e.instance_id in instances and e.run_id.startswith("reap-"))])


def collect(evidence_dir: Path, ledgers: list[Path] | None = None) -> list[RunCost]:
    """Every run: those with a record here, then every run the ledgers name, its record found wherever it is
    (or its cost estimated from its lines)."""
    runs = {r.run_id: r for r in (_from_record(p) for p in run_dirs(evidence_dir)) if r is not None}
    if ledgers is None:
        ledgers = ledger_paths(evidence_dir)
    entries = ledger_entries(ledgers)
    by_run: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        by_run[e.run_id].append(e)
    elsewhere = runs_elsewhere(evidence_dir, ledgers) if by_run.keys() - runs.keys() else {}
    for run_id, lines in by_run.items():
        if run_id in runs or run_id.startswith("reap-"):  # a reap's lines name other runs' instances; it rents nothing
            continue
        found = _from_record(elsewhere[run_id]) if run_id in elsewhere else None
        if found is not None:
            runs[run_id] = found
            continue
        instances, estimate = run_estimate(run_id, entries)
        if not instances:  # an intent that never rented cost nothing
            continue
        runs[run_id] = RunCost(run_id=run_id, day=_day(lines[0].t_unix), profile=None,
                               sim=any(is_loopback_url(e.api_url) for e in lines if e.api_url),
                               accrued_usd=estimate, estimated=estimate is not None, exit_code=None,
                               instances=instances, dir=None)
    return sorted(runs.values(), key=lambda r: r.run_id)


def _add(t: Totals, r: RunCost) -> None:
    t.runs += 1
    if r.accrued_usd is None:
        t.unrecorded_runs += 1
    else:
        t.accrued_usd += r.accrued_usd
        t.estimated_runs += r.estimated


def summarise(runs: list[RunCost]) -> dict[str, Any]:
    """Per day, per profile and in total, real (Vast) and simulated apart."""
    per_day: dict[str, dict[str, Totals]] = {"real": {}, "sim": {}}
    per_profile: dict[str, dict[str, Totals]] = {"real": {}, "sim": {}}
    total = {"real": Totals(), "sim": Totals()}
    for r in runs:
        market = "sim" if r.sim else "real"
        _add(per_day[market].setdefault(r.day, Totals()), r)
        _add(per_profile[market].setdefault(r.profile or "unknown", Totals()), r)
        _add(total[market], r)
    return {"per_day": per_day, "per_profile": per_profile, "total": total}


def _dump(summary: dict[str, Any]) -> dict[str, Any]:
    def conv(v: Any) -> Any:
        if isinstance(v, Totals):
            return v.model_dump() | {"accrued_usd": usd_up(v.accrued_usd)}
        return {k: conv(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {k: conv(v) for k, v in summary.items()}


def show_costs(out: Output, evidence_dir: Path) -> int:
    refuse_file_on_path(evidence_dir, "the evidence directory")
    found = evidence_dir.is_dir()
    ledgers = ledger_paths(evidence_dir)
    runs = collect(evidence_dir, ledgers)
    summary = summarise(runs)
    if not found and not ledgers:
        # Not "$0 spent": nothing was read (a mistyped VAST_HARNESS_HOME or --evidence-dir looks like this).
        out.warn(f"nothing recorded here: {evidence_dir} does not exist and no ledger was found "
                 f"(looked in it and in {state_dir()})")
    if out.json_mode:
        out.emit_json({"evidence_dir": str(evidence_dir), "evidence_dir_found": found,
                       "ledgers": [str(p) for p in ledgers], "runs": [r.model_dump() for r in runs]} | _dump(summary))
        return 0
    if not runs and not found and not ledgers:
        return 0
    from rich.table import Table

    t = Table(title=f"Runs in {evidence_dir} ({len(runs)})", header_style="bold")
    for col in ("run", "day", "profile", "sim", "exit", "accrued $", "instances", "fleet"):
        t.add_column(col, overflow="fold")
    for r in runs:
        t.add_row(*safe_cells(r.run_id, r.day, r.profile or "–", "yes" if r.sim else "no",
                              "–" if r.exit_code is None else r.exit_code,
                              "unrecorded" if r.accrued_usd is None else
                              f"{r.accrued_usd:.4f}" + (" (estimated)" if r.estimated else "")
                              + (" (held: so far)" if r.held else ""),
                              ", ".join(map(str, r.instances)) or "–", r.fleet or ""))
    out.out.print(t)
    hosts = [r for r in runs if r.attempts]
    if hosts:  # an interruptible run's every host: where, how long, what it billed, why it ended
        a = Table(title="Interruptible runs, host by host", header_style="bold")
        for col in ("run", "instance", "machine", "$/h", "started", "seconds", "accrued $", "salvaged B", "ended"):
            a.add_column(col, overflow="fold")
        for r in hosts:
            for at in r.attempts:
                a.add_row(*safe_cells(r.run_id, at.instance_id, "–" if at.machine_id is None else at.machine_id,
                                      f"{at.dph_usd:.4f}", _utc(at.started_unix), f"{_span_s(at):.0f}",
                                      f"{at.accrued_usd:.4f}",
                                      at.salvaged_bytes, at.ended or "open"))
        out.out.print(a)
        for r in hosts:
            out.out.print(terminal_safe(r.attempts_line()))
    for title, key in (("Per day", "per_day"), ("Per profile", "per_profile")):
        g = Table(title=title, header_style="bold")
        for col in (title.split()[1], "market", "runs", "accrued $", "unrecorded runs"):
            g.add_column(col)
        for market in ("real", "sim"):
            for name, tot in sorted(summary[key][market].items()):
                g.add_row(*safe_cells(name, "simulated" if market == "sim" else "Vast", tot.runs,
                                      f"{tot.accrued_usd:.4f}", tot.unrecorded_runs))
        out.out.print(g)
    real, sim = summary["total"]["real"], summary["total"]["sim"]
    estimated = real.estimated_runs + sim.estimated_runs
    if estimated:
        out.out.print(f"{estimated} run(s) killed before their record: estimated from the ledger (create to DELETE "
                      "at the quoted $/h), marked so")
    out.out.print(f"Total against Vast: ${real.accrued_usd:.4f} over {real.runs} run(s)"
                  + (f" ({real.unrecorded_runs} unrecorded, not in that sum: see the Vast console's billing)"
                     if real.unrecorded_runs
                     else "") + f"; simulated: ${sim.accrued_usd:.4f} over {sim.runs} run(s)"
                  + (f" ({sim.unrecorded_runs} unrecorded, not in that sum)" if sim.unrecorded_runs else ""))
    out.out.print(line(("Ledgers read: ", "dim"), ", ".join(map(str, ledgers)) or "none"))
    return 0
