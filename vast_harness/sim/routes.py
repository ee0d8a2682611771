"""HTTP routes: parse a request, authenticate, apply faults and rate limits, call the backend.

`ROUTES` is the table (method, path regex, endpoint name, handler). Every API call goes through
`dispatch` in this order: route -> auth -> faults (hang, 429, 5xx) -> rate limit -> handler -> call log.
The `/_sim/` control plane (state, faults, reset) has no auth, limits or faults and is not logged.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from vast_harness.sim import errors
from vast_harness.sim.backend import Backend, Identity
from vast_harness.sim.errors import JSON_TYPE, SimHTTPError
from vast_harness.sim.faults import FaultSpecError


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    client_ip: str = "127.0.0.1"
    match: re.Match[str] | None = None

    @classmethod
    def build(cls, method: str, target: str, headers: dict[str, str], body: bytes, client_ip: str) -> Request:
        parts = urlsplit(target)
        return cls(method, parts.path, dict(parse_qsl(parts.query, keep_blank_values=True)),
                   {k.lower(): v for k, v in headers.items()}, body, client_ip)

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise errors.invalid_json() from None

    def json_object(self) -> dict[str, Any]:
        body = self.json()
        if not isinstance(body, dict):
            raise errors.invalid_json()
        return body

    def int_arg(self, name: str) -> int:
        assert self.match is not None
        return int(self.match.group(name))


@dataclass
class Response:
    status: int
    body: Any
    content_type: str = JSON_TYPE
    drop_connection: bool = False  # close the socket without answering (create_timeout)
    headers: dict[str, str] = field(default_factory=dict)

    def payload(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else json.dumps(self.body).encode()


Handler = Callable[[Backend, Request, Identity], Response]


def _search(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, {"offers": backend.search(req.json_object())})


def _create(backend: Backend, req: Request, ident: Identity) -> Response:
    status, body = backend.create(_account(ident), req.int_arg("id"), req.json_object())
    timeout = backend.faults.take("create_timeout")
    if timeout is not None:
        time.sleep(timeout.seconds or 0.0)  # created, then the answer never comes
        return Response(status, body, drop_connection=True)
    return Response(status, body)


def _show(backend: Backend, req: Request, ident: Identity) -> Response:
    """The per-id read, in the simulator's shape (`show_shape`) or a fault's: Vast's own QA tool reads
    `{"instances": [{...}]}` without ports (base-image test_template.py); the docs and dstack an object with ports.
    A not-found read is `{"instances": null}` in both (vast-cli PR 405; the QA tool's docstring)."""
    row = backend.show(ident, req.int_arg("id"))
    if row is None:
        return Response(200, {"instances": None})
    as_list = backend.faults.take("show_list") is not None or backend.show_shape == "list"
    if backend.show_shape == "list" or backend.faults.take("show_no_ports") is not None:
        row.pop("ports", None)
    return Response(200, {"instances": [row] if as_list else row})


def _list(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.list(_account(ident), req.query))


def _legacy_list(backend: Backend, req: Request, ident: Identity) -> Response:
    raise errors.legacy_list_gone()


def _destroy(backend: Backend, req: Request, ident: Identity) -> Response:
    backend.destroy(ident, req.int_arg("id"))
    return Response(200, {"success": True})


def _user(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.user(_account(ident)))


def _ssh_key_text(req: Request) -> str:
    key = req.json_object().get("ssh_key")
    if not isinstance(key, str) or not key.strip():
        raise errors.vast_error(400, "no_ssh_key", "No ssh key provided")
    key = key.replace("\0", "")
    parts = key.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise errors.vast_error(400, "no_ssh_key", "Invalid ssh key: expected 'TYPE BASE64 [comment]'")
    return key.strip()


def _ssh_list(backend: Backend, req: Request, ident: Identity) -> Response:
    keys = _account(ident).ssh_keys
    return Response(200, [{k: e[k] for k in ("id", "user_id", "key", "created_at", "deleted_at")} for e in keys])


def _ssh_add(backend: Backend, req: Request, ident: Identity) -> Response:
    entry = backend.add_account_key(_account(ident), _ssh_key_text(req))
    key = {k: entry[k] for k in ("id", "user_id", "public_key", "created_at", "deleted_at")}
    return Response(200, {"success": True, "key": key})


def _instance_ssh_add(backend: Backend, req: Request, ident: Identity) -> Response:
    backend.add_instance_key(_account(ident), req.int_arg("id"), _ssh_key_text(req))
    return Response(200, {"success": True, "msg": "SSH key attached successfully"})


def _instance_ssh_list(backend: Backend, req: Request, ident: Identity) -> Response:
    keys = backend.instance_keys(_account(ident), req.int_arg("id"))
    return Response(200, {"success": True, "ssh_keys": json.dumps(keys)})


def _pending_increases(backend: Backend, req: Request, ident: Identity) -> Response:
    rows = backend.pending_increases(_account(ident))
    return Response(200, {"success": True, "count": len(rows), "truncated": False, "pending_price_increases": rows})


def _accept_increase(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.answer_increase(_account(ident), req.json_object(), accept=True))


def _reject_increase(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.answer_increase(_account(ident), req.json_object(), accept=False))


def _manage(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.manage(_account(ident), req.int_arg("id"), req.json_object()))


def _copy(backend: Backend, req: Request, ident: Identity) -> Response:
    return Response(200, backend.copy(_account(ident), req.json_object()))


def _account(ident: Identity) -> Any:
    if ident.account is None:  # anonymous or a container key on an account endpoint
        raise errors.auth_error() if ident.container_of is None else errors.not_allowed(
            "An instance key may only show or destroy its own instance")
    return ident.account


_ID = r"(?P<id>\d+)"
_V0_INSTANCE_PATH = re.compile(r"/api/v0/instances/\d+(/.*)?")  # the per-id v0 family (fault v0_deprecated)
# (method, path regex, endpoint name for faults and limits, handler, who may call it)
ROUTES: list[tuple[str, re.Pattern[str], str, Handler, str]] = [
    ("POST", re.compile(r"/api/v0/bundles/?"), "search", _search, "anyone"),
    ("PUT", re.compile(rf"/api/v0/asks/{_ID}/?"), "create", _create, "account"),
    ("GET", re.compile(rf"/api/v0/instances/{_ID}/?"), "show", _show, "container"),
    ("DELETE", re.compile(rf"/api/v0/instances/{_ID}/?"), "destroy", _destroy, "container"),
    # stop or start (manage_instance.yaml: `vastai stop|start instance`); the canary stops its own bid instance
    ("PUT", re.compile(rf"/api/v0/instances/{_ID}/?"), "manage", _manage, "account"),
    ("GET", re.compile(r"/api/v0/instances/?"), "list", _legacy_list, "account"),
    ("GET", re.compile(r"/api/v1/instances/?"), "list", _list, "account"),
    ("GET", re.compile(r"/api/v0/users/current/?"), "user", _user, "account"),
    ("GET", re.compile(r"/api/v0/ssh/?"), "ssh", _ssh_list, "account"),
    ("POST", re.compile(r"/api/v0/ssh/?"), "ssh", _ssh_add, "account"),
    ("POST", re.compile(rf"/api/v0/instances/{_ID}/ssh/?"), "ssh", _instance_ssh_add, "account"),
    ("GET", re.compile(rf"/api/v0/instances/{_ID}/ssh/?"), "ssh", _instance_ssh_list, "account"),
    # a host's raise on a running contract, and the renter's answer (vast-cli vastai/api/price_increase.py)
    ("GET", re.compile(r"/api/v0/instances/pending-price-increases/?"), "price_increase", _pending_increases,
     "account"),
    ("PUT", re.compile(r"/api/v0/instances/accept-price-increase/?"), "price_increase", _accept_increase, "account"),
    ("PUT", re.compile(r"/api/v0/instances/reject-price-increase/?"), "price_increase", _reject_increase, "account"),
    # a copy with one side local (vast-cli `vastai/api/storage.py::copy`): sim/copyd.py serves the transfer
    ("PUT", re.compile(r"/api/v0/commands/rsync/?"), "copy", _copy, "account"),
]


def _limit_name(endpoint: str, method: str) -> str:
    return "ssh_key_post" if endpoint == "ssh" and method == "POST" else endpoint


def _authenticate(backend: Backend, req: Request, endpoint: str, who: str) -> tuple[Identity, bool]:
    """The caller, and whether the key came in the URL (legacy, flagged in the call log)."""
    header = req.headers.get("authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else ""
    in_url = "api_key" in req.query
    if not key and in_url:
        key = req.query["api_key"]
    ident = backend.identify(key, req.client_ip)
    if ident is None:  # an unknown key; search documents 404 "Invalid user key" for it
        raise errors.auth_error(404 if endpoint == "search" else 401)
    if ident.account is None and ident.container_of is None and who != "anyone":
        raise errors.auth_error()
    if ident.container_of is not None and who != "container":
        raise errors.not_allowed("An instance key may only show or destroy its own instance")
    return ident, in_url


def _inject(backend: Backend, endpoint: str, method: str) -> None:
    """Apply the request-level faults of the current plan to this call."""
    plan = backend.faults
    hang = plan.take("hang", endpoint)
    if hang is not None:
        time.sleep(hang.seconds or 0.0)
    if plan.take("429", endpoint) is not None:
        raise errors.rate_limited(endpoint, backend.limiter.threshold_s(_limit_name(endpoint, method)))
    rule = plan.take("5xx", endpoint) or (plan.take("delete_fail", "destroy") if endpoint == "destroy" else None)
    if rule is not None:
        status = plan.draw_status(rule)
        if status == 429:
            raise errors.rate_limited(endpoint, backend.limiter.threshold_s("destroy"))
        raise errors.gateway_error(status)


def dispatch(backend: Backend, req: Request) -> Response:
    if req.path.startswith("/_sim/"):
        return control(backend, req)
    endpoint, in_url, status = "unknown", "api_key" in req.query, 500
    try:
        for method, pattern, endpoint, handler, who in ROUTES:
            req.match = pattern.fullmatch(req.path)
            if req.match and req.method == method:
                break
        else:
            endpoint = "unknown"
            raise errors.unknown_route(req.method, req.path)
        ident, in_url = _authenticate(backend, req, endpoint, who)
        if _V0_INSTANCE_PATH.match(req.path) and backend.faults.take("v0_deprecated"):
            raise errors.deprecated_endpoint("/api/v0/instances/")
        _inject(backend, endpoint, req.method)
        limit = _limit_name(endpoint, req.method)
        if not backend.limiter.allow(limit, ident.rate_key, time.monotonic()):
            raise errors.rate_limited(endpoint, backend.limiter.threshold_s(limit))
        response = handler(backend, req, ident)
    except SimHTTPError as exc:
        response = Response(exc.status, exc.body, exc.content_type)
    status = response.status
    backend.log_call(req.method, req.path, status, endpoint, in_url)
    return response


def control(backend: Backend, req: Request) -> Response:
    """The /_sim/ control plane: GET state, PUT/GET faults, POST reset, POST outbid/<id>."""
    if req.path.rstrip("/") == "/_sim/state" and req.method == "GET":
        return Response(200, backend.state())
    if req.path.rstrip("/") == "/_sim/faults" and req.method == "GET":
        return Response(200, backend.faults.to_json())
    if req.path.rstrip("/") == "/_sim/faults" and req.method == "PUT":
        try:
            spec = json.loads(req.body or b"null")
            return Response(200, backend.set_faults(spec).to_json())
        except (json.JSONDecodeError, FaultSpecError) as exc:
            return Response(400, {"success": False, "error": "invalid_faults", "msg": str(exc)})
    if req.path.rstrip("/") == "/_sim/reset" and req.method == "POST":
        backend.reset()
        return Response(200, {"success": True})
    if req.path.startswith("/_sim/outbid/") and req.method == "POST":  # a bid instance outbid now (a test's moment)
        try:
            instance_id = int(req.path.rstrip("/").rsplit("/", 1)[1])
        except ValueError:
            return Response(400, {"success": False, "error": "invalid_id", "msg": req.path})
        return Response(200, {"success": backend.outbid_now(instance_id)})
    return Response(404, {"success": False, "error": "not_found", "msg": f"no control route {req.path}"})
