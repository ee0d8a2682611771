"""A cancelled workflow, as GitHub's runner cancels it, against the action's steps (tests/harness/actionrun.py):
SIGINT to the run step's process (vast-e2e itself: the step `exec`s it), SIGTERM 7.5 s later, SIGKILL 2.5 s after
that, then the steps that run after a cancel (the reap, the summary). At boot, mid-step and mid-teardown, with
Vast's own proof timings (two rounds 10 s apart, nothing proven within 30 s of the create), a teardown whose DELETE
keeps failing, and a run cancelled late enough to prove absence itself. Judged by a standalone simulator's own
state (`/_sim/state`): nothing of the run left live, nothing billed past its caps, its DELETE sent within a second
and a half of the SIGINT.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.actionrun import CancelWhen, after, run_action, stderr_has
from tests.harness.receiver import Receiver
from tests.harness.test_action import ACTION, KEY, action_env, project

pytestmark = pytest.mark.slow  # each case waits out GitHub's 10 s and Vast's proof timings
MAX_USD, MAX_MINUTES = 0.5, 10.0
DELETE_WITHIN_S = 1.5  # SIGINT -> the run's (or its cap guard's) DELETE at the simulator
# Vast's proof interval and read-lag window kept; only the client's pacing and the boot poll are the simulator's.
OPTIONS = "--pacing-scale\n0.01\n--poll-interval\n0.2"


class Standalone:
    """`python -m vast_harness.sim` in a process of its own, as a user starts it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "vast_harness.sim", "--port", "0", "--seed", "47",
                                      "--offers", "200", "--rate-scale", "0.01", "--boot-seconds", "0.5"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.url = line.strip().rsplit(" ", 1)[-1]
        assert self.url.startswith("http://127.0.0.1:"), line

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_sim/state", timeout=10).json()

    def faults(self, spec: str | None) -> None:
        httpx.put(f"{self.url}/_sim/faults", json={"spec": spec} if spec else None, timeout=10).raise_for_status()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def standalone() -> Iterator[Standalone]:
    sim = Standalone()
    yield sim
    sim.stop()


def set_faults_when(sim: Standalone, text: str, spec: str, then: CancelWhen) -> CancelWhen:
    """Set the fault plan once the step's log holds `text`; cancel when `then` says."""
    done: list[bool] = []

    def when(proc: subprocess.Popen[bytes], log: str) -> bool:
        if not done and text in log:
            sim.faults(spec)
            done.append(True)
        return bool(done) and then(proc, log)

    return when


