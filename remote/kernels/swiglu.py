"""SwiGLU, act = silu(gate) * up over the fused w13 output gu = [gate | up], as two custom ops.

Forward: one Triton pass, gu in, act out (what Inductor's fused kernel does). Backward: one Triton pass that
reads dact and gu once and writes d(gu) = [d gate | d up] once: 3 reads + 2 writes of [N, F], instead of
Inductor's cat-shaped kernel. Both ops are opaque to the compiler on purpose: the partitioner then keeps
`act` saved for the down projection's weight gradient instead of recomputing it from gu in backward (an
extra pass over gu per layer). fp32 math inside, one rounding per output, as Inductor computes it.
"""

from __future__ import annotations

from typing import Any

import torch

from remote import knobs
from remote.kernels.jit import LazyKernel, runs_triton, tl
from remote.kernels.registry import Kernel, relative_error


def _swiglu_bwd(dact_ptr, gu_ptr, dgu_ptr, n_rows, n_ffn, n_col_blocks, ROWS: tl.constexpr,  # type: ignore[no-untyped-def]
                BLOCK: tl.constexpr):
    """One [ROWS x BLOCK] tile of dact and the matching gate and up tiles of gu -> the two dgu tiles."""
    pid = tl.program_id(0)
    rows = (pid // n_col_blocks) * ROWS + tl.arange(0, ROWS)
    cols = (pid % n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < n_ffn)[None, :]
    rows64 = tl.cast(rows, tl.int64)[:, None]
    in_gate = rows64 * (2 * n_ffn) + cols[None, :]
    da = tl.load(dact_ptr + rows64 * n_ffn + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gu_ptr + in_gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + in_gate + n_ffn, mask=mask, other=0.0).to(tl.float32)
    sg = tl.sigmoid(g)
    dg = da * u * (sg * (1.0 + g * (1.0 - sg)))
    du = da * (g * sg)
    tl.store(dgu_ptr + in_gate, dg.to(dgu_ptr.dtype.element_ty), mask=mask)
    tl.store(dgu_ptr + in_gate + n_ffn, du.to(dgu_ptr.dtype.element_ty), mask=mask)


_SWIGLU_BWD = LazyKernel(_swiglu_bwd)


def _swiglu_fwd(gu_ptr, act_ptr, n_rows, n_ffn, n_col_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    rows = (pid // n_col_blocks) * ROWS + tl.arange(0, ROWS)
    cols = (pid % n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < n_ffn)[None, :]
    rows64 = tl.cast(rows, tl.int64)[:, None]
    in_gate = rows64 * (2 * n_ffn) + cols[None, :]
    g = tl.load(gu_ptr + in_gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + in_gate + n_ffn, mask=mask, other=0.0).to(tl.float32)
    act = g * tl.sigmoid(g) * u
    tl.store(act_ptr + rows64 * n_ffn + cols[None, :], act.to(act_ptr.dtype.element_ty), mask=mask)


_SWIGLU_FWD = LazyKernel(_swiglu_fwd)


def launch_config(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":  # the interpreter pays per program: big tiles
        return {"ROWS": 64, "BLOCK": 1024, "num_warps": 4}
    knob = knobs.kernels()
    return {"ROWS": knob.swiglu_rows, "BLOCK": knob.swiglu_block, "num_warps": knob.swiglu_warps}


def _grid(rows: int, n_ffn: int, cfg: dict[str, Any]) -> tuple[int, int, int]:
    block = min(cfg["BLOCK"], 1 << max(0, (n_ffn - 1).bit_length()))
    blocks = -(-n_ffn // block)
    return -(-rows // cfg["ROWS"]) * blocks, blocks, block


def forward_triton(gu: torch.Tensor, config: dict[str, Any] | None = None) -> torch.Tensor:
    n_ffn = gu.shape[-1] // 2
    gu = gu.contiguous()
    rows = gu.numel() // max(1, 2 * n_ffn)
    act = torch.empty((*gu.shape[:-1], n_ffn), dtype=gu.dtype, device=gu.device)
    if rows == 0:
        return act
    cfg = config or launch_config(gu.device)
    programs, blocks, block = _grid(rows, n_ffn, cfg)
    _SWIGLU_FWD[(programs,)](gu, act, rows, n_ffn, blocks, ROWS=cfg["ROWS"], BLOCK=block,
                             num_warps=cfg["num_warps"])
    return act


def backward_triton(dact: torch.Tensor, gu: torch.Tensor, config: dict[str, Any] | None = None) -> torch.Tensor:
    n_ffn = dact.shape[-1]
    dact, gu = dact.contiguous(), gu.contiguous()
    rows = dact.numel() // n_ffn
    dgu = torch.empty(gu.shape, dtype=gu.dtype, device=gu.device)
    if rows == 0:
        return dgu
    cfg = config or launch_config(gu.device)
    programs, blocks, block = _grid(rows, n_ffn, cfg)
    _SWIGLU_BWD[(programs,)](dact, gu, dgu, rows, n_ffn, blocks, ROWS=cfg["ROWS"], BLOCK=block,
                             num_warps=cfg["num_warps"])
    return dgu


def forward_reference(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.float().chunk(2, dim=-1)
    return (g * torch.sigmoid(g) * u).to(gu.dtype)


def backward_reference(dact: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    """fp32 math, one rounding at the end (what Inductor's fused kernel computes)."""
    g, u = gu.float().chunk(2, dim=-1)
    da = dact.float()
    sg = torch.sigmoid(g)
    return torch.cat([da * u * (sg * (1 + g * (1 - sg))), da * (g * sg)], dim=-1).to(gu.dtype)


@torch.library.custom_op("vh_kernels::swiglu_forward", mutates_args=())
def swiglu_forward(gu: torch.Tensor) -> torch.Tensor:
    if runs_triton(gu.device):
        return forward_triton(gu)
    return forward_reference(gu).contiguous()


@swiglu_forward.register_fake
def _(gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty((*gu.shape[:-1], gu.shape[-1] // 2))


@torch.library.custom_op("vh_kernels::swiglu_backward", mutates_args=())
def swiglu_backward(dact: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    if runs_triton(gu.device):
        return backward_triton(dact, gu)
    return backward_reference(dact, gu).contiguous()


@swiglu_backward.register_fake
def _(dact: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty(gu.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx: Any, dact: torch.Tensor) -> torch.Tensor:
    (gu,) = ctx.saved_tensors
    dgu: torch.Tensor = swiglu_backward(dact, gu)
    return dgu


swiglu_forward.register_autograd(_backward, setup_context=_setup_context)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gu = [gate | up] (last dimension), with the one-pass backward."""
    act: torch.Tensor = swiglu_forward(gu)
    return act


def qualify(device: torch.device) -> str | None:
    """The probe: forward and backward against the torch formula (fp32 math, one rounding) at a ragged shape,
    and the same bits twice; else the reason (the run then keeps torch's SwiGLU)."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows, ffn = 37, 130
    gu = torch.randn(2, rows, 2 * ffn, device=device, generator=gen).to(torch.bfloat16)
    dact = torch.randn(2, rows, ffn, device=device, generator=gen).to(torch.bfloat16)
    runs = [(forward_triton(gu), backward_triton(dact, gu)) for _ in range(2)]
    if not all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True)):
        return "swiglu kernels gave different bits on two identical runs"
    for name, got, ref in (("act", runs[0][0], forward_reference(gu)), ("dgu", runs[0][1], backward_reference(dact, gu))):
        err = relative_error(got, ref)
        if not err < 1e-2:
            return f"swiglu {name} relative error {err:.3g} against the torch reference"
    return None


KERNEL = Kernel(
    name="swiglu",
    summary="silu(gate) * up in one pass each way: the backward reads the upstream gradient and gate/up once and "
            "writes both gradients once",
    fallback="remote.training.model.FeedForward.forward",
    probe=qualify,
    deterministic=True,
    deterministic_why="elementwise: each output element is written by one program, no reduction",
    knobs=("swiglu_rows", "swiglu_block", "swiglu_warps"),
)
