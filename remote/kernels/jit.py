"""Triton, where it imports: the language module the kernels are written in, and where they can run.

Every kernel module imports `tl` from here, so it imports without Triton too (the registry reads each kernel's
declaration on every host); its Triton functions only run where `runs_triton` says so. They are decorated on
first launch (`LazyKernel`), because Triton reads TRITON_INTERPRET when it decorates and the tests switch to
its interpreter after import.

The Triton functions themselves carry no annotations but Triton's own (`tl.constexpr`): Triton's compiler
evaluates each parameter's annotation against the kernel's globals, and a type such as `Any` is no value it
accepts, so each such `def` is exempt from mypy's rule (`type: ignore[no-untyped-def]`) and nothing else is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from remote import knobs

tl: Any  # triton.language, or None where Triton does not import
TRITON_VERSION: str | None
try:
    import triton
    import triton.language

    tl, TRITON_VERSION = triton.language, triton.__version__
except Exception:  # noqa: BLE001 - a broken Triton must only switch the kernels off, never end a run
    tl, TRITON_VERSION = None, None


def interpret() -> bool:
    """Triton's interpreter (TRITON_INTERPRET, Triton's own variable): kernels run on CPU tensors, slowly."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def runs_triton(device: torch.device) -> bool:
    """Can Triton kernels run on tensors of this device (compiled on CUDA, interpreted on CPU in tests)?"""
    return triton_unavailable(device) is None


def triton_unavailable(device: torch.device) -> str | None:
    """Why Triton kernels cannot run on this device (None: they can)."""
    if TRITON_VERSION is None:
        return "Triton is not importable"
    if device.type == "cuda":
        return "TRITON_INTERPRET is set: the interpreter runs CPU tensors only" if interpret() else None
    if device.type == "cpu" and interpret() and knobs.kernels().on_cpu:
        return None
    switch = knobs.KernelKnobs.env_names()["on_cpu"]
    return f"Triton kernels run on CUDA (on {device.type} only in tests: TRITON_INTERPRET=1 with {switch}=1)"


class LazyKernel:
    """A Triton kernel decorated on first launch, once per interpret mode."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self._jitted: dict[bool, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        mode = interpret()
        if mode not in self._jitted:
            self._jitted[mode] = triton.jit(self.fn)
        return self._jitted[mode][grid]  # type: ignore[no-any-return]


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
