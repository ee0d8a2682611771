"""Per-endpoint, per-identity rate limits and their documented 429 bodies (scaled down for speed)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.sim import openapi
from tests.sim.conftest import cheapest_offer
from vast_harness.sim import SimServer
from vast_harness.sim.ratelimit import RateLimiter

SCALE = 0.05  # create 4.5 s -> 0.225 s; search 60 s window -> 3 s


@pytest.fixture(scope="module")
def limited() -> Iterator[SimServer]:
    with SimServer(seed=4, rate_scale=SCALE, num_offers=40) as server:
        yield server


@pytest.fixture
def client(limited: SimServer) -> Iterator[httpx.Client]:
    limited.reset()
    with httpx.Client(base_url=limited.url, headers={"Authorization": "Bearer rl"}) as c:
        yield c


def test_create_interval_and_body(client: httpx.Client, limited: SimServer) -> None:
    offers = client.post("/api/v0/bundles/", json={"limit": 3}).json()["offers"]
    assert client.put(f"/api/v0/asks/{offers[0]['id']}/", json={"image": "i"}).status_code == 200
    second = client.put(f"/api/v0/asks/{offers[1]['id']}/", json={"image": "i"})
    assert second.status_code == 429
    assert second.json() == {"detail": "API requests too frequent endpoint threshold=4.5"}
    assert "retry-after" not in second.headers
    openapi.validate(second.json(), "create_instance.yaml", "/api/v0/asks/{id}/", "put", 429)
    time.sleep(4.5 * SCALE + 0.02)
    assert client.put(f"/api/v0/asks/{offers[1]['id']}/", json={"image": "i"}).status_code == 200
    assert len(limited.state()["instances"]) == 2  # the limited call created nothing


@pytest.mark.parametrize(("path", "method", "threshold", "spec"), [
    ("/api/v0/instances/1/", "GET", 2.0, "show_instance.yaml"),
    ("/api/v1/instances/", "GET", 1.0, "show_instances.yaml"),
])
def test_read_intervals(client: httpx.Client, path: str, method: str, threshold: float, spec: str) -> None:
    assert client.request(method, path).status_code == 200
    limited = client.request(method, path)
    assert limited.status_code == 429
    assert limited.json() == {"detail": f"API requests too frequent endpoint threshold={threshold}"}
    time.sleep(threshold * SCALE + 0.02)
    assert client.request(method, path).status_code == 200


def test_destroy_body(client: httpx.Client) -> None:
    assert client.delete("/api/v0/instances/1/").status_code == 404  # accepted call, counted
    limited = client.delete("/api/v0/instances/1/")
    assert limited.status_code == 429
    assert limited.json() == {"success": False, "error": "rate_limit_exceeded",
                              "msg": "API requests too frequent endpoint threshold=3.0"}


def test_ssh_key_post_interval(client: httpx.Client) -> None:
    body = {"ssh_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"}
    assert client.post("/api/v0/ssh/", json=body).status_code == 200
    assert client.post("/api/v0/ssh/", json=body).status_code == 429
    assert client.get("/api/v0/ssh/").status_code == 200  # GET is not limited


def test_search_window_is_plain_text(client: httpx.Client) -> None:
    statuses = [client.post("/api/v0/bundles/", json={"limit": 1}).status_code for _ in range(11)]
    assert statuses == [200] * 10 + [429]
    limited = client.post("/api/v0/bundles/", json={"limit": 1})
    assert limited.text == "API requests too frequent"
    assert limited.headers["content-type"].startswith("text/plain")


def test_limits_are_per_identity() -> None:
    with SimServer(rate_scale=1.0, num_offers=5) as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer one"}) as one, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer two"}) as two:
        assert one.get("/api/v1/instances/").status_code == 200
        assert two.get("/api/v1/instances/").status_code == 200
        assert one.get("/api/v1/instances/").status_code == 429  # 1.0 s interval, unscaled


def test_limits_are_per_endpoint(client: httpx.Client) -> None:
    assert client.get("/api/v1/instances/").status_code == 200
    assert client.get("/api/v0/instances/1/").status_code == 200
    assert cheapest_offer(client)


def test_scale_zero_disables() -> None:
    limiter = RateLimiter(0)
    assert all(limiter.allow("create", "a", 0.0) for _ in range(50))
    with pytest.raises(ValueError):
        RateLimiter(-1)


def test_limiter_counts_only_accepted_calls() -> None:
    limiter = RateLimiter(1.0)
    assert limiter.allow("destroy", "a", 100.0)
    assert not limiter.allow("destroy", "a", 102.9)
    assert limiter.allow("destroy", "a", 103.0)  # 3.0 s after the last accepted call
