"""The fused-MLP knob's own logic on CPU (remote/kernels/mlp.py): quack's GEMMs need a Hopper GPU, so a torch
stand-in with quack's documented conventions (gated pre-activation interleaved as (gate, up) column pairs)
takes their place. What is tested is ours: w13 kept in that interleaved row order while the kernel is attached
and handed back as [gate; up] in the run's state, the residual add in w2's GEMM, the custom ops' autograd and
fake kernels under torch.compile, the knobs, and the compatibility key for quack's epilogue cache. The GPU check (remote.kernels.check, section mlp) runs
quack itself against fp32 torch."""

from __future__ import annotations

import contextvars
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from remote import knobs
from remote.kernels import mlp


class FakeQuack:
    """quack.gemm_interface's four calls, in fp32 torch, with quack's layouts."""

    calls: list[str] = []

    @classmethod
    def gemm_gated(cls, a, b, activation, tuned):
        cls.calls.append(f"gemm_gated tuned={tuned}")
        assert activation == "swiglu"
        pre = a.float() @ b.float()  # b's columns are (gate, up) pairs: the epilogue pairs adjacent columns
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
    def gemm(cls, a, b, tuned=False, dynamic_scheduler=False):
        cls.calls.append("gemm")
        return (a.float() @ b.float()).to(a.dtype)


@pytest.fixture
def fake_quack(monkeypatch: pytest.MonkeyPatch) -> type[FakeQuack]:
    monkeypatch.setattr(mlp._Quack, "module", FakeQuack)
    FakeQuack.calls = []
    return FakeQuack


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 16, generator=gen)
    return x, torch.randn(24, 16, generator=gen) * 0.2, torch.randn(16, 12, generator=gen) * 0.2, \
        torch.randn(2, 8, 16, generator=gen), torch.randn(2, 8, 16, generator=gen)


def test_the_layouts_are_inverse_and_pair_gate_with_up() -> None:
    w = torch.arange(6 * 2).reshape(6, 2)  # rows g0 g1 g2 u0 u1 u2
    k = mlp.to_kernel_layout(w)
    assert k[:, 0].tolist() == [0, 6, 2, 8, 4, 10]  # g0 u0 g1 u1 g2 u2
    assert torch.equal(mlp.to_model_layout(k), w)


@pytest.mark.parametrize("gemms", ["fused", "all"])
@pytest.mark.parametrize("compiled", [False, True])
def test_fused_mlp_matches_the_model_formula(fake_quack, monkeypatch: pytest.MonkeyPatch, gemms: str,
                                             compiled: bool) -> None:
    monkeypatch.setenv("VH_MLP_GEMMS", gemms)
    x0, w13_0, w2_0, r0, dout = _inputs()
    ours = [t.clone().requires_grad_() for t in (x0, mlp.to_kernel_layout(w13_0), w2_0, r0)]
    fn = torch.compile(mlp.mlp, fullgraph=True, backend="aot_eager") if compiled else mlp.mlp
    out = fn(*ours)
    out.backward(dout)
    ref_in = [t.clone().requires_grad_() for t in (x0, w13_0, w2_0, r0)]
    ref = mlp.reference(*ref_in)  # [gate; up] = w13 rows, as FeedForward computes it without the kernel
    ref.backward(dout)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    ours[1].grad = mlp.to_model_layout(ours[1].grad)
    for got, want in zip(ours, ref_in, strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)
    quack_gemms = [c for c in fake_quack.calls if c == "gemm"]
    assert bool(quack_gemms) == (gemms == "all")  # `fused`: cuBLAS for the four plain GEMMs


def test_feedforward_uses_it_when_attached(fake_quack) -> None:
    from remote.training.model import FeedForward, ModelConfig

    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=12, vocab_size=32, seq_len=8,
                      dtype="float32")
    ffn = FeedForward(cfg)
    x, r = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    plain = ffn(x, r)
    ffn.mlp = mlp.mlp
    with torch.no_grad():
        ffn.w13.weight.copy_(mlp.to_kernel_layout(ffn.w13.weight))
    torch.testing.assert_close(ffn(x, r), plain, rtol=1e-5, atol=1e-5)
    assert fake_quack.calls[0].startswith("gemm_gated")


@pytest.mark.parametrize("reduction", ["ddp", "zero2"])
def test_an_attached_mlp_trains_the_same_model_and_states_it_canonically(fake_quack, monkeypatch, reduction) -> None:
    """apply_kernels interleaves w13 in place; a step with the kernel gives the plain path's loss, and the
    run's state (what the leaf root hashes) names the same parameters in the model's [gate; up] layout."""
    import torch.distributed as dist

    from remote.training import parallel
    from remote.training.model import ModelConfig, build_model
    from remote.training.profiles import TrainConfig

    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=12, vocab_size=32, seq_len=8,
                      dtype="float32")
    train = TrainConfig(micro_batch=2, steps=4)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        results = {}
        for with_mlp in (False, True):
            monkeypatch.setattr(parallel.registry, "active", lambda name, dev, on=with_mlp: on and name == "mlp")
            model = build_model(cfg, torch.device("cpu"), seed=5)
            plain_w13 = model.layers[0].ffn.w13.weight.detach().clone()
            runner = parallel.parallelize(model, parallel.ParallelConfig(reduction, train),
                                          parallel.World(dist.group.WORLD, torch.device("cpu")))
            held = model.layers[0].ffn.w13.weight.detach()
            assert torch.equal(held, mlp.to_kernel_layout(plain_w13) if with_mlp else plain_w13)
            losses = []
            for _ in range(2):
                losses.append(runner.forward_backward(tokens, tokens).item())
                runner.step()
            results[with_mlp] = (losses, dict(runner.canonical_state()))
        assert fake_quack.calls and fake_quack.calls[0].startswith("gemm_gated")
        (plain_losses, plain_state), (mlp_losses, mlp_state) = results[False], results[True]
        assert mlp_losses == pytest.approx(plain_losses, rel=1e-5)
        assert plain_state.keys() == mlp_state.keys()
        for name, want in plain_state.items():
            torch.testing.assert_close(mlp_state[name], want, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()


def test_knobs(monkeypatch: pytest.MonkeyPatch, knob_env) -> None:
    knob_env("VH_MLP_GEMMS", "some")
    with pytest.raises(knobs.KnobError, match="VH_MLP_GEMMS"):
        mlp.settings()
    knob_env("VH_MLP_GEMMS", "all")
    knob_env("VH_MLP_TUNED", "1")
    assert mlp.settings() == {"gemms": "all", "tuned": True}
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert mlp.settings()["tuned"] is False  # a timed choice could differ between a run and its replay
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(mlp._Quack, "error", "ImportError: no quack")  # deterministic runs may use it
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


def test_the_bench_strips_every_kernel_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evidence checker and the bench take the kernel knobs' prefixes from remote.knobs: a knob they
    missed would let a bench's `ours` run with it, and a record claim profile defaults it did not use."""
    import importlib.util
    from pathlib import Path

    from remote.checks import mfu as mfu_checks

    spec = importlib.util.spec_from_file_location(
        "bench_vs_reference", Path(__file__).resolve().parents[2] / "scripts/bench/bench_vs_reference.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert mfu_checks.KERNEL_PREFIXES is bench.KNOB_PREFIXES is knobs.KERNEL_PREFIXES
    assert all(name.startswith(knobs.KERNEL_PREFIXES) for name in knobs.KernelKnobs.env_names().values())
    monkeypatch.setenv("VH_MLP_GEMMS", "all")
    assert "VH_MLP_GEMMS" not in bench.user_env()
