"""The fleet's preflight: per GPU type, the offer a single run would pick, and whether the fleet fits its caps.

Read-only, before anything is rented: each GPU type's run spec (the base filters with that GPU name, the per-run
cost cap; under `--sim` the smoke profile's CPU steps with a nominal peak per GPU type), the offer `plan_run`
would choose for it (same filters, driver qualification and quote), and the refusal when a type has no offer or
the summed worst cases exceed the total cap or the credit (exit 5, with the table). `fleet.py` runs what this
module planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

from vast_harness.console.money import usd
from vast_harness.console.output import Output
from vast_harness.console.terminal import line, safe_cells, safe_text
from vast_harness.errors import ConfigError, NoOfferError
from vast_harness.host.bundle import Bundle
from vast_harness.market.peaks import load_peaks
from vast_harness.market.plan import RunPlan, account_credit_usd, plan_run
from vast_harness.spec.profile import Caps, DriverPolicy, load_profile
from vast_harness.spec.references import check_gates, shipped_references
from vast_harness.spec.resolve import RunSpec
from vast_harness.vast.client import VastClient

# On --sim the tiny CPU round stands in for the GPU workload; its MFU is against a nominal peak per GPU type
# (the sourced bf16 peak scaled down to what one CPU core reaches), so the figures differ per type.
SIM_PEAK_SCALE = 2e-4
SIM_FALLBACK_PEAK_TFLOPS = 100.0


def parse_gpus(text: str) -> list[str]:
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise ConfigError('--gpus: give one or more GPU names separated by commas, e.g. "RTX 4090,H100 SXM"')
    return names


def nominal_sim_peak_tflops(gpu: str) -> float:
    """The sourced bf16 peak (`market/peaks.py`, matched as remote/accounting/mfu.py matches it) scaled down to what one CPU
    core reaches; a GPU with no sourced peak gets SIM_FALLBACK_PEAK_TFLOPS."""
    peak = load_peaks().sourced_tflops(gpu)
    return round((peak or SIM_FALLBACK_PEAK_TFLOPS) * SIM_PEAK_SCALE, 6)


def spec_for_gpu(base: RunSpec, gpu: str, per_run_usd: float) -> RunSpec:
    """The single run's spec for one GPU type: the base filters with this GPU name, the per-run cost cap."""
    spec = base.model_copy(update={"filters": base.filters.model_copy(update={"gpu_names": [gpu]}),
                                   "caps": Caps(max_usd=per_run_usd, max_minutes=base.caps.max_minutes)})
    if not base.sim:
        return spec
    # Simulated hosts have no GPU: run the smoke profile's tiny CPU steps (same filters, image and caps).
    profile = spec.profile
    if profile.require_gpu:
        smoke = load_profile("smoke")
        # ...and what those steps require (nothing): the GPU steps' [requires] would drop GPU types they never run on
        profile = profile.model_copy(update={"name": f"{profile.name} (--sim: the smoke steps)", "steps": smoke.steps,
                                             "require_gpu": False, "requires": smoke.requires,
                                             "pytest_node_ids": [], "transfer": smoke.transfer})
    env = dict(spec.remote_env) | {"VH_PEAK_TFLOPS": str(nominal_sim_peak_tflops(gpu))}
    return spec.model_copy(update={"profile": profile, "remote_env": env})


@dataclass
class FleetEntry:
    gpu: str
    spec: RunSpec
    plan: RunPlan | None = None
    no_offer: str = ""  # why this GPU type has no offer

    @property
    def worst_case_usd(self) -> float:
        return self.plan.chosen.quote.worst_case_usd if self.plan else 0.0

    def row(self) -> dict[str, Any]:
        if self.plan is None:
            return {"gpu": self.gpu, "offer_id": None, "no_offer": self.no_offer}
        o, q = self.plan.chosen.offer, self.plan.chosen.quote
        return {"gpu": self.gpu, "offer_id": o.id, "num_gpus": o.num_gpus, "dph_usd": round(q.dph_at_disk_usd, 6),
                "driver": o.driver_version, "driver_qualified": self.plan.chosen.driver_qualified,
                "worst_case_usd": round(q.worst_case_usd, 6), "location": o.geolocation}


