"""The fleet's report: one row per GPU type ranked by measured throughput per dollar (the receipt's sustained
TFLOP/s, summed over the host's GPUs, per $/h: what the host delivered, not what its offer said; then dollars per
million training tokens), as a rich table, `fleet-result.json` and `fleet-report.html` (the table, an MFU vs
$/Mtok scatter, and per run its receipt, steps, cost over time and absence proof). Built from the runs' evidence
files only, like a single run's `report.html`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from html import escape
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from vast_harness.console.output import Output
from vast_harness.console.terminal import safe_cells
from vast_harness.errors import ConfigError
from vast_harness.evidence.host_data import json_safe, number, read_json, usd_per_mtok
from vast_harness.evidence.run import write_whole
from vast_harness.reports import svg as svgplot
from vast_harness.reports import timeline
from vast_harness.reports.html import Link, show, usd
from vast_harness.reports.run import REPORT_NAME, Cell, exit_cell, load_run, page, run_sections, table
from vast_harness.state.runs import FLEET_LEDGER_NAME, FLEET_RESULT_NAME

__all__ = ["FLEET_REPORT_NAME", "FLEET_RESULT_NAME", "FleetRow", "build_rows", "fleet_html", "measured_per_usd",
           "print_table", "rank_key", "rebuild_fleet_report", "write_fleet_report", "write_fleet_result"]

FLEET_REPORT_NAME = "fleet-report.html"


@dataclass
class FleetRow:
    gpu: str
    exit_code: int
    message: str
    run_id: str | None = None
    evidence_dir: str | None = None
    offer_id: int | None = None
    num_gpus: int | None = None
    dph_usd: float | None = None
    driver: str | None = None
    driver_qualified: bool | None = None
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s: float | None = None
    usd_per_mtok: float | None = None
    receipt_tflops: float | None = None  # the receipt's sustained burn, summed over the GPUs (a passed receipt)
    tflops_per_usd_h: float | None = None  # receipt_tflops per $/h: what the fleet ranks by
    replay_match: bool | None = None
    accrued_usd: float | None = None
    absence: str | None = None
    workload_source: str = ""


def measured_per_usd(receipt: Any, dph_usd: float | None) -> tuple[float | None, float | None]:
    """(the receipt's sustained TFLOP/s over the host's GPUs, that per $/h) from a record's `receipt`, when it
    passed and both are positive figures; else (None, None)."""
    rec = receipt if isinstance(receipt, dict) else {}
    total = number(rec.get("burn_tflops_total"), low=0.0, high=1e9).value if rec.get("verdict") == "passed" else None
    dph = number(dph_usd, low=0.0, high=1e6).value
    return total, (round(total / dph, 3) if total is not None and dph else None)


def rank_key(r: FleetRow) -> tuple[bool, float, bool, float, str]:
    """Measured TFLOP/s per $/h first (highest first), then $/Mtok (lowest first); rows without a figure last."""
    return (r.tflops_per_usd_h is None, -(r.tflops_per_usd_h or 0.0), r.usd_per_mtok is None, r.usd_per_mtok or 0.0,
            r.gpu)


def build_rows(outcomes: list[Any]) -> list[FleetRow]:
    """One row per run outcome (`fleet.RunOutcome`), ranked by `rank_key`."""
    rows = []
    for o in outcomes:
        row = FleetRow(gpu=o.gpu, exit_code=o.exit_code, message=o.message, run_id=o.run_id,
                       evidence_dir=str(o.evidence_dir) if o.evidence_dir else None, accrued_usd=o.accrued_usd)
        if o.evidence_dir and Path(o.evidence_dir).is_dir():
            f = load_run(Path(o.evidence_dir))
            offer, w = f.offer, f.workload()
            row.offer_id, row.num_gpus, row.dph_usd = offer.get("id"), offer.get("num_gpus"), f.dph_usd
            row.driver, row.driver_qualified = offer.get("driver_version"), offer.get("driver_qualified")
            row.mfu, row.tokens_per_s, row.tokens_per_s_per_gpu = w.mfu, w.tokens_per_s, w.tokens_per_s_per_gpu
            row.replay_match, row.workload_source = w.replay_match, w.source
            row.usd_per_mtok = usd_per_mtok(row.dph_usd, row.tokens_per_s)
            row.receipt_tflops, row.tflops_per_usd_h = measured_per_usd(f.result.get("receipt"), row.dph_usd)
            row.absence = (f.result.get("absence") or {}).get("verdict")
            row.accrued_usd = f.result.get("accrued_usd", row.accrued_usd)
        rows.append(row)
    return sorted(rows, key=rank_key)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f}%"


def _f(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def print_table(out: Output, rows: list[FleetRow], *, title: str) -> None:
    t = Table(title=title, header_style="bold")
    for col in ("rank", "GPU", "offer", "$/h", "driver", "TFLOP/s", "TFLOP/s per $/h", "MFU", "tok/s/GPU",
                "tok/s total", "$/Mtok", "replay", "exit", "accrued $", "absence"):
        t.add_column(col)
    for i, r in enumerate(rows, 1):
        driver = f"{r.driver or '–'}{'' if r.driver_qualified in (True, None) else ' (unqual.)'}"
        replay_cells: dict[bool | None, str | Text] = {True: "yes", False: Text("NO", style="red"), None: "–"}
        t.add_row(*safe_cells(i, r.gpu, r.offer_id or "–", _f(r.dph_usd, ".4f"), driver, _f(r.receipt_tflops, ",.1f"),
                              _f(r.tflops_per_usd_h, ",.1f"), _pct(r.mfu),
                              _f(r.tokens_per_s_per_gpu, ",.0f"), _f(r.tokens_per_s, ",.0f"), _f(r.usd_per_mtok, ".4f"),
                              replay_cells[r.replay_match],
                              Text(str(r.exit_code), style="green" if r.exit_code in (0, 4) else "red"),
                              _f(r.accrued_usd, ".4f"), r.absence or "–"))
    (out.err if out.json_mode else out.out).print(t)


SIMULATED_NOTE = ("SIMULATED: no GPU was rented. Each run executed the smoke profile's tiny CPU round on a simulated "
                  "host and its MFU is taken against a nominal peak per GPU type; each host's receipt was answered "
                  "from its offer and the reference table: the figures in grey (receipt TFLOP/s, MFU, token rates, "
                  "$ per M tokens) test the harness and rank nothing.")


def _from_cpu_round(value: Any, simulated: bool) -> Any:
    """A figure of the tiny CPU round (a simulated fleet): shown greyed, never as a GPU's figure."""
    if not simulated:
        return value
    return Cell(show(value) if not isinstance(value, str) else value, "sim num")


