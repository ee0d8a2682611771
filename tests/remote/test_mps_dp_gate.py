"""The DP gate for MPS at world size 2 (gloo, CPU): every rank reports its attachment before any rank
aborts, a disagreement is a run-level error on every rank naming the odd rank, and nobody hangs."""

from __future__ import annotations

import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2

pytestmark = pytest.mark.slow  # two ranks spawned per test, up to a minute each on 2 cores


def _worker(rank: int, port: int, outcomes: list, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      VH_MPS_MODE="on")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from remote import mps
    from remote.training import train

    def fake_attach(role: str, rank: int | None, device_index: int) -> dict:
        outcome = outcomes[rank]
        if outcome == "not-attached":
            raise mps.MpsNotAttached(f"rank {rank}: CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 0")
        if outcome == "daemon-unreachable":
            raise mps.MpsError(f"rank {rank}: the control daemon does not answer")
        return {"mode": outcome, "pid": os.getpid(), "role": role, "rank": rank}

    mps.attach_current_process = fake_attach  # the real one needs a GPU and a daemon
    try:
        rec = train.attach_mps(rank, 0, WORLD)
        queue.put((rank, "ok", rec["mode"]))
    except train.RunError as exc:
        queue.put((rank, "error", str(exc)))
    finally:
        dist.destroy_process_group()


def _run(outcomes: list[str]) -> dict[int, tuple[str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_worker, args=(port, outcomes, queue), nprocs=WORLD, join=True, start_method="spawn")
    results = {}
    for _ in range(WORLD):
        rank, status, detail = queue.get(timeout=60)
        results[rank] = (status, detail)
    return results


def test_ranks_that_agree_pass():
    assert _run(["on", "on"]) == {0: ("ok", "on"), 1: ("ok", "on")}


@pytest.mark.parametrize("odd", ["off", "not-attached", "daemon-unreachable"])
def test_a_disagreeing_rank_stops_every_rank_and_is_named(odd):
    results = _run(["on", odd])
    for rank in range(WORLD):
        status, detail = results[rank]
        assert status == "error", results
        assert "ranks [1] differ" in detail and "rank 1:" in detail
        if odd == "daemon-unreachable":  # an MpsError is reported like a missing attachment, never a hang
            assert "rank 1: MpsError: rank 1: the control daemon does not answer" in detail
