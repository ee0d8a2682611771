"""`vast-e2e status`: read-only. Every live run of this user (its registration) and every `vh-` instance of the
account (the v1 list), one row each: run id, profile, GPU, age, $/h, accrued $, caps, deadline, owner (this
machine / elsewhere) and state (starting / running / orphan / tearing down).

Ages and accrued dollars are on the API server's clock (its `Date` header against the instance's
`start_date`), never this machine's wall clock; an orphan is what `reap` would delete (`orphans.judge`). A run
that is tearing down says so in its registration (its instances may no longer be listed), with its absence
proof's rounds. `status --sim` reads the --sim runs' registrations only: each --sim run's instances live in its
own embedded simulator, which no other process can reach.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from rich.table import Table

from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.console.terminal import safe_cells, safe_text, terminal_safe
from vast_harness.errors import AuthError, ExitCode, VastError
from vast_harness.instance.absence import is_lingering
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.ledger import Ledger
from vast_harness.state.registry import LABEL_PREFIX, LiveRun, Registration, RunRegistry, parse_label
from vast_harness.state.runs import refuse_file_on_path
from vast_harness.vast.client import VastClient
from vast_harness.views.orphans import LiveInstance, judge


class StatusRow(BaseModel):
    run_id: str | None
    instance_id: int | None = None
    label: str | None = None
    profile: str | None = None
    gpu: str | None = None
    age_s: float | None = None
    dph_usd: float | None = None
    accrued_usd: float | None = None
    max_usd: float | None = None
    max_minutes: float | None = None
    deadline_unix: float | None = None
    owner: str  # this machine | elsewhere
    state: str  # starting | running | orphan | tearing down | held | busy | expired | ending (a kept host's)
    why: str = ""
    held: str | None = None  # the kept host's name (`vast-e2e up NAME`)


def collect(spec: RunSpec, client: VastClient | None) -> tuple[list[StatusRow], list[str]]:
    """The rows, and what could not be read (a failed list is said, never shown as "nothing running").
    Without a client (`status --sim`) the registrations alone."""
    problems: list[str] = []
    refuse_file_on_path(spec.state_dir, "the state directory")  # else every live run here looked "elsewhere"
    registry = RunRegistry(spec.state_dir)
    runs = registry.scan()
    problems.extend(registry.skipped)
    store = HeldStore(spec.state_dir)
    holds = store.all()
    problems.extend(store.skipped)
    held_rows = [_held_row(store, record) for record in holds]
    held_ids = {r.hold_id for r in holds}
    if client is not None:  # an interruptible hold's host outbid while no command runs: said as such
        held_rows = [_held_row(store, record, paused=_paused(client, record)) for record in holds]
    else:  # `status --sim`: a `--sim` hold's own simulator, read with the hold's simulator key
        held_rows = [_held_row(store, record, paused=_paused_on_own_sim(spec, record)) for record in holds]
    if client is None:
        return held_rows + [_registered_only(run, instance_id) for run_id, run in sorted(runs.items())
                            if run.liveness == "live" and run_id not in held_ids
                            for instance_id in (run.reg.instance_ids if run.reg and run.reg.instance_ids else [None])
                            ], problems
    try:
        instances = [i for i in client.list_instances() if (i.label or "").startswith(LABEL_PREFIX)]
    except AuthError:
        raise  # a refused key is bad configuration (exit 2), not an account that shows nothing
    except VastError as exc:
        instances = []
        problems.append(f"could not list the account's instances: {exc}")
    server_now = client.server_clock.now()
    server_now = None if server_now is None else min(server_now, time.time())  # as reap judges: both clocks agree
    entries = Ledger.for_spec(spec).entries()
    known = {e.run_id for e in entries}
    processes = {e.run_id: e.process for e in entries if e.process is not None}
    rows: list[StatusRow] = list(held_rows)
    for inst in instances:
        info = parse_label(inst.label)
        run_id = info.run_id if info else None
        if run_id in held_ids:  # a kept host's: its row above says more (idle deadline, last exec)
            continue
        run = runs.get(run_id or "")
        reg = run.reg if run else None
        kind, why = judge(None, inst.label or "", inst, runs=runs, known_runs=known, server_now=server_now,
                          processes=processes)
        age = server_now - inst.start_date if server_now is not None and inst.start_date is not None else None
        state = "tearing down" if is_lingering(inst) else ("orphan" if kind == "orphan" else "running")
        if reg is not None and run is not None and run.liveness == "live" and reg.phase == "tearing down":
            state, why = "tearing down", _proof_progress(reg)  # the run says so: deleted, being proven absent
        rows.append(StatusRow(
            run_id=run_id, instance_id=inst.id, label=inst.label, profile=reg.profile if reg else None,
            gpu=inst.gpu_name or (reg.gpu if reg else None), age_s=age, dph_usd=inst.dph_total,
            accrued_usd=inst.dph_total * max(0.0, age) / 3600.0 if age is not None and inst.dph_total else None,
            max_usd=reg.max_usd if reg else None, max_minutes=reg.max_minutes if reg else None,
            deadline_unix=(info.deadline_unix if info and info.deadline_unix else (reg.deadline_unix if reg else None)),
            owner="this machine" if run is not None and run.liveness in ("live", "dead") else "elsewhere",
            state=state, why=why))
    listed = {(r.run_id, r.instance_id) for r in rows}
    for run_id, run in sorted(runs.items()):
        if run.liveness != "live" or run_id in held_ids:
            continue
        # A live run's instances the list does not show: not listed yet, or deleted and being proven absent.
        ids = run.reg.instance_ids if run.reg and run.reg.instance_ids else []
        rows.extend(_registered_only(run, i) for i in ids if (run_id, i) not in listed)
        if not ids and not any(r[0] == run_id for r in listed):
            rows.append(_registered_only(run, None))
    return rows, problems


def _paused(client: VastClient, record: HeldHost) -> str | None:
    """Why an interruptible hold's held instance reads paused (outbid), else None (or unreadable)."""
    if record.bid is None or record.instance_id is None or record.state != "held":
        return None
    try:
        read = client.get_instance(record.instance_id, max_retry_s=0.0)
    except VastError:
        return None
    return read.paused if read is not None else None


