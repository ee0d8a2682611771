"""Which hand-written kernels run here: one declaration per kernel, one probe and one rule for all of them.

Each kernel module declares itself with a module-level `KERNEL = Kernel(...)`: its name (in `VH_KERNELS` and the
run record), the torch path it replaces and that runs wherever it is off (`fallback`), where it can run at all
(`runs_on`), its probe, whether deterministic runs may use it and why, and its launch knobs
(`remote.knobs.KernelKnobs` fields). The registry finds the declarations by importing every module of this
package (`INFRASTRUCTURE` aside), so adding a kernel is its file and its test: `VH_KERNELS`, the run record,
the listing below and the GPU check's probes (`python -m remote.kernels.check`) pick it up. Two things live
where they belong instead: the line that attaches it where the model is assembled
(`remote.training.parallel.apply_kernels`), and launch knobs of its own, as fields of `remote.knobs.KernelKnobs`
(the one module that reads `VH_*` variables).

A requested kernel is used on a device only if it can run there, deterministic runs allow it, and its probe
passed there: a small forward (and backward) against the reference torch path, on the device, before first use,
the same bits twice. The probe runs once per kernel, device and interpreter mode; its outcome (and why a
requested kernel stays off) goes into the run record (`describe`). The model and the optimizer ask `active`.

    python -m remote.kernels.registry                  the declarations, one line each
    python -m remote.kernels.registry --probe cuda     every probe on this device (exit 1 if one fails)
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from remote import knobs
from remote.kernels import jit

INFRASTRUCTURE = ("check", "jit", "registry")  # the modules of this package that are not kernels


@dataclass(frozen=True, kw_only=True)
class Kernel:
    name: str
    """Its name in `VH_KERNELS` and in the run record."""
    summary: str
    """What it does in place of the torch path, in one line."""
    fallback: str
    """The torch code that runs wherever the kernel is off, as `module.qualname` (tests resolve it)."""
    probe: Callable[[torch.device], str | None]
    """On the device: None if the kernel matches the reference torch path and repeats bitwise, else why not."""
    deterministic: bool
    """Whether `--deterministic` runs may use it."""
    deterministic_why: str
    """Why (or why not): what in the kernel decides the order of its arithmetic."""
    knobs: tuple[str, ...]
    """Its launch knobs: field names of `remote.knobs.KernelKnobs`."""
    runs_on: Callable[[torch.device], str | None] = jit.triton_unavailable
    """None where it can run at all (no probe is tried elsewhere), else why not; Triton's rule by default."""
    default: bool = True
    """In the default set (`VH_KERNELS=all`); an opt-in kernel is asked for by name."""


@dataclass(frozen=True)
class ProbeResult:
    reason: str | None
    """None: passed."""
    seconds: float


