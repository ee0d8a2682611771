"""The chaos suite: hundreds of seeded fault compositions against the guarded run, behind a fault proxy, and
kill -9 of the CLI.

The big test runs the whole suite (>= 300 scenarios: in-process, network, kill -9) and asserts the invariants
held in every scenario; it is one of the slow tests (`-m slow`, which CI runs; VH_CHAOS_FULL=0 swaps it for
the smaller in-process + kill -9 suite). The small ones show the checks can fail (a leak and a false absence
are caught when planted) and hold four rules at small scale: a host dropping mid-upload is exit 1, not a
crash; no exit 5 once something was rented; a cap reached while booting is the cap's exit code; a step's
timing excludes the absence proof. A known violation is pinned as a strict xfail with a matching
KNOWN_ISSUES entry in vast_harness/chaos/judge.py until it is fixed.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from vast_harness import chaos
from vast_harness.chaos import (
    FAULT_KINDS,
    ScenarioOutcome,
    ScenarioPlan,
    Violation,
    check_scenario,
)
from vast_harness.chaos.network import NET_KINDS, NetOutcome, NetPlan, judge_net
from vast_harness.chaos.suite import KILL9_OFFSET, NET_OFFSET
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.state.ledger import Ledger

SUITE_SCENARIOS = 200
SUITE_KILL9 = 4  # one per trigger window: intent (create stalled), created, a random time, delete_ack
SUITE_WALL_LIMIT_S = 300.0
SUITE_NET = 110  # with the 200 above and the kill -9 runs: >= 300 scenarios per CI run
SUITE_ACCOUNT = 13  # one per account kind (chaos/account.py, trust.py, upload.py, artifacts.py): runs, reaps, state dirs, clocks
SUITE_SEED = int(os.environ.get("VH_CHAOS_SEED", "1"))
FULL = os.environ.get("VH_CHAOS_FULL", "1") != "0"  # on by default (CI); VH_CHAOS_FULL=0 skips it locally
FULL_WALL_LIMIT_S = 600.0


def plan(faults: str, **overrides) -> ScenarioPlan:
    fields = {"seed": 11, "faults": faults, "cap_mode": "generous", "max_minutes": 1.0, "boot_retries": 0,
              "proof_interval_s": 0.05, "step_sleep_s": 0.1, "step_rc": 0, "steps": 1} | overrides
    return ScenarioPlan(**fields)


# ----------------------------------------------------------------------------------------------- draws


def test_a_scenario_is_a_pure_function_of_its_seed():
    assert chaos.draw_scenario(1234) == chaos.draw_scenario(1234)
    assert chaos.draw_kill9(77) == chaos.draw_kill9(77)
    assert chaos.draw_net(77) == chaos.draw_net(77)
    assert chaos.draw_net(77, ("ssh_stall",)).kind == "ssh_stall"
    assert len({chaos.draw_scenario(s).faults for s in range(50)}) > 40


def test_draws_cover_every_fault_kind_cap_mode_and_kill_window():
    plans = [chaos.draw_scenario(chaos.scenario_seed(SUITE_SEED, i)) for i in range(SUITE_SCENARIOS)]
    net_plans = [chaos.draw_net(chaos.scenario_seed(SUITE_SEED, NET_OFFSET + i)) for i in range(SUITE_NET)]
    assert {p.kind for p in net_plans} == set(NET_KINDS), set(NET_KINDS) - {p.kind for p in net_plans}
    drawn = Counter(kind for p in plans for kind in p.fault_kinds)
    assert set(drawn) == set(FAULT_KINDS), set(FAULT_KINDS) - set(drawn)
    assert {p.cap_mode for p in plans} == {"generous", "time", "cost", "unrentable"}
    assert any(p.faults.startswith("seed=") for p in plans)  # some scenarios are fault-free
    assert any("delete_fail:*" in p.faults for p in plans)  # some must end in exit 3 and a reap
    kills = [chaos.draw_kill9(chaos.scenario_seed(SUITE_SEED, KILL9_OFFSET + k)) for k in range(SUITE_KILL9)]
    assert {k.trigger for k in kills} == set(chaos.TRIGGERS)


# ---------------------------------------------------------------------------------- the checks can fail


def _state(live: bool, destroyed_at: float | None, billed_usd: float = 0.001) -> dict:
    inst = {"id": 42, "label": "vh-x", "live": live, "destroyed_at": destroyed_at, "billed_usd": billed_usd}
    return {"now": 2000.0, "instances": [inst], "faults": {"rules": []}}


def test_a_live_instance_after_exit_1_is_a_leak_and_a_premature_gone_is_a_false_absence(tmp_path: Path):
    p = plan("offline:0.1:1")  # a fault: exit 1 is a plausible outcome, so only the planted faults count
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, state_dir=tmp_path), environ={})
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("r", "created", "vh-x", instance_id=42)
    entry = ledger.append("r", "absence", "vh-x", instance_id=42, verdict="gone")
    out = ScenarioOutcome(seed=1, plan=p, exit_code=1)
    found = {v.kind for v in check_scenario(p, spec, out, _state(True, None), None, entry.t_unix - 1)}
    assert {"leak", "false_absence"} <= found
    # destroyed after the claim: still a false absence; destroyed before it: clean
    late = check_scenario(p, spec, out, _state(False, entry.t_unix + 5), None, entry.t_unix - 1)
    assert [v.kind for v in late] == ["false_absence"]
    assert check_scenario(p, spec, out, _state(False, entry.t_unix - 0.5), None, entry.t_unix - 1) == []
    # harness-result.json claiming gone for an instance destroyed after the run finished: false absence
    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-1" / "harness-result.json").write_text(json.dumps(
        {"finished_unix": entry.t_unix, "absence": {"per_instance": {"42": "gone"}}}))
    late = check_scenario(p, spec, out, _state(False, entry.t_unix - 0.5 + 1.0), None, entry.t_unix - 1)
    assert [v.detail.split(" says")[0] for v in late] == ["ledger", "run-1"]


def test_a_bill_over_the_cap_and_an_exit_that_does_not_fit_are_reported(tmp_path: Path):
    p = plan("seed=1", step_rc=7)
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, state_dir=tmp_path, max_usd=0.01),
                   environ={})
    out = ScenarioOutcome(seed=1, plan=p, exit_code=0)
    found = {v.kind for v in check_scenario(p, spec, out, _state(False, 1000.5, billed_usd=0.02), None, 1000.0)}
    assert found == {"over_cap_usd", "exit_mismatch"}
    # exit 3 says "may still bill": a live instance the ledger does not name is still a leak
    out3 = ScenarioOutcome(seed=1, plan=p, exit_code=3)
    assert {v.kind for v in check_scenario(p, spec, out3, _state(True, None), None, 1000.0)} == {"leak"}


def test_a_price_raised_unseen_is_under_reported(tmp_path):
    """Suite seed 1000119 (the closed known issue price-change-under-report): the offer's price is raised
    tenfold before the create and the per-id reads are refused, so the run ends (exit 1) before any per-id read
    shows the billed price; the absence proof's list rows show it, and the meter bills it from the create."""
    outcome = chaos.run_scenario(plan("v0_deprecated:3;reprice_offer:10.0;seed=1000119"), tmp_path)
    assert not [v for v in outcome.violations if v.kind == "under_reported"], outcome.violations


