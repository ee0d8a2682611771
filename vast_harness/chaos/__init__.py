"""The chaos suite: a test engine for the harness, outside the simulator (which depends on nothing here).

    engine    in-process scenarios: seeded compositions of simulator faults and caps, one guarded run each
    network   network scenarios: the harness in its own process behind `netproxy`'s fault proxy
    netproxy  the seeded HTTP and TCP fault proxy in front of the simulator
    child     one guarded run, or the real CLI, in a process of its own (the network and account families)
    kill9     the real CLI SIGKILLed at a drawn moment, then `reap` from another directory
    account   several runs, reaps, state dirs and clocks on one account
    trust     issue 35's account kinds: a suspend, a Date skew, a decoy instance, a tampered registration
    upload    issue 43's account kinds: a key file and credential files in the workdir, a daemonising command
    artifacts issue 43's account kind: a secret inside a binary artifact
    judge     the invariants, decided from the simulator's own record
    suite     every family from one seed, concurrently; the report and its JSON summary

`python scripts/bench/chaos.py --help` runs it; `--replay SEED` (`--replay-net`, `--replay-kill9`) reruns one.
"""

from vast_harness.chaos.account import ACCOUNT_KINDS, AccountOutcome, AccountPlan, draw_account, run_account
from vast_harness.chaos.artifacts import run_secret_artifact  # registers issue 43's account kind
from vast_harness.chaos.engine import (
    FAULT_KINDS,
    SIM_RULES,
    ScenarioOutcome,
    ScenarioPlan,
    check_scenario,
    draw_scenario,
    exit_mismatches,
    run_bounded,
    run_scenario,
    scenario_seed,
)
from vast_harness.chaos.judge import KNOWN_ISSUES, VIOLATION_KINDS, Violation, classify, false_absences
from vast_harness.chaos.kill9 import TRIGGERS, Kill9Outcome, Kill9Plan, draw_kill9, run_kill9
from vast_harness.chaos.network import NET_KINDS, NetOutcome, NetPlan, draw_net, run_net
from vast_harness.chaos.suite import Selection, SuiteReport, run_suite, select_kinds
from vast_harness.chaos.trust import TRUST_SCENARIOS  # registers issue 35's account kinds
from vast_harness.chaos.upload import UPLOAD_SCENARIOS  # registers issue 43's account kinds

__all__ = [
    "ACCOUNT_KINDS", "AccountOutcome", "AccountPlan", "draw_account", "run_account",
    "FAULT_KINDS", "KNOWN_ISSUES", "NET_KINDS", "SIM_RULES", "TRIGGERS", "VIOLATION_KINDS", "Kill9Outcome",
    "Kill9Plan", "NetOutcome", "NetPlan", "ScenarioOutcome", "ScenarioPlan", "Selection", "SuiteReport",
    "Violation", "check_scenario", "classify", "draw_kill9", "draw_net", "draw_scenario", "exit_mismatches",
    "false_absences", "run_bounded", "run_kill9", "run_net", "run_scenario", "run_suite", "scenario_seed",
    "select_kinds", "TRUST_SCENARIOS", "UPLOAD_SCENARIOS", "run_secret_artifact",
]
