"""Hand-written kernels for the 1B workload, each behind a knob so one device call can measure each change.

Knobs (environment variables, parsed in `remote.knobs`; recorded in the evidence):

- `VH_KERNELS`: comma list of `loss`, `swiglu`, `optim`, `norm`, `rope`, `mlp`, or `all` (the default) /
  `none`; `all` may be combined with names (kept for kernels that measure no faster and become opt-in).
  - `loss`: the chunked LM-head + cross-entropy with one reused logits buffer, a single Triton pass per row
    (online max/sum, then the gradient written over the logits in place), input gradients written in
    place, and the head gradient accumulated in fp32 inside the GEMM (`addmm(out_dtype=float32)`).
  - `swiglu`: SwiGLU backward in one pass (reads the upstream gradient and gate/up once, writes both).
  - `norm`: RMSNorm and residual add + RMSNorm, forward and backward in one pass each (the weight gradient's
    partial sums in the same pass as dx).
  - `rope`: RoPE on the fused qkv in one pass each way (q, k rotated and v copied into [B, T, H, D]; backward
    writes the whole d(qkv)).
  - `mlp`: the SwiGLU MLP with the activation in the GEMM epilogues (quack's CuTe-DSL GEMMs, sm90/sm100;
    `remote/kernels/mlp.py`): no SwiGLU passes and no `act` kept for backward (8 GiB less at mb 16). Probed;
    off in deterministic runs until their replay with it is measured. Where it is active, `swiglu` has
    nothing left to do. `VH_MLP_GEMMS`, `VH_MLP_TUNED`: see that module.
  - `optim`: one fused AdamW pass (bf16 grad + fp32 master/m/v in, fp32 state + bf16 params out); at world
    size 1 no collectives, no gradient buckets and no bucket zeroing.
- `VH_CE_CHUNK`: tokens per loss chunk (overrides the profile's `ce_chunk_tokens`).
- `VH_CE_BLOCK`, `VH_CE_WARPS`, `VH_CE_PROGRAMS`: the loss kernel's launch (programs 0 = one per row).
- `VH_SWIGLU_BLOCK`, `VH_SWIGLU_WARPS`, `VH_ADAMW_BLOCK`, `VH_ADAMW_WARPS`: the other two launches.

A kernel is active only on CUDA with Triton importable; elsewhere the torch path runs, unchanged. The kernels
in `QUALIFIED` are probed first as well (their module's `qualify(device)`: a small fwd+bwd against the torch
reference and bitwise twice, once per device); one that fails stays off and `describe()` records why. For tests,
`VH_KERNELS_CPU=1` together with `TRITON_INTERPRET=1` runs the Triton kernels on CPU tensors.
"""

from __future__ import annotations

import os

import torch

from remote import knobs

KNOWN = ("loss", "swiglu", "optim", "norm", "rope", "mlp")
# `all` (the default): what measured faster in the step (issue 32: `mlp` -5.5 ms a step on an H200, NOTES.md).
DEFAULT = ("loss", "swiglu", "optim", "norm", "rope", "mlp")
QUALIFIED = ("norm", "rope", "mlp")  # used only where their probe passes on the device (issue 32)

try:
    import triton

    TRITON_VERSION: str | None = triton.__version__
except Exception:  # noqa: BLE001 - a broken triton must only switch the kernels off, never end a run
    TRITON_VERSION = None


def requested() -> frozenset[str]:
    return knobs.kernels().selection.resolve(KNOWN, DEFAULT)


def interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def runs_triton(device: torch.device) -> bool:
    """Can Triton kernels run on tensors of this device (compiled on CUDA, interpreted on CPU in tests)?"""
    if TRITON_VERSION is None:
        return False
    if device.type == "cuda":
        return not interpret()
    return device.type == "cpu" and interpret() and knobs.kernels().on_cpu


def active(name: str, device: torch.device) -> bool:
    if name not in KNOWN:
        raise ValueError(f"unknown kernel {name!r}")
    return name in requested() and runs_triton(device) and rejection(name, device) is None


_PROBES: dict[tuple[str, str, bool], str | None] = {}


def rejection(name: str, device: torch.device) -> str | None:
    """Why a probed kernel (QUALIFIED) is off on this device (None: it qualified, or it needs no probe)."""
    if name not in QUALIFIED:
        return None
    key = (name, str(device), interpret())
    if key not in _PROBES:
        import importlib

        try:
            _PROBES[key] = importlib.import_module(f"remote.kernels.{name}").qualify(device)
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot even run is simply not used
            _PROBES[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return _PROBES[key]


def describe(device: torch.device) -> dict:
    """What ran, for the evidence record."""
    want = [n for n in QUALIFIED if n in requested() and runs_triton(device)]
    return {"requested": sorted(requested()), "active": sorted(n for n in KNOWN if active(n, device)),
            "rejected": {n: rejection(n, device) for n in want if rejection(n, device) is not None},
            "triton": TRITON_VERSION,
            "env": knobs.given(knobs.KernelKnobs)}


class LazyKernel:
    """A Triton kernel decorated on first launch, once per interpret mode: `TRITON_INTERPRET` is read at
    decoration time, so tests can switch to the interpreter after this module was imported."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._jitted: dict[bool, object] = {}

    def __getitem__(self, grid):
        mode = interpret()
        if mode not in self._jitted:
            import triton

            self._jitted[mode] = triton.jit(self.fn)
        return self._jitted[mode][grid]