def test_known_issues_are_classified_and_not_counted(monkeypatch):
    # The mechanism is tested with a planted entry.
    monkeypatch.setitem(chaos.KNOWN_ISSUES, "exit5-after-renting",
                        ("exit_mismatch", re.compile(r"^exit 5 \(nothing rented\)")))
    v = chaos.classify(Violation(kind="exit_mismatch", detail="exit 5 (nothing rented) but the simulator has 1"))
    assert v.known == "exit5-after-renting"
    report = chaos.SuiteReport(suite_seed=0, scenarios=[ScenarioOutcome(seed=1, plan=plan("seed=1"), violations=[v])])
    assert sum(report.violations().values()) == 0 and report.known() == {"exit5-after-renting": 1}
    assert chaos.classify(Violation(kind="leak", detail="exit 5 (nothing rented)")).known is None


# -------------------------------------------------------------------------------------------- the suite


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(FULL, reason="VH_CHAOS_FULL=1: test_full_chaos_suite_holds_every_invariant covers this")
def test_chaos_suite_holds_every_invariant():
    report = chaos.run_suite(SUITE_SCENARIOS, SUITE_SEED, workers=6, kill9=SUITE_KILL9,
                             selection=chaos.select_kinds("sim,kill9"))
    bad = [(o.seed, v.kind, v.detail[:300]) for o in [*report.scenarios, *report.kill9] for v in o.violations
           if v.known is None]
    assert not bad, f"replay with `python scripts/bench/chaos.py --replay SEED`: {bad}"
    assert len(report.scenarios) == SUITE_SCENARIOS and report.wall_s < SUITE_WALL_LIMIT_S
    codes = report.exit_codes()
    assert codes["6"] > 0 and codes["3"] > 0 and codes["5"] > 0 and codes["1"] > 0
    assert codes["0"] + codes["4"] > SUITE_SCENARIOS // 5
    fired = {kind for kind, (_, hit, _) in report.faults().items() if hit}
    assert fired == set(FAULT_KINDS), set(FAULT_KINDS) - fired
    # a "time" kill may land before the create on a loaded machine: nothing rented is then a valid outcome
    assert all(k.killed and k.reap_rc == 0 and (k.instances >= 1 or k.plan.trigger == "time")
               for k in report.kill9), \
        [k.summary() for k in report.kill9]


