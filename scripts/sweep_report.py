"""Summarise an MFU sweep: a markdown table.

    python scripts/sweep_report.py DIR [--md FILE]

Reads DIR/mfu-*.json (remote.training.evidence records); one line per configuration (world size, reduction,
compile, act-ckpt, PCIe NCCL, deterministic) and micro-batch. It runs on the rented host, standard library
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


def table(rows: list[dict]) -> str:
    lines = ["| configuration | micro-batch | MFU | tokens/s | tokens/s/GPU | attention | peak mem GiB | file |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in sorted(rows, key=lambda r: (config_of(r), r["micro_batch"])):
        lines.append(f"| {config_of(d)} | {d['micro_batch']} | {d['mfu']:.4f} | {d['tokens_per_s']:,.0f} | "
                     f"{d['tokens_per_s'] / d['world_size']:,.0f} | {d['attention_backend']} | "
                     f"{max(d['rank_peak_mem_gib']):.1f} | {d['_file']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--md", type=Path, help="default DIR/sweep.md")
    args = ap.parse_args(argv)
    rows = load(args.directory)
    if not rows:
        print(f"error: no mfu-*.json evidence in {args.directory}", file=sys.stderr)
        return 1
    text = table(rows)
    (args.md or args.directory / "sweep.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
