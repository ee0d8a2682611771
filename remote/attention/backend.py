"""Attention backend choice: probe the SDPA paths once per (device, dtype, KV grouping, head dim).

`choose()` tries each candidate path on a small causal forward+backward at the real head layout and
keeps the first that runs; the choice is pinned for the whole run (only that SDPA backend stays enabled,
so a later shape it rejects fails loudly instead of silently switching kernels mid-run). An input that no
fast path accepts stops with a message unless the math path was asked for.

`python -m remote.attention.backend --qualify --out FILE` runs every path at a given shape several times and
records which ones give the same bits each time (the source of profiles/attention-qualification.json).

Besides PyTorch's SDPA backends there are custom paths, each probed like the others and skipped (the reason
recorded in the run JSON's `attention_rejected`) where its wheel, CUDA or architecture is missing:
- "fa4" / "fa4-det" (remote.attention.fa4): FlashAttention-4 (flash-attn-4, CuTe DSL), fast and deterministic
  backward; first in fast and deterministic runs where it qualifies (sm90/sm100 with the wheels installed).
- "cudnn-det" (remote.attention.cudnn_sdpa): cuDNN's attention through its own graph API with cuDNN's deterministic
  backward. PyTorch's SDPA refuses cuDNN in deterministic mode, so without fa4-det and cudnn-det a
  deterministic run lands on FlashAttention-2's slower deterministic backward.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from remote.accounting.merkle import raw_bytes

PATHS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
CUSTOM = ("fa4", "fa4-det", "cudnn-det")  # not SDPA backends: remote.attention.fa4, remote.attention.cudnn_sdpa
CHOICES = (*PATHS, *CUSTOM)
# Fastest first on Hopper (docs/mfu.md; issue 32: FA4 2.53 ms per layer fwd+bwd at the model's shape, cuDNN
# SDPA 2.91, flash SDPA 4.15). Under strict deterministic mode PyTorch removes cuDNN itself; FA4's
# deterministic backward (2.69 ms, bitwise repeatable) goes first there, then cudnn-det (cuDNN's
# deterministic backward, called directly), then flash with its deterministic backward.
FAST_ORDER = {"cuda": ["fa4", "cudnn", "flash", "efficient"], "cpu": ["flash"]}
DETERMINISTIC_ORDER = {"cuda": ["fa4-det", "cudnn-det", "flash", "efficient"], "cpu": ["flash"]}
FA4_PATHS = {"fa4": False, "fa4-det": True}  # path -> FA4's deterministic backward


class AttentionUnavailable(RuntimeError):
    """No fast SDPA path accepts the input and the math path was not asked for."""


@dataclass(frozen=True)
class Choice:
    path: str
    kv_mode: str
    """"gqa": the kernel reads the 8 KV heads directly; "expand": K/V are repeated to all heads first."""
    rejected: dict[str, str]

    def describe(self) -> str:
        return f"{self.path} (kv: {self.kv_mode})"


_PROBED: dict[tuple[Any, ...], Choice] = {}
_ACTIVE: Choice | None = None
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_CUSTOM_FN: AttentionFn | None = None  # the activated custom path's attention(q, k, v), resolved outside any traced graph


def _try(path: str, kv_mode: str, device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int,
         head_dim: int, seq: int = 128) -> str | None:
    """Run one causal fwd+bwd on this path; None if it ran, else the reason."""
    if path in FA4_PATHS:
        if kv_mode != "gqa":
            return f"{path} reads the KV heads directly (gqa) only"
        from remote.attention import fa4

        return fa4.available(device, dtype, n_heads, n_kv, head_dim, deterministic=FA4_PATHS[path])
    if path == "cudnn-det":
        if kv_mode != "gqa":
            return "cudnn-det reads the KV heads directly (gqa) only"
        from remote.attention import cudnn_sdpa

        return cudnn_sdpa.available(device, dtype, n_heads, n_kv, head_dim, seq)
    _base, (q, k, v) = _inputs(device, dtype, 1, seq, n_heads, n_kv, head_dim, seed=0)
    # A rejected path makes PyTorch warn once per reason ("... kernel not used because"); the probe reports
    # the reason itself, so the warnings are only noise in the step's log.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            with sdpa_kernel([PATHS.get(path, SDPBackend.MATH)]):
                out = _call(q, k, v, kv_mode, path)
            out.float().sum().backward()
            if not torch.isfinite(out).all():
                return "non-finite output"
        except RuntimeError as exc:  # "No available kernel" and friends
            return str(exc).splitlines()[0][:200]
    return None


def _inputs(device: torch.device, dtype: torch.dtype, batch: int, seq: int, n_heads: int, n_kv: int,
            head_dim: int, seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """q, k, v laid out exactly as the model makes them (one fused qkv projection, transposed views), so
    a path that accepts the probe accepts the model's strides too."""
    gen = torch.Generator(device=device).manual_seed(seed)
    base = torch.randn(batch, seq, n_heads + 2 * n_kv, head_dim, device=device, dtype=dtype, generator=gen,
                       requires_grad=True)
    return base, base.transpose(1, 2).split([n_heads, n_kv, n_kv], dim=1)


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mode: str, path: str = "") -> torch.Tensor:
    if path in CUSTOM:
        return _custom(path)(q, k, v)
    if q.shape[1] != k.shape[1] and kv_mode != "gqa":
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    gqa = q.shape[1] != k.shape[1]
    out: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return out


def _custom(path: str) -> AttentionFn:
    """The custom path's attention(q, k, v); its module is imported on first use (CUDA runs that chose it)."""
    if path in FA4_PATHS:
        from remote.attention import fa4

        det = FA4_PATHS[path]
        return lambda q, k, v: fa4.attention(q, k, v, det)
    from remote.attention import cudnn_sdpa

    return cudnn_sdpa.attention


