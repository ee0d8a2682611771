"""Between GPUs: peer-to-peer copy bandwidth for every ordered pair, and all-reduce bus bandwidth across all of
them (nccl-tests' definition: 2 * (n - 1) / n * bytes / time). On the CPU the all-reduce runs over gloo, which
is how the tests exercise the multi-rank path without GPUs.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

GB = 1e9
P2P_BYTES = 256 << 20
ALLREDUCE_BYTES = 256 << 20
ALLREDUCE_ITERS = 20
ALLREDUCE_WARMUP = 5


def p2p(devices: list[int], *, nbytes: int = P2P_BYTES, iters: int = 10) -> list[dict[str, Any]]:
    """GB/s of a copy from each GPU to each other (one direction), and whether peer access is on."""
    rows: list[dict[str, Any]] = []
    for src in devices:
        for dst in devices:
            if src == dst:
                continue
            row: dict[str, Any] = {"src": src, "dst": dst,
                                   "peer_access": bool(torch.cuda.can_device_access_peer(src, dst))}
            try:
                a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
                b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
                b.copy_(a)
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
                times = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    b.copy_(a)
                    torch.cuda.synchronize(src)
                    torch.cuda.synchronize(dst)
                    times.append(time.perf_counter() - t0)
                row["gbps"] = round(nbytes / GB / statistics.median(times), 2)
                del a, b
            except RuntimeError as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
    return rows


def _rank_main(rank: int, world: int, backend: str, init_file: str, out_dir: str, nbytes: int) -> None:
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
        else:
            device = torch.device("cpu")
            x = torch.ones(nbytes // 4, dtype=torch.float32)
        for _ in range(ALLREDUCE_WARMUP):
            dist.all_reduce(x)
        times = []
        for _ in range(ALLREDUCE_ITERS):
            if backend == "nccl":
                torch.cuda.synchronize(device)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if backend == "nccl":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        x.fill_(1)
        dist.all_reduce(x)
        correct = bool(torch.all(x == world).item())
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"times_s": times, "correct": correct}))
    finally:
        dist.destroy_process_group()


def allreduce(world: int, *, backend: str, nbytes: int = ALLREDUCE_BYTES) -> dict[str, Any]:
    """All-reduce across `world` processes (one per GPU for nccl): bus bandwidth of the median iteration of the
    slowest rank, and whether the sum came out right."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vh-receipt-ar-") as tmp:
        init_file = os.path.join(tmp, "init")
        try:
            spawn(_rank_main, args=(world, backend, init_file, tmp, nbytes), nprocs=world, join=True)
        except Exception as exc:  # a rank that died: the receipt records it, the control plane decides
            return {"world": world, "backend": backend, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "seconds": round(time.perf_counter() - t0, 3)}
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    median_s = max(statistics.median(r["times_s"]) for r in ranks)
    busbw = 2.0 * (world - 1) / world * nbytes / GB / median_s
    return {"world": world, "backend": backend, "bytes": nbytes, "busbw_gbps": round(busbw, 2),
            "median_s": round(median_s, 6), "correct": all(r["correct"] for r in ranks),
            "seconds": round(time.perf_counter() - t0, 3)}
