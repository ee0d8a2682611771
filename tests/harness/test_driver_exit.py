"""A passing run exits 0 on a qualified driver and exactly 4 on any other (README, "Exit codes"), and nothing
else decides between the two: the driver list is the seed here, so the expected code is known in advance."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import DriverPolicy, QualifiedDriver, Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-driver-key"
SIM_OPTIONS = dict(seed=17, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
OK = [Step(name="ok", run="true", timeout_s=30)]
# Every branch the simulator draws from, from its first build: whatever offer is cheapest, its driver qualifies.
ALL_DRIVERS = DriverPolicy(drivers=[QualifiedDriver(branch=b, min_version=f"{b}.0.0") for b in range(300, 1000)])
NO_DRIVERS = DriverPolicy(drivers=[])


def _spec(sim: SimServer, tmp_path: Path, *, any_driver: bool) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              any_driver=any_driver), environ={})
    prof = spec.profile.model_copy(update={"steps": OK})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
        ).with_timings(teardown_margin_s=2.0)


def _run(sim: SimServer, spec: RunSpec, drivers: DriverPolicy) -> tuple[GuardedRun, int, dict]:
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, drivers, Output(quiet=True))
        result = run.execute()
    record = json.loads((run.ev.dir / "harness-result.json").read_text())
    return run, result.exit_code, record


def test_a_pass_on_an_unqualified_driver_is_exactly_4(clean_sim, tmp_path: Path) -> None:
    run, code, record = _run(clean_sim, _spec(clean_sim, tmp_path, any_driver=True), NO_DRIVERS)
    assert code == 4, record.get("message")
    assert record["exit_code"] == 4 and record["driver_qualified"] is False


def test_the_same_pass_on_a_qualified_driver_is_exactly_0(clean_sim, tmp_path: Path) -> None:
    run, code, record = _run(clean_sim, _spec(clean_sim, tmp_path, any_driver=True), ALL_DRIVERS)
    assert code == 0, record.get("message")
    assert record["driver_qualified"] is True


def test_without_any_driver_only_qualified_offers_are_rented_so_a_pass_is_0(clean_sim, tmp_path: Path) -> None:
    policy = load_driver_policy()
    run, code, record = _run(clean_sim, _spec(clean_sim, tmp_path, any_driver=False), policy)
    assert code == 0, record.get("message")
    assert run.state.candidate is not None and policy.qualifies(run.state.candidate.offer.driver_version)
