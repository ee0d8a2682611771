"""The receipt's reference table (`profiles/receipt-references.toml`): per GPU and measure, what this receipt's own
method reaches on a healthy card (`value`, from committed evidence) beside the best public figure (`public`),
each number with its source.

A gate compares with `value` only (a fraction of it, the profile's `[receipt]`); `public` is shown, never gated
on: public achieved-matmul figures are bursts, and a sustained burn on a healthy 700 W card stays ~12% under them.
A GPU or measure without a `value` is recorded, never failed. The table's header comment says the rest.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vast_harness.errors import ConfigError
from vast_harness.resources import profiles_dir
from vast_harness.spec.profile import load_toml, validation_message
from vast_harness.spec.receipt import MEASURES, ReceiptPolicy

REFERENCES_FILE = "receipt-references.toml"
GPU_MEASURES = ("matmul", "burn", "hbm_copy")  # per GPU product
LINK_MEASURES = ("h2d", "d2h")  # per PCIe link (generation x width)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class EvidencePoint(_Strict):
    """One run of ours the reference was read from: the file (from the repository's root), the field in it as a
    `/`-separated path (`gpus/0/matmul/tflops`), and the number found there."""

    path: str
    field: str
    value: float = Field(gt=0)


class MeasureRef(_Strict):
    unit: Literal["TFLOP/s", "GB/s"]
    value: float | None = Field(default=None, gt=0)  # this receipt's method on a healthy card: what gates compare with
    source: str | None = None
    evidence: list[EvidencePoint] = Field(default_factory=list)
    public: float | None = Field(default=None, gt=0)  # the best public figure: shown, never gated on
    public_source: str | None = None

    @model_validator(mode="after")
    def _sourced(self) -> MeasureRef:
        if self.value is not None and not self.source:
            raise ValueError("a value needs its source")
        if self.public is not None and not self.public_source:
            raise ValueError("a public figure needs its public_source")
        if self.evidence and self.value != min(p.value for p in self.evidence):
            raise ValueError(f"value {self.value} is not the lowest of its evidence "
                             f"({', '.join(f'{p.value:g}' for p in self.evidence)})")
        return self


class GpuRefs(_Strict):
    ecc: bool  # whether the GPU reports ECC at all (GeForce cards do not)
    note: str = ""
    matmul: MeasureRef | None = None
    burn: MeasureRef | None = None
    hbm_copy: MeasureRef | None = None

    def measure(self, name: str) -> MeasureRef | None:
        return getattr(self, name, None) if name in GPU_MEASURES else None


class LinkRefs(_Strict):
    h2d: MeasureRef | None = None
    d2h: MeasureRef | None = None

    def measure(self, name: str) -> MeasureRef | None:
        return getattr(self, name, None) if name in LINK_MEASURES else None


class References(_Strict):
    schema_: Literal[1] = Field(alias="schema")
    gpu: dict[str, GpuRefs] = Field(default_factory=dict)
    pcie: dict[str, LinkRefs] = Field(default_factory=dict)

    def for_gpu(self, gpu_name: str) -> GpuRefs | None:
        """The row of Vast's `gpu_name` ("H100 SXM"), matched exactly but for case and spaces; None: none."""
        want = " ".join(gpu_name.lower().split())
        return next((refs for name, refs in self.gpu.items() if " ".join(name.lower().split()) == want), None)

    def for_link(self, gen: int | None, width: int | None) -> LinkRefs | None:
        return self.pcie.get(f"{gen}x{width}") if gen and width else None

    def gpu_value(self, gpu_name: str, measure: str) -> float | None:
        row = self.for_gpu(gpu_name)
        ref = row.measure(measure) if row else None
        return ref.value if ref else None


def load_references(directory: Path | None = None) -> References:
    """The table, validated; ConfigError naming the file and the field when it is not what it should be."""
    path = (directory or profiles_dir()) / REFERENCES_FILE
    try:
        return References.model_validate(load_toml(path))
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from None


@cache
def shipped_references() -> References:
    """The shipped table, read once per process."""
    return load_references()


def check_gates(policy: ReceiptPolicy, *, num_gpus: int, gpu_names: list[str], refs: References) -> None:
    """ConfigError (exit 2, before anything is rented) for a gate the profile declared on a measure the GPUs it
    may rent cannot report: a comparison of several GPUs on a 1-GPU host, ECC on a card that has none, the
    reference on a GPU the table has no figure for. The defaults never trip this: where a GPU cannot report a
    measure, the measure is recorded, never failed. `gpu_names` empty (any GPU): only the GPU count is known."""
    if not policy.enabled:
        return
    for measure in policy.declared_gates:
        info = MEASURES[measure]
        where = f"[receipt] {measure}"
        if info.several_gpus and num_gpus < 2:
            raise ConfigError(f"{where} is a gate, but a 1-GPU host cannot report it ({info.what}): set it to "
                              "\"record\" or rent several GPUs")
        for gpu in gpu_names:
            row = refs.for_gpu(gpu)
            if info.needs_ecc and row is not None and not row.ecc:
                raise ConfigError(f"{where} is a gate, but {gpu} reports no ECC ({REFERENCES_FILE}): set it to "
                                  "\"record\" or \"off\"")
            # Refused when the profile asked for the reference (min_of_reference given), or gated with nothing
            # else this GPU can be compared with; a profile that gates on the offer (min_of_offer) over the
            # default's min_of_reference has that recorded where the GPU has no reference, never refused.
            rule = policy.rule(measure)
            asked = "min_of_reference" in policy.declared_thresholds.get(measure, ())
            other = [n for n in info.thresholds if n != "min_of_reference" and rule.threshold(n) is not None]
            if (rule.min_of_reference is not None and measure in GPU_MEASURES and (asked or not other)
                    and refs.gpu_value(gpu, measure) is None):
                instead = (f"gate it on the offer's figure instead ({measure} = {{ min_of_offer = 0.9 }}), "
                           if "min_of_offer" in info.thresholds else "")
                raise ConfigError(f"{where} gates on the reference (min_of_reference), but {gpu} has no reference "
                                  f"figure for it in {REFERENCES_FILE}: it can only be recorded there; "
                                  f"{instead}set it to \"record\", or drop the GPU")
