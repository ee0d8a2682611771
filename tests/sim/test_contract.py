"""Every simulator response validates against the Vast OpenAPI files, and carries their fields."""

from __future__ import annotations

import json

import httpx
import paramiko
import pytest
from jsonschema import ValidationError

from tests.sim import openapi
from tests.sim.conftest import cheapest_offer, create, public_line
from vast_harness.sim import SimServer

BUNDLES, ASKS = "/api/v0/bundles/", "/api/v0/asks/{id}/"
INSTANCE, LIST = "/api/v0/instances/{id}/", "/api/v1/instances/"


def _check(response: httpx.Response, name: str, path: str, method: str, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    openapi.validate(response.json(), name, path, method, status)


def test_validator_rejects_a_wrong_shape() -> None:
    with pytest.raises(ValidationError):
        openapi.validate({"offers": {"not": "a list"}}, "search_offers.yaml", BUNDLES, "post", 200)
    with pytest.raises(ValidationError):
        openapi.validate({"instances": {"ports": [22]}}, "show_instance.yaml", INSTANCE, "get", 200)


def test_search_offers__schema_and_every_documented_field(api: httpx.Client) -> None:
    response = api.post(BUNDLES, json={"limit": 5})
    _check(response, "search_offers.yaml", BUNDLES, "post", 200)
    doc = openapi._document("search_offers.yaml")
    example = doc["paths"][BUNDLES]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    for offer in response.json()["offers"]:
        assert set(example["offers"]) <= set(offer), set(example["offers"]) - set(offer)
        for key in ("id", "machine_id", "host_id", "num_gpus", "gpu_ram", "compute_cap", "direct_port_count"):
            assert isinstance(offer[key], int), key
        assert isinstance(offer["driver_version"], str) and offer["driver_version"].count(".") == 2


def test_search_errors(api: httpx.Client, fresh: SimServer) -> None:
    _check(api.post(BUNDLES, content=b"{not json"), "search_offers.yaml", BUNDLES, "post", 400)
    assert api.post(BUNDLES, content=b"{oops").json()["msg"] == "Invalid json body"
    with httpx.Client(base_url=fresh.url, headers={"Authorization": "Bearer x"}) as bad:
        assert bad.post(BUNDLES, json={}).status_code == 200  # open mode: any key is an account
    with SimServer(api_keys=["only"], num_offers=5) as closed, httpx.Client(base_url=closed.url) as c:
        response = c.post(BUNDLES, json={}, headers={"Authorization": "Bearer wrong"})
        _check(response, "search_offers.yaml", BUNDLES, "post", 404)
        assert c.post(BUNDLES, json={}).status_code == 200  # unauthenticated search works (gpuhunt)


def test_create_show_list_destroy__schemas(api: httpx.Client) -> None:
    offer = cheapest_offer(api)
    response = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "img", "disk": 10, "onstart": "true",
                                                              "env": {"A": "1", "-p 8000:8000": "1"}})
    _check(response, "create_instance.yaml", ASKS, "put", 200)
    instance_id = response.json()["new_contract"]
    shown = api.get(f"/api/v0/instances/{instance_id}/")
    _check(shown, "show_instance.yaml", INSTANCE, "get", 200)
    listed = api.get(LIST)
    _check(listed, "show_instances.yaml", LIST, "get", 200)
    documented = openapi.response_schema("show_instances.yaml", LIST, "get", 200)
    fields = documented["properties"]["instances"]["items"]["properties"]
    row = listed.json()["instances"][0]
    assert set(fields) - {"cpu_cores"} <= set(row), set(fields) - set(row)
    assert row["extra_env"] == [["A", "1"], ["-p 8000:8000", "1"]]
    destroyed = api.delete(f"/api/v0/instances/{instance_id}/")
    _check(destroyed, "destroy_instance.yaml", INSTANCE, "delete", 200)
    _check(api.delete(f"/api/v0/instances/{instance_id}/"), "destroy_instance.yaml", INSTANCE, "delete", 404)
    _check(api.get(f"/api/v0/instances/{instance_id}/"), "show_instance.yaml", INSTANCE, "get", 200)


