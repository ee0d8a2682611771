"""Summarise an MFU sweep: a markdown table.

    python scripts/sweep_report.py DIR [--md FILE] [--receipt FILE]

Reads DIR/mfu-*.json (remote.training.evidence records); one line per configuration (world size, reduction,
compile, act-ckpt, PCIe NCCL, deterministic) and micro-batch. Beside MFU (against the vendor's peak) it gives
each run's achieved TFLOP/s per GPU as a fraction of this host's own measured matmul rate, when the host's
receipt (`python -m remote.receipt`; DIR/receipt.json unless --receipt says) is there: how close the workload
came to what these cards delivered, not to the datasheet. The slowest GPU's rate is the divisor (data-parallel
ranks wait for it). It runs on the rented host, standard library
only; the sweep's chart is drawn locally from the same files, in the run's report.html
(vast_harness/reports/svg.py says why the host draws none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(directory: Path) -> list[dict]:
    rows = []
    for path in sorted(directory.glob("mfu-*.json")):
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            print(f"skip {path}: {exc}", file=sys.stderr)
            continue
        if "mfu" in d and "flags" in d:
            rows.append(d | {"_file": path.name})
    return rows


def config_of(d: dict) -> str:
    f = d["flags"]
    parts = [f"w{d['world_size']}", d["reduction"], "compile" if f.get("compile") else "eager"]
    parts += [name for name in ("act_ckpt", "nccl_pcie", "deterministic") if f.get(name)]
    return " ".join(parts)


def host_matmul_tflops(receipt: Path) -> float | None:
    """The slowest GPU's dense bf16 matmul rate in the host's receipt, or None (no receipt, or none measured)."""
    try:
        rec = json.loads(receipt.read_text())
    except (OSError, ValueError):
        return None
    rates = [g.get("matmul", {}).get("tflops") for g in rec.get("gpus") or [] if isinstance(g, dict)]
    rates = [r for r in rates if isinstance(r, (int, float)) and r > 0]
    return min(rates) if rates else None


def achieved_tflops_per_gpu(d: dict) -> float:
    return d["tokens_per_s"] / d["world_size"] * d["flops_per_token"] / 1e12


def table(rows: list[dict], host_tflops: float | None = None) -> str:
    lines = ["| configuration | micro-batch | MFU | TFLOP/s/GPU | of host matmul | tokens/s | tokens/s/GPU | attention "
             "| peak mem GiB | file |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in sorted(rows, key=lambda r: (config_of(r), r["micro_batch"])):
        achieved = achieved_tflops_per_gpu(d)
        of_host = f"{achieved / host_tflops:.1%}" if host_tflops else "no receipt"
        lines.append(f"| {config_of(d)} | {d['micro_batch']} | {d['mfu']:.4f} | {achieved:.1f} | {of_host} | "
                     f"{d['tokens_per_s']:,.0f} | {d['tokens_per_s'] / d['world_size']:,.0f} | "
                     f"{d['attention_backend']} | {max(d['rank_peak_mem_gib']):.1f} | {d['_file']} |")
    if host_tflops:
        lines.append(f"\nThe host's receipt: {host_tflops:.1f} TFLOP/s dense bf16 matmul (the slowest GPU).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--md", type=Path, help="default DIR/sweep.md")
    ap.add_argument("--receipt", type=Path, help="the host's receipt; default DIR/receipt.json")
    args = ap.parse_args(argv)
    rows = load(args.directory)
    if not rows:
        print(f"error: no mfu-*.json evidence in {args.directory}", file=sys.stderr)
        return 1
    text = table(rows, host_matmul_tflops(args.receipt or args.directory / "receipt.json"))
    (args.md or args.directory / "sweep.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
