"""`vast-e2e machines`: the machines' history (state/machines.py), one row per machine this user rented, with the
dates of its receipts, its last verdict, the measures that failed (measured and expected) and whether the next
run skips it. Reads the state directory only; calls no API. `--forget ID` / `--forget-all` (cli/app.py) append
a line that lets a machine be tried again.
"""

from __future__ import annotations

import time
from typing import Any

from vast_harness.console.output import Output
from vast_harness.console.terminal import line, safe_cells
from vast_harness.state.machines import MachineHistory, MachineRecord


def _when(t_unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_unix))


def _row(rec: MachineRecord) -> dict[str, Any]:
    last = rec.last
    return {"machine_id": rec.machine_id, "gpu": rec.gpu_name, "receipts": len(rec.receipts),
            "first_unix": rec.receipts[0].t_unix if rec.receipts else None,
            "last_unix": last.t_unix if last else None, "last_verdict": last.verdict if last else None,
            "failed": [f.model_dump() for f in last.failed] if last else [], "reason": last.reason if last else "",
            "skipped": rec.skipped, "forgotten_receipts": rec.forgotten,
            "history": [{"t_unix": r.t_unix, "verdict": r.verdict, "run_id": r.run_id, "instance_id": r.instance_id,
                         "offer_id": r.offer_id} for r in rec.receipts]}


def show_machines(out: Output, history: MachineHistory, market: str) -> int:
    """The table (or its JSON): every machine of `market` with a receipt since any forget, the skipped first."""
    records = sorted(history.machines(market).values(), key=lambda r: (not r.skipped, -(r.last.t_unix if r.last
                                                                                        else 0.0)))
    rows = [_row(r) for r in records if r.receipts or r.forgotten]
    if out.json_mode:
        out.emit_json({"market": market, "history": str(history.path), "machines": rows,
                       "skipped": [r["machine_id"] for r in rows if r["skipped"]], "unreadable_lines": history.bad_lines})
        return 0
    from rich.table import Table

    t = Table(title=f"Machines of {market} ({len(rows)}), from {history.path}", header_style="bold")
    for col in ("machine", "GPU", "receipts", "first", "last", "verdict", "what failed", "next run"):
        t.add_column(col, overflow="fold")
    for r in rows:
        failed = "; ".join(f["line"] or f["measure"] for f in r["failed"]) or r["reason"] or "–"
        t.add_row(*safe_cells(r["machine_id"], r["gpu"] or "?", r["receipts"],
                              _when(r["first_unix"]) if r["first_unix"] else "–",
                              _when(r["last_unix"]) if r["last_unix"] else "–", r["last_verdict"] or "forgotten",
                              failed if r["last_verdict"] == "failed" else "–",
                              "SKIPPED" if r["skipped"] else "rented as any"))
    out.out.print(t)
    skipped = [str(r["machine_id"]) for r in rows if r["skipped"]]
    if skipped:
        out.out.print(line(("Skipped: ", "bold"), f"{', '.join(skipped)} (their last receipt failed); "
                           "`vast-e2e machines --forget ID` (or --forget-all) tries one again"), soft_wrap=True)
    if history.bad_lines:
        out.warn(f"{history.bad_lines} unreadable line(s) in {history.path} were skipped")
    return 0
