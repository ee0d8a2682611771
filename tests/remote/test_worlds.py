"""The zero2/zero2o owner reduction at world sizes 2, 4 and 8 under gloo (remote/training/parallel.py says in which
order it adds): the reduced shards are the rank-order fold of the ranks' gradients, zero2o is bitwise zero2,
the bits do not depend on the bucket layout, and a deterministic round replays at world 4.

Ranks are forked from a forkserver that already imported torch (tests/remote/worlds.py), so a world of 8 on
the tiny profile costs seconds, not the ~16 s of importing torch eight times.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from remote.checks import mfu as mfu_check
from remote.training import parallel
from tests.remote.worlds import owner_reduction, run_world, train_main, train_main_where_rank0_passes_a_probe


def _main(tmp: Path, world: int, reduction: str, *extra: str, name: str = "", bucket_cap_mb: float | None = None,
          env: dict[str, str] | None = None) -> dict:
    out = tmp / f"{name or reduction}-w{world}.json"
    argv = ["--profile", "tiny-cpu", "--device", "cpu", "--reduction", reduction, "--peak-tflops", "1",
            "--out", str(out), *extra]
    result = run_world(world, train_main, argv, bucket_cap_mb, logs=tmp / f"logs-{out.stem}", env=env)
    assert result.ok, result.explain()
    return json.loads(out.read_text())


@pytest.mark.parametrize(("world", "reduction"), [(2, "zero2"), (4, "zero2o"), (8, "zero2o"), (8, "zero2")])
@pytest.mark.slow
def test_owner_reduction_is_the_rank_order_fold(tmp_path: Path, world: int, reduction: str) -> None:
    result = run_world(world, owner_reduction, str(tmp_path), reduction, 0.04, logs=tmp_path / "logs")
    assert result.ok, result.explain()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    assert {r["order"] for r in ranks} == {"rank"}
    n_buckets = len(ranks[0]["sent"])
    assert n_buckets >= 4  # the tiny profile's buckets are small enough that bucketing is exercised
    order_matters = False
    for b in range(n_buckets):
        shard = ranks[0]["sent"][b].numel() // world
        for owner in range(world):
            parts = torch.stack([ranks[r]["sent"][b][owner * shard:(owner + 1) * shard] for r in range(world)])
            expected = parallel.fold_in_rank_order(parts, out=torch.empty_like(parts[0]))
            assert torch.equal(ranks[owner]["got"][b], expected), (b, owner)
            reversed_fold = parallel.fold_in_rank_order(parts.flip(0), out=torch.empty_like(parts[0]))
            order_matters |= not torch.equal(reversed_fold, expected)
    # At world 2 one add is commutative; above it, these gradients do depend on the order, so the equality
    # above is a claim about the order and not only about the sum.
    assert order_matters == (world > 2)


@pytest.mark.parametrize("world", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_zero2o_is_bitwise_zero2(tmp_path: Path, world: int) -> None:
    steps = ("--deterministic", "--steps", "4")
    z2, z2o = (_main(tmp_path, world, r, *steps) for r in ("zero2", "zero2o"))
    assert z2["world_size"] == z2o["world_size"] == world
    assert z2["reduce_order"] == z2o["reduce_order"] == "rank"
    assert z2["leaf_root"] == z2o["leaf_root"]
    assert z2["loss_per_step"] == z2o["loss_per_step"]


@pytest.mark.slow
def test_rank_order_bits_do_not_depend_on_the_bucket_layout(tmp_path: Path) -> None:
    """Eight buckets or one: each element is still g0 + g1 + g2 + g3 in that order, so the roots agree."""
    steps = ("--deterministic", "--steps", "4")
    small = _main(tmp_path, 4, "zero2", *steps, name="small", bucket_cap_mb=0.04)
    whole = _main(tmp_path, 4, "zero2", *steps, name="whole", bucket_cap_mb=1.0)
    assert small["leaf_root"] == whole["leaf_root"]
    assert small["loss_per_step"] == whole["loss_per_step"]


@pytest.mark.slow
def test_backend_order_zero2o_is_bitwise_zero2(tmp_path: Path) -> None:
    """VH_REDUCE_ORDER=backend: the reduce_scatter_tensor path NCCL takes, here on gloo's own."""
    steps = ("--deterministic", "--steps", "4")
    env = {"VH_REDUCE_ORDER": "backend"}
    z2, z2o = (_main(tmp_path, 4, r, *steps, env=env) for r in ("zero2", "zero2o"))
    assert z2["reduce_order"] == "backend"
    assert z2["leaf_root"] == z2o["leaf_root"]
    assert z2["nccl_env"]["VH_REDUCE_ORDER"] == "backend"


@pytest.mark.slow
def test_deterministic_replay_at_world_4(tmp_path: Path) -> None:
    record = _main(tmp_path, 4, "zero2o", "--deterministic", "--replay", "--steps", "5")
    assert record["world_size"] == 4 and len(record["rank_optimizer_numel"]) == 4
    assert record["replay_match"] is True and record["replay_leaf_root"] == record["leaf_root"]
    assert record["replay_loss_per_step"] == record["loss_per_step"]
    assert mfu_check.check(tmp_path / "zero2o-w4.json") == []


@pytest.mark.slow
def test_ranks_whose_kernel_probes_disagree_stop_before_any_round(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    argv = ["--profile", "tiny-cpu", "--device", "cpu", "--reduction", "zero2", "--peak-tflops", "1", "--out", str(out)]
    result = run_world(2, train_main_where_rank0_passes_a_probe, argv, logs=tmp_path / "logs",
                       env={"VH_KERNELS": "loss"})
    assert result.exit_codes == [1, 1], result.explain()
    assert "ranks disagree on which kernels passed their probes (rank 0: loss; rank 1: none)" in result.logs[0]
    assert not out.exists()


@pytest.mark.slow
def test_an_unknown_reduce_order_is_refused_before_any_round(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    argv = ["--profile", "tiny-cpu", "--device", "cpu", "--reduction", "zero2", "--peak-tflops", "1", "--out", str(out)]
    result = run_world(1, train_main, argv, logs=tmp_path / "logs", env={"VH_REDUCE_ORDER": "ring"})
    assert result.exit_codes == [2]
    assert "VH_REDUCE_ORDER='ring'" in result.logs[0] and not out.exists()