@pytest.mark.slow
@pytest.mark.timeout(660)
@pytest.mark.skipif(not FULL, reason="VH_CHAOS_FULL=0: the full chaos suite is skipped")
def test_full_chaos_suite_holds_every_invariant():
    report = chaos.run_suite(SUITE_SCENARIOS, SUITE_SEED, workers=6, kill9=SUITE_KILL9, net=SUITE_NET,
                             account=SUITE_ACCOUNT)
    bad = [(o.seed, getattr(o.plan, "kind", "sim"), v.kind, v.detail[:700])
           for o in [*report.scenarios, *report.network, *report.kill9, *report.account] for v in o.violations
           if v.known is None]
    assert not bad, f"replay with `python scripts/bench/chaos.py --replay[-net|-account] SEED`: {bad}"
    total = len(report.scenarios) + len(report.network) + len(report.kill9) + len(report.account)
    assert {o.plan.kind for o in report.account} == set(chaos.ACCOUNT_KINDS)
    assert total >= 300 and report.wall_s < FULL_WALL_LIMIT_S, (total, report.wall_s)
    skipped = [o.plan.kind for o in report.network if o.skipped]
    assert not skipped or not os.environ.get("CI"), f"skipped in CI: {skipped}"
    assert {o.plan.kind for o in report.network} == set(NET_KINDS)


# ------------------------------------------------------------------------------- network scenarios


def test_kinds_select_families_and_network_kinds_by_name_or_pattern():
    assert chaos.select_kinds(None) == chaos.Selection()
    sel = chaos.select_kinds("odd_*,kill9")
    assert not sel.sim and sel.kill9 and sel.net == tuple(k for k in NET_KINDS if k.startswith("odd_"))
    assert chaos.select_kinds("net").net == tuple(NET_KINDS)
    with pytest.raises(ValueError, match="matches nothing"):
        chaos.select_kinds("linger")


def _net(kind: str = "api_stall", **overrides) -> NetPlan:
    fields = {"seed": 5, "kind": kind, "net": "stall:show:1;seed=5", "faults": "seed=5", "steps": ["true"],
              "cap_mode": "generous", "max_minutes": 0.35, "boot_retries": 0, "proof_interval_s": 0.05} | overrides
    return NetPlan(**fields)


def test_the_network_judge_catches_tracebacks_leaks_and_a_zero_over_the_cap(tmp_path: Path):
    p = _net()
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, state_dir=tmp_path, max_usd=0.01,
                              max_minutes=0.35), environ={})
    out = NetOutcome(seed=5, plan=p, exit_code=1, max_usd=0.01)
    judge_net(p, spec, out, _state(True, None), 1999.0, "ok\nTraceback (most recent call last):\n  boom", None)
    assert {v.kind for v in out.violations} == {"leak", "traceback"}
    out0 = NetOutcome(seed=5, plan=p, exit_code=0, max_usd=0.01)
    judge_net(p, spec, out0, _state(False, 1999.5, billed_usd=0.02), 1999.0, "passed", None)
    assert {v.kind for v in out0.violations} == {"over_cap_usd", "exit_mismatch"}
    # a clean run that does not pass, and a full disk that rents anyway, do not fit either
    clean = NetOutcome(seed=5, plan=_net("clean", net="seed=5"), exit_code=1, max_usd=0.01)
    judge_net(clean.plan, spec, clean, _state(False, 1999.5), 1999.0, "", None)
    assert [v.kind for v in clean.violations] == ["exit_mismatch"]
    disk = NetOutcome(seed=5, plan=_net("disk_full_start", disk="full_at_start"), exit_code=1, max_usd=0.01)
    judge_net(disk.plan, spec, disk, _state(False, 1999.5), 1999.0, "", None)
    assert [v.kind for v in disk.violations] == ["exit_mismatch"]


def test_an_exit_0_with_the_ledger_naming_an_unproven_instance_is_a_mismatch(tmp_path: Path):
    from vast_harness.chaos.network import _unproven, net_exit_mismatches

    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, state_dir=tmp_path, max_usd=0.01,
                              max_minutes=0.35), environ={})
    out = NetOutcome(seed=5, plan=_net(), exit_code=0, max_usd=0.01)
    assert _unproven(tmp_path) == (set(), set()) and net_exit_mismatches(out.plan, out, spec) == []
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("r", "created", "vh-x", instance_id=42)
    ledger.append("r", "intent", "vh-y", offer_id=1)
    assert _unproven(tmp_path) == ({42}, {"vh-y"})  # instance ids, not the ledger's entries
    assert net_exit_mismatches(out.plan, out, spec) == [
        "exit 0 with the ledger naming unproven instances [42] ['vh-y']"]


