"""The LM head + cross-entropy, chunked over tokens, with the gradients formed in forward (Liger-style).

Per chunk of c tokens, with one [c x V] logits buffer reused for every chunk:
  1. logits = h_c @ W^T                      (GEMM into the buffer)
  2. one Triton program per row (or a persistent grid): pass 1 reads the row once for an online max/sum
     (log-sum-exp) and the target logit, writes the row's loss; pass 2 re-reads the row (L2 when the
     grid is small enough) and writes d(loss)/d(logits) * scale over it, in place
  3. grad_h[c] = dlogits @ W                 (GEMM straight into grad_h's rows)
  4. grad_W += dlogits^T @ h_c in fp32       (GEMM with an fp32 accumulator: addmm(out_dtype=float32))
No host sync: the per-row losses go into a buffer summed once at the end (fixed order, no atomics).
"""

from __future__ import annotations

from typing import Any

import torch

from remote import knobs
from remote.kernels.jit import LazyKernel, cdiv, pow2_at_least, tl
from remote.kernels.registry import Kernel, relative_error


def _ce_rows(logits_ptr, stride_row, targets_ptr, loss_ptr, n_rows, n_cols, scale, ROWS: tl.constexpr,  # type: ignore[no-untyped-def]
             BLOCK: tl.constexpr):
    """Tiles of ROWS rows, a persistent loop over them: pass 1 online max/sum over [ROWS x BLOCK] column
    blocks -> lse and the row loss; pass 2 re-reads each block and writes the scaled gradient over it."""
    pid = tl.program_id(0)
    for tile in range(pid, tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        base = logits_ptr + tl.cast(rows, tl.int64)[:, None] * stride_row
        m = tl.full([ROWS], float("-inf"), tl.float32)
        s = tl.zeros([ROWS], tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(base + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 1))
            m_safe = tl.where(row_ok, m_new, 0.0)  # rows past the end: keep the arithmetic finite
            s = s * tl.exp(tl.where(row_ok, m, 0.0) - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), 1)
            m = m_new
        lse = tl.where(row_ok, m, 0.0) + tl.log(tl.where(row_ok, s, 1.0))
        tgt = tl.load(targets_ptr + rows, mask=row_ok, other=0)
        x_t = tl.load(base + tgt[:, None], mask=row_ok[:, None], other=0.0).to(tl.float32)
        tl.store(loss_ptr + rows, lse - tl.sum(x_t, 1), mask=row_ok)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(x - lse[:, None]) * scale
            g = tl.where(cols[None, :] == tgt[:, None], g - scale, g)
            tl.store(base + cols[None, :], g.to(logits_ptr.dtype.element_ty), mask=mask)


_CE_ROWS = LazyKernel(_ce_rows)


def launch_config(device: torch.device, n_rows: int) -> dict[str, Any]:
    """programs 0: one per row tile. On CPU (the interpreter pays per operation) wide row tiles."""
    if device.type != "cuda":
        return {"ROWS": 64, "BLOCK": 1024, "num_warps": 4, "programs": 0}
    knob = knobs.kernels()
    return {"ROWS": knob.ce_rows, "BLOCK": knob.ce_block, "num_warps": knob.ce_warps, "programs": knob.ce_programs}


