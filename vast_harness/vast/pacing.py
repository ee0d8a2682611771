"""Request pacing: per-endpoint rate rules from Vast's OpenAPI thresholds, so a normal run never draws a 429.

Vast sends no Retry-After and enforces limits per endpoint and identity as minimum intervals (search: 10 per
minute). The client holds `Pacer.slot` around every request: `acquire` before it, `release` after it, and, once
`serialize` was called (a client several threads share: a fleet's runs), the endpoint's own lock, so that one
request per endpoint is in flight at a time.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vast_harness.vast.endpoints import ENDPOINT_PATHS

_ID_SEGMENT = re.compile(r"/\d+(?=/|$)")


@dataclass(frozen=True)
class RateRule:
    """At most `calls` requests per `per_s` seconds; a minimum interval is the case `calls == 1`."""

    calls: int
    per_s: float

    @classmethod
    def interval(cls, seconds: float) -> RateRule:
        return cls(calls=1, per_s=seconds)


# Keyed by "METHOD /path/with/{id}/". Thresholds from the per-endpoint OpenAPI `x-rate-limit`
# (docs/vast-behaviours.md); endpoints without a documented one get the cautious default.
RATE_RULES: dict[str, RateRule] = {
    f"POST {ENDPOINT_PATHS['search_offers']}": RateRule(calls=10, per_s=60.0),
    f"PUT {ENDPOINT_PATHS['create_instance']}": RateRule.interval(4.5),
    f"GET {ENDPOINT_PATHS['get_instance']}": RateRule.interval(2.0),
    f"DELETE {ENDPOINT_PATHS['destroy_instance']}": RateRule.interval(3.0),
    f"GET {ENDPOINT_PATHS['list_instances']}": RateRule.interval(1.0),
    f"PUT {ENDPOINT_PATHS['copy_to_local']}": RateRule.interval(3.5),  # copy.yaml's threshold (vast-api.md)
}
DEFAULT_RATE_RULE = RateRule.interval(1.0)


def endpoint_key(method: str, path: str) -> str:
    """`GET /api/v0/instances/42/` -> `GET /api/v0/instances/{id}/`: the unit of pacing and stats."""
    return f"{method.upper()} {_ID_SEGMENT.sub('/{id}', path)}"


class Pacer:
    """Per-client, thread-safe request pacing so a normal run never draws a 429.

    Slots are reserved under a lock and slept outside it, so the watchdog thread and the main thread
    queue up instead of racing. A slot's time is moved to the request's *completion*: the server sees
    the previous request arrive no later than that, so the gap it measures is at least the interval.
    Each operation keeps its own history (method and path): Vast's OpenAPI gives each its own
    `x-rate-limit` (the per-id read 2 s, its DELETE 3 s), and its docs call some limits method-specific. An
    earlier reading shared one history for GET and DELETE of an instance (unconfirmed either way); it made
    every DELETE wait up to 3 s behind the run's own last read, with the cap already broken (red team r10: 3-6 s
    at 500x). Should Vast share them after all, such a DELETE draws a 429 and is retried.

    Moving a slot to the completion helps only when requests to one endpoint do not overlap: two threads'
    creates are reserved 4.5 s apart from each other's start, and if the first reaches the server late they
    arrive closer than 4.5 s (a 429). A client shared by threads that each run a lifecycle (a fleet) is
    therefore `serialized`: `slot` takes the endpoint's lock before it reserves, so each slot is reserved after
    the previous request to that endpoint completed. Off by default: one run's threads (the price watch, the
    main thread) rarely meet on an endpoint, and a request stalled up to its answer bound must not hold them.
    """

    def __init__(self, *, scale: float, clock: Callable[[], float], sleep: Callable[[float], None],
                 serialized: bool = False):
        self._scale = scale
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._history: dict[str, list[float]] = {}
        self._serialized = serialized
        self._in_flight: dict[str, threading.Lock] = {}  # per endpoint (path key), when serialized

    @property
    def serialized(self) -> bool:
        return self._serialized

    def serialize(self) -> None:
        """From now on one request per endpoint in flight at a time. Call it before the threads share the
        pacer: a request already in flight is not waited for."""
        with self._lock:
            self._serialized = True

    @contextlib.contextmanager
    def slot(self, method: str, path: str) -> Iterator[None]:
        """Around one request: its paced slot and, when serialized, the endpoint to itself until it completes."""
        gate: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if self._serialized:
            key = endpoint_key(method, path)  # the history's key: one per operation
            with self._lock:
                gate = self._in_flight.setdefault(key, threading.Lock())
        with gate:  # taken before the slot is reserved, so the slot is spaced from the previous completion
            token = self.acquire(method, path)
            try:
                yield
            finally:
                self.release(token)

    def acquire(self, method: str, path: str) -> tuple[str, float]:
        """Block until this request may start; returns a token for `release`."""
        key = endpoint_key(method, path)
        rule = RATE_RULES.get(key, DEFAULT_RATE_RULE)
        with self._lock:
            now = self._clock()
            hist = self._history.setdefault(key, [])
            slot = now
            if self._scale > 0 and len(hist) >= rule.calls:
                slot = max(now, hist[-rule.calls] + rule.per_s * self._scale)
            hist.append(slot)
            del hist[:-64]  # the longest rule counts 10 calls; keep a bounded tail
        if slot > now:
            self._sleep(slot - now)
        return key, slot

    def release(self, token: tuple[str, float]) -> None:
        key, slot = token
        with self._lock:
            hist = self._history.get(key, [])
            for i in range(len(hist) - 1, -1, -1):
                if hist[i] == slot:
                    hist[i] = max(slot, self._clock())
                    break
            hist.sort()
