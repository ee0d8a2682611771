"""Causal attention through FlashAttention-4 (the `flash-attn-4` wheel, import `flash_attn.cute`): the "fa4"
and "fa4-det" attention paths.

FA4's kernels are written in CuTe DSL (the `nvidia-cutlass-dsl` wheel) and JIT-compiled at first use, so the
wheel itself is pure Python. On Hopper at the model's shape (B 16, T 2048, 32/8 heads, D 64, causal, bf16)
its forward+backward beats cuDNN's SDPA, and its deterministic backward (`deterministic=True`: dQ reduced in
a fixed order) beats cuDNN's deterministic one (issue 32; `remote/kernels/NOTES.md`).

Two custom ops (opaque to torch.compile, like remote.attention.cudnn_sdpa): forward returns (out, lse) in FA4's own
[B, T, H, D] layout, backward (dq, dk, dv). torch 2.11's `activate_flash_attention_impl("FA4")` expects a
different return arity from this FA4 release, so it is not used. `deterministic` travels as an input of the
forward op, so the backward the autograd formula calls is fixed when the graph is traced.

`available()` is the probe: None where a small causal fwd+bwd at the model's head layout runs here, matches
an fp32 reference and (deterministic) gives the same bits twice; else the reason, and attention.choose goes
on to the next path. Architectures without a measurement here (sm120, e.g. the RTX 5090) are refused up
front: cuDNN stays their path until FA4 is measured faster there.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Compute capability majors FA4 was measured on (and faster than cuDNN): Hopper (9.x) and Blackwell DC (10.x).
QUALIFIED_MAJORS = (9, 10)
PACKAGES = ("flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-base",
            "nvidia-cutlass-dsl-libs-cu13", "nvidia-cutlass-dsl-libs-cu12", "quack-kernels", "apache-tvm-ffi",
            "torch-c-dlpack-ext")

_IFACE: Any = None
_IMPORT_ERROR: str | None = None


def _add_dsl_packages() -> None:
    """nvidia-cutlass-dsl puts <pkg>/dsl_packages (the `cutlass` module) on sys.path from a .pth file, which
    Python reads only in a site directory, never from PYTHONPATH or a `pip --target` folder (the host's
    pydeps): do what the .pth does."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "dsl_packages")
        if os.path.isdir(path) and path not in sys.path:
            sys.path.insert(0, path)


def interface() -> Any:
    """flash_attn.cute.interface, imported once; None (and import_error() says why) where it cannot be."""
    global _IFACE, _IMPORT_ERROR
    if _IFACE is None and _IMPORT_ERROR is None:
        try:
            _add_dsl_packages()
            from flash_attn.cute import interface as iface

            _IFACE = iface
        except Exception as exc:  # noqa: BLE001 - absent wheel, a FA2 `flash_attn` shadowing it, no CUDA libs
            _IMPORT_ERROR = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return _IFACE


def import_error() -> str | None:
    return _IMPORT_ERROR


def versions() -> dict[str, str | None]:
    """The installed versions of FA4 and its support libraries (None where absent), for the run record."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


def _empty_bthd(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, device=like.device, dtype=like.dtype)


@torch.library.custom_op("vh_attn::fa4_fwd", mutates_args=())
def fa4_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, D], k/v [B, T, Hkv, D] (any 16-byte-aligned strides, last dim contiguous) -> out
    [B, T, H, Dv] contiguous, lse [B, H, T] fp32. `deterministic` only selects the backward."""
    b, t, h, _ = q.shape
    out = _empty_bthd((b, t, h, v.shape[-1]), q)
    lse = torch.empty((b, h, t), device=q.device, dtype=torch.float32)
    interface()._flash_attn_fwd(q, k, v, softmax_scale=_scale(q), causal=True, out=out, lse=lse,
                                return_lse=True)
    return out, lse


@fa4_fwd.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, t, h, _ = q.shape
    return q.new_empty((b, t, h, v.shape[-1])), q.new_empty((b, h, t), dtype=torch.float32)


@torch.library.custom_op("vh_attn::fa4_bwd", mutates_args=())
def fa4_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
            lse: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _empty_bthd(q.shape, q), _empty_bthd(k.shape, k), _empty_bthd(v.shape, v)
    interface()._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=_scale(q), causal=True,
                                deterministic=deterministic, dq=dq, dk=dk, dv=dv)
    return dq, dk, dv


@fa4_bwd.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    q, k, v, deterministic = inputs
    ctx.deterministic = deterministic
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = fa4_bwd(q, k, v, out, dout, lse, ctx.deterministic)
    return dq, dk, dv, None


fa4_fwd.register_autograd(_backward, setup_context=_setup)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
    """Causal attention on [B, H, T, D] (k/v may have fewer heads: GQA). The output is a [B, H, T, D] view
    of [B, T, H, D] memory, so the output projection reads it with no copy."""
    out, _lse = fa4_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), deterministic)
    bhtd: torch.Tensor = out.transpose(1, 2)
    return bhtd


def _grad(x: torch.Tensor) -> torch.Tensor:
    if x.grad is None:
        raise RuntimeError("the backward left no gradient on the input")
    return x.grad.detach()


def unqualified(device: torch.device) -> str | None:
    """Why FA4 is not even tried on this device (None: try it)."""
    if device.type != "cuda":
        return "fa4 needs CUDA"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in QUALIFIED_MAJORS:
        return (f"fa4 is not qualified on sm{major}{minor} (measured on sm90/sm100 only; FA4 lists sm120 as "
                "experimental): cuDNN/flash stay this device's path")
    if interface() is None:
        return f"flash-attn-4 is not importable ({import_error()})"
    return None


def available(device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int,
              deterministic: bool = False, seq: int = 256) -> str | None:
    """None if a small causal fwd+bwd at this head layout runs here and is right (and, deterministic, gives
    the same bits twice); else the reason."""
    why = unqualified(device)
    if why:
        return why
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        base = torch.randn(2, seq, n_heads + 2 * n_kv, head_dim, device=device, dtype=dtype, generator=gen)
        dout = torch.randn(2, n_heads, seq, head_dim, device=device, dtype=dtype, generator=gen)
        runs = []
        for _ in range(2 if deterministic else 1):
            x = base.detach().clone().requires_grad_(True)
            q, k, v = x.transpose(1, 2).split([n_heads, n_kv, n_kv], dim=1)
            out = attention(q, k, v, deterministic)
            out.backward(dout)
            runs.append((out.detach(), _grad(x)))
        if not all(torch.isfinite(t).all() for t in runs[0]):
            return "non-finite output"
        if deterministic and not (torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])):
            return "deterministic backward gave different bits on two identical runs"
        ref_x = base.detach().float().requires_grad_(True)
        q, k, v = ref_x.transpose(1, 2).split([n_heads, n_kv, n_kv], dim=1)
        rep = n_heads // n_kv
        with sdpa_kernel([SDPBackend.MATH]):
            ref = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        ref.backward(dout.float())
        for name, got, want in (("out", runs[0][0], ref), ("dqkv", runs[0][1], _grad(ref_x))):
            err = ((got.float() - want).norm() / want.norm()).item()
            if not err < 2e-2:
                return f"{name} relative error {err:.3g} against an fp32 reference"
    except Exception as exc:  # noqa: BLE001 - any failure (JIT compile, unsupported arch/shape) means unavailable
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
