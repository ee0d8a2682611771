"""Per-endpoint, per-identity rate limits with the thresholds of the OpenAPI files (x-rate-limit).

Most endpoints enforce a minimum interval between accepted calls (`threshold`, seconds); search allows
10 requests per 60 s sliding window. Only accepted calls count, so a client that waits the threshold
after a 429 gets through. `scale` multiplies every interval and window (0 disables limits).
"""

from __future__ import annotations

import threading
from collections import deque

# endpoint -> minimum interval in seconds between accepted calls of one identity.
MIN_INTERVAL_S = {"create": 4.5, "show": 2.0, "list": 1.0, "destroy": 3.0, "ssh_key_post": 1.0, "copy": 3.5}
SEARCH_WINDOW_REQUESTS = 10
SEARCH_WINDOW_S = 60.0


class RateLimiter:
    def __init__(self, scale: float = 1.0) -> None:
        if scale < 0:
            raise ValueError(f"rate scale must be >= 0, got {scale}")
        self.scale = scale
        self._last: dict[tuple[str, str], float] = {}
        self._windows: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def threshold_s(self, endpoint: str) -> float:
        """The documented threshold this endpoint reports in its 429 body (unscaled, as Vast shows it)."""
        return MIN_INTERVAL_S.get(endpoint, 0.0)

    def allow(self, endpoint: str, identity: str, now: float) -> bool:
        """True and counted when the call may proceed; False when it must get a 429."""
        if self.scale == 0:
            return True
        with self._lock:
            if endpoint == "search":
                return self._allow_window(identity, now)
            interval = MIN_INTERVAL_S.get(endpoint)
            if interval is None:
                return True
            last = self._last.get((endpoint, identity))
            if last is not None and now - last < interval * self.scale:
                return False
            self._last[(endpoint, identity)] = now
            return True

    def _allow_window(self, identity: str, now: float) -> bool:
        window = self._windows.setdefault(identity, deque())
        span = SEARCH_WINDOW_S * self.scale
        while window and now - window[0] >= span:
            window.popleft()
        if len(window) >= SEARCH_WINDOW_REQUESTS:
            return False
        window.append(now)
        return True

    def reset(self) -> None:
        with self._lock:
            self._last.clear()
            self._windows.clear()
