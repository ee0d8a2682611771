"""Fixtures for the harness tests: a fake clock, a respx router with everything mocked, a client factory, and
one simulator per module (shaped by the module's SIM_OPTIONS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import respx

from vast_harness.sim import SimServer
from vast_harness.vast.client import VastClient

# Distinctive, so a leak into any URL, message or log is unambiguous when searched for.
VAST_TEST_KEY = "vhkey-SECRET-7f3a9c1e5b2d4680"
VAST_TEST_BASE = "https://vast.test"


class FakeClock:
    """A monotonic clock that only moves when something sleeps: pacing and retries run instantly."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self.sleeps_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.now_s += max(0.0, seconds)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def vast_api() -> Iterator[respx.MockRouter]:
    """Every request must hit a declared route, and every declared route must be hit."""
    with respx.mock(base_url=VAST_TEST_BASE, assert_all_called=True, assert_all_mocked=True) as router:
        yield router


@pytest.fixture
def make_client(fake_clock: FakeClock) -> Iterator[Callable[..., VastClient]]:
    made: list[VastClient] = []

    def make(**overrides: Any) -> VastClient:
        kwargs: dict[str, Any] = {"base_url": VAST_TEST_BASE, "sleep": fake_clock.sleep, "clock": fake_clock}
        kwargs.update(overrides)
        client = VastClient(VAST_TEST_KEY, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., VastClient]) -> VastClient:
    return make_client()


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest) -> Iterator[SimServer]:
    """The module's simulator: SimServer(**SIM_OPTIONS) of the test module (seed, rate scale, boot, offers)."""
    with SimServer(**request.module.SIM_OPTIONS) as server:
        yield server


@pytest.fixture
def clean_sim(sim: SimServer) -> Iterator[SimServer]:
    """No faults before or after the test, and any credit a test charged (credit_zero) handed back."""
    sim.set_faults(None)
    yield sim
    sim.set_faults(None)
    for account in sim.backend.accounts.values():
        account.charged_usd = 0.0
