"""Notifications delivered: each event of a run POSTed as one JSON object to every `--notify` URL, from background
threads, so that a receiver that is slow, down or answering errors never delays what the run does (docs/notifications.md).

`Notifier.post` only appends to a bounded per-URL queue: it never blocks, never raises and sends nothing itself.
One daemon thread per URL sends its queue in order, each request with short timeouts and no redirect followed (a
redirect could carry the body elsewhere); a full queue drops the event, and every outcome (delivered, the status a
receiver answered, the error, dropped, still queued when the run ended) is a `Delivery`, recorded, never raised.
`close(wait_s)` gives the queues at most that long once the run is over, after its teardown. The body is the event
with every string masked (masking.py) before it is serialised; the only headers are the content type, the event's
name and the user agent. A URL is shown only as `shown_target` (scheme, host, port): a webhook's path or query is
its token, so the whole URL is also told to the masker as a secret.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlparse

from pydantic import BaseModel

from vast_harness.clock import now_s
from vast_harness.errors import ConfigError
from vast_harness.masking import MASKER
from vast_harness.vast.url import is_loopback_url, shown

if TYPE_CHECKING:  # httpx is imported by the worker thread that sends: a run without --notify never loads it here
    import httpx

    from vast_harness.console.notification import Notification

NOTIFY_CONNECT_S = 2.0  # a receiver that does not accept within this is down
NOTIFY_READ_S = 3.0  # nor one that does not answer within this (per read; a stall is cut here)
NOTIFY_QUEUE_MAX = 32  # events waiting per URL; a run makes a handful, so a full queue is a receiver that stalls
NOTIFY_FLUSH_S = 3.0  # once the run is over, how long its last events may take to leave
MAX_NOTIFY_URLS = 8
MAX_URL_CHARS = 2048
_IDLE_POLL_S = 0.05  # a worker with nothing queued looks again this often (no lock is shared with `post`)
NOTIFY_SECRET_NAME = "a --notify URL"

Outcome = Literal["delivered", "failed", "dropped", "undelivered"]


class Delivery(BaseModel):
    """What became of one event at one URL (the URL as `shown_target` says it)."""

    target: str  # the URL as `shown_target` says it, and its place among the run's URLs: `https://host/… [2]`
    event: str
    sequence: int
    outcome: Outcome  # delivered (2xx) | failed (another status, or no answer) | dropped (queue full) | undelivered
    status: int | None = None
    error: str = ""
    seconds: float = 0.0


def shown_target(url: str) -> str:
    """What may be printed of a notify URL: its scheme, host and port; the path and query (a token) as `/…`."""
    parsed = urlparse(url)
    host = parsed.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    port = f":{parsed.port}" if parsed.port else ""
    rest = "/…" if (parsed.path not in ("", "/") or parsed.query) else ""
    return f"{parsed.scheme}://{host}{port}{rest}"


def notify_url(url: str, source: str = "--notify") -> str:
    """`url` as given when it may receive notifications, else ConfigError naming `source`: printable ASCII, an
    https URL with a host, or plain http to this machine only (an event in clear says what the run rents; a
    loopback receiver is a test or a local relay), no credentials in it, not the account key."""
    if not url or not url.strip():
        raise ConfigError(f"{source} is empty: give the https URL that receives the run's events")
    if len(url) > MAX_URL_CHARS or not url.isascii() or any(not ch.isprintable() or ch.isspace() for ch in url):
        raise ConfigError(f"{source} {shown(url)} must be a printable ASCII URL without spaces, at most "
                          f"{MAX_URL_CHARS} characters")
    try:
        parsed = urlparse(url)
        _ = parsed.port  # raises on a port out of range
    except ValueError as exc:
        raise ConfigError(f"{source} {shown(url)} is not a valid URL ({exc})") from None
    if parsed.scheme not in ("https", "http") or not parsed.hostname:
        raise ConfigError(f"{source} {shown(url)} is not an https URL")
    if parsed.scheme == "http" and not is_loopback_url(url):
        raise ConfigError(f"{source} {shown(url)} is plain http to another machine: events would travel in clear. "
                          "Use https (plain http is accepted only for a receiver on this machine); nothing was rented")
    if parsed.username or parsed.password:
        raise ConfigError(f"{source} {shown_target(url)} carries credentials (user:password@): a receiver's token "
                          "belongs in its path, which is never shown")
    if "the account key" in MASKER.names_in(url):
        raise ConfigError(f"{source} holds the account key: it would reach the receiver")
    return url


def notify_urls(urls: Iterable[str], source: str = "--notify") -> list[str]:
    """Every URL checked (`notify_url`), duplicates dropped, at most MAX_NOTIFY_URLS."""
    checked = list(dict.fromkeys(notify_url(u, source) for u in urls))
    if len(checked) > MAX_NOTIFY_URLS:
        raise ConfigError(f"{source}: {len(checked)} URLs; at most {MAX_NOTIFY_URLS} receive a run's events")
    return checked


def _user_agent() -> str:
    try:
        return f"vast-harness/{metadata.version('vast-harness')}"
    except metadata.PackageNotFoundError:
        return "vast-harness"


class _Target:
    """One URL's queue and the thread that sends it. `shown`: its `shown_target` and its place in the list
    (`[2]`), which tells apart receivers on one host whose paths are not shown."""

    def __init__(self, url: str, number: int) -> None:
        self.url, self.shown = url, f"{shown_target(url)} [{number}]"
        self.queue: collections.deque[tuple[str, int, bytes]] = collections.deque()
        self.busy = False  # a request is out (its event is no longer in the queue)
        self.current: tuple[str, int] | None = None  # the event of that request
        self.thread: threading.Thread | None = None


class Notifier:
    """Sends each posted event to every URL (the module's docstring). With no URLs every call does nothing."""

    def __init__(self, urls: Sequence[str], *, connect_s: float = NOTIFY_CONNECT_S, read_s: float = NOTIFY_READ_S,
                 queue_max: int = NOTIFY_QUEUE_MAX) -> None:
        self._targets = [_Target(u, n) for n, u in enumerate(urls, 1)]
        self._connect_s, self._read_s, self._queue_max = connect_s, read_s, queue_max
        self._deliveries: list[Delivery] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()  # the deliveries list and the threads' start; never held while sending

    @property
    def targets(self) -> list[str]:
        return [t.shown for t in self._targets]

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def post(self, event: Notification) -> None:
        """Queue `event` for every URL; returns at once. Never raises: a notification must not stop a run."""
        if not self._targets or self._closed.is_set():
            return
        try:
            body = json.dumps(MASKER.json_value(event.model_dump(mode="json"))).encode()
        except Exception as exc:  # noqa: BLE001 - a bug in an event must not end the run it describes
            self._record([Delivery(target=t.shown, event=event.event, sequence=event.sequence, outcome="failed",
                                   error=f"not sent: {type(exc).__name__}") for t in self._targets])
            return
        dropped = []
        for target in self._targets:
            if len(target.queue) >= self._queue_max:
                dropped.append(Delivery(target=target.shown, event=event.event, sequence=event.sequence,
                                        outcome="dropped", error=f"{self._queue_max} events were still waiting"))
                continue
            target.queue.append((event.event, event.sequence, body))
            self._start(target)
        if dropped:
            self._record(dropped)

    def not_made(self, event: str, exc: BaseException) -> None:
        """An event the run could not make (a bug in it): recorded for every URL, never raised."""
        self._record([Delivery(target=t.shown, event=event, sequence=0, outcome="failed",
                               error=f"not made: {type(exc).__name__}") for t in self._targets])

    def close(self, wait_s: float = NOTIFY_FLUSH_S) -> list[Delivery]:
        """Wait at most `wait_s` for every queue to empty, then stop: what is left is recorded as undelivered
        (a request still out is left to its daemon thread and its timeouts). Returns every delivery. A signal
        while waiting only ends the wait."""
        end = now_s() + max(0.0, wait_s)
        try:
            while now_s() < end and any(t.queue or t.busy for t in self._targets):
                time.sleep(_IDLE_POLL_S)
        except KeyboardInterrupt:
            pass
        left = []
        with self._lock:  # from here a worker records nothing: what it still has out is said undelivered here
            self._closed.set()
            for target in self._targets:
                if target.busy and target.current is not None:
                    name, sequence = target.current
                    left.append(Delivery(target=target.shown, event=name, sequence=sequence, outcome="undelivered",
                                         error="the receiver had not answered when the run ended"))
        for target in self._targets:
            while target.queue:
                name, sequence, _ = target.queue.popleft()
                left.append(Delivery(target=target.shown, event=name, sequence=sequence, outcome="undelivered",
                                     error=f"still queued {wait_s:g} s after the run ended"))
        self._record(left)
        return self.deliveries

    # ------------------------------------------------------------------------------------------ the workers
    def _record(self, deliveries: Iterable[Delivery]) -> None:
        with self._lock:
            self._deliveries.extend(deliveries)

    def _start(self, target: _Target) -> None:
        if target.thread is not None:
            return
        with self._lock:
            if target.thread is None:
                target.thread = threading.Thread(target=self._send_all, args=(target,), daemon=True,
                                                 name=f"vh-notify {target.shown}")
                target.thread.start()

    def _send_all(self, target: _Target) -> None:
        import httpx

        timeout = httpx.Timeout(connect=self._connect_s, read=self._read_s, write=self._read_s, pool=self._connect_s)
        with httpx.Client(timeout=timeout, follow_redirects=False,
                          headers={"Content-Type": "application/json", "User-Agent": _user_agent()}) as http:
            while not self._closed.is_set():
                try:
                    target.busy = True
                    name, sequence, body = target.queue.popleft()
                except IndexError:
                    target.busy = False
                    time.sleep(_IDLE_POLL_S)
                    continue
                target.current = (name, sequence)
                delivery = self._send(http, target, name, sequence, body)
                with self._lock:  # recorded and marked done at once: `close` sees one or the other
                    if not self._closed.is_set():
                        self._deliveries.append(delivery)
                    target.busy, target.current = False, None

    def _send(self, http: httpx.Client, target: _Target, name: str, sequence: int, body: bytes) -> Delivery:
        import httpx

        start = now_s()
        delivery = Delivery(target=target.shown, event=name, sequence=sequence, outcome="failed")
        try:
            with http.stream("POST", target.url, content=body, headers={"X-Vast-Harness-Event": name}) as answer:
                with contextlib.suppress(httpx.HTTPError):
                    for _ in answer.iter_bytes():  # read and dropped: the connection is then done with
                        if now_s() - start > self._connect_s + self._read_s:
                            break
                ok = 200 <= answer.status_code < 300
                return delivery.model_copy(update={
                    "outcome": "delivered" if ok else "failed", "status": answer.status_code,
                    "error": "" if ok else f"the receiver answered {answer.status_code}",
                    "seconds": round(now_s() - start, 3)})
        except httpx.HTTPError as exc:
            what = "no answer within its timeouts" if isinstance(exc, httpx.TimeoutException) else type(exc).__name__
            return delivery.model_copy(update={"error": what, "seconds": round(now_s() - start, 3)})
        except Exception as exc:  # noqa: BLE001 - a receiver's fault is recorded, never raised
            return delivery.model_copy(update={"error": f"{type(exc).__name__}", "seconds": round(now_s() - start, 3)})


def teach_notify_urls(urls: Iterable[str]) -> None:
    """Every notify URL masked from now on, as a secret: a webhook's URL is its token."""
    for url in urls:
        MASKER.add(url.strip() or None, NOTIFY_SECRET_NAME)
