"""Behaviours of the real Vast market the simulator models (docs/vast-behaviours.md), on the wire."""

from __future__ import annotations

import time

import httpx
import paramiko
import pytest

from tests.sim.conftest import KEY, cheapest_offer, create, direct_port, rented_host, run, show, ssh_connect, wait_for
from vast_harness.sim import SimServer


def list_rows(api: httpx.Client, **filters) -> list[dict]:
    import json

    params = {"select_filters": json.dumps({k: {"eq": v} for k, v in filters.items()})} if filters else {}
    response = api.get("/api/v1/instances/", params=params)
    assert response.status_code == 200, response.text
    return response.json()["instances"]


def test_linger_fault_overrides_the_default(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("linger:1.5")
    instance_id = create(api)["new_contract"]
    api.delete(f"/api/v0/instances/{instance_id}/")
    time.sleep(1.1)  # past the default 1 s linger
    assert show(api, instance_id)["intended_status"] == "destroyed"
    assert [r["id"] for r in list_rows(api, label="t")] == [instance_id]
    wait_for(lambda: show(api, instance_id) is None, timeout_s=3)
    assert list_rows(api, label="t") == []


def test_read_lag_hides_the_instance_from_every_read_and_delete(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("read_lag:0.8")
    instance_id = create(api)["new_contract"]
    assert show(api, instance_id) is None
    assert list_rows(api, id=instance_id) == [] and list_rows(api, label="t") == []
    lagging = api.delete(f"/api/v0/instances/{instance_id}/")
    assert lagging.status_code == 404 and lagging.json()["error"] == "not_found"
    # the 404 deleted nothing: the instance is live and appears once the lag is over
    assert [i["live"] for i in fresh.state()["instances"]] == [True]
    assert wait_for(lambda: show(api, instance_id), timeout_s=3)["id"] == instance_id
    assert [r["id"] for r in list_rows(api, label="t")] == [instance_id]


def test_create_5xx_still_creates(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("create_5xx:1:502")
    offer = cheapest_offer(api)
    response = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "x", "disk": 10, "label": "five"})
    assert response.status_code == 502 and "<html>" in response.text
    assert [r["label"] for r in list_rows(api, label="five")] == ["five"]


def test_create_hold_creates_after_the_client_gave_up(fresh: SimServer) -> None:
    fresh.set_faults("create_hold:0.8")
    with httpx.Client(base_url=fresh.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=0.3) as quick:
        offer = cheapest_offer(quick)
        with pytest.raises(httpx.ReadTimeout):
            quick.put(f"/api/v0/asks/{offer['id']}/", json={"image": "x", "disk": 10, "label": "held"})
    assert not fresh.state()["instances"]
    wait_for(lambda: fresh.state()["instances"], timeout_s=3)
    assert fresh.state()["instances"][0]["label"] == "held"


@pytest.mark.parametrize(("fault", "needle"), [("oci_fail", "OCI runtime create failed"),
                                               ("manifest_missing", "manifest for")])
def test_containers_that_cannot_start(api: httpx.Client, fresh: SimServer, fault: str, needle: str) -> None:
    fresh.set_faults(fault)
    instance_id = create(api)["new_contract"]
    time.sleep(0.2)
    row = show(api, instance_id)
    assert row["actual_status"] == "created" and needle in row["status_msg"] and row["ports"] is None


def test_exit_stops_the_container_and_bills_storage(api: httpx.Client, fresh: SimServer,
                                                    ssh_key: paramiko.PKey) -> None:
    fresh.set_faults("exit:0.4")
    instance_id, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        wait_for(lambda: show(api, instance_id)["actual_status"] == "exited", timeout_s=5)
        wait_for(lambda: not client.get_transport().is_active(), timeout_s=5)
    billed = fresh.state()["instances"][0]["billed_usd"]
    time.sleep(0.3)
    assert fresh.state()["instances"][0]["billed_usd"] > billed  # storage still bills until deleted


def test_credit_zero_stops_instances_and_storage_still_bills(api: httpx.Client, fresh: SimServer,
                                                             ssh_key: paramiko.PKey) -> None:
    fresh.set_faults("credit_zero:0.3")
    instance_id, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        wait_for(lambda: show(api, instance_id)["actual_status"] == "stopped", timeout_s=5)
        wait_for(lambda: not client.get_transport().is_active(), timeout_s=5)
    assert api.get("/api/v0/users/current/").json()["credit"] <= 0
    record = fresh.state()["instances"][0]
    assert record["live"] and record["actual_status"] == "stopped"
    offer = cheapest_offer(api)
    refused = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "x", "disk": 10})
    assert refused.status_code == 400 and "credit" in refused.json()["msg"]


