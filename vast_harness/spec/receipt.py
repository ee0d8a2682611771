"""A profile's `[receipt]`: how long the receipt may take on the host and, per measure, whether it gates the host,
is recorded only, or is not judged at all, with its thresholds (docs/profiles.md, the [receipt] table).

    [receipt]
    budget_s = 90                                  # the receipt's whole run on the host (torch's import included)
    matmul = "record"                              # an action alone: gate | record | off
    hbm_copy = { min_of_reference = 0.85 }         # a table: the action (gate unless said) and thresholds
    h2d = { action = "gate", min_of_offer = 0.6 }

A measure the profile does not name keeps its default (`MEASURES`); a table given merges over the default. A
threshold is a fraction: `min_of_reference` of the reference table's figure for this receipt's method
(profiles/receipt-references.toml), `min_of_offer` of what the offer advertised, `min_of_best` of the host's best
GPU, `max_share` of the burn's samples. The defaults sit a margin above the run-to-run spread of our own receipts
(~1-2%) and the simulator's ±3% noise: 90% of the like-for-like figure.

A profile that names a measure as a gate (explicitly, or by giving it thresholds without an action) gates on it:
a host that cannot measure at all (no python or torch in a `run`'s image) is then refused, where by default it
is only recorded as not measured.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vast_harness.errors import ConfigError
from vast_harness.timings import Timings

Action = Literal["gate", "record", "off"]
ACTIONS = ("gate", "record", "off")
THRESHOLDS = ("min_of_reference", "min_of_offer", "min_of_best", "max_share")
DEFAULT_BUDGET_S = 90.0  # issue 44: the receipt is bounded, 90 s by default on one GPU
MAX_BUDGET_S = 600.0


class MeasureInfo(BaseModel):
    """What a measure is and what it can be compared with (the `[receipt]` keys it takes)."""

    model_config = ConfigDict(frozen=True)

    unit: str
    what: str
    thresholds: tuple[str, ...]
    several_gpus: bool = False  # compares GPUs with each other: a 1-GPU host cannot report it
    needs_ecc: bool = False


class MeasureRule(BaseModel):
    """One measure's action and thresholds. None: not compared (the figure beside it is still shown)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    action: Action = "gate"
    min_of_reference: float | None = Field(default=None, gt=0, le=10)
    min_of_offer: float | None = Field(default=None, gt=0, le=10)
    min_of_best: float | None = Field(default=None, gt=0, le=1)
    max_share: float | None = Field(default=None, gt=0, le=1)

    def threshold(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


MEASURES: dict[str, MeasureInfo] = {
    "matmul": MeasureInfo(unit="TFLOP/s", what="dense bf16 matmul, the best shape's median", thresholds=(
        "min_of_reference", "min_of_offer")),
    "burn": MeasureInfo(unit="TFLOP/s", what="the sustained burn's median window", thresholds=("min_of_reference",)),
    "hbm_copy": MeasureInfo(unit="GB/s", what="device-to-device copy", thresholds=("min_of_reference",
                                                                                   "min_of_offer")),
    "h2d": MeasureInfo(unit="GB/s", what="pinned host-to-device copy", thresholds=("min_of_reference",
                                                                                  "min_of_offer")),
    "d2h": MeasureInfo(unit="GB/s", what="pinned device-to-host copy", thresholds=("min_of_reference",
                                                                                  "min_of_offer")),
    "pcie_link": MeasureInfo(unit="gen x width", what="the PCIe link under load: at the most the driver "
                             "reports, and at least the offer's pci_gen", thresholds=()),
    "ecc": MeasureInfo(unit="errors", what="uncorrectable ECC errors and row remaps (failure or pending)",
                       thresholds=(), needs_ecc=True),
    "throttle": MeasureInfo(unit="share of samples", what="HW slowdown or thermal slowdown active during the burn "
                            "(a SW power cap is normal and recorded)", thresholds=("max_share",)),
    "spread": MeasureInfo(unit="of the best GPU", what="each GPU's burn against the host's best GPU",
                          thresholds=("min_of_best",), several_gpus=True),
    "p2p": MeasureInfo(unit="GB/s", what="the slowest GPU-to-GPU copy", thresholds=("min_of_offer",),
                       several_gpus=True),
    "allreduce": MeasureInfo(unit="GB/s", what="an all-reduce across the GPUs: its sum right, its bus bandwidth",
                             thresholds=(), several_gpus=True),
}

# The defaults: a gate on what a healthy host's figure can be compared with like for like, recorded otherwise.
# h2d gates on the offer's own pcie_bw (Vast measures the same direction); the link table is shown beside it, since
# a host that advertised a slow link honestly is what the renter chose. Vast's total_flops (its precision is not
# documented) and bw_nvlink are shown, never gated, by default.
DEFAULT_RULES: dict[str, MeasureRule] = {
    "matmul": MeasureRule(min_of_reference=0.9),
    "burn": MeasureRule(min_of_reference=0.9),
    "hbm_copy": MeasureRule(min_of_reference=0.9, min_of_offer=0.75),
    "h2d": MeasureRule(min_of_offer=0.7),
    "d2h": MeasureRule(action="record"),
    "pcie_link": MeasureRule(),
    "ecc": MeasureRule(),
    "throttle": MeasureRule(max_share=0.1),
    "spread": MeasureRule(min_of_best=0.9),
    "p2p": MeasureRule(action="record"),
    "allreduce": MeasureRule(),
}


class ReceiptPolicy(BaseModel):
    """`[receipt]`, every measure's rule resolved (the defaults where the profile said nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    enabled: bool = True  # false: no receipt is taken (said in the dry run and the record)
    budget_s: float = Field(default=DEFAULT_BUDGET_S, gt=0, le=MAX_BUDGET_S)
    rules: dict[str, MeasureRule] = Field(default_factory=lambda: dict(DEFAULT_RULES))
    declared_gates: tuple[str, ...] = ()  # measures the profile itself named as gates (see the module doc)
    # the thresholds the profile itself gave, per measure (a default merged in is not the profile's to answer for)
    declared_thresholds: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _measures(cls, data: Any) -> Any:
        """The file's flat form (`matmul = "gate"`, `h2d = {...}`) into `rules`; an unknown key or a threshold a
        measure does not take is named here."""
        if not isinstance(data, dict) or "rules" in data:
            return data
        top = {"enabled", "budget_s"}
        rules = dict(DEFAULT_RULES)
        declared = []
        thresholds: dict[str, tuple[str, ...]] = {}
        for key, given in data.items():
            if key in top:
                continue
            if key not in MEASURES:
                raise ValueError(f"unknown measure {key!r}; the measures are {', '.join(MEASURES)} (and enabled, "
                                 "budget_s)")
            fields = {"action": given} if isinstance(given, str) else given
            if not isinstance(fields, dict):
                raise ValueError(f"{key}: give an action (gate, record or off) or a table of action and thresholds")
            if "action" in fields and fields["action"] not in ACTIONS:
                raise ValueError(f"{key}: action {fields['action']!r} is not one of gate, record, off")
            for name in fields:
                if name in THRESHOLDS and name not in MEASURES[key].thresholds:
                    takes = ", ".join(MEASURES[key].thresholds) or "none"
                    raise ValueError(f"{key}.{name}: {key} has no such comparison (its thresholds: {takes})")
                if name in THRESHOLDS and not _positive(fields[name]):
                    raise ValueError(f"{key}.{name}: {fields[name]!r} is not a positive number")
            thresholds[key] = tuple(name for name in fields if name in THRESHOLDS)
            merged = {**DEFAULT_RULES[key].model_dump(), **fields}
            if "action" not in fields:
                merged["action"] = "gate"
            rules[key] = MeasureRule.model_validate(merged)
            if rules[key].action == "gate":
                declared.append(key)
        return {**{k: v for k, v in data.items() if k in top}, "rules": rules, "declared_gates": tuple(declared),
                "declared_thresholds": thresholds}

    def rule(self, measure: str) -> MeasureRule:
        return self.rules.get(measure, DEFAULT_RULES[measure])

    @property
    def gates_declared(self) -> bool:
        """The profile itself gates on some measure: a host that cannot measure is refused, not just recorded."""
        return bool(self.declared_gates)


def check_receipt_budget(policy: ReceiptPolicy, timings: Timings) -> None:
    """A `budget_s` below the least a receipt can run in would rent a host and end at exit 6 before any work, with
    the whole cap left: exit 2 naming it, before anything is rented."""
    if policy.enabled and policy.budget_s < timings.receipt_min_s:
        raise ConfigError(f"[receipt] budget_s = {policy.budget_s:g} is below the least a receipt runs in here "
                          f"({timings.receipt_min_s:g} s: torch's import and the shortest measures); raise it, or "
                          "set enabled = false to take no receipt")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and value == value \
        and value != float("inf")