def _paused_on_own_sim(spec: RunSpec, record: HeldHost) -> str | None:
    """`_paused` for a `--sim` hold, on the simulator its `up` started (its URL and key in the record)."""
    if record.bid is None or record.instance_id is None or record.state != "held" or not record.sim_key:
        return None
    try:
        with VastClient(record.sim_key, base_url=record.api_url, pacing_scale=spec.pacing_scale) as client:
            return _paused(client, record)
    except (VastError, OSError):
        return None


def _held_row(store: HeldStore, record: HeldHost, *, paused: str | None = None) -> StatusRow:
    """A kept host: its accrued dollars against its caps now (its price since the create, and the bytes), the
    deadline that ends it, the idle deadline and the last exec, and who is at work on it; an interruptible
    one's outbid (paused now, or its husk already deleted)."""
    left_s = record.left_s()
    busy = store.busy(record.name)
    if record.state == "ending":
        state = "ending"
    elif paused is not None:
        state = "outbid (paused)"
    elif record.state == "outbid":
        state = "outbid"
    elif left_s <= 0:
        state = "expired"
    elif busy is not None:
        state = f"busy: {busy.command}"
    else:
        state = record.state  # starting | held
    idle = (f"idle deadline in {record.idle_deadline.left_s():.0f} s" if record.idle_deadline is not None
            and record.idle_deadline.left_s() > 0 else "idle deadline passed" if record.idle_deadline else "")
    last = (f"last exec {time.time() - record.last_exec_unix:.0f} s ago "
            + ("(it did not end: killed? its command may still run there; the next exec stops it)"
               if record.exec_unfinished and busy is None else f"(rc {record.last_exec_rc})")
            if record.last_exec_unix else "no exec yet")
    why = {"expired": f"its {record.why_deadline()} deadline passed {-left_s:.0f} s ago: its switch deletes it, "
                      "`vast-e2e reap` proves it gone",
           "ending": record.message or "ending",
           "outbid (paused)": f"{paused}: the watcher or the next command salvages and deletes it (storage bills)",
           "outbid": f"{record.message or 'outbid'}; nothing billed until the next exec rents another host"}.get(state, f"{idle}; {last}; ends by its {record.why_deadline()} "
                                                            "deadline")
    created = record.created.to_mono() if record.created else None
    return StatusRow(run_id=record.hold_id, instance_id=record.instance_id, label=record.label, profile="kept",
                     gpu=record.gpu, age_s=now_s() - created if created is not None else None,
                     dph_usd=record.dph_usd, accrued_usd=record.accrued_now_usd(), max_usd=record.max_usd,
                     max_minutes=record.max_minutes, deadline_unix=time.time() + left_s, owner="this machine",
                     state=state, why=why, held=record.name)


