"""The HTML pieces every report is made of: a page, a table whose every cell is escaped, a cell with a class
or a link, and the one way dollars are written. No script, no network: a report opens offline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape
from typing import Any

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
.row{display:flex;flex-wrap:wrap;gap:0 24px;align-items:flex-start}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ccc;padding:4px 8px;font-size:13px;
text-align:left}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:bold}.bad{color:#c62828;font-weight:bold}.muted{color:#777}
td.sim{color:#999;font-style:italic}img.sim{opacity:.55}
p.simulated{background:#fff4e5;border:2px solid #e0a030;padding:8px 12px;font-weight:bold}
img.plot,img.sweep{border:1px solid #ddd;margin:8px 0;max-width:100%;height:auto}
a{color:#0b57d0}
"""


def table(headers: list[str], rows: list[list[Any]], *, cls: str = "") -> str:
    """An HTML table; every cell escaped. Numbers right-aligned. No headers (a list of label, value rows):
    no header row, rather than an empty one."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for v in row:
            if isinstance(v, (Cell, Link)):
                cells.append(v.html())
            else:
                num = isinstance(v, (int, float)) and not isinstance(v, bool)
                cells.append(f'<td{" class=num" if num else ""}>{escape(show(v))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{max(1, len(headers))}" class="muted">(none)</td></tr>')
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f'<table class="{cls}">{thead}<tbody>' + "".join(body) + "</tbody></table>"


@dataclass
class Cell:
    text: str
    cls: str = ""

    def html(self) -> str:
        return f'<td class="{escape(self.cls)}">{escape(self.text)}</td>'


def show(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):  # six significant digits with thousands separators; whole above 100,000 (ints
        # are ids, counts and codes: shown as they are, so that an instance id can be copied)
        return f"{v:,.0f}" if abs(v) >= 1e5 else f"{v:,.6g}"
    return str(v)


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}"
            f'<p class="muted">Generated {escape(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))} '
            f"from the evidence files in this directory.</p></body></html>\n")


def exit_cell(code: Any) -> Cell:
    return Cell(str(code), "ok" if code in (0, 4) else "bad")


@dataclass
class Link:
    """A table cell holding a link relative to the report (a step log, a run's report)."""

    text: str
    href: str

    def html(self) -> str:
        return f'<td><a href="{escape(self.href)}">{escape(self.text)}</a></td>'


def usd(value: Any, digits: int = 4) -> str:
    """Dollars as people read them: `$0.0004`, `$1.50`; "–" for nothing."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    return f"${value:,.{digits}f}" if abs(value) < 100 else f"${value:,.2f}"
