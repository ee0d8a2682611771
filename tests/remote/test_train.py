"""Two-process gloo runs of the tiny profile under torchrun: equality, replay, loss, sharding, evidence.

One run per reduction, shared by the module (each costs a few seconds on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remote.checks import mfu as mfu_check

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # torchrun processes, every test (the module's runs take a minute on 2 cores)


def torchrun(out: Path, reduction: str, *extra: str, nproc: int = 2) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", "tiny-cpu", "--device", "cpu",
           "--reduction", reduction, "--peak-tflops", "1", "--out", str(out), *extra]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attention backend: flash" in proc.stdout
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    tmp = tmp_path_factory.mktemp("runs")
    result = {}
    for reduction, extra in (("zero2", ("--deterministic", "--replay")), ("zero2o", ("--deterministic",)),
                             ("ddp", ("--deterministic",))):
        path = tmp / f"mfu-{reduction}.json"
        result[reduction] = (path, torchrun(path, reduction, *extra))
    return result


def test_zero2o_and_zero2_give_the_same_leaf_root(runs) -> None:
    z2, z2o = runs["zero2"][1], runs["zero2o"][1]
    assert z2["leaf_root"] == z2o["leaf_root"]
    assert z2["loss_per_step"] == z2o["loss_per_step"]


def test_replay_matches_in_a_fresh_process_group(runs) -> None:
    z2 = runs["zero2"][1]
    assert z2["replay_match"] is True
    assert z2["replay_leaf_root"] == z2["leaf_root"]
    assert z2["replay_loss_per_step"] == z2["loss_per_step"]


@pytest.mark.parametrize("reduction", ["ddp", "zero2", "zero2o"])
def test_loss_falls(runs, reduction: str) -> None:
    losses = runs[reduction][1]["loss_per_step"]
    assert losses[-1] < losses[0] - 0.3, losses


def test_zero2_optimizer_state_is_sharded(runs) -> None:
    full = runs["ddp"][1]["rank_optimizer_numel"]
    sharded = runs["zero2"][1]["rank_optimizer_numel"]
    assert len(sharded) == 2 and full[0] == full[1]
    for n in sharded:  # each rank holds ~1/world of it (shards are padded to alignment)
        assert 0.45 * full[0] <= n <= 0.6 * full[0]


@pytest.mark.parametrize("reduction", ["ddp", "zero2", "zero2o"])
def test_evidence_validates(runs, reduction: str) -> None:
    path, record = runs[reduction]
    assert mfu_check.check(path) == []
    assert record["world_size"] == 2 and record["reduction"] == reduction
    assert record["nccl_env"]["NCCL_NVLS_ENABLE"] == "0"
    assert len(record["step_times_s"]) == record["steps"] - record["warmup_steps"]


def test_world_of_one_without_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", "tiny-cpu",
                           "--device", "cpu", "--reduction", "zero2o", "--peak-tflops", "1", "--steps", "4",
                           "--out", str(out)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())["world_size"] == 1
    assert mfu_check.check(out) == []
