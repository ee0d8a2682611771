#!/usr/bin/env python3
"""How long the test suite takes: runs one set (the README's default set, or the slow set CI adds) and records
the count, the wall time, the CPU time of every process it started, the machine and its load, in
`.evidence/cpu/test-suite.json` (one entry per set and added load; docs/development.md states these figures and
tests/harness/test_suite_figures.py keeps the two equal).

    uv run --extra workload python scripts/bench/suite_time.py                  # the default set
    uv run --extra workload python scripts/bench/suite_time.py --load 2         # with two busy loops beside it
    uv run --extra workload python scripts/bench/suite_time.py --set slow       # the slow set (VH_CHAOS_FULL=1)

`--load N` starts N processes that spin for as long as the suite runs (an artificial load of N), as measured
for the target "five minutes at a load of 2". Run it on an otherwise quiet machine: the load average before
the run is recorded beside the figures. Extra arguments after `--` go to pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".evidence" / "cpu" / "test-suite.json"
SETS = {"default": [], "slow": ["-m", "slow"]}  # default: pyproject's addopts (`-m 'not slow'`)
MEASURING_ENV = "VH_MEASURING_SUITE"  # the figures being measured cannot be checked meanwhile: those tests skip


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def counts(junit: Path) -> dict[str, int]:
    suite = ET.parse(junit).getroot()
    suites = [suite] if suite.tag == "testsuite" else list(suite.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"tests": total["tests"], "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "skipped": total["skipped"], "failed": total["failures"] + total["errors"]}


def measure(which: str, load: int, extra: list[str]) -> dict[str, object]:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            argv = [sys.executable, "-m", "pytest", "-q", *SETS[which], f"--junitxml={junit}", *extra]
            env = dict(os.environ) | {MEASURING_ENV: "1"} | ({"VH_CHAOS_FULL": "1"} if which == "slow" else {})
            load_before = os.getloadavg()[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            done = subprocess.run(argv, cwd=ROOT, env=env, check=False)
            wall_s = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # pytest, its workers and what they started
            found = counts(junit)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "set": which, "added_load": load, **found, "exit_code": done.returncode,
        "wall_s": round(wall_s, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "cores": os.cpu_count(), "cpu_model": cpu_model(), "loadavg_1m_before": round(load_before, 2),
        "python": platform.python_version(), "command": " ".join(["pytest", *SETS[which], *extra]),
        "commit": commit.stdout.strip(), "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=sorted(SETS), default="default", dest="which")
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the suite (default 0)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args()
    entry = measure(args.which, args.load, args.pytest_args)
    print(json.dumps(entry, indent=2))
    if entry["exit_code"] != 0:
        print("the suite failed: nothing recorded", file=sys.stderr)
        return 1
    kept = json.loads(args.out.read_text()) if args.out.exists() else []
    kept = [e for e in kept if (e["set"], e["added_load"]) != (args.which, args.load)] + [entry]
    kept.sort(key=lambda e: (e["set"], e["added_load"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(kept, indent=2) + "\n")
    print(f"recorded in {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
