#!/usr/bin/env python3
"""Benchmark of the guarded run's own overhead: `python scripts/bench/bench_run.py --runs 5`.

Each run starts a fresh standalone simulator (`python -m vast_harness.sim`, zero boot delay, Vast's real rate
limits: --rate-scale 1) as a separate process and drives one `GuardedRun` in this process at real client
pacing (pacing_scale 1.0) with a trivial step. Measured per run, then the median:

* last step's end -> DELETE acknowledged     target < 1 s: harness-result timings.delete_ack_after_last_step_s
                                              (the evidence pull sits in between)
* DELETE sent -> absence proven               first DELETE request to the last proof round (two all-gone rounds
                                              at least the proof interval apart, so >= the interval; each round
                                              is 3 reads paced at Vast's per-endpoint intervals)
* API calls, 429s, retries                    harness-result api_calls, cross-checked against the simulator's
                                              call log (target: zero 429s in a fault-free run)
* harness CPU seconds                         time.process_time() around GuardedRun.execute (target < 2 s).
                                              The simulator runs in another process and the step in its host
                                              sandbox (the simulator's children), so neither is counted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

import httpx
from rich.console import Console
from rich.table import Table

from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim.server import spawn_standalone
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

KEY = "sim-bench-key"
COLUMNS = ("exit", "last step -> DELETE ack (s)", "DELETE sent -> ack (s)", "DELETE sent -> absence proven (s)",
           "teardown (s)", "proof rounds", "API calls", "429s",
           "429s (sim log)", "retries", "harness CPU (s)", "wall (s)")


def start_sim(seed: int, rate_scale: float) -> tuple[subprocess.Popen[str], str]:
    try:
        return spawn_standalone(["--seed", str(seed), "--boot-seconds", "0", "--rate-scale", str(rate_scale),
                                 "--offers", "1000"])
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


def one_run(seed: int, args: argparse.Namespace) -> dict[str, float]:
    sim, url = start_sim(seed, args.rate_scale)
    try:
        with tempfile.TemporaryDirectory(prefix="vh-bench-") as tmp:
            spec = resolve(RunOptions(profile="smoke", api_url=url, evidence_dir=Path(tmp),
                                      proof_interval_s=args.proof_interval, pacing_scale=args.pacing_scale),
                           environ={"VAST_API_KEY": KEY})
            steps = [Step(name="bench", run=f"echo bench; sleep {args.step_seconds}", timeout_s=60)]
            spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"steps": steps})})
            with VastClient(KEY, base_url=url, pacing_scale=args.pacing_scale) as client:
                out = Output(quiet=True)
                out.out = out.err = Console(file=io.StringIO())  # the run's own table would interleave ours
                run = GuardedRun(spec, client, load_driver_policy(), out)
                wall0, cpu0 = time.monotonic(), time.process_time()
                result = run.execute()
                cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
            res = json.loads((run.ev.dir / "harness-result.json").read_text())
        calls = httpx.get(f"{url}/_sim/state", timeout=10).json()["calls"]
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    t = run.teardowns[0]
    sent, acked, proven = t.deletes[0].t_request_unix, t.deletes[-1].t_ack_unix, t.proof.rounds[-1].t_unix
    raw_s = res["timings"]["delete_ack_after_last_step_s"]
    return {
        "exit": result.exit_code,
        "last step -> DELETE ack (s)": raw_s,
        "DELETE sent -> ack (s)": acked - sent,
        "DELETE sent -> absence proven (s)": proven - sent,
        "teardown (s)": res["timings"]["teardown_s"],
        "proof rounds": len(t.proof.rounds),
        "API calls": res["api_calls"]["total"],
        "429s": res["api_calls"]["rate_limited"],
        "429s (sim log)": sum(1 for c in calls if c["status"] == 429),
        "retries": res["api_calls"]["retries"],
        "harness CPU (s)": cpu_s,
        "wall (s)": wall_s,
        "_by_endpoint": res["api_calls"]["by_endpoint"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--proof-interval", type=float, default=2.0, help="seconds between proof rounds")
    parser.add_argument("--pacing-scale", type=float, default=1.0, help="client pacing (1.0 = Vast's limits)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="simulator rate limits (1.0 = Vast's)")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="the trivial step's sleep")
    parser.add_argument("--json", action="store_true", help="the per-run rows and medians as JSON")
    args = parser.parse_args(argv)
    rows = [one_run(seed, args) for seed in range(1, args.runs + 1)]
    medians = {c: statistics.median(r[c] for r in rows) for c in COLUMNS}
    if args.json:
        print(json.dumps({"settings": vars(args), "runs": rows, "median": medians}, indent=2))
        return 0 if all(r["exit"] in (0, 4) for r in rows) else 1
    console = Console(highlight=False, width=200)
    table = Table(title=f"guarded-run overhead: {args.runs} runs, proof interval {args.proof_interval:g} s, "
                        f"pacing {args.pacing_scale:g}, sim rate limits x{args.rate_scale:g}, zero boot delay",
                  header_style="bold")
    table.add_column("run")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for i, r in enumerate([*rows, medians], start=1):
        table.add_row("median" if i > len(rows) else str(i), *(_fmt(r[c]) for c in COLUMNS))
    console.print(table)
    console.print(f"calls by endpoint (run 1): {rows[0]['_by_endpoint']}")
    console.print(f"harness CPU = process_time of this process around GuardedRun.execute (pid {os.getpid()}); "
                  "the simulator and the step's processes are other processes, not counted")
    return 0 if all(r["exit"] in (0, 4) for r in rows) else 1


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