@dataclass
class Preflight:
    entries: list[FleetEntry]
    total_usd: float
    per_run_usd: float
    credit_usd: float
    allow_overcommit: bool = False

    @property
    def worst_case_sum_usd(self) -> float:
        return sum(e.worst_case_usd for e in self.entries)

    def refusal(self) -> str | None:
        missing = [e for e in self.entries if e.plan is None]
        if missing:
            return "no offer for " + "; ".join(f"{e.gpu}: {e.no_offer}" for e in missing)
        total = self.worst_case_sum_usd
        if total > self.credit_usd:
            return f"the summed worst cases ${total:.4f} exceed the credit ${self.credit_usd:.2f}"
        if total > self.total_usd and not self.allow_overcommit:
            return (f"the summed worst cases ${total:.4f} exceed the total cap --max-usd {usd(self.total_usd)} "
                    "(raise it, drop a GPU type, shorten --max-minutes, or --allow-overcommit to let the live "
                    "monitor hold the total)")
        return None

    def summary(self) -> dict[str, Any]:
        return {"rows": [e.row() for e in self.entries], "worst_case_sum_usd": round(self.worst_case_sum_usd, 6),
                "total_cap_usd": self.total_usd, "per_run_usd": self.per_run_usd, "credit_usd": self.credit_usd,
                "allow_overcommit": self.allow_overcommit, "refused": self.refusal()}


def preflight(base: RunSpec, gpus: list[str], client: VastClient, drivers: DriverPolicy, bundle: Bundle, *,
              total_usd: float, per_run_usd: float, allow_overcommit: bool = False) -> Preflight:
    """Read-only: the offer each GPU type's run would pick, and whether the fleet fits its caps."""
    entries = []
    for gpu in gpus:
        entry = FleetEntry(gpu=gpu, spec=spec_for_gpu(base, gpu, per_run_usd))
        receipt = entry.spec.profile.receipt
        if receipt.declared_gates:  # a gate this GPU type cannot report: exit 2 before anything is rented
            check_gates(receipt, num_gpus=entry.spec.filters.num_gpus, gpu_names=[gpu], refs=shipped_references())
        try:
            entry.plan = plan_run(entry.spec, client, drivers, bundle)
        except NoOfferError as exc:
            closest = exc.rejected[0].reasons if exc.rejected else []
            entry.no_offer = str(exc) + (f"; closest offer: {'; '.join(closest)}" if closest else "")
        entries.append(entry)
    credit = account_credit_usd(client)
    return Preflight(entries, total_usd, per_run_usd, credit, allow_overcommit)


def print_preflight(out: Output, pre: Preflight, *, title: str) -> None:
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for col in ("GPU", "offer", "n", "$/h", "driver", "qualified", "worst case $", "location / why no offer"):
        t.add_column(col, overflow="fold")
    for e in pre.entries:
        r = e.row()
        if e.plan is None:
            t.add_row(*safe_cells(e.gpu, "–", "–", "–", "–", "–", "–", safe_text(e.no_offer, "red")))
            continue
        t.add_row(*safe_cells(e.gpu, r["offer_id"], r["num_gpus"], f"{r['dph_usd']:.4f}", r["driver"],
                              "yes" if r["driver_qualified"] else Text("no", style="yellow"),
                              f"{r['worst_case_usd']:.4f}", r["location"]))
    console = out.err if out.json_mode else out.out
    console.print(t)
    console.print(line(("Summed worst case", "bold"), f" ${pre.worst_case_sum_usd:.4f} · total cap ${pre.total_usd:.2f} · "
                       f"per run ${pre.per_run_usd:.2f} · credit ${pre.credit_usd:.2f}"))