@pytest.mark.parametrize(("body", "status"), [
    ({"disk": 10}, 400),  # no image
    ({"image": "i", "disk": 2}, 400),  # below the 8 GB minimum
    ({"image": "i", "label": "x" * 300}, 400),
    ({"image": "i", "onstart": "x" * 5000}, 400),
    ({"image": "i", "price": 500}, 400),
], ids=["no-image", "small-disk", "long-label", "long-onstart", "price-out-of-range"])
def test_create_bad_args(api: httpx.Client, body: dict, status: int) -> None:
    offer = cheapest_offer(api)
    response = api.put(f"/api/v0/asks/{offer['id']}/", json=body)
    _check(response, "create_instance.yaml", ASKS, "put", status)
    assert response.json()["error"] == "invalid_args"


def test_create_unknown_and_rented_offers(api: httpx.Client) -> None:
    _check(api.put("/api/v0/asks/1/", json={"image": "i"}), "create_instance.yaml", ASKS, "put", 404)
    offer = cheapest_offer(api)
    create(api, offer["id"])
    again = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "i", "cancel_unavail": True})
    _check(again, "create_instance.yaml", ASKS, "put", 410)
    assert again.json()["error"] == "no_such_ask"


def test_user_and_ssh_keys__schemas(api: httpx.Client, ssh_key: paramiko.PKey) -> None:
    _check(api.get("/api/v0/users/current/"), "show_user.yaml", "/api/v0/users/current/", "get", 200)
    added = api.post("/api/v0/ssh/", json={"ssh_key": public_line(ssh_key)})
    _check(added, "create_ssh_key.yaml", "/api/v0/ssh/", "post", 200)
    _check(api.post("/api/v0/ssh/", json={}), "create_ssh_key.yaml", "/api/v0/ssh/", "post", 400)
    _check(api.get("/api/v0/ssh/"), "show_ssh_keys.yaml", "/api/v0/ssh/", "get", 200)
    instance_id = create(api)["new_contract"]
    path = "/api/v0/instances/{id}/ssh/"
    attached = api.post(f"/api/v0/instances/{instance_id}/ssh/", json={"ssh_key": public_line(ssh_key)})
    _check(attached, "attach_ssh.yaml", path, "post", 200)
    shown = api.get(f"/api/v0/instances/{instance_id}/ssh/")
    _check(shown, "show_instance_ssh_keys.yaml", "/api/v0/instances/{instance_id}/ssh/", "get", 200)
    assert json.loads(shown.json()["ssh_keys"])[0]["public_key"].split()[1] == ssh_key.get_base64()
    _check(api.post("/api/v0/instances/1/ssh/", json={"ssh_key": public_line(ssh_key)}),
           "attach_ssh.yaml", path, "post", 404)


def test_auth_errors__schemas(fresh: SimServer) -> None:
    with httpx.Client(base_url=fresh.url) as anonymous:
        _check(anonymous.get("/api/v0/instances/5/"), "show_instance.yaml", INSTANCE, "get", 401)
        _check(anonymous.get(LIST), "show_instances.yaml", LIST, "get", 401)
        _check(anonymous.get("/api/v0/users/current/"), "show_user.yaml", "/api/v0/users/current/", "get", 401)
        _check(anonymous.put("/api/v0/asks/5/", json={"image": "i"}), "create_instance.yaml", ASKS, "put", 401)


def test_list_bad_query__schema(api: httpx.Client) -> None:
    for params in ({"select_filters": '{"dph_total": {"lt": 1}}'}, {"after_token": "!!!"},
                   {"order_by": '[{"col":"nope"}]'}):
        _check(api.get(LIST, params=params), "show_instances.yaml", LIST, "get", 400)
