"""The market's shapes and states its sources disagree on (issue 33), in the simulator: the per-id read's
other shape (a one-element list, no ports), `error`, a key reset that drops what onstart appended, and a DELETE
that answers 200 and deletes nothing."""

from __future__ import annotations

import time

import httpx
import paramiko
import pytest

from tests.sim.conftest import create, direct_port, public_line, run, show, ssh_connect, wait_for
from vast_harness.sim import SimServer

LIST = "/api/v1/instances/"


def _raw_show(api: httpx.Client, instance_id: int) -> object:
    return api.get(f"/api/v0/instances/{instance_id}/").json()["instances"]


def test_show_list_answers_a_one_element_list_and_null_when_gone(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("show_list")
    instance_id = create(api)["new_contract"]
    body = _raw_show(api, instance_id)
    assert isinstance(body, list) and len(body) == 1 and body[0]["id"] == instance_id
    assert body[0]["ports"]["22/tcp"]  # the fault moves only the shape
    api.delete(f"/api/v0/instances/{instance_id}/")
    assert _raw_show(api, instance_id) is None  # not found stays null (vast-cli PR 405, base-image docstring)


def test_the_list_shape_option_carries_no_ports_but_the_v1_list_does() -> None:
    with SimServer(seed=5, rate_scale=0.0, num_offers=20, show_shape="list") as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer k"}, timeout=10) as api:
        instance_id = create(api)["new_contract"]
        body = _raw_show(api, instance_id)
        assert isinstance(body, list) and "ports" not in body[0]
        row = api.get(LIST, params={"select_filters": f'{{"id": {{"eq": {instance_id}}}}}'}).json()["instances"][0]
        assert row["ports"]["22/tcp"]


def test_show_no_ports_drops_ports_from_the_object(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("show_no_ports")
    instance_id = create(api)["new_contract"]
    row = show(api, instance_id)
    assert row is not None and row["actual_status"] == "running" and "ports" not in row


def test_error_status_is_terminal_and_bills_storage_only(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("error_status")
    instance_id = create(api)["new_contract"]
    time.sleep(0.2)
    row = show(api, instance_id)
    assert row is not None and row["actual_status"] == "error" and "unexpected EOF" in row["status_msg"]
    record = fresh.state()["instances"][0]
    assert record["billed_usd"] < record["billed_seconds"] * record["dph_total"] / 3600  # no GPU charge


def test_delete_noop_answers_200_and_deletes_nothing(api: httpx.Client, fresh: SimServer) -> None:
    fresh.set_faults("delete_noop:1")
    instance_id = create(api)["new_contract"]
    assert api.delete(f"/api/v0/instances/{instance_id}/").json() == {"success": True}
    assert fresh.state()["instances"][0]["live"] and show(api, instance_id) is not None
    assert api.delete(f"/api/v0/instances/{instance_id}/").json() == {"success": True}
    assert not fresh.state()["instances"][0]["live"]


@pytest.mark.parametrize("attached", [False, True], ids=["onstart-only", "attached"])
def test_a_key_reset_drops_the_onstart_key_and_keeps_an_attached_one(api: httpx.Client, fresh: SimServer,
                                                                       attached: bool) -> None:
    key = paramiko.ECDSAKey.generate()
    line = public_line(key)
    fresh.set_faults("key_reset:2")  # time to connect and run once before it, on a busy machine too
    instance_id = create(api, onstart=f"mkdir -p ~/.ssh; echo '{line}' >> ~/.ssh/authorized_keys")["new_contract"]
    if attached:
        assert api.post(f"/api/v0/instances/{instance_id}/ssh/", json={"ssh_key": line}).status_code == 200
    port = direct_port(wait_for(lambda: (i := show(api, instance_id)) and i["actual_status"] == "running" and i))
    client = wait_for(lambda: _try_connect(port, key), timeout_s=5)
    assert client is not None and run(client, "echo hi")[1].strip() == "hi"  # the onstart key works at first
    client.close()
    wait_for(lambda: fresh.backend.instances[instance_id].keys_reset, timeout_s=10)
    time.sleep(0.2)  # the flag is set just before authorized_keys is rewritten
    after = _try_connect(port, key)
    assert (after is not None) == attached
    if after is not None:
        after.close()


def _try_connect(port: int, key: paramiko.PKey) -> paramiko.SSHClient | None:
    try:
        return ssh_connect(port, key, timeout_s=3)
    except paramiko.AuthenticationException:
        return None


def test_the_key_reset_option_refreshes_every_instances_keys() -> None:
    key = paramiko.ECDSAKey.generate()
    line = public_line(key)
    with SimServer(seed=6, rate_scale=0.0, num_offers=20, key_reset_s=0.3) as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer k"}, timeout=10) as api:
        instance_id = create(api, onstart=f"mkdir -p ~/.ssh; echo '{line}' >> ~/.ssh/authorized_keys")["new_contract"]
        wait_for(lambda: sim.backend.instances[instance_id].keys_reset, timeout_s=5)
        port = direct_port(show(api, instance_id))
        assert _try_connect(port, key) is None  # the onstart's key went with the refresh