CASES: dict[str, dict[str, Any]] = {
    # the boot never ends (boot_stall): cancelled while the run waits for its host
    "boot": {"faults": "boot_stall:1", "command": "python train.py",
             "when": lambda sim: after(1.0, stderr_has("renting offer")), "killed": True},
    "mid-step": {"command": "sleep 600", "when": lambda sim: after(1.0, stderr_has("step run")), "killed": True},
    "mid-teardown": {"command": "sleep 1", "when": lambda sim: stderr_has("tearing down"), "killed": True,
                     "signal_after_delete": True},
    # every DELETE fails once the step runs: the run cannot delete; SIGKILL finds it mid-teardown, the API then
    # heals and the reap step deletes and proves what the run left
    "mid-teardown, DELETE failing": {
        "command": "sleep 2",
        "when": lambda sim: set_faults_when(sim, "step run", "delete_fail:*:503", stderr_has("tearing down")),
        "killed": True, "heal": True, "signal_after_delete": True, "left_live": True},
    # cancelled 35 s into the step, past the 30 s in which no proof counts, with proof rounds 0.5 s apart: the run
    # deletes and proves absence itself inside the 7.5 s, and exits 130
    "mid-step, provable in time": {"command": "sleep 600", "options": "\n--proof-interval\n0.5",
                                   "when": lambda sim: after(35.0, stderr_has("step run")), "killed": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_cancel_leaves_nothing_live_and_nothing_over_the_caps(case, standalone, tmp_path):
    spec = CASES[case]
    standalone.faults(spec.get("faults"))
    healed: list[str] = []

    def between(step_id: str) -> None:
        if spec.get("heal") and not healed:
            standalone.faults(None)  # the API answers DELETEs again: what the reap step meets
            healed.append(step_id)

    with Receiver() as rx:
        try:
            done = run_action(
                ACTION, {"command": spec["command"], "max-usd": str(MAX_USD), "max-minutes": str(MAX_MINUTES),
                         "api-url": standalone.url, "api-key": KEY, "install": "false",
                         "options": OPTIONS + spec.get("options", ""), "reap-options": "--pacing-scale\n0.01",
                         "notify": rx.url("/ok/cancel")},
                workspace=project(tmp_path), env=action_env(tmp_path), cancel_step="run",
                cancel_when=spec["when"](standalone), between_steps=between, timeout_s=240)
        finally:
            standalone.faults(None)
        bodies = rx.bodies()
    run = done.step("run")
    run_id = re.search(r"as vh-(\d{8}T\d{6}Z-[0-9a-f]+)-", run.log).group(1)  # type: ignore[union-attr]
    assert run.outcome == "cancelled" and run.signals[0][0] == "SIGINT", run.signals
    assert run.sigint_unix is not None
    if spec["killed"]:  # the proof could not finish inside GitHub's 10 s: SIGTERM, then SIGKILL
        assert [s for s, _ in run.signals] == ["SIGINT", "SIGTERM", "SIGKILL"], (run.signals, run.log[-3000:])
        assert done.outputs["exit-code"] == "unknown" and "**no verdict**" in done.summary
    else:  # it proved absence itself and exited before the SIGTERM
        assert [s for s, _ in run.signals] == ["SIGINT"] and run.exited_after_sigint_s < 7.5, run.signals
        assert done.outputs["exit-code"] == "130" and done.outputs["absence"] == "gone"
        assert "**exit 130 INTERRUPTED**" in done.summary
    # the steps that run after a cancel did: the reap deleted and proved what was left, the summary says so
    assert done.step("reap").outcome == "success", done.step("reap").log[-3000:]
    assert done.step("summary").outcome == "success", done.step("summary").log[-3000:]
    reap = json.loads(Path(done.step("setup").outputs["reap-result"]).read_text())
    assert reap["exit_code"] == 0, reap
    assert "#### Follow-up reap" in done.summary and "exit 0" in done.summary
    # the simulator's word: nothing of the run live, nothing past the caps
    state = standalone.state()
    mine = [i for i in state["instances"] if run_id in (i["label"] or "")]
    assert mine, run.log[-3000:]
    assert not [i for i in mine if i["live"]], mine
    assert sum(i["billed_usd"] for i in mine) <= MAX_USD
    assert all(i["billed_seconds"] <= MAX_MINUTES * 60 for i in mine)
    deletes = [c for c in state["calls"] if c["method"] == "DELETE" and str(mine[0]["id"]) in c["path"]]
    if spec.get("signal_after_delete"):  # the teardown had begun: its DELETE went before the SIGINT
        assert deletes and deletes[0]["time"] < run.sigint_unix + DELETE_WITHIN_S
    else:
        after_sigint = [c["time"] - run.sigint_unix for c in deletes if c["time"] >= run.sigint_unix]
        assert after_sigint and after_sigint[0] < DELETE_WITHIN_S, (after_sigint, deletes)
    if spec.get("left_live"):  # the run's DELETEs all failed: the reap's is the one that deleted it
        destroyed = mine[0]["destroyed_at"]
        assert destroyed is not None and destroyed > run.sigint_unix + 9.5, (destroyed, run.sigint_unix)
    # the receiver heard the cancel as it happened
    assert [b["event"] for b in bodies][:1] == ["rented"]
    if case != "mid-teardown" and case != "mid-teardown, DELETE failing":
        assert "interrupted" in [b["event"] for b in bodies], bodies
    if not spec["killed"]:
        assert [b["event"] for b in bodies][-1] == "proven_gone"
