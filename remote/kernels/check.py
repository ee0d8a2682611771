"""On the GPU: every registered kernel's probe, then each kernel against its torch reference at the 1B shapes,
timed against the path it replaces and against the copy ceiling measured here.

    python -m remote.kernels.check --out kernels-check.json [--tokens 32768] [--only probes,loss,...]
    TRITON_INTERPRET=1 python -m remote.kernels.check --small --out x.json    the same code paths on CPU

Section `probes` runs the registry's probe of every kernel on this device (what a run does before using one),
so one call proves them all; the kernels measured so far also have sections of their own (`KERNEL_SECTIONS`).
Correctness per section: fresh random inputs, outputs poisoned first where the kernel writes into a
given buffer, ||out - ref|| / ||ref|| against an fp32 (or fp64) reference, two runs on the same input compared
bit for bit. Timing: CUDA events (triton.testing.do_bench), median. Exit 1 if any check fails. With --small a
kernel that cannot run on CPU at all (`mlp`: quack's GEMMs) is recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from remote import knobs
from remote.kernels import jit, registry
from remote.kernels.registry import grads

if TYPE_CHECKING:
    from remote.training.model import CeKernel

SHAPES = {"d_model": 2048, "ffn": 8192, "vocab": 128256, "ce_rows": 8192, "adamw_check": 64 * 2**20,
          "params": 1_235_814_400, "heads": 32, "kv_heads": 8, "head_dim": 64, "seq": 2048}  # params: non-embedding + embedding parameters of the 1B profile
# --small: the same code paths at toy sizes, for a dry run on CPU through Triton's interpreter
SMALL = {"d_model": 32, "ffn": 48, "vocab": 300, "ce_rows": 40, "adamw_check": 5000, "params": 7000,
         "heads": 4, "kv_heads": 2, "head_dim": 8, "seq": 16}


INTERPRETER_ROUNDS = "Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU to nearest even)"


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float(((out - ref).norm() / ref.norm()).item())


def bench_ms(fn: Callable[[], object]) -> float:
    if not torch.cuda.is_available():  # dry run: one call, host clock
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


class Report:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.timings: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.skipped: dict[str, str] = {}

    def skip(self, name: str, why: str) -> None:
        self.skipped[name] = why
        print(f"[check] skip {name}: {why}", flush=True)

    def gpu_fact(self, dev: torch.device, name: str, value: bool, cpu_differs: str) -> None:
        """A check of what the GPU does that a CPU dry run cannot show (recorded as skipped there, with why)."""
        if dev.type == "cuda":
            self.check(name, value)
        elif not value:
            self.skip(name, cpu_differs)
        else:
            self.check(name, value)

    def check(self, name: str, value: float | bool, limit: float | None = None) -> None:
        ok = bool(value) if limit is None else (not math.isnan(value) and value < limit)
        self.checks.append({"name": name, "value": value, "limit": limit, "ok": ok})
        print(f"[check] {'ok  ' if ok else 'FAIL'} {name}: {value}" + (f" (< {limit})" if limit else ""),
              flush=True)

    def time(self, name: str, ms: float, nbytes: float | None = None, note: str = "") -> None:
        row = {"name": name, "ms": ms, "bytes": nbytes, "tb_s": nbytes / ms / 1e9 if nbytes else None,
               "note": note}
        self.timings.append(row)
        bw = f" {row['tb_s']:.2f} TB/s" if nbytes else ""
        print(f"[time] {name}: {ms:.3f} ms{bw} {note}", flush=True)


def copy_ceiling(rep: Report, dev: torch.device, sh: dict[str, Any]) -> float:
    src = torch.randn(2**29 if dev.type == "cuda" else 2**16, device=dev, dtype=torch.float32)  # 2 GiB
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    rep.time("copy 2 GiB (read+write)", ms, 2 * src.numel() * 4)
    return 2 * src.numel() * 4 / ms / 1e9


def check_probes(rep: Report, dev: torch.device) -> None:
    """Every registered kernel as a run would decide it on this device: where it can run at all, then its probe
    (a small fwd/bwd against the torch reference path, the same bits twice), timed."""
    reg = registry.default()
    for name, kernel in reg.kernels.items():
        cannot = kernel.runs_on(dev)
        if cannot is not None and dev.type != "cuda":
            rep.skip(f"probe {name}", cannot)
            continue
        if cannot is not None:
            rep.check(f"probe {name}: runs here ({cannot})", False)
            continue
        result = reg.probe(name, dev)
        rep.check(f"probe {name}: matches the torch path, bitwise twice ({result.reason or 'ok'})",
                  result.reason is None)
        rep.time(f"probe {name}", result.seconds * 1e3)


def check_ce(rep: Report, dev: torch.device, sh: dict[str, Any]) -> None:
    from remote.kernels import loss

    rows, VOCAB = sh["ce_rows"], sh["vocab"]
    logits = (torch.randn(rows, VOCAB, device=dev) * 3).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (rows,), device=dev)
    ref_buf, ref_loss = logits.clone(), torch.empty(rows, device=dev)
    loss.ce_rows_reference(ref_buf, targets, ref_loss, 1.0 / rows)
    outs = []
    for _ in range(2):
        buf, row_loss = logits.clone(), torch.full((rows,), float("nan"), device=dev)
        loss.ce_rows_inplace(buf, targets, row_loss, 1.0 / rows)
        outs.append((buf, row_loss))
    rep.check("ce: row loss rel err vs fp32 torch", rel(outs[0][1], ref_loss), 1e-5)
    rep.check("ce: gradient rel err vs fp32 torch", rel(outs[0][0], ref_buf), 1e-2)
    rep.check("ce: every row loss written", bool(torch.isfinite(outs[0][1]).all()))
    rep.check("ce: bitwise across two runs", torch.equal(outs[0][0], outs[1][0]) and
              torch.equal(outs[0][1], outs[1][1]))
    nbytes = 2 * logits.numel() * 2  # the floor: read once, write once
    base = _compiled_ce(dev)
    rep.time(f"ce baseline (Inductor _ce_chunk) {rows}x{VOCAB}",
             bench_ms(lambda: base(logits, targets, 1.0)), nbytes)
    work = logits.clone()
    row_loss = torch.empty(rows, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    configs = [{"ROWS": 1, "BLOCK": 2048, "num_warps": 4, "programs": 0},
               {"ROWS": 1, "BLOCK": 4096, "num_warps": 4, "programs": 0},
               {"ROWS": 1, "BLOCK": 4096, "num_warps": 8, "programs": 0},
               {"ROWS": 1, "BLOCK": 8192, "num_warps": 8, "programs": 0},
               {"ROWS": 1, "BLOCK": 8192, "num_warps": 16, "programs": 0},
               {"ROWS": 1, "BLOCK": 8192, "num_warps": 16, "programs": sms},
               {"ROWS": 1, "BLOCK": 16384, "num_warps": 16, "programs": sms},
               {"ROWS": 1, "BLOCK": 8192, "num_warps": 8, "programs": 2 * sms},
               {"ROWS": 2, "BLOCK": 4096, "num_warps": 8, "programs": 0}]
    default = loss.launch_config(dev, rows)
    for cfg in configs:
        work.copy_(logits)
        ms = bench_ms(partial(loss.ce_rows_inplace, work, targets, row_loss, 1e-9, cfg))
        tag = " (default)" if cfg == default else ""
        rep.time(f"ce triton {cfg}{tag}", ms, nbytes)


_COMPILED: dict[str, Any] = {}


def _compiled_ce(dev: torch.device) -> CeKernel:
    """The baseline's loss kernel, compiled once and shared by the two sections that time it."""
    from remote.training.model import _ce_chunk

    if dev.type != "cuda":
        return _ce_chunk
    if "ce" not in _COMPILED:
        _COMPILED["ce"] = torch.compile(_ce_chunk, fullgraph=True)
    compiled: CeKernel = _COMPILED["ce"]
    return compiled


