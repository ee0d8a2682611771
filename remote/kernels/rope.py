"""RoPE on the fused qkv projection in one kernel each way (knob `rope`).

Forward: one program per token reads the token's row of qkv = [q heads | k heads | v heads] x head_dim once and
writes q and k rotated (rotate-half convention, fp32 math, one rounding) and v copied, each [B, T, H, D]
contiguous: the layout FA4 and the output projection read without a copy. Backward: one program per token
reads dq, dk, dv and writes the whole d(qkv) row (the inverse rotation on dq, dk): Inductor's version is the
rotation's backward plus the copy that concatenates the three gradients into d(qkv).
"""

from __future__ import annotations

from typing import Any

import torch

from remote import knobs
from remote.kernels.jit import LazyKernel, pow2_at_least, runs_triton, tl
from remote.kernels.registry import Kernel


def _rope_fwd(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, n_tok, seq, n_q, n_kv, HALF: tl.constexpr,  # type: ignore[no-untyped-def]
              HEADS: tl.constexpr, VHEADS: tl.constexpr, TOK: tl.constexpr, INVERSE: tl.constexpr):
    """TOK tokens per program, one tile row per (token, head). INVERSE=False: qkv rows -> rotated q, k and v.
    INVERSE=True: the backward, the same memory roles swapped (q_ptr/k_ptr/v_ptr are the incoming dq/dk/dv,
    qkv_ptr the d(qkv) written)."""
    width = (n_q + 2 * n_kv) * 2 * HALF
    r = tl.arange(0, TOK * HEADS)
    tok = tl.program_id(0).to(tl.int64) * TOK + r // HEADS
    heads = r % HEADS
    t = tok % seq
    d = tl.arange(0, HALF)
    tok_ok = (tok < n_tok)[:, None]
    if TOK == 1:  # the GPU launch: one table row, broadcast over the heads
        t1 = tl.program_id(0).to(tl.int64) % seq
        c = tl.load(cos_ptr + t1 * 2 * HALF + d).to(tl.float32)[None, :]
        s = tl.load(sin_ptr + t1 * 2 * HALF + d).to(tl.float32)[None, :]
    else:
        c = tl.load(cos_ptr + t[:, None] * 2 * HALF + d[None, :], mask=tok_ok, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + t[:, None] * 2 * HALF + d[None, :], mask=tok_ok, other=0.0).to(tl.float32)
    # each row's first half in the fused row, and in the separate q / k tensors ([c | c] tables: one half read)
    row = qkv_ptr + tok[:, None] * width + heads[:, None] * 2 * HALF + d[None, :]
    q_row = q_ptr + tok[:, None] * n_q * 2 * HALF + heads[:, None] * 2 * HALF + d[None, :]
    k_row = k_ptr + tok[:, None] * n_kv * 2 * HALF + (heads - n_q)[:, None] * 2 * HALF + d[None, :]
    mq = tok_ok & (heads < n_q)[:, None]
    mk = tok_ok & ((heads >= n_q) & (heads < n_q + n_kv))[:, None]
    m = mq | mk
    if INVERSE:
        a1 = tl.where(mq, tl.load(q_row, mask=mq, other=0.0), tl.load(k_row, mask=mk, other=0.0)).to(tl.float32)
        a2 = tl.where(mq, tl.load(q_row + HALF, mask=mq, other=0.0),
                      tl.load(k_row + HALF, mask=mk, other=0.0)).to(tl.float32)
        o1 = a1 * c + a2 * s
        o2 = a2 * c - a1 * s
        tl.store(row, o1.to(qkv_ptr.dtype.element_ty), mask=m)
        tl.store(row + HALF, o2.to(qkv_ptr.dtype.element_ty), mask=m)
    else:
        a1 = tl.load(row, mask=m, other=0.0).to(tl.float32)
        a2 = tl.load(row + HALF, mask=m, other=0.0).to(tl.float32)
        o1 = (a1 * c - a2 * s).to(q_ptr.dtype.element_ty)
        o2 = (a2 * c + a1 * s).to(q_ptr.dtype.element_ty)
        tl.store(q_row, o1, mask=mq)
        tl.store(q_row + HALF, o2, mask=mq)
        tl.store(k_row, o1, mask=mk)
        tl.store(k_row + HALF, o2, mask=mk)
    rv = tl.arange(0, TOK * VHEADS)
    vtok = tl.program_id(0).to(tl.int64) * TOK + rv // VHEADS
    vh = rv % VHEADS
    vm = ((vtok < n_tok) & (vh < n_kv))[:, None]
    dd = tl.arange(0, 2 * HALF)
    fused_v = qkv_ptr + vtok[:, None] * width + (n_q + n_kv + vh)[:, None] * 2 * HALF + dd[None, :]
    own_v = v_ptr + vtok[:, None] * n_kv * 2 * HALF + vh[:, None] * 2 * HALF + dd[None, :]
    if INVERSE:
        tl.store(fused_v, tl.load(own_v, mask=vm, other=0.0), mask=vm)
    else:
        tl.store(own_v, tl.load(fused_v, mask=vm, other=0.0), mask=vm)


_ROPE = LazyKernel(_rope_fwd)


