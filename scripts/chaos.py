#!/usr/bin/env python3
"""Chaos suite over the simulator's faults: `python scripts/chaos.py --scenarios 200 --seed 1 --kill9 3`.

Each scenario is one guarded run under a seeded random composition of faults and caps, checked against the
invariants (no leak, no false absence, no bill over the cap, a consistent exit code); `--kill9 K` adds K
runs of the real CLI killed with SIGKILL and cleaned by `reap`. `--replay SEED` reruns one scenario alone
(`--replay-kill9 SEED` one kill scenario) and prints its plan, its log and its checks. Exit 1 on any
violation that is not a known issue (see KNOWN_ISSUES in vast_harness/sim/chaos.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from vast_harness.sim import chaos


def render(report: chaos.SuiteReport, console: Console) -> None:
    violations, known = report.violations(), report.known()
    overview = Table(title=f"chaos suite, seed {report.suite_seed}", header_style="bold")
    overview.add_column("measure")
    overview.add_column("value", justify="right")
    rows = [("scenarios (in-process)", len(report.scenarios)), ("kill -9 scenarios", len(report.kill9)),
            ("wall time (s)", f"{report.wall_s:.1f}"), ("leaks", violations["leak"]),
            ("false absences", violations["false_absence"]), ("over-cap bills ($)", violations["over_cap_usd"]),
            ("over-cap lifetimes (s)", violations["over_cap_time"]), ("exit mismatches", violations["exit_mismatch"]),
            ("reap failures", violations["reap_failed"]), ("hangs", violations["hang"]),
            ("crashes", violations["crash"])]
    rows += [(f"known issue: {name}", n) for name, n in sorted(known.items())]
    for name, value in rows:
        overview.add_row(name, str(value))
    console.print(overview)

    faults = Table(title="faults (in-process scenarios)", header_style="bold")
    for col in ("kind", "drawn in", "fired in", "fires"):
        faults.add_column(col, justify="left" if col == "kind" else "right")
    for kind, (drawn, hit, fires) in report.faults().items():
        faults.add_row(kind, str(drawn), str(hit), str(fires))
    console.print(faults)

    codes = Table(title="exit codes", header_style="bold")
    codes.add_column("exit")
    codes.add_column("scenarios", justify="right")
    for code, n in sorted(report.exit_codes().items()):
        codes.add_row("none (crash)" if code == "None" else code, str(n))
    kill_rc = sorted(("killed" if k.killed else f"ended {k.harness_rc}") for k in report.kill9)
    if kill_rc:
        codes.add_row("kill -9 runs", ", ".join(kill_rc))
    console.print(codes)

    bad = [(o.seed, v) for o in [*report.scenarios, *report.kill9] for v in o.violations]
    if bad:
        table = Table(title="violations (replay with --replay SEED)", header_style="bold")
        for col in ("seed", "kind", "known", "detail"):
            table.add_column(col)
        for seed, v in bad:
            table.add_row(str(seed), v.kind, v.known or "", v.detail.splitlines()[0][:160])
        console.print(table)


def replay(seed: int, kill9: bool, console: Console) -> int:
    if kill9:
        k = chaos.run_kill9(chaos.draw_kill9(seed))
        console.print(k.plan.model_dump(), k.summary(), k.ledger_events, k.violations)
        return 1 if any(v.known is None for v in k.violations) else 0
    outcome = chaos.run_bounded(chaos.draw_scenario(seed))
    console.print(outcome.plan.model_dump())
    console.out(outcome.log)
    console.print(f"exit {outcome.exit_code} in {outcome.wall_s:.2f} s; faults fired {outcome.faults_fired}; "
                  f"billed ${outcome.billed_usd:.6f} (cap {outcome.max_usd})")
    for v in outcome.violations:
        console.print(f"[red]{v.kind}[/]{f' (known: {v.known})' if v.known else ''}: {v.detail}")
    return 1 if any(v.known is None for v in outcome.violations) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=200, help="in-process scenarios (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="suite seed: scenario i gets a seed derived from it")
    parser.add_argument("--kill9", type=int, default=0, help="kill -9 scenarios of the real CLI (default 0)")
    parser.add_argument("--workers", type=int, default=6, help="scenarios run at once (threads; default 6)")
    parser.add_argument("--replay", type=int, metavar="SEED", help="rerun one in-process scenario, verbosely")
    parser.add_argument("--replay-kill9", type=int, metavar="SEED", help="rerun one kill -9 scenario")
    parser.add_argument("--quiet", action="store_true", help="no per-scenario progress lines")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=160)
    if args.replay is not None or args.replay_kill9 is not None:
        return replay(args.replay if args.replay is not None else args.replay_kill9, args.replay is None, console)
    progress = None if args.quiet else (lambda line: console.print(line, markup=False))
    report = chaos.run_suite(args.scenarios, args.seed, workers=args.workers, kill9=args.kill9, progress=progress)
    render(report, console)
    return 1 if sum(report.violations().values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
