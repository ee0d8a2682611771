"""AdamW on fp32 master weights in one pass: bf16 gradient + fp32 master/m/v in, fp32 state + bf16 weights out.

28 bytes per parameter (2 + 3x4 read, 3x4 + 2 written), the floor for this state layout; torch's fused
AdamW on the master copy needs the gradient copied to fp32 first and the master copied back to bf16 after,
two more passes. The update follows torch.optim.AdamW (decoupled decay, bias corrections, eps outside the
square root) in fp32 with IEEE sqrt and division; bias corrections are computed on the host in fp64
from an integer step count (no device sync, the same every run).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from remote import knobs
from remote.kernels.jit import LazyKernel, tl
from remote.kernels.registry import Kernel, relative_error


def _adamw(grad_ptr, master_ptr, m_ptr, v_ptr, out_ptr, n, grad_scale, lr_wd, beta1, beta2, step_size,  # type: ignore[no-untyped-def]
           bc2_sqrt, eps, HAS_OUT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32) * grad_scale
    p = tl.load(master_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = p - lr_wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(master_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if HAS_OUT:
        tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


_ADAMW = LazyKernel(_adamw)


def launch_config() -> dict[str, Any]:
    knob = knobs.kernels()
    return {"BLOCK": knob.adamw_block, "num_warps": knob.adamw_warps}


def hyper(lr: float, beta1: float, beta2: float, weight_decay: float, eps: float, step: int) -> dict[str, Any]:
    """Per-step scalars (step counts from 1, as torch's state['step'] after its increment)."""
    return {"lr_wd": lr * weight_decay, "beta1": beta1, "beta2": beta2, "step_size": lr / (1.0 - beta1 ** step),
            "bc2_sqrt": math.sqrt(1.0 - beta2 ** step), "eps": eps}


def step_triton(grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                out: torch.Tensor | None, hp: dict[str, Any], grad_scale: float = 1.0, config: dict[str, Any] | None = None) -> None:
    n = master.numel()
    for t in (grad, master, exp_avg, exp_avg_sq) + ((out,) if out is not None else ()):
        assert t.is_contiguous() and t.numel() == n, "fused AdamW needs contiguous tensors of one size"
    assert master.dtype == exp_avg.dtype == exp_avg_sq.dtype == torch.float32
    if n == 0:
        return
    cfg = config or launch_config()
    _ADAMW[(-(-n // cfg["BLOCK"]),)](
        grad, master, exp_avg, exp_avg_sq, out if out is not None else master, n, float(grad_scale),
        hp["lr_wd"], hp["beta1"], hp["beta2"], hp["step_size"], hp["bc2_sqrt"], hp["eps"],
        HAS_OUT=out is not None, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"])


@torch.no_grad()
def step_reference(grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   out: torch.Tensor | None, hp: dict[str, Any], grad_scale: float = 1.0) -> None:
    """The same update in torch ops (fp32): the tests' reference."""
    g = grad.float() * grad_scale
    master.sub_(hp["lr_wd"] * master)
    exp_avg.mul_(hp["beta1"]).add_((1.0 - hp["beta1"]) * g)
    exp_avg_sq.mul_(hp["beta2"]).add_((1.0 - hp["beta2"]) * g * g)
    denom = exp_avg_sq.sqrt() / hp["bc2_sqrt"] + hp["eps"]
    master.sub_(hp["step_size"] * (exp_avg / denom))
    if out is not None:
        out.copy_(master)


class FusedMasterAdamW:
    """fp32 master copies + moments of flat bf16 sources (bucket shards), updated by the fused kernel.

    Same state names and layout as the torch-AdamW runner (master, exp_avg, exp_avg_sq per source and a
    float32 device `step`), so canonical state and Merkle roots are formed the same way.
    """

    def __init__(self, sources: list[torch.Tensor], lr: float, beta1: float, beta2: float,
                 weight_decay: float, eps: float = 1e-8) -> None:
        self.masters = [s.detach().float().clone() for s in sources]
        self.exp_avg = [torch.zeros_like(m) for m in self.masters]
        self.exp_avg_sq = [torch.zeros_like(m) for m in self.masters]
        self.step_t = torch.zeros((), dtype=torch.float32, device=self.masters[0].device)
        self.steps = 0
        self.args = (lr, beta1, beta2, weight_decay, eps)
        self.hp: dict[str, Any] = {}

    def begin_step(self) -> None:
        self.steps += 1
        self.step_t.fill_(float(self.steps))
        self.hp = hyper(*self.args, step=self.steps)

    def update(self, i: int, grad: torch.Tensor, out: torch.Tensor | None, offset: int = 0,
               grad_scale: float = 1.0) -> None:
        """Update elements [offset, offset + grad.numel()) of source i from grad; write bf16 into out."""
        n = grad.numel()
        if out is not None and not out.is_contiguous():
            raise ValueError("fused AdamW writes the bf16 weights in place: out must be contiguous")
        sl = slice(offset, offset + n)
        step_triton(grad.reshape(-1), self.masters[i][sl], self.exp_avg[i][sl], self.exp_avg_sq[i][sl],
                    None if out is None else out.reshape(-1), self.hp, grad_scale)

    def state(self, i: int) -> dict[str, torch.Tensor]:
        return {"master": self.masters[i], "exp_avg": self.exp_avg[i], "exp_avg_sq": self.exp_avg_sq[i],
                "step": self.step_t}

    def numel(self) -> int:
        return sum(m.numel() for m in self.masters)


def qualify(device: torch.device) -> str | None:
    """The probe: one fused step against the same update in torch ops (fp32) on a ragged length, with a
    gradient scale, and the same bits twice; else the reason (the run then keeps torch's fused AdamW)."""
    gen = torch.Generator(device=device).manual_seed(0)
    n = 3001
    grad = torch.randn(n, device=device, generator=gen).to(torch.bfloat16)
    start = (torch.randn(n, device=device, generator=gen), 0.1 * torch.randn(n, device=device, generator=gen),
             0.01 * torch.rand(n, device=device, generator=gen))
    hp = hyper(3e-3, 0.9, 0.95, 0.1, 1e-8, step=3)
    results = []
    for step in (step_triton, step_triton, step_reference):
        master, m, v = (t.clone() for t in start)
        out = torch.full((n,), float("nan"), device=device, dtype=torch.bfloat16)
        step(grad, master, m, v, out, hp, 0.5)
        results.append((master, m, v, out))
    if not all(torch.equal(a, b) for a, b in zip(results[0], results[1], strict=True)):
        return "the fused AdamW gave different bits on two identical runs"
    for name, got, ref, limit in zip(("master", "exp_avg", "exp_avg_sq", "bf16 weights"), results[0], results[2],
                                     (1e-5, 1e-5, 1e-5, 1e-2), strict=True):
        err = relative_error(got, ref)
        if not err < limit:
            return f"adamw {name} relative error {err:.3g} against the torch-op reference"
    return None


KERNEL = Kernel(
    name="optim",
    summary="AdamW on fp32 master weights in one pass (bf16 gradient in, fp32 state and bf16 weights out); at "
            "world size 1 no gradient buckets and no collectives",
    fallback="remote.training.parallel._MasterAdamW",
    probe=qualify,
    deterministic=True,
    deterministic_why="elementwise: each parameter is updated by one program; the bias corrections are computed on "
                      "the host from an integer step count",
    knobs=("adamw_block", "adamw_warps"),
)
