"""VastClient against respx: success and error shapes of every endpoint, retries, pacing, key safety."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from tests.harness.conftest import VAST_TEST_BASE, VAST_TEST_KEY, FakeClock
from vast_harness.errors import (
    ApiStatusError,
    AuthError,
    ConfigError,
    NotFoundError,
    OfferUnavailable,
    RateLimitError,
    ServerError,
    TransportError,
    VastError,
)
from vast_harness.vast import client as client_module
from vast_harness.vast.client import (
    DEFAULT_API_URL,
    USER_AGENT,
    RawExchange,
    Timeouts,
    VastClient,
)
from vast_harness.vast.pacing import Pacer, endpoint_key

INSTANCE_ROW = {
    "id": 7835610,
    "label": "vh-run42",
    "actual_status": "running",
    "public_ipaddr": " 63.135.50.11 ",
    "ssh_host": "ssh2.vast.ai",
    "ssh_port": 10882,
    "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]},
}
OFFER_ROW = {"id": 12345678, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.3021, "gpu_ram": 24564}


def _json(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


def _text(status: int, text: str) -> httpx.Response:
    return httpx.Response(status, text=text)


def _assert_key_absent(*texts: object) -> None:
    for text in texts:
        assert VAST_TEST_KEY not in str(text)


# ------------------------------------------------------------------------------ construction and config


def test_repr_masks_key(client: VastClient) -> None:
    assert "***" in repr(client)
    _assert_key_absent(repr(client), str(client))


@pytest.mark.parametrize(
    "base_url", ["ftp://vast.test", "console.vast.ai", "", "https://vast.test/?api_key=x"], ids=str
)
def test_base_url__rejected_with_its_value_named(base_url: str) -> None:
    with pytest.raises(ConfigError) as info:
        VastClient(VAST_TEST_KEY, base_url=base_url)
    assert "base_url" in str(info.value)
    assert "api_key=x" not in str(info.value)


@pytest.mark.parametrize("key", ["", "   \n", "two words"], ids=["empty", "blank", "space"])
def test_api_key__rejected_without_echo(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        VastClient(key)
    assert key.strip() == "" or key not in str(info.value)


def test_defaults_and_timeouts() -> None:
    with VastClient(VAST_TEST_KEY + "\n") as c:  # trailing newline of a key file is dropped
        assert c.base_url == DEFAULT_API_URL
        timeout = c._http.timeout
        assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (10.0, 30.0, 30.0, 10.0)
        assert c._http.headers["Authorization"] == f"Bearer {VAST_TEST_KEY}"
    assert c._http.is_closed
    assert Timeouts(read_s=5).to_httpx().read == 5.0
    with pytest.raises(ValueError):
        Timeouts(connect_s=0)


def test_transport_seam__mock_transport_without_respx(fake_clock: FakeClock) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _json(200, {"id": 9, "credit": 12.5})

    with VastClient(VAST_TEST_KEY, transport=httpx.MockTransport(handler), sleep=fake_clock.sleep) as c:
        assert c.current_user().available_usd == 12.5
    assert seen[0].url == f"{DEFAULT_API_URL}/api/v0/users/current/"
    assert seen[0].headers["User-Agent"] == USER_AGENT


# ------------------------------------------------------------------------------------- search offers


def test_search_offers__success(vast_api: respx.MockRouter, client: VastClient) -> None:
    route = vast_api.post("/api/v0/bundles/").mock(return_value=_json(200, {"offers": [OFFER_ROW]}))
    query = {"num_gpus": {"eq": 1}, "order": [["dph_total", "asc"]], "limit": 20}
    offers = client.search_offers(query)
    assert [(o.id, o.gpu_ram_mb) for o in offers] == [(12345678, 24564)]
    request = route.calls.last.request
    assert json.loads(request.content) == query
    assert request.headers["Authorization"] == f"Bearer {VAST_TEST_KEY}"
    assert request.headers["User-Agent"].startswith("vast-harness/")
    _assert_key_absent(request.url)


def test_search_offers__invalid_user_key_404_is_auth_error_not_retried(
    vast_api: respx.MockRouter, client: VastClient
) -> None:
    route = vast_api.post("/api/v0/bundles/").mock(return_value=_json(404, {"msg": "Invalid user key"}))
    with pytest.raises(AuthError) as info:
        client.search_offers({})
    assert info.value.status == 404 and route.call_count == 1


@pytest.mark.parametrize(
    "response",
    [_json(200, {"nope": []}), _text(200, "<html>oops</html>"), _json(200, {"offers": [{"gpu_name": "x"}]})],
    ids=["no-offers-key", "garbage", "row-without-id"],
)
def test_search_offers__bad_200_body_is_invalid_response(
    vast_api: respx.MockRouter, client: VastClient, response: httpx.Response
) -> None:
    vast_api.post("/api/v0/bundles/").mock(return_value=response)
    with pytest.raises(ApiStatusError) as info:
        client.search_offers({})
    assert type(info.value) is ApiStatusError
    assert info.value.error == "invalid_response" and info.value.status == 200


# ------------------------------------------------------------------------ status mapping (all shapes)

GONE_INSTANCE = {"success": False, "error": "no_such_instance", "msg": "Instance not found."}
ERROR_SHAPES = [
    ("401-auth", _json(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}), AuthError),
    ("403-text", _text(403, "Forbidden: missing scope instance_read"), AuthError),
    ("404-auth", _json(404, {"error": "auth_error", "msg": "Invalid user key"}), AuthError),
    ("429-text", _text(429, "API requests too frequent"), RateLimitError),
    (
        "429-detail",
        _json(429, {"detail": "API requests too frequent endpoint threshold=2.0"}),
        RateLimitError,
    ),
    (
        "429-error-json",
        _json(429, {"success": False, "error": "rate_limit_exceeded", "msg": "threshold=3.0"}),
        RateLimitError,
    ),
    ("500-json", _json(500, {"success": False, "error": "server_error"}), ServerError),
    ("502-html", _text(502, "<html><body>Bad Gateway</body></html>"), ServerError),
    ("503-empty", httpx.Response(503), ServerError),
    ("504-text", _text(504, "Gateway Timeout"), ServerError),
    ("404-no-such-instance", _json(404, GONE_INSTANCE), NotFoundError),
    ("404-bare", _text(404, "Not Found"), ApiStatusError),
    ("400-msg-only", _json(400, {"msg": "invalid instance_id"}), ApiStatusError),
    ("400-message", _json(400, {"message": "Invalid json body"}), ApiStatusError),
    ("400-detail-list", _json(400, {"detail": [{"loc": ["id"], "msg": "bad"}]}), ApiStatusError),
    (
        "200-success-false",
        _json(200, {"success": False, "error": "not_allowed", "msg": "no"}),
        ApiStatusError,
    ),
    ("409-echoes-key", _json(409, {"error": "x", "msg": f"bad key {VAST_TEST_KEY}"}), ApiStatusError),
]


@pytest.mark.parametrize(("case", "response", "expected"), ERROR_SHAPES, ids=[c[0] for c in ERROR_SHAPES])
def test_error_shapes__typed_and_key_free(
    vast_api: respx.MockRouter, make_client, case: str, response: httpx.Response, expected: type
) -> None:
    client = make_client(max_retry_s=0)  # map only: no retry budget
    route = vast_api.get("/api/v0/instances/42/").mock(return_value=response)
    with pytest.raises(ApiStatusError) as info:
        client.get_instance(42)
    err = info.value
    assert type(err) is expected
    assert (err.method, err.path, err.status) == ("GET", "/api/v0/instances/42/", response.status_code)
    assert route.call_count == 1
    assert err.msg or err.error or case == "503-empty"
    _assert_key_absent(str(err), repr(err), err.args, err.body, err.msg)
    if case.startswith("429"):
        assert client.stats.rate_limited == 1


# ---------------------------------------------------------------------------------- get / list instances


def test_get_instance__running(vast_api: respx.MockRouter, client: VastClient) -> None:
    vast_api.get("/api/v0/instances/7835610/").mock(return_value=_json(200, {"instances": INSTANCE_ROW}))
    inst = client.get_instance(7835610)
    assert inst is not None and inst.direct_ssh == ("63.135.50.11", 41022)


def test_get_instance__instances_null_is_none(vast_api: respx.MockRouter, client: VastClient) -> None:
    vast_api.get("/api/v0/instances/5/").mock(return_value=_json(200, {"instances": None}))
    assert client.get_instance(5) is None


@pytest.mark.parametrize("body", [{}, {"instances": [{"id": 6}]}, {"instances": "x"}], ids=["missing", "list", "str"])
def test_get_instance__unexpected_shape_is_not_absence(
    vast_api: respx.MockRouter, client: VastClient, body: dict
) -> None:
    vast_api.get("/api/v0/instances/5/").mock(return_value=_json(200, body))
    with pytest.raises(ApiStatusError, match="invalid_response"):
        client.get_instance(5)


def test_list_instances__select_filters_and_pagination(
    vast_api: respx.MockRouter, client: VastClient
) -> None:
    pages = [
        _json(200, {"success": True, "instances": [{"id": 1}], "total_instances": 3, "next_token": "t1"}),
        _json(200, {"success": True, "instances": [{"id": 2}], "total_instances": 3, "next_token": "t2"}),
        _json(200, {"success": True, "instances": [{"id": 3}], "total_instances": 3, "next_token": None}),
    ]
    route = vast_api.get("/api/v1/instances/").mock(side_effect=pages)
    rows = client.list_instances(label="vh-run42", page_limit=10)
    assert [r.id for r in rows] == [1, 2, 3]
    params = [call.request.url.params for call in route.calls]
    assert [p.get("after_token") for p in params] == [None, "t1", "t2"]
    assert all(json.loads(p["select_filters"]) == {"label": {"eq": "vh-run42"}} for p in params)
    assert all(p["limit"] == "10" for p in params)
    # order_by as the official CLI sends it (vastai/api/instances.py): the keyset never rests on a server default
    assert all(json.loads(p["order_by"]) == [{"col": "id", "dir": "asc"}] for p in params)


def test_list_instances__empty_token_ends_paging(vast_api: respx.MockRouter, client: VastClient) -> None:
    route = vast_api.get("/api/v1/instances/").mock(
        return_value=_json(200, {"instances": [{"id": 1}], "next_token": ""})
    )
    assert [r.id for r in client.list_instances(instance_id=1)] == [1] and route.call_count == 1


def test_list_instances_page__by_id_total(vast_api: respx.MockRouter, client: VastClient) -> None:
    route = vast_api.get("/api/v1/instances/").mock(
        return_value=_json(200, {"success": True, "instances": [], "total_instances": 0, "next_token": None})
    )
    page = client.list_instances_page(instance_id=77)
    assert page.total_instances == 0 and page.instances == []
    params = route.calls.last.request.url.params
    assert json.loads(params["select_filters"]) == {"id": {"eq": 77}} and params["limit"] == "25"


def test_list_instances__endless_tokens_are_bounded(
    vast_api: respx.MockRouter, make_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "MAX_LIST_PAGES", 3)
    route = vast_api.get("/api/v1/instances/").mock(
        return_value=_json(200, {"instances": [{"id": 1}], "next_token": "again"})
    )
    with pytest.raises(VastError, match="3 pages"):
        make_client(pacing_scale=0).list_instances(label="vh")
    assert route.call_count == 3


@pytest.mark.parametrize("limit", [0, 26])
def test_list_instances_page__limit_bounds(client: VastClient, limit: int) -> None:
    with pytest.raises(ConfigError, match="limit"):
        client.list_instances_page(limit=limit)


# ---------------------------------------------------------------------------------------------- create


def test_create_instance__success(vast_api: respx.MockRouter, client: VastClient) -> None:
    body = {"client_id": "me", "image": "pytorch/pytorch", "disk": 40, "label": "vh-run42"}
    route = vast_api.put("/api/v0/asks/12345678/").mock(
        return_value=_json(200, {"success": True, "new_contract": 7835610, "instance_api_key": "ik-secret"})
    )
    result = client.create_instance(12345678, body)
    assert result.new_contract == 7835610 and result.instance_api_key == "ik-secret"
    assert "ik-secret" not in json.dumps(result.model_dump())
    assert json.loads(route.calls.last.request.content) == body


def test_create_instance__error_with_new_contract_raises_once(
    vast_api: respx.MockRouter, client: VastClient
) -> None:
    route = vast_api.put("/api/v0/asks/9/").mock(
        return_value=_json(
            400, {"success": False, "error": "invalid_price", "msg": "bid too low", "new_contract": 555}
        )
    )
    with pytest.raises(ApiStatusError) as info:
        client.create_instance(9, {"image": "x"})
    assert info.value.new_contract == 555 and info.value.error == "invalid_price"
    assert route.call_count == 1


@pytest.mark.parametrize(
    "response",
    [
        _json(
            404, {"success": False, "error": "invalid_args", "msg": "error 404/3603: no_such_ask Instance"}
        ),
        _json(410, {"success": False, "error": "no_such_ask", "msg": "error 410/3907: no longer available."}),
        _json(400, {"success": False, "error": "invalid_args", "msg": "Offer 9 has already been rented"}),
        _json(400, {"msg": "This offer is no longer rentable"}),
    ],
    ids=["404-no_such_ask", "410-no_such_ask", "already-rented", "no-longer-rentable"],
)
def test_create_instance__offer_gone(
    vast_api: respx.MockRouter, client: VastClient, response: httpx.Response
) -> None:
    route = vast_api.put("/api/v0/asks/9/").mock(return_value=response)
    with pytest.raises(OfferUnavailable):
        client.create_instance(9, {"image": "x"})
    assert route.call_count == 1


@pytest.mark.parametrize(
    "effect",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("timed out"), _json(503, {})],
    ids=["connect", "read-timeout", "503"],
)
def test_create_instance__never_retried_on_unknown_outcome(vast_api: respx.MockRouter, client: VastClient, effect) -> None:
    route = vast_api.put("/api/v0/asks/9/").mock(side_effect=[effect, _json(200, {"new_contract": 1})])
    with pytest.raises((TransportError, ServerError, RateLimitError)):
        client.create_instance(9, {"image": "x"})
    assert route.call_count == 1 and client.stats.retries == 0  # the queued 200 was never requested


# ---------------------------------------------------------------------------------------------- retries


def test_retry__429_then_connect_error_then_200(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    route = vast_api.get("/api/v0/instances/42/").mock(
        side_effect=[
            _text(429, "API requests too frequent"),
            httpx.ConnectError("reset"),
            _json(200, {"instances": None}),
        ]
    )
    assert client.get_instance(42) is None
    assert route.call_count == 3
    stats = client.stats
    assert (stats.retries, stats.rate_limited, stats.total) == (2, 1, 3)
    backoffs = [s for s in fake_clock.sleeps_s if s >= 1.0]
    assert backoffs and all(1.0 <= s <= 20.0 for s in backoffs)


def test_retry__destroy_on_503_then_deleted(vast_api: respx.MockRouter, client: VastClient) -> None:
    route = vast_api.delete("/api/v0/instances/42/").mock(
        side_effect=[_text(503, "Service Unavailable"), _json(200, {"success": True})]
    )
    assert client.destroy_instance(42) == "deleted"
    assert route.call_count == 2


@pytest.mark.parametrize(
    "response",
    [_json(401, {"error": "auth_error"}), _json(400, {"error": "invalid_args"})],
    ids=["401", "400"],
)
def test_retry__never_on_auth_or_4xx(vast_api: respx.MockRouter, client: VastClient, response) -> None:
    route = vast_api.delete("/api/v0/instances/42/").mock(return_value=response)
    with pytest.raises(ApiStatusError):
        client.destroy_instance(42)
    assert route.call_count == 1 and client.stats.retries == 0


def test_retry__each_retry_is_told_to_on_retry_naming_the_call_and_the_bound(
    vast_api: respx.MockRouter, make_client
) -> None:
    # `vast-e2e status` against an unreachable API sat silent for two minutes before its one warning.
    told: list[str] = []
    client = make_client(on_retry=told.append, max_retry_s=60.0)
    vast_api.get("/api/v0/instances/42/").mock(
        side_effect=[httpx.ConnectError("refused"), _text(503, "Service Unavailable"), _json(200, {"instances": None})]
    )
    assert client.get_instance(42) is None
    assert len(told) == 2, told
    assert all("/api/v0/instances/42/" in line and "retrying in" in line and "giving up in" in line for line in told)
    assert "refused" in told[0] and "503" in told[1]
    assert all(VAST_TEST_KEY not in line for line in told)


def test_retry__bounded_by_max_retry_s(
    vast_api: respx.MockRouter, make_client, fake_clock: FakeClock
) -> None:
    client = make_client(max_retry_s=60.0, retry_wait_min_s=1.0, retry_wait_max_s=20.0)

    def always_429(request: httpx.Request) -> httpx.Response:
        # Fail loudly (not by hanging) if the bound does not hold: AssertionError is never retried.
        assert route.call_count <= 30, "retry policy ignored max_retry_s"
        return _text(429, "API requests too frequent")

    route = vast_api.get("/api/v1/instances/").mock(side_effect=always_429)
    start = fake_clock()
    with pytest.raises(RateLimitError):
        client.list_instances_page()
    assert fake_clock() - start <= 60.0
    assert 3 <= route.call_count <= 30


def test_transport_error__chained_and_named(vast_api: respx.MockRouter, make_client) -> None:
    vast_api.get("/api/v0/users/current/").mock(side_effect=httpx.ConnectError("connection refused"))
    with pytest.raises(TransportError) as info:
        make_client(max_retry_s=0).current_user()
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert info.value.path == "/api/v0/users/current/" and "ConnectError" in str(info.value)


# ---------------------------------------------------------------------------------------------- destroy


@pytest.mark.parametrize(
    "response",
    [
        _json(404, {"success": False, "error": "not_found", "msg": "Instance not found"}),
        _json(404, GONE_INSTANCE),
        _json(200, GONE_INSTANCE),
    ],
    ids=["404-not_found", "404-no_such_instance", "200-success-false"],
)
def test_destroy__already_gone(vast_api: respx.MockRouter, client: VastClient, response) -> None:
    route = vast_api.delete("/api/v0/instances/42/").mock(return_value=response)
    assert client.destroy_instance(42) == "already_gone"
    assert route.call_count == 1


def test_destroy__sends_empty_object_and_timeout_then_404_is_gone(
    vast_api: respx.MockRouter, client: VastClient
) -> None:
    route = vast_api.delete("/api/v0/instances/42/").mock(
        side_effect=[httpx.ReadTimeout("timed out"), _json(404, GONE_INSTANCE)]
    )
    # the timed-out attempt was sent: it may be what deleted it, so the 404 says so (not someone else's delete)
    assert client.destroy_instance(42) == "already_gone_after_unanswered"
    assert [json.loads(c.request.content) for c in route.calls] == [{}, {}]


def test_destroy__bare_404_is_not_proof_of_absence(vast_api: respx.MockRouter, client: VastClient) -> None:
    vast_api.delete("/api/v0/instances/42/").mock(return_value=_text(404, "<html>Not Found</html>"))
    with pytest.raises(ApiStatusError) as info:
        client.destroy_instance(42)
    assert type(info.value) is ApiStatusError


# ------------------------------------------------------------------------------------- user and ssh keys


def test_current_user(vast_api: respx.MockRouter, client: VastClient) -> None:
    vast_api.get("/api/v0/users/current/").mock(
        return_value=_json(200, {"id": 1, "email": "a@b.c", "balance": 3.0, "api_key": VAST_TEST_KEY})
    )
    user = client.current_user()
    assert user.available_usd == 3.0 and "a@b.c" not in repr(user)


@pytest.mark.parametrize(
    ("call", "route_args", "body"),
    [
        ("current_user", ("GET", "/api/v0/users/current/"), {"id": "not-an-int", "api_key": VAST_TEST_KEY}),
        ("create", ("PUT", "/api/v0/asks/9/"), {"success": True, "instance_api_key": "ik-77"}),
    ],
    ids=["user-bad-id", "create-without-new_contract"],
)
def test_invalid_success_body__error_is_scrubbed(
    vast_api: respx.MockRouter, client: VastClient, call: str, route_args: tuple, body: dict
) -> None:
    vast_api.route(method=route_args[0], path=route_args[1]).mock(return_value=_json(200, body))
    with pytest.raises(ApiStatusError) as info:
        client.current_user() if call == "current_user" else client.create_instance(9, {})
    assert info.value.error == "invalid_response"
    _assert_key_absent(str(info.value), info.value.body)
    assert "ik-77" not in json.dumps(info.value.body)


# ---------------------------------------------------------------------------------------------- exchange


@pytest.mark.parametrize(
    ("effect", "status", "parsed", "error_part"),
    [
        (_json(200, {"instances": None}), 200, {"instances": None}, None),
        (_json(404, GONE_INSTANCE), 404, GONE_INSTANCE, None),
        (_text(200, "<html>garbage"), 200, None, None),
        (_text(429, "API requests too frequent"), 429, None, None),
        (httpx.ReadTimeout("timed out"), None, None, "ReadTimeout"),
    ],
    ids=["200-null", "404", "garbage", "429", "timeout"],
)
def test_exchange__records_raw_outcome_without_raising(
    vast_api: respx.MockRouter, client: VastClient, effect, status, parsed, error_part
) -> None:
    route = vast_api.get("/api/v0/instances/42/").mock(side_effect=[effect])
    record = client.exchange("GET", "/api/v0/instances/42/")
    assert (record.status, record.json, record.path) == (status, parsed, "/api/v0/instances/42/")
    if error_part is None:
        assert record.error is None
    else:
        assert error_part in (record.error or "") and record.text == ""
    assert record.t_end_unix >= record.t_start_unix and route.call_count == 1
    assert json.loads(json.dumps(record.to_dict()))["status"] == status


def test_exchange__legacy_list_410_is_visible(vast_api: respx.MockRouter, client: VastClient) -> None:
    vast_api.get("/api/v0/instances/", params={"owner": "me"}).mock(
        return_value=_json(410, {"detail": "Use /api/v1/instances/ instead"})
    )
    record = client.exchange("GET", "/api/v0/instances/", params={"owner": "me"})
    assert record.status == 410 and record.params == {"owner": "me"}


def test_exchange__scrubs_key_and_instance_key(vast_api: respx.MockRouter, client: VastClient) -> None:
    body = {"api_key": VAST_TEST_KEY, "instance_api_key": "ik-42", "note": f"k={VAST_TEST_KEY}"}
    vast_api.get("/api/v0/users/current/").mock(return_value=_json(200, body))
    record = client.exchange("GET", "/api/v0/users/current/")
    dumped = json.dumps(record.to_dict())
    _assert_key_absent(dumped)
    assert "ik-42" not in dumped and record.json["note"] == "k=***"


@pytest.mark.parametrize(
    ("path", "params"),
    [("/api/v0/instances/1/", {"api_key": VAST_TEST_KEY}), ("/api/v0/instances/1/?api_key=x", None)],
    ids=["param", "query-in-path"],
)
def test_exchange__refuses_key_in_url_and_records_why(
    vast_api: respx.MockRouter, client: VastClient, path: str, params
) -> None:
    record = client.exchange("GET", path, params=params)
    assert record.status is None and "ConfigError" in (record.error or "")
    _assert_key_absent(record.error)
    assert not vast_api.calls


def test_request_hook__key_in_url_never_sent(vast_api: respx.MockRouter, client: VastClient) -> None:
    # Bypasses _send's checks: the request hook is the last guard before the wire.
    with pytest.raises(ConfigError) as info:
        client._http.get(f"/api/v0/x/{VAST_TEST_KEY}/")
    _assert_key_absent(info.value)
    assert not vast_api.calls


@pytest.mark.parametrize(
    "key, url, refused",
    [
        # A short test key is matched as a token: a label or base36 deadline containing its letter is fine
        # (CI once failed on "vh-...-dk3" with key "k").
        ("k", '/api/v1/instances/?select_filters={"label":{"eq":"vh-abc-dk3q"}}', False),
        ("k", "/api/v0/asks/1/", False),
        ("k", '/api/v1/instances/?select_filters={"label":{"eq":"k"}}', True),
        ("k", "/api/v0/x/k/", True),
        # A real-length key is found wherever it sits, encoded or glued to other text.
        (VAST_TEST_KEY, f"/api/v1/instances/?q=zz{VAST_TEST_KEY}zz", True),
        (VAST_TEST_KEY, "/api/v1/instances/?q=" + VAST_TEST_KEY.replace("-", "%2D"), True),
        (VAST_TEST_KEY, f"/api/v0/x/{VAST_TEST_KEY}.json", True),
        (VAST_TEST_KEY, "/api/v1/instances/?q=vhkey", False),
    ],
)
def test_key_in_url__tokens_for_short_keys_substrings_for_real_ones(key: str, url: str, refused: bool) -> None:
    assert client_module._key_in_url(key, httpx.URL(f"{VAST_TEST_BASE}{url}")) is refused


# ------------------------------------------------------------------------------------------------ pacing


def _start_times(fake_clock: FakeClock, response: httpx.Response):
    starts: list[float] = []

    def record(request: httpx.Request) -> httpx.Response:
        starts.append(fake_clock())
        return response

    return starts, record


def test_pacing__same_endpoint_spaced_by_interval(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    starts, record = _start_times(fake_clock, _json(200, {"instances": None}))
    vast_api.get("/api/v0/instances/42/").mock(side_effect=record)
    for _ in range(3):
        client.get_instance(42)
    assert [b - a for a, b in itertools.pairwise(starts)] == [2.0, 2.0]


def test_pacing__interval_counts_from_completion(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    # A slow answer: the server saw the request arrive as late as its completion, so pace from there.
    starts: list[float] = []

    def slow(request: httpx.Request) -> httpx.Response:
        starts.append(fake_clock())
        fake_clock.now_s += 0.5
        return _json(200, {"instances": None})

    vast_api.get("/api/v0/instances/42/").mock(side_effect=slow)
    client.get_instance(42)
    client.get_instance(42)
    assert starts[1] - starts[0] == 2.5


def test_pacing__search_sliding_window(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    starts, record = _start_times(fake_clock, _json(200, {"offers": []}))
    vast_api.post("/api/v0/bundles/").mock(side_effect=record)
    for _ in range(11):
        client.search_offers({})
    assert starts[9] == starts[0]  # ten fit in the window at once
    assert starts[10] - starts[0] >= 60.0


def test_pacing__a_delete_never_waits_behind_a_read_of_its_instance(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    # Each operation keeps its own pacing (its own x-rate-limit): a DELETE right after the run's read of the
    # instance goes at once (red team r10: it waited 3 s with the cap already broken); a second DELETE waits 3 s.
    starts, record = _start_times(fake_clock, _json(200, {"instances": None}))
    vast_api.delete("/api/v0/instances/42/").mock(side_effect=record)
    vast_api.get("/api/v0/instances/42/").mock(side_effect=record)
    client.get_instance(42)
    client.destroy_instance(42)
    client.destroy_instance(42)
    assert [b - a for a, b in itertools.pairwise(starts)] == [0.0, 3.0]


def test_pacing__independent_endpoints_and_scale_zero(
    vast_api: respx.MockRouter, make_client, fake_clock: FakeClock
) -> None:
    vast_api.get("/api/v0/users/current/").mock(return_value=_json(200, {"id": 1}))
    vast_api.get("/api/v1/instances/").mock(return_value=_json(200, {"instances": []}))
    paced = make_client()
    paced.current_user()
    paced.list_instances_page()
    assert fake_clock.sleeps_s == []  # different endpoints do not wait for each other
    unpaced = make_client(pacing_scale=0)
    for _ in range(3):
        unpaced.current_user()
    assert fake_clock.sleeps_s == []
    assert unpaced.stats.by_endpoint == {"GET /api/v0/users/current/": 3}


def test_pacer__threads_get_distinct_slots() -> None:
    lock = threading.Lock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        with lock:
            slept.append(seconds)

    pacer = Pacer(scale=0.5, clock=lambda: 100.0, sleep=sleep)
    slots: list[float] = []

    def worker() -> None:
        token = pacer.acquire("GET", "/api/v0/instances/1/")
        with lock:
            slots.append(token[1])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert sorted(slots) == [100.0 + i * 1.0 for i in range(8)]  # 2.0 s rule at scale 0.5
    assert sorted(slept) == [1.0 * i for i in range(1, 8)]


class _OverlapApi:
    """A real HTTP server on loopback that answers slowly and records, per endpoint (the pacing's path key), how
    many requests were in flight at once and when each arrived."""

    def __init__(self, delay_s: float) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.peak_all = 0
        self.arrivals: dict[str, list[float]] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                key = endpoint_key(self.command, self.path.split("?", 1)[0])
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with api.lock:
                    api.arrivals.setdefault(key, []).append(time.monotonic())
                    api.in_flight[key] = api.in_flight.get(key, 0) + 1
                    api.peak[key] = max(api.peak.get(key, 0), api.in_flight[key])
                    api.peak_all = max(api.peak_all, sum(api.in_flight.values()))
                try:
                    time.sleep(api.delay_s)
                    body = json.dumps({"id": 1} if "users" in key else {"instances": None}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                finally:
                    with api.lock:
                        api.in_flight[key] -= 1

            do_GET = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _shared_by_threads(client: VastClient, n: int = 3) -> None:
    """`n` threads each read and delete "their" instance while `n` more read the user: the load of a fleet's
    runs sharing one client (two endpoints, several callers each)."""
    def lifecycle(i: int) -> None:
        client.get_instance(100 + i)
        client.destroy_instance(100 + i)

    threads = [threading.Thread(target=lifecycle, args=(i,)) for i in range(n)]
    threads += [threading.Thread(target=client.current_user) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("serialized", [False, True], ids=["shared", "serialized"])
def test_serialized_client__one_request_per_endpoint_in_flight(serialized: bool) -> None:
    """A client shared by threads (a fleet's runs) never has two requests to one endpoint in flight once
    `serialize_endpoints` was called, and each arrives at least the endpoint's interval after the previous one
    *completed*. Unserialised, the same load overlaps: slots are spaced from reservations, and an answer slower
    than the interval lets the next request arrive while it is still in flight (a 429 on Vast)."""
    scale = 0.05  # each operation its own history: GET 0.1 s and DELETE 0.15 s of instances; users/current 0.05 s
    api = _OverlapApi(delay_s=0.2)  # slower than every interval
    try:
        with VastClient(VAST_TEST_KEY, base_url=api.url, pacing_scale=scale, max_retry_s=0) as client:
            if serialized:
                client.serialize_endpoints()
            _shared_by_threads(client)
    finally:
        api.close()
    read, delete, user = ("GET /api/v0/instances/{id}/", "DELETE /api/v0/instances/{id}/",
                          "GET /api/v0/users/current/")
    assert len(api.arrivals[read]) == 3 and len(api.arrivals[delete]) == 3 and len(api.arrivals[user]) == 3
    if not serialized:  # what a fleet's runs did without it: the assertions below are not vacuous
        assert max(api.peak.values()) > 1, api.peak
        return
    assert api.peak == {read: 1, delete: 1, user: 1}
    assert api.peak_all >= 2  # per endpoint, not one lock for the whole client
    for key, interval_s in ((read, 0.1), (delete, 0.15), (user, 0.05)):
        arrivals = sorted(api.arrivals[key])
        # the previous answer took 0.2 s, then the interval: arrivals at least that far apart
        assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.2 + interval_s - 0.02


def test_pacer__serialize_is_per_endpoint_and_off_by_default() -> None:
    pacer = Pacer(scale=0, clock=time.monotonic, sleep=time.sleep)
    assert not pacer.serialized
    with pacer.slot("GET", "/api/v0/instances/1/"), pacer.slot("GET", "/api/v0/instances/2/"):
        pass  # unserialised: nested slots on one endpoint do not wait for each other
    pacer.serialize()
    assert pacer.serialized
    entered = threading.Event()
    with pacer.slot("GET", "/api/v0/instances/1/"):
        with pacer.slot("GET", "/api/v0/users/current/"):
            pass  # another endpoint is free
        with pacer.slot("DELETE", "/api/v0/instances/1/"):
            pass  # another operation on the same path is free too

        def read() -> None:
            with pacer.slot("GET", "/api/v0/instances/2/"):
                entered.set()

        t = threading.Thread(target=read)
        t.start()
        assert not entered.wait(0.2)  # per-id reads of instances are one endpoint: it waits
    assert entered.wait(5)
    t.join(timeout=5)


def test_endpoint_key() -> None:
    assert endpoint_key("delete", "/api/v0/instances/42/") == "DELETE /api/v0/instances/{id}/"
    assert endpoint_key("GET", "/api/v0/instances/42/ssh/") == "GET /api/v0/instances/{id}/ssh/"


# ----------------------------------------------------------------------------------- key never leaks


def test_key_never_in_urls_or_logs(
    vast_api: respx.MockRouter, client: VastClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    vast_api.get("/api/v0/users/current/").mock(return_value=_json(200, {"id": 1}))
    vast_api.get("/api/v1/instances/").mock(return_value=_json(200, {"instances": []}))
    vast_api.delete("/api/v0/instances/9/").mock(side_effect=[_text(502, "bad"), _json(404, GONE_INSTANCE)])
    vast_api.put("/api/v0/asks/3/").mock(side_effect=httpx.ConnectError("boom"))
    client.current_user()
    client.list_instances(label="vh")
    client.destroy_instance(9)
    with pytest.raises(TransportError) as info:
        client.create_instance(3, {})
    assert all(call.request.headers["Authorization"] == f"Bearer {VAST_TEST_KEY}" for call in vast_api.calls)
    _assert_key_absent(*(call.request.url for call in vast_api.calls), caplog.text, info.value)
    assert all("api_key" not in call.request.url.params for call in vast_api.calls)


def test_raw_exchange_is_plain_data() -> None:
    record = RawExchange("GET", "/p/", {}, None, "", None, "ReadTimeout: x", 1.0, 2.0)
    assert record.to_dict()["error"] == "ReadTimeout: x"


def test_base_url_is_used_verbatim(vast_api: respx.MockRouter, client: VastClient) -> None:
    route = vast_api.get("/api/v0/users/current/").mock(return_value=_json(200, {"id": 1}))
    client.current_user()
    assert str(route.calls.last.request.url) == f"{VAST_TEST_BASE}/api/v0/users/current/"


# ------------------------------------------------------------------------------------- preflight bound


def test_preflight_gives_up_on_a_silent_api_within_its_bound(fake_clock: FakeClock) -> None:
    # Nothing is rented yet: an API that never answers is reported after PREFLIGHT_RETRY_S of retries, not after
    # the client's whole budget (120 s, there for a DELETE), and the message names the URL and the bound.
    from vast_harness.market.plan import PREFLIGHT_RETRY_S, account_credit_usd

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    with VastClient(VAST_TEST_KEY, transport=httpx.MockTransport(refuse), sleep=fake_clock.sleep,
                    clock=fake_clock) as c:
        start = fake_clock()
        with pytest.raises(TransportError) as info:
            account_credit_usd(c)
        assert fake_clock() - start <= PREFLIGHT_RETRY_S
        assert c.stats.retries >= 2
        start = fake_clock()
        with pytest.raises(TransportError):
            c.current_user()  # the client's own bound is unchanged for everything else
        assert fake_clock() - start > PREFLIGHT_RETRY_S
    assert f"(retried for up to {PREFLIGHT_RETRY_S:g} s)" in str(info.value)
    assert DEFAULT_API_URL in str(info.value) and "Connection refused" in str(info.value)
    assert "retried for up to" in str(info.value) and "usable answer in" in str(info.value)


# ----------------------------------------------------------------------- whole-answer bound (total_s)
# A real local server, not respx: the bound must hold on a real socket, where a trickling server (one byte a
# second) never trips httpx's per-read timeout.

_FAST_BODY = b'{"id": 1, "credit": 5.0}'


def _answer(conn: socket.socket, body: bytes, *, pieces: int = 1, gap_s: float = 0.0) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    step = max(1, -(-len(body) // pieces))
    for i in range(0, len(body), step):
        time.sleep(gap_s)
        conn.sendall(body[i : i + step])


def _body_trickle(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(60):
        conn.sendall(b" ")
        time.sleep(0.25)


def _header_trickle(conn: socket.socket) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
        conn.sendall(bytes([byte]))
        time.sleep(0.25)


def _self_signed_tls(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS contexts for 127.0.0.1, from a throwaway self-signed certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_path, key_path)
    return server, ssl.create_default_context(cafile=str(cert_path))


class _LocalApi:
    """A tiny HTTP/1.1 server on 127.0.0.1: the n-th request (over any connection; keep-alive honoured, so a
    client that reuses a connection is exercised too) is answered by `handlers[n]` (the last one repeats)."""

    def __init__(self, handlers: list[Callable[[socket.socket], None]], tls: ssl.SSLContext | None = None) -> None:
        self.handlers = handlers
        self._tls = tls
        self.requests = 0
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        if self._tls is not None:
            try:
                conn = self._tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            buf = b""
            try:
                while not self._stop.is_set():
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buf += data
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    buf = buf[length:]
                    handler = self.handlers[min(self.requests, len(self.handlers) - 1)]
                    self.requests += 1
                    handler(conn)
            except OSError:  # the client cut the connection: what the bound is for
                return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def local_api() -> Iterator[Callable[..., tuple[_LocalApi, VastClient]]]:
    made: list[tuple[_LocalApi, VastClient]] = []

    def make(handlers: list[Callable[[socket.socket], None]], total_s: float) -> tuple[_LocalApi, VastClient]:
        server = _LocalApi(handlers)
        client = VastClient(VAST_TEST_KEY, base_url=server.base_url, timeouts=Timeouts(total_s=total_s),
                            pacing_scale=0, max_retry_s=0)  # one attempt: the bound of one request is measured
        made.append((server, client))
        return server, client

    yield make
    for server, client in made:
        client.close()
        server.close()


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vast-answer-bound") and t.is_alive()]


def test_timeouts__total_s_default_and_validated() -> None:
    assert Timeouts().total_s == 45.0
    with pytest.raises(ValueError):
        Timeouts(total_s=0)


@pytest.mark.parametrize("handler", [_body_trickle, _header_trickle], ids=["body", "headers"])
def test_total_bound__cuts_a_trickling_answer(local_api: Any, handler: Callable[[socket.socket], None]) -> None:
    # Each byte arrives well within read_s, so only the whole-answer bound can end the request.
    _, client = local_api([handler], total_s=2)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        client.current_user()
    elapsed_s = time.monotonic() - start
    assert 1.9 <= elapsed_s < 4.0
    assert str(info.value).startswith("GET /api/v0/users/current/: no complete answer within 2 s")
    assert "trickled or stalled" in str(info.value)
    _assert_key_absent(info.value)


def test_total_bound__cuts_a_trickling_answer_over_tls(tmp_path: Path) -> None:
    # Production is HTTPS: TLS wraps (and detaches) the TCP socket, so the cut must reach the TLS socket.
    server_tls, client_tls = _self_signed_tls(tmp_path)
    server = _LocalApi([_header_trickle], tls=server_tls)  # headers: only the socket cut can end it
    transport = httpx.HTTPTransport(verify=client_tls, limits=httpx.Limits(max_keepalive_connections=0))
    try:
        with VastClient(VAST_TEST_KEY, base_url=server.base_url, timeouts=Timeouts(total_s=2),
                        transport=transport, pacing_scale=0, max_retry_s=0) as client:
            start = time.monotonic()
            with pytest.raises(TransportError, match="no complete answer within 2 s"):
                client.current_user()
            assert time.monotonic() - start < 4.0
    finally:
        server.close()


def test_total_bound__a_slow_but_complete_answer_succeeds(local_api: Any) -> None:
    server, client = local_api([partial(_answer, body=_FAST_BODY, pieces=4, gap_s=0.3)], total_s=3)
    assert client.current_user().id == 1
    assert server.requests == 1
    time.sleep(0.2)
    assert _watchdogs() == []  # cancelled on success, not left to fire


def test_total_bound__exchange_records_the_cut(local_api: Any) -> None:
    _, client = local_api([_body_trickle], total_s=1.5)
    start = time.monotonic()
    record = client.exchange("GET", "/api/v0/instances/7/")
    assert time.monotonic() - start < 3.5
    assert record.status is None
    assert record.error is not None and "no complete answer within 1.5 s" in record.error
    assert record.error.startswith("TransportError: ")


def test_total_bound__never_cuts_a_later_request(local_api: Any) -> None:
    # The first request answers at once; its bound would expire at ~2 s, in the middle of the second
    # (t = 1.0 .. 2.5 s), which completes within its own bound and must not be cut by the first's timer.
    server, client = local_api([partial(_answer, body=_FAST_BODY),
                                partial(_answer, body=_FAST_BODY, pieces=5, gap_s=0.3)], total_s=2)
    assert client.current_user().id == 1
    time.sleep(1.0)
    assert client.current_user().id == 1
    assert (server.requests, server.connections) == (2, 2)  # no keep-alive: each request owns its socket
    time.sleep(0.2)
    assert _watchdogs() == []


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_410_deprecated_endpoint_is_named_and_never_gone(vast_api: respx.MockRouter, client: VastClient,
                                                           method: str) -> None:
    from vast_harness.errors import EndpointDeprecated

    body = {"success": False, "error": "deprecated_endpoint",
            "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead."}
    vast_api.route(method=method, path="/api/v0/instances/5/").mock(return_value=_json(410, body))
    with pytest.raises(EndpointDeprecated, match="RETIRED") as info:
        client.get_instance(5) if method == "GET" else client.destroy_instance(5)
    assert not isinstance(info.value, NotFoundError)


def _instance_answer(conn: socket.socket) -> None:
    _answer(conn, b'{"instances": {"id": 7, "actual_status": "loading"}}')


def test_within_s__a_read_ends_by_its_phases_deadline_retries_and_answer_included(local_api: Any) -> None:
    # A read that starts just before a phase's deadline (the boot's, the cap's) must not hold the phase past it:
    # not with the client's 30 s answer bound, and not with its minutes of retries.
    server, client = local_api([_header_trickle], total_s=30)
    client._max_retry_s = 120.0  # the production retry bound
    start = time.monotonic()
    with pytest.raises(TransportError):
        client.get_instance(7, within_s=1.0)
    assert time.monotonic() - start < 1.6
    server.handlers = [_instance_answer]
    assert client.get_instance(7, within_s=5.0) is not None  # an answer in time is read as usual


def test_within_s__past_its_deadline_nothing_is_sent(local_api: Any) -> None:
    server, client = local_api([_instance_answer], total_s=30)
    with pytest.raises(TransportError, match="not sent"):
        client.get_instance(7, within_s=0.0)
    assert server.requests == 0 and client.stats.total == 0


def _stall(conn: socket.socket) -> None:
    time.sleep(6)  # accepted, never answered (the client cuts it)


def _ok_answer(conn: socket.socket) -> None:
    _answer(conn, b'{"success": true, "offers": []}')


def test_land_within_s__a_stalled_delete_leaves_room_for_a_retry_that_lands_in_time(local_api: Any) -> None:
    # The cap is 1.6 s away and one answer may take 2 s (the chaos suite's scale): a stalled first DELETE retried
    # after its whole 2 s bound would land past the cap. Half the time left per attempt lands it.
    server = _LocalApi([_stall, _ok_answer])
    try:
        with VastClient(VAST_TEST_KEY, base_url=server.base_url, timeouts=Timeouts(total_s=2), pacing_scale=0,
                        retry_wait_min_s=0.02, retry_wait_max_s=0.2) as client:
            start = time.monotonic()
            assert client.destroy_instance(7, land_within_s=1.6) == "deleted"
            assert time.monotonic() - start < 1.4 and server.requests == 2
    finally:
        server.close()


def test_land_within_s__without_room_for_two_an_attempt_keeps_its_full_bound(local_api: Any) -> None:
    # Landing late beats not landing: too close to the cap to split, the attempt is not cut short.
    server, client = local_api([_ok_slow_answer], total_s=2)
    assert client.destroy_instance(7, land_within_s=0.4) == "deleted" and server.requests == 1


def _ok_slow_answer(conn: socket.socket) -> None:
    time.sleep(0.8)
    _ok_answer(conn)


@pytest.mark.slow
def test_min_attempts__a_search_that_stalls_past_the_retry_bound_is_tried_again(local_api: Any) -> None:
    # Nothing is rented during a search: one that stalled its whole answer bound (longer than the preflight's
    # retry bound) gets a second try instead of failing the run (exit 1 where the answer would be exit 5).
    server, client = local_api([_stall, _ok_answer], total_s=1)
    client._max_retry_s = 0.5
    assert client.search_offers({}, max_retry_s=0.5, min_attempts=2) == [] and server.requests == 2
    server.requests = 0
    server.handlers = [_stall]
    with pytest.raises(TransportError):
        client.search_offers({}, max_retry_s=0.5, min_attempts=2)
    assert server.requests == 2


def _not_found(conn: socket.socket) -> None:
    body = b'{"success": false, "error": "no_such_instance", "msg": "Instance 7 not found."}'
    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(body) + body)


def test_a_404_after_an_unanswered_delete_of_ours_is_not_someone_elses_delete(local_api: Any) -> None:
    # A DELETE the API held was cut and the retry answered 404: ours was sent and may be what deleted it, so
    # it is never "deleted by someone else".
    server = _LocalApi([_stall, _not_found])
    try:
        with VastClient(VAST_TEST_KEY, base_url=server.base_url, timeouts=Timeouts(total_s=0.5), pacing_scale=0,
                        retry_wait_min_s=0.02, retry_wait_max_s=0.1) as client:
            assert client.destroy_instance(7) == "already_gone_after_unanswered"
            server.handlers, server.requests = [_not_found], 0
            assert client.destroy_instance(7) == "already_gone"  # a first answer of 404: nothing of ours was lost
    finally:
        server.close()


def test_a_delete_past_the_cap_is_retried_at_its_own_pace_not_backed_off(
    vast_api: respx.MockRouter, make_client, fake_clock: FakeClock
) -> None:
    # Red team r11: a DELETE failing 503 four times after the cap had passed (its land-by deadline behind it)
    # was retried 6, 5, 9 and 16 s apart, the backoff growing while the host billed 500x: 30x the cap. Past
    # its deadline a DELETE is retried at its rate limit's pace (3 s), never backed off further.
    client = make_client(max_retry_s=300)
    starts: list[float] = []
    answers = iter([_json(503, {"error": "x"})] * 4 + [_json(200, {"success": True})])

    def record(request: httpx.Request) -> httpx.Response:
        starts.append(fake_clock())
        return next(answers)

    vast_api.delete("/api/v0/instances/7/").mock(side_effect=record)
    assert client.destroy_instance(7, land_within_s=0.0) == "deleted"
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 4 and max(gaps) <= 3.0 + 1e-6, gaps
