"""RMSNorm and residual add + RMSNorm, forward and backward, as custom ops (knob `norm`).

Forward, one pass per row: h = x + r (rounded to the stream's dtype, as torch's add), y = h * rstd * w in fp32
with one rounding (as F.rms_norm computes it), rstd saved (fp32, one per row). Backward, one pass: per row
dx = rstd * (w*dy - h_hat * mean(w*dy * h_hat)) + dh (dh: the residual stream's own gradient, added in the
same pass), and the weight gradient's partial sums over each program's fixed block of rows kept in
registers, written once per program and summed by torch in a fixed order: no atomics, the same bits every
run (the deterministic profile relies on it). Inductor runs the same math as two kernels in backward (the
per-row dx pass and a separate dw reduction over all tokens, which reads dy and h again).

The ops are opaque to torch.compile (like the SwiGLU ones), so the per-layer graph saves h, w and rstd for
them, which it saved anyway.
"""

from __future__ import annotations

from typing import Any

import torch

from remote import knobs
from remote.kernels.jit import LazyKernel, pow2_at_least, runs_triton, tl
from remote.kernels.registry import Kernel


def _rmsnorm_fwd(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps, HAS_RES: tl.constexpr,  # type: ignore[no-untyped-def]
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    offs = tl.cast(rows, tl.int64)[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = xf * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


def _rmsnorm_bwd(dy_ptr, dh_ptr, h_ptr, w_ptr, rstd_ptr, dx_ptr, dw_part_ptr, n_rows, n_cols, rows_per_prog,  # type: ignore[no-untyped-def]
                 HAS_DH: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Program p owns rows [p * rows_per_prog, (p + 1) * rows_per_prog): dx for each, and its dw partial."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK], tl.float32)
    first = pid * rows_per_prog
    last = tl.minimum(first + rows_per_prog, n_rows)
    for start in range(first, last, ROWS):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < last
        mask = row_ok[:, None] & col_ok[None, :]
        offs = tl.cast(rows, tl.int64)[:, None] * n_cols + cols[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        hh = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        hh = hh * rstd[:, None]
        wdy = dy * w[None, :]
        c = tl.sum(wdy * hh, 1) / n_cols
        dx = (wdy - hh * c[:, None]) * rstd[:, None]
        if HAS_DH:
            dx += tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * hh
    tl.store(dw_part_ptr + pid.to(tl.int64) * n_cols + cols, tl.sum(dw, 0), mask=col_ok)


_FWD = LazyKernel(_rmsnorm_fwd)
_BWD = LazyKernel(_rmsnorm_bwd)


def launch_config(device: torch.device) -> dict[str, Any]:
    """Per-row tiles on the GPU (VH_NORM_*); wide tiles on CPU, where the interpreter pays per program."""
    if device.type != "cuda":
        return {"ROWS": 16, "num_warps": 4, "BWD_ROWS": 16, "programs": 4}
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    knob = knobs.kernels()
    return {"ROWS": knob.norm_rows, "num_warps": knob.norm_warps, "BWD_ROWS": knob.norm_bwd_rows,
            "programs": knob.norm_programs or 4 * sms}


def forward_triton(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                   config: dict[str, Any] | None = None) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(h = x + residual or None, y = rmsnorm(h) * weight, rstd fp32 [rows])."""
    d = x.shape[-1]
    x = x.contiguous()
    rows = x.numel() // d
    y = torch.empty_like(x)
    h = torch.empty_like(x) if residual is not None else None
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows == 0:
        return h, y, rstd
    cfg = config or launch_config(x.device)
    r = residual.contiguous() if residual is not None else x
    _FWD[(-(-rows // cfg["ROWS"]),)](x, r, weight, h if h is not None else y, y, rstd, rows, d, float(eps),
                                     HAS_RES=residual is not None, ROWS=cfg["ROWS"], BLOCK=pow2_at_least(d),
                                     num_warps=cfg["num_warps"])
    return h, y, rstd


def backward_triton(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor,
                    rstd: torch.Tensor, config: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx = d/dh of the norm + dh, dw in the weight's dtype)."""
    d = h.shape[-1]
    dy, h = dy.contiguous(), h.contiguous()
    rows = h.numel() // d
    dx = torch.empty_like(h)
    cfg = config or launch_config(h.device)
    programs = max(1, min(cfg["programs"], rows))
    per_prog = -(-rows // programs)
    programs = max(1, -(-rows // per_prog))
    dw_part = torch.empty(programs, d, dtype=torch.float32, device=h.device)
    if rows == 0:
        return dx, torch.zeros_like(weight)
    _BWD[(programs,)](dy, dh.contiguous() if dh is not None else dy, h, weight, rstd, dx, dw_part, rows, d,
                      per_prog, HAS_DH=dh is not None, ROWS=cfg["BWD_ROWS"], BLOCK=pow2_at_least(d),
                      num_warps=cfg["num_warps"])
    return dx, dw_part.sum(0).to(weight.dtype)


def forward_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                      ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    h = x + residual if residual is not None else None
    hf = (h if h is not None else x).float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1) + eps)
    return h, (hf * rstd[..., None] * weight.float()).to(x.dtype), rstd


def backward_reference(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor,
                       rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hh = h.float() * rstd[..., None]
    wdy = dy.float() * weight.float()
    dx = (wdy - hh * (wdy * hh).mean(-1, keepdim=True)) * rstd[..., None]
    if dh is not None:
        dx = dx + dh.float()
    dw = (dy.float() * hh).reshape(-1, h.shape[-1]).sum(0)
    return dx.to(h.dtype), dw.to(weight.dtype)


def _fwd(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    if runs_triton(x.device):
        return forward_triton(x, residual, weight, eps)
    return forward_reference(x, residual, weight, eps)


@torch.library.custom_op("vh_kernels::add_rmsnorm", mutates_args=())
def add_rmsnorm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h, y, rstd = _fwd(x, residual, weight, eps)
    assert h is not None
    return h, y, rstd


@add_rmsnorm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("vh_kernels::rmsnorm", mutates_args=())
def rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _h, y, rstd = _fwd(x, None, weight, eps)
    return y, rstd


@rmsnorm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("vh_kernels::rmsnorm_backward", mutates_args=())
def rmsnorm_backward_op(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor,
                        rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if runs_triton(h.device):
        return backward_triton(dy, dh, h, weight, rstd)
    return backward_reference(dy, dh, h, weight, rstd)


@rmsnorm_backward_op.register_fake
def _(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return h.new_empty(h.shape), weight.new_empty(weight.shape)


def _setup_add(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.save_for_backward(output[0], inputs[2], output[2])


def _backward_add(ctx: Any, dh: torch.Tensor, dy: torch.Tensor, _drstd: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    h, weight, rstd = ctx.saved_tensors
    dx, dw = rmsnorm_backward_op(dy, dh, h, weight, rstd)
    return dx, dx, dw, None


add_rmsnorm_op.register_autograd(_backward_add, setup_context=_setup_add)


def _setup_norm(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _backward_norm(ctx: Any, dy: torch.Tensor, _drstd: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rmsnorm_backward_op(dy, None, x, weight, rstd)
    return dx, dw, None


rmsnorm_op.register_autograd(_backward_norm, setup_context=_setup_norm)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm(x, (d,), weight, eps) with the one-pass backward."""
    y: torch.Tensor = rmsnorm_op(x, weight, eps)[0]
    return y


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y) = (x + residual, F.rms_norm(h, (d,), weight, eps)) in one pass each way."""
    h, y, _rstd = add_rmsnorm_op(x, residual, weight, eps)
    return h, y


def qualify(device: torch.device) -> str | None:
    """The probe: None if both kernels run here and match the torch reference (fp32 math) on a small ragged
    shape and give the same bits twice; else the reason (the run then keeps Inductor's norm)."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows, d = 67, 320
    x, r, dy, dh = (torch.randn(rows, d, device=device, generator=gen).to(torch.bfloat16) for _ in range(4))
    w = (1 + 0.1 * torch.randn(d, device=device, generator=gen)).to(torch.bfloat16)
    runs = []
    for _ in range(2):
        h, y, rstd = forward_triton(x, r, w, 1e-5)
        assert h is not None
        runs.append((h, y, rstd, *backward_triton(dy, dh, h, w, rstd), *forward_triton(x, None, w, 1e-5)[1:]))
    if not all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True)):
        return "norm kernels gave different bits on two identical runs"
    h, y, rstd, dx, dw, y_plain, _ = runs[0]
    _h, y_ref, _r = forward_reference(h, None, w, 1e-5)
    dx_ref, dw_ref = backward_reference(dy, dh, h, w, rstd)
    for name, got, want in (("h", h, (x.float() + r.float())), ("y", y, y_ref), ("dx", dx, dx_ref),
                            ("dw", dw, dw_ref), ("y (no residual)", y_plain, forward_reference(x, None, w, 1e-5)[1])):
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        if not err < 1e-2:
            return f"norm {name} relative error {err:.3g} against the torch reference"
    return None


KERNEL = Kernel(
    name="norm",
    summary="RMSNorm and residual add + RMSNorm in one pass each way, the weight gradient's partial sums in the "
            "pass that writes dx",
    fallback="remote.training.model.RMSNorm.forward",
    probe=qualify,
    deterministic=True,
    deterministic_why="no atomics: each program sums the weight gradient over a fixed block of rows, and torch "
                      "adds the blocks in a fixed order",
    knobs=("norm_rows", "norm_warps", "norm_bwd_rows", "norm_programs"),
)
