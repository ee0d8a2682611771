"""A profile's `[requires]` and its memory fit applied to offers: why an offer cannot run the workload, and the
dropped offers grouped by GPU family, as `offers` and `--dry-run` say them.

Pure functions over parsed offers; the peak table is data (`market/peaks.py`), the memory fit is the run's
(`spec/fit.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from vast_harness.market.peaks import PeakTable, load_peaks
from vast_harness.spec.fit import WorkloadFit
from vast_harness.spec.requires import MIB_PER_GIB, Requires
from vast_harness.vast.models import Offer

# Vast's compute_cap is the capability times 100 (890 for 8.9).
COMPUTE_CAP_SCALE = 100


def requires_query(requires: Requires) -> dict[str, Any]:
    """The search narrowing `[requires]` allows (documented operators on `gpu_ram`, `compute_cap`,
    `cuda_max_good`, `gpu_name`); the peak is checked client-side only, since it matches names by substring."""
    query: dict[str, Any] = {}
    if requires.min_gpu_ram_gib:
        query["gpu_ram"] = {"gte": requires.min_gpu_ram_mib}
    if requires.min_compute_cap is not None:
        query["compute_cap"] = {"gte": round(requires.min_compute_cap * COMPUTE_CAP_SCALE)}
    if requires.gpu_names:
        query["gpu_name"] = {"in": list(requires.gpu_names)}
    return query


def requires_reasons(offer: Offer, requires: Requires, peaks: PeakTable | None = None,
                     fit: WorkloadFit | None = None) -> list[str]:
    """Why this offer cannot run a profile with these requirements and this memory fit (empty: it can)."""
    reasons: list[str] = []
    if requires.gpu_names and offer.gpu_name not in requires.gpu_names:
        reasons.append(f"{offer.gpu_name or '?'} is not one of the GPUs it runs on ({', '.join(requires.gpu_names)})")
    if requires.sourced_bf16_peak and (peaks or load_peaks()).sourced_tflops(offer.gpu_name) is None:
        reasons.append(f"no sourced bf16 peak for {offer.gpu_name or '?'} (remote/peaks.json)")
    ram_mib = offer.gpu_ram_mb
    if fit is not None:
        if ram_mib is None or not math.isfinite(ram_mib):
            reasons.append(f"GPU memory {'unknown' if ram_mib is None else ram_mib}: the profile's runs need at "
                           f"least {fit.floor_gib:.1f} GiB per GPU")
        else:
            reasons.extend(fit.on(ram_mib).reasons())
    if requires.min_gpu_ram_gib and not _floor_is_the_fits(requires, fit):
        if ram_mib is None or not ram_mib >= requires.min_gpu_ram_mib:  # `not >=`: a NaN fails too
            have = "unknown" if ram_mib is None else f"{ram_mib / MIB_PER_GIB:.1f} GiB"
            reasons.append(f"GPU memory {have} < {requires.min_gpu_ram_gib:g} GiB")
    if requires.min_compute_cap is not None:
        cap = offer.compute_cap
        if cap is None or not cap / COMPUTE_CAP_SCALE >= requires.min_compute_cap:
            have = "unknown" if cap is None else f"{cap / COMPUTE_CAP_SCALE:g}"
            reasons.append(f"compute capability {have} < {requires.min_compute_cap:g}")
    if requires.min_cuda is not None:
        cuda = offer.cuda_max_good
        if cuda is None or not cuda >= requires.min_cuda:
            reasons.append(f"driver CUDA {cuda if cuda is not None else 'unknown'} < {requires.min_cuda:g}")
    return reasons


def _floor_is_the_fits(requires: Requires, fit: WorkloadFit | None) -> bool:
    """The memory floor is the fit's own (resolve made it so): the fit's reasons already say it, better."""
    return fit is not None and requires.min_gpu_ram_gib <= round(fit.floor_gib, 2)


class DroppedFamily(BaseModel):
    """Offers of one GPU name that `[requires]` dropped, how many, and why."""

    gpu: str
    offers: int
    reasons: list[str]
    gpu_ram_mib: float | None = None  # the largest of its offers'

    def line(self) -> str:
        return f"{self.gpu} ({self.offers} offer{'s' if self.offers != 1 else ''}): {'; '.join(self.reasons)}"


def dropped_families(offers: Iterable[Offer], requires: Requires, peaks: PeakTable | None = None,
                     fit: WorkloadFit | None = None) -> list[DroppedFamily]:
    """The offers `[requires]` drops, one entry per GPU name (each reason once), most offers first."""
    families: dict[str, DroppedFamily] = {}
    for offer in offers:
        reasons = requires_reasons(offer, requires, peaks, fit)
        if not reasons:
            continue
        family = families.setdefault(offer.gpu_name or "?", DroppedFamily(gpu=offer.gpu_name or "?", offers=0,
                                                                         reasons=[]))
        family.offers += 1
        family.reasons.extend(r for r in reasons if r not in family.reasons)
        if offer.gpu_ram_mb is not None and offer.gpu_ram_mb > (family.gpu_ram_mib or 0):
            family.gpu_ram_mib = offer.gpu_ram_mb
    return sorted(families.values(), key=lambda f: (-f.offers, f.gpu))


def memory_shortfall(fit: WorkloadFit, offers: Iterable[Offer]) -> str | None:
    """When no offer seen has the memory the profile's runs need: the need and the largest offered (None: one
    has, or none says its memory)."""
    sized = [o for o in offers if o.gpu_ram_mb is not None and math.isfinite(o.gpu_ram_mb)]
    if not sized:
        return None
    largest = max(sized, key=lambda o: o.gpu_ram_mb or 0.0)
    return fit.shortfall((largest.gpu_ram_mb or 0.0) / MIB_PER_GIB, f"{largest.gpu_name or '?'}, offer {largest.id}")
