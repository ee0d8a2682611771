"""A test-only TCP proxy on 127.0.0.1 that can stall (keep the connection open, move no bytes) or throttle.

The simulator's fault grammar cannot express a link that is open but silent: this sits between the harness
and a simulated host's SSH port and does exactly that, in both directions, on demand.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

_CHUNK = 16384


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stalled = threading.Event()
        self.bytes_per_s: float | None = None
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept_loop, daemon=True, name="tcp-proxy").start()

    def stall(self) -> None:
        """From now on no byte moves either way; the TCP connections stay open."""
        self._stalled.set()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self._closed:
            if self._stalled.is_set():
                time.sleep(0.05)  # read nothing: the sender's buffers fill and it blocks, as on a dead link
                continue
            ready, _, _ = select.select([src], [], [], 0.05)
            if not ready:
                continue
            try:
                data = src.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            if self.bytes_per_s:
                time.sleep(len(data) / self.bytes_per_s)
            while self._stalled.is_set() and not self._closed:
                time.sleep(0.05)  # the chunk in hand waits too
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