def fleet_html(fleet_id: str, rows: list[FleetRow], summary: dict[str, Any], *, fleet_dir: Path | None = None) -> str:
    runs = [(r.gpu, Path(r.evidence_dir)) for r in rows if r.evidence_dir and Path(r.evidence_dir).is_dir()]
    facts = {gpu: load_run(d) for gpu, d in runs}
    simulated = summary.get("sim") is True or any(f.result.get("sim") is True for f in facts.values())
    headers = ["rank", "GPU", "offer", "GPUs", "$/h", "driver", "receipt TFLOP/s (sustained, all GPUs)",
               "TFLOP/s per $/h", "MFU %", "tokens/s per GPU", "tokens/s total", "$ per M tokens", "replay match",
               "exit", "accrued $", "absence", "run"]
    body_rows = []
    for i, r in enumerate(rows, 1):
        body_rows.append([i, r.gpu, r.offer_id, r.num_gpus, usd(r.dph_usd),
                          f"{r.driver or '–'} ({'qualified' if r.driver_qualified else 'not qualified'})",
                          *(_from_cpu_round(v, simulated) for v in (r.receipt_tflops, r.tflops_per_usd_h)),
                          *(_from_cpu_round(v, simulated) for v in (
                              None if r.mfu is None else round(100 * r.mfu, 3), r.tokens_per_s_per_gpu,
                              r.tokens_per_s, usd(r.usd_per_mtok))),
                          r.replay_match, exit_cell(r.exit_code), usd(r.accrued_usd),
                          Cell(r.absence or "nothing rented", "ok" if r.absence in ("gone", None) else "bad"),
                          r.run_id])
    points = [(r.usd_per_mtok, 100 * r.mfu, r.gpu) for r in rows if r.usd_per_mtok is not None and r.mfu is not None]
    title = "MFU vs cost per training token" + (" (SIMULATED: CPU round, nominal peak)" if simulated else "")
    scatter = (svgplot.img_tag(svgplot.scatter(points, title=title,
                                               xlabel="$ per million training tokens", ylabel="MFU %"),
                               "MFU vs $ per million tokens", cls="plot sim" if simulated else "plot")
               if points else "<p class=muted>no run produced both an MFU and a token rate</p>")
    here = fleet_dir or Path(str(summary.get("dir") or "."))
    files = [Link(name, name) for name in (FLEET_RESULT_NAME, FLEET_LEDGER_NAME) if (here / name).is_file()]
    links = [[r.gpu, r.run_id, exit_cell(r.exit_code), usd(r.accrued_usd),
              Link(f"{Path(r.evidence_dir or '').name}/{REPORT_NAME}", f"{Path(r.evidence_dir or '').name}/{REPORT_NAME}")
              if r.gpu in facts and (Path(r.evidence_dir or "") / REPORT_NAME).is_file() else "–"] for r in rows]
    total_cap = summary.get("total_cap_usd") if isinstance(summary.get("total_cap_usd"), (int, float)) else None
    parts = [f"<h1>Fleet {escape(fleet_id)}{' (SIMULATED)' if simulated else ''}</h1>",
             f"<p class=simulated>{escape(SIMULATED_NOTE)}</p>" if simulated else "",
             (("<p>Files: " + " · ".join(f'<a href="{escape(x.href)}">{escape(x.text)}</a>' for x in files)
               + "</p>") if files else ""),
             (f"<p>Exit code <b>{escape(str(summary.get('exit_code')))}</b> · total cap "
              f"{escape(usd(summary.get('total_cap_usd'), 2))} · accrued {escape(usd(summary.get('accrued_usd')))}"
              f" · {escape(str(summary.get('stop_reason') or 'not cancelled'))}</p>"),
             ("<p>Ranked by measured throughput per dollar: each host's receipt (its sustained burn, summed over its "
              "GPUs, measured before any work) per $/h; then $ per million training tokens = $/h ÷ (tokens/s total "
              "× 3600 ÷ 10⁶), with the run's best-MFU measurement.</p>"),
             "<h2>Ranked by measured TFLOP/s per $/h</h2>", table(headers, body_rows, cls="fleet"), scatter,
             "<h2>Each run's report</h2>", table(["GPU", "run", "exit", "accrued", "report"], links, cls="runs"),
             timeline.fleet_cost_section(list(facts.items()), total_cap)]
    for r in rows:
        parts.append(f"<h2 id=\"run-{escape(r.gpu)}\">{escape(r.gpu)}: run {escape(str(r.run_id or '(not started)'))}"
                     "</h2>")
        if r.gpu in facts:
            parts.append(run_sections(facts[r.gpu], link_prefix=f"{Path(r.evidence_dir or '').name}/"))
        else:
            parts.append(f"<p class=muted>{escape(r.message)}</p>")
    return page(f"Fleet {fleet_id}", "".join(parts))


