"""The dead-man switch, checked from the harness's side at the first SSH: is it armed, and when does it fire?

One host command (bounded) does three things (the switch itself is in `onstart.py`):

* reads the host's clock, so the evidence records the skew between the user's clock and the host's (the
  switch compares only with the host's; a large skew is said, not acted on);
* tightens the switch's deadline to `host now + what is left of the allowance` by the harness's own
  monotonic clock since the create was sent (never later than the onstart's own, which is late by at most
  one boot);
* reads the arm probe the switch made with `CONTAINER_API_KEY` through the same URL and path family it
  deletes with: armed only on a 200 whose body shows this instance. Anything else fails the run closed
  (`DeadmanUnarmed`: deleted, proven absent, a message naming the switch and the answer it got), unless the
  user passed `--allow-unarmed-deadman`, which is recorded.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic import BaseModel

from vast_harness.errors import HarnessError
from vast_harness.host.onstart import ARMED_FILE, DEADLINE_FILE, IDLE_FILE, LOG_FILE, PID_FILE
from vast_harness.host.ssh import HostSession
from vast_harness.records import StepOutcome
from vast_harness.vast.endpoints import ENDPOINT_PATHS

ARM_WAIT_S = 50.0  # how long the check waits for the switch's arm probe (20 tries 2 s apart) to be written
SKEW_WARN_S = 60.0  # a host clock this far from the user's is said in the output and the evidence
LOG_KEEP_BYTES = 64 * 1024
_user_clock = time.time  # this machine's clock (a seam: the tests set it an hour off)


class DeadmanUnarmed(HarnessError):
    """The dead-man switch could not prove it can act on its instance (exit 1; the run is torn down)."""


class DeadmanStatus(BaseModel):
    """`deadman` in harness-result.json: the switch as the harness found it at the first SSH."""

    armed: bool
    probe_status: int | None = None  # the arm probe's HTTP status (0: no answer; None: no probe written)
    probe_body_head: str = ""
    allowance_s: int  # cap + grace, counted from the create
    remaining_s: float | None = None  # of the allowance, at the check (harness monotonic clock)
    fires_at_host_epoch: int | None = None  # the deadline the switch reads (host clock)
    fires_at_utc: str | None = None  # the same instant on the user's clock
    host_clock_skew_s: float | None = None  # host clock minus user clock (positive: host ahead)
    skew_large: bool = False
    allowed_unarmed: bool = False  # --allow-unarmed-deadman was given
    problem: str | None = None
    log_tail: str = ""  # the switch's log as read at the check (also pulled again at teardown)

    def line(self) -> str:
        """One line for people: "dead-man: armed, fires at <UTC>"."""
        if self.armed:
            return f"dead-man: armed, fires at {self.fires_at_utc}"
        return f"dead-man: NOT ARMED ({self.problem}){'; run allowed by --allow-unarmed-deadman' if self.allowed_unarmed else ''}"


def _script(remaining_s: int, wait_s: int) -> str:
    """Print the host clock, tighten the deadline (never later), wait for and print the arm probe."""
    return (f"n=$(date +%s); d=$((n+{remaining_s})); f=~/{DEADLINE_FILE}; o=$(cat $f 2>/dev/null); "
            f"if [ -z \"$o\" ] || [ $d -lt $o ]; then echo $d > $f.t && mv $f.t $f; fi; "
            f"echo VHCLOCK $n; echo VHDEADLINE $(cat $f); "
            f"i=0; while [ ! -f ~/{ARMED_FILE} ] && [ $i -lt {wait_s} ]; do sleep 1; i=$((i+1)); done; "
            f"echo VHARMED; cat ~/{ARMED_FILE} 2>/dev/null; echo; echo VHLOG; tail -c {LOG_KEEP_BYTES} ~/{LOG_FILE} 2>/dev/null")


def read_log(session: HostSession, *, timeout_s: float) -> str:
    """The switch's log from the host (best effort: '' when the host does not answer)."""
    lines: list[str] = []
    if timeout_s <= 0:
        return ""
    try:
        session.run(f"tail -c {LOG_KEEP_BYTES} ~/{LOG_FILE} 2>/dev/null", on_line=lambda s, line: lines.append(line),
                    timeout_s=timeout_s)
    except Exception:  # noqa: BLE001 - evidence only; the teardown never waits on it
        return ""
    return "\n".join(lines)