def _launch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_q: int, n_kv: int, inverse: bool,
            tokens: int | None = None) -> None:
    b, t, _h, d = qkv.shape
    if b * t == 0:
        return
    # one token per program on the GPU (measured at the copy rate); many on CPU, where the interpreter pays per
    # program
    knob = knobs.kernels()
    tok = tokens or (knob.rope_tokens if qkv.is_cuda else 64)  # a power of two
    warps = knob.rope_warps if qkv.is_cuda else 1
    _ROPE[(-(-(b * t) // tok),)](qkv, cos, sin, q, k, v, b * t, t, n_q, n_kv, HALF=d // 2,
                                 HEADS=pow2_at_least(n_q + n_kv), VHEADS=pow2_at_least(n_kv), TOK=tok,
                                 INVERSE=inverse, num_warps=warps)


def forward_triton(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int,
                   tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t, _h, d = qkv.shape
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    q = qkv.new_empty(b, t, n_q, d)
    k, v = qkv.new_empty(b, t, n_kv, d), qkv.new_empty(b, t, n_kv, d)
    _launch(qkv, cos, sin, q, k, v, n_q, n_kv, inverse=False, tokens=tokens)
    return q, k, v


def backward_triton(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    tokens: int | None = None) -> torch.Tensor:
    b, t, n_q, d = dq.shape
    n_kv = dk.shape[2]
    dqkv = dq.new_empty(b, t, n_q + 2 * n_kv, d)
    _launch(dqkv, cos.contiguous(), sin.contiguous(), dq.contiguous(), dk.contiguous(), dv.contiguous(), n_q,
            n_kv, inverse=True, tokens=tokens)
    return dqkv


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """x: [B, T, H, D]; cos/sin: [T, D]; fp32 math, one rounding (sign -1: the inverse rotation)."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos.float()[:, None, :] + sign * rotated * sin.float()[:, None, :]).to(x.dtype)


def forward_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = qkv.split([n_q, n_kv, n_kv], dim=2)
    return _rotate(q, cos, sin, 1.0), _rotate(k, cos, sin, 1.0), v.contiguous()


def backward_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor) -> torch.Tensor:
    return torch.cat([_rotate(dq, cos, sin, -1.0), _rotate(dk, cos, sin, -1.0), dv], dim=2)


@torch.library.custom_op("vh_kernels::rope_qkv", mutates_args=())
def rope_qkv_op(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if runs_triton(qkv.device):
        return forward_triton(qkv, cos, sin, n_q, n_kv)
    return forward_reference(qkv, cos, sin, n_q, n_kv)


@rope_qkv_op.register_fake
def _(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t, _h, d = qkv.shape
    return qkv.new_empty(b, t, n_q, d), qkv.new_empty(b, t, n_kv, d), qkv.new_empty(b, t, n_kv, d)


@torch.library.custom_op("vh_kernels::rope_qkv_backward", mutates_args=())
def rope_qkv_backward_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> torch.Tensor:
    if runs_triton(dq.device):
        return backward_triton(dq, dk, dv, cos, sin)
    return backward_reference(dq, dk, dv, cos, sin).contiguous()


@rope_qkv_backward_op.register_fake
def _(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, t, n_q, d = dq.shape
    return dq.new_empty(b, t, n_q + 2 * dk.shape[2], d)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.save_for_backward(inputs[1], inputs[2])


def _backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    cos, sin = ctx.saved_tensors
    return rope_qkv_backward_op(dq, dk, dv, cos, sin), None, None, None, None


rope_qkv_op.register_autograd(_backward, setup_context=_setup)


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_q: int, n_kv: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [B, T, n_q + 2 n_kv, D] -> (q, k rotated, v), each [B, T, H, D] contiguous."""
    q, k, v = rope_qkv_op(qkv, cos, sin, n_q, n_kv)
    return q, k, v


def qualify(device: torch.device) -> str | None:
    """The probe: None if both directions run here, match the torch reference (fp32 math) at a GQA layout
    with a non-power-of-two head count and give the same bits twice; else the reason."""
    gen = torch.Generator(device=device).manual_seed(0)
    b, t, n_q, n_kv, d = 2, 5, 6, 2, 16
    qkv = torch.randn(b, t, n_q + 2 * n_kv, d, device=device, generator=gen).to(torch.bfloat16)
    ang = torch.randn(t, d // 2, device=device, generator=gen)
    cos, sin = (torch.cat([f(ang), f(ang)], -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    dq, dk, dv = (torch.randn(b, t, h, d, device=device, generator=gen).to(torch.bfloat16) for h in (n_q, n_kv, n_kv))
    runs = [(*forward_triton(qkv, cos, sin, n_q, n_kv), backward_triton(dq, dk, dv, cos, sin)) for _ in range(2)]
    if not all(torch.equal(a, c) for a, c in zip(runs[0], runs[1], strict=True)):
        return "rope kernels gave different bits on two identical runs"
    want = (*forward_reference(qkv, cos, sin, n_q, n_kv), backward_reference(dq, dk, dv, cos, sin))
    for name, got, ref in zip(("q", "k", "v", "dqkv"), runs[0], want, strict=True):
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        if not err < 1e-2:
            return f"rope {name} relative error {err:.3g} against the torch reference"
    return None


KERNEL = Kernel(
    name="rope",
    summary="RoPE on the fused qkv in one pass each way: q and k rotated and v copied into [B, T, H, D]; the "
            "backward writes the whole d(qkv)",
    fallback="remote.training.model.apply_rope",
    probe=qualify,
    deterministic=True,
    deterministic_why="a rotation and a copy: one program per token, no reduction",
    knobs=("rope_tokens", "rope_warps"),
)
