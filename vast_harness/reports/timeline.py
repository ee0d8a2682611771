"""A run in time, for the reports: the timeline of its phases (create, boot, upload, each step, pull, teardown,
each DELETE and absence-proof round) with dollars, the accrued cost against the cap, and a fleet's summed cost
against its total cap. Built from the record's `phases` (`console/live.py`'s PhaseLog) and absence-proof.json only.
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


def deadlines(f: RunFacts) -> list[tuple[float, str]]:
    """(seconds since the run started, label) of the time cap and the work deadline it sets (the time cap less
    the teardown margin: no work past it). The dollar cap's deadline moves with the price; the cost chart has
    it as a line."""
    caps: dict[str, Any] = f.result["caps"] if isinstance(f.result.get("caps"), dict) else {}
    minutes, margin_s = _num(caps.get("max_minutes")), _num(caps.get("teardown_margin_s"))
    if minutes is None:
        return []
    cap_s = 60 * minutes
    work = [(cap_s - margin_s, "work deadline")] if margin_s is not None and margin_s < cap_s else []
    return [*work, (cap_s, "time cap")]


def _chart_events(events: Sequence[tuple[float, str]]) -> list[tuple[float, str]]:
    """The chart's labels: a run of proof rounds with one verdict is one label ("proofs 1-5: going") on the
    first round's line; the other rounds keep their lines. The table under the chart lists every round."""
    out: list[tuple[float, str]] = []
    i = 0
    while i < len(events):
        t, label = events[i]
        if not label.startswith("proof "):
            out.append((t, label))
            i += 1
            continue
        verdict = label.partition(": ")[2]
        j = i
        while j + 1 < len(events) and events[j + 1][1].startswith("proof ") and \
                events[j + 1][1].partition(": ")[2] == verdict:
            j += 1
        first, last = label.split(":")[0].removeprefix("proof "), events[j][1].split(":")[0].removeprefix("proof ")
        out.append((t, f"proofs {first}-{last}: {verdict}" if j > i else label))
        out += [(events[k][0], "") for k in range(i + 1, j + 1)]
        i = j + 1
    return out


def timeline_section(f: RunFacts) -> str:
    rows = phases(f)
    if not rows:
        return "<h3>Timeline</h3><p class=muted>no phases recorded (a record from before the timeline)</p>"
    t0 = rows[0]["start"]
    bars = [(p["name"], p["start"] - t0, p["end"] - t0, usd(p["usd_end"] - p["usd_start"])) for p in rows]
    events = [(t - t0, label) for t, label in teardown_events(f) if t >= t0]
    span_s = max(p["end"] for p in rows) - t0
    # the time cap on the chart when the run came near it (a cut by the time cap always does); a 5 s run
    # under a 15 min cap would be squeezed into a sliver. The table lists both either way.
    drawn = [(t, label) for t, label in deadlines(f) if t <= 1.5 * span_s]
    svg = svgplot.timeline(bars, events=sorted(_chart_events(events) + drawn),
                           title="Timeline: phases, DELETE and absence-proof rounds",
                           xlabel="seconds since the run started")
    body = [[p["name"], round(p["start"] - t0, 2), round(p["end"] - p["start"], 2), usd(p["usd_end"] - p["usd_start"]),
             usd(p["usd_end"])] for p in rows]
    body += [[label, round(t, 2), None, None, None] for t, label in sorted(events + deadlines(f))]
    return ("<h3>Timeline</h3><div class=row>"
            + svgplot.img_tag(svg, "timeline of the run's phases", cls="plot timeline")
            + table(["phase / event", "starts at s", "seconds", "$ in phase", "$ accrued at end"], body,
                    cls="timeline") + "</div>")


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
    share = f" ({100 * pts[-1][1] / cap:.2f}% of the {usd(cap, 2)} cap)" if cap else ""
    return ("<h3>Cost over time</h3>" f"<p>accrued {usd(pts[-1][1])}{share}</p>"
            + _cost_chart(series, max(v for _, v in pts), cap, markers=markers, what="Accrued cost",
                          cap_name="cap", xlabel="seconds since the run started", cls="plot cost"))


CAP_SCALE_FROM = 0.2  # a run that spent at least this share of its cap is drawn against it


def _cost_chart(series: list[tuple[str, list[Point]]], top_usd: float, cap: float | None, *,
                markers: Sequence[tuple[float, str]] = (), what: str, cap_name: str, xlabel: str, cls: str) -> str:
    """One chart at the one useful scale: against the cap with its line when the run came near it, else at
    its own scale with the cap named in the title (at cap scale a cheap run is a line on the axis)."""
    if cap and top_usd >= CAP_SCALE_FROM * cap:
        svg = svgplot.lines(series, markers=markers, hlines=[(cap, f"{cap_name} {usd(cap, 2)}")],
                            title=f"{what} against the {cap_name}", xlabel=xlabel, ylabel="accrued $")
        return svgplot.img_tag(svg, f"{what.lower()} against the {cap_name}", cls=cls)
    off = (f" (the {usd(cap, 2)} {cap_name} is {cap / top_usd:,.0f}x higher)" if cap and top_usd > 0 else
           f" (the {usd(cap, 2)} {cap_name} is off this scale)" if cap else "")
    svg = svgplot.lines(series, markers=markers, title=f"{what}{off}", xlabel=xlabel, ylabel="accrued $")
    return svgplot.img_tag(svg, f"{what.lower()} at its own scale, the {cap_name} far above", cls=cls)


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
    share = f" ({100 * total[-1][1] / total_cap:.2f}% of the {usd(total_cap, 2)} total cap)" if total_cap else ""
    return (f"<h2>Fleet cost over time</h2><p>accrued {usd(total[-1][1])}{share}</p>"
            + _cost_chart(series, max(v for _, v in total), total_cap, what="Fleet cost", cap_name="total cap",
                          xlabel="seconds since the first run started", cls="plot fleet-cost"))
