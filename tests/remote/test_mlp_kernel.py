"""The fused-MLP knob's own logic on CPU (remote/kernels/mlp.py): quack's GEMMs need a Hopper GPU, so a torch
stand-in with quack's documented conventions (gated pre-activation interleaved as (gate, up) column pairs,
`concat_layout` reading a [gate; up] operand as interleaved) takes their place. What is tested is ours: the
row (de)interleaving around cuBLAS, the custom ops' autograd and fake kernels under torch.compile, the knobs,
and the compatibility key for quack's epilogue cache. The GPU check (remote.kernels.check, section mlp) runs
quack itself against fp32 torch."""

from __future__ import annotations

import contextvars
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from remote import kernels
from remote.kernels import mlp


def _interleave_cols(b: torch.Tensor) -> torch.Tensor:
    k, n = b.shape
    return b.reshape(k, 2, n // 2).transpose(1, 2).reshape(k, n)


class FakeQuack:
    """quack.gemm_interface's four calls, in fp32 torch, with quack's layouts."""

    calls: list[str] = []

    @classmethod
    def gemm_gated(cls, a, b, activation, concat_layout, tuned):
        cls.calls.append(f"gemm_gated tuned={tuned}")
        assert activation == "swiglu" and concat_layout == ("B",)
        pre = a.float() @ _interleave_cols(b).float()
        return pre.to(a.dtype), (F.silu(pre[:, 0::2]) * pre[:, 1::2]).to(a.dtype)

    @classmethod
    def gemm_dgated(cls, a, b, pre, activation, dynamic_scheduler, tuned):
        cls.calls.append(f"gemm_dgated tuned={tuned}")
        dact = a.float() @ b.float()
        g, u = pre[:, 0::2].float(), pre[:, 1::2].float()
        sg = torch.sigmoid(g)
        dpre = torch.stack([dact * u * sg * (1 + g * (1 - sg)), dact * g * sg], -1).reshape(a.shape[0], -1)
        return dpre.to(a.dtype), (F.silu(g) * u).to(a.dtype)

    @classmethod
    def gemm(cls, a, b, tuned=False, dynamic_scheduler=False, concat_layout=None):
        cls.calls.append(f"gemm {concat_layout}")
        if concat_layout == ("B",):
            b = mlp._interleave_rows(b)
        out = (a.float() @ b.float()).to(a.dtype)
        return mlp._deinterleave_rows(out) if concat_layout == ("out",) else out


@pytest.fixture
def fake_quack(monkeypatch: pytest.MonkeyPatch) -> type[FakeQuack]:
    monkeypatch.setattr(mlp._Quack, "module", FakeQuack)
    FakeQuack.calls = []
    return FakeQuack


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 16, generator=gen)
    return x, torch.randn(24, 16, generator=gen) * 0.2, torch.randn(16, 12, generator=gen) * 0.2, \
        torch.randn(2, 8, 16, generator=gen)


@pytest.mark.parametrize("gemms", ["fused", "all"])
@pytest.mark.parametrize("compiled", [False, True])
def test_fused_mlp_matches_the_model_formula(fake_quack, monkeypatch: pytest.MonkeyPatch, gemms: str,
                                             compiled: bool) -> None:
    monkeypatch.setenv("VH_MLP_GEMMS", gemms)
    x0, w13_0, w2_0, dout = _inputs()
    ours = [t.clone().requires_grad_() for t in (x0, w13_0, w2_0)]
    fn = torch.compile(mlp.mlp, fullgraph=True, backend="aot_eager") if compiled else mlp.mlp
    out = fn(*ours)
    out.backward(dout)
    ref_in = [t.clone().requires_grad_() for t in (x0, w13_0, w2_0)]
    ref = mlp.reference(*ref_in)  # [gate; up] = w13 rows, as FeedForward computes it
    ref.backward(dout)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(ours, ref_in):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)
    quack_gemms = [c for c in fake_quack.calls if c.startswith("gemm ")]
    assert bool(quack_gemms) == (gemms == "all")  # `fused`: cuBLAS for the four plain GEMMs


