"""Vast's error bodies, as the simulator answers them.

Each error knows its wire shape (status, body, content type), moto-style, so a handler raises
`SimHTTPError` and the server renders it. The shapes follow `docs/vast-behaviours.md` and the
OpenAPI files: most errors are `{"success": false, "error": CODE, "msg": TEXT}`; create's and show's
429 is `{"detail": ...}`; search's 429 is plain text; gateway 5xx bodies are HTML, not JSON.
"""

from __future__ import annotations

import json
from typing import Any

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"

_GATEWAY_REASONS = {502: "Bad Gateway", 503: "Service Temporarily Unavailable", 504: "Gateway Time-out"}


class SimHTTPError(Exception):
    """An HTTP error answer: status, body (dict/list rendered as JSON, str sent as is), content type."""

    def __init__(self, status: int, body: Any, content_type: str = JSON_TYPE) -> None:
        super().__init__(f"{status}: {body!r}")
        self.status = status
        self.body = body
        self.content_type = content_type

    def payload(self) -> bytes:
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


def vast_error(status: int, code: str, msg: str, **extra: Any) -> SimHTTPError:
    """The common shape: {"success": false, "error": code, "msg": msg, ...extra}."""
    return SimHTTPError(status, {"success": False, "error": code, "msg": msg, **extra})


def invalid_json() -> SimHTTPError:
    return SimHTTPError(400, {"success": False, "error": "invalid_request", "msg": "Invalid json body"})


def invalid_args(msg: str, **extra: Any) -> SimHTTPError:
    return vast_error(400, "invalid_args", msg, **extra)


def auth_error(status: int = 401) -> SimHTTPError:
    """A missing or unknown key. Search answers 404 for it (search_offers.yaml), the rest 401."""
    return vast_error(status, "auth_error", "Invalid user key")


def not_allowed(msg: str) -> SimHTTPError:
    """403: the key is valid but its scope does not cover this call (e.g. a CONTAINER_API_KEY)."""
    return vast_error(403, "not_allowed", msg)


def no_such_ask_404(ask_id: int) -> SimHTTPError:
    return vast_error(
        404, "invalid_args", f"error 404/3603: no_such_ask Instance type by id {ask_id} is not available.",
        ask_id=ask_id,
    )


def no_such_ask_410(ask_id: int) -> SimHTTPError:
    return vast_error(
        410, "no_such_ask", f"error 410/3907: no_such_ask Instance type {ask_id} is no longer available.",
        ask_id=ask_id,
    )


def destroy_not_found() -> SimHTTPError:
    return vast_error(404, "not_found", "Instance not found")


def no_such_instance() -> SimHTTPError:
    return vast_error(404, "no_such_instance", "Instance not found.")


def legacy_list_gone() -> SimHTTPError:
    """`GET /api/v0/instances/` today: the body skypilot issue 10517 quotes, the 410 dstack PR 3969 reports."""
    return deprecated_endpoint("/api/v0/instances/")


def deprecated_endpoint(path: str) -> SimHTTPError:
    return vast_error(410, "deprecated_endpoint", f"{path} is deprecated. Use /api/v1/instances/ instead.")


def unknown_route(method: str, path: str) -> SimHTTPError:
    return vast_error(404, "not_found", f"no route for {method} {path}")


def rate_limited(endpoint: str, threshold_s: float) -> SimHTTPError:
    """429 in the body shape the endpoint's OpenAPI file documents. Vast sends no Retry-After."""
    text = f"API requests too frequent endpoint threshold={threshold_s}"
    if endpoint == "search":
        return SimHTTPError(429, "API requests too frequent", TEXT_TYPE)
    if endpoint == "destroy":
        return vast_error(429, "rate_limit_exceeded", text)
    return SimHTTPError(429, {"detail": text})


def gateway_error(status: int) -> SimHTTPError:
    """A 502/503/504 as a proxy in front of the API answers it: an HTML page, not JSON."""
    reason = _GATEWAY_REASONS.get(status, "Server Error")
    html = f"<html><head><title>{status} {reason}</title></head><body><h1>{status} {reason}</h1></body></html>"
    return SimHTTPError(status, html, HTML_TYPE)
