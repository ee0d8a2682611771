"""The chaos suite's trust families (issue 35, vast_harness/chaos/trust.py): a suspended laptop, a `Date` hours off,
an instance of the account that is not the run's, and a run's registration file tampered with while it runs.

Every scenario runs the real guarded run in its own process against the simulator and is judged by the
simulator's record. The default suite only checks the draws and the judge; each (kind, variant) is one slow test,
picked by name (`-m slow -k 'suspend and step'`), and the whole family runs in the full chaos suite.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from vast_harness import chaos
from vast_harness.chaos import trust
from vast_harness.chaos.account import VARIANTS, AccountOutcome, AccountPlan
from vast_harness.chaos.engine import SCALE
from vast_harness.chaos.suite import ACCOUNT_OFFSET
from vast_harness.sim import SimServer

CASES = [(kind, variant) for kind, variants in VARIANTS.items() if kind in trust.TRUST_SCENARIOS
         for variant in variants]


def test_every_trust_kind_is_an_account_kind_and_its_variants_cycle_with_the_seed():
    assert set(VARIANTS) <= set(chaos.ACCOUNT_KINDS)
    assert set(trust.TRUST_SCENARIOS) | set(chaos.UPLOAD_SCENARIOS) == set(VARIANTS) - {"secret_artifact"}  # the others: test_chaos_upload, test_chaos_artifacts
    drawn = {(p.kind, p.variant) for p in (chaos.draw_account(s) for s in range(400))}
    assert set(CASES) <= drawn, set(CASES) - drawn
    assert chaos.draw_account(123) == chaos.draw_account(123)
    # the full suite's consecutive account seeds draw every kind once
    suite = [chaos.draw_account(chaos.scenario_seed(1, ACCOUNT_OFFSET + k)) for k in range(len(chaos.ACCOUNT_KINDS))]
    assert {p.kind for p in suite} == set(chaos.ACCOUNT_KINDS)


def test_the_new_violation_kinds_are_counted():
    report = chaos.SuiteReport(suite_seed=0, account=[AccountOutcome(
        seed=1, plan=AccountPlan(seed=1, kind="decoy", variant="unlabelled"),
        violations=[chaos.Violation(kind="not_ours", detail="the decoy 7 was deleted"),
                    chaos.Violation(kind="under_reported", detail="$0.1 reported, $0.4 billed")])])
    assert report.violations()["not_ours"] == 1 and report.violations()["under_reported"] == 1


def _run(kind: str, variant: str, **kwargs: bool) -> AccountOutcome:
    plan = AccountPlan(seed=35, kind=kind, variant=variant)  # type: ignore[arg-type]
    if not kwargs:
        return chaos.run_account(plan)
    outcome = AccountOutcome(seed=plan.seed, plan=plan)
    with tempfile.TemporaryDirectory() as tmp, \
            SimServer(seed=plan.seed, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as sim:
        trust.TRUST_SCENARIOS[kind](plan, sim, Path(tmp), outcome, **kwargs)  # type: ignore[operator]
    return outcome


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_trust_scenario_holds_every_invariant(kind: str, variant: str):
    outcome = _run(kind, variant)
    assert not outcome.violations, (outcome.summary(), [v.detail[:500] for v in outcome.violations],
                                    outcome.log[-3000:])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_suspend_family_catches_a_run_whose_clock_stops_in_a_suspend():
    """The judge can fail: the same suspend, with the run's own clock losing the stopped seconds (as a control
    plane on CLOCK_MONOTONIC did), is a pass over the cap reporting a fraction of the bill."""
    outcome = _run("suspend", "step", blind=True)
    kinds = {v.kind for v in outcome.violations}
    # usually exit 0 "passed" (exit_mismatch as well); on a loaded machine the blind clock may still reach
    # the cap later (an exit 6, late or not): whatever the exit, the judge must see the bill under-reported
    assert "under_reported" in kinds, outcome.violations


def test_the_decoy_judge_catches_a_deleted_decoy():
    from vast_harness.chaos.engine import decoy_violations

    row = {"id": 7, "label": "prod-database", "live": True}
    assert decoy_violations({"calls": [], "instances": [row]}, 7) == []
    deleted = {"calls": [{"method": "DELETE", "path": "/api/v0/instances/7/"}], "instances": [row]}
    assert [v.kind for v in decoy_violations(deleted, 7)] == ["not_ours"]
    assert [v.kind for v in decoy_violations({"calls": [], "instances": [row | {"live": False}]}, 7)] == ["not_ours"]
    # ended by Vast itself (the account's balance past its grace: every instance goes, the decoy's too) is no
    # act of the run's (suite seed 1000006: negative_balance with wrong_contract)
    assert decoy_violations({"calls": [], "instances": [row | {"live": False, "destroyed_by": "vast"}]}, 7) == []
    assert [v.kind for v in decoy_violations({"calls": [], "instances": [row | {"live": False, "destroyed_by": "api"}]},
                                             7)] == ["not_ours"]
    # another id's DELETE is not the decoy's
    assert decoy_violations({"calls": [{"method": "DELETE", "path": "/api/v0/instances/77/"}], "instances": [row]},
                            7) == []


def test_the_in_process_family_draws_the_trust_faults():
    plans = [chaos.draw_scenario(chaos.scenario_seed(1, i)) for i in range(200)]
    drawn = {kind for p in plans for kind in p.fault_kinds}
    assert {"date_ahead", "date_behind", "started_earlier", "wrong_contract"} <= drawn
    assert any("date_ahead" in p.faults and "date_behind" in p.faults for p in plans)  # a sign that flips


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [3, 4, 5])  # the decoy is labelled prod-database, unlabelled, another run's vh-
def test_an_in_process_run_whose_create_names_the_decoy_leaves_it_alone(tmp_path: Path, seed: int):
    plan = chaos.ScenarioPlan(seed=seed, faults=f"wrong_contract:1;date_ahead:7200:4;date_behind:7200;seed={seed}",
                              cap_mode="generous", max_minutes=1.0, boot_retries=1, proof_interval_s=0.05,
                              step_sleep_s=0.1, step_rc=0, steps=1)
    outcome = chaos.run_scenario(plan, tmp_path)
    assert outcome.faults_fired.get("wrong_contract") == 1, outcome.faults_fired
    assert not outcome.violations, ([v.detail[:500] for v in outcome.violations], outcome.log[-2000:])


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_decoy_named_by_the_create_is_left_alone_when_its_reads_hang_until_the_cap(tmp_path: Path, seed: int):
    """The boot's per-id reads of the named instance hang until the cap: no read compared its label before the
    teardown and the cap guard. Neither deletes it; the run's own instance (found by its label) goes by the cap."""
    plan = chaos.ScenarioPlan(seed=seed, faults=f"wrong_contract:1;hang:show:1.8:*;seed={seed}", cap_mode="time",
                              max_minutes=3.5 / 60, boot_retries=0, proof_interval_s=0.05, step_sleep_s=6.0,
                              step_rc=0, steps=1)
    outcome = chaos.run_scenario(plan, tmp_path)
    assert outcome.faults_fired.get("wrong_contract") == 1, outcome.faults_fired
    assert outcome.exit_code == 6 and not outcome.violations, ([v.detail[:500] for v in outcome.violations],
                                                               outcome.log[-2000:])