def write_fleet_report(fleet_dir: Path, fleet_id: str, rows: list[FleetRow], summary: dict[str, Any]) -> Path:
    """fleet-result.json and report.html, each written whole or not at all (a temp file, then a rename);
    OSError (a full or read-only disk) is the caller's to report."""
    write_fleet_result(fleet_dir, rows, summary)
    path = fleet_dir / FLEET_REPORT_NAME
    write_whole(path, fleet_html(fleet_id, rows, summary, fleet_dir=fleet_dir))
    return path


def rebuild_fleet_report(fleet_dir: Path) -> Path:
    """`vast-e2e report FLEET`: fleet-report.html again, from fleet-result.json (the fleet's summary and which
    run each GPU type had) and each run's evidence files, read afresh. fleet-result.json is not rewritten: it
    is what the fleet run decided. A fleet directory moved since keeps its runs beside it."""
    doc, problem = read_json(fleet_dir / FLEET_RESULT_NAME)
    if not isinstance(doc, dict):
        raise ConfigError(f"{fleet_dir.name}: {FLEET_RESULT_NAME} cannot be read ({problem or 'not an object'}); "
                          f"the fleet's report is built from it (each run's own report.html stays)")
    fields = {f.name for f in dataclass_fields(FleetRow)}
    rows = []
    for raw in doc.get("rows") or []:
        if not isinstance(raw, dict) or not isinstance(raw.get("gpu"), str):
            continue
        row = FleetRow(**{k: v for k, v in raw.items() if k in fields})
        if row.evidence_dir and not Path(row.evidence_dir).is_dir() and (fleet_dir / Path(row.evidence_dir).name).is_dir():
            row.evidence_dir = str(fleet_dir / Path(row.evidence_dir).name)
        rows.append(row)
    summary = {k: v for k, v in doc.items() if k != "rows"}
    path = fleet_dir / FLEET_REPORT_NAME
    fleet_id = str(summary.get("fleet_id") or fleet_dir.name)
    write_whole(path, fleet_html(fleet_id, build_rows(rows), summary, fleet_dir=fleet_dir))
    return path


def write_fleet_result(fleet_dir: Path, rows: list[FleetRow], summary: dict[str, Any]) -> None:
    doc = json_safe(summary | {"rows": [asdict(r) for r in rows]})  # strict JSON: a later ranking reads it
    write_whole(fleet_dir / FLEET_RESULT_NAME, json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")