def check_armed(session: HostSession, *, instance_id: int, allowance_s: int, elapsed_s: float,
                timeout_s: float, allow_unarmed: bool) -> DeadmanStatus:
    """The switch's state (see the module doc). The caller fails the run unless `armed` (or `allow_unarmed`)."""
    remaining_s = allowance_s - elapsed_s
    lines: list[str] = []
    t_before = _user_clock()
    outcome = session.run(_script(max(0, int(remaining_s)), int(max(1.0, min(ARM_WAIT_S, timeout_s - 2.0)))),
                          on_line=lambda s, line: lines.append(line), timeout_s=max(1.0, timeout_s))
    t_after = _user_clock()
    status = DeadmanStatus(armed=False, allowance_s=allowance_s, remaining_s=round(remaining_s, 3),
                           allowed_unarmed=allow_unarmed)
    marks = {line.split(" ", 1)[0]: i for i, line in enumerate(lines) if line.startswith("VH")}
    host_now = _int_after(lines, "VHCLOCK")
    deadline = _int_after(lines, "VHDEADLINE")
    if host_now is not None:
        status.host_clock_skew_s = round(host_now - (t_before + t_after) / 2, 1)
        status.skew_large = abs(status.host_clock_skew_s) > SKEW_WARN_S
    if deadline is not None:
        status.fires_at_host_epoch = deadline
        user_epoch = deadline - (status.host_clock_skew_s or 0.0)
        status.fires_at_utc = datetime.fromtimestamp(user_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if "VHLOG" in marks:
        status.log_tail = "\n".join(lines[marks["VHLOG"] + 1:])[-LOG_KEEP_BYTES:]
    armed_lines = lines[marks["VHARMED"] + 1: marks.get("VHLOG", len(lines))] if "VHARMED" in marks else []
    armed_lines = [line for line in armed_lines if line.strip()]
    shows = False
    if armed_lines:
        status.probe_status = _int(armed_lines[0].strip())
        shows = len(armed_lines) > 1 and armed_lines[1].strip() == "shows"  # the switch grepped its body for its id
        status.probe_body_head = "\n".join(armed_lines[2:])[:1000]
    status.problem = _problem(outcome, status, instance_id, deadline, shows=shows)
    status.armed = status.problem is None
    return status


def _problem(outcome: StepOutcome, status: DeadmanStatus, instance_id: int, deadline: int | None, *,
             shows: bool) -> str | None:
    code, body = status.probe_status, status.probe_body_head
    path = ENDPOINT_PATHS["get_instance"].format(id=instance_id)
    if not outcome.ok and deadline is None:
        return "the check command did not run on the host" + (f" ({outcome.detail})" if outcome.detail else "")
    if deadline is None:
        return "no deadline file on the host"
    if code is None and outcome.rc is None:  # cut off (timeout, lost link): the host said nothing either way
        return f"the check did not finish on the host ({outcome.detail or 'no exit status'}) before its arm probe was read"
    if code is None:
        return f"the switch wrote no arm probe within {ARM_WAIT_S:g} s (onstart did not run?)"
    if code == 200 and shows:
        return None
    if code == 200:
        return f"its read of {path} answered 200 without this instance: {body[:200]!r}"
    what = {0: "no answer", 401: "401: the container key was refused", 403: "403: the container key was refused",
            410: "410: the endpoint is gone (deprecated_endpoint?)"}.get(code, f"HTTP {code}")
    return f"its read of {path} with CONTAINER_API_KEY got {what}: {body[:200]!r}"


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _int_after(lines: list[str], mark: str) -> int | None:
    for line in lines:
        if line.startswith(mark + " "):
            return _int(line.split(" ", 1)[1].strip())
    return None


class SwitchStatus(BaseModel):
    """A kept host's switch as a later command finds it (`push_deadlines`): its deadlines on the host's clock,
    whether it still runs, and the host's clock against this machine's."""

    host_now: int | None = None
    cap_epoch: int | None = None  # the switch's cap deadline (host clock), after tightening
    idle_epoch: int | None = None  # its idle deadline (host clock), after the push
    alive: bool = False  # its process is there and not stopped: it can act
    stopped: bool = False  # its process is there but stopped (state T/t): as good as dead
    host_clock_skew_s: float | None = None  # host minus this machine
    problem: str | None = None  # why the push or the check failed (None: pushed, and the switch runs)

    def fires_in_s(self) -> float | None:
        """Seconds until the switch deletes the host, on its own clock (None: unknown)."""
        ends = [e for e in (self.cap_epoch, self.idle_epoch) if e is not None]
        return min(ends) - self.host_now if ends and self.host_now is not None else None


def _push_script(cap_left_s: int, idle_s: int | None) -> str:
    """Tighten the cap file (never later), write the idle file (when given), print both, the host's clock and
    whether the process named by the switch's pid file is the switch, and whether it runs (not stopped)."""
    idle = (f"g=~/{IDLE_FILE}; echo $((n+{idle_s})) > $g.t && mv $g.t $g; " if idle_s is not None else "")
    return (f"n=$(date +%s); f=~/{DEADLINE_FILE}; d=$((n+{cap_left_s})); o=$(cat $f 2>/dev/null); "
            f"case \"$o\" in ''|*[!0-9]*) o=;; esac; "
            f"if [ -z \"$o\" ] || [ $d -lt $o ]; then echo $d > $f.t && mv $f.t $f; fi; {idle}"
            f"echo VHCLOCK $n; echo VHDEADLINE $(cat $f 2>/dev/null); echo VHIDLE $(cat ~/{IDLE_FILE} 2>/dev/null); "
            f"p=$(cat ~/{PID_FILE} 2>/dev/null); "
            # its state, the field after the parenthesised name in /proc/PID/stat: T/t stopped (SIGSTOP, traced)
            f"if [ -n \"$p\" ] && grep -q vh-deadman /proc/$p/cmdline 2>/dev/null; then "
            f"st=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1); "
            f"case \"$st\" in T|t) echo VHSWITCH stopped;; Z|X|x) echo VHSWITCH dead;; *) echo VHSWITCH alive;; esac; "
            f"else echo VHSWITCH dead; fi")


def push_deadlines(session: HostSession, *, cap_left_s: float, idle_s: float | None, timeout_s: float) -> SwitchStatus:
    """A kept host's deadlines, from a later command: the switch's cap tightened to what is left of the hold's
    caps (`cap_left_s`, never later than it was), its idle deadline set to host now + `idle_s` (moved later or
    earlier: it is the idle deadline; the cap bounds it on the host), and whether the switch still runs. One
    bounded host command; `problem` says what went wrong."""
    lines: list[str] = []
    t_before = _user_clock()
    outcome = session.run(_push_script(max(0, int(cap_left_s)), None if idle_s is None else max(0, int(idle_s))),
                          on_line=lambda s, line: lines.append(line), timeout_s=max(1.0, timeout_s))
    t_after = _user_clock()
    status = SwitchStatus(host_now=_int_after(lines, "VHCLOCK"), cap_epoch=_int_after(lines, "VHDEADLINE"),
                          idle_epoch=_int_after(lines, "VHIDLE"),
                          alive=any(line.strip() == "VHSWITCH alive" for line in lines),
                          stopped=any(line.strip() == "VHSWITCH stopped" for line in lines))
    if status.host_now is not None:
        status.host_clock_skew_s = round(status.host_now - (t_before + t_after) / 2, 1)
    if not outcome.ok or status.host_now is None:
        status.problem = f"the deadline push did not run on the host ({outcome.detail or f'rc={outcome.rc}'})"
    elif status.cap_epoch is None:
        status.problem = "the switch's deadline file is missing on the host"
    elif idle_s is not None and status.idle_epoch is None:
        status.problem = "the idle deadline could not be written on the host"
    elif status.stopped:
        status.problem = ("the dead-man switch is stopped on the host (its process is in state T: a SIGSTOP or a "
                          "tracer), so it deletes nothing")
    elif not status.alive:
        status.problem = "the dead-man switch no longer runs on the host (its process is gone)"
    return status
