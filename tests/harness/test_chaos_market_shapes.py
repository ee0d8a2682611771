"""The chaos faults of the market's shapes and states (issue 33), one small scenario each (run by name, not the
whole suite): judged by the simulator's own record with the suite's checks (no leak, no false "gone", nothing
over the cap) and an exit that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

import vast_harness.chaos as chaos
from tests.harness.test_chaos import plan


@pytest.mark.parametrize(("faults", "overrides", "exit_code"), [
    ("show_list:*", {}, 0),  # the per-id read as a one-element list (Vast's QA tool's shape)
    ("show_list:*;show_no_ports:*", {}, 0),  # ...and without ports: they come from the v1 list by id
    ("show_no_ports:*", {}, 0),
    ("error_status:1", {"boot_retries": 1}, 0),  # fail fast, prove gone, the next offer runs
    ("error_status:1", {"boot_retries": 0}, 1),
    ("key_reset:0.0:1", {"step_sleep_s": 0.5, "steps": 2}, 0),  # the attached key is in the set Vast keeps
    ("delete_noop:1", {}, 0),  # the DELETE 200 that deleted nothing: the proof sees it, DELETE again
    ("delete_noop:2;show_list:*", {}, 0),
], ids=["list", "list-no-ports", "no-ports", "error-retry", "error-no-retry", "key-reset", "delete-noop",
        "delete-noop-twice-list"])
def test_issue_33_faults_hold_every_invariant(tmp_path: Path, faults: str, overrides: dict, exit_code: int) -> None:
    outcome = chaos.run_scenario(plan(f"{faults};seed=5", **overrides), tmp_path)
    assert not outcome.violations, (outcome.violations, outcome.log[-2000:])
    assert outcome.exit_code == exit_code, (outcome.exit_code, outcome.message, outcome.log[-2000:])
    for kind in plan(faults).fault_kinds:  # each fault really happened in the run
        assert outcome.faults_fired.get(kind), (kind, outcome.faults_fired)