def test_reprice_between_search_and_create(api: httpx.Client, fresh: SimServer) -> None:
    offer = cheapest_offer(api)
    fresh.set_faults("reprice_offer:3")
    instance_id = create(api, offer["id"])["new_contract"]
    assert show(api, instance_id)["dph_total"] > 2.5 * offer["dph_total"]


def test_a_silent_reprice_of_a_running_contract_the_defence_fault(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("reprice_silent:2:0.2")
    instance_id = create(api)["new_contract"]
    before = show(api, instance_id)["dph_total"]
    assert wait_for(lambda: show(api, instance_id)["dph_total"] > 1.9 * before, timeout_s=3)


def _pending(api: httpx.Client) -> list[dict]:
    response = api.get("/api/v0/instances/pending-price-increases/")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and body["count"] == len(body["pending_price_increases"])
    return body["pending_price_increases"]


def _billed(fresh: SimServer, instance_id: int) -> float:
    return next(i["billed_usd"] for i in fresh.state()["instances"] if i["id"] == instance_id)


def test_a_host_raising_its_price_leaves_the_running_contract_at_its_own(api: httpx.Client, fresh: SimServer) -> None:
    """The sourced model (docs/vast-behaviours.md): the offer is re-priced for new rentals; the running contract
    bills its own price and gets a pending increase with the CLI's row fields."""
    offer = cheapest_offer(api)
    fresh.set_faults("reprice:3:0.1")
    instance_id = create(api, offer["id"])["new_contract"]
    row = show(api, instance_id)
    (pending,) = wait_for(lambda: _pending(api), timeout_s=3)
    assert pending["contract_id"] == instance_id and pending["contract_end_date"] == row["end_date"]
    assert pending["new_gpu_costpersec"] == pytest.approx(3 * pending["old_gpu_costpersec"])
    assert pending["old_gpu_costpersec"] == pytest.approx(row["dph_base"] / 3600)
    assert pending["ask_end_date"] >= pending["contract_end_date"]
    for key in ("new_disk_ram_costpersec", "new_bwu_cost", "new_bwd_cost", "host_id", "created_at"):
        assert key in pending
    assert show(api, instance_id)["dph_total"] == pytest.approx(row["dph_total"])  # the contract's price holds
    t0, b0 = time.time(), _billed(fresh, instance_id)
    time.sleep(0.3)
    rate = (_billed(fresh, instance_id) - b0) / (time.time() - t0) * 3600
    assert rate < 1.5 * row["dph_total"]  # billed at the contract's price, not 3x
    api.delete(f"/api/v0/instances/{instance_id}/")
    again = create(api, offer["id"])["new_contract"]  # a new rental of the offer pays the new price
    assert show(api, again)["dph_total"] > 2.5 * offer["dph_total"]


def test_an_unanswered_increase_lets_the_contract_expire_at_its_end_date(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("contract_end:0.8;reprice:5:0.1")
    instance_id = create(api)["new_contract"]
    row = show(api, instance_id)
    assert row["end_date"] == pytest.approx(time.time() + 0.8, abs=0.5) and row["duration"] < 1.0
    wait_for(lambda: _pending(api), timeout_s=3)
    stopped = wait_for(lambda: (r := show(api, instance_id)) and r["actual_status"] == "stopped" and r, timeout_s=4)
    assert "expired" in stopped["status_msg"] and stopped["dph_total"] == pytest.approx(row["dph_total"])
    assert _pending(api) == []  # the increase went with the contract
    record = next(i for i in fresh.state()["instances"] if i["id"] == instance_id)
    assert record["live"] and record["expired"]  # storage bills on until it is destroyed


def test_an_accepted_increase_applies_from_the_end_date_and_extends_the_contract(api: httpx.Client,
                                                                                 fresh: SimServer) -> None:
    fresh.set_faults("contract_end:1.0;reprice:4:0.1")
    instance_id = create(api)["new_contract"]
    before = show(api, instance_id)
    (pending,) = wait_for(lambda: _pending(api), timeout_s=3)
    body = {"pending_price_increase_id": pending["pending_price_increase_id"]}
    assert api.put("/api/v0/instances/accept-price-increase/", json={**body, "extra": 1}).status_code == 400
    accepted = api.put("/api/v0/instances/accept-price-increase/", json=body)
    assert accepted.status_code == 200 and accepted.json() == {"success": True, "contract_id": instance_id, **body}
    assert show(api, instance_id)["dph_total"] == pytest.approx(before["dph_total"])  # not before the end date
    stale = api.put("/api/v0/instances/reject-price-increase/", json=body)
    assert stale.status_code == 404 and stale.json()["error"] == "no_pending_price_increase"
    after = wait_for(lambda: (r := show(api, instance_id)) and r["dph_total"] > 3.5 * before["dph_total"] and r,
                     timeout_s=4)
    assert after["actual_status"] == "running" and after["end_date"] == pending["ask_end_date"]


def test_a_rejected_increase_is_gone_and_the_price_holds(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("reprice:4:0.05")
    instance_id = create(api)["new_contract"]
    price = show(api, instance_id)["dph_total"]
    (pending,) = wait_for(lambda: _pending(api), timeout_s=3)
    body = {"pending_price_increase_id": pending["pending_price_increase_id"]}
    assert api.put("/api/v0/instances/reject-price-increase/", json=body).json()["contract_id"] == instance_id
    assert _pending(api) == [] and show(api, instance_id)["dph_total"] == pytest.approx(price)
    assert api.put("/api/v0/instances/accept-price-increase/", json=body).status_code == 404


def test_an_offers_duration_is_counted_from_now(api: httpx.Client, fresh: SimServer) -> None:
    offer = cheapest_offer(api)
    assert offer["duration"] == pytest.approx(offer["end_date"] - time.time(), abs=2.0)


def test_ssh_sessions_do_not_see_create_time_env(api: httpx.Client, fresh: SimServer,
                                                 ssh_key: paramiko.PKey) -> None:
    onstart = "echo \"$MY_VAR $CONTAINER_ID\" > onstart-env.txt"
    instance_id, instance = rented_host(api, ssh_key, env={"MY_VAR": "from-create"}, onstart=onstart)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        wait_for(lambda: run(client, "cat onstart-env.txt")[1].strip(), timeout_s=5)
        assert run(client, "cat onstart-env.txt")[1].strip() == f"from-create {instance_id}"
        rc, out, _ = run(client, 'echo "[$MY_VAR][$CONTAINER_API_KEY][$CONTAINER_ID]"; echo "$HOME"')
        assert out.splitlines()[0] == "[][][]" and out.splitlines()[1]
        assert run(client, "export MY_VAR=given; echo $MY_VAR")[1] == "given\n"  # what the command sets


def test_v1_list_pages_of_25_with_next_token(api: httpx.Client, fresh: SimServer) -> None:
    offers = api.post("/api/v0/bundles/", json={"limit": 40, "order": [["dph_total", "asc"]]}).json()["offers"]
    for offer in offers[:30]:
        create(api, offer["id"], label="vh-many")
    first = api.get("/api/v1/instances/", params={"limit": 100}).json()
    assert len(first["instances"]) == 25 and first["next_token"] and first["total_instances"] == 30
    second = api.get("/api/v1/instances/", params={"after_token": first["next_token"]}).json()
    assert len(second["instances"]) == 5 and second["next_token"] is None


def test_a_double_sale_is_silent_the_instance_reads_running_and_never_answers(api: httpx.Client, fresh: SimServer,
                                                                              ssh_key: paramiko.PKey) -> None:
    # SkyPilot PR 9117: both buys are accepted and "this error never propagates back"; no message says so
    fresh.set_faults("double_accept")
    instance_id = create(api)["new_contract"]
    row = wait_for(lambda: (r := show(api, instance_id)) and r["actual_status"] == "running" and r, timeout_s=3)
    assert "error" not in (row["status_msg"] or "").lower() and row["ports"]
    with pytest.raises((paramiko.SSHException, OSError, EOFError)):
        ssh_connect(direct_port(row), ssh_key)


def test_a_refused_container_key_gets_401_on_its_own_instance(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("container_key_refused")
    made = create(api)
    headers = {"Authorization": f"Bearer {made['instance_api_key']}"}
    read = api.get(f"/api/v0/instances/{made['new_contract']}/", headers=headers)
    gone = api.delete(f"/api/v0/instances/{made['new_contract']}/", headers=headers)
    assert (read.status_code, gone.status_code) == (401, 401)
    assert [i["live"] for i in fresh.state()["instances"]] == [True]


def test_v0_deprecated_answers_410_on_every_v0_instance_path(api: httpx.Client, fresh: SimServer) -> None:
    instance_id = create(api)["new_contract"]
    fresh.set_faults("v0_deprecated")
    for method in ("GET", "DELETE"):
        answer = api.request(method, f"/api/v0/instances/{instance_id}/")
        assert answer.status_code == 410 and answer.json()["error"] == "deprecated_endpoint", answer.text
    assert api.get("/api/v1/instances/").status_code == 200  # the v1 list still answers
    assert [i["live"] for i in fresh.state()["instances"]] == [True]  # the 410 deleted nothing


def test_the_legacy_v0_list_answers_as_skypilot_10517_quotes(api: httpx.Client) -> None:
    answer = api.get("/api/v0/instances/", params={"owner": "me"})
    assert answer.status_code == 410
    assert answer.json() == {"success": False, "error": "deprecated_endpoint",
                             "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead."}


def test_scheduling_holds_the_boot(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("scheduling:0.6")
    instance_id = create(api)["new_contract"]
    time.sleep(0.2)
    row = show(api, instance_id)  # as the docs spell the phase: stopped, on its way to running (no "scheduling")
    assert (row["actual_status"], row["intended_status"]) == ("stopped", "running")
    assert row["ports"] is None and "Scheduling" in row["status_msg"]
    assert wait_for(lambda: show(api, instance_id)["actual_status"] == "running", timeout_s=3)


def test_a_negative_balance_stops_at_once_then_vast_destroys_without_a_card(api: httpx.Client,
                                                                            fresh: SimServer) -> None:
    # billing.mdx: "stopped automatically" at <= $0; a grace delays deletion; deletion only without a saved card
    from vast_harness.sim.backend import NEGATIVE_GRACE_S

    fresh.set_faults("negative_balance:0.1")
    instance_id = create(api)["new_contract"]
    wait_for(lambda: show(api, instance_id)["actual_status"] == "stopped", timeout_s=2)
    assert api.get("/api/v0/users/current/").json()["credit"] < 0
    assert fresh.state()["instances"][0]["live"]  # stopped, billing storage, through the grace
    wait_for(lambda: not fresh.state()["instances"][0]["live"], timeout_s=NEGATIVE_GRACE_S + 2)
    assert api.delete(f"/api/v0/instances/{instance_id}/").json()["error"] == "no_such_instance"


def test_a_negative_balance_with_a_saved_card_stays_stopped_and_bills_storage() -> None:
    from vast_harness.sim.backend import NEGATIVE_GRACE_S

    with SimServer(seed=3, rate_scale=0.0, card_saved=True, faults="negative_balance:0.05") as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer k"}, timeout=10) as api:
        instance_id = create(api)["new_contract"]
        wait_for(lambda: show(api, instance_id)["actual_status"] == "stopped", timeout_s=2)
        billed = sim.state()["instances"][0]["billed_usd"]
        time.sleep(NEGATIVE_GRACE_S + 0.5)
        inst = sim.state()["instances"][0]
        assert inst["live"] and inst["billed_usd"] > billed  # never destroyed by Vast; storage still bills


def test_offline_bills_neither_gpu_nor_storage(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("offline:0.05")
    instance_id = create(api)["new_contract"]
    wait_for(lambda: show(api, instance_id)["actual_status"] == "offline", timeout_s=3)
    billed = fresh.state()["instances"][0]["billed_usd"]
    time.sleep(0.3)
    assert fresh.state()["instances"][0]["billed_usd"] == billed