@dataclass
class Registry:
    kernels: dict[str, Kernel]
    probes: dict[tuple[str, str, bool], ProbeResult] = field(default_factory=dict)

    @classmethod
    def of(cls, kernels: list[Kernel]) -> Registry:
        names = [k.name for k in kernels]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel names declared twice: {sorted(n for n in names if names.count(n) > 1)}")
        return cls({k.name: k for k in sorted(kernels, key=lambda k: k.name)})

    def names(self) -> tuple[str, ...]:
        return tuple(self.kernels)

    def defaults(self) -> tuple[str, ...]:
        return tuple(n for n, k in self.kernels.items() if k.default)

    def requested(self) -> frozenset[str]:
        """`VH_KERNELS`, resolved against the declared names (KnobError for a name nobody declared)."""
        return knobs.kernels().selection.resolve(self.names(), self.defaults())

    def get(self, name: str) -> Kernel:
        if name not in self.kernels:
            raise ValueError(f"unknown kernel {name!r}; declared: {', '.join(self.kernels)}")
        return self.kernels[name]

    def probe(self, name: str, device: torch.device) -> ProbeResult:
        """The kernel's probe on this device, run once (a probe that raises is a failed probe)."""
        key = (name, str(device), jit.interpret())
        if key not in self.probes:
            start = time.perf_counter()
            try:
                reason = self.get(name).probe(device)
            except Exception as exc:  # noqa: BLE001 - a kernel that cannot even run is simply not used
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.probes[key] = ProbeResult(reason, time.perf_counter() - start)
        return self.probes[key]

    def rejection(self, name: str, device: torch.device) -> str | None:
        """Why this kernel stays off on this device (None: it runs here), whether or not it was requested."""
        kernel = self.get(name)
        cannot = kernel.runs_on(device)
        if cannot is not None:
            return cannot
        if torch.are_deterministic_algorithms_enabled() and not kernel.deterministic:
            return f"not in deterministic runs: {kernel.deterministic_why}"
        reason = self.probe(name, device).reason
        return None if reason is None else f"probe failed: {reason}"

    def active(self, name: str, device: torch.device) -> bool:
        return name in self.requested() and self.rejection(name, device) is None

    def describe(self, device: torch.device) -> dict[str, Any]:
        """What ran and why, for the run record: `rejected` holds every requested kernel that stays off with its
        reason, `probes` every probe that ran (`passed`, `reason`, `seconds`)."""
        requested = sorted(self.requested())
        rejected = {n: r for n in requested if (r := self.rejection(n, device)) is not None}
        probes = {n: {"passed": p.reason is None, "reason": p.reason, "seconds": round(p.seconds, 3)}
                  for (n, dev, mode), p in sorted(self.probes.items())
                  if dev == str(device) and mode == jit.interpret() and n in requested}
        return {"requested": requested, "active": [n for n in requested if n not in rejected], "rejected": rejected,
                "probes": probes, "triton": jit.TRITON_VERSION, "env": knobs.given(knobs.KernelKnobs)}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in fp32: what the probes compare against the torch reference."""
    return float(((got.float() - want.float()).norm() / want.float().norm()).item())


def grads(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The gradients a probe's backward left on its inputs (every one must have one)."""
    out = [t.grad for t in tensors]
    missing = [i for i, g in enumerate(out) if g is None]
    if missing:
        raise RuntimeError(f"the backward left no gradient on input(s) {missing}")
    return [g for g in out if g is not None]


def discover() -> list[Kernel]:
    """Every module of this package but INFRASTRUCTURE must declare `KERNEL`."""
    package = importlib.import_module("remote.kernels")
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in INFRASTRUCTURE or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"remote.kernels.{info.name}")
        kernel = getattr(module, "KERNEL", None)
        if not isinstance(kernel, Kernel):
            raise TypeError(f"remote/kernels/{info.name}.py declares no KERNEL = Kernel(...) (or is it "
                            "infrastructure? then add it to registry.INFRASTRUCTURE)")
        found.append(kernel)
    return found


_DEFAULT: Registry | None = None


def default() -> Registry:
    """The registry of this package's kernels, discovered on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry.of(discover())
    return _DEFAULT


def names() -> tuple[str, ...]:
    return default().names()


def requested() -> frozenset[str]:
    return default().requested()


def active(name: str, device: torch.device) -> bool:
    return default().active(name, device)


def rejection(name: str, device: torch.device) -> str | None:
    return default().rejection(name, device)


def describe(device: torch.device) -> dict[str, Any]:
    return default().describe(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", metavar="DEVICE", help="run every kernel's probe on this device (cuda, cuda:1, cpu)")
    args = ap.parse_args(argv)
    reg = default()
    env = knobs.KernelKnobs.env_names()
    for k in reg.kernels.values():
        print(f"{k.name:7s} {'default' if k.default else 'opt-in':7s} deterministic={k.deterministic} "
              f"knobs={','.join(env[n] for n in k.knobs)} fallback={k.fallback}: {k.summary}")
    if not args.probe:
        return 0
    device = torch.device(args.probe)
    failed = 0
    for name in reg.names():
        why = reg.rejection(name, device)
        failed += why is not None
        print(f"[probe] {'ok  ' if why is None else 'FAIL'} {name} on {device}: {why or 'qualified'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":  # run as the importable module: the kernels declare themselves with its Kernel class
    from remote.kernels import registry as _registry

    sys.exit(_registry.main())
