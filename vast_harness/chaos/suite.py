"""The suite: in-process, network and kill -9 scenarios from one seed, run concurrently, one report.

Scenario i of each family gets its own seed (`scenario_seed(suite_seed, OFFSET + i)`), so any one replays
alone. `select_kinds` turns `--kinds` (names or shell patterns: `sim`, `kill9`, `net`, `odd_*`, `ssh_stall`)
into what runs.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, Field

from vast_harness.chaos.account import AccountOutcome, draw_account, run_account
from vast_harness.chaos.engine import FAULT_KINDS, ScenarioOutcome, draw_scenario, run_bounded, scenario_seed
from vast_harness.chaos.judge import VIOLATION_KINDS
from vast_harness.chaos.kill9 import Kill9Outcome, draw_kill9, run_kill9
from vast_harness.chaos.network import NET_KINDS, NetOutcome, draw_net, run_net
from vast_harness.clock import now_s

NET_OFFSET = 2_000_000
KILL9_OFFSET = 1_000_000
ACCOUNT_OFFSET = 3_000_000
FAMILIES = ("sim", "kill9", "account")


class Selection(BaseModel):
    sim: bool = True
    kill9: bool = True
    account: bool = True
    net: tuple[str, ...] = tuple(NET_KINDS)


def select_kinds(spec: str | None) -> Selection:
    """`None` or "all": everything. Else comma-separated names or patterns over sim, kill9, net and the
    network kinds; an unknown name is an error naming the known ones."""
    if spec is None or spec.strip() in ("", "all"):
        return Selection()
    known = (*FAMILIES, "net", *NET_KINDS)
    chosen: set[str] = set()
    for item in (p.strip() for p in spec.split(",") if p.strip()):
        hits = fnmatch.filter(known, item)
        if not hits:
            raise ValueError(f"--kinds: {item!r} matches nothing; known: {', '.join(known)}")
        chosen.update(hits)
    net = tuple(NET_KINDS) if "net" in chosen else tuple(k for k in NET_KINDS if k in chosen)
    return Selection(sim="sim" in chosen, kill9="kill9" in chosen, account="account" in chosen, net=net)


class SuiteReport(BaseModel):
    suite_seed: int
    wall_s: float = 0.0
    scenarios: list[ScenarioOutcome] = Field(default_factory=list)
    network: list[NetOutcome] = Field(default_factory=list)
    kill9: list[Kill9Outcome] = Field(default_factory=list)
    account: list[AccountOutcome] = Field(default_factory=list)

    def _all(self) -> list[Any]:
        return [*self.scenarios, *self.network, *self.kill9, *self.account]

    def violations(self) -> Counter[str]:
        """Violations by kind, known issues left out (see `known`)."""
        found: Counter[str] = Counter({kind: 0 for kind in VIOLATION_KINDS})
        for o in self._all():
            found.update(v.kind for v in o.violations if v.known is None)
        return found

    def known(self) -> Counter[str]:
        return Counter(v.known for o in self._all() for v in o.violations if v.known)

    def exit_codes(self) -> Counter[str]:
        return Counter(str(o.exit_code) for o in self.scenarios)

    def faults(self) -> dict[str, tuple[int, int, int]]:
        """Simulator fault kind -> (in-process scenarios that drew it, scenarios where it fired, total fires)."""
        table = {}
        for kind in FAULT_KINDS:
            drawn = sum(kind in o.plan.fault_kinds for o in self.scenarios)
            hit = [o.faults_fired.get(kind, 0) for o in self.scenarios]
            table[kind] = (drawn, sum(1 for h in hit if h), sum(hit))
        return table

    def net_kinds(self) -> dict[str, dict[str, Any]]:
        """Network kind -> scenarios, skipped, exit codes, violations by kind (unknown ones only)."""
        table: dict[str, dict[str, Any]] = {}
        for o in self.network:
            row = table.setdefault(o.plan.kind, {"scenarios": 0, "skipped": 0, "exits": Counter(),
                                                 "violations": Counter(), "seeds": []})
            row["scenarios"] += 1
            row["skipped"] += o.skipped is not None
            row["exits"][str(o.exit_code) if o.exit_code is not None else "killed"] += 1
            new = [v.kind for v in o.violations if v.known is None]
            row["violations"].update(new)
            if new:
                row["seeds"].append(o.seed)
        return dict(sorted(table.items()))

    def summary(self) -> dict[str, Any]:
        """The JSON summary: counts, and per scenario with a violation its seed, family and findings."""
        bad = [{"family": fam, "seed": o.seed, "kind": getattr(o.plan, "kind", None),
                "violations": [v.model_dump() for v in o.violations]}
               for fam, outs in (("sim", self.scenarios), ("net", self.network), ("kill9", self.kill9),
                                 ("account", self.account))
               for o in outs if o.violations]
        return {"suite_seed": self.suite_seed, "wall_s": self.wall_s,
                "scenarios": {"sim": len(self.scenarios), "net": len(self.network), "kill9": len(self.kill9),
                              "account": len(self.account),
                              "skipped": sum(o.skipped is not None for o in self.network)},
                "violations": dict(self.violations()), "known": dict(self.known()),
                "exit_codes_sim": dict(self.exit_codes()),
                "net_kinds": {k: {**v, "exits": dict(v["exits"]), "violations": dict(v["violations"])}
                              for k, v in self.net_kinds().items()},
                "failing": bad}


def run_suite(count: int, suite_seed: int, *, workers: int = 4, kill9: int = 0, net: int = 0, account: int = 0,
              selection: Selection | None = None, progress: Callable[[str], None] | None = None) -> SuiteReport:
    sel = selection or Selection()
    report = SuiteReport(suite_seed=suite_seed)
    started = now_s()
    plans = [draw_scenario(scenario_seed(suite_seed, i)) for i in range(count)] if sel.sim else []
    net_plans = [draw_net(scenario_seed(suite_seed, NET_OFFSET + i), sel.net) for i in range(net)] if sel.net else []
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="chaos") as pool:
        # network scenarios first: they are the long ones, and their children run outside this process
        net_futures = [pool.submit(run_net, p) for p in net_plans]
        sim_futures = [pool.submit(run_bounded, p) for p in plans]
        total = len(plans) + len(net_plans)
        futures: list[Future[NetOutcome] | Future[ScenarioOutcome]] = [*net_futures, *sim_futures]
        for future in futures:
            outcome = future.result()
            if isinstance(outcome, NetOutcome):
                report.network.append(outcome)
            else:
                report.scenarios.append(outcome)
            if progress:
                progress(_progress_line(len(report.scenarios) + len(report.network), total, outcome))
    for k in range(kill9 if sel.kill9 else 0):
        outcome9 = run_kill9(draw_kill9(scenario_seed(suite_seed, KILL9_OFFSET + k)))
        report.kill9.append(outcome9)
        if progress:
            progress(f"kill9 {k + 1}/{kill9} seed {outcome9.seed}: {outcome9.summary()}")
    for k in range(account if sel.account else 0):  # one at a time: each runs several processes at once
        outcome_a = run_account(draw_account(scenario_seed(suite_seed, ACCOUNT_OFFSET + k)))
        report.account.append(outcome_a)
        if progress:
            progress(f"account {k + 1}/{account} seed {outcome_a.seed}: {outcome_a.summary()}")
    report.wall_s = round(now_s() - started, 2)
    return report


def _progress_line(done: int, total: int, o: ScenarioOutcome | NetOutcome) -> str:
    flags = ",".join(v.kind for v in o.violations) or ("skipped" if getattr(o, "skipped", None) else "ok")
    what = f"net {o.plan.kind}" if isinstance(o, NetOutcome) else f"sim {o.plan.cap_mode}"
    return f"[{done}/{total}] seed {o.seed} {what} exit {o.exit_code} {o.wall_s:.1f}s {flags}"
