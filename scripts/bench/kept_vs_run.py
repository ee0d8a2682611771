#!/usr/bin/env python3
"""A kept host against a fresh run, for one try of a command: `python scripts/bench/kept_vs_run.py [--out F]`.

One standalone simulator (`python -m vast_harness.sim`, its own process) with Vast's figures where the harness
has them: a boot of `--boot-seconds` (default 60 s: the low end of "typically 1-5 minutes", Vast's
hello-world.mdx, as Timings.real().min_boot_s takes it), SFTP throttled to `--bytes-per-s` (default 16 MB/s:
128 Mbit/s, the floor dstack asks of `inet_down`; no transfer rate has been measured on Vast from here), Vast's
own rate limits (--rate-scale 1) and the client's real pacing. The workdir is `--workdir-mb` (default 30) of
incompressible files and a `train.py` whose first line is a marker.

* the fresh run: `vast-e2e run -- python train.py` (rent, boot, upload all, run, delete, prove absent);
* the kept host: `vast-e2e up`, `exec` once, one file changed, then the second `exec` (what this measures:
  the warm try: only the change uploaded), then `down`.

For each: the seconds from the command's start to the command's first output line (the marker, read as it
arrives), and the billed seconds (the run's instance from its create to its DELETE, as the simulator billed it;
for the exec, its own span, what that try kept the host for). Printed as a table with the ratios, and with
`--out` written as JSON. Every command is a process of its own, as a user types it, and as an installed tool
runs: with its bytecode cached (warmed in a cache of the bench's own, `PYTHONPYCACHEPREFIX`; a machine with
`PYTHONDONTWRITEBYTECODE` would compile the sources, about a second, in every command) and `--pause-s` after
the previous command (the edit between tries; a command within 2 s of the last read of the instance draws
Vast's 429 for that endpoint and waits it out).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repo root

import httpx  # noqa: E402

# Every module of the harness imported once (not a `__main__`: it would run), so that the commands find the
# bytecode of all they import cached.
WARM = ("import importlib, pkgutil, vast_harness\n"
        "for m in pkgutil.walk_packages(vast_harness.__path__, 'vast_harness.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n")

from vast_harness.sim.server import spawn_standalone  # noqa: E402

KEY = "sim-bench-kept"
MARKER = "VH-FIRST-LINE"


def make_workdir(root: Path, mb: int) -> Path:
    wd = root / "wd"
    (wd / "data").mkdir(parents=True)
    for i in range(mb):
        (wd / "data" / f"shard-{i:03d}.bin").write_bytes(secrets.token_bytes(1_000_000))
    (wd / "train.py").write_text(f"print({MARKER!r}, flush=True)\nimport os\nprint(len(os.listdir('data')))\n")
    return wd


def timed(argv: list[str], env: dict[str, str], *, marker: str | None = MARKER, timeout_s: float = 900
          ) -> dict[str, Any]:
    """Run the CLI; seconds to the line holding `marker` (stdout or stderr) and to the end; the exit code."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "vast_e2e.py"), *argv], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    first_s, seen = None, []
    streams = [proc.stdout, proc.stderr]
    while streams and time.monotonic() - start < timeout_s:
        ready, _, _ = select.select(streams, [], [], 0.2)
        for stream in ready:
            line = stream.readline()
            if not line:
                streams.remove(stream)
                continue
            seen.append(line)
            if first_s is None and marker is not None and marker in line:
                first_s = time.monotonic() - start
    code = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - start)))
    return {"argv": argv[:2], "exit": code, "first_line_s": first_s, "wall_s": round(time.monotonic() - start, 2),
            "tail": "".join(seen)[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boot-seconds", type=float, default=60.0)
    ap.add_argument("--bytes-per-s", type=int, default=16_000_000)
    ap.add_argument("--workdir-mb", type=int, default=30)
    ap.add_argument("--pause-s", type=float, default=5.0, help="between commands: the edit between tries")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    sim, url = spawn_standalone(["--seed", "7", "--boot-seconds", str(args.boot_seconds), "--rate-scale", "1",
                                 "--offers", "1000", "--faults", f"slow_sftp:{args.bytes_per_s}"])
    try:
        with tempfile.TemporaryDirectory(prefix="vh-bench-kept-") as tmp:
            root = Path(tmp)
            wd = make_workdir(root, args.workdir_mb)
            env = {k: v for k, v in os.environ.items() if not k.startswith("VAST_")}
            env |= {"VAST_API_KEY": KEY, "VAST_HARNESS_HOME": str(root / "state"), "HOME": str(root),
                    "PYTHONPYCACHEPREFIX": str(root / "pycache")}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            subprocess.run([sys.executable, "-c", WARM], env=env, cwd=ROOT, check=True)
            common = ["--api-url", url, "--proof-interval", "10", "--poll-interval", "2"]
            caps = ["--max-minutes", "15", "--max-usd", "2"]
            run = timed(["run", "--workdir", str(wd), *caps, *common, "--", "python", "train.py"], env)
            time.sleep(args.pause_s)
            up = timed(["up", "bench", "--workdir", str(wd), *caps, "--idle-minutes", "10", *common], env, marker=None)
            time.sleep(args.pause_s)
            exec1 = timed(["exec", "bench", *common[:2], "--poll-interval", "2", "--", "python", "train.py"], env)
            (wd / "train.py").write_text((wd / "train.py").read_text() + "# one change\n")
            time.sleep(args.pause_s)
            exec2 = timed(["exec", "bench", *common[:2], "--poll-interval", "2", "--", "python", "train.py"], env)
            time.sleep(args.pause_s)
            down = timed(["down", "bench", *common], env, marker=None)
            instances = httpx.get(f"{url}/_sim/state", timeout=30).json()["instances"]
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    failed = [r for r in (run, up, exec1, exec2, down) if r["exit"] != 0]
    if failed:
        print(json.dumps(failed, indent=1), file=sys.stderr)
        return 1
    # What is measured is what it says: the first exec sent nothing, the second only the change
    assert "nothing changed since the last upload" in exec1["tail"], exec1["tail"]
    assert "upload: 1 changed file(s)" in exec2["tail"], exec2["tail"]
    run_inst, kept_inst = sorted(instances, key=lambda i: i["created_at"])
    assert not run_inst["live"] and not kept_inst["live"], "an instance was left live"
    result = {
        "command": shlex.join(["python", *sys.argv]),  # under `uv run --extra workload`
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "load_avg_1_5_15": {"before": [round(x, 2) for x in load_before],
                            "after": [round(x, 2) for x in os.getloadavg()]},
        "setup": {"boot_seconds": args.boot_seconds, "sftp_bytes_per_s": args.bytes_per_s,
                  "workdir_mb": args.workdir_mb, "rate_scale": 1, "pacing_scale": 1, "pause_s": args.pause_s,
                  "bytecode": "cached (warmed first)"},
        "fresh_run": {"first_line_s": run["first_line_s"], "billed_s": round(run_inst["billed_seconds"], 2),
                      "wall_s": run["wall_s"]},
        "second_exec": {"first_line_s": exec2["first_line_s"], "billed_s": exec2["wall_s"], "wall_s": exec2["wall_s"]},
        "up": {"wall_s": up["wall_s"]}, "first_exec": {"first_line_s": exec1["first_line_s"], "wall_s": exec1["wall_s"]},
        "down": {"wall_s": down["wall_s"]}, "hold_billed_s": round(kept_inst["billed_seconds"], 2),
    }
    result["ratio_first_line"] = round(run["first_line_s"] / exec2["first_line_s"], 1)
    result["ratio_billed"] = round(run_inst["billed_seconds"] / exec2["wall_s"], 1)
    print(f"{'':24}{'first line (s)':>16}{'billed (s)':>12}")
    print(f"{'fresh run -- CMD':24}{run['first_line_s']:>16.1f}{run_inst['billed_seconds']:>12.1f}")
    print(f"{'second exec':24}{exec2['first_line_s']:>16.1f}{exec2['wall_s']:>12.1f}")
    print(f"{'ratio (run / exec)':24}{result['ratio_first_line']:>16}{result['ratio_billed']:>12}")
    print(f"(up {up['wall_s']:.1f} s once; first exec {exec1['wall_s']:.1f} s; down {down['wall_s']:.1f} s; the hold "
          f"billed {kept_inst['billed_seconds']:.1f} s in all; boot {args.boot_seconds:g} s, SFTP "
          f"{args.bytes_per_s / 1e6:g} MB/s, workdir {args.workdir_mb} MB, {args.pause_s:g} s between commands)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
