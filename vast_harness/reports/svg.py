"""The project's one plotting stack: small dependency-free SVG charts (scatter, lines, bars, timeline) for the
HTML reports, embedded as data URIs.

Why this and not matplotlib: a report must open offline and self-contained, and the charts are a handful of
lines and dots, so a few hundred lines of standard library beat a plotting dependency (and its native wheels)
for every user of the control plane. Each chart is a standalone SVG document embedded as
`<img src="data:image/svg+xml;base64,...">`, so a malformed chart fails to load in a browser (naturalWidth 0)
instead of half-rendering. Every chart is drawn here, locally, from the evidence: the rented host draws none
(the control plane never travels there, and a host image may lack any plotting library), so an MFU sweep's
host script writes its table (scripts/sweep_report.py) and the run report draws the sweep from the pulled
`mfu-*.json` (reports/run.py, `sweep_series`).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence
from html import escape

W, H = 640, 360
ML, MR, MT, MB = 70, 20, 36, 52  # margins: left, right, top, bottom
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 12)]
    while ticks[-1] < hi - step * 1e-9 and len(ticks) < 50:  # the last tick is at or above hi: nothing clipped
        ticks.append(round(first + step * len(ticks), 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.001:
        return f"{v:.3g}"
    return f"{v:.4g}"


class _Frame:
    """Axes mapping data to pixels, with ticks, grid and labels."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, title: str, xlabel: str, ylabel: str,
                 y_from_zero: bool = True, x_ticks: bool = True, left: float = ML, height: float = H,
                 y_ticks: bool = True, top: float = MT) -> None:
        self.left, self.height, self.top = left, height, top
        ylo = min([0.0, *ys]) if y_from_zero else min(ys, default=0.0)
        self.xt = nice_ticks(min(xs, default=0.0), max(xs, default=1.0))
        self.yt = nice_ticks(ylo, max(ys, default=1.0) * 1.08)  # headroom for labels above the top point
        self.x0, self.x1 = self.xt[0], self.xt[-1]
        self.y0, self.y1 = self.yt[0], self.yt[-1]
        L, Hh = self.left, self.height
        self.parts: list[str] = [
            f'<rect width="{W}" height="{Hh}" fill="white"/>',
            f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>',
        ]
        if xlabel:
            self.parts.append(f'<text x="{W / 2}" y="{Hh - 10}" text-anchor="middle" font-size="12">'
                              f'{escape(xlabel)}</text>')
        if ylabel:
            self.parts.append(f'<text x="16" y="{Hh / 2}" text-anchor="middle" font-size="12" '
                              f'transform="rotate(-90 16 {Hh / 2})">{escape(ylabel)}</text>')
        for t in self.xt if x_ticks else ():
            x = self.px(t)
            self.parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{Hh - MB}" stroke="#eee"/>')
            self.parts.append(f'<text x="{x:.1f}" y="{Hh - MB + 16}" text-anchor="middle" font-size="11">'
                              f'{_fmt(t)}</text>')
        for t in self.yt if y_ticks else ():
            y = self.py(t)
            self.parts.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" stroke="#eee"/>')
            self.parts.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>')
        self.parts.append(f'<rect x="{L}" y="{top}" width="{W - L - MR}" height="{Hh - top - MB}" fill="none" '
                          f'stroke="#333"/>')

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / ((self.x1 - self.x0) or 1.0) * (W - self.left - MR)

    def py(self, y: float) -> float:
        return self.height - MB - (y - self.y0) / ((self.y1 - self.y0) or 1.0) * (self.height - self.top - MB)

    def svg(self) -> str:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{self.height:.0f}" '
                f'viewBox="0 0 {W} {self.height:.0f}" font-family="sans-serif">' + "".join(self.parts) + "</svg>")


def _text_width(label: str, font_px: float) -> float:
    return 0.6 * font_px * len(label)  # sans-serif average advance: enough to keep a label inside the frame