def test_feedforward_uses_it_when_attached(fake_quack) -> None:
    from remote.model import FeedForward, ModelConfig

    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=12, vocab_size=32, seq_len=8,
                      dtype="float32")
    ffn = FeedForward(cfg)
    x = torch.randn(2, 8, 16)
    plain = ffn(x)
    ffn.mlp = mlp.mlp
    torch.testing.assert_close(ffn(x), plain, rtol=1e-5, atol=1e-5)
    assert fake_quack.calls[0].startswith("gemm_gated")


def test_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VH_MLP_GEMMS", "some")
    with pytest.raises(kernels.KnobError, match="VH_MLP_GEMMS"):
        mlp.settings()
    monkeypatch.setenv("VH_MLP_GEMMS", "all")
    monkeypatch.setenv("VH_MLP_TUNED", "1")
    assert mlp.settings() == {"gemms": "all", "tuned": True}
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert mlp.settings()["tuned"] is False  # a timed choice could differ between a run and its replay
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "deterministic" in (mlp.qualify(torch.device("cuda")) or "")
    monkeypatch.setenv("VH_MLP_DETERMINISTIC", "1")  # past that gate, the next one: quack importable here?
    monkeypatch.setattr(mlp._Quack, "error", "ImportError: no quack")
    assert "not importable" in (mlp.qualify(torch.device("cuda")) or "")
    assert "CUDA" in (mlp.qualify(torch.device("cpu")) or "")


def test_epilogue_cache_key_accepts_what_quack_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """quack 0.6.5 + nvidia-cutlass-dsl 4.8.1: its epilogue key raises on cutlass's location helpers."""

    def strict_key(value, seen):
        if isinstance(value, (int, str)):
            return ("prim", value)
        if isinstance(value, tuple):
            return ("tuple", tuple(identity.semantic_value_key(v, seen) for v in value))
        raise TypeError(f"epilogue fn depends on {value!r}, which has no fail-closed semantic key.")

    identity = types.ModuleType("quack.gemm_runtime.identity")
    identity.semantic_value_key = strict_key
    frontend = types.ModuleType("quack.operand_transform.frontend")
    frontend._semantic_value_key = strict_key
    for name, module in (("quack", types.ModuleType("quack")), ("quack.gemm_runtime", types.ModuleType("g")),
                         ("quack.gemm_runtime.identity", identity), ("quack.operand_transform.frontend", frontend)):
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["quack.gemm_runtime"].identity = identity  # type: ignore[attr-defined]
    mlp._key_context_vars_by_name()
    key = identity.semantic_value_key
    var = contextvars.ContextVar("_LOC_TRANSFORMS", default=())
    assert key((1, var, "a"), set()) == ("tuple", (("prim", 1), ("contextvar", "_LOC_TRANSFORMS"), ("prim", "a")))
    assert key(type(var).__init__, set())[0] == "opaque"  # a method descriptor, like code.co_positions
    assert frontend._semantic_value_key is key
    mlp._key_context_vars_by_name()  # twice: not wrapped twice
    assert identity.semantic_value_key is key

    def other_error(value, seen):
        raise TypeError("something else")

    identity.semantic_value_key = other_error
    mlp._key_context_vars_by_name()
    with pytest.raises(TypeError, match="something else"):
        identity.semantic_value_key(1, set())


def test_the_knob_prefix_copies_follow_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evidence checker and the bench keep torch-free copies of kernels.ENV_PREFIXES: a knob they miss
    would let a bench's `ours` run with it, and a record claim profile defaults it did not use."""
    import importlib.util
    from pathlib import Path

    from remote.checks import mfu as mfu_checks

    spec = importlib.util.spec_from_file_location(
        "bench_vs_reference", Path(__file__).resolve().parents[2] / "scripts" / "bench_vs_reference.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert mfu_checks.KNOB_PREFIXES == bench.KNOB_PREFIXES == kernels.ENV_PREFIXES
    monkeypatch.setenv("VH_MLP_DETERMINISTIC", "1")
    assert "VH_MLP_DETERMINISTIC" not in bench.user_env()
