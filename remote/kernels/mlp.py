"""The SwiGLU MLP with the activation inside the GEMMs' epilogues (knob `mlp`), through quack's CuTe-DSL
GEMMs (`quack-kernels`, shipped with the FA4 wheels; Hopper and Blackwell only).

Without it a layer's MLP is: w13 GEMM writes gu [N, 2F]; SwiGLU reads gu, writes act [N, F]; w2 GEMM. In
backward: w2's dgrad writes dact [N, F]; SwiGLU backward reads dact and gu, writes dgu [N, 2F]. With it:

- forward: one GEMM whose epilogue writes the pre-activation (kept for backward) and silu(gate) * up;
- backward: w2's dgrad GEMM whose epilogue reads the pre-activation and writes d(pre-activation) and the
  activation again (for w2's weight gradient), so `act` is not kept across the step (0.5 GiB a layer less).

The SwiGLU passes (16 ms a step at mb 16 on an H200) disappear into epilogues of GEMMs that are compute-bound:
-5.5 ms a step on an H200 (issue 32 round 5, remote/kernels/NOTES.md), though one layer timed alone is level.
quack's gated epilogue pairs adjacent columns (gate, up), so while `mlp` is attached the w13 parameter is kept
in that order (rows gate_0, up_0, gate_1, ...; `to_kernel_layout`, once when the kernel is attached): w13's
dgrad and weight-gradient GEMMs then read and write it with plain strides (round 5 read [gate; up] through
quack's `concat_layout` and paid two 67 MB strided copies a layer for cuBLAS, 3.4 ms a step). The runners
hand out the canonical [gate; up] layout (`to_model_layout`) in the run's state, so a run's leaf root
describes the same model whichever path ran. The residual add rides w2's GEMM epilogue (cuBLAS addmm, as
Inductor emits it on the other path): a separate add kernel cost 2 ms a step in round 5's step.

`remote.knobs.KernelKnobs.mlp_gemms`: `fused` (default) runs quack only for the two GEMMs with an epilogue and
cuBLAS for the other four (w2 forward, both weight gradients, w13's dgrad); `all` runs all six on quack.
`mlp_tuned` lets quack autotune its configs per shape (~96 s at first use on an H200, and no faster than the
default configs there; the choice may differ between processes, so never under deterministic algorithms).

Deterministic runs use it: no split-K, no atomics, the same bits twice in one process (remote.kernels.check),
and a deterministic run replayed bitwise with it on an H200 (issue 32 round 6, call 1: `replay_match` true,
4 ms a step faster than without it).

Two custom ops, opaque to torch.compile (like remote.attention.fa4): the compiled per-layer graph calls them as one
node each. `KERNEL` below declares it to the registry: it runs where `unavailable` finds quack's GEMMs, and its
probe (`check_small`) is fwd+bwd at a small shape against fp32 torch, and the same bits twice.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

from remote import knobs
from remote.kernels.registry import Kernel, grads

QUALIFIED_MAJORS = (9, 10)  # quack's sm90 / sm100 GEMMs; elsewhere the cuBLAS + Triton SwiGLU path stays


class _Quack:
    """quack.gemm_interface, imported once (after FA4's import put nvidia_cutlass_dsl's `cutlass` on sys.path)."""

    module: Any = None
    error: str | None = None


def quack() -> Any:
    if _Quack.module is None and _Quack.error is None:
        try:
            from remote.attention import fa4

            if fa4.interface() is None:
                raise ImportError(f"the FA4 / CuTe DSL wheels are not importable ({fa4.import_error()})")
            _key_context_vars_by_name()
            import quack.gemm_interface as gi  # noqa: PLC0415 - shipped with the FA4 wheels only

            _Quack.module = gi
        except Exception as exc:  # noqa: BLE001 - absent wheels, no CUDA 13 driver: the knob just stays off
            _Quack.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return _Quack.module


def _key_context_vars_by_name() -> None:
    """quack 0.6.5 keys its compiled epilogues by walking the epilogue function's globals, and refuses a
    value it has no key for. With nvidia-cutlass-dsl 4.8.1 (the release FA4 4.0.0b36 pins) that walk reaches
    cutlass's MLIR source-location helpers (`cutlass._mlir_helpers.op._LOC_TRANSFORMS`, a ContextVar, and
    `code.co_positions`), so every gated epilogue failed to import (seen on the H200, issue 32). Those
    values decide debug locations, not traced math: a value quack cannot key is keyed by its type and name
    (stable across processes), everything else goes to quack's own function."""
    import contextvars

    from quack.gemm_runtime import identity  # noqa: PLC0415 - shipped with the FA4 wheels only

    original = identity.semantic_value_key
    if getattr(original, "vh_context_vars", False):
        return

    def semantic_value_key(value: Any, seen: Any) -> Any:
        if isinstance(value, contextvars.ContextVar):
            return ("contextvar", value.name)
        try:
            return original(value, seen)
        except TypeError as exc:
            if not str(exc).startswith("epilogue fn depends on"):
                raise
            return ("opaque", type(value).__module__, type(value).__qualname__,
                    getattr(value, "__qualname__", None) or getattr(value, "__name__", None))

    semantic_value_key.vh_context_vars = True  # type: ignore[attr-defined]
    identity.semantic_value_key = semantic_value_key
    for name, module in list(sys.modules.items()):  # modules that imported it by name before this point
        if name.startswith("quack.") and getattr(module, "_semantic_value_key", None) is original:
            setattr(module, "_semantic_value_key", semantic_value_key)