def scatter(points: Sequence[tuple[float, float, str]], *, title: str, xlabel: str, ylabel: str) -> str:
    """One labelled dot per (x, y, label). Each label takes the first place around its dot that stays inside
    the frame and off the labels already placed (two GPUs of the same price would otherwise print as one)."""
    f = _Frame([p[0] for p in points], [p[1] for p in points], title=title, xlabel=xlabel, ylabel=ylabel)
    placed: list[tuple[float, float, float, float]] = []
    for i, (x, y, label) in enumerate(points):
        cx, cy = f.px(x), f.py(y)
        color = PALETTE[i % len(PALETTE)]
        f.parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="6" fill="{color}"/>')
        w, h = _text_width(label, 12), 13.0
        spots = [(dx, dy) for dy in (-7, 18, -21, 32, -35, 46) for dx in (9, -9 - w)]
        box = None
        for dx, dy in spots:
            bx, by = cx + dx, cy + dy - h + 3  # text baseline at cy + dy
            cand = (bx, by, bx + w, by + h)
            inside = f.left + 2 <= cand[0] and cand[2] <= W - MR - 2 and f.top + 2 <= cand[1] and cand[3] <= f.height - MB
            if inside and not any(_boxes_overlap(cand, other) for other in placed):
                box = cand
                break
        if box is None:  # nowhere free: the first spot that stays inside
            dx, dy = (9, -7) if cx + 9 + w <= W - MR - 2 else (-9 - w, -7)
            box = (cx + dx, cy + dy - h + 3, cx + dx + w, cy + dy + 3)
        placed.append(box)
        f.parts.append(f'<text class="label" x="{box[0]:.1f}" y="{box[3] - 3:.1f}" font-size="12" '
                       f'fill="{color}">{escape(label)}</text>')
    return f.svg()


def _boxes_overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


LANE_PX = 13  # one lane of event labels: 10 px text and its leading
MAX_LANES = 8


def _label_lanes(f: _Frame, events: Sequence[tuple[float, str]], font_px: float = 10.0
                 ) -> tuple[list[tuple[float, float, str, int]], int]:
    """Event labels written across, each in the first lane where it touches no other: (line x, text x, text,
    lane) per labelled event, and the lanes used. Vertical labels side by side ran into each other and into the
    bars; an event with an empty label gets its line only. A label with no free lane among MAX_LANES is left
    to the table under the chart (its line is still drawn)."""
    lanes: list[list[tuple[float, float]]] = []
    placed: list[tuple[float, float, str, int]] = []
    for x, label in sorted(events, key=lambda e: e[0]):
        if not label:
            continue
        px, w = f.px(x), _text_width(label, font_px)
        x0 = px + 3 if px + 3 + w <= W - MR - 2 else max(f.left + 2, px - 3 - w)  # right of its line, else left
        span = (x0 - 3, x0 + w + 3)
        for i, taken in enumerate([*lanes, []][:MAX_LANES]):
            if not any(span[0] < b and a < span[1] for a, b in taken):
                if i == len(lanes):
                    lanes.append([])
                lanes[i].append(span)
                placed.append((px, x0, label, i))
                break
    return placed, len(lanes)


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, title: str, xlabel: str, ylabel: str,
          markers: Sequence[tuple[float, str]] = (), hlines: Sequence[tuple[float, str]] = (),
          point_marks: bool = False) -> str:
    """Polylines (name, [(x, y), ...]) with optional vertical markers (x, label), horizontal reference lines
    (y, label: a cap) and a dot per point."""
    xs = [x for _, pts in series for x, _ in pts] + [m[0] for m in markers]
    ys = [y for _, pts in series for _, y in pts] + [h[0] for h in hlines]
    f = _Frame(xs, ys, title=title, xlabel=xlabel, ylabel=ylabel)
    placed, n_lanes = _label_lanes(f, markers)
    if n_lanes:  # the labels go in a band between the title and the frame: redraw the frame lower
        f = _Frame(xs, ys, title=title, xlabel=xlabel, ylabel=ylabel, top=MT + LANE_PX * n_lanes,
                   height=H + LANE_PX * n_lanes)
    for x, _ in markers:  # from the labels' band down; each label starts at its line
        f.parts.append(f'<line x1="{f.px(x):.1f}" y1="{f.top}" x2="{f.px(x):.1f}" y2="{f.height - MB}" '
                       f'stroke="#999" stroke-dasharray="4 3"/>')
    for _, x0, label, lane in placed:
        f.parts.append(f'<text class="marker" x="{x0:.1f}" y="{MT + LANE_PX * lane + 9:.1f}" font-size="10" '
                       f'fill="#666">{escape(label)}</text>')
    for y, label in hlines:
        py = f.py(y)
        f.parts.append(f'<line class="cap" x1="{ML}" y1="{py:.1f}" x2="{W - MR}" y2="{py:.1f}" stroke="#c62828" '
                       f'stroke-width="1.5" stroke-dasharray="8 4"/>')
        f.parts.append(f'<text x="{ML + 6}" y="{py - 4:.1f}" font-size="11" fill="#c62828">{escape(label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in pts)
        f.parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        if point_marks:
            f.parts.extend(f'<circle class="point" cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="4" fill="{color}"/>'
                           for x, y in pts)
        f.parts.append(f'<text x="{W - MR - 4}" y="{f.top + 14 + 14 * i}" text-anchor="end" font-size="11" '
                       f'fill="{color}">{escape(name)}</text>')
    return f.svg()


def bars(items: Sequence[tuple[str, float]], *, title: str, ylabel: str) -> str:
    """One bar per (label, value); labels under the bars."""
    f = _Frame([0.0, float(len(items))], [v for _, v in items], title=title, xlabel="", ylabel=ylabel,
               x_ticks=False)
    slot = (f.px(float(len(items))) - ML) / max(1, len(items))
    for i, (label, value) in enumerate(items):
        x = ML + slot * i + slot * 0.15
        y = f.py(value)
        f.parts.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" '
                       f'height="{max(0.0, f.py(0.0) - y):.1f}" fill="{PALETTE[i % len(PALETTE)]}"/>')
        f.parts.append(f'<text x="{x + slot * 0.35:.1f}" y="{H - MB + 16}" text-anchor="middle" font-size="10">'
                       f'{escape(label[:28])}</text>')
    return f.svg()


