"""The embeddable simulator: a threaded HTTP server on 127.0.0.1 in front of the backend.

    with SimServer(seed=0, boot_seconds=0.0) as sim:
        httpx.get(f"{sim.url}/api/v1/instances/", headers={"Authorization": "Bearer k"})
        assert not [i for i in sim.state()["instances"] if i["live"]]

`start()` returns once the port answers; `stop()` kills every host's processes and closes every port
but destroys nothing, so `state()` afterwards still shows what was left live (a leak stays visible).
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from vast_harness.sim.backend import DEFAULT_LINGER_S, Backend
from vast_harness.sim.faults import FaultPlan
from vast_harness.sim.routes import Request, dispatch

MAX_BODY_BYTES = 8 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients pool connections
    server_version = "vast-sim/1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: avoid 40 ms delayed-ACK stalls
    backend: Backend  # set on the subclass made per server

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.send_error(413)
            return
        body = self.rfile.read(length) if length else b""
        req = Request.build(self.command, self.path, dict(self.headers.items()), body, self.client_address[0])
        response = dispatch(self.backend, req)
        if response.drop_connection:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        payload = response.payload()
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The answer's `Date`: the simulator's clock, moved by a `date_ahead` / `date_behind` fault (the
        control endpoints keep the true time and spend no fault count)."""
        skew_s = 0.0
        if not self.path.startswith("/_sim"):
            faults = self.backend.faults
            ahead = faults.take("date_ahead")
            behind = faults.take("date_behind") if ahead is None else None
            skew_s = (ahead.seconds or 0.0) if ahead else -(behind.seconds or 0.0) if behind else 0.0
        return super().date_time_string((time.time() if timestamp is None else timestamp) + skew_s)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the call log in /_sim/state is the record; stderr noise helps nobody


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    backend: Backend

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Never print (the embedded simulator shares the user's stderr). A client that hung up mid-answer is
        its own business; anything else is a simulator bug, kept in `/_sim/state` `server_errors`."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        self.backend.record_server_error(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")


class SimServer:
    """The simulated Vast marketplace, in-process. Context manager; `url` once started."""

    def __init__(self, seed: int = 0, boot_seconds: float = 0.0, faults: str | list[Any] | FaultPlan | None = None,
                 num_offers: int = 300, rate_scale: float = 1.0, api_keys: list[str] | None = None,
                 credit_usd: float = 100.0, host_root: str | Path | None = None, port: int = 0,
                 linger_seconds: float = DEFAULT_LINGER_S, show_shape: str = "object",
                 card_saved: bool = False, key_reset_s: float | None = None, host_network: bool = False,
                 copy_bytes_per_s: float | None = None) -> None:
        self.backend = Backend(seed=seed, boot_seconds=boot_seconds, faults=faults, num_offers=num_offers,
                               rate_scale=rate_scale, api_keys=api_keys, credit_usd=credit_usd,
                               host_root=host_root, linger_seconds=linger_seconds, show_shape=show_shape,
                               card_saved=card_saved, key_reset_s=key_reset_s, host_network=host_network,
                               copy_bytes_per_s=copy_bytes_per_s)
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("SimServer is not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"backend": self.backend})
        self._httpd = _Server(("127.0.0.1", self._port), handler)
        self._httpd.backend = self.backend
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True, name="vast-sim-http")
        self._thread.start()
        return self  # the socket is bound and listening: connections queue until served

    def state(self) -> dict[str, Any]:
        return self.backend.state()

    def set_faults(self, spec: str | list[Any] | dict[str, Any] | FaultPlan | None) -> FaultPlan:
        return self.backend.set_faults(spec)

    def reset(self) -> None:
        self.backend.reset()

    def outbid(self, instance_id: int) -> bool:
        """Outbid a live bid instance now (`SimBackend.outbid_now`)."""
        return self.backend.outbid_now(instance_id)

    def stop(self) -> None:
        """Close the API port and every host (processes killed); live instances stay live in state()."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.backend.shutdown_hosts()
        self.backend.cleanup_root()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_standalone(args: list[str], *, stderr: Any = subprocess.DEVNULL, start_timeout_s: float = 30.0,
                     env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start `python -m vast_harness.sim --port 0 ARGS...` as its own process (for kill -9 tests and
    benchmarks that must not share the harness's process); returns it and its URL once it listens."""
    cmd = [sys.executable, "-m", "vast_harness.sim", "--port", "0", *args]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=env)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], start_timeout_s)
    line = proc.stdout.readline() if ready else ""
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"the simulator did not start: {line!r}")
    return proc, line.rsplit("listening on ", 1)[1].strip()