def test_the_child_counts_the_time_cap_from_the_runs_own_clock(tmp_path: Path, monkeypatch):
    # The judge measures an instance's life from the t0 the child writes, so t0 must be the run's own cap clock,
    # not a time taken before the API client was built: on a loaded machine that can be seconds earlier, and a
    # run that kept its cap would be judged over it.
    import time

    from vast_harness.chaos import child, engine
    from vast_harness.run.runner import GuardedRun, HarnessResult

    real_client = child._client

    def slow_client(url: str):
        time.sleep(0.4)
        return real_client(url)

    seen: dict[str, float] = {}

    def execute(run: GuardedRun) -> HarnessResult:
        seen["t0_unix"] = time.time() - (run.meter.now() - run.meter.t0)
        return HarnessResult(run_id=run.run_id, exit_code=0)

    monkeypatch.setattr(child, "_client", slow_client)
    monkeypatch.setattr(GuardedRun, "execute", execute)
    job = engine.ChildJob(api_url="http://127.0.0.1:9", evidence_dir=tmp_path / "ev", steps=[], max_minutes=1.0,
                          max_usd=None, boot_retries=0, proof_interval_s=0.1, t0_file=tmp_path / "t0",
                          state_dir=tmp_path / "state")
    (tmp_path / "job.json").write_text(job.model_dump_json())
    assert child.main([str(tmp_path / "job.json")]) == 0
    assert abs(float((tmp_path / "t0").read_text()) - seen["t0_unix"]) < 0.05


@pytest.mark.slow
def test_a_clean_run_behind_the_proxy_passes_and_a_stalled_one_is_killed_as_a_hang():
    clean = chaos.run_net(_net("clean", net="seed=5"))
    assert clean.exit_code == 0 and not clean.violations, (clean.violations, clean.log[-1500:])
    assert clean.instances == 1 and not clean.live_at_exit
    # the child is stopped by SIGSTOP-free means: a budget shorter than any run makes it a hang
    from vast_harness.chaos import network

    hung = network.NetOutcome(seed=5, plan=_net("clean", net="seed=5"))
    original = network.budget_s
    try:
        network.budget_s = lambda plan: 0.5
        hung = chaos.run_net(_net("clean", net="seed=5"))
    finally:
        network.budget_s = original
    assert hung.exit_code is None and [v.kind for v in hung.violations][:1] == ["hang"]


# ------------------------------------------------- the four rules above, each in one small scenario


@pytest.mark.slow
def test_host_dropping_mid_upload_exits_1_not_an_exception(tmp_path: Path):
    # A ~60 kB bundle at 10 kB/s: the upload lasts ~6 s; every host goes offline 1 s after it came up (on a
    # loaded machine the SSH connect itself can outlast that second: then a retry host drops mid-upload).
    outcome = chaos.run_scenario(plan("slow_sftp:10000:*;offline:1.0:*"), tmp_path)
    assert not outcome.violations and outcome.exit_code == 1, (outcome.violations, outcome.log[-1500:])


@pytest.mark.slow
def test_no_offer_left_after_a_boot_failure_is_not_exit_5(tmp_path: Path):
    # The cap fits only the cheapest offer; it never boots; no other offer fits the cap.
    outcome = chaos.run_scenario(plan("boot_stall:1", cap_mode="cost", max_minutes=0.5, usd_factor=1.0001,
                                      boot_retries=1), tmp_path)
    assert outcome.instances == 1
    assert outcome.exit_code == 1 and not outcome.violations, (outcome.exit_code, outcome.violations)


def test_time_cap_reached_while_booting_exits_6(tmp_path: Path):
    # Cap deadline 1 s after start (3 s cap, 2 s teardown margin); the host never boots (3 s boot timeout).
    outcome = chaos.run_scenario(plan("boot_stall:1", cap_mode="time", max_minutes=3.0 / 60), tmp_path)
    assert outcome.instances == 1
    assert outcome.exit_code == 6 and not outcome.violations, (outcome.exit_code, outcome.message)


@pytest.mark.slow
def test_delete_ack_timing_does_not_include_the_absence_proof(tmp_path: Path):
    outcome = chaos.run_scenario(plan("seed=3", proof_interval_s=1.0), tmp_path)
    assert outcome.exit_code == 0, outcome.message
    result = json.loads(next((tmp_path / "ev").glob("*/harness-result.json")).read_text())
    assert result["timings"]["delete_ack_after_last_step_s"] < 1.0  # the proof alone takes >= 1 s