def settings() -> dict[str, Any]:
    knob = knobs.kernels()
    gemms, tuned = knob.mlp_gemms, knob.mlp_tuned
    if tuned and torch.are_deterministic_algorithms_enabled():
        tuned = False  # a timed choice may differ between the run and its replay
    return {"gemms": gemms, "tuned": tuned}


def to_kernel_layout(w13: torch.Tensor) -> torch.Tensor:
    """[gate rows; up rows] -> rows (gate_0, up_0, gate_1, ...): the order quack's pre-activation has."""
    two_f, d = w13.shape
    return w13.view(2, two_f // 2, d).transpose(0, 1).reshape(two_f, d)


def to_model_layout(w: torch.Tensor) -> torch.Tensor:
    """The inverse: interleaved rows -> [gate rows; up rows] (the model's own layout, the canonical state's)."""
    two_f, d = w.shape
    return w.view(two_f // 2, 2, d).transpose(0, 1).reshape(two_f, d)


@torch.library.custom_op("vh_kernels::mlp_fwd", mutates_args=())
def mlp_fwd(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, residual: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d], w13 [2F, d] (interleaved rows), w2 [d, F], residual [..., d] -> residual + out [..., d],
    pre-activation [N, 2F] (interleaved)."""
    gi, cfg = quack(), settings()
    x2, r2 = x.reshape(-1, x.shape[-1]), residual.reshape(-1, residual.shape[-1])
    preact, act = gi.gemm_gated(x2, w13.T, activation="swiglu", tuned=cfg["tuned"])
    if cfg["gemms"] == "all":
        out = gi.gemm(act, w2.T, tuned=cfg["tuned"]) + r2
    else:
        out = torch.addmm(r2, act, w2.T)  # the residual add in cuBLAS's epilogue (beta = 1)
    return out.view(residual.shape), preact


@mlp_fwd.register_fake
def _(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel() // x.shape[-1]
    return residual.new_empty(residual.shape), x.new_empty((n, w13.shape[0]))


@torch.library.custom_op("vh_kernels::mlp_bwd", mutates_args=())
def mlp_bwd(dout: torch.Tensor, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, preact: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gi, cfg = quack(), settings()
    d2 = dout.reshape(-1, dout.shape[-1]).contiguous()
    x2 = x.reshape(-1, x.shape[-1])
    # dpreact (interleaved) and act again, both from w2's dgrad GEMM's epilogue
    dpre, act = gi.gemm_dgated(d2, w2, preact, activation="swiglu", dynamic_scheduler=True, tuned=cfg["tuned"])
    if cfg["gemms"] == "all":
        dw2 = gi.gemm(d2.T, act, dynamic_scheduler=True, tuned=cfg["tuned"])
        dx = gi.gemm(dpre, w13, dynamic_scheduler=True, tuned=cfg["tuned"])
        dw13 = gi.gemm(dpre.T, x2, dynamic_scheduler=True, tuned=cfg["tuned"])
    else:  # dpre and w13 share the interleaved order: plain strides, no copies
        dw2 = d2.T @ act
        dx = dpre @ w13
        dw13 = dpre.T @ x2
    return dx.view(x.shape), dw13, dw2


@mlp_bwd.register_fake
def _(dout: torch.Tensor, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, preact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), w13.new_empty(w13.shape), w2.new_empty(w2.shape)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, w13, w2, _residual = inputs
    ctx.save_for_backward(x, w13, w2, output[1])


def _backward(ctx: Any, dout: torch.Tensor, _dpre: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    x, w13, w2, preact = ctx.saved_tensors
    return (*mlp_bwd(dout, x, w13, w2, preact), dout)  # d(residual) = d(out)


mlp_fwd.register_autograd(_backward, setup_context=_setup)


def mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + w2(silu(gate) * up), (gate, up) = w13(x) with w13 in `to_kernel_layout`'s interleaved rows;
    the activation in the GEMM epilogues, the residual add in w2's."""
    out: torch.Tensor = mlp_fwd(x, w13, w2, residual)[0]
    return out


def reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The same in plain torch, w13 in the model's [gate; up] rows."""
    gate, up = (x @ w13.T).chunk(2, dim=-1)
    return residual + (F.silu(gate) * up) @ w2.T


def unavailable(device: torch.device) -> str | None:
    """Why quack's GEMMs cannot run on this device (None: they can; the probe decides the rest)."""
    if device.type != "cuda":
        return "mlp needs CUDA (quack's GEMMs)"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in QUALIFIED_MAJORS:
        return f"mlp is not qualified on sm{major}{minor} (quack's gated GEMMs measured on sm90 only)"
    if quack() is None:
        return f"quack is not importable ({_Quack.error})"
    return None


def qualify(device: torch.device) -> str | None:
    """None where the fused MLP runs here, matches fp32 torch (out and the three gradients) and gives the same
    bits twice; else why not."""
    return unavailable(device) or check_small(device)


def check_small(device: torch.device, n: int = 512, d: int = 256, ffn: int = 512) -> str | None:
    """The probe proper: fwd+bwd at a small shape against fp32 torch, and the same bits twice."""
    gen = torch.Generator(device=device).manual_seed(0)
    x0 = torch.randn(2, n // 2, d, device=device, generator=gen).to(torch.bfloat16)
    w13_0 = (torch.randn(2 * ffn, d, device=device, generator=gen) / d**0.5).to(torch.bfloat16)
    w2_0 = (torch.randn(d, ffn, device=device, generator=gen) / ffn**0.5).to(torch.bfloat16)
    r0 = torch.randn(2, n // 2, d, device=device, generator=gen).to(torch.bfloat16)
    dout = torch.randn(2, n // 2, d, device=device, generator=gen).to(torch.bfloat16)
    runs = []
    for _ in range(2):
        x, w13, w2, r = (t.detach().clone().requires_grad_(True) for t in (x0, to_kernel_layout(w13_0), w2_0, r0))
        out = mlp(x, w13, w2, r)
        out.backward(dout)
        dx, dw13, dw2, dr = grads(x, w13, w2, r)
        runs.append((out.detach(), dx, to_model_layout(dw13), dw2, dr))
    if not all(torch.equal(a, b) for a, b in zip(*runs)):
        return "different bits on two identical runs"
    ref_in = [t.detach().float().requires_grad_(True) for t in (x0, w13_0, w2_0, r0)]
    ref = reference(*ref_in)
    ref.backward(dout.float())
    for name, got, want in zip(("out", "dx", "dw13", "dw2", "dresidual"), runs[0], (ref, *grads(*ref_in))):
        err = ((got.float() - want).norm() / want.norm()).item()
        if not err < 2e-2:
            return f"{name} relative error {err:.3g} against fp32 torch"
    return None


KERNEL = Kernel(
    name="mlp",
    summary="the SwiGLU MLP with the activation in quack's GEMM epilogues (sm90/sm100) and the residual add in "
            "w2's; no SwiGLU passes and no activation kept for backward (w13 held in quack's interleaved rows)",
    fallback="remote.training.model.FeedForward.forward",
    probe=check_small,
    runs_on=unavailable,
    deterministic=True,
    deterministic_why="quack's gated GEMMs use no split-K and no atomics; a deterministic run replayed bitwise with "
                      "it on an H200 (issue 32 round 6); autotuning stays off under deterministic algorithms",
    knobs=("mlp_gemms", "mlp_tuned", "mlp_check"),
)