def _proof_progress(reg: Registration) -> str:
    if not reg.proof_rounds:
        return "deleting; absence proof not started"
    return f"absence proof round {reg.proof_rounds} (last round: {reg.last_round or '?'})"


def _registered_only(run: LiveRun, instance_id: int | None) -> StatusRow:
    reg = run.reg
    tearing_down = reg is not None and reg.phase == "tearing down"
    if tearing_down and reg is not None:
        why = _proof_progress(reg)
    elif instance_id is not None:
        why = "rented; not listed yet (reads lag creates)"
    else:
        why = "registered; no instance rented yet"
    return StatusRow(run_id=run.run_id, instance_id=instance_id, profile=reg.profile if reg else None,
                     gpu=reg.gpu if reg else None,
                     max_usd=reg.max_usd if reg else None, max_minutes=reg.max_minutes if reg else None,
                     deadline_unix=reg.deadline_unix if reg else None, owner="this machine",
                     state="tearing down" if tearing_down else "starting", why=why)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) if t else "?"


def _money(v: float | None, digits: int = 4) -> str:
    return f"{v:.{digits}f}" if v is not None else "?"


def show_status(spec: RunSpec, client: VastClient | None, out: Output) -> int:
    rows, problems = collect(spec, client)
    # a registration that is not a regular file (a link, a FIFO) is skipped and said; it fails nothing: only
    # what kept status from seeing the account (an unreadable list) does
    failing = [p for p in problems if not p.startswith("registration ")]
    if out.json_mode:
        out.emit_json({"rows": [r.model_dump() for r in rows], "problems": problems,
                       "server_clock": client.server_clock.now() if client else None, "state_dir": str(spec.state_dir)})
    elif not rows:  # a sentence, not an empty table; what could not be read is said below
        if not failing:
            where = "no --sim run" if client is None else "no run of this user and no vh- instance on the account"
            out.out.print(terminal_safe(f"nothing live: {where} (state dir {spec.state_dir})"))
    else:
        t = Table(title=f"vast-harness status ({len(rows)} row(s); state dir {spec.state_dir})", header_style="bold")
        for col in ("run", "instance", "profile", "GPU", "age", "$/h", "accrued $", "caps", "deadline", "owner",
                    "state", "why"):
            t.add_column(col, overflow="fold")
        for r in rows:
            caps = f"${r.max_usd:g} / {r.max_minutes:g} min" if r.max_usd is not None and r.max_minutes else "?"
            style = {"orphan": "red", "tearing down": "yellow", "expired": "red", "ending": "yellow",
                     "held": "green"}.get(r.state, "")
            # every cell may carry what the API sent (a label, a GPU name): control characters shown escaped
            run = f"{r.held} ({r.run_id})" if r.held else r.run_id or "?"
            t.add_row(*safe_cells(run, str(r.instance_id or "-"), r.profile or "?", r.gpu or "?",
                                  f"{r.age_s:.0f} s" if r.age_s is not None else "?", _money(r.dph_usd),
                                  _money(r.accrued_usd), caps, _when(r.deadline_unix), r.owner),
                      safe_text(r.state, style=style), safe_text(r.why))
        out.out.print(t)
    if not out.json_mode:
        for p in problems:
            out.warn(p)
    return ExitCode.FAILED if failing else ExitCode.PASSED


def confirm_live(live: list[LiveInstance]) -> bool:
    """`reap --include-live`'s prompt, on stderr: every live run it would delete, then yes/no."""
    import typer

    for li in live:
        typer.echo(terminal_safe(li.line()), err=True)  # the label is the API's
    try:
        return bool(typer.confirm(f"delete these {len(live)} live instance(s)?", default=False, err=True))
    except (EOFError, typer.Abort):
        return False
