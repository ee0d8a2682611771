"""Create -> boot -> show -> destroy, auth, the legacy paths and the call log."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.sim.conftest import KEY, cheapest_offer, create, show, wait_for
from vast_harness.sim import SimServer


@pytest.fixture(scope="module")
def slow_boot() -> Iterator[SimServer]:
    with SimServer(seed=2, boot_seconds=1.0, rate_scale=0.0, num_offers=40) as server:
        yield server


def test_boot_walks_null_loading_running(slow_boot: SimServer) -> None:
    with httpx.Client(base_url=slow_boot.url, headers={"Authorization": "Bearer boot"}) as api:
        instance_id = create(api)["new_contract"]
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (not seen or seen[-1] != "running"):
            status = show(api, instance_id)["actual_status"]
            if not seen or seen[-1] != status:
                seen.append(status)
            time.sleep(0.05)
        assert seen == [None, "loading", "running"]  # no invented "scheduling" (the documented enum has none)
        instance = show(api, instance_id)
        assert instance["ports"]["22/tcp"][0]["HostPort"].isdigit()
        assert instance["public_ipaddr"] != instance["public_ipaddr"].strip() == "127.0.0.1"
        assert isinstance(instance["ssh_port"], int) and instance["ssh_host"] == "127.0.0.1"
        assert api.delete(f"/api/v0/instances/{instance_id}/").json() == {"success": True}


def test_ports_absent_until_running(slow_boot: SimServer) -> None:
    with httpx.Client(base_url=slow_boot.url, headers={"Authorization": "Bearer ports"}) as api:
        instance_id = create(api)["new_contract"]
        assert show(api, instance_id)["ports"] is None
        api.delete(f"/api/v0/instances/{instance_id}/")


def test_destroy_lingers_then_null_then_404(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("linger:1.0")  # the default is the sourced shape, null at once (vast-cli PR 405)
    instance_id = create(api)["new_contract"]
    assert show(api, instance_id)["actual_status"] == "running"
    assert api.delete(f"/api/v0/instances/{instance_id}/").json() == {"success": True}
    # the lingering-row option (vast-cli's tests model this shape)
    row = show(api, instance_id)
    assert (row["actual_status"], row["intended_status"], row["cur_state"]) == ("destroyed", "destroyed", "unloaded")
    listed = api.get("/api/v1/instances/").json()["instances"]
    assert [r["intended_status"] for r in listed] == ["destroyed"]
    gone = api.delete(f"/api/v0/instances/{instance_id}/")
    assert gone.status_code == 404
    assert gone.json() == {"success": False, "error": "no_such_instance", "msg": "Instance not found."}
    assert not [i for i in fresh.state()["instances"] if i["live"]]  # lingering is not billing
    wait_for(lambda: show(api, instance_id) is None, timeout_s=5)
    assert api.get("/api/v1/instances/").json()["total_instances"] == 0
    assert api.delete(f"/api/v0/instances/{instance_id}/").status_code == 404


def test_accounts_are_isolated(api: httpx.Client, other_api: httpx.Client) -> None:
    instance_id = create(api)["new_contract"]
    assert show(other_api, instance_id) is None
    assert other_api.delete(f"/api/v0/instances/{instance_id}/").status_code == 404
    assert other_api.get("/api/v1/instances/").json()["total_instances"] == 0
    assert show(api, instance_id) is not None


def test_container_key_reaches_only_its_own_instance(api: httpx.Client, fresh: SimServer) -> None:
    first, second = create(api), create(api)
    headers = {"Authorization": f"Bearer {first['instance_api_key']}"}
    with httpx.Client(base_url=fresh.url, headers=headers) as container:
        assert container.get(f"/api/v0/instances/{first['new_contract']}/").json()["instances"]["id"] \
            == first["new_contract"]
        for response in (container.get(f"/api/v0/instances/{second['new_contract']}/"),
                         container.delete(f"/api/v0/instances/{second['new_contract']}/"),
                         container.get("/api/v1/instances/"), container.get("/api/v0/users/current/"),
                         container.put(f"/api/v0/asks/{cheapest_offer(api)['id']}/", json={"image": "i"})):
            assert response.status_code == 403, response.request.url
        assert container.delete(f"/api/v0/instances/{first['new_contract']}/").json() == {"success": True}
    assert show(api, second["new_contract"]) is not None


def test_unknown_key_with_allowlist() -> None:
    with SimServer(api_keys=["good"], num_offers=5, rate_scale=0) as sim, httpx.Client(base_url=sim.url) as c:
        assert c.get("/api/v1/instances/", headers={"Authorization": "Bearer bad"}).status_code == 401
        assert c.get("/api/v1/instances/", headers={"Authorization": "Bearer good"}).status_code == 200
        assert "good" not in str(sim.state()) and "bad" not in str(sim.state()["calls"])


def test_key_in_url_works_but_is_flagged(fresh: SimServer) -> None:
    with httpx.Client(base_url=fresh.url) as c:
        response = c.get("/api/v1/instances/", params={"api_key": "url-key"})
        assert response.status_code == 200
    calls = fresh.state()["calls"]
    assert calls[-1]["key_in_url"] is True and calls[-1]["path"] == "/api/v1/instances/"
    assert "url-key" not in str(fresh.state())


def test_header_calls_are_not_flagged(api: httpx.Client, fresh: SimServer) -> None:
    api.get("/api/v1/instances/")
    assert [c["key_in_url"] for c in fresh.state()["calls"]] == [False]


def test_legacy_list_is_gone(api: httpx.Client) -> None:
    response = api.get("/api/v0/instances/", params={"owner": "me"})
    assert response.status_code == 410
    assert response.json()["error"] == "deprecated_endpoint"


def test_bad_json_body(api: httpx.Client) -> None:
    response = api.put(f"/api/v0/asks/{cheapest_offer(api)['id']}/", content=b"{nope")
    assert response.status_code == 400
    assert response.json() == {"success": False, "error": "invalid_request", "msg": "Invalid json body"}


def test_user_has_credit_and_balance(api: httpx.Client, fresh: SimServer) -> None:
    user = api.get("/api/v0/users/current/").json()
    assert user["credit"] == user["balance"] == pytest.approx(100.0)
    assert KEY not in str(user)


def test_target_state_stopped(api: httpx.Client) -> None:
    instance_id = create(api, target_state="stopped")["new_contract"]
    instance = show(api, instance_id)
    assert instance["actual_status"] == "stopped"
    assert instance["intended_status"] == instance["cur_state"] == instance["next_state"] == "stopped"


def test_stop_leaves_live_instances_visible() -> None:
    sim = SimServer(num_offers=10, rate_scale=0).start()
    try:
        with httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer s"}) as api:
            instance_id = create(api, onstart="sleep 300")["new_contract"]
            wait_for(lambda: sim.state()["instances"][0]["live_pids"])
    finally:
        sim.stop()
    record = sim.state()["instances"][0]
    assert record["id"] == instance_id and record["live"] and record["destroyed_at"] is None
    assert record["live_pids"] == []  # the host's processes were killed all the same
