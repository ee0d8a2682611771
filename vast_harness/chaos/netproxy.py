"""A seeded fault proxy on 127.0.0.1 in front of the simulator: what the simulator's own grammar cannot say.

`HttpFaultProxy` speaks HTTP/1.1 to the harness and forwards each request to the simulator's API; a rule may
stall it, lag it, trickle it, reset it mid-body or replace its body with an odd one. Instance bodies are
rewritten so every SSH port they advertise points at a `TcpFaultProxy` listener, which forwards to the host's
real port and may stall (bytes dropped, TCP kept open), trickle or reset the link. The simulator is unchanged
and unaware; the judge reads its record directly, never through the proxy.

SPEC grammar (items joined by ";", "seed=N" seeds the draws, COUNT is an int or "*", default 1;
"@PROB" fires with that probability per matching event and makes the rule permanent unless a COUNT is given):

    stall:EP[:COUNT]                 the request is accepted, never forwarded, never answered (TCP stays open)
    lost:EP[:COUNT]                  forwarded (its effect happens), never answered
    stall_body:EP[:COUNT]            forwarded; the status, headers and half the body come, then nothing
    lag:EP:SECONDS[:COUNT]           forwarded; the answer waits SECONDS
    throttle:EP:BYTES_PER_S[:COUNT]  the answer trickles at BYTES_PER_S
    reset:EP[:COUNT]                 headers and part of the body, then a TCP reset
    truncate:EP[:COUNT]              the body cut in half (Content-Length says the cut length)
    html:EP[:COUNT]                  200 with an HTML error page (text/html)
    empty:EP[:COUNT]                 200 with an empty body
    nested:EP[:COUNT]                200 with JSON nested 100,000 deep (RecursionError bait)
    huge:EP[:COUNT]                  the real answer inside a 20 MB JSON object
    ctype:EP[:COUNT]                 the real answer labelled text/plain
    nan:EP[:COUNT]                   every price in the answer NaN, Infinity or -Infinity (offers on search)
    dupkeys:EP[:COUNT]               every top-level key repeated last with an empty value (null, [], 0)
    ssh_stall:DIR:AFTER_S[:COUNT]    AFTER_S into an SSH connection, bytes going DIR (up: to the host, down,
                                     both) are dropped; the TCP connection stays open
    ssh_slow:BYTES_PER_S[:COUNT]     SSH connections trickle both ways
    ssh_reset:AFTER_S[:COUNT]        AFTER_S into an SSH connection, both sides get a TCP reset

    EP := search | create | show | list | destroy | user | ssh | any     (the simulator's endpoint names)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import random
import select
import socket
import struct
import threading
import time
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from vast_harness.clock import now_s
from vast_harness.sim.routes import ROUTES

API_KINDS = ("stall", "lost", "stall_body", "lag", "throttle", "reset", "truncate", "html", "empty", "nested",
             "huge", "ctype", "nan", "dupkeys")
SSH_KINDS = ("ssh_stall", "ssh_slow", "ssh_reset")
_ARGS: dict[str, tuple[str, ...]] = {"lag": ("seconds",), "throttle": ("bytes_per_s",), "ssh_stall": ("seconds",),
                                     "ssh_slow": (), "ssh_reset": ("seconds",)}
_TARGETS = {"ssh_stall": ("up", "down", "both")}
HUGE_BYTES = 20 * 1024 * 1024
NEST_DEPTH = 100_000
UPSTREAM_TIMEOUT_S = 120.0  # longer than any simulator hang: the proxy never times out before the client
SSH_PORT_KEYS = ("ssh_port", "machine_dir_ssh_port", "direct_port_start", "direct_port_end")
PRICE_KEYS = ("dph_total", "dph_base", "storage_cost", "inet_up_cost", "inet_down_cost", "min_bid",
              "dph_total_adj", "storage_total_cost", "search", "instance")
_POLL_S = 0.2


class NetSpecError(ValueError):
    pass


class NetRule(BaseModel):
    kind: str
    target: str | None = None  # an endpoint for API kinds, a direction for ssh_stall
    count: int | None = 1
    prob: float | None = Field(default=None, gt=0.0, le=1.0)
    seconds: float | None = None
    bytes_per_s: int | None = None
    fired: int = 0


def _parse_item(item: str) -> NetRule:
    body, _, prob = item.partition("@")
    kind, *args = [p.strip() for p in body.split(":")]
    if kind not in API_KINDS + SSH_KINDS:
        raise NetSpecError(f"net fault {item!r}: unknown kind {kind!r}")
    fields: dict[str, Any] = {"kind": kind}
    if kind in API_KINDS or kind in _TARGETS:
        if not args:
            raise NetSpecError(f"net fault {item!r}: needs a target")
        fields["target"], args = args[0], args[1:]
        allowed = _TARGETS.get(kind, tuple({r[2] for r in ROUTES}) + ("any",))
        if fields["target"] not in allowed:
            raise NetSpecError(f"net fault {item!r}: target must be one of {', '.join(sorted(allowed))}")
    else:
        fields["target"] = "ssh"
    names = _ARGS.get(kind, ()) + ("count",)
    if kind == "ssh_slow":
        names = ("bytes_per_s", "count")
    if len(args) > len(names) or len(args) < len(names) - 1:
        raise NetSpecError(f"net fault {item!r}: expected {':'.join(names)} (the count may be left out)")
    for name, value in zip(names, args, strict=False):
        fields[name] = None if value == "*" else (float(value) if name == "seconds" else int(value))
    if prob:
        fields["prob"] = float(prob)
        fields.setdefault("count", None)
    return NetRule(**fields)


class NetFaultPlan:
    """Thread-safe rules with their own seeded RNG (which rule fires, and how odd bodies are drawn)."""

    def __init__(self, spec: str = "") -> None:
        self.rules: list[NetRule] = []
        seed = 0
        for item in (p.strip() for p in spec.split(";")):
            if item.startswith("seed="):
                seed = int(item[5:])
            elif item:
                self.rules.append(_parse_item(item))
        self.rng = random.Random(seed)
        self._lock = threading.Lock()

    def take(self, kinds: tuple[str, ...], target: str) -> NetRule | None:
        with self._lock:
            for rule in self.rules:
                if rule.kind not in kinds or (rule.count is not None and rule.fired >= rule.count):
                    continue
                if rule.kind in API_KINDS and rule.target not in (target, "any"):
                    continue
                if rule.prob is not None and self.rng.random() >= rule.prob:
                    continue
                rule.fired += 1
                return rule.model_copy()
        return None

    def fired(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for rule in self.rules:
                out[rule.kind] = out.get(rule.kind, 0) + rule.fired
            return out


def endpoint_of(method: str, path: str) -> str:
    """The simulator's name for a request (its fault and rate-limit endpoint), 'unknown' if none."""
    bare = path.split("?", 1)[0]
    for route_method, pattern, endpoint, _handler, _who in ROUTES:
        if route_method == method and pattern.fullmatch(bare):
            return endpoint
    return "unknown"


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Listener:
    """A loopback listening socket whose accepted connections each get `handle` in a daemon thread."""

    def __init__(self, name: str, handle: Any, stop: threading.Event, conns: set[socket.socket]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self._handle, self._stop, self._conns = handle, stop, conns
        threading.Thread(target=self._loop, daemon=True, name=name).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], _POLL_S)
                if not ready:
                    continue
                conn, _ = self.sock.accept()
            except (OSError, ValueError):
                return
            self._conns.add(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except OSError:
            pass
        finally:
            self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()


class FaultProxy:
    """Both proxies for one simulator: `url` is what the harness is given as its API URL."""

    def __init__(self, upstream_url: str, spec: str = "") -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.plan = NetFaultPlan(spec)
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._ssh: dict[int, _Listener] = {}  # upstream port -> its listener
        self._api = _Listener("netproxy-api", self._serve_http, self._stop, self._conns)
        self.url = f"http://127.0.0.1:{self._api.port}"
        self.requests = 0

    # ------------------------------------------------------------------------------------------ ssh
    def ssh_port(self, upstream_port: int) -> int:
        with self._lock:
            if upstream_port not in self._ssh:
                self._ssh[upstream_port] = _Listener(f"netproxy-ssh-{upstream_port}",
                                                     lambda c, p=upstream_port: self._pipe(c, p),
                                                     self._stop, self._conns)
            return self._ssh[upstream_port].port

    def _pipe(self, conn: socket.socket, upstream_port: int) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", upstream_port), timeout=5)
        except OSError:
            _reset(conn)
            return
        self._conns.add(up)
        rule = self.plan.take(SSH_KINDS, "ssh")
        started = now_s()
        done = threading.Event()
        other = threading.Thread(target=self._pump, args=(up, conn, "down", rule, started, done), daemon=True)
        other.start()
        self._pump(conn, up, "up", rule, started, done)
        other.join()
        self._conns.discard(up)
        with contextlib.suppress(OSError):
            up.close()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str, rule: NetRule | None,
              started: float, done: threading.Event) -> None:
        bps = rule.bytes_per_s if rule and rule.kind == "ssh_slow" else None
        chunk = max(1, min(65536, (bps or 655360) // 10))
        while not self._stop.is_set() and not done.is_set():
            now = now_s() - started
            if rule and rule.kind == "ssh_reset" and now >= (rule.seconds or 0.0):
                done.set()
                _reset(src)
                _reset(dst)
                return
            try:
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(chunk)
            except (OSError, ValueError):
                break
            if not data:
                break
            now = now_s() - started  # when the bytes arrived, not when the wait began
            stalled = (rule is not None and rule.kind == "ssh_stall" and now >= (rule.seconds or 0.0)
                       and rule.target in (direction, "both"))
            if stalled:
                continue  # dropped: nothing reaches the other side, and the TCP connection stays up
            if bps:
                time.sleep(len(data) / bps)
            try:
                dst.sendall(data)
            except OSError:
                break
        done.set()
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    # ----------------------------------------------------------------------------------------- http
    def _serve_http(self, conn: socket.socket) -> None:
        # Closed here: a file left open keeps the socket's fd alive past conn.close() until the garbage
        # collector takes both, in either order (a ResourceWarning, "unclosed socket", in the chaos suite).
        with conn.makefile("rb") as reader:
            while not self._stop.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                self.requests += 1
                if not self._answer(conn, method, path, headers, body):
                    return
                if headers.get("connection", "").lower() == "close":
                    return

    def _answer(self, conn: socket.socket, method: str, path: str, headers: dict[str, str], body: bytes) -> bool:
        """Forward one request and write its (possibly faulted) answer; False when the connection is done."""
        rule = self.plan.take(API_KINDS, endpoint_of(method, path))
        kind = rule.kind if rule else None
        if kind == "stall":
            self._hold(conn)
            return False
        upstream = self._forward(method, path, headers, body)
        if upstream is None:  # the simulator dropped the connection (its create_timeout): drop ours too
            return False
        status, reason, up_headers, payload = upstream
        ctype = up_headers.get("content-type", "application/json")
        payload = self._rewrite_ports(payload, ctype)
        if kind == "lost":
            self._hold(conn)
            return False
        if kind == "lag":
            time.sleep(rule.seconds or 0.0)  # type: ignore[union-attr]
        if kind in ("truncate", "html", "empty", "nested", "huge", "ctype", "nan", "dupkeys"):
            status, reason, ctype, payload = self._odd_body(kind, status, reason, ctype, payload)
        extra = {k: v for k, v in up_headers.items() if k in ("retry-after",)}
        head = _head(status, reason, ctype, len(payload), extra)
        if kind in ("stall_body", "reset"):
            conn.sendall(head + payload[: len(payload) // 2])
            if kind == "reset":
                _reset(conn)
            else:
                self._hold(conn)
            return False
        if kind == "throttle":
            _trickle(conn, head + payload, rule.bytes_per_s or 1, self._stop)  # type: ignore[union-attr]
            return True
        conn.sendall(head + payload)
        return True

    def _forward(self, method: str, path: str, headers: dict[str, str],
                 body: bytes) -> tuple[int, str, dict[str, str], bytes] | None:
        skip = {"host", "connection", "keep-alive", "accept-encoding", "content-length", "transfer-encoding"}
        fwd = {k: v for k, v in headers.items() if k not in skip}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            upstream.request(method, path, body=body or None, headers=fwd)
            resp = upstream.getresponse()
            payload = resp.read()
            return resp.status, resp.reason, {k.lower(): v for k, v in resp.getheaders()}, payload
        except (OSError, http.client.HTTPException):
            return None
        finally:
            upstream.close()

    def _hold(self, conn: socket.socket) -> None:
        """Keep the connection open and silent until the client gives up (or the proxy stops)."""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([conn], [], [], _POLL_S)
                if ready and not conn.recv(65536):
                    return
            except (OSError, ValueError):
                return

    def _rewrite_ports(self, payload: bytes, ctype: str) -> bytes:
        """Every SSH port an instance advertises becomes this proxy's listener for it."""
        if "json" not in ctype or b"ssh_port" not in payload and b"22/tcp" not in payload:
            return payload
        try:
            doc = json.loads(payload)
        except ValueError:
            return payload
        changed = False

        def walk(node: Any) -> None:
            nonlocal changed
            if isinstance(node, list):
                for item in node:
                    walk(item)
            elif isinstance(node, dict):
                for key in SSH_PORT_KEYS:
                    if isinstance(node.get(key), int) and node[key] > 0:
                        node[key], changed = self.ssh_port(node[key]), True
                ports = node.get("ports")
                for binding in (ports.get("22/tcp") or [] if isinstance(ports, dict) else []):
                    if isinstance(binding, dict) and str(binding.get("HostPort", "")).isdigit():
                        binding["HostPort"], changed = str(self.ssh_port(int(binding["HostPort"]))), True
                for value in node.values():
                    if isinstance(value, (dict, list)):
                        walk(value)

        walk(doc)
        return json.dumps(doc).encode() if changed else payload

    def _odd_body(self, kind: str, status: int, reason: str, ctype: str,
                  payload: bytes) -> tuple[int, str, str, bytes]:
        rng = self.plan.rng
        match kind:
            case "truncate":
                return status, reason, ctype, payload[: max(1, len(payload) // 2)]
            case "html":
                page = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><center><h1>" \
                       b"502 Bad Gateway</h1></center><hr><center>cloudflare</center></body></html>"
                return 200, "OK", "text/html; charset=UTF-8", page
            case "empty":
                return 200, "OK", ctype, b""
            case "nested":
                return 200, "OK", "application/json", b"[" * NEST_DEPTH + b"]" * NEST_DEPTH
            case "ctype":
                return status, reason, "text/plain; charset=utf-8", payload
        try:
            doc = json.loads(payload)
        except ValueError:
            return status, reason, ctype, payload
        if kind == "huge":
            pad = "x" * HUGE_BYTES
            body = json.dumps({"padding": pad, **doc} if isinstance(doc, dict) else {"padding": pad, "data": doc})
            return status, reason, ctype, body.encode()
        if kind == "nan":
            return status, reason, ctype, json.dumps(_poison_prices(doc, rng)).encode()
        # dupkeys: the real value first, then the same key again with an empty one (json keeps the last)
        if not isinstance(doc, dict) or not doc:
            return status, reason, ctype, payload
        parts = [json.dumps(k) + ": " + json.dumps(v) for k, v in doc.items()]
        parts += [json.dumps(k) + ": " + json.dumps(_empty_like(v)) for k, v in doc.items()]
        return status, reason, ctype, ("{" + ", ".join(parts) + "}").encode()

    def fired(self) -> dict[str, int]:
        return {k: v for k, v in self.plan.fired().items() if v}

    def close(self) -> None:
        self._stop.set()
        for listener in [self._api, *self._ssh.values()]:
            with contextlib.suppress(OSError):
                listener.sock.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked reading it (close alone does not)
            with contextlib.suppress(OSError):
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _poison_prices(node: Any, rng: random.Random) -> Any:
    if isinstance(node, list):
        return [_poison_prices(i, rng) for i in node]
    if isinstance(node, dict):
        return {k: (rng.choice((math.nan, math.inf, -math.inf)) if k in PRICE_KEYS and isinstance(v, (int, float))
                    else _poison_prices(v, rng)) for k, v in node.items()}
    return node


def _empty_like(value: Any) -> Any:
    if isinstance(value, list):
        return []
    if isinstance(value, dict) or value is None:
        return None
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return 0
    return ""


def _head(status: int, reason: str, ctype: str, length: int, extra: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or 'OK'}", f"Content-Type: {ctype}", f"Content-Length: {length}",
             *(f"{k}: {v}" for k, v in extra.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _trickle(conn: socket.socket, data: bytes, bytes_per_s: int, stop: threading.Event) -> None:
    chunk = max(1, bytes_per_s // 20)
    for at in range(0, len(data), chunk):
        if stop.is_set():
            return
        conn.sendall(data[at:at + chunk])
        time.sleep(chunk / bytes_per_s)


def _read_request(reader: Any) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request (Content-Length framing, as the harness's client sends); None at EOF."""
    try:
        line = reader.readline(65536)
        while line in (b"\r\n", b"\n"):
            line = reader.readline(65536)
        if not line:
            return None
        method, path, _version = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while True:
            h = reader.readline(65536)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length") or 0)
        body = reader.read(length) if length else b""
        return method, path, headers, body
    except (OSError, ValueError):
        return None
