"""Fault plans: the SPEC grammar, the JSON form, and every fault's effect on the wire."""

from __future__ import annotations

import io
import time

import httpx
import paramiko
import pytest

from tests.sim.conftest import (
    cheapest_offer,
    create,
    direct_port,
    rented_host,
    run,
    show,
    ssh_connect,
    wait_for,
)
from vast_harness.sim import FaultPlan, FaultRule, FaultSpecError, SimServer


def test_spec_grammar() -> None:
    plan = FaultPlan.parse("429:search:3;5xx:destroy:2:503;create_timeout;ssh_refuse:2;"
                           "hang:list:1.5;5xx:show@0.25;slow_sftp:1000;seed=7")
    assert plan.seed == 7
    kinds = [(r.kind, r.endpoint, r.count, r.status, r.seconds, r.prob) for r in plan.rules]
    assert kinds == [("429", "search", 3, None, None, None), ("5xx", "destroy", 2, 503, None, None),
                     ("create_timeout", None, 1, None, None, None), ("ssh_refuse", None, 2, None, None, None),
                     ("hang", "list", 1, None, 1.5, None), ("5xx", "show", None, None, None, 0.25),
                     ("slow_sftp", None, None, None, None, None)]
    assert plan.rules[-1].bytes_per_s == 1000
    assert FaultPlan.parse("5xx:any:*").rules[0].count is None


@pytest.mark.parametrize("spec", ["nope", "429", "429:nowhere", "5xx:search:1:418", "hang:list",
                                  "429:search:x", "seed=abc", "ssh_refuse:1:2:3", "5xx:show@2"])
def test_bad_specs_name_the_item(spec: str) -> None:
    with pytest.raises(FaultSpecError, match="fault"):
        FaultPlan.parse(spec)


def test_json_form_matches_spec() -> None:
    from_json = FaultPlan.parse({"seed": 3, "rules": [{"kind": "429", "endpoint": "search", "count": 3}]})
    assert from_json.rules == [FaultRule(kind="429", endpoint="search", count=3)] and from_json.seed == 3
    assert FaultPlan.parse({"spec": "429:search:3"}).rules == from_json.rules
    with pytest.raises(FaultSpecError, match="rule #0"):
        FaultPlan.parse([{"kind": "429"}])


def test_probabilistic_rules_are_seeded() -> None:
    def draws(seed: int) -> list[bool]:
        plan = FaultPlan.parse(f"5xx:show@0.5;seed={seed}")
        return [plan.take("5xx", "show") is not None for _ in range(40)]

    assert draws(1) == draws(1) != draws(2)
    assert 5 < sum(draws(1)) < 35


def test_put_faults_over_http(fresh: SimServer) -> None:
    with httpx.Client(base_url=fresh.url) as c:
        assert c.put("/_sim/faults", json={"spec": "429:search:2"}).json()["rules"][0]["count"] == 2
        assert c.put("/_sim/faults", json=[{"kind": "5xx", "endpoint": "list"}]).status_code == 200
        bad = c.put("/_sim/faults", json=[{"kind": "teleport"}])
        assert bad.status_code == 400 and "rule #0" in bad.json()["msg"]
        assert c.get("/_sim/faults").json()["rules"][0]["kind"] == "5xx"


