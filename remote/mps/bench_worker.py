"""One benchmark process: a learner (large bf16 GEMMs) or a helper (many small kernels) on GPU 0.

Started by remote.mps.bench with VH_MPS_MODE set. It initialises CUDA, proves its MPS state with
`attach_current_process` (on: attached; off: attribute 0), prints one JSON line, then serves phases
read from stdin as JSON lines. In a phase, an active worker runs steps until `t_end`; only steps that
start at or after `t_start` and finish by `t_end` count (the rest is warm-up). CLOCK_MONOTONIC is
system-wide on Linux, so all workers share the parent's time.monotonic() deadlines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

LEARNER_N = 8192
LEARNER_GEMMS_PER_STEP = 4


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Work:
    def __init__(self, torch: Any, role: str) -> None:
        self.torch, self.role = torch, role
        self.cache: dict[int, tuple[Any, ...]] = {}

    def tensors(self, n: int) -> tuple[Any, ...]:
        if n not in self.cache:
            g = self.torch.Generator(device="cuda").manual_seed(n)
            bf16 = self.torch.bfloat16
            a, b = (self.torch.randn(n, n, device="cuda", dtype=bf16, generator=g) for _ in range(2))
            self.cache[n] = (a, b, self.torch.empty(n, n, device="cuda", dtype=bf16))
        return self.cache[n]

    def step(self, size: int, kernels: int) -> float:
        """One step; returns its work: TFLOP for the learner, kernel launches for a helper."""
        if self.role == "learner":
            a, b, c = self.tensors(LEARNER_N)
            for _ in range(LEARNER_GEMMS_PER_STEP):
                self.torch.matmul(a, b, out=c)
            self.torch.cuda.synchronize()
            return LEARNER_GEMMS_PER_STEP * 2 * LEARNER_N**3 / 1e12
        a, b, c = self.tensors(size)
        for _ in range(kernels):
            self.torch.matmul(a, b, out=c)
        self.torch.cuda.synchronize()  # a helper waits on its batch, as a collector would
        return float(kernels)


def run_phase(work: Work, cmd: dict[str, Any]) -> dict[str, Any]:
    if not cmd["active"]:
        return {"steps": 0}
    times, done = [], 0.0
    while True:
        t0 = time.monotonic()
        if t0 >= cmd["t_end"]:
            break
        units = work.step(cmd["size"], cmd["kernels"])
        t1 = time.monotonic()
        if t0 >= cmd["t_start"] and t1 <= cmd["t_end"]:
            times.append(t1 - t0)
            done += units
    window = cmd["t_end"] - cmd["t_start"]
    return {"steps": len(times), "work": done, "throughput": done / window, "step_times_s": times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="remote.mps.bench_worker")
    p.add_argument("--role", choices=("learner", "helper"), required=True)
    p.add_argument("--cpu", type=int, help="pin to this CPU core (host-side launch jitter stays put)")
    a = p.parse_args(argv)
    if a.cpu is not None and a.cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {a.cpu})
    import torch

    from remote.mps.attach import MpsNotAttached, attach_current_process

    torch.cuda.set_device(0)
    work = Work(torch, a.role)
    work.step(256, 1)  # CUDA context + cuBLAS handle before the attachment check
    try:
        record = attach_current_process(a.role, 0, 0)
    except MpsNotAttached as exc:
        _emit({"ready": False, "error": str(exc)})
        return 1
    _emit({"ready": True, "record": record})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "exit":
            break
        _emit(run_phase(work, cmd))
    torch.cuda.synchronize()  # never leave with GPU work in flight under MPS (docs/mps.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
