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
import time
from collections.abc import Callable

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
