"""Summarise an MFU sweep: a markdown table and a PNG of MFU and tokens/s against micro-batch.

    python scripts/sweep_report.py DIR [--md FILE] [--png FILE]

Reads DIR/mfu-*.json (remote.evidence records); one line per configuration (world size, reduction,
compile, act-ckpt, PCIe NCCL, deterministic). matplotlib is optional: without it only the table is made.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
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


def plot(rows: list[dict], png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    series: dict[str, list[dict]] = defaultdict(list)
    for d in rows:
        series[config_of(d)].append(d)
    fig, (ax_mfu, ax_tps) = plt.subplots(1, 2, figsize=(11, 4))
    for name, items in sorted(series.items()):
        items.sort(key=lambda r: r["micro_batch"])
        mb = [r["micro_batch"] for r in items]
        ax_mfu.plot(mb, [r["mfu"] for r in items], marker="o", label=name)
        ax_tps.plot(mb, [r["tokens_per_s"] for r in items], marker="o", label=name)
    ax_mfu.set(xlabel="micro-batch (sequences per rank)", ylabel="MFU", title="MFU vs micro-batch")
    ax_tps.set(xlabel="micro-batch (sequences per rank)", ylabel="tokens/s (all ranks)", title="throughput")
    ax_mfu.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--md", type=Path, help="default DIR/sweep.md")
    ap.add_argument("--png", type=Path, help="default DIR/sweep.png")
    args = ap.parse_args(argv)
    rows = load(args.directory)
    if not rows:
        print(f"error: no mfu-*.json evidence in {args.directory}", file=sys.stderr)
        return 1
    text = table(rows)
    (args.md or args.directory / "sweep.md").write_text(text + "\n")
    plot(rows, args.png or args.directory / "sweep.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
