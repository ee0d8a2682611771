"""Which `vh-` instances are orphans and which are a live run's: the judgement `status` shows and `reap` acts on.

One function decides it (`judge`), so what `status` calls an orphan is exactly what `reap` would delete. It
reads only: the instance's label and row, this user's registrations and ledger, the API server's clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel

from vast_harness.caps.meter import teardown_budget_s
from vast_harness.state.held import HeldHost
from vast_harness.state.process import ProcessId, this_host, this_process
from vast_harness.state.registry import MAX_RUN_S, LiveRun, parse_label
from vast_harness.timings import Timings
from vast_harness.vast.models import Instance

# A run past its cap deadline is tearing down for at most its teardown budget (at Vast's proof interval):
# only after that is its instance an orphan to a reap that cannot see the run itself.
DEADLINE_GRACE_S = teardown_budget_s(Timings.real().proof_interval_s) + 60.0


class LiveInstance(BaseModel):
    """An instance reap left alone because its run may still be working."""

    instance_id: int
    label: str
    run_id: str | None
    why: str
    host: str | None = None
    dph_usd: float | None = None
    accrued_usd: float | None = None
    deadline_unix: float | None = None

    def line(self) -> str:
        accrued = f"${self.accrued_usd:.4f} accrued" if self.accrued_usd is not None else "accrued unknown"
        ends = (time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.deadline_unix)) if self.deadline_unix
                else "unknown")
        return (f"run {self.run_id or '?'} on host {self.host or '?'}, live, {accrued}, ends by {ends}: instance "
                f"{self.instance_id} ({self.label}) left alone ({self.why}); `reap --include-live` deletes it")


Judgement = tuple[Literal["orphan", "live"], str]


def label_deadline(label: str, row: Instance | None) -> tuple[float | None, str]:
    """The cap deadline a label gives, checked against the instance's own `start_date` (Vast's clock), and a
    note when the row changed it. A label's deadline is as good as the `Date` header it was computed from: a
    run whose answers came 2 h late wrote a deadline 2 h early. The seconds of cap the label carries, added to
    the start date, bound the run's end on Vast's clock; the later of the two counts. An older label without
    them whose deadline precedes the instance's start contradicts itself and is not trusted at all."""
    info = parse_label(label)
    deadline = info.deadline_unix if info else None
    started = row.start_date if row is not None else None
    if info is None or deadline is None or started is None:
        return deadline, ""
    if info.left_s is not None:
        by_start = started + info.left_s
        if by_start > deadline:
            return by_start, f" (the instance's start + the {info.left_s:.0f} s of cap its label carries)"
        return deadline, ""
    if deadline < started:
        return None, " (its label's deadline precedes the instance's own start: written from a skewed clock)"
    return deadline, ""


def _pid_text(run: LiveRun, process: ProcessId | None) -> str:
    """The run's pid from its registration, else from its ledger lines; else say why there is none."""
    if run.reg is not None:
        return f"pid {run.reg.pid}"
    if process is not None:
        return f"pid {process.pid}, from its ledger"
    return "pid unknown: its registration file is unreadable"


def judge(run_id: str | None, label: str, row: Instance | None, *, runs: dict[str, LiveRun], known_runs: set[str],
          server_now: float | None, processes: Mapping[str, ProcessId] | None = None,
          held: Mapping[str, HeldHost] | None = None) -> Judgement:
    """Is this instance an orphan (its run is dead, or past its own cap deadline) or a live run's?

    The label's deadline is compared with the API server's clock (never this machine's wall clock alone) and
    checked against the instance's own start (`label_deadline`); a registration on this machine is judged by its
    lock, then by its process; a run this user's ledger knows but that holds no registration has ended unless its
    process (recorded on its ledger lines) still runs here. A kept host (`held`, by hold id: no process holds it
    between commands) is live until its own deadline (the earliest of its caps and its idle deadline, on this
    machine's boot clock), an orphan after, or once its hold is ending. What cannot be judged is treated as live:
    deleting a live run's host is the harm this avoids, and the dead-man switch still ends it."""
    info = parse_label(label)
    run_id = run_id or (info.run_id if info else None)
    deadline, note = label_deadline(label, row)
    if deadline is not None and server_now is not None and server_now > deadline + DEADLINE_GRACE_S:
        return "orphan", f"its cap deadline passed {server_now - deadline:.0f} s ago (API server's clock){note}"
    hold = (held or {}).get(run_id or "")
    if hold is not None and hold.machine == this_host():
        if hold.state == "ending":
            return "orphan", f"kept host {hold.name}'s hold is ending, its instance not proven gone ({hold.message})"
        left_s = hold.left_s()
        if left_s > 0:
            return "live", (f"kept host {hold.name}, held: its {hold.why_deadline()} deadline is {left_s:.0f} s "
                            "ahead (this machine's clock)")
        return "orphan", f"kept host {hold.name}: its {hold.why_deadline()} deadline passed {-left_s:.0f} s ago"
    run = runs.get(run_id or "")
    process = (processes or {}).get(run_id or "")
    if run is not None:
        if run.liveness == "live":
            how = "its process is alive (its registration file lost its lock)" if run.unlocked else \
                "its run holds its registration on this machine"
            return "live", f"{how} ({_pid_text(run, process)})"
        if run.liveness == "dead":
            if process is not None and _alive_here(process):
                # The file lost its lock, and its content (an editor's or a backup's bad copy) is unreadable or
                # names a process that is gone: the ledger's lines still name the run's process, and it runs.
                return "live", (f"its run's process (pid {process.pid}) is alive on this machine, though its "
                                "registration file says otherwise")
            return "orphan", f"its run ({_pid_text(run, process)}) is dead: nothing holds its registration"
    elif run_id in known_runs and (process is None or process.host == this_host()):
        # Only a run of this machine is judged by its registration here; another machine's (a synced state dir)
        # is judged by its label's deadline below, like any run elsewhere.
        if process is not None and _alive_here(process):
            return "live", (f"its run's process (pid {process.pid}) is alive on this machine, though its "
                            "registration is gone")
        return "orphan", "its run has ended (this user's ledger knows it; it holds no registration)"
    if deadline is not None:
        if server_now is None:
            return "live", "its cap deadline cannot be judged: the API sent no Date header"
        if deadline >= server_now:
            return "live", f"its cap deadline is {deadline - server_now:.0f} s ahead (API server's clock){note}"
        return "live", (f"its cap deadline passed {server_now - deadline:.0f} s ago, within the "
                        f"{DEADLINE_GRACE_S:.0f} s teardown grace (API server's clock){note}")
    started = row.start_date if row is not None else None
    if started is not None and server_now is not None and server_now - started > MAX_RUN_S:
        return "orphan", f"an old label without a deadline, created {(server_now - started) / 3600:.0f} h ago{note}"
    return "live", f"not this user's run and its label carries no deadline it can trust{note}: it may be working elsewhere"


def _alive_here(process: ProcessId) -> bool:
    """The process a run's ledger lines name runs on this machine (the reaper itself is no run)."""
    return process.host == this_host() and process != this_process() and bool(process.running())
