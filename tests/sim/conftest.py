"""Fixtures: one simulator per test module (state reset per test), clients, SSH keys and helpers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import paramiko
import pytest

from vast_harness.sim import SimServer

KEY = "test-key-a"
OTHER_KEY = "test-key-b"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    """A module's simulator: no rate limits (tests of limits build their own), instant boot."""
    with SimServer(seed=11, rate_scale=0.0, num_offers=120) as server:
        yield server


@pytest.fixture
def fresh(sim: SimServer) -> SimServer:
    sim.reset()
    return sim


@pytest.fixture
def api(fresh: SimServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fresh.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as client:
        yield client


@pytest.fixture
def other_api(fresh: SimServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fresh.url, headers={"Authorization": f"Bearer {OTHER_KEY}"},
                      timeout=10) as client:
        yield client


@pytest.fixture(scope="session")
def ssh_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def public_line(key: paramiko.PKey, comment: str = "test") -> str:
    return f"{key.get_name()} {key.get_base64()} {comment}"


def cheapest_offer(client: httpx.Client, **filters: Any) -> dict[str, Any]:
    body = {"order": [["dph_total", "asc"]], "limit": 1, **filters}
    response = client.post("/api/v0/bundles/", json=body)
    assert response.status_code == 200, response.text
    return response.json()["offers"][0]


def create(client: httpx.Client, offer_id: int | None = None, **body: Any) -> dict[str, Any]:
    """Rent (the cheapest offer unless given) and return the create response body."""
    if offer_id is None:
        offer_id = cheapest_offer(client)["id"]
    payload = {"image": "pytorch/pytorch:2.4.0", "disk": 10, "label": "t", **body}
    response = client.put(f"/api/v0/asks/{offer_id}/", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def show(client: httpx.Client, instance_id: int) -> dict[str, Any] | None:
    response = client.get(f"/api/v0/instances/{instance_id}/")
    assert response.status_code == 200, response.text
    return response.json()["instances"]


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def direct_port(instance: dict[str, Any]) -> int:
    return int(instance["ports"]["22/tcp"][0]["HostPort"])


def ssh_connect(port: int, key: paramiko.PKey, timeout_s: float = 10.0) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=port, username="root", pkey=key, look_for_keys=False,
                   allow_agent=False, timeout=timeout_s, banner_timeout=timeout_s, auth_timeout=timeout_s)
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str, str]:
    _, out, err = client.exec_command(command, timeout=30)
    stdout, stderr = out.read().decode(), err.read().decode()
    return out.channel.recv_exit_status(), stdout, stderr


def rented_host(api: httpx.Client, key: paramiko.PKey, **body: Any) -> tuple[int, dict[str, Any]]:
    """Register `key` on the account, rent, and return (instance id, running instance)."""
    assert api.post("/api/v0/ssh/", json={"ssh_key": public_line(key)}).status_code == 200
    instance_id = create(api, **body)["new_contract"]
    instance = wait_for(lambda: (i := show(api, instance_id)) and i["actual_status"] == "running" and i)
    return instance_id, instance
