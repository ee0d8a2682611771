"""The hand-written Triton kernels against torch references, on CPU tensors through Triton's interpreter.

Run by tests/remote/test_kernels.py in a child pytest with TRITON_INTERPRET=1 set before Triton is
imported (Triton's own library functions are bound to the interpreter at import time). Small shapes with ragged edges (rows and columns that are not multiples of the tile); fresh random inputs
per test; outputs poisoned first where the kernel writes into a given buffer; every kernel run twice on the
same input must give the same bits (deterministic mode relies on it). The GPU versions of the same checks,
at the 1B shapes, are `python -m remote.kernels.check` (scripts/gpu/h200_kernels.sh).
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run through tests/remote/test_kernels.py (needs TRITON_INTERPRET=1 from the start)",
                allow_module_level=True)
pytest.importorskip("triton")

import torch
import torch.nn.functional as F

from remote.kernels import adamw, jit, loss, norm, registry, rope, swiglu
from remote.training.model import ModelConfig, apply_rope, linear_cross_entropy, rope_tables


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch, knob_env) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    knob_env("VH_KERNELS_CPU", "1")
    assert jit.runs_triton(torch.device("cpu"))


def within_one_bf16_ulp(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """The interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest even): allow one ulp."""
    ref = ref.float()
    return bool(((out.float() - ref).abs() <= ref.abs() * 2.0 ** -7 + 1e-30).all())


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


def test_every_triton_kernel_is_active_here_and_mlp_says_why_not(knob_env) -> None:
    cpu = torch.device("cpu")
    assert registry.requested() == frozenset(registry.names())
    assert [n for n in registry.names() if registry.active(n, cpu)] == ["loss", "norm", "optim", "rope", "swiglu"]
    assert "CUDA" in (registry.rejection("mlp", cpu) or "")  # quack's GEMMs: CUDA sm90/sm100 only
    knob_env("VH_KERNELS", "loss, optim")
    assert registry.active("loss", cpu) and not registry.active("swiglu", cpu)


def test_kernels_stay_off_on_cpu_without_the_test_switch(monkeypatch: pytest.MonkeyPatch, knob_env) -> None:
    knob_env("VH_KERNELS_CPU", None)
    assert not registry.active("loss", torch.device("cpu"))
    knob_env("VH_KERNELS_CPU", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not registry.active("loss", torch.device("cpu"))


@pytest.mark.parametrize("config", [{"ROWS": 1, "BLOCK": 64, "num_warps": 4, "programs": 0},
                                    {"ROWS": 16, "BLOCK": 128, "num_warps": 4, "programs": 3}])
def test_ce_rows_match_the_reference_and_write_every_element(config: dict) -> None:
    n, v, scale = 37, 301, 1.0 / 50
    logits = (torch.randn(n, v) * 4).to(torch.bfloat16)
    targets = torch.randint(0, v, (n,))
    x = logits.double()
    ref_loss = torch.logsumexp(x, -1) - x.gather(1, targets[:, None]).squeeze(1)
    ref_grad = (torch.softmax(x, -1) - F.one_hot(targets, v).double()) * scale
    outs = []
    for _ in range(2):
        buf = logits.clone()
        row_loss = torch.full((n,), float("nan"))
        loss.ce_rows_inplace(buf, targets, row_loss, scale, config)
        assert rel_err(row_loss, ref_loss) < 1e-5
        assert rel_err(buf, ref_grad) < 1e-2  # one bf16 rounding of each gradient element
        outs.append((buf, row_loss))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_ce_rows_equal_the_torch_reference_within_rounding() -> None:
    logits = torch.randn(20, 130).to(torch.bfloat16)
    targets = torch.randint(0, 130, (20,))
    a, b = logits.clone(), logits.clone()
    la, lb = torch.empty(20), torch.empty(20)
    loss.ce_rows_reference(a, targets, la, 0.25)
    loss.ce_rows_inplace(b, targets, lb, 0.25, {"ROWS": 8, "BLOCK": 32, "num_warps": 4, "programs": 0})
    assert torch.allclose(la, lb, rtol=1e-6, atol=1e-6)
    assert (a.float() - b.float()).abs().max() <= 2 ** -8 * 0.25  # at most one bf16 ulp of the scale


@pytest.mark.parametrize("chunk", [16, 23, 64])
def test_fused_linear_cross_entropy_matches_fp64_and_the_unfused_path(chunk: int) -> None:
    n, d, v = 50, 24, 77
    h = torch.randn(n, d).to(torch.bfloat16)
    w = (torch.randn(v, d) * 0.5).to(torch.bfloat16)
    t = torch.randint(0, v, (n,))
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    F.cross_entropy(hd @ wd.t(), t).backward()
    total, grad_h, grad_w = loss.forward_backward(h, w, t, chunk, use_triton=True)
    ref = F.cross_entropy(h.double() @ w.double().t(), t)
    assert abs(total.item() - ref.item()) < 2e-3 * ref.item()  # bf16 logits: each one rounded once
    assert grad_w.dtype == torch.float32 and grad_h.dtype == torch.bfloat16
    assert rel_err(grad_h, hd.grad) < 1e-2 and rel_err(grad_w, wd.grad) < 1e-2
    # the model's autograd entry: fused and unfused agree within bf16 tolerance, grad_out is honoured
    grads, losses = [], []
    for fused in (False, True):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        out = linear_cross_entropy(hh, ww, t, chunk, fused=fused)
        (2 * out).backward()
        grads.append((hh.grad, ww.grad))
        losses.append(out.item())
    assert abs(losses[0] - losses[1]) < 1e-5 * losses[0]  # the same bf16 logits, fp32 sums
    assert rel_err(grads[1][0], grads[0][0]) < 1e-2 and rel_err(grads[1][1], grads[0][1]) < 1e-2
    assert rel_err(grads[1][1], 2 * wd.grad) < 1e-2
    again = loss.forward_backward(h, w, t, chunk, use_triton=True)
    assert all(torch.equal(a, b) for a, b in zip((total, grad_h, grad_w), again, strict=True))


def test_scale_cast_is_one_rounding_of_the_product() -> None:
    src = torch.randn(1000, 7)
    out = loss.scale_cast(src, torch.tensor(0.75), torch.bfloat16, use_triton=True)
    assert out.dtype == torch.bfloat16 and within_one_bf16_ulp(out, src * 0.75)


@pytest.mark.parametrize(("rows", "ffn"), [(70, 96), (5, 130)])
def test_swiglu_backward_matches_autograd_in_fp64(rows: int, ffn: int) -> None:
    gu = torch.randn(rows, 2 * ffn).to(torch.bfloat16)
    dact = torch.randn(rows, ffn).to(torch.bfloat16)
    ref_in = gu.double().requires_grad_()
    g, u = ref_in.chunk(2, -1)
    (F.silu(g) * u).backward(dact.double())
    config = {"ROWS": 16, "BLOCK": 64, "num_warps": 4}
    out = swiglu.backward_triton(dact, gu, config)
    assert rel_err(out, ref_in.grad) < 1e-2
    assert torch.equal(out, swiglu.backward_triton(dact, gu, config))
    # against the fp32 reference it is the same math: at most one bf16 rounding apart
    g, u = gu.float().chunk(2, -1)
    sg, da = torch.sigmoid(g), dact.float()
    assert within_one_bf16_ulp(out, torch.cat([da * u * (sg * (1 + g * (1 - sg))), da * (g * sg)], -1))


@pytest.mark.parametrize(("rows", "ffn"), [(70, 96), (5, 130)])
def test_swiglu_forward_is_one_rounding_of_the_fp32_product(rows: int, ffn: int) -> None:
    gu = torch.randn(2, rows, 2 * ffn).to(torch.bfloat16)
    config = {"ROWS": 16, "BLOCK": 64, "num_warps": 4}
    out = swiglu.forward_triton(gu, config)
    g, u = gu.float().chunk(2, -1)
    assert out.shape == (2, rows, ffn) and within_one_bf16_ulp(out, F.silu(g) * u)
    assert torch.equal(out, swiglu.forward_triton(gu, config))


def test_swiglu_op_gives_the_unfused_gradients_and_traces_under_compile() -> None:
    x = torch.randn(3, 11, 2 * 40).to(torch.bfloat16)
    up = torch.randn(3, 11, 40).to(torch.bfloat16)
    grads = []
    for fn in (lambda t: F.silu(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1], swiglu.swiglu):
        t = x.clone().requires_grad_()
        fn(t).backward(up)
        grads.append(t.grad)
    assert rel_err(grads[1], grads[0]) < 1e-2
    torch._dynamo.reset()
    compiled = torch.compile(swiglu.swiglu, backend="aot_eager", fullgraph=True)
    t = x.clone().requires_grad_()
    compiled(t).backward(up)
    assert torch.equal(t.grad, grads[1])


def test_fused_adamw_matches_torch_adamw_over_steps() -> None:
    n, lr, b1, b2, wd = 3001, 1e-2, 0.9, 0.95, 0.1
    p0 = torch.randn(n)
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([ref], lr=lr, betas=(b1, b2), weight_decay=wd, foreach=False)
    fused = adamw.FusedMasterAdamW([p0.to(torch.bfloat16)], lr, b1, b2, wd)
    fused.masters[0].copy_(p0)  # same fp32 start as the reference
    out = torch.full((n,), float("nan"), dtype=torch.bfloat16)
    for _ in range(4):
        g = torch.randn(n).to(torch.bfloat16)
        ref.grad = g.float()
        opt.step()
        fused.begin_step()
        fused.update(0, g, out)
    assert fused.state(0)["step"].item() == opt.state[ref]["step"].item() == 4
    assert rel_err(fused.masters[0], ref.detach()) < 1e-6
    assert rel_err(fused.exp_avg_sq[0], opt.state[ref]["exp_avg_sq"]) < 1e-6
    assert within_one_bf16_ulp(out, fused.masters[0])


def test_fused_adamw_kernel_is_the_reference_update_and_repeats_bitwise() -> None:
    n = 2500
    g = torch.randn(n).to(torch.bfloat16)
    start = [torch.randn(n), torch.randn(n) * 0.1, torch.rand(n) * 0.01]
    hp = adamw.hyper(3e-3, 0.9, 0.95, 0.1, 1e-8, step=3)
    results = []
    for kernel in ("triton", "triton", "reference"):
        master, m, v = (t.clone() for t in start)
        out = torch.full((n,), float("nan"), dtype=torch.bfloat16)
        if kernel == "triton":
            adamw.step_triton(g, master, m, v, out, hp, grad_scale=0.5, config={"BLOCK": 256, "num_warps": 4})
        else:
            adamw.step_reference(g, master, m, v, out, hp, grad_scale=0.5)
        results.append((master, m, v, out))
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1], strict=True))
    for a, b in zip(results[0][:3], results[2][:3], strict=True):  # fp32 state: a few ulps apart
        assert rel_err(a, b) < 1e-6
    assert rel_err(results[0][3], results[2][3]) < 1e-2  # the bf16 weights: at most one rounding apart


@pytest.mark.parametrize(("rows", "d", "config"), [(37, 96, None), (5, 80, {"ROWS": 1, "num_warps": 4,
                                                                              "BWD_ROWS": 2, "programs": 3})])
def test_add_rmsnorm_kernels_match_the_torch_reference_and_repeat_bitwise(rows: int, d: int, config) -> None:
    x, r, dy, dh = (torch.randn(rows, d).to(torch.bfloat16) for _ in range(4))
    w = (1 + 0.1 * torch.randn(d)).to(torch.bfloat16)
    h, y, rstd = norm.forward_triton(x, r, w, 1e-5, config)
    assert h is not None and within_one_bf16_ulp(h, x.float() + r.float())
    _h, y_ref, rstd_ref = norm.forward_reference(h, None, w, 1e-5)  # the norm of the kernel's own h
    assert rel_err(rstd, rstd_ref) < 1e-6 and rel_err(y, y_ref) < 1e-2
    assert within_one_bf16_ulp(y, h.float() * rstd_ref[:, None] * w.float())
    dx, dw = norm.backward_triton(dy, dh, h, w, rstd, config)
    dx_ref, dw_ref = norm.backward_reference(dy, dh, h, w, rstd)
    assert rel_err(dx, dx_ref) < 1e-2 and rel_err(dw, dw_ref) < 1e-2
    again = (*norm.forward_triton(x, r, w, 1e-5, config), *norm.backward_triton(dy, dh, h, w, rstd, config))
    assert all(torch.equal(a, b) for a, b in zip((h, y, rstd, dx, dw), again, strict=True))
    y_plain = norm.forward_triton(x, None, w, 1e-5, config)[1]
    assert rel_err(y_plain, norm.forward_reference(x, None, w, 1e-5)[1]) < 1e-2


def test_norm_ops_give_autograd_gradients_of_the_unfused_block_and_trace_under_compile() -> None:
    """h, y = x + r, rms_norm(h): the fused op's gradients (dx = dr, the residual's own gradient added in
    the same pass, dw) against fp32 autograd of the torch formula."""
    x, r, w = torch.randn(3, 9, 64), torch.randn(3, 9, 64), 1 + 0.1 * torch.randn(64)
    up_h, up_y = torch.randn(3, 9, 64), torch.randn(3, 9, 64)

    def loss_of(fused: bool, xx, rr, ww):
        if fused:
            hh, yy = norm.add_rmsnorm(xx, rr, ww, 1e-5)
            z = norm.rmsnorm(hh, ww, 1e-5)
        else:
            hh = xx + rr
            yy = F.rms_norm(hh, (64,), ww, 1e-5)
            z = F.rms_norm(hh, (64,), ww, 1e-5)
        return (hh.float() * up_h).sum() + (yy.float() * up_y).sum() + (z.float() * up_y).sum()

    ref = [t.clone().requires_grad_() for t in (x, r, w)]
    loss_of(False, *ref).backward()
    got = [t.to(torch.bfloat16).requires_grad_() for t in (x, r, w)]
    loss_of(True, *got).backward()
    for a, b in zip(got, ref, strict=True):
        assert rel_err(a.grad, b.grad) < 2e-2
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: loss_of(True, *a), backend="aot_eager", fullgraph=True)
    again = [t.detach().to(torch.bfloat16).requires_grad_() for t in (x, r, w)]
    compiled(*again).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(again, got, strict=True))


def test_rope_kernel_matches_the_model_rotation_and_its_backward_is_the_inverse() -> None:
    cfg = ModelConfig(d_model=96, n_layers=1, n_heads=6, n_kv_heads=2, ffn_hidden=64, vocab_size=100, seq_len=13)
    cos, sin = rope_tables(cfg, 13, torch.bfloat16, torch.device("cpu"))
    qkv = torch.randn(2, 13, 10, 16).to(torch.bfloat16)
    q, k, v = rope.forward_triton(qkv, cos, sin, 6, 2)
    assert q.shape == (2, 13, 6, 16) and k.shape == v.shape == (2, 13, 2, 16) and q.is_contiguous()
    assert torch.equal(v, qkv[:, :, 8:])
    ref = qkv.float().requires_grad_()
    rq, rk, rv = ref.transpose(1, 2).split([6, 2, 2], dim=1)
    rq, rk = apply_rope(rq, cos.float(), sin.float()), apply_rope(rk, cos.float(), sin.float())
    assert within_one_bf16_ulp(q, rq.transpose(1, 2)) and within_one_bf16_ulp(k, rk.transpose(1, 2))
    grads = [torch.randn(2, 13, h, 16).to(torch.bfloat16) for h in (6, 2, 2)]
    ((rq * grads[0].float().transpose(1, 2)).sum() + (rk * grads[1].float().transpose(1, 2)).sum()
     + (rv * grads[2].float().transpose(1, 2)).sum()).backward()
    dqkv = rope.backward_triton(*grads, cos, sin)
    assert rel_err(dqkv, ref.grad) < 1e-2 and torch.equal(dqkv[:, :, 8:], grads[2])
    assert torch.equal(dqkv, rope.backward_triton(*grads, cos, sin))
    assert torch.equal(q, rope.forward_triton(qkv, cos, sin, 6, 2)[0])
    # one token per program (the GPU launch, its own table-load branch) gives the same bits as the CPU tiles
    assert all(torch.equal(a, b) for a, b in zip(rope.forward_triton(qkv, cos, sin, 6, 2, tokens=1), (q, k, v),
                                                 strict=True))
    assert torch.equal(rope.backward_triton(*grads, cos, sin, tokens=1), dqkv)
    x = qkv.clone().requires_grad_()
    outs = rope.rope_qkv(x, cos, sin, 6, 2)
    sum((o.float() * g.float()).sum() for o, g in zip(outs, grads, strict=True)).backward()
    assert torch.equal(x.grad, dqkv)


def test_every_probe_passes_here_and_a_failing_one_keeps_its_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for module in (loss, swiglu, adamw, norm, rope):
        assert module.qualify(cpu) is None, module.__name__
    assert registry.active("norm", cpu) and registry.active("rope", cpu)
    monkeypatch.setattr(registry.default(), "probes", {})
    monkeypatch.setattr(rope, "backward_triton", lambda *a: rope.backward_reference(*a) * 1.5)
    assert "dqkv relative error" in (rope.qualify(cpu) or "")
    assert not registry.active("rope", cpu) and registry.active("norm", cpu)
    record = registry.describe(cpu)
    assert "dqkv" in record["rejected"]["rope"] and record["probes"]["rope"]["passed"] is False
    assert record["probes"]["norm"]["passed"] is True and "rope" not in record["active"]


@pytest.mark.parametrize(("module", "name", "written", "wrong"), [
    (loss, "ce_rows_inplace", 0, "loss grad_h relative error"),  # the gradient, over the logits buffer
    (swiglu, "backward_triton", None, "swiglu dgu relative error"),  # its return value
    (adamw, "step_triton", 1, "adamw master relative error"),  # the master weights, in place
])
def test_a_probe_sees_a_kernel_that_is_a_little_wrong(monkeypatch: pytest.MonkeyPatch, module, name: str,
                                                      written: int | None, wrong: str) -> None:
    """The probes added for loss, swiglu and optim are real checks: 5% off in what the kernel writes fails them."""
    good = getattr(module, name)

    def off_by_five_percent(*args, **kwargs):
        out = good(*args, **kwargs)
        (out if written is None else args[written]).mul_(1.05)
        return out

    monkeypatch.setattr(module, name, off_by_five_percent)
    assert wrong in (module.qualify(torch.device("cpu")) or "")


def test_block_with_norm_and_rope_kernels_matches_the_torch_block_and_compiles() -> None:
    """The model wiring (Block.norms, Attention.rope): the same block's output and every gradient within bf16
    rounding of the torch path, and the per-layer compile (aot_eager here) giving the eager kernels' bits."""
    from remote.training.model import build_model

    cfg = ModelConfig(d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab_size=64, seq_len=24)
    block = build_model(cfg, torch.device("cpu"), 0).layers[0]
    cos, sin = rope_tables(cfg, 24, torch.bfloat16, torch.device("cpu"))
    x = torch.randn(2, 24, 64).to(torch.bfloat16)

    def run() -> list[torch.Tensor]:
        block.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        y = block(xx, cos, sin)
        (y.float() * torch.linspace(-1, 1, 64)).sum().backward()
        return [y.detach(), xx.grad, *(p.grad for p in block.parameters())]

    torch_path = run()
    block.norms, block.attn.rope = norm, rope.rope_qkv
    kernel_path = run()
    for a, b in zip(kernel_path, torch_path, strict=True):
        assert rel_err(a, b) < 2e-2
    torch._dynamo.reset()
    block.compile(fullgraph=True, backend="aot_eager")
    assert all(torch.equal(a, b) for a, b in zip(run(), kernel_path, strict=True))
