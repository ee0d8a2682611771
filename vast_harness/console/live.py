"""Watching a run: the phases it went through (for the record and the report's timeline) and the live view.

`PhaseLog` records each phase (plan, create, boot, upload, each step, pull, teardown) with its start and end
time and the dollars accrued at both ends; the record carries it and `report.html` draws it.

`LiveView` shows, on stderr only: when stderr is a terminal, a rich `Live` region (the current phase with its
elapsed time and accrued dollars, bars for the dollar and the time cap, a spinner and "quiet N s" while a step
prints nothing) with the step lines and one line per finished step printed above it; otherwise plain
heartbeat lines every `heartbeat_s` of silence, so a 40-minute sweep never looks hung in a CI log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from vast_harness.clock import now_s
from vast_harness.console.terminal import safe_text, terminal_safe
from vast_harness.records import PhaseRecord

HEARTBEAT_S = 30.0  # plain mode: a line after this much silence (and again after each further interval)
QUIET_SHOWN_AFTER_S = 2.0  # live mode: "quiet N s" once a step has printed nothing for this long


class PhaseLog:
    """The run's phases in order; starting one ends the previous one. Thread-safe (a fleet's runs, the view)."""

    def __init__(self, accrued_usd: Callable[[], float], *, clock: Callable[[], float] = now_s) -> None:
        self._accrued = accrued_usd
        self._clock = clock  # the run's monotonic clock (the phase's elapsed time in the live view)
        self._lock = threading.Lock()
        self.records: list[PhaseRecord] = []
        self.current_started_mono = clock()

    def start(self, name: str) -> None:
        usd = self._accrued()
        with self._lock:
            self._end_locked(usd)
            self.records.append(PhaseRecord(name=name, t_start_unix=time.time(), usd_start=usd))
            self.current_started_mono = self._clock()

    def end(self) -> None:
        usd = self._accrued()
        with self._lock:
            self._end_locked(usd)

    def _end_locked(self, usd: float) -> None:
        if self.records and self.records[-1].t_end_unix is None:
            self.records[-1].t_end_unix = time.time()
            self.records[-1].usd_end = usd

    @property
    def current(self) -> str:
        with self._lock:
            return self.records[-1].name if self.records and self.records[-1].t_end_unix is None else ""


@dataclass
class Snapshot:
    """What the view shows, read from the run each refresh."""

    phase: str
    phase_elapsed_s: float
    accrued_usd: float
    max_usd: float
    elapsed_s: float
    max_s: float
    step_number: int | None = None  # "step k of n" while a step runs
    step_count: int = 0
    tearing_down: bool = False  # DELETE sent or teardown begun: silence is expected, the dollars stop at its ack
    teardown_expected_s: float | None = None  # how long a teardown usually takes (its DELETEs and proofs)


def _bar(done: float, total: float) -> ProgressBar:
    return ProgressBar(total=max(total, 1e-9), completed=min(max(done, 0.0), total), width=30)


def minutes_seconds(seconds: float) -> str:
    """`14 m 05 s`: time left to a cap as people count it (never negative)."""
    whole = max(0, int(seconds))
    return f"{whole // 60} m {whole % 60:02d} s"


def phase_label(s: Snapshot) -> str:
    """The phase as shown: `step 2 of 5: sweep` while a step runs."""
    if s.step_number is not None and s.phase.startswith("step "):
        return f"step {s.step_number} of {s.step_count}: {s.phase.removeprefix('step ')}"
    return s.phase or "finishing"


def teardown_note(s: Snapshot) -> str:
    return (f" (a teardown usually takes ~{s.teardown_expected_s:.0f} s)"
            if s.tearing_down and s.teardown_expected_s is not None else "")


class LiveView:
    """The live display of one run (see the module docstring). `line_printed` resets the quiet clock."""

    def __init__(self, console: Console, snapshot: Callable[[], Snapshot], *, live: bool,
                 heartbeat_s: float = HEARTBEAT_S, plain: Callable[[str], None] | None = None) -> None:
        self.console, self._snapshot, self.is_live = console, snapshot, live
        self.heartbeat_s = heartbeat_s
        self._plain = plain or (lambda text: console.print(Text(text, style="dim")))
        self._last_line = now_s()
        self._last_beat = now_s()
        self._spinner = Spinner("dots")
        self._live: Live | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.progress = ""  # a progress bar's latest drawing (carriage.py), shown under the status line

    def line_printed(self) -> None:
        self._last_line = self._last_beat = now_s()

    def quiet_s(self) -> float:
        return now_s() - self._last_line

    def render(self) -> RenderableType:
        s = self._snapshot()
        head = Table.grid(padding=(0, 1))
        quiet = self.quiet_s()
        # a step that prints nothing is the one that looks hung; in a teardown silence is expected
        in_step = s.phase.startswith("step ") and not s.tearing_down
        status = Text.assemble((terminal_safe(phase_label(s)), "bold cyan"), f"  {s.phase_elapsed_s:6.1f} s  ",
                               (f"${s.accrued_usd:.4f}", "bold"), (teardown_note(s), "dim"),
                               (f"   quiet {quiet:.0f} s" if in_step and quiet >= QUIET_SHOWN_AFTER_S else "",
                                "yellow"))
        head.add_row(self._spinner, status)
        if in_step and self.progress:
            head.add_row(Text(""), safe_text(self.progress, "dim"))
        caps = Table.grid(padding=(0, 1))
        caps.add_row(Text("dollar cap", style="dim"), _bar(s.accrued_usd, s.max_usd),
                     Text(f"${s.accrued_usd:.4f} of ${s.max_usd:.2f}"))
        caps.add_row(Text("time cap  ", style="dim"), _bar(s.elapsed_s, s.max_s),
                     Text(f"{s.elapsed_s / 60:.1f} of {s.max_s / 60:.0f} min · "
                          f"{minutes_seconds(s.max_s - s.elapsed_s)} left"))
        return Group(head, caps)

    def heartbeat_text(self) -> str:
        s = self._snapshot()
        what = (f"tearing down{teardown_note(s).replace(' (', '; ').removesuffix(')')}" if s.tearing_down
                else f"still running, no output for {self.quiet_s():.0f} s")
        return (f"[{phase_label(s)} {s.phase_elapsed_s:6.1f}s ${s.accrued_usd:.4f}] {what} (${s.accrued_usd:.4f} of "
                f"${s.max_usd:.2f}, {minutes_seconds(s.max_s - s.elapsed_s)} left of {s.max_s / 60:.0f} min)")

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s / 4)):
            now = now_s()
            if now - self._last_beat >= self.heartbeat_s:
                self._last_beat = now
                self._plain(self.heartbeat_text())

    def start(self) -> None:
        if self.is_live:
            self._live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4,
                              transient=True, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        else:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="vh-heartbeat")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._live is not None:
            try:
                self._live.stop()
            except Exception:  # noqa: BLE001 - a broken terminal must not stop the teardown's report
                pass
            self._live = None
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
