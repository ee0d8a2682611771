"""All-reduce latency and bus bandwidth over NCCL, one process per GPU (MPS on/off is the caller's choice).

    torchrun --standalone --nproc-per-node 2 scripts/bench/bench_allreduce.py --out allreduce.json [--label off]

bf16 tensors of 1, 16 and 128 MiB (the zero2o bucket is 25-100 MiB); 5 warm-up and 30 timed iterations each,
timed with CUDA events around each call; median and p95 per size, bus bandwidth = 2(n-1)/n * bytes / time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `import remote`

SIZES_MIB = (1, 16, 128)
WARMUP, ITERS = 5, 30


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ[k] = v  # NVLink multicast stays off whatever the caller set
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    from remote import knobs
    from remote.training.train import attach_mps

    # under `python -m remote.mps` (an MPS mode set): prove this rank attached, as training does; else None
    mps_rec = attach_mps(rank, int(os.environ["LOCAL_RANK"]), world)
    rows = []
    for mib in SIZES_MIB:
        x = torch.randn(mib * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
        times_ms = []
        for i in range(WARMUP + ITERS):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dist.all_reduce(x)
            e.record()
            e.synchronize()
            if i >= WARMUP:
                times_ms.append(s.elapsed_time(e))
            x.mul_(1.0 / world)  # keep values bounded
        med = statistics.median(times_ms)
        p95 = sorted(times_ms)[int(0.95 * (len(times_ms) - 1))]
        busbw = 2 * (world - 1) / world * mib * 2**20 / (med / 1e3) / 1e9
        rows.append({"size_mib": mib, "median_ms": round(med, 4), "p95_ms": round(p95, 4),
                     "busbw_gbps": round(busbw, 1), "times_ms": [round(t, 4) for t in times_ms]})
    if rank == 0:
        doc = {"label": args.label, "world_size": world, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "mps_mode": knobs.mps().mode, "mps_rank0": mps_rec, "rows": rows}
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        for r in rows:
            print(f"[allreduce] {args.label} {r['size_mib']:>4} MiB median {r['median_ms']:.3f} ms "
                  f"p95 {r['p95_ms']:.3f} ms busbw {r['busbw_gbps']:.1f} GB/s")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
