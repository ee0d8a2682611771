"""What a profile can run on (`[requires]`): checked on every offer before renting and on the host that arrived.

`[filters]` narrows the search; `[requires]` says what the workload cannot do without, so an offer that fails
it is dropped with the reason (`offers` and `--dry-run` say it per GPU family) and a host that does not match
it after SSH is deleted before any workload minute. A plain model a CLI can fill (`--gpu`, `--min-gpu-ram-gb`
map onto `gpu_names` and `min_gpu_ram_gib`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Vast's `gpu_ram` and nvidia-smi's `memory.total` are both MiB (an H100 80GB reads 81559 in each, though
# Vast's docs say "MB"), so GiB is the unit a requirement is written in: what torch reports as peak memory.
MIB_PER_GIB = 1024
MAX_GPU_RAM_GIB = 4096


class Requires(BaseModel):
    """A profile's `[requires]`. Every field is optional; the defaults require nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    # Vast GPU names (as `gpu_name` spells them: "H100 SXM", "RTX 4090") this profile can run on; empty: any
    gpu_names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list)
    # only GPUs whose dense bf16 peak is sourced in remote/peaks.json (an MFU needs a peak to divide by)
    sourced_bf16_peak: bool = False
    min_gpu_ram_gib: float = Field(ge=0, le=MAX_GPU_RAM_GIB, default=0)  # per GPU
    min_compute_cap: float | None = Field(default=None, ge=1, le=20)  # e.g. 8.0 for bf16 flash attention
    min_cuda: float | None = Field(default=None, gt=0, le=100)  # the host driver's CUDA (Vast's cuda_max_good)

    @field_validator("gpu_names")
    @classmethod
    def _unique(cls, names: list[str]) -> list[str]:
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"GPU names listed twice: {dupes}")
        return names

    @property
    def min_gpu_ram_mib(self) -> float:
        return self.min_gpu_ram_gib * MIB_PER_GIB

    def is_empty(self) -> bool:
        return self == Requires()
