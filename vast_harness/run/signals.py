"""The run's signal guard: the first SIGINT, SIGTERM or SIGHUP interrupts the run (exit 130 after the usual
teardown); any signal during the teardown only says the teardown is in progress, and hurries it (the evidence
pull is abandoned, the DELETE goes first). Handlers are installed only on the main thread: a fleet's runs
share the fleet's own."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from vast_harness.console.output import Output
from vast_harness.errors import Interrupted

# What signal.signal takes and returns (typeshed's private _HANDLER).
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SignalGuard:
    """First signal interrupts the run; any signal during teardown only says teardown is in progress."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, out: Output, on_signal: Callable[[str], None] = lambda _name: None) -> None:
        self.out = out
        self.on_signal = on_signal  # told of every signal, first thing (the cap guard deletes within a second)
        self.in_teardown = False
        self.received: int | None = None
        self.hurry = False  # a signal during teardown: abandon the evidence pull, go straight to DELETE
        self._previous: dict[signal.Signals, SignalHandler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.on_signal(signal.Signals(signum).name)
        if self.in_teardown or self.received is not None:
            self.hurry = True
            self.out.warn(f"{signal.Signals(signum).name}: teardown is in progress and will finish; it cannot be skipped")
            return
        self.received = signum
        raise Interrupted(signum)

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


__all__ = ["SignalGuard", "SignalHandler"]
