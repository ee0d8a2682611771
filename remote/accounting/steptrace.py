"""Split a profiler Chrome trace by step and compare steps: where does a slow step lose its time?

    python -m remote.accounting.steptrace TRACE.json[.gz] [--out FILE.json]

Steps are the `vh_step_N` ranges remote.training.train marks while profiling (VH_TORCH_PROFILE_OUT, VH_TORCH_TRACE_OUT,
VH_TORCH_PROFILE_STEPS). A kernel belongs to the step whose host range launched it (the launch's correlation
id). Per step: GPU span (first kernel start to last kernel end), busy time, idle gaps, and busy time per kernel
family; then the slowest step against the fastest, family by family. Same kernels, each a few percent slower
means the chip ran slower (clocks); more kernels or larger gaps means the work or the host changed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

FAMILIES = (("attention", ("cudnn", "flash", "Flash", "fmha", "Attention")), ("gemm", ("nvjet", "gemm", "xmma", "cublas")),
            ("ours", ("_swiglu", "_ce_", "_adamw", "_scale_cast")), ("triton", ("triton_",)),
            ("memset/copy", ("memset", "memcpy", "Memset", "Memcpy")))


def family(name: str) -> str:
    for fam, keys in FAMILIES:
        if any(k in name for k in keys):
            return fam
    return "other"


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    events: list[dict[str, Any]] = data["traceEvents"] if isinstance(data, dict) else data
    return events


def split_steps(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    ranges = []
    for e in events:
        m = re.fullmatch(r"vh_step_(\d+)", str(e.get("name", "")))
        if m and e.get("ph") == "X" and e.get("cat") == "user_annotation":
            ranges.append((e["ts"], e["ts"] + e["dur"], int(m.group(1))))
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
    steps: dict[int, list[dict[str, Any]]] = {n: [] for _, _, n in ranges}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        t = launches.get(e.get("args", {}).get("correlation"))
        for a, b, n in ranges:
            if t is not None and a <= t <= b:
                steps[n].append(e)
                break
    return steps


def summarize(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    kernels = sorted(kernels, key=lambda e: e["ts"])
    if not kernels:
        return {"kernels": 0}
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy: Counter[str] = Counter()
    for e in kernels:
        busy[family(e["name"])] += e["dur"]
    end, idle = kernels[0]["ts"], 0.0
    for e in kernels:
        idle += max(0.0, e["ts"] - end)
        end = max(end, e["ts"] + e["dur"])
    return {"kernels": len(kernels), "span_ms": span / 1e3, "busy_ms": sum(busy.values()) / 1e3,
            "idle_ms": idle / 1e3, "families_ms": {k: v / 1e3 for k, v in busy.most_common()}}


def report(path: Path) -> dict[str, Any]:
    steps = {n: summarize(k) for n, k in sorted(split_steps(load(path)).items())}
    timed = {n: s for n, s in steps.items() if s.get("kernels")}
    rec: dict[str, Any] = {"steps": steps}
    if len(timed) >= 2:
        slow = max(timed, key=lambda n: timed[n]["span_ms"])
        fast = min(timed, key=lambda n: timed[n]["span_ms"])
        fams = set(timed[slow]["families_ms"]) | set(timed[fast]["families_ms"])
        rec["slow_vs_fast"] = {"slow_step": slow, "fast_step": fast,
                               "span_ms": [timed[slow]["span_ms"], timed[fast]["span_ms"]],
                               "kernels": [timed[slow]["kernels"], timed[fast]["kernels"]],
                               "idle_ms": [timed[slow]["idle_ms"], timed[fast]["idle_ms"]],
                               "families_ms": {f: [timed[slow]["families_ms"].get(f, 0.0),
                                                   timed[fast]["families_ms"].get(f, 0.0)] for f in sorted(fams)}}
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rec = report(args.trace)
    for n, s in rec["steps"].items():
        if s.get("kernels"):
            fams = " ".join(f"{k} {v:.1f}" for k, v in s["families_ms"].items())
            print(f"[steptrace] step {n}: span {s['span_ms']:.1f} ms busy {s['busy_ms']:.1f} idle {s['idle_ms']:.1f} "
                  f"kernels {s['kernels']} | {fams}")
    sv = rec.get("slow_vs_fast")
    if sv:
        print(f"[steptrace] slow step {sv['slow_step']} vs fast step {sv['fast_step']}: span {sv['span_ms'][0]:.1f} vs "
              f"{sv['span_ms'][1]:.1f} ms, kernels {sv['kernels']}, idle {sv['idle_ms'][0]:.1f} vs {sv['idle_ms'][1]:.1f}")
        for f, (a, b) in sv["families_ms"].items():
            print(f"[steptrace]   {f:12s} {a:8.2f} {b:8.2f}  x{a / b if b else float('nan'):.3f}")
    if args.out:
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
