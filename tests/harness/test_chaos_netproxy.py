"""The chaos suite's fault proxy does what its grammar says, over real loopback sockets.

An upstream stands in for the simulator's API (it records what reached it) and a TCP echo server for a host's
SSH port; each rule is checked from the client's side: what it receives, when, and whether the request
reached the upstream.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from vast_harness.chaos.netproxy import HUGE_BYTES, FaultProxy, NetSpecError, endpoint_of


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str]]
    ssh_port: int

    def _reply(self) -> None:
        self.seen.append((self.command, self.path))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.startswith("/api/v0/bundles"):
            doc = {"offers": [{"id": 1, "dph_total": 0.5, "storage_cost": 0.1, "direct_port_count": 4}]}
        else:
            doc = {"instances": {"id": 9, "ssh_port": self.ssh_port, "ssh_host": "127.0.0.1",
                                 "direct_port_start": self.ssh_port, "direct_port_count": 3,
                                 "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(self.ssh_port)}]}}}
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _reply

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):  # resets are what some tests do
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def upstream(echo_port: int) -> Iterator[tuple[str, list[tuple[str, str]], int]]:
    seen: list[tuple[str, str]] = []
    handler = type("H", (_Upstream,), {"seen": seen, "ssh_port": echo_port})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, echo_port
    httpd.shutdown()
    httpd.server_close()


SHOW = "/api/v0/instances/9/"


def _get(proxy: FaultProxy, path: str = SHOW, read_s: float = 5.0) -> httpx.Response:
    return httpx.get(proxy.url + path, timeout=httpx.Timeout(5.0, read=read_s))


def test_requests_pass_through_and_every_ssh_port_points_at_a_forwarding_listener(upstream):
    url, seen, ssh = upstream
    with FaultProxy(url, "") as proxy:
        inst = _get(proxy).json()["instances"]
        proxied = inst["ssh_port"]
        assert proxied != ssh and inst["direct_port_start"] == proxied
        assert inst["ports"]["22/tcp"][0]["HostPort"] == str(proxied) and inst["direct_port_count"] == 3
        with socket.create_connection(("127.0.0.1", proxied), timeout=2) as s:
            s.sendall(b"ping")
            assert s.recv(16) == b"ping"
    assert seen == [("GET", SHOW)]


def test_endpoints_are_named_as_the_simulator_names_them():
    assert endpoint_of("POST", "/api/v0/bundles/") == "search"
    assert endpoint_of("PUT", "/api/v0/asks/12/") == "create"
    assert endpoint_of("DELETE", "/api/v0/instances/3/") == "destroy"
    assert endpoint_of("GET", "/api/v1/instances/?select_filters=%7B%7D") == "list"
    assert endpoint_of("GET", "/nope") == "unknown"
    with pytest.raises(NetSpecError):
        FaultProxy("http://127.0.0.1:1", "stall:nowhere")


def test_stall_never_forwards_lost_forwards_and_neither_answers(upstream):
    url, seen, _ = upstream
    with FaultProxy(url, "stall:show:1;lost:show:1") as proxy:
        with pytest.raises(httpx.ReadTimeout):
            _get(proxy, read_s=0.5)
        assert seen == []
        with pytest.raises(httpx.ReadTimeout):
            _get(proxy, read_s=0.5)
        assert seen == [("GET", SHOW)]
        assert _get(proxy).status_code == 200  # both rules spent
        assert proxy.fired() == {"stall": 1, "lost": 1}


def test_stall_body_sends_headers_then_nothing_and_reset_cuts_the_body(upstream):
    url, _, _ = upstream
    with FaultProxy(url, "stall_body:show:1;reset:show:1") as proxy:
        with httpx.Client(timeout=httpx.Timeout(5.0, read=0.5)) as client, \
                client.stream("GET", proxy.url + SHOW) as resp:
            assert resp.status_code == 200
            with pytest.raises(httpx.ReadTimeout):
                resp.read()
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            _get(proxy)


def test_lag_and_throttle_delay_the_answer(upstream):
    url, _, _ = upstream
    with FaultProxy(url, "lag:search:0.6:1;throttle:show:200:1") as proxy:
        t = time.monotonic()
        assert httpx.post(proxy.url + "/api/v0/bundles/", json={}, timeout=5).status_code == 200
        assert time.monotonic() - t >= 0.6
        t = time.monotonic()
        body = _get(proxy).content
        assert time.monotonic() - t >= 0.8 * len(body) / 200


def test_odd_bodies(upstream):
    url, _, _ = upstream
    spec = "truncate:show:1;html:show:1;empty:show:1;nested:show:1;ctype:show:1;dupkeys:show:1;huge:show:1"
    with FaultProxy(url, spec) as proxy:
        with pytest.raises(ValueError):
            _get(proxy).json()  # truncated
        html = _get(proxy)
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        assert _get(proxy).content == b""
        with pytest.raises(RecursionError):
            json.loads(_get(proxy).content)
        odd = _get(proxy)
        assert odd.headers["content-type"].startswith("text/plain") and odd.json()["instances"]["id"] == 9
        dup = _get(proxy)
        assert dup.text.count('"instances"') == 2 and dup.json() == {"instances": None}
        huge = _get(proxy)
        assert len(huge.content) > HUGE_BYTES and huge.json()["instances"]["id"] == 9


def test_nan_poisons_every_price(upstream):
    url, _, _ = upstream
    with FaultProxy(url, "nan:search:1;seed=3") as proxy:
        offer = httpx.post(proxy.url + "/api/v0/bundles/", json={}, timeout=5).json()["offers"][0]
        assert not math.isfinite(offer["dph_total"]) and not math.isfinite(offer["storage_cost"])
        assert offer["direct_port_count"] == 4


def _ssh_link(proxy: FaultProxy, port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.ssh_port(port)), timeout=1.0)


def test_ssh_stall_drops_bytes_and_keeps_the_connection_open(upstream):
    url, _, ssh = upstream
    with FaultProxy(url, "ssh_stall:down:0.3:1") as proxy, _ssh_link(proxy, ssh) as s:
        s.sendall(b"a")
        assert s.recv(8) == b"a"
        time.sleep(0.4)
        s.sendall(b"b")
        with pytest.raises(TimeoutError):
            s.recv(8)  # the echo never comes back, and the connection is not closed either
        s.sendall(b"c")  # still writable


def test_ssh_reset_and_slow(upstream):
    url, _, ssh = upstream
    with FaultProxy(url, "ssh_reset:0.2:1;ssh_slow:400:1") as proxy:
        with _ssh_link(proxy, ssh) as s:
            time.sleep(0.6)
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                s.sendall(b"x" * 100_000)
                s.recv(8)
        with _ssh_link(proxy, ssh) as s:
            s.settimeout(5)
            t = time.monotonic()
            s.sendall(b"y" * 200)
            got = b""
            while len(got) < 200:
                got += s.recv(256)
            assert time.monotonic() - t >= 0.45  # 200 bytes at 400 B/s (both ways, pipelined)
