"""The seeded market and the search over it (pure functions, plus a few calls over HTTP)."""

from __future__ import annotations

import random

import httpx
import pytest

from vast_harness.sim import market
from vast_harness.sim.errors import SimHTTPError

NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def offers() -> list[dict]:
    return market.generate_offers(random.Random(5), 2000, NOW)


def test_same_seed_same_market() -> None:
    a = market.generate_offers(random.Random(1), 50, NOW)
    assert a == market.generate_offers(random.Random(1), 50, NOW)
    assert a != market.generate_offers(random.Random(2), 50, NOW)


def test_market_is_realistic(offers: list[dict]) -> None:
    names = {o["gpu_name"] for o in offers}
    assert {"RTX 5090", "RTX 4090", "H100 SXM", "H200", "A100 SXM4", "L40S"} <= names
    assert {o["num_gpus"] for o in offers} == {1, 2, 4, 8}
    assert len({o["id"] for o in offers}) == len(offers)
    assert len({o["machine_id"] for o in offers}) == len(offers)
    assert any(o["cpu_cores"] is None for o in offers)
    assert all(o["geolocation"].split(", ")[-1].isupper() for o in offers)
    assert all(o["driver_vers"] == market.pack_driver(o["driver_version"]) for o in offers)
    for o in offers:
        if o["gpu_name"] == "RTX 5090":
            assert int(o["driver_version"].split(".")[0]) >= 570  # Blackwell needs the 570 branch


def test_about_half_the_drivers_are_qualified(offers: list[dict]) -> None:
    qualified = market.load_qualified()
    assert qualified, "profiles/qualified-drivers.toml should be readable"
    share = sum(market.is_qualified(o["driver_version"], qualified) for o in offers) / len(offers)
    assert 0.35 < share < 0.65


def test_is_qualified_uses_packed_comparison() -> None:
    qualified = [(570, market.pack_driver("570.86.15"))]
    assert market.is_qualified("570.133.07", qualified)
    assert not market.is_qualified("570.86.10", qualified)
    assert not market.is_qualified("575.57.08", qualified)


def test_default_filters_apply_when_absent(offers: list[dict]) -> None:
    found = market.search(offers, {"limit": 5000})
    assert found and all(o["verified"] and o["rentable"] and not o["rented"] for o in found)
    everything = market.search(offers, {"limit": 5000, "verified": {"in": [True, False]},
                                        "rentable": {"in": [True, False]}})
    assert len(everything) == len(offers)


@pytest.mark.parametrize(("op", "value", "check"), [
    ("eq", 4, lambda v: v == 4), ("neq", 1, lambda v: v != 1), ("gt", 2, lambda v: v > 2),
    ("gte", 2, lambda v: v >= 2), ("lt", 4, lambda v: v < 4), ("lte", 2, lambda v: v <= 2),
    ("in", [1, 8], lambda v: v in (1, 8)), ("notin", [1, 8], lambda v: v not in (1, 8)),
])
def test_operators(offers: list[dict], op: str, value: object, check) -> None:
    found = market.search(offers, {"num_gpus": {op: value}, "limit": 5000})
    assert found and all(check(o["num_gpus"]) for o in found)
    complement = market.search(offers, {"limit": 5000})
    assert len(found) == sum(check(o["num_gpus"]) for o in complement)


def test_cli_conventions(offers: list[dict]) -> None:
    by_underscore = market.search(offers, {"gpu_name": {"eq": "RTX_4090"}, "limit": 5000})
    assert by_underscore and {o["gpu_name"] for o in by_underscore} == {"RTX 4090"}
    by_country = market.search(offers, {"geolocation": {"in": ["US"]}, "limit": 5000})
    assert by_country and all(o["geolocation"].endswith(", US") for o in by_country)
    new_drivers = market.search(offers, {"driver_version": {"gte": "575.0.0"}, "limit": 5000})
    assert new_drivers and all(o["driver_vers"] >= 575_000_000 for o in new_drivers)
    by_alias = market.search(offers, {"cuda_vers": {"gte": 12.8}, "limit": 5000})
    assert by_alias and all(o["cuda_max_good"] >= 12.8 for o in by_alias)


def test_allocated_storage_reprices_dph_total(offers: list[dict]) -> None:
    found = market.search(offers, {"allocated_storage": 100, "limit": 20})
    for o in found:
        assert o["dph_total"] == pytest.approx(o["dph_base"] + 100 * o["storage_cost"] / 720)
        assert o["search"]["totalHour"] == pytest.approx(o["dph_total"])
    default = market.search(offers, {"limit": 1})[0]
    assert default["dph_total"] == pytest.approx(default["dph_base"] + 8 * default["storage_cost"] / 720)
    bid = market.search(offers, {"type": "bid", "limit": 1})[0]
    assert bid["is_bid"] and bid["dph_total"] == pytest.approx(bid["min_bid"] + 8 * bid["storage_cost"] / 720)


def test_order_and_limit(offers: list[dict]) -> None:
    found = market.search(offers, {"order": [["num_gpus", "desc"], ["dph_total", "asc"]], "limit": 300})
    assert len(found) == 300
    keys = [(-o["num_gpus"], o["dph_total"]) for o in found]
    assert keys == sorted(keys)
    assert [o["rn"] for o in found] == list(range(1, 301))
    assert len(market.search(offers, {})) == market.DEFAULT_LIMIT


@pytest.mark.parametrize("body", [
    {"bogus_field": {"eq": 1}}, {"num_gpus": {"approx": 1}}, {"num_gpus": 1}, {"num_gpus": {"in": 1}},
    {"type": "spot"}, {"order": [["nope", "asc"]]}, {"limit": "many"},
], ids=["unknown-field", "unknown-op", "bare-value", "in-needs-list", "bad-type", "bad-order", "bad-limit"])
def test_bad_queries_are_invalid_args(offers: list[dict], body: dict) -> None:
    with pytest.raises(SimHTTPError) as err:
        market.search(offers, body)
    assert err.value.status == 400 and err.value.body["error"] == "invalid_args"


def test_rented_offer_leaves_the_market(api: httpx.Client) -> None:
    from tests.sim.conftest import cheapest_offer, create

    offer = cheapest_offer(api)
    instance_id = create(api, offer["id"])["new_contract"]
    ids = {o["id"] for o in api.post("/api/v0/bundles/", json={"limit": 5000}).json()["offers"]}
    assert offer["id"] not in ids
    rented = api.post("/api/v0/bundles/", json={"limit": 5000, "rented": {"eq": True},
                                                "rentable": {"eq": False}}).json()["offers"]
    assert [o["id"] for o in rented] == [offer["id"]]
    assert api.delete(f"/api/v0/instances/{instance_id}/").status_code == 200
    ids = {o["id"] for o in api.post("/api/v0/bundles/", json={"limit": 5000}).json()["offers"]}
    assert offer["id"] in ids  # the machine is free again
