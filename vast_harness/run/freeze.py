"""Seconds this process did not run: stopped (SIGSTOP, a frozen VM) or its machine suspended.

Every clock the run reads goes on while the process is stopped, as the API and the bill do, so a budget that
bounds waiting on the API (a teardown's) can be spent without one try. A thread that looks every `TICK_S`
sees the gap when the process runs again; a gap longer than `GAP_S` (no scheduler delay comes near it) counts.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import ClassVar

from vast_harness.clock import Clock, now_s


class FreezeWatch:
    """`with FreezeWatch(clock) as watch:` ... `watch.frozen_s()`: the seconds it saw the process not run."""

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
        """The gaps seen so far, and the one under way (asked right after a resume, before the thread ran)."""
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


__all__ = ["FreezeWatch"]
