"""Worlds of N gloo ranks for the tests, without torchrun.

Ranks are forked from a forkserver that has imported torch once, so a rank starts in milliseconds instead of
spending ~2 s of a shared CPU importing torch: a world of 8 costs what its steps cost. Each rank gets the
environment torchrun would give it (RANK, WORLD_SIZE, MASTER_ADDR/PORT), one CPU thread, and a log file.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "remote.training.train", "tests.remote.worlds"])


@dataclass
class World:
    exit_codes: list[int | None]
    logs: list[str]

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.exit_codes)

    def explain(self) -> str:
        return "\n".join(f"--- rank {r} exit {rc}\n{log[-2500:]}"
                         for r, (rc, log) in enumerate(zip(self.exit_codes, self.logs, strict=True)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(fn: Callable[..., int | None], rank: int, world: int, port: int, log: str, env: dict[str, str],
           args: tuple[Any, ...]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    import torch

    torch.set_num_threads(1)
    try:
        rc = fn(*args)
    except BaseException:  # noqa: BLE001 - the traceback goes to the rank's log, the exit code says it failed
        traceback.print_exc()
        rc = 70
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc or 0)  # no atexit: a forked rank must not run the parent's exit handlers


def run_world(world: int, fn: Callable[..., int | None], *args: Any, logs: Path, env: dict[str, str] | None = None,
              timeout_s: float = 180) -> World:
    """fn(*args) on `world` ranks at once; every rank is waited for (or killed at the timeout)."""
    logs.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    paths = [logs / f"rank{r}.log" for r in range(world)]
    procs = [_CTX.Process(target=_entry, args=(fn, r, world, port, str(paths[r]), env or {}, args))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode if p.exitcode is not None else -9 for p in procs]
    return World(exit_codes=codes, logs=[path.read_text() if path.exists() else "" for path in paths])


def train_main(argv: list[str], bucket_cap_mb: float | None = None) -> int:
    """remote.training.train.main, the workload's entry point, optionally with the profile's bucket size replaced."""
    from remote.training import train

    if bucket_cap_mb is not None:
        import dataclasses

        load = train.load_profile

        def load_with_buckets(name: str):  # type: ignore[no-untyped-def]
            prof = load(name)
            return dataclasses.replace(prof, train=dataclasses.replace(prof.train, bucket_cap_mb=bucket_cap_mb))

        train.load_profile = load_with_buckets  # this rank's process only
    return train.main(argv)


def train_main_where_rank0_passes_a_probe(argv: list[str]) -> int:
    """remote.training.train.main, where only rank 0's registry says `loss` runs here and passed its probe (a
    GPU whose probe disagrees with its peers'): no rank may start a round."""
    import dataclasses

    from remote.kernels import registry
    from remote.training import train

    if os.environ["RANK"] == "0":
        reg = registry.default()
        loss = dataclasses.replace(reg.get("loss"), runs_on=lambda device: None, probe=lambda device: None)
        registry._DEFAULT = registry.Registry.of([loss, *(k for k in reg.kernels.values() if k.name != "loss")])
    return train.main(argv)


def owner_reduction(out_dir: str, reduction: str, bucket_cap_mb: float) -> int:
    """One step of the tiny model through the real Zero2Runner; saves what this rank put into the owner
    reduction (every bucket's flat gradient) and what it got back (its reduced shards)."""
    import dataclasses
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from remote.training import data, parallel
    from remote.training.model import build_model
    from remote.training.profiles import load_profile

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    profile = load_profile("tiny-cpu")
    cfg, train = profile.model, dataclasses.replace(profile.train, bucket_cap_mb=bucket_cap_mb)
    model = build_model(cfg, torch.device("cpu"), train.seed)
    runner = parallel.parallelize(model, parallel.ParallelConfig(reduction, train), parallel.World(
        dist.group.WORLD, torch.device("cpu")))
    assert isinstance(runner, parallel.Zero2Runner)
    tokens, targets = data.batch(train.seed, rank, 0, 2, cfg.seq_len, cfg.vocab_size, torch.device("cpu"))
    runner.forward_backward(tokens, targets)
    sent = [b.flat_grad.clone() for b in runner.buckets]  # zero2o: read while its collectives are in flight
    runner.step()
    torch.save({"sent": sent, "got": [b.shard_grad.clone() for b in runner.buckets],
                "order": runner.reduce_order}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()
    return 0
