"""Model, FLOPs, peaks, attention choice, Merkle and profiles: in-process, CPU, fast."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from remote.accounting import mfu
from remote.accounting.merkle import merkle_root
from remote.attention import backend as attention
from remote.training.model import ModelConfig, build_model, linear_cross_entropy, rope_tables
from remote.training.profiles import ProfileError, load_profile


def test_1b_flops_per_token_matches_the_formula() -> None:
    cfg = load_profile("mfu-dense-1b-dp1").model
    counts = cfg.param_counts()
    assert cfg.padded_vocab == 128256  # 501 * 256: already aligned
    assert counts["non_embedding"] == 16 * (2048 * 3072 + 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048) + 2048
    fpt = 6 * (counts["non_embedding"] + counts["lm_head"]) + 12 * 16 * 2048 * 2048
    assert cfg.flops_per_token() == fpt
    assert 8.2e9 < fpt < 8.25e9
    assert cfg.flops_per_token(causal_halved=True) == fpt - 6 * 16 * 2048 * 2048


def test_tiny_model_parameter_count_matches_config() -> None:
    cfg = load_profile("tiny-cpu").model
    model = build_model(cfg, torch.device("cpu"), seed=0)
    assert sum(p.numel() for p in model.parameters()) == cfg.param_counts()["total"]
    assert model.tok_embeddings.weight.dtype == torch.bfloat16


def test_rope_tables_are_cached_per_key() -> None:
    cfg = load_profile("tiny-cpu").model
    a = rope_tables(cfg, 64, torch.float32, torch.device("cpu"))
    assert rope_tables(cfg, 64, torch.float32, torch.device("cpu")) is a
    assert rope_tables(cfg, 32, torch.float32, torch.device("cpu")) is not a
    assert rope_tables(cfg, 64, torch.bfloat16, torch.device("cpu"))[0].dtype == torch.bfloat16


def test_linear_cross_entropy_matches_reference_loss_and_grads() -> None:
    torch.manual_seed(0)
    h = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 40, (50,))
    ref = F.cross_entropy(h @ w.t(), t)
    ref.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    loss = linear_cross_entropy(h, w, t, chunk_tokens=16)  # 4 chunks, the last one ragged
    (loss * 2).backward()
    assert torch.allclose(loss.double(), ref)
    # fp32 accumulation inside (as on GPU): compare at fp32 precision
    assert torch.allclose(h.grad, 2 * gh, rtol=1e-4, atol=1e-6)
    assert torch.allclose(w.grad, 2 * gw, rtol=1e-4, atol=1e-6)


def test_model_config_refuses_bad_shapes() -> None:
    cfg = load_profile("tiny-cpu").model
    with pytest.raises(ValueError, match="n_kv_heads"):
        dataclasses.replace(cfg, n_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=8, vocab_size=8, seq_len=4,
                    dtype="int8")


@pytest.mark.parametrize(("name", "tflops"), [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0),
                                              ("NVIDIA H100 PCIe", 756.0), ("NVIDIA GeForce RTX 5090", 209.5),
                                              ("NVIDIA A100-SXM4-80GB", 312.0)])
def test_peak_table(name: str, tflops: float) -> None:
    peak = mfu.peak_for(name)
    assert peak.tflops == tflops and "http" in peak.source


@pytest.mark.parametrize("name", ["NVIDIA H200 NVL", "Tesla T4", "cpu"])
def test_unknown_or_unsourced_gpu_is_refused_unless_peak_given(name: str) -> None:
    with pytest.raises(mfu.UnknownGpu, match="--peak-tflops"):
        mfu.peak_for(name)
    assert mfu.peak_for(name, 123.0).tflops == 123.0


def test_attention_refuses_when_no_fast_path_accepts() -> None:
    def reject(path, kv_mode, *rest):
        return None if path == "math" else f"{path} rejects head_dim 17"

    with pytest.raises(attention.AttentionUnavailable, match="--attention math"):
        attention.choose(torch.device("cuda"), torch.float32, 4, 2, 17, "auto", prober=reject)
    choice = attention.choose(torch.device("cuda"), torch.float32, 4, 2, 17, "math", prober=reject)
    assert (choice.path, choice.kv_mode) == ("math", "gqa")


def test_attention_probe_is_cached_per_key() -> None:
    calls = []

    def accept(*args):
        calls.append(args)

    for _ in range(3):
        attention.choose(torch.device("cuda"), torch.bfloat16, 32, 8, 64, "auto", prober=accept)
    assert len(calls) == 1 and calls[0][:2] == ("fa4", "gqa")


@pytest.mark.slow
def test_deterministic_mode_probes_fa4_det_then_cudnn_det_then_flash() -> None:
    """Strict deterministic mode: PyTorch's SDPA drops cuDNN, so FA4's deterministic backward (remote.attention.fa4)
    goes first, then cuDNN's own (remote.attention.cudnn_sdpa); when both wheels are missing the probe lands on flash."""
    tried = []

    def no_wheels(path, kv_mode, *rest):
        tried.append(f"{path}/{kv_mode}")
        return "no wheel" if path in ("fa4-det", "cudnn-det") else None

    torch.use_deterministic_algorithms(True)
    try:
        choice = attention.choose(torch.device("cuda"), torch.bfloat16, 16, 4, 32, "auto", prober=no_wheels)
        assert tried[:2] == ["fa4-det/gqa", "fa4-det/expand"] and tried[2] == "cudnn-det/gqa"
        assert choice.path == "flash" and {"fa4-det/gqa", "cudnn-det/gqa"} <= set(choice.rejected)
        got = attention.choose(torch.device("cuda"), torch.bfloat16, 16, 2, 32, "auto",
                               prober=lambda p, *a: "no wheel" if p == "fa4-det" else None)
        assert got.path == "cudnn-det"
        assert attention.choose(torch.device("cuda"), torch.bfloat16, 16, 1, 32, "auto",
                                prober=lambda *a: None).path == "fa4-det"
    finally:
        torch.use_deterministic_algorithms(False)
    assert attention.choose(torch.device("cuda"), torch.bfloat16, 16, 2, 32, "auto",
                            prober=lambda p, *a: "no wheel" if p == "fa4" else None).path == "cudnn"


