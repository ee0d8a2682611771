"""`vast-e2e check`: read-only, like `sky check`. Does this account, at this API, answer the way the harness
expects? Nothing is created, nothing is deleted.

One row per fact: the key is accepted, credit and balance, each endpoint the harness uses answers in the shape
it parses (and none says deprecated), and the image reference the create would send. Exit 0 when every row is
ok, 1 naming the rows that are not, 2 for bad input (the CLI's usual validation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from rich.table import Table
from rich.text import Text

from vast_harness.console.money import usd
from vast_harness.console.output import Output
from vast_harness.errors import AuthError, EndpointDeprecated, ExitCode, VastError
from vast_harness.market.offers import price_faults
from vast_harness.spec.resolve import RunSpec
from vast_harness.vast.client import VastClient
from vast_harness.vast.endpoints import ENDPOINT_PATHS
from vast_harness.vast.models import UnreadableShape, per_id_row

CHECK_RETRY_S = 30.0  # like the preflight: an API that does not answer is a failed row, not a hang
_PROBE_SEARCH = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False},
                 "type": "on-demand", "order": [["dph_total", "asc"]], "limit": 5}


class CheckRow(BaseModel):
    name: str
    ok: bool | None  # None: information, never a failure
    detail: str


class CheckReport(BaseModel):
    api_url: str
    rows: list[CheckRow]
    key_refused: bool = False  # a rejected key is bad configuration (exit 2), not a failed check

    @property
    def failed(self) -> list[CheckRow]:
        return [r for r in self.rows if r.ok is False]

    @property
    def exit_code(self) -> ExitCode:
        if self.key_refused:
            return ExitCode.BAD_INPUT
        return ExitCode.FAILED if self.failed else ExitCode.PASSED


def _deprecated(text: str) -> bool:
    return "deprecated" in text.lower()


def _row(name: str, fn: Callable[[], tuple[bool | None, str]]) -> CheckRow:
    """One check; a typed error becomes a failed row naming it (a 410 deprecated_endpoint loudly)."""
    try:
        ok, detail = fn()
    except EndpointDeprecated as exc:
        return CheckRow(name=name, ok=False, detail=f"DEPRECATED: {exc}")
    except VastError as exc:
        return CheckRow(name=name, ok=False, detail=str(exc)[:400])
    return CheckRow(name=name, ok=ok, detail=detail)


def run_checks(spec: RunSpec, client: VastClient) -> CheckReport:
    rows: list[CheckRow] = []
    answered = refused = False

    def user() -> tuple[bool | None, str]:
        nonlocal answered, refused
        try:
            u = client.current_user(max_retry_s=CHECK_RETRY_S)
        except AuthError as exc:
            refused = True
            raise VastError(f"the key was refused: {exc}") from None
        answered = True
        funds = u.available_usd
        def money(v: float | None) -> str:
            return "not sent" if v is None else usd(v)

        return funds > 0, (f"credit {money(u.credit)}, balance {money(u.balance)}: {usd(funds)} spendable"
                           + ("" if funds > 0 else " (nothing can be rented)"))

    rows.append(_row("key and credit", user))
    if not answered:  # a refused key or an API that does not answer: every other call would say the same
        return CheckReport(api_url=spec.api_url, rows=rows, key_refused=refused)

    def search() -> tuple[bool | None, str]:
        offers = client.search_offers(_PROBE_SEARCH, max_retry_s=CHECK_RETRY_S)
        priced = [o for o in offers if (o.dph_total is not None or o.dph_base is not None) and not price_faults(o)]
        if not offers:
            return False, "answered with no offers at all"
        return bool(priced), f"{len(offers)} offer(s) parsed, {len(priced)} with a usable price"

    rows.append(_row(f"search  POST {ENDPOINT_PATHS['search_offers']}", search))
    seen_id: list[int] = []

    def v1_list() -> tuple[bool | None, str]:
        page = client.list_instances_page(limit=1)
        if page.instances:
            seen_id.append(page.instances[0].id)
        return True, (f"{page.total_instances if page.total_instances is not None else '?'} instance(s); "
                      f"next_token {'present' if page.next_token else 'none'}")

    rows.append(_row(f"list    GET {ENDPOINT_PATHS['list_instances']}", v1_list))

    def per_id() -> tuple[bool | None, str]:
        instance_id = seen_id[0] if seen_id else 1  # none of ours: someone else's id reads as null
        x = client.read_instance_raw(instance_id)
        body = x.text[:200]
        if x.status == 410 or _deprecated(body):
            return False, f"DEPRECATED: HTTP {x.status} {body!r}: the dead-man switch and the absence proof use this path"
        try:
            shape, shown = per_id_row(x.json, instance_id) if x.status == 200 else (None, None)
        except UnreadableShape:
            shape = None
        if shape is None:
            return False, f"HTTP {x.status} {x.error or body!r}: not the {{'instances': ...}} the proof reads"
        what = f"instance {shown.get('id')}" if shown is not None else shape
        return True, f"200, instances: {what} ({shape}; DELETE shares this path; not exercised: read-only)"

    rows.append(_row(f"read    GET {ENDPOINT_PATHS['get_instance']}", per_id))

    def image() -> tuple[bool | None, str]:
        ref = spec.profile.image_ref
        return None, (f"the create sends {ref.create_form} (tag {ref.tag} kept in the profile); whether Vast "
                      "accepts it is measured by `vast-e2e canary`")

    rows.append(_row("image reference", image))
    return CheckReport(api_url=spec.api_url, rows=rows)


def report_json(report: CheckReport) -> dict[str, Any]:
    return {"api_url": report.api_url, "ok": not report.failed, "exit_code": int(report.exit_code),
            "checks": [r.model_dump() for r in report.rows]}


def print_report(out: Output, report: CheckReport) -> None:
    if out.json_mode:
        out.emit_json(report_json(report))
        return
    table = Table(title=Text(f"vast-e2e check: {report.api_url}"), show_lines=False)
    for header in ("check", "", "detail"):
        table.add_column(header)
    for row in report.rows:
        mark = {True: Text("ok", "green"), False: Text("FAIL", "bold red"), None: Text("info", "cyan")}[row.ok]
        table.add_row(Text(row.name), mark, Text(row.detail))
    out.out.print(table)
    if report.failed:
        out.warn("not ready: " + "; ".join(r.name for r in report.failed))
