"""Is the host that arrived the one offered? GPU names, count, memory, driver and CUDA, compared robustly.

Vast names a GPU its own way ("H100 SXM", "RTX 3090", "A100 SXM4"); nvidia-smi another ("NVIDIA H100 80GB
HBM3", "NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-80GB"). `gpu_key` reduces both to what identifies the
product: the model tokens (those with a digit: "h100", "3090", "a6000"), the variant tokens that make another
product ("nvl", "ti", "d", "ada", "pro") and the form factor ("sxm", "pcie"). Vendor, brand, memory size and
memory type are dropped. Two names match when model and variants are equal and the form factors do not
contradict: nvidia-smi names no form for an SXM H100/H200 ("NVIDIA H100 80GB HBM3"), so an offer's "sxm"
matches a host that names none, while an offer's "pcie" needs the host to say PCIe.

Memory: Vast's `gpu_ram` and nvidia-smi's `memory.total` are both MiB in practice (81559 for an H100 80GB in
each), but ECC on or off moves the total by up to 6.25% (GDDR cards reserve 1/16), so they match within
MEMORY_TOLERANCE.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from vast_harness.records import HostGpu
from vast_harness.spec.requires import MIB_PER_GIB, Requires

MEMORY_TOLERANCE = 0.07  # ECC on a GDDR card hides 1/16 of its memory; more than this is another card
_DROP = frozenset({"nvidia", "geforce", "tesla", "quadro", "q", "generation", "edition", "hbm", "hbm2",
                   "hbm2e", "hbm3", "hbm3e"})
_VARIANTS = frozenset({"nvl", "ti", "d", "ada", "pro", "super", "max", "nvlink"})
_FORMS = {"sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "pcie": "pcie"}
_MEMORY_TOKEN = re.compile(r"^\d+gb$|^gddr\d+x?$")
_GLUED_VARIANT = re.compile(r"(\d)(ada|ti|d)$")  # Vast's "RTX 6000Ada", "RTX 4090D"


class GpuKey(BaseModel):
    """What identifies a GPU product in a name (see the module doc)."""

    model: frozenset[str]
    variants: frozenset[str]
    form: str | None


def gpu_key(name: str) -> GpuKey:
    tokens: list[str] = []
    for raw in re.split(r"[\s\-_/]+", name.lower().strip()):
        glued = _GLUED_VARIANT.search(raw)
        tokens.extend([raw[:glued.start() + 1], glued.group(2)] if glued else [raw])
    kept = [t for t in tokens if t and t not in _DROP and not _MEMORY_TOKEN.match(t)]
    forms = {_FORMS[t] for t in kept if t in _FORMS}
    model = frozenset(t for t in kept if any(c.isdigit() for c in t) and t not in _FORMS)
    variants = frozenset(t for t in kept if t in _VARIANTS)
    if not model:  # "Titan RTX", "Titan Xp": no numbered token, so every word counts
        model = frozenset(t for t in kept if t not in _FORMS and t not in _VARIANTS)
    return GpuKey(model=model, variants=variants, form=next(iter(forms)) if len(forms) == 1 else None)


def same_gpu(offered: str, reported: str) -> bool:
    """Whether Vast's `offered` name and nvidia-smi's `reported` name are one GPU product."""
    a, b = gpu_key(offered), gpu_key(reported)
    if not a.model or a.model != b.model or a.variants != b.variants:
        return False
    if a.form is None or a.form == b.form:
        return True
    return a.form == "sxm" and b.form is None  # nvidia-smi names no form for an SXM H100/H200


def memory_matches(offered_mib: float, reported_mib: float) -> bool:
    return abs(reported_mib - offered_mib) <= MEMORY_TOLERANCE * offered_mib


class Offered(BaseModel):
    """What the offer said, as the comparison reads it (`vast.models.Offer`'s fields)."""

    gpu_name: str
    num_gpus: int
    gpu_ram_mib: float | None
    driver_version: str | None
    cuda_max_good: float | None
    compute_cap: int | None  # Vast's capability x 100

    def describe(self) -> str:
        ram = f"{self.gpu_ram_mib / MIB_PER_GIB:.1f} GiB" if self.gpu_ram_mib else "? GiB"
        return (f"{self.num_gpus}x {self.gpu_name} ({ram}), driver {self.driver_version or '?'}, "
                f"CUDA {self.cuda_max_good if self.cuda_max_good is not None else '?'}")


def mismatches(offered: Offered, gpus: list[HostGpu], cuda_version: str | None, *, requires: Requires,
               image_cuda: float) -> list[str]:
    """Every way the host differs from its offer or falls short of `[requires]` and the image (empty: none)."""
    found: list[str] = []
    if len(gpus) != offered.num_gpus:
        found.append(f"{len(gpus)} GPU(s), the offer said {offered.num_gpus}")
    for name in sorted({g.name for g in gpus}):
        if not same_gpu(offered.gpu_name, name):
            found.append(f"GPU {name!r} is not the offered {offered.gpu_name!r}")
    for ram in sorted({g.memory_mib for g in gpus}):
        if offered.gpu_ram_mib and not memory_matches(offered.gpu_ram_mib, ram):
            found.append(f"{ram} MiB per GPU, the offer said {offered.gpu_ram_mib:.0f} MiB "
                         f"(more than {MEMORY_TOLERANCE:.0%} apart)")
        if requires.min_gpu_ram_gib and ram < requires.min_gpu_ram_mib:
            found.append(f"{ram / MIB_PER_GIB:.1f} GiB per GPU < the {requires.min_gpu_ram_gib:g} GiB it needs")
    for driver in sorted({g.driver_version for g in gpus}):
        if offered.driver_version and driver != offered.driver_version.strip():
            found.append(f"driver {driver}, the offer said {offered.driver_version}")
    for cap in sorted({g.compute_cap or "?" for g in gpus}):
        if offered.compute_cap is not None and cap != "?" and round(float(cap) * 100) != offered.compute_cap:
            found.append(f"compute capability {cap}, the offer said {offered.compute_cap / 100:g}")
        if requires.min_compute_cap is not None and (cap == "?" or float(cap) < requires.min_compute_cap):
            found.append(f"compute capability {cap} < the {requires.min_compute_cap:g} it needs")
    if gpus and cuda_version is not None:
        cuda = float(cuda_version)
        if offered.cuda_max_good is not None and cuda < offered.cuda_max_good:
            found.append(f"driver CUDA {cuda_version}, the offer said {offered.cuda_max_good:g}")
        if cuda < max(image_cuda, requires.min_cuda or 0.0):
            found.append(f"driver CUDA {cuda_version} < the {max(image_cuda, requires.min_cuda or 0.0):g} "
                         "the image and [requires] need")
    return found
