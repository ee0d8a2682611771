"""A run whose main thread never comes back (an evidence disk that does not answer) still ends: the cap guard
deletes at the cap, and a bound after that the run proves the deleted instances absent itself, says so on the
console and exits (6, or 3 when not proven), instead of living on with a heartbeat about a deleted host.

Judged by the simulator's record: the instance destroyed, nothing of the run left live.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.evidence.run import RunEvidence
from vast_harness.run import stuck
from vast_harness.run.runner import GuardedRun
from vast_harness.run.tools import snapshot
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-stuck-key"
SIM_OPTIONS = dict(seed=1010, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")
TEARDOWN_BUDGET_S = 2.0


@pytest.mark.slow  # a 9 s cap, then the stuck grace
def test_a_run_stuck_on_a_hung_evidence_disk_ends_a_bound_after_the_guards_delete(sim: SimServer, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    hung, release = threading.Event(), threading.Event()
    real_guarded = RunEvidence.guarded

    def guarded(self: RunEvidence, what: str, fn):  # type: ignore[no-untyped-def]
        if what == "steps.tsv":  # the first write after the step: the disk stops answering, for good
            hung.set()
            release.wait()
        return real_guarded(self, what, fn)

    exits: list[int] = []
    exited = threading.Event()

    def exit_process(code: int) -> None:  # os._exit in a real run
        exits.append(code)
        exited.set()

    monkeypatch.setattr(RunEvidence, "guarded", guarded)
    monkeypatch.setattr(stuck, "exit_process", exit_process)
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="a", run="echo hi", timeout_s=30)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "caps": spec.caps.model_copy(update={"max_minutes": 0.15})}
                           ).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        run.state.teardown_budget_s = TEARDOWN_BUDGET_S
        worker = threading.Thread(target=run.execute, daemon=True)
        worker.start()
        try:
            assert hung.wait(60), "the run never reached the hung write"
            assert exited.wait(12.0 + 4 * TEARDOWN_BUDGET_S + stuck.STUCK_GRACE_S + 10.0), "the stuck run never ended"
            assert exits == [6]
            ours = [i for i in sim.state()["instances"] if i["label"] in run.tools.book.labels()]
            assert ours and not any(i["live"] for i in ours)
            view = snapshot(run.tools)
            assert "still running" not in (view.phase or "") and "cap guard" in (view.phase or ""), view.phase
            at_exit = run.accrued_usd
            time.sleep(0.5)
            assert run.accrued_usd == at_exit  # billing ended at the guard's acknowledged DELETE
        finally:
            release.set()  # the disk answers again: the run's own thread finishes while the client is open
            worker.join(60)