def test_429_burst(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("429:search:2")
    statuses = [api.post("/api/v0/bundles/", json={"limit": 1}).status_code for _ in range(3)]
    assert statuses == [429, 429, 200]


def test_5xx_is_html_and_counted(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("5xx:list:2:502;5xx:destroy:1")
    first = api.get("/api/v1/instances/")
    assert first.status_code == 502 and first.headers["content-type"].startswith("text/html")
    assert api.get("/api/v1/instances/").status_code == 502
    assert api.get("/api/v1/instances/").status_code == 200
    assert api.delete("/api/v0/instances/9/").status_code in (502, 503, 504)


def test_hang_then_answer(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("hang:show:0.3")
    started = time.monotonic()
    assert api.get("/api/v0/instances/1/").status_code == 200
    assert time.monotonic() - started >= 0.3
    with pytest.raises(httpx.ReadTimeout):
        fresh.set_faults("hang:list:1")
        api.get("/api/v1/instances/", timeout=0.2)


def test_create_timeout_still_creates(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("create_timeout")
    offer = cheapest_offer(api)
    with pytest.raises(httpx.RemoteProtocolError):
        api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "i", "label": "lost"})
    listed = api.get("/api/v1/instances/", params={"select_filters": '{"label": {"eq": "lost"}}'}).json()
    assert listed["total_instances"] == 1


def test_create_error_with_new_contract(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("create_stopped")
    response = api.put(f"/api/v0/asks/{cheapest_offer(api)['id']}/", json={"image": "i"})
    assert response.status_code == 400 and response.json()["success"] is False
    instance_id = response.json()["new_contract"]
    assert show(api, instance_id)["actual_status"] == "stopped"
    record = fresh.state()["instances"][0]
    time.sleep(0.2)
    storage_h = show(api, instance_id)["storage_total_cost"]
    assert fresh.state()["instances"][0]["billed_usd"] == pytest.approx(
        storage_h * (time.time() - record["created_at"]) / 3600, rel=0.05)


def test_underbid_creates_stopped(api: httpx.Client) -> None:
    offer = cheapest_offer(api)
    response = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "i", "price": offer["min_bid"] / 2})
    assert response.status_code == 400 and response.json()["error"] == "invalid_price"
    assert show(api, response.json()["new_contract"])["actual_status"] == "stopped"


def test_offer_taken_between_search_and_create(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("offer_taken")
    offer = cheapest_offer(api)
    response = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "i", "cancel_unavail": True})
    assert response.status_code == 410 and response.json()["error"] == "no_such_ask"
    assert fresh.state()["rented_offers"] == [{"offer_id": offer["id"], "account": -1, "instance_id": None}]
    assert fresh.state()["instances"] == []


def test_delete_fails_n_times(api: httpx.Client, fresh: SimServer) -> None:
    instance_id = create(api)["new_contract"]
    fresh.set_faults("delete_fail:2:429")
    statuses = [api.delete(f"/api/v0/instances/{instance_id}/").status_code for _ in range(3)]
    assert statuses == [429, 429, 200]
    assert not fresh.state()["instances"][0]["live"]


def test_read_lag(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("read_lag:0.4")
    instance_id = create(api)["new_contract"]
    assert show(api, instance_id) is None
    assert wait_for(lambda: show(api, instance_id), timeout_s=3)["id"] == instance_id


def test_boot_stall(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("boot_stall")
    stuck, fine = create(api)["new_contract"], create(api)["new_contract"]
    time.sleep(0.2)
    assert show(api, stuck)["actual_status"] == "loading"
    assert show(api, fine)["actual_status"] == "running"


def test_offline_mid_run(api: httpx.Client, fresh: SimServer, ssh_key: paramiko.PKey) -> None:
    fresh.set_faults("offline:0.5")
    instance_id, instance = rented_host(api, ssh_key, onstart="sleep 60")
    with ssh_connect(direct_port(instance), ssh_key) as client:
        assert run(client, "echo up")[1] == "up\n"
        wait_for(lambda: show(api, instance_id)["actual_status"] == "offline", timeout_s=5)
        wait_for(lambda: not client.get_transport().is_active(), timeout_s=5)
    assert fresh.state()["instances"][0]["live_pids"] == []
    with pytest.raises((paramiko.SSHException, OSError, EOFError)):
        ssh_connect(direct_port(instance), ssh_key, timeout_s=2).close()


def test_ssh_refuses_first_k(api: httpx.Client, fresh: SimServer, ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    fresh.set_faults("ssh_refuse:2")
    for _ in range(2):
        with pytest.raises((paramiko.SSHException, OSError, EOFError)):
            ssh_connect(direct_port(instance), ssh_key, timeout_s=3).close()
    with ssh_connect(instance["ssh_port"], ssh_key) as client:
        assert run(client, "true")[0] == 0


def test_ssh_drop_mid_step(api: httpx.Client, fresh: SimServer, ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    fresh.set_faults("ssh_drop:0.3")
    with ssh_connect(direct_port(instance), ssh_key) as client:
        _, out, _ = client.exec_command("echo start; sleep 5; echo never")
        started = time.monotonic()
        text = out.read().decode()
        assert text == "start\n" and time.monotonic() - started < 3
        assert out.channel.recv_exit_status() == -1  # no exit status: the connection died
        assert not client.get_transport().is_active()


def test_slow_sftp(api: httpx.Client, fresh: SimServer, ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    fresh.set_faults("slow_sftp:200000")
    with ssh_connect(direct_port(instance), ssh_key) as client, client.open_sftp() as sftp:
        started = time.monotonic()
        sftp.putfo(io.BytesIO(b"x" * 100_000), "slow.bin")
        assert time.monotonic() - started >= 0.45