def timeline(rows: Sequence[tuple[str, float, float, str]], *, title: str, xlabel: str,
             events: Sequence[tuple[float, str]] = ()) -> str:
    """A Gantt chart: one bar per (label, start, end, note) on a shared time axis, top to bottom, its label
    left of the frame and its note (dollars) on the bar or right of it; `events` are dashed verticals
    (DELETE, proof rounds, the time cap) down to their labels, written across in lanes under the bars."""
    row_h, top = 20, MT + 8
    xs = [x for _, a, b, _ in rows for x in (a, b)] + [e[0] for e in events]
    left = min(ML + 90, 10 + max((int(_text_width(r[0], 11)) for r in rows), default=0))

    def frame(lanes: int) -> _Frame:
        height = max(H, top + row_h * len(rows) + LANE_PX * lanes + MB + 10)
        return _Frame(xs, [0.0, 1.0], title=title, xlabel=xlabel, ylabel="", y_from_zero=True, left=left,
                      height=height, y_ticks=False)

    placed, n_lanes = _label_lanes(frame(0), events)
    f = frame(n_lanes)
    lanes_top = top + row_h * len(rows) + 4
    for x, _ in events:  # behind the bars (a bar's dollars stay readable), down to the labels, which start at it
        px = f.px(x)
        f.parts.append(f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{lanes_top}" stroke="#c62828" '
                       f'stroke-dasharray="3 3"/>')
    for i, (label, start, end, note) in enumerate(rows):
        y = top + row_h * i
        x0, x1 = f.px(start), max(f.px(end), f.px(start) + 2)
        color = PALETTE[i % len(PALETTE)]
        f.parts.append(f'<rect class="phase" x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="{row_h - 6}" '
                       f'fill="{color}" opacity="0.8"/>')
        f.parts.append(f'<text class="label" x="{left - 6}" y="{y + row_h - 9:.1f}" text-anchor="end" '
                       f'font-size="11">{escape(label)}</text>')
        if note:
            inside = x1 - x0 > _text_width(note, 10) + 6
            nx = x0 + 3 if inside else min(x1 + 3, W - MR - _text_width(note, 10))
            f.parts.append(f'<text x="{nx:.1f}" y="{y + row_h - 10:.1f}" font-size="10" '
                           f'fill="{"white" if inside else "#333"}">{escape(note)}</text>')
    for _, x0, label, lane in placed:
        f.parts.append(f'<text class="marker" x="{x0:.1f}" y="{lanes_top + LANE_PX * lane + 9:.1f}" font-size="10" '
                       f'fill="#c62828">{escape(label)}</text>')
    return f.svg()


def img_tag(svg: str, alt: str, *, cls: str = "plot") -> str:
    data = base64.b64encode(svg.encode()).decode()
    found = re.search(r'height="(\d+)"', svg)
    height = found.group(1) if found else H
    return (f'<img class="{escape(cls)}" alt="{escape(alt)}" width="{W}" height="{height}" '
            f'src="data:image/svg+xml;base64,{data}">')
