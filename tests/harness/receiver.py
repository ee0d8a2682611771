"""A notification receiver on loopback, in a thread: it records every body it gets and answers by its path.

`/ok/...` answers 200; `/fail/...` answers 500; `/stall/...` reads the body, records it, then holds the connection
without answering for `stall_s` (or until the receiver stops). What each request carried (path, headers, body,
when) is in `got`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Got:
    path: str
    headers: dict[str, str]
    body: bytes
    t_unix: float

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, *, stall_s: float = 30.0) -> None:
        self.got: list[Got] = []
        self.stall_s = stall_s
        self._stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                receiver.got.append(Got(self.path, dict(self.headers), body, time.time()))
                if self.path.startswith("/stall"):
                    receiver._stop.wait(receiver.stall_s)
                    return
                status = 500 if self.path.startswith("/fail") else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def bodies(self, prefix: str = "") -> list[Any]:
        return [g.json() for g in self.got if g.path.startswith(prefix)]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