def check_loss_path(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    from remote.kernels import loss
    from remote.training.model import linear_cross_entropy

    D_MODEL, VOCAB = sh["d_model"], sh["vocab"]
    chunks = (8192, 16384, 32768) if dev.type == "cuda" else (16, 32, 64)
    h = torch.randn(tokens, D_MODEL, device=dev).to(torch.bfloat16)
    w = (torch.randn(VOCAB, D_MODEL, device=dev) * 0.02).to(torch.bfloat16)
    t = torch.randint(0, VOCAB, (tokens,), device=dev)
    rep.gpu_fact(dev, "loss: fp32-accumulating GEMM available (addmm out_dtype=float32)",
                 loss.fp32_accumulate_gemm(dev), "this torch has no fp32-accumulating bf16 GEMM on CPU")
    compiled = _compiled_ce(dev)
    results: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}
    for name, fused, chunk in (("baseline", False, chunks[0]), *(("fused", True, c) for c in chunks)):
        def run(fused: bool = fused, chunk: int = chunk) -> tuple[torch.Tensor, ...]:
            hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
            out = linear_cross_entropy(hh, ww, t, chunk, compiled, fused=fused)
            out.backward()
            return (out.detach(), *grads(hh, ww))

        results[(name, chunk)] = run()
        cuda = dev.type == "cuda"
        torch.cuda.reset_peak_memory_stats(dev) if cuda else None
        ms = bench_ms(run)
        peak = torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else 0.0
        rep.time(f"loss path {name} chunk {chunk} ({tokens} tokens, fwd+bwd)", ms, note=f"peak {peak:.1f} GiB")
    base = results[("baseline", chunks[0])]
    for key, val in results.items():
        if key[0] != "fused":
            continue
        rep.check(f"loss chunk {key[1]}: loss rel diff vs baseline", rel(val[0], base[0]), 1e-4)
        rep.check(f"loss chunk {key[1]}: grad_h rel err vs baseline", rel(val[1], base[1]), 2e-2)
        rep.check(f"loss chunk {key[1]}: grad_w rel err vs baseline", rel(val[2], base[2]), 2e-2)
    def again() -> torch.Tensor:
        return linear_cross_entropy(h.detach().requires_grad_(), w, t, chunks[0], fused=True)

    rep.check("loss: fused loss bitwise across two runs", torch.equal(again(), again()))
    src = torch.randn(VOCAB, D_MODEL, device=dev)
    rep.gpu_fact(dev, "loss: scale_cast == (src * s).to(bf16) bitwise",
                 torch.equal(loss.scale_cast(src, torch.tensor(0.5, device=dev), torch.bfloat16, True),
                             (src * 0.5).to(torch.bfloat16)), INTERPRETER_ROUNDS)