def ce_rows_inplace(logits: torch.Tensor, targets: torch.Tensor, row_loss: torch.Tensor, scale: float,
                    config: dict[str, Any] | None = None) -> None:
    """Triton: row_loss[i] = lse_i - logits[i, t_i]; logits <- (softmax - onehot) * scale, in place."""
    n, v = logits.shape
    if n == 0:
        return
    assert logits.stride(1) == 1 and row_loss.is_contiguous() and targets.is_contiguous()
    cfg = config or launch_config(logits.device, n)
    block = min(cfg["BLOCK"], pow2_at_least(v))
    tiles = -(-n // cfg["ROWS"])
    programs = min(cfg["programs"] or tiles, tiles)
    _CE_ROWS[(programs,)](logits, logits.stride(0), targets, row_loss, n, v, float(scale), ROWS=cfg["ROWS"],
                          BLOCK=block, num_warps=cfg["num_warps"])


def ce_rows_reference(logits: torch.Tensor, targets: torch.Tensor, row_loss: torch.Tensor,
                      scale: float) -> None:
    """The same contract in torch (fp32 math): the CPU path and the tests' reference."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    hit = torch.arange(x.shape[-1], device=x.device)[None, :] == targets[:, None]
    row_loss.copy_(lse.squeeze(-1) - torch.where(hit, x, 0.0).sum(-1))
    logits.copy_((torch.exp(x - lse) - hit.to(x.dtype)) * scale)


_FP32_GEMM: dict[str, bool] = {}


def fp32_accumulate_gemm(device: torch.device) -> bool:
    """Does this torch have mm/addmm(out_dtype=float32) for bf16 operands on this device? Probed once."""
    key = str(device)
    if key not in _FP32_GEMM:
        try:
            a = torch.ones(16, 16, dtype=torch.bfloat16, device=device)
            acc = torch.mm(a, a, out_dtype=torch.float32)
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            _FP32_GEMM[key] = acc.dtype == torch.float32 and bool((acc == 32.0).all())
        except (RuntimeError, TypeError, NotImplementedError):
            _FP32_GEMM[key] = False
    return _FP32_GEMM[key]


def forward_backward(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int,
                     use_triton: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean loss (fp32 scalar), d(mean loss)/dh (h's dtype), d(mean loss)/dW (fp32)."""
    n, d = h.shape
    vocab = weight.shape[0]
    chunk = max(1, min(chunk_tokens, n))
    grad_h = torch.empty_like(h)
    row_loss = torch.empty(n, dtype=torch.float32, device=h.device)
    logits = torch.empty(chunk, vocab, dtype=h.dtype, device=h.device)
    fp32_gemm = fp32_accumulate_gemm(h.device)
    grad_w: torch.Tensor | None = None if fp32_gemm else torch.zeros(vocab, d, dtype=torch.float32, device=h.device)
    config = launch_config(h.device, chunk) if use_triton else None
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        hc, lg = h[start:end], logits[:end - start]
        torch.mm(hc, weight.t(), out=lg)
        if use_triton:
            ce_rows_inplace(lg, targets[start:end], row_loss[start:end], 1.0 / n, config)
        else:
            ce_rows_reference(lg, targets[start:end], row_loss[start:end], 1.0 / n)
        torch.mm(lg, weight, out=grad_h[start:end])
        if grad_w is None:  # fp32 GEMMs: the first chunk writes the accumulator, no zero fill, no read
            grad_w = torch.mm(lg.t(), hc, out_dtype=torch.float32)
        elif fp32_gemm:
            torch.addmm(grad_w, lg.t(), hc, out_dtype=torch.float32, out=grad_w)
        else:
            grad_w += (lg.t() @ hc).float()
    if grad_w is None:  # no tokens
        grad_w = torch.zeros(vocab, d, dtype=torch.float32, device=h.device)
    return row_loss.sum() / n, grad_h, grad_w


def _scale_cast(src_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(scale_ptr).to(tl.float32)
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, (x * s).to(out_ptr.dtype.element_ty), mask=mask)


_SCALE_CAST = LazyKernel(_scale_cast)


def scale_cast(src: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, use_triton: bool) -> torch.Tensor:
    """(src * scale).to(dtype) in one pass (the fp32 head gradient times the upstream scalar gradient)."""
    if not use_triton:
        return (src * scale.to(src.dtype)).to(dtype)
    out = torch.empty(src.shape, dtype=dtype, device=src.device)
    n = src.numel()
    block = 4096
    _SCALE_CAST[(cdiv(n, block),)](src, scale.reshape(1).float(), out, n, BLOCK=block, num_warps=8)
    return out


def qualify(device: torch.device) -> str | None:
    """The probe: the fused loss (Triton rows writing the gradient in place, the scale-cast) against the same
    chunked path with torch's rows, at a ragged shape (rows, vocabulary and the last chunk fit no tile), and
    the same bits twice; else the reason (the run then keeps the model's torch loss)."""
    gen = torch.Generator(device=device).manual_seed(0)
    n, d, vocab, chunk = 37, 24, 301, 16
    h = torch.randn(n, d, device=device, generator=gen).to(torch.bfloat16)
    w = (0.5 * torch.randn(vocab, d, device=device, generator=gen)).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (n,), device=device, generator=gen)
    scale = torch.tensor(0.75, device=device)
    runs = []
    for _ in range(2):
        total, grad_h, grad_w = forward_backward(h, w, targets, chunk, use_triton=True)
        runs.append((total, grad_h, grad_w, scale_cast(grad_w, scale, torch.bfloat16, use_triton=True)))
    if not all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True)):
        return "loss kernels gave different bits on two identical runs"
    total, grad_h, grad_w = forward_backward(h, w, targets, chunk, use_triton=False)
    want = (total, grad_h, grad_w, scale_cast(grad_w, scale, torch.bfloat16, use_triton=False))
    for name, got, ref in zip(("loss", "grad_h", "grad_w", "scaled grad_w"), runs[0], want, strict=True):
        err = relative_error(got, ref)
        if not err < 1e-2:
            return f"loss {name} relative error {err:.3g} against the torch reference"
    return None


KERNEL = Kernel(
    name="loss",
    summary="the LM head and cross-entropy in token chunks: one reused logits buffer, one Triton pass per row "
            "writing the gradient over the logits, the head gradient accumulated in fp32 inside the GEMM",
    fallback="remote.training.model._ce_chunk",
    probe=qualify,
    deterministic=True,
    deterministic_why="no atomics: one program per row tile, a fixed order along each row; torch sums the row "
                      "losses once",
    knobs=("ce_chunk", "ce_rows", "ce_block", "ce_warps", "ce_programs"),
)
