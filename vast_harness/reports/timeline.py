"""A run in time, for the reports: the timeline of its phases (create, boot, upload, each step, pull, teardown,
each DELETE and absence-proof round) with dollars, the accrued cost against the cap, and a fleet's summed cost
against its total cap. Built from the record's `phases` (progress.PhaseLog) and absence-proof.json only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vast_harness.evidence.host_data import number
from vast_harness.reports import svg as svgplot
from vast_harness.reports.html import table, usd

if TYPE_CHECKING:
    from vast_harness.reports.run_facts import RunFacts

Point = tuple[float, float]


def _num(value: Any) -> float | None:
    return number(value, low=0.0, high=1e12, low_inclusive=True).value


def phases(f: RunFacts) -> list[dict[str, Any]]:
    """The record's phases with a start, an end and dollars at both ends (odd rows dropped)."""
    rows = f.result.get("phases")
    good = []
    for p in rows if isinstance(rows, list) else []:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            continue
        start, end = _num(p.get("t_start_unix")), _num(p.get("t_end_unix"))
        if start is None or end is None or end < start:
            continue
        good.append({"name": p["name"], "start": start, "end": end, "usd_start": _num(p.get("usd_start")) or 0.0,
                     "usd_end": _num(p.get("usd_end")) or 0.0})
    return good


def teardown_events(f: RunFacts) -> list[tuple[float, str]]:
    """(t_unix, label) for each DELETE request and acknowledgement and each absence-proof round."""
    events: list[tuple[float, str]] = []
    instances = f.absence.get("instances")
    for td in instances if isinstance(instances, list) else []:
        if not isinstance(td, dict):
            continue
        for d in td.get("deletes") or []:
            t = _num(d.get("t_request_unix")) if isinstance(d, dict) else None
            if t is not None:
                events.append((t, "DELETE"))
            t = _num(d.get("t_ack_unix")) if isinstance(d, dict) and d.get("acknowledged") else None
            if t is not None:
                events.append((t, "DELETE ack"))
        proof: dict[str, Any] = td["proof"] if isinstance(td.get("proof"), dict) else {}
        for i, rd in enumerate(proof.get("rounds") or [], 1):
            t = _num(rd.get("t_unix")) if isinstance(rd, dict) else None
            if t is not None:
                events.append((t, f"proof {i}: {rd.get('verdict')}"))
    return sorted(events)


def timeline_section(f: RunFacts) -> str:
    rows = phases(f)
    if not rows:
        return "<h3>Timeline</h3><p class=muted>no phases recorded (a record from before the timeline)</p>"
    t0 = rows[0]["start"]
    bars = [(p["name"], p["start"] - t0, p["end"] - t0, usd(p["usd_end"] - p["usd_start"])) for p in rows]
    events = [(t - t0, label) for t, label in teardown_events(f) if t >= t0]
    svg = svgplot.timeline(bars, events=events, title="Timeline: phases, DELETE and absence-proof rounds",
                           xlabel="seconds since the run started")
    body = [[p["name"], round(p["start"] - t0, 2), round(p["end"] - p["start"], 2), usd(p["usd_end"] - p["usd_start"]),
             usd(p["usd_end"])] for p in rows]
    body += [[label, round(t, 2), None, None, None] for t, label in events]
    return ("<h3>Timeline</h3>" + svgplot.img_tag(svg, "timeline of the run's phases", cls="plot timeline")
            + table(["phase / event", "starts at s", "seconds", "$ in phase", "$ accrued at end"], body,
                    cls="timeline"))


def accrued_points(f: RunFacts) -> list[tuple[float, float]]:
    """(t_unix, accrued $) at every phase boundary: the cost meter's own view, price changes included."""
    pts: list[tuple[float, float]] = []
    for p in phases(f):
        pts += [(p["start"], p["usd_start"]), (p["end"], p["usd_end"])]
    return pts