def check_swiglu(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    import torch.nn.functional as F

    from remote.kernels import swiglu

    FFN = sh["ffn"]
    gu = torch.randn(tokens, 2 * FFN, device=dev).to(torch.bfloat16)
    dact = torch.randn(tokens, FFN, device=dev).to(torch.bfloat16)
    g, u = gu.float().chunk(2, -1)
    act = swiglu.forward_triton(gu)
    rep.check("swiglu fwd rel err vs fp32 torch", rel(act, F.silu(g) * u), 1e-2)
    ref_act = (F.silu(g) * u).abs()
    rep.check("swiglu fwd within one bf16 ulp of fp32 torch",
              bool(((act.float() - F.silu(g) * u).abs() <= ref_act * 2.0**-7 + 1e-30).all()))
    dgu = swiglu.backward_triton(dact, gu)
    ref = swiglu.backward_reference(dact, gu)
    rep.check("swiglu bwd rel err vs fp32 torch", rel(dgu, ref), 1e-2)
    rep.check("swiglu bwd bitwise across two runs", torch.equal(dgu, swiglu.backward_triton(dact, gu)))
    n = tokens * FFN * 2
    fwd_bytes, bwd_bytes = 3 * n, 5 * n
    inductor_bwd = torch.compile(_inductor_swiglu_bwd, fullgraph=True) if dev.type == "cuda" else \
        _inductor_swiglu_bwd
    rep.time(f"swiglu bwd Inductor (cat formula) [{tokens}x{FFN}]", bench_ms(lambda: inductor_bwd(dact, gu)),
             bwd_bytes)
    default = swiglu.launch_config(dev)
    for cfg in ({"ROWS": 1, "BLOCK": 1024, "num_warps": 4}, {"ROWS": 1, "BLOCK": 2048, "num_warps": 8},
                {"ROWS": 4, "BLOCK": 1024, "num_warps": 8}, default):
        tag = " (default)" if cfg == default else ""
        rep.time(f"swiglu bwd triton {cfg}{tag}", bench_ms(partial(swiglu.backward_triton, dact, gu, cfg)),
                 bwd_bytes)
    rep.time("swiglu fwd triton (default)", bench_ms(lambda: swiglu.forward_triton(gu)), fwd_bytes)


def _inductor_swiglu_bwd(dact: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    """The ops of the unfused block's backward graph for silu(gate) * up, which Inductor fuses into the
    cat-shaped kernel the baseline profile shows."""
    gate, up = gu.chunk(2, dim=-1)
    sg = torch.sigmoid(gate)
    return torch.cat([dact * up * (sg * (1 + gate * (1 - sg))), dact * (gate * sg)], dim=-1)


def check_adamw(rep: Report, dev: torch.device, sh: dict[str, Any]) -> None:
    from remote.kernels import adamw

    n = sh["adamw_check"]
    g = torch.randn(n, device=dev).to(torch.bfloat16)
    start = [torch.randn(n, device=dev), torch.randn(n, device=dev) * 1e-3, torch.rand(n, device=dev) * 1e-6]
    hp = adamw.hyper(3e-4, 0.9, 0.95, 0.1, 1e-8, step=5)
    res = []
    for kind in ("triton", "triton", "reference"):
        master, m, v = (x.clone() for x in start)
        out = torch.full((n,), float("nan"), device=dev, dtype=torch.bfloat16)
        (adamw.step_triton if kind == "triton" else adamw.step_reference)(g, master, m, v, out, hp, 0.5)
        res.append((master, m, v, out))
    rep.check("adamw bitwise across two runs", all(torch.equal(a, b) for a, b in zip(res[0], res[1])))
    rep.check("adamw master rel err vs torch-op reference", rel(res[0][0], res[2][0]), 1e-6)
    rep.check("adamw exp_avg_sq rel err vs torch-op reference", rel(res[0][2], res[2][2]), 1e-6)
    rep.check("adamw bf16 weights written (no NaN left)", bool(torch.isfinite(res[0][3]).all()))
    # timed at the 1B parameter count: the fused pass vs the path it replaces (copy in, fused AdamW, copy out)
    del res, start
    p = sh["params"]
    grad = torch.randn(p, device=dev).to(torch.bfloat16)
    master = torch.randn(p, device=dev)
    moments = [torch.zeros(p, device=dev), torch.zeros(p, device=dev)]
    out = torch.empty(p, device=dev, dtype=torch.bfloat16)
    rep.time("adamw fused triton, 1.24e9 params",
             bench_ms(lambda: adamw.step_triton(grad, master, moments[0], moments[1], out, hp)), 28 * p)
    moments.clear()  # free 10 GB before the baseline allocates its own moments
    mp = torch.nn.Parameter(master)
    mp.grad = master_grad = torch.zeros_like(master)
    opt = torch.optim.AdamW([mp], lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=dev.type == "cuda")

    def old() -> None:
        master_grad.copy_(grad)
        opt.step()
        out.copy_(mp.detach())

    rep.time("adamw baseline: copy-in + torch fused AdamW + copy-out", bench_ms(old), 28 * p,
             note="(bytes counted as the fused floor)")


def check_norm(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    """residual add + RMSNorm (and plain RMSNorm), fwd+bwd: the Triton ops against fp32 torch and against
    Inductor's fusion of the same formula (what the per-layer graph runs without them), and quack's CuTe DSL
    rmsnorm where it imports (timing only)."""
    import torch.nn.functional as F

    from remote.kernels import norm

    d = sh["d_model"]
    x, r, dy, dh = (torch.randn(tokens, d, device=dev).to(torch.bfloat16) for _ in range(4))
    w = (1 + 0.1 * torch.randn(d, device=dev)).to(torch.bfloat16)
    h, y, rstd = norm.forward_triton(x, r, w, 1e-5)
    assert h is not None  # a residual was given
    rep.gpu_fact(dev, "norm: h == x + r (bf16 add) bitwise", torch.equal(h, x + r), INTERPRETER_ROUNDS)
    rep.check("norm fwd rel err vs fp32 torch", rel(y, F.rms_norm(h.float(), (d,), w.float(), 1e-5)), 1e-2)
    dx, dw = norm.backward_triton(dy, dh, h, w, rstd)
    hf, wf = h.float().requires_grad_(), w.float().requires_grad_()
    F.rms_norm(hf, (d,), wf, 1e-5).backward(dy.float())
    dhf, dwf = grads(hf, wf)
    rep.check("norm bwd dx rel err vs fp32 autograd", rel(dx, dhf + dh.float()), 1e-2)
    rep.check("norm bwd dw rel err vs fp32 autograd", rel(dw, dwf), 1e-2)
    rep.check("norm fwd+bwd bitwise across two runs",
              torch.equal(y, norm.forward_triton(x, r, w, 1e-5)[1]) and
              all(torch.equal(a, b) for a, b in zip((dx, dw), norm.backward_triton(dy, dh, h, w, rstd))))
    del hf, wf
    n = tokens * d * 2
    rep.time(f"norm add+rmsnorm fwd triton [{tokens}x{d}]", bench_ms(lambda: norm.forward_triton(x, r, w, 1e-5)),
             4 * n)
    default = norm.launch_config(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
    for cfg in (default, default | {"programs": 2 * sms}, default | {"programs": 8 * sms},
                default | {"BWD_ROWS": 4}, default | {"BWD_ROWS": 2, "num_warps": 4}):
        tag = " (default)" if cfg == default else ""
        rep.time(f"norm add+rmsnorm bwd triton (dx + dw, one pass) {cfg}{tag}",
                 bench_ms(partial(norm.backward_triton, dy, dh, h, w, rstd, cfg)), 4 * n)

    def fused_ops(xx: torch.Tensor, rr: torch.Tensor, ww: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return norm.add_rmsnorm(xx, rr, ww, 1e-5)

    def inductor_formula(xx: torch.Tensor, rr: torch.Tensor, ww: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hh = xx + rr
        return hh, F.rms_norm(hh, (d,), ww, 1e-5)

    NormFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    compiled: NormFn = torch.compile(inductor_formula, fullgraph=True) if dev.type == "cuda" else inductor_formula
    norm_paths: tuple[tuple[str, NormFn], ...] = (("triton ops", fused_ops), ("Inductor", compiled))
    for name, fn in norm_paths:
        def step(fn: NormFn = fn) -> None:
            xx, rr, ww = (t.detach().requires_grad_() for t in (x, r, w))
            hh, yy = fn(xx, rr, ww)
            torch.autograd.backward([hh, yy], [dh, dy])
        rep.time(f"norm add+rmsnorm fwd+bwd {name} [{tokens}x{d}]", bench_ms(step), 8 * n)
    try:
        from remote.attention import fa4

        fa4.interface()  # puts nvidia_cutlass_dsl's `cutlass` on sys.path (its .pth is not read from a --target)
        from quack.rmsnorm import rmsnorm as quack_rmsnorm  # noqa: PLC0415 - shipped with the FA4 wheels only

        def quack_step() -> tuple[torch.Tensor, ...]:
            xx, rr, ww = (t.detach().requires_grad_() for t in (x, r, w))
            yy, hh = quack_rmsnorm(xx, ww, residual=rr, eps=1e-5, prenorm=True)
            torch.autograd.backward([hh, yy], [dh, dy])
            return (yy, *grads(xx, ww))

        qy, qdx, qdw = quack_step()
        rep.time(f"norm quack rmsnorm(residual, prenorm) fwd+bwd [{tokens}x{d}] (dx rel {rel(qdx, dx):.2g}, "
                 f"dw rel {rel(qdw, dw):.2g} vs ours)", bench_ms(quack_step), 8 * n)
    except Exception as exc:  # noqa: BLE001 - quack is optional: its absence or API drift is recorded, not fatal
        rep.time(f"norm quack not timed: {type(exc).__name__}: {str(exc)[:120]}", float("nan"))


def check_rope(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    """RoPE on the fused qkv, fwd+bwd: the Triton ops against fp32 torch and against Inductor's kernels for
    the model's formula (transpose, split, rotate-half; backward the rotation plus the cat into d(qkv))."""
    from remote.kernels import rope
    from remote.training.model import ModelConfig, apply_rope, rope_tables

    heads, kv, hd, seq = sh["heads"], sh["kv_heads"], sh["head_dim"], sh["seq"]
    b = max(1, tokens // seq)
    cfg = ModelConfig(d_model=heads * hd, n_layers=1, n_heads=heads, n_kv_heads=kv, ffn_hidden=8, vocab_size=8,
                      seq_len=seq)
    cos, sin = rope_tables(cfg, seq, torch.bfloat16, dev)
    qkv = torch.randn(b, seq, heads + 2 * kv, hd, device=dev).to(torch.bfloat16)
    dq, dk, dv = (torch.randn(b, seq, h, hd, device=dev).to(torch.bfloat16) for h in (heads, kv, kv))
    out = rope.forward_triton(qkv, cos, sin, heads, kv)
    want = rope.forward_reference(qkv, cos, sin, heads, kv)
    rep.check("rope fwd q/k rel err vs fp32 torch", max(rel(out[0], want[0]), rel(out[1], want[1])), 1e-2)
    rep.check("rope fwd v copied bitwise", torch.equal(out[2], want[2]))
    dqkv = rope.backward_triton(dq, dk, dv, cos, sin)
    rep.check("rope bwd rel err vs fp32 torch", rel(dqkv, rope.backward_reference(dq, dk, dv, cos, sin)), 1e-2)
    rep.check("rope fwd+bwd bitwise across two runs", torch.equal(dqkv, rope.backward_triton(dq, dk, dv, cos, sin))
              and torch.equal(out[0], rope.forward_triton(qkv, cos, sin, heads, kv)[0]))
    n = qkv.numel() * 2
    rep.time(f"rope fwd triton [{b}x{seq}x{heads}+2x{kv}x{hd}]",
             bench_ms(lambda: rope.forward_triton(qkv, cos, sin, heads, kv)), 2 * n)
    rep.time("rope bwd triton (writes d(qkv))", bench_ms(lambda: rope.backward_triton(dq, dk, dv, cos, sin)), 2 * n)

    def inductor_formula(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = x.transpose(1, 2).split([heads, kv, kv], dim=1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def triton_ops(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return rope.rope_qkv(x, cos, sin, heads, kv)

    RopeFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    compiled: RopeFn = torch.compile(inductor_formula, fullgraph=True) if dev.type == "cuda" else inductor_formula
    bhtd = [g.transpose(1, 2) for g in (dq, dk, dv)]
    rope_paths: tuple[tuple[str, RopeFn, list[torch.Tensor]], ...] = (("triton ops", triton_ops, [dq, dk, dv]),
                                                              ("Inductor", compiled, bhtd))
    for name, fn, gs in rope_paths:
        def step(fn: RopeFn = fn, gs: list[torch.Tensor] = gs) -> None:
            x = qkv.detach().requires_grad_()
            torch.autograd.backward(list(fn(x)), gs)
        rep.time(f"rope fwd+bwd {name}", bench_ms(step), 4 * n)


def check_attention(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    """The custom attention paths (fa4 and fa4-det: remote.attention.fa4; cudnn-det: remote.attention.cudnn_sdpa) against an fp64
    math SDPA reference, the deterministic ones bitwise across two runs, and every path timed (fwd+bwd) at
    the model's layout."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from remote.attention import backend as attention
    from remote.attention import cudnn_sdpa, fa4

    if dev.type != "cuda":  # CUDA only; the SDPA paths' CPU behaviour is tests/remote's business
        return
    heads, kv, hd, seq = sh["heads"], sh["kv_heads"], sh["head_dim"], sh["seq"]
    batch = max(1, tokens // seq)
    reasons = {"cudnn-det": cudnn_sdpa.available(dev, torch.bfloat16, heads, kv, hd)}
    rep.check(f"attention: cudnn-det available (frontend {cudnn_sdpa.frontend_version()}; "
              f"{reasons['cudnn-det'] or 'ok'})", reasons["cudnn-det"] is None)
    for path, det in attention.FA4_PATHS.items():
        reasons[path] = fa4.available(dev, torch.bfloat16, heads, kv, hd, deterministic=det)
        rep.check(f"attention: {path} qualifies ({fa4.versions()}; {reasons[path] or 'ok'})", reasons[path] is None)

    def inputs(b: int, seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        gen = torch.Generator(device=dev).manual_seed(seed)
        base = torch.randn(b, seq, heads + 2 * kv, hd, device=dev, dtype=torch.bfloat16, generator=gen)
        base.requires_grad_(True)
        return base, base.transpose(1, 2).split([heads, kv, kv], dim=1)

    def fwd_bwd(path: str, base: torch.Tensor, qkv: tuple[torch.Tensor, ...], dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base.grad = None
        q, k, v = qkv
        out = attention._call(q, k, v, "gqa", path)
        out.backward(dout)
        return out.detach(), grads(base)[0].detach()

    b = 2
    base, qkv = inputs(b, 1)
    # dO as the model makes it: [B, T, H, D] memory (the output projection's input gradient), [B, H, T, D] view
    dout = torch.randn(b, seq, heads, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    ref_base = base.detach().double().requires_grad_(True)
    q, k, v = ref_base.transpose(1, 2).split([heads, kv, kv], dim=1)
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref.backward(dout.double())
    (ref_grad,) = grads(ref_base)
    for path in ("fa4", "fa4-det", "cudnn-det"):
        if reasons[path] is not None:
            continue
        runs = [fwd_bwd(path, base, qkv, dout) for _ in range(2)]
        if path != "fa4":
            rep.check(f"attention {path}: bitwise across two runs (out and dqkv)",
                      torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]))
        rep.check(f"attention {path}: out rel err vs fp64 math", rel(runs[0][0], ref), 1e-2)
        rep.check(f"attention {path}: dqkv rel err vs fp64 math", rel(runs[0][1], ref_grad), 2e-2)
        for name, sl in (("dq", slice(0, heads)), ("dk", slice(heads, heads + kv)), ("dv", slice(heads + kv, None))):
            rep.check(f"attention {path}: {name} rel err vs fp64 math", rel(runs[0][1][:, :, sl],
                                                                             ref_grad[:, :, sl]), 2e-2)
    del ref_base, ref
    base, qkv = inputs(batch, 2)
    dout = torch.randn(batch, seq, heads, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    flops = 2 * 2 * batch * heads * seq * seq * hd / 2 * 3.5  # causal fwd (2 GEMMs) + bwd (5 GEMMs)
    paths = [("fa4", False), ("fa4-det", True), ("cudnn", False), ("flash", False), ("flash", True),
             ("cudnn-det", True)]
    for path, det in paths:
        if reasons.get(path, None) is not None:
            continue
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(det)
        try:
            with sdpa_kernel([attention.PATHS.get(path, SDPBackend.MATH)]):
                ms = bench_ms(partial(fwd_bwd, path, base, qkv, dout))
            rep.time(f"attention fwd+bwd {path}{' deterministic' if det else ''} "
                     f"[{batch}x{heads}/{kv}x{seq}x{hd}]", ms, note=f"{flops / ms / 1e9:.0f} TFLOP/s")
        except RuntimeError as exc:
            rep.time(f"attention {path} det={det} failed: {str(exc)[:120]}", float("nan"))
        finally:
            torch.use_deterministic_algorithms(was)


def check_mlp(rep: Report, dev: torch.device, tokens: int, sh: dict[str, Any]) -> None:
    """The SwiGLU MLP with the activation in quack's GEMM epilogues (`mlp.py`) against fp32 torch at the
    model's shape, bitwise twice, then one layer's MLP fwd+bwd timed against the path it replaces (cuBLAS +
    the Triton SwiGLU ops), for each mlp_gemms / mlp_tuned setting (`remote.knobs`), in interleaved rounds (the
    card is power-capped: each variant sees the same thermal and power state)."""
    from remote.kernels import mlp, swiglu

    d, ffn = sh["d_model"], sh["ffn"]
    why = mlp.qualify(dev)
    if why is not None:  # the probes section recorded it (a failure on the GPU, a skip on CPU)
        rep.skip("mlp section", why)
        return
    gen = torch.Generator(device=dev).manual_seed(1)
    x0 = torch.randn(tokens, d, device=dev, generator=gen).to(torch.bfloat16)
    w13_0 = (torch.randn(2 * ffn, d, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    w2_0 = (torch.randn(d, ffn, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    r0 = torch.randn(tokens, d, device=dev, generator=gen).to(torch.bfloat16)
    dout = torch.randn(tokens, d, device=dev, generator=gen).to(torch.bfloat16)
    w13_k = mlp.to_kernel_layout(w13_0)  # the parameter's layout while `mlp` is attached

    def fused() -> tuple[torch.Tensor, ...]:
        x, w13, w2, r = (t.detach().requires_grad_(True) for t in (x0, w13_k, w2_0, r0))
        out = mlp.mlp(x, w13, w2, r)
        out.backward(dout)
        dx, dw13, dw2, dr = grads(x, w13, w2, r)
        return out.detach(), dx, mlp.to_model_layout(dw13), dw2, dr

    def current() -> tuple[torch.Tensor, ...]:  # what the step runs without it: cuBLAS GEMMs around the Triton SwiGLU ops
        x, w13, w2, r = (t.detach().requires_grad_(True) for t in (x0, w13_0, w2_0, r0))
        out = torch.addmm(r, swiglu.swiglu(x @ w13.T), w2.T)
        out.backward(dout)
        return (out.detach(), *grads(x, w13, w2, r))

    settings: dict[str, dict[str, Any]] = {
        "fused": {"mlp_gemms": "fused", "mlp_tuned": False}, "all": {"mlp_gemms": "all", "mlp_tuned": False},
        "fused tuned": {"mlp_gemms": "fused", "mlp_tuned": True}, "all tuned": {"mlp_gemms": "all", "mlp_tuned": True}}

    def under(setting: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        with knobs.override(**setting):
            return fused()

    ref_in = [t.detach().float().requires_grad_(True) for t in (x0, w13_0, w2_0, r0)]
    ref = mlp.reference(*ref_in)
    ref.backward(dout.float())
    want = (ref.detach(), *grads(*ref_in))
    del ref, ref_in
    got_current = current()
    for name, part, w in zip(("out", "dx", "dw13", "dw2", "dresidual"), got_current, want):
        rep.time(f"mlp current path {name} rel err vs fp32 torch: {rel(part, w):.3g}", float("nan"))
    # untuned first, then tuned (its autotuning may run into the phase's time limit): each group timed
    # against the current path in its own interleaved rounds
    groups = {"untuned": ("fused", "all"), "tuned": ("fused tuned", "all tuned"), "fused-tuned": ("fused tuned",)}
    for group in (groups[g] for g in knobs.kernels().mlp_check):
        variants: dict[str, Callable[[], tuple[torch.Tensor, ...]]] = {"current (cuBLAS + Triton SwiGLU)": current}
        for tag in group:
            t0 = time.perf_counter()
            got = under(settings[tag])
            torch.cuda.synchronize(dev)
            first_s = time.perf_counter() - t0
            for name, g, w in zip(("out", "dx", "dw13", "dw2", "dresidual"), got, want):
                rep.check(f"mlp {tag} {name} rel err vs fp32 torch", rel(g, w), 2e-2)
            rep.check(f"mlp {tag} bitwise across two runs",
                      all(torch.equal(a, b) for a, b in zip(got, under(settings[tag]))))
            rep.time(f"mlp {tag}: first call (compile{' + autotune' if 'tuned' in tag else ''}) ms", first_s * 1e3)
            variants[f"quack {tag}"] = partial(under, settings[tag])
            del got
        results: dict[str, list[float]] = {k: [] for k in variants}
        for _round in range(4):
            for tag, fn in variants.items():
                results[tag].append(bench_ms(fn))
        base = sorted(results["current (cuBLAS + Triton SwiGLU)"])[1]
        for tag, ms in results.items():
            med = sorted(ms)[1]
            rep.time(f"mlp one layer fwd+bwd [{tokens}x{d}x{ffn}] {tag} (rounds {[round(m, 3) for m in ms]}, "
                     f"x{med / base:.3f} of current)", med)


# The kernels' own sections: correctness at the 1B shapes and timings (`probes` covers every registered kernel).
KERNEL_SECTIONS = {"loss": ("ce", "loss"), "swiglu": ("swiglu",), "optim": ("adamw",), "norm": ("norm",),
                   "rope": ("rope",), "mlp": ("mlp",)}
SECTIONS = ("copy", "probes", *(s for names in KERNEL_SECTIONS.values() for s in names), "attention")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32768, help="tokens per step (mb 16 x seq 2048)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"a comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--small", action="store_true",
                    help="toy sizes on CPU, the kernels through Triton's interpreter (needs TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.only.split(",") if s not in SECTIONS]
    if unknown:
        ap.error(f"--only: unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    if args.small and not jit.interpret():
        ap.error("--small runs the kernels through Triton's interpreter: set TRITON_INTERPRET=1 before Python starts")
    if not args.small and not torch.cuda.is_available():
        ap.error("no CUDA device: this is the GPU check (--small runs its code paths on CPU)")
    with knobs.override(on_cpu=True) if args.small else contextlib.nullcontext():
        return run_sections(args)


def run_sections(args: argparse.Namespace) -> int:
    dev = torch.device("cpu" if args.small else "cuda")
    sh = SMALL if args.small else SHAPES
    tokens = 100 if args.small else args.tokens
    rep = Report()
    t0 = time.monotonic()
    record = {"gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "triton": jit.TRITON_VERSION, "tokens": tokens, "shapes": sh, "kernels": list(registry.names())}
    sections = {"copy": lambda: record.update(copy_tb_s=copy_ceiling(rep, dev, sh)),
                "probes": lambda: check_probes(rep, dev),
                "ce": lambda: check_ce(rep, dev, sh), "loss": lambda: check_loss_path(rep, dev, tokens, sh),
                "swiglu": lambda: check_swiglu(rep, dev, tokens, sh), "mlp": lambda: check_mlp(rep, dev, tokens, sh),
                "norm": lambda: check_norm(rep, dev, tokens, sh), "rope": lambda: check_rope(rep, dev, tokens, sh),
                "adamw": lambda: check_adamw(rep, dev, sh),
                "attention": lambda: check_attention(rep, dev, tokens, sh)}
    assert set(sections) == set(SECTIONS)
    for name in args.only.split(","):
        try:
            sections[name]()
        except Exception as exc:  # noqa: BLE001 - record and go on: one broken kernel must not hide the rest
            rep.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            rep.check(f"{name}: ran without error", False)
            traceback.print_exc()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        record |= {"checks": rep.checks, "timings": rep.timings, "errors": rep.errors, "skipped": rep.skipped,
                   "wall_s": time.monotonic() - t0}
        with open(args.out, "w") as fh:  # after every section: a time limit still leaves what was measured
            json.dump(record, fh, indent=1)
    failed = [c["name"] for c in rep.checks if not c["ok"]]
    print(f"[check] {len(rep.checks) - len(failed)}/{len(rep.checks)} passed, {len(rep.skipped)} skipped; "
          f"failed: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
