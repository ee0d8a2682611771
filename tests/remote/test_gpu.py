"""GPU-only tests: the proofs profile runs these on the rented host, where a skip fails the step.

They travel in the workload bundle and use only the standard library, PyTorch, pytest and `remote/`.
Elsewhere (CI has no GPU) they skip; `python -m remote.host.plan no-skips` turns any skip into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cuda_visible_and_bf16_matmul():
    """The GPU computes: a bf16 product on fresh random data against an fp64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = torch.randn(4096, 4096, device="cuda", generator=gen)
    b = torch.randn(4096, 4096, device="cuda", generator=gen)
    out = (a.bfloat16() @ b.bfloat16()).double()
    ref = a.double() @ b.double()
    rel = ((out - ref).norm() / ref.norm()).item()
    assert torch.isfinite(out).all()
    assert rel < 1e-2, f"bf16 relative error {rel:.2e} (bf16 operands land between 1e-3 and 1e-2)"


def test_attention_fast_path_selected():
    """The 1B shape gets the fast SDPA path the profile qualifies, never the math fallback."""
    from remote.attention import backend as attention
    from remote.training.profiles import load_profile

    profile = load_profile("mfu-dense-1b-dp1")
    m = profile.model
    choice = attention.choose(torch.device("cuda"), torch.bfloat16, m.n_heads, m.n_kv_heads, m.d_model // m.n_heads)
    print(f"attention backend: {choice.describe()}")
    assert choice.path in profile.required_attention, (choice.path, choice.rejected)
    assert choice.path != "math"


def test_deterministic_step_bitwise(tmp_path):
    """Two fresh processes, same seed, deterministic mode: the same leaf root, bit for bit."""
    out = tmp_path / "det.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", "tiny-cpu", "--device", "cuda",
           "--reduction", "zero2o", "--deterministic", "--replay", "--steps", "5", "--peak-tflops", "989",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["replay_match"] is True, (data.get("leaf_root"), data.get("replay_leaf_root"))


def test_mps_attached():
    """Under the proofs profile the tests run inside `python -m remote.mps`: this process must be a client."""
    if os.environ.get("VH_MPS_MODE") != "on":
        pytest.skip("not running under remote.mps (VH_MPS_MODE != on)")
    from remote import mps

    torch.zeros(1, device="cuda")  # create the CUDA context first: attachment happens at context creation
    record = mps.attach_current_process(role="gpu-test", rank=None, device_index=0)
    assert record["mode"] == "on"
    assert record["mps_enabled_attr"] == 1, record
    assert record["device_uuid"] and record["device_uuid"].startswith("GPU-")
