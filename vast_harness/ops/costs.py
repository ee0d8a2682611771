"""`vast-e2e costs`: what every run cost, from the ledger and the evidence, per run, per day, per profile, and in
total, real and simulated apart. Reads files only; calls no API.

A run's dollars are its record's `accrued_usd` (the cost meter: time at the rented price plus billed bytes).
A run the ledger names but no record describes (killed with -9, a full disk) is listed as `unrecorded` with
its instances: its cost is not known here (the Vast console's billing is the authority for those).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vast_harness.console.output import Output
from vast_harness.console.terminal import line, safe_cells
from vast_harness.evidence.host_data import number, read_json
from vast_harness.state.dirs import SIM_SUBDIR, state_dir
from vast_harness.state.ledger import LEDGER_FILE, Ledger
from vast_harness.state.runs import RESULT_NAME, refuse_file_on_path, run_dirs
from vast_harness.vast.url import is_loopback_url


class RunCost(BaseModel):
    run_id: str
    day: str  # UTC date the run started
    profile: str | None
    sim: bool
    accrued_usd: float | None  # None: no record (the ledger alone names it)
    exit_code: int | None
    instances: list[int]
    dir: str | None
    fleet: str | None = None


class Totals(BaseModel):
    runs: int = 0
    accrued_usd: float = 0.0
    unrecorded_runs: int = 0


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
    return RunCost(run_id=str(doc.get("run_id") or path.name), day=_day(number(started, low=0, high=1e11).value),
                   profile=doc.get("profile") if isinstance(doc.get("profile"), str) else None,
                   sim=bool(doc.get("sim")) or is_loopback_url(str(doc.get("api_url") or "")),
                   accrued_usd=number(doc.get("accrued_usd"), low=0, high=1e9, low_inclusive=True).value,
                   exit_code=code if isinstance(code, int) else None,
                   instances=[i["instance_id"] for i in insts if isinstance(i, dict)
                              and isinstance(i.get("instance_id"), int)],
                   dir=str(path), fleet=path.parent.name if path.parent.name.startswith("fleet-") else None)


def ledger_paths(evidence_dir: Path) -> list[Path]:
    """The ledgers `costs` reads: the state dir's (its --sim part beside it); an --evidence-dir may hold an
    older one."""
    homes = [evidence_dir, evidence_dir / SIM_SUBDIR, state_dir(), state_dir() / SIM_SUBDIR]
    return list(dict.fromkeys(h / LEDGER_FILE for h in homes if (h / LEDGER_FILE).is_file()))


def collect(evidence_dir: Path, ledgers: list[Path] | None = None) -> list[RunCost]:
    """Every run: those with a record, and those only the ledger names."""
    runs = {r.run_id: r for r in (_from_record(p) for p in run_dirs(evidence_dir)) if r is not None}
    if ledgers is None:
        ledgers = ledger_paths(evidence_dir)
    first: dict[str, float] = {}
    instances: dict[str, set[int]] = defaultdict(set)
    sim: dict[str, bool] = {}
    for e in (e for path in ledgers for e in Ledger(path).entries()):
        first.setdefault(e.run_id, e.t_unix)
        if e.instance_id is not None:
            instances[e.run_id].add(e.instance_id)
        if e.api_url:
            sim[e.run_id] = is_loopback_url(e.api_url)
    for run_id, t in first.items():
        if run_id.startswith("reap-"):  # a reap's lines name other runs' instances; it rents nothing
            continue
        if run_id not in runs and instances.get(run_id):  # an intent that never rented cost nothing
            runs[run_id] = RunCost(run_id=run_id, day=_day(t), profile=None, sim=sim.get(run_id, False),
                                   accrued_usd=None, exit_code=None, instances=sorted(instances[run_id]), dir=None)
    return sorted(runs.values(), key=lambda r: r.run_id)


def _add(t: Totals, r: RunCost) -> None:
    t.runs += 1
    if r.accrued_usd is None:
        t.unrecorded_runs += 1
    else:
        t.accrued_usd += r.accrued_usd


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
            return v.model_dump() | {"accrued_usd": round(v.accrued_usd, 6)}
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
                              "unrecorded" if r.accrued_usd is None else f"{r.accrued_usd:.4f}",
                              ", ".join(map(str, r.instances)) or "–", r.fleet or ""))
    out.out.print(t)
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
    out.out.print(f"Total against Vast: ${real.accrued_usd:.4f} over {real.runs} run(s)"
                  + (f" ({real.unrecorded_runs} unrecorded, not in that sum: see the Vast console's billing)"
                     if real.unrecorded_runs
                     else "") + f"; simulated: ${sim.accrued_usd:.4f} over {sim.runs} run(s)"
                  + (f" ({sim.unrecorded_runs} unrecorded, not in that sum)" if sim.unrecorded_runs else ""))
    out.out.print(line(("Ledgers read: ", "dim"), ", ".join(map(str, ledgers)) or "none"))
    return 0
