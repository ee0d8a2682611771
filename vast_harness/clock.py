"""The control plane's one clock for deadlines and bills: seconds that keep counting through a suspend.

`time.monotonic` stops while a laptop sleeps (Linux's CLOCK_MONOTONIC; macOS's mach_absolute_time), but the
rented host, the API and the bill do not: a lid closed 150 s mid-step on a 3-minute cap once let a run report
a quarter of its bill and pass a cap it had already crossed. `now_s` counts the suspend (CLOCK_BOOTTIME on
Linux, CLOCK_MONOTONIC on macOS, which keeps counting in sleep), so on resume every deadline that passed meanwhile
has passed and the meter has accrued what the host billed. Elsewhere it falls back to `time.monotonic`.
Standard library only (a leaf). The simulator keeps its own clock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import ClassVar

Clock = Callable[[], float]  # a clock a caller may inject: now_s, or a test's fake clock
Sleep = Callable[[float], None]

if hasattr(time, "CLOCK_BOOTTIME"):
    _CLOCK: int | None = time.CLOCK_BOOTTIME
elif sys.platform == "darwin":
    _CLOCK = time.CLOCK_MONOTONIC
else:
    _CLOCK = None
SUSPEND_AWARE = _CLOCK is not None


def now_s() -> float:
    """Seconds since an arbitrary point, never going back, counting time spent suspended where the OS can."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """Which boot of this machine `now_s` counts from (Linux: a fresh random id per boot), None where unknown.

    `now_s` is one clock for every process of a boot: a deadline one process wrote in it (a kept host's) is
    read back by the next, whatever the wall clock did meanwhile. After a reboot the reading means nothing,
    and the id says so."""
    if _CLOCK is None or not sys.platform.startswith("linux"):
        return None
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as fh:
            return fh.read(64).strip() or None
    except OSError:
        return None


class FreezeWatch:
    """`with FreezeWatch(clock) as watch:` ... `watch.frozen_s()`: the seconds this process did not run.

    A stopped process (SIGSTOP, a frozen VM) or a suspended machine: every clock goes on meanwhile, as the API and
    the bill do, so a budget that bounds waiting on the API (a teardown's) can be spent without one try. A thread
    that looks every `TICK_S` sees the gap when the process runs again; a gap over `GAP_S` (no scheduler delay
    comes near it) counts, less the tick it would have slept anyway.
    """

    TICK_S: ClassVar[float] = 0.25
    GAP_S: ClassVar[float] = 2.0

    def __init__(self, clock: Clock = now_s) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()
        self._frozen_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="freeze-watch", daemon=True)

    def __enter__(self) -> FreezeWatch:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def frozen_s(self) -> float:
        """The gaps seen so far and the one under way (asked right after a resume, before the thread looked)."""
        with self._lock:
            return self._frozen_s + self._gap(self._clock())

    def _gap(self, now: float) -> float:
        gap = now - self._last
        return gap - self.TICK_S if gap > self.GAP_S else 0.0

    def _watch(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                now = self._clock()
                self._frozen_s += self._gap(now)
                self._last = now