def test_cudnn_det_ops_trace_with_the_models_layouts() -> None:
    """The custom ops' fake kernels (what torch.compile traces) give [B, H, T, D] views of [B, T, H, D]
    memory for out/dq/dk/dv and fp32 [B, H, T, 1] stats, so the output projection reads out with no copy."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remote.attention import cudnn_sdpa

    with FakeTensorMode():
        base = torch.empty(2, 64, 16 + 2 * 4, 32, dtype=torch.bfloat16)
        q, k, v = base.transpose(1, 2).split([16, 4, 4], dim=1)
        out, stats = cudnn_sdpa.sdpa_fwd(q, k, v)
        dq, dk, dv = cudnn_sdpa.sdpa_bwd(q, k, v, out, out, stats, True)
    assert out.shape == (2, 16, 64, 32) and out.transpose(1, 2).is_contiguous()
    assert stats.shape == (2, 16, 64, 1) and stats.dtype == torch.float32
    assert dk.shape == (2, 4, 64, 32) and dq.stride() == out.stride() and dv.transpose(1, 2).is_contiguous()
    assert cudnn_sdpa.available(torch.device("cpu"), torch.bfloat16, 16, 4, 32) == "cudnn-det needs CUDA"


def test_merkle_root_sees_order_name_dtype_and_bytes() -> None:
    a, b = torch.arange(6, dtype=torch.float32), torch.ones(2, 3)
    base = merkle_root([("a", a), ("b", b)])
    assert base == merkle_root([("b", b), ("a", a)])  # canonical (sorted) order
    assert base != merkle_root([("a", a.flip(0)), ("b", b)])  # element order matters (unlike XOR hashes)
    assert base != merkle_root([("a", a), ("c", b)])
    assert base != merkle_root([("a", a.double()), ("b", b)])
    assert base != merkle_root([("a", a.view(2, 3)), ("b", b)])
    assert len(merkle_root([("s", torch.tensor(3.0))])) == 64


@pytest.mark.parametrize("name", ["mfu-dense-1b-dp1", "mfu-dense-1b-dp2", "tiny-cpu"])
def test_profiles_load(name: str) -> None:
    assert load_profile(name).name == name


def test_bad_profiles_are_refused(tmp_path) -> None:
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        load_profile("nope")
    text = (load_profile.__globals__["PROFILE_DIR"] / "tiny-cpu.toml").read_text()
    (tmp_path / "tiny-cpu.toml").write_text(text.replace("micro_batch = 4", "micro_batch = 4\nbogus = 1"))
    with pytest.raises(ProfileError, match=r"\[train\]: unknown field\(s\) bogus"):
        load_profile("tiny-cpu", tmp_path)
    (tmp_path / "tiny-cpu.toml").write_text(text.replace("warmup_steps = 3", "warmup_steps = 1"))
    with pytest.raises(ProfileError, match="warmup_steps must be >= 3"):
        load_profile("tiny-cpu", tmp_path)