def cost_section(f: RunFacts) -> str:
    pts = accrued_points(f)
    caps: dict[str, Any] = f.result["caps"] if isinstance(f.result.get("caps"), dict) else {}
    cap = _num(caps.get("max_usd"))
    if not pts and "harness-result.json" in f.missing:
        return "<h3>Cost over time</h3><p class=bad>not known: harness-result.json is missing</p>"
    if not pts or pts[-1][1] <= 0:
        return "<h3>Cost over time</h3><p class=muted>nothing was rented (or nothing accrued)</p>"
    t0 = pts[0][0]
    markers = [(p["end"] - t0, f"end {p['name'].removeprefix('step ')}") for p in phases(f)
               if p["name"].startswith("step ")]
    markers += [(t - t0, label) for t, label in teardown_events(f) if label == "DELETE ack" and t >= t0]
    series = [(f"accrued {usd(pts[-1][1])}", [(t - t0, v) for t, v in pts])]
    hlines = [(cap, f"cap {usd(cap, 2)}")] if cap else []
    svg = svgplot.lines(series, markers=markers, hlines=hlines, title="Accrued cost against the cap",
                        xlabel="seconds since the run started", ylabel="accrued $")
    share = f" ({100 * pts[-1][1] / cap:.2f}% of the {usd(cap, 2)} cap)" if cap else ""
    # at cap scale a cheap run is a line on the axis: the same curve at its own scale beside it
    zoom = svgplot.lines(series, markers=markers, title="Accrued cost (own scale)",
                         xlabel="seconds since the run started", ylabel="accrued $")
    return ("<h3>Cost over time</h3>"
            f"<p>accrued {usd(pts[-1][1])}{share}</p>"
            + svgplot.img_tag(svg, "accrued cost against the cap", cls="plot cost")
            + svgplot.img_tag(zoom, "accrued cost at its own scale", cls="plot cost-zoom"))


def _at(points: Sequence[Point], t: float) -> float:
    """Piecewise-linear value at t: 0 before the first point, the last value after the end."""
    if not points or t < points[0][0]:
        return 0.0
    for (ta, va), (tb, vb) in zip(points, points[1:], strict=False):
        if ta <= t <= tb:
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
    return points[-1][1]


def fleet_cost_section(runs: Sequence[tuple[str, RunFacts]], total_cap: float | None) -> str:
    """The fleet's summed accrual over time against its total cap, with each run's own line."""
    per_run = [(name, accrued_points(f)) for name, f in runs]
    per_run = [(name, pts) for name, pts in per_run if pts]
    if not per_run:
        return "<h2>Fleet cost over time</h2><p class=muted>no run accrued anything</p>"
    t0 = min(pts[0][0] for _, pts in per_run)
    times = sorted({t for _, pts in per_run for t, _ in pts})
    total = [(t - t0, sum(_at(pts, t) for _, pts in per_run)) for t in times]
    series = [(f"fleet total {usd(total[-1][1])}", total)]
    series += [(name, [(t - t0, v) for t, v in pts]) for name, pts in per_run]
    hlines = [(total_cap, f"total cap {usd(total_cap, 2)}")] if total_cap else []
    svg = svgplot.lines(series, hlines=hlines, title="Fleet cost against its total cap",
                        xlabel="seconds since the first run started", ylabel="accrued $")
    zoom = svgplot.lines(series, title="Fleet cost (own scale)", xlabel="seconds since the first run started",
                         ylabel="accrued $")
    share = f" ({100 * total[-1][1] / total_cap:.2f}% of the {usd(total_cap, 2)} total cap)" if total_cap else ""
    return (f"<h2>Fleet cost over time</h2><p>accrued {usd(total[-1][1])}{share}</p>"
            + svgplot.img_tag(svg, "fleet cost against its total cap", cls="plot fleet-cost")
            + svgplot.img_tag(zoom, "fleet cost at its own scale", cls="plot fleet-cost-zoom"))