def choose(device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int,
           requested: str = "auto", prober: Callable[..., str | None] = _try) -> Choice:
    """Probe once per key; raise AttentionUnavailable naming every rejection."""
    key = (str(device), dtype, n_heads // n_kv, head_dim, requested,
           torch.are_deterministic_algorithms_enabled())
    if key in _PROBED:
        return _PROBED[key]
    if requested == "auto":
        order = DETERMINISTIC_ORDER if torch.are_deterministic_algorithms_enabled() else FAST_ORDER
        candidates = order.get(device.type, [])
    elif requested in CHOICES:
        candidates = [requested]
    else:
        raise ValueError(f"--attention {requested!r} is not one of auto, {', '.join(CHOICES)}")
    rejected: dict[str, str] = {}
    for path in candidates:
        for kv_mode in ("gqa", "expand"):
            reason = prober(path, kv_mode, device, dtype, n_heads, n_kv, head_dim)
            if reason is None:
                _PROBED[key] = Choice(path, kv_mode, rejected)
                return _PROBED[key]
            rejected[f"{path}/{kv_mode}"] = reason
    detail = "; ".join(f"{k}: {v}" for k, v in rejected.items()) or "no candidate for this device"
    raise AttentionUnavailable(
        f"no SDPA path accepts dtype={dtype} head_dim={head_dim} heads={n_heads}/{n_kv} on {device.type} "
        f"({detail}). Use --attention math to run the slow reference path on purpose.")


def activate(choice: Choice) -> None:
    """Pin the chosen backend: every other SDPA backend is switched off for the process."""
    global _ACTIVE, _CUSTOM_FN
    _ACTIVE = choice
    _CUSTOM_FN = _custom(choice.path) if choice.path in CUSTOM else None  # resolved here, not inside a graph
    torch.backends.cuda.enable_flash_sdp(choice.path == "flash")
    torch.backends.cuda.enable_cudnn_sdp(choice.path == "cudnn")
    torch.backends.cuda.enable_mem_efficient_sdp(choice.path == "efficient")
    torch.backends.cuda.enable_math_sdp(choice.path == "math")


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on [B, H, T, D] through the activated path (math/gqa when none was chosen)."""
    if _ACTIVE is None:
        return _call(q, k, v, "gqa")
    if _CUSTOM_FN is not None:
        return _CUSTOM_FN(q, k, v)
    return _call(q, k, v, _ACTIVE.kv_mode, _ACTIVE.path)


# --- qualification ----------------------------------------------------------------------------------


def qualify(device: torch.device, dtype: torch.dtype, batch: int, seq: int, n_heads: int, n_kv: int,
            head_dim: int, repeats: int = 3) -> dict[str, Any]:
    """Run each path `repeats` times on the same inputs; bitwise_stable = output and dq/dk/dv identical."""
    results: dict[str, Any] = {}
    for path in CHOICES:
        backend = PATHS.get(path, SDPBackend.MATH)
        for kv_mode in ("gqa", "expand"):
            if _try(path, kv_mode, device, dtype, n_heads, n_kv, head_dim) is not None:
                continue
            digests: list[list[str]] = []
            times_ms: list[float] = []
            for _ in range(repeats):
                base, (q, k, v) = _inputs(device, dtype, batch, seq, n_heads, n_kv, head_dim, seed=1)
                start, end = _events(device)
                with sdpa_kernel([backend]):
                    out = _call(q, k, v, kv_mode, path)
                    out.backward(torch.ones_like(out))
                end_ms = _elapsed_ms(start, end)
                times_ms.append(end_ms)
                if base.grad is None:
                    raise RuntimeError(f"{path}: the backward left no gradient on the input")
                digests.append([hashlib.sha256(raw_bytes(t.detach().contiguous().cpu())).hexdigest()
                                for t in (out, base.grad)])
            results[f"{path}/{kv_mode}"] = {"bitwise_stable": all(d == digests[0] for d in digests),
                                           "fwd_bwd_ms": times_ms}
            break
    return results


def versions(choice: Choice) -> dict[str, Any]:
    """What the run record says about the attention path: which ran, and the FA4 / cuDNN-frontend versions."""
    from remote.attention import fa4

    rec: dict[str, Any] = {"path": choice.path, "kv_mode": choice.kv_mode, "fa4_packages": fa4.versions()}
    if choice.path == "cudnn-det":
        from remote.attention import cudnn_sdpa

        rec["cudnn_frontend"] = cudnn_sdpa.frontend_version()
    return rec


def _events(device: torch.device) -> tuple[torch.cuda.Event | None, torch.cuda.Event | None]:
    if device.type != "cuda":
        return None, None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def _elapsed_ms(start: torch.cuda.Event | None, end: torch.cuda.Event | None) -> float:
    if start is None or end is None:
        return 0.0
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qualify", action="store_true", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="4,2048,32,8,64", help="batch,seq,heads,kv_heads,head_dim")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts (math path uses cuBLAS)
    batch, seq, heads, kv, hd = (int(x) for x in args.shape.split(","))
    device = torch.device(args.device)
    record: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "shape": {"batch": batch, "seq": seq, "heads": heads, "kv_heads": kv, "head_dim": hd}}
    for mode in ("fast", "deterministic"):
        torch.use_deterministic_algorithms(mode == "deterministic")
        record[mode] = qualify(device, torch.bfloat16, batch, seq, heads, kv, hd)
        if device.type == "cuda":
            record[mode]["chosen"] = asdict(choose(device, torch.bfloat16, heads, kv, hd))
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1)
    print(json.dumps({m: {k: v.get("bitwise_stable") for k, v in record[m].items() if k != "chosen"}
                      for m in ("fast", "deterministic")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
