"""One exchange's whole deadline on the wall clock: an HTTP request of the Vast client (client.py), an SSH
connect (ssh.py).

httpx bounds each socket operation, not the answer: a server that trickles a byte a second never trips it.
paramiko bounds each connect phase (TCP, banner, auth) on its own: a host slow in each holds one attempt for
several times its timeout.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from typing import Any, Self

from vast_harness.clock import now_s

# httpcore trace events whose return value is the stream a request reads from: the TCP connect, then TLS
# (which detaches the TCP socket object, so only the TLS socket can still be cut); proxies emit their own.
STREAM_EVENTS = (".connect_tcp.complete", ".start_tls.complete")


class AnswerBound:
    """One request's whole-answer deadline. httpx has no total timeout, and a read blocked on a trickling
    server returns only when a byte comes: at the deadline a timer shuts this request's socket down, which
    fails the blocked read at once (headers or body alike). The socket comes from httpcore's trace extension
    (see STREAM_EVENTS); the client opens a fresh connection per request, so every request emits those
    events and the socket is never one another request is using."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.deadline = now_s() + total_s  # the real clock: this bound is wall time, not pacing
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._fired = False
        self._done = False
        self._timer = threading.Timer(total_s, self._fire)
        self._timer.name = "vast-answer-bound"
        self._timer.daemon = True

    def __enter__(self) -> Self:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # after this the timer can touch nothing, even if it is already running
            self._done = True
            self._sock = None
        self._timer.cancel()

    @property
    def expired(self) -> bool:
        return self._fired or now_s() >= self.deadline

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpcore's trace callback: keep this request's newest socket; cut it at once if the deadline
        passed while connecting."""
        if not event.endswith(STREAM_EVENTS):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            self.attach(sock)

    def attach(self, sock: socket.socket) -> None:
        """The socket the deadline cuts (at once if it has already passed)."""
        with self._lock:
            if self._done:
                return
            self._sock = sock
            if self._fired:
                self._cut()

    @property
    def fired(self) -> bool:
        """Whether the deadline cut (or would have cut) the socket."""
        return self._fired

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            self._cut()

    def _cut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the peer or by httpcore: nothing left to cut
                pass
