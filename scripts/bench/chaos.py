#!/usr/bin/env python3
"""Chaos suite: `python scripts/bench/chaos.py --scenarios 200 --net 110 --kill9 4 --account 12 --seed 1`.

Three families from one seed, judged by the simulator's own record (vast_harness/chaos/judge.py): in-process
runs under simulator faults and caps (`sim`), the harness in its own process behind a fault proxy that
stalls, lags, trickles, resets and garbles the API and the SSH links, with floods and a full disk (`net`,
kinds: `--list-kinds`), the real CLI SIGKILLed then reaped from another directory (`kill9`), and several runs,
reaps, state dirs and clocks on one account (`account`: vast_harness/chaos/account.py). `--kinds` picks families or
network kinds (names or patterns: `--kinds 'odd_*,ssh_stall'`). `--replay SEED` (`--replay-net SEED`,
`--replay-kill9 SEED`) reruns one scenario alone, verbosely; a network replay needs the same `--kinds`.
Exit 1 on any violation that is not a known issue (KNOWN_ISSUES in vast_harness/chaos/judge.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vast_harness import chaos
from vast_harness.chaos.network import NET_KINDS


def render(report: chaos.SuiteReport, console: Console) -> None:
    violations, known = report.violations(), report.known()
    overview = Table(title=f"chaos suite, seed {report.suite_seed}", header_style="bold")
    overview.add_column("measure")
    overview.add_column("value", justify="right")
    skipped = sum(o.skipped is not None for o in report.network)
    rows = [("scenarios in-process (sim)", len(report.scenarios)),
            ("scenarios behind the fault proxy (net)", f"{len(report.network)} ({skipped} skipped)"),
            ("kill -9 scenarios", len(report.kill9)), ("account scenarios", len(report.account)),
            ("wall time (s)", f"{report.wall_s:.1f}")]
    rows += [(kind.replace("_", " "), violations[kind]) for kind in chaos.VIOLATION_KINDS]
    rows += [(f"known issue: {name}", n) for name, n in sorted(known.items())]
    for name, value in rows:
        overview.add_row(name, str(value))
    console.print(overview)

    if report.network:
        net = Table(title="network kinds (unknown violations; replay with --replay-net SEED)", header_style="bold")
        for col in ("kind", "scenarios", "exits", "violations", "seeds"):
            net.add_column(col)
        for kind, row in report.net_kinds().items():
            exits = " ".join(f"{c}:{n}" for c, n in sorted(row["exits"].items()))
            bad = " ".join(f"{k}:{n}" for k, n in sorted(row["violations"].items())) or "-"
            net.add_row(kind, str(row["scenarios"]), exits, bad, " ".join(map(str, row["seeds"][:4])))
        console.print(net)

    if report.scenarios:
        faults = Table(title="simulator faults (in-process scenarios)", header_style="bold")
        for col in ("kind", "drawn in", "fired in", "fires"):
            faults.add_column(col, justify="left" if col == "kind" else "right")
        for kind, (drawn, hit, fires) in report.faults().items():
            faults.add_row(kind, str(drawn), str(hit), str(fires))
        console.print(faults)
        codes = Table(title="exit codes (in-process scenarios)", header_style="bold")
        codes.add_column("exit")
        codes.add_column("scenarios", justify="right")
        for code, n in sorted(report.exit_codes().items()):
            codes.add_row("none (crash)" if code == "None" else code, str(n))
        kill_rc = sorted(("killed" if k.killed else f"ended {k.harness_rc}") for k in report.kill9)
        if kill_rc:
            codes.add_row("kill -9 runs", ", ".join(kill_rc))
        console.print(codes)

    bad = [(fam, o.seed, v) for fam, outs in (("sim", report.scenarios), ("net", report.network),
                                             ("kill9", report.kill9), ("account", report.account))
           for o in outs for v in o.violations]
    if bad:
        table = Table(title="violations", header_style="bold")
        for col in ("family", "seed", "kind", "known", "detail"):
            table.add_column(col)
        for fam, seed, v in bad:
            table.add_row(fam, str(seed), v.kind, v.known or "", escape(v.detail.splitlines()[0][:150]))
        console.print(table)


def _print_violations(console: Console, violations: list[chaos.Violation]) -> int:
    for v in violations:
        console.print(f"[red]{v.kind}[/]{f' (known: {v.known})' if v.known else ''}: {escape(v.detail)}")
    return 1 if any(v.known is None for v in violations) else 0


def replay(args: argparse.Namespace, console: Console) -> int:
    if args.replay_account is not None:
        a = chaos.run_account(chaos.draw_account(args.replay_account))
        console.print(a.plan.model_dump(), a.summary())
        console.out(a.log)
        return _print_violations(console, a.violations)
    if args.replay_kill9 is not None:
        k = chaos.run_kill9(chaos.draw_kill9(args.replay_kill9))
        console.print(k.plan.model_dump(), k.summary(), k.ledger_events)
        return _print_violations(console, k.violations)
    if args.replay_net is not None:
        n = chaos.run_net(chaos.draw_net(args.replay_net, chaos.select_kinds(args.kinds).net))
        console.print(n.plan.model_dump())
        console.out(n.log)
        console.print(f"exit {n.exit_code} in {n.wall_s:.2f} s (budget {n.budget_s} s); proxy fired {n.net_fired}; "
                      f"simulator fired {n.sim_fired}; billed ${n.billed_usd:.6f} (cap {n.max_usd}); "
                      f"live at exit {n.live_at_exit}{'; skipped: ' + n.skipped if n.skipped else ''}")
        return _print_violations(console, n.violations)
    outcome = chaos.run_bounded(chaos.draw_scenario(args.replay))
    console.print(outcome.plan.model_dump())
    console.out(outcome.log)
    console.print(f"exit {outcome.exit_code} in {outcome.wall_s:.2f} s; faults fired {outcome.faults_fired}; "
                  f"billed ${outcome.billed_usd:.6f} (cap {outcome.max_usd})")
    return _print_violations(console, outcome.violations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=200, help="in-process scenarios (default 200)")
    parser.add_argument("--net", type=int, default=110, help="network scenarios (default 110)")
    parser.add_argument("--kill9", type=int, default=4, help="kill -9 scenarios of the real CLI (default 4)")
    parser.add_argument("--account", type=int, default=12, help="account scenarios: two runs and a reap, clock "
                        "steps, a failing boot with a failing DELETE, a re-priced fleet, a suspend, a `Date` "
                        "skew, a decoy instance, a tampered registration, key and credential files in the "
                        "workdir, a daemonising command (default 12)")
    parser.add_argument("--kinds", default=None, help="families and network kinds to run, comma-separated "
                        "names or patterns (sim, kill9, net, or a network kind); default all")
    parser.add_argument("--list-kinds", action="store_true", help="list the network kinds and exit")
    parser.add_argument("--seed", type=int, default=1, help="suite seed: scenario i gets a seed derived from it")
    parser.add_argument("--workers", type=int, default=6, help="scenarios run at once (default 6)")
    parser.add_argument("--replay", type=int, metavar="SEED", help="rerun one in-process scenario, verbosely")
    parser.add_argument("--replay-net", type=int, metavar="SEED", help="rerun one network scenario")
    parser.add_argument("--replay-kill9", type=int, metavar="SEED", help="rerun one kill -9 scenario")
    parser.add_argument("--replay-account", type=int, metavar="SEED", help="rerun one account scenario")
    parser.add_argument("--json-out", type=Path, metavar="FILE", help="write the JSON summary here")
    parser.add_argument("--quiet", action="store_true", help="no per-scenario progress lines")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=170)
    if args.list_kinds:
        console.print(" ".join(NET_KINDS), markup=False)
        return 0
    try:
        selection = chaos.select_kinds(args.kinds)
    except ValueError as exc:
        parser.error(str(exc))
    if any(x is not None for x in (args.replay, args.replay_net, args.replay_kill9, args.replay_account)):
        return replay(args, console)
    progress = None if args.quiet else (lambda line: console.print(line, markup=False))
    report = chaos.run_suite(args.scenarios, args.seed, workers=args.workers, kill9=args.kill9, net=args.net,
                             account=args.account, selection=selection, progress=progress)
    render(report, console)
    if args.json_out:
        args.json_out.write_text(json.dumps(report.summary(), indent=2) + "\n")
    return 1 if sum(report.violations().values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
