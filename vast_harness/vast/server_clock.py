"""The API server's clock, as the harness knows it: the `Date` header of its answers, carried forward on the
monotonic clock.

Inside one process every deadline and window runs on `now_s()` (docs/invariants.md, "One clock"):
the wall clock is recorded, never compared, because NTP can step it by hours. Another process that must judge
an age (a reap deciding a create is old enough to trust null reads, a second machine deciding a run's cap
deadline has passed) has no shared monotonic clock, so it uses the server's: every answer's `Date` header
(RFC 9110: the origin's clock, second resolution) is mapped to the local monotonic clock at its arrival, and
"server now" is that date plus the monotonic time since. A client that never saw a `Date` header knows no
server time (`None`): callers fall back to the wall clock and say so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

from vast_harness.clock import now_s

# A Date header is truncated to the second: the server's clock at arrival lies in [date, date + 1).
DATE_RESOLUTION_S = 1.0


def parse_http_date(value: str | None) -> float | None:
    """Epoch seconds of an HTTP `Date` header, or None when absent or unreadable."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:  # RFC 9110 dates are GMT; an odd one without a zone is not trusted
        return None
    return parsed.timestamp()


class ServerClock:
    """Thread-safe. `observe` each answer's `Date`; `now()` is the server's epoch seconds, or None."""

    def __init__(self, mono: Callable[[], float] = now_s) -> None:
        self._mono = mono
        self._lock = threading.Lock()
        self._anchor: tuple[float, float] | None = None  # (server epoch at arrival, local monotonic then)

    def observe(self, date_header: str | None) -> None:
        server = parse_http_date(date_header)
        if server is None:
            return
        with self._lock:
            self._anchor = (server, self._mono())  # the latest answer wins: its date is the freshest

    def now(self) -> float | None:
        with self._lock:
            anchor = self._anchor
        if anchor is None:
            return None
        server, at = anchor
        return server + (self._mono() - at)

    def to_server(self, mono_t: float) -> float | None:
        """A local monotonic instant on the server's clock (a deadline, a create), or None."""
        now = self.now()
        return None if now is None else now + (mono_t - self._mono())

    def now_or_wall(self) -> tuple[float, str]:
        """The server's now when known, else the wall clock; and which one it is (for messages)."""
        now = self.now()
        return (now, "server") if now is not None else (time.time(), "local wall clock")
