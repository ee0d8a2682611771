"""GET /api/v1/instances/: limits, keyset pagination, select_filters, label counts."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.sim.conftest import create
from vast_harness.sim import SimServer

LIST = "/api/v1/instances/"


@pytest.fixture
def seven(api: httpx.Client) -> list[int]:
    offers = api.post("/api/v0/bundles/", json={"limit": 7}).json()["offers"]
    return [create(api, o["id"], label="odd" if i % 2 else "even")["new_contract"] for i, o in enumerate(offers)]


def test_pages_cover_everything_once(api: httpx.Client, seven: list[int]) -> None:
    seen, token, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"after_token": token} if token else {})}
        body = api.get(LIST, params=params).json()
        assert body["total_instances"] == 7 and body["instances_found"] == len(body["instances"])
        seen += [i["id"] for i in body["instances"]]
        pages += 1
        token = body["next_token"]
        if token is None:
            break
    assert pages == 3 and seen == sorted(seven)


def test_desc_order(api: httpx.Client, seven: list[int]) -> None:
    body = api.get(LIST, params={"order_by": '[{"col":"id","dir":"desc"}]', "limit": 4}).json()
    rest = api.get(LIST, params={"order_by": '[{"col":"id","dir":"desc"}]', "limit": 4,
                                 "after_token": body["next_token"]}).json()
    assert [i["id"] for i in body["instances"] + rest["instances"]] == sorted(seven, reverse=True)


@pytest.mark.parametrize(("limit", "expected"), [(None, 7), ("0", 5), ("-3", 5), ("2", 2), ("100", 7)])
def test_limit_rules(api: httpx.Client, seven: list[int], limit: str | None, expected: int) -> None:
    params = {} if limit is None else {"limit": limit}
    assert len(api.get(LIST, params=params).json()["instances"]) == expected


def test_limit_is_capped_at_25(api: httpx.Client) -> None:
    offers = api.post("/api/v0/bundles/", json={"limit": 27}).json()["offers"]
    for offer in offers:
        create(api, offer["id"])
    body = api.get(LIST, params={"limit": 100}).json()
    assert len(body["instances"]) == 25 and body["total_instances"] == 27 and body["next_token"]


def test_select_filters(api: httpx.Client, seven: list[int]) -> None:
    def ids(filters: str) -> list[int]:
        return [i["id"] for i in api.get(LIST, params={"select_filters": filters}).json()["instances"]]

    assert ids(f'{{"id": {{"eq": {seven[2]}}}}}') == [seven[2]]
    assert ids('{"label": {"eq": "odd"}}') == sorted(seven[1::2])
    assert ids('{"label": {"neq": "odd"}}') == sorted(seven[0::2])
    assert ids(f'{{"id": {{"in": [{seven[0]}, {seven[1]}]}}}}') == sorted(seven[:2])
    assert ids(f'{{"id": {{"notin": [{seven[0]}]}}}}') == sorted(seven[1:])
    assert ids(f'{{"id": {{"gt": {seven[5]}}}}}') == sorted(seven[6:])
    assert ids(f'{{"id": {{"lte": {seven[1]}}}}}') == sorted(seven[:2])
    assert ids('{"label": {"eq": "nobody"}}') == []
    body = api.get(LIST, params={"select_filters": '{"label": {"eq": "odd"}}'}).json()
    assert body["total_instances"] == 3 and body["label_counts"] == {"odd": 3}


def test_label_counts_and_select_cols(api: httpx.Client, seven: list[int]) -> None:
    body = api.get(LIST, params={"select_cols": '["id","label","nope"]'}).json()
    assert body["label_counts"] == {"odd": 3, "even": 4}
    assert set(body["instances"][0]) == {"id", "label", "nope"} and body["instances"][0]["nope"] is None


def test_destroyed_instances_linger_then_leave_the_list(api: httpx.Client, fresh: SimServer, seven: list[int]) -> None:
    fresh.set_faults("linger:1.0")  # the default is the sourced shape: null at once
    api.delete(f"/api/v0/instances/{seven[0]}/")
    params = {"select_filters": f'{{"id": {{"eq": {seven[0]}}}}}'}
    lingering = api.get(LIST, params=params).json()["instances"]
    assert [(r["intended_status"], r["cur_state"]) for r in lingering] == [("destroyed", "unloaded")]
    time.sleep(1.05)
    body = api.get(LIST, params=params).json()
    assert body["total_instances"] == 0 and body["instances"] == []


@pytest.mark.parametrize("params", [
    {"select_filters": '{"num_gpus": {"eq": 1}}'}, {"select_filters": "not json"},
    {"select_filters": '{"id": {"like": 1}}'}, {"after_token": "garbage"}, {"limit": "x"},
], ids=["computed-column", "not-json", "bad-op", "bad-token", "bad-limit"])
def test_bad_queries(api: httpx.Client, params: dict) -> None:
    response = api.get(LIST, params=params)
    assert response.status_code == 400 and response.json()["error"] in ("invalid_request", "invalid_token")
