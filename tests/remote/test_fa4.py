"""FlashAttention-4 as an attention path (remote.attention.fa4): selection, fallback and tracing, on CPU.

The kernels themselves run only on a GPU (remote.kernels.check times and checks them there); here: the probe
refuses what cannot run it (CPU, unqualified architectures, a missing wheel) with a reason that lands in the
run record, the fast and deterministic orders put FA4 first, and the custom ops trace with the model's layouts.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from remote.attention import backend as attention
from remote.attention import fa4
from remote.training import evidence


@pytest.fixture(autouse=True)
def _fresh_probe_cache():
    attention._PROBED.clear()
    yield
    attention._PROBED.clear()
    torch.use_deterministic_algorithms(False)


def test_fa4_is_first_in_both_cuda_orders_and_never_on_cpu() -> None:
    assert attention.FAST_ORDER["cuda"][0] == "fa4" and attention.DETERMINISTIC_ORDER["cuda"][0] == "fa4-det"
    assert "fa4" not in attention.FAST_ORDER["cpu"] and "fa4-det" not in attention.DETERMINISTIC_ORDER["cpu"]
    assert attention.FA4_PATHS == {"fa4": False, "fa4-det": True}
    assert {"fa4", "fa4-det"} <= set(attention.CHOICES)


def test_cpu_refuses_fa4_with_a_reason() -> None:
    assert fa4.available(torch.device("cpu"), torch.bfloat16, 32, 8, 64) == "fa4 needs CUDA"
    reason = attention._try("fa4-det", "gqa", torch.device("cpu"), torch.bfloat16, 4, 2, 8)
    assert reason == "fa4 needs CUDA"
    assert attention._try("fa4", "expand", torch.device("cpu"), torch.bfloat16, 4, 2, 8).endswith("(gqa) only")


def test_asking_for_fa4_on_cpu_fails_loudly_naming_the_reason() -> None:
    with pytest.raises(attention.AttentionUnavailable, match="fa4/gqa: fa4 needs CUDA"):
        attention.choose(torch.device("cpu"), torch.bfloat16, 4, 2, 8, "fa4")


@pytest.mark.parametrize(("cap", "qualified"), [((9, 0), True), ((10, 0), True), ((12, 0), False), ((8, 0), False)])
def test_only_measured_architectures_try_fa4(monkeypatch, cap, qualified) -> None:
    """sm120 (the RTX 5090 hosts) and older chips keep cuDNN/flash: FA4 is not tried there at all."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(fa4, "interface", lambda: object())
    reason = fa4.unqualified(torch.device("cuda", 0))
    assert (reason is None) == qualified
    if not qualified:
        assert f"sm{cap[0]}{cap[1]}" in reason


def test_a_missing_wheel_is_a_reason_not_a_crash(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(fa4, "_IFACE", None)
    monkeypatch.setattr(fa4, "_IMPORT_ERROR", None)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))  # e.g. FA2 shadowing it
    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn.cute.interface", raising=False)
    reason = fa4.unqualified(torch.device("cuda", 0))
    assert reason.startswith("flash-attn-4 is not importable (") and "Error" in reason


def test_fast_run_falls_back_to_cudnn_and_records_why() -> None:
    def no_fa4(path, kv_mode, *rest):
        return "flash-attn-4 is not importable (ModuleNotFoundError)" if path == "fa4" else None

    choice = attention.choose(torch.device("cuda"), torch.bfloat16, 32, 8, 64, "auto", prober=no_fa4)
    assert choice.path == "cudnn"
    assert choice.rejected == {"fa4/gqa": "flash-attn-4 is not importable (ModuleNotFoundError)",
                               "fa4/expand": "flash-attn-4 is not importable (ModuleNotFoundError)"}


def test_deterministic_run_prefers_fa4_det_when_it_qualifies() -> None:
    torch.use_deterministic_algorithms(True)
    assert attention.choose(torch.device("cuda"), torch.bfloat16, 32, 8, 64, "auto",
                            prober=lambda *a: None).path == "fa4-det"


def test_activate_routes_sdpa_through_the_fa4_op_with_the_right_backward(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(fa4, "attention", lambda q, k, v, det=False: calls.append(det) or q)
    q = torch.zeros(1, 4, 8, 2)
    try:
        for path, det in (("fa4", False), ("fa4-det", True)):
            attention.activate(attention.Choice(path, "gqa", {}))
            assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
            attention.sdpa(q, q[:, :2], q[:, :2])
            assert calls[-1] is det
    finally:
        attention.activate(attention.Choice("flash", "gqa", {}))
        attention._ACTIVE = None
        torch.backends.cuda.enable_math_sdp(True)
        torch.backends.cuda.enable_cudnn_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)


def test_fa4_ops_trace_with_the_models_layouts() -> None:
    """The fake kernels (what torch.compile traces): out is [B, T, H, D] contiguous (so the wrapper's [B, H, T, D]
    view feeds the output projection with no copy), lse fp32 [B, H, T], grads shaped like their inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        base = torch.empty(2, 64, 16 + 2 * 4, 32, dtype=torch.bfloat16)
        q, k, v = base.transpose(1, 2).split([16, 4, 4], dim=1)
        out, lse = fa4.fa4_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True)
        dq, dk, dv = fa4.fa4_bwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out, out, lse, True)
        view = fa4.attention(q, k, v)
    assert out.shape == (2, 64, 16, 32) and out.is_contiguous() and lse.shape == (2, 16, 64)
    assert lse.dtype == torch.float32 and dk.shape == (2, 64, 4, 32) and dq.shape == out.shape
    assert view.shape == (2, 16, 64, 32) and view.transpose(1, 2).is_contiguous()


def test_the_record_names_the_path_and_the_fa4_versions() -> None:
    rec = attention.versions(attention.Choice("fa4-det", "gqa", {}))
    assert rec["path"] == "fa4-det" and set(fa4.PACKAGES) == set(rec["fa4_packages"])


def test_step_spread_shows_an_alternating_step() -> None:
    s = evidence.step_spread([0.450, 0.465, 0.449, 0.466, 0.451])
    assert s["min_ms"] == pytest.approx(449) and s["max_ms"] == pytest.approx(466)
    assert s["alternation_ms"] == pytest.approx(465.5 - 450, abs=1e-6)
    assert evidence.step_spread([]) == {}


def test_steptrace_splits_a_trace_by_step_and_compares_the_slow_one(tmp_path) -> None:
    from remote.accounting import steptrace

    ev = []
    for step, t0, scale in ((3, 0, 1.0), (4, 1000, 1.1)):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"vh_step_{step}", "ts": t0, "dur": 100})
        for i, name in enumerate(("nvjet_tst_128x256", "cudnn_sdpa_bwd", "triton_red_fused_rms")):
            corr = step * 10 + i
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 1 + i, "dur": 1,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t0 + 200 + 100 * i, "dur": 90 * scale,
                       "args": {"correlation": corr}})
    path = tmp_path / "t.json"
    path.write_text(__import__("json").dumps({"traceEvents": ev}))
    rec = steptrace.report(path)
    assert rec["steps"][3]["kernels"] == 3 and rec["steps"][3]["families_ms"]["gemm"] == pytest.approx(0.09)
    sv = rec["slow_vs_fast"]
    assert (sv["slow_step"], sv["fast_step"]) == (4, 3)
    assert sv["families_ms"]["attention"] == [pytest.approx(0.099), pytest.approx(0.09)]
