"""The table for scripts/gpu/h200x2_dp.sh: every run's MFU, per-GPU tokens/s, scaling against dp1 at the same
micro-batch, step-time jitter, leaf root and MPS mode; then all-reduce latency with MPS off and on.

    python scripts/gpu/dp2_report.py DIR      (DIR holds the runs' JSON files, searched recursively)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _load(root: Path) -> list[tuple[str, dict]]:
    runs = []
    for p in sorted(root.rglob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and ("mfu" in d or "rows" in d):
            runs.append((str(p.relative_to(root)), d))
    return runs


def main() -> int:
    root = Path(sys.argv[1])
    runs = _load(root)
    dp1 = {d["micro_batch"]: d["tokens_per_s_per_gpu"] for _, d in runs
           if "mfu" in d and d.get("world_size") == 1 and d.get("reduction") == "zero2o"}
    print(f"{'run':46s} {'w':>2} {'red':6s} {'mb':>3} {'MFU':>7} {'tok/s/GPU':>10} {'vs dp1':>7} "
          f"{'p50 ms':>7} {'p95 ms':>7} {'cv%':>5} {'mps':>4} {'replay':>6} root")
    for name, d in runs:
        if "mfu" not in d:
            continue
        times = [t * 1e3 for t in d.get("step_times_s", [])]
        p50 = statistics.median(times) if times else float("nan")
        p95 = sorted(times)[int(0.95 * (len(times) - 1))] if times else float("nan")
        cv = 100 * statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else float("nan")
        base = dp1.get(d["micro_batch"])
        ratio = f"{d['tokens_per_s_per_gpu'] / base:.3f}" if base and d["world_size"] > 1 else "-"
        mps = (d.get("mps") or {}).get("mode", "-") if isinstance(d.get("mps"), dict) else "-"
        flags = "+pcie" if "nccl_pcie" in json.dumps(d.get("flags", {})) and d.get("flags", {}).get("nccl_pcie") else ""
        print(f"{name[-46:]:46s} {d['world_size']:>2} {d['reduction']:6s} {d['micro_batch']:>3} {d['mfu']:>7.4f} "
              f"{d['tokens_per_s_per_gpu']:>10.0f} {ratio:>7} {p50:>7.1f} {p95:>7.1f} {cv:>5.2f} {mps:>4} "
              f"{str(d.get('replay_match', '-')):>6} {(d.get('leaf_root') or '-')[:12]}{flags}")
    for name, d in runs:
        if "rows" in d:
            cells = "  ".join(f"{r['size_mib']}MiB {r['median_ms']:.3f}/{r['p95_ms']:.3f} ms {r['busbw_gbps']:.0f}GB/s"
                              for r in d["rows"])
            print(f"allreduce {d.get('label', ''):4s} (median/p95, bus bw): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
