"""Bodies the client cannot read are typed errors on every endpoint; create's 429; prices (respx)."""

from __future__ import annotations

import math

import httpx
import pytest
import respx

from tests.harness.conftest import FakeClock
from vast_harness.errors import ApiStatusError, RateLimitError, VastError
from vast_harness.instance.lifecycle import destroy
from vast_harness.state.ledger import Ledger
from vast_harness.vast import client as client_module
from vast_harness.vast.client import CREATE_429_PENALTY_S, VastClient
from vast_harness.vast.models import Instance

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
DEEP_OBJ = '{"instances": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}"  # parses; too deep for recursive code

ENDPOINTS = {
    "search": ("POST", "/api/v0/bundles/", lambda c: c.search_offers({})),
    "create": ("PUT", "/api/v0/asks/9/", lambda c: c.create_instance(9, {"image": "x"})),
    "show": ("GET", "/api/v0/instances/5/", lambda c: c.get_instance(5)),
    "list": ("GET", "/api/v1/instances/", lambda c: c.list_instances(label="vh-x")),
    "destroy": ("DELETE", "/api/v0/instances/5/", lambda c: c.destroy_instance(5)),
    "user": ("GET", "/api/v0/users/current/", lambda c: c.current_user()),
}
BODIES = {
    "deep-json": DEEP, "deep-object": DEEP_OBJ, "not-json": "<html>ok</html>", "wrong-type": '"a string"',
    "list-not-object": "[1, 2, 3]", "null-fields": '{"instances": [null], "offers": [null], "id": [], "key": 5}',
}


@pytest.mark.parametrize("body", list(BODIES), ids=list(BODIES))
@pytest.mark.parametrize("endpoint", list(ENDPOINTS), ids=list(ENDPOINTS))
def test_unreadable_200_bodies_are_typed_errors(vast_api: respx.MockRouter, client: VastClient,
                                                endpoint: str, body: str) -> None:
    method, path, call = ENDPOINTS[endpoint]
    vast_api.route(method=method, path=path).mock(return_value=httpx.Response(200, text=BODIES[body]))
    try:
        call(client)
    except ApiStatusError:
        return
    # (a DELETE's body is not read; a null show is "gone"; users/current ignores fields it does not know)
    assert (endpoint, body) in {("destroy", b) for b in BODIES} | {("show", "null-fields"), ("user", "deep-object")}


@pytest.mark.parametrize("status", [200, 404, 503])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS), ids=list(ENDPOINTS))
def test_deep_error_bodies_are_typed_errors(vast_api: respx.MockRouter, make_client, endpoint: str,
                                            status: int) -> None:
    client = make_client(max_retry_s=0)
    method, path, call = ENDPOINTS[endpoint]
    vast_api.route(method=method, path=path).mock(return_value=httpx.Response(status, text=DEEP_OBJ))
    try:
        call(client)
    except VastError:
        return
    assert status == 200 and endpoint in ("destroy", "user")


def test_a_huge_body_is_not_read_past_the_bound(vast_api: respx.MockRouter, client: VastClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_RESPONSE_BYTES", 1000)
    vast_api.get("/api/v0/users/current/").mock(return_value=httpx.Response(200, text='{"id": 1, "x": "'
                                                                             + "a" * 5000 + '"}'))
    with pytest.raises(ApiStatusError, match="exceeds 1000 bytes"):
        client.current_user()


def test_destroy_with_a_pathological_answer_never_raises(vast_api: respx.MockRouter, make_client) -> None:
    client = make_client(max_retry_s=0)
    vast_api.delete("/api/v0/instances/5/").mock(return_value=httpx.Response(500, text=DEEP_OBJ))
    ack = destroy(client, 5)
    assert not ack.acknowledged and "HTTP 500" in ack.outcome


def test_create_429_waits_the_documented_penalty_and_retries_the_same_offer(
    vast_api: respx.MockRouter, client: VastClient, fake_clock: FakeClock
) -> None:
    limited = httpx.Response(429, json={"detail": "API requests too frequent endpoint threshold=4.5"})
    route = vast_api.put("/api/v0/asks/9/").mock(
        side_effect=[limited, limited, httpx.Response(200, json={"success": True, "new_contract": 77})])
    assert client.create_instance(9, {"image": "x"}).new_contract == 77
    assert route.call_count == 3
    assert [s for s in fake_clock.sleeps_s if s >= CREATE_429_PENALTY_S][:2] == pytest.approx(
        [s for s in fake_clock.sleeps_s if s >= CREATE_429_PENALTY_S][:2]) and \
        sum(1 for s in fake_clock.sleeps_s if s >= CREATE_429_PENALTY_S) == 2


def test_create_429_forever_gives_up_as_rate_limited(vast_api: respx.MockRouter, make_client) -> None:
    client = make_client(max_retry_s=60)
    vast_api.put("/api/v0/asks/9/").mock(return_value=httpx.Response(429, json={"detail": "slow"}))
    with pytest.raises(RateLimitError):
        client.create_instance(9, {"image": "x"})


def test_destroy_retries_are_bounded_by_the_callers_budget(vast_api: respx.MockRouter, client: VastClient,
                                                           fake_clock: FakeClock) -> None:
    vast_api.delete("/api/v0/instances/5/").mock(return_value=httpx.Response(503, text="<html/>"))
    start = fake_clock.now_s
    ack = destroy(client, 5, max_retry_s=5.0)
    assert not ack.acknowledged and fake_clock.now_s - start <= 5.0 + 1e-6


@pytest.mark.parametrize(("raw", "expected"), [
    (0.5, 0.5), ("0.3021", 0.3021), (" 1.25 ", 1.25), (None, None), ("n/a", None), (float("nan"), None),
    ("inf", None), (-1.0, None), ([], None), (True, None),
])
def test_dph_total_parses_robustly(raw, expected) -> None:
    inst = Instance.model_validate({"id": 1, "dph_total": raw})
    assert inst.dph_total == expected or (expected is not None and math.isclose(inst.dph_total, expected))


def test_ledger_accepts_create_unresolved(tmp_path) -> None:
    Ledger(tmp_path / "l.jsonl").append("r", "intent", "vh-r", offer_id=9)
    Ledger(tmp_path / "l.jsonl").append("r", "create_unresolved", "vh-r", offer_id=9, detail="held")
    _, labels = Ledger(tmp_path / "l.jsonl").unproven()
    assert labels == {"vh-r"}
