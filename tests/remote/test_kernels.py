"""The Triton kernels on CPU (interpreter): equivalence cases in a child pytest, and the whole tiny workload
with every kernel on, under gloo: zero2 == zero2o bitwise, replay matching, losses close to the torch path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
INTERPRET_ENV = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "TRITON_INTERPRET": "1",
                 "VH_KERNELS_CPU": "1"}


@pytest.mark.slow
def test_kernel_cases_under_the_triton_interpreter() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "remote" / "kernel_cases.py")], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=280, env=INTERPRET_ENV)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]


def run(out: Path, reduction: str, kernels: str, nproc: int, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", "tiny-cpu", "--device", "cpu",
           "--reduction", reduction, "--peak-tflops", "1", "--steps", "5", "--out", str(out), *extra]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env=INTERPRET_ENV | {"VH_KERNELS": kernels})
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["kernels"]["active"] == sorted(k for k in ("loss", "swiglu", "optim", "norm", "rope")
                                                 if kernels == "all" or k in kernels.split(","))
    return record


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_workload_with_every_kernel_zero2_equals_zero2o_and_replays(tmp_path: Path, nproc: int) -> None:
    z2 = run(tmp_path / "z2.json", "zero2", "all", nproc, "--deterministic", "--replay")
    z2o = run(tmp_path / "z2o.json", "zero2o", "all", nproc, "--deterministic")
    assert z2["replay_match"] is True and z2["replay_loss_per_step"] == z2["loss_per_step"]
    assert z2["leaf_root"] == z2o["leaf_root"] and z2["loss_per_step"] == z2o["loss_per_step"]
    torch_path = run(tmp_path / "none.json", "zero2", "none", nproc, "--deterministic")
    for a, b in zip(z2["loss_per_step"], torch_path["loss_per_step"], strict=True):
        assert abs(a - b) < 2e-3 * abs(b), (z2["loss_per_step"], torch_path["loss_per_step"])
    assert z2["leaf_root"] != torch_path["leaf_root"]  # the kernels really ran (different rounding)
