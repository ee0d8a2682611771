"""A suspended laptop: the host, the API and the bill keep counting while this machine sleeps, so must the caps.

Linux's CLOCK_MONOTONIC (Python's `time.monotonic`) stops during a suspend; every deadline and the meter run on
`vast_harness.clock.now_s`, which does not. A real suspend cannot be had in a test: the behavioural test hands
the run a clock that jumps as a resume does, and the conventions below keep every control-plane module on the
suspend-aware clock.
"""

from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from vast_harness import clock
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.01
KEY = "sim-suspend-key"
SIM_OPTIONS = dict(seed=151, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's")
def test_the_clock_counts_a_suspend_on_linux():
    assert clock.SUSPEND_AWARE
    assert abs(clock.now_s() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 0.05


def test_no_control_plane_module_measures_time_on_a_clock_that_stops_in_a_suspend():
    """`time.monotonic` (and `perf_counter`) stop while the machine sleeps: a deadline or a bill measured on
    them passes a cap the host, the API and the bill did not stop for. The simulator keeps its own clock."""
    bad = []
    for path in sorted((ROOT / "vast_harness").rglob("*.py")):
        if "sim" in path.relative_to(ROOT / "vast_harness").parts or path.name == "clock.py":
            continue
        if path.relative_to(ROOT).as_posix() == "vast_harness/chaos/child.py":
            continue  # it measures nothing: it makes time.monotonic lose a simulated suspend, as the kernel does
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("monotonic", "perf_counter") and \
                    isinstance(node.value, ast.Name) and node.value.id == "time":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad


def test_a_run_resumed_past_its_cap_deletes_at_once_and_is_exit_6(sim: SimServer, tmp_path: Path):
    """A lid closed 150 s into a step of a run capped at 7 s: on resume the cap has passed. The DELETE goes at
    once, the run is exit 6 (never 0), and its accrued dollars count the suspended time as the bill does."""
    suspended_s = 150.0
    jump = threading.Event()

    def laptop_clock() -> float:
        return clock.now_s() + (suspended_s if jump.is_set() else 0.0)

    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="long", run="sleep 30", timeout_s=60)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "caps": spec.caps.model_copy(update={"max_minutes": 0.12})}
                           ).with_timings(teardown_margin_s=2.0)
    resumed_at: list[float] = []

    def suspend_during_the_step() -> None:
        while not any(s["live"] for s in sim.state()["instances"]):
            time.sleep(0.05)
        time.sleep(1.5)  # into the step
        resumed_at.append(time.time())
        jump.set()

    threading.Thread(target=suspend_during_the_step, daemon=True).start()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), clock=laptop_clock)
        result = run.execute()
    assert result.exit_code == 6, result.message
    assert resumed_at, "the run ended before the suspend"
    deletes = [c for c in sim.state()["calls"] if c["method"] == "DELETE"]
    assert deletes and deletes[0]["time"] - resumed_at[0] < 2.0, "the DELETE did not go at once on resume"
    record = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert record["accrued_usd"] > 0 and record["over_cap"], record["over_cap"]
    inst = next(i for i in sim.state()["instances"] if i["id"] == run.created[0].instance_id)
    assert not inst["live"]
    assert record["accrued_usd"] >= inst["billed_usd"]  # the meter counted the suspended time too


class _StoppedDuringDelete(VastClient):
    """A client whose process is stopped (SIGSTOP, a closed lid) while its first DELETE is on the wire: every
    clock the run reads jumps by `stopped_s` before the answer arrives, as it does on SIGCONT."""

    def __init__(self, *args: object, jump: threading.Event, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.jump = jump

    def destroy_instance(self, instance_id: int, **kwargs: object):  # type: ignore[no-untyped-def,override]
        self.jump.set()
        return super().destroy_instance(instance_id, **kwargs)  # type: ignore[arg-type]


def test_a_run_stopped_while_its_delete_is_pending_proves_absence_on_resume(sim: SimServer, tmp_path: Path):
    """Red team round 5: a run SIGSTOPped for longer than a teardown's budget while its DELETE was pending (a
    minute, far under the cap) woke to a budget already spent: its proof reads were "not sent, its phase's
    deadline has passed" and it exited 3, "may still bill", for an instance the API had deleted. Seconds the
    process did not run are not seconds the API failed to answer: on resume it proves absence (exit 0)."""
    stopped_s = 100.0  # past the teardown budget (60 s + 8 proof intervals), far under the 10 min cap
    jump = threading.Event()

    def stopped_clock() -> float:
        return clock.now_s() + (stopped_s if jump.is_set() else 0.0)

    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="short", run="echo hi", timeout_s=60)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "caps": spec.caps.model_copy(update={"max_minutes": 10.0})})
    with _StoppedDuringDelete(KEY, base_url=sim.url, pacing_scale=SCALE, jump=jump) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), clock=stopped_clock)
        result = run.execute()
    assert jump.is_set(), "no DELETE was sent"
    assert result.exit_code == 0, result.message
    (teardown,) = run.teardowns
    assert teardown.verdict == "gone"
    inst = next(i for i in sim.state()["instances"] if i["id"] == run.created[0].instance_id)
    assert not inst["live"] and inst["destroyed_by"] == "api"
    record = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert record["absence"]["verdict"] == "gone" and record["exit_code"] == 0


def test_the_freeze_watch_counts_only_the_seconds_the_process_did_not_run():
    from vast_harness.clock import FreezeWatch

    jumped_s = [0.0]
    with FreezeWatch(lambda: clock.now_s() + jumped_s[0]) as watch:
        time.sleep(0.6)  # ticking: no gap
        assert watch.frozen_s() == 0.0
        jumped_s[0] = 30.0  # stopped 30 s: seen at once, before the watch's next look
        assert 29.0 < watch.frozen_s() < 30.5
        time.sleep(0.6)  # after its next looks the gap is counted once, not again
        assert 29.0 < watch.frozen_s() < 30.5
