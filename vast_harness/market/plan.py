"""Preflight and offer choice: everything a run decides before it rents, and all a dry run shows.

Only read-only calls happen here: `users/current` and at most MAX_PAGES offer searches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from vast_harness.clock import now_s
from vast_harness.console.money import usd
from vast_harness.errors import ConfigError, NoOfferError, TransportError
from vast_harness.host.bundle import Bundle
from vast_harness.host.receipt import receipt_payload
from vast_harness.market.offers import (
    NO_BID_REASON,
    Candidate,
    OfferChoice,
    OfferCriteria,
    Rejection,
    search_ranked,
)
from vast_harness.market.requires import DroppedFamily, memory_shortfall
from vast_harness.records import OfferSummary, WorkdirRecord
from vast_harness.spec.fit import GpuFit
from vast_harness.spec.profile import DriverPolicy
from vast_harness.spec.receipt import MEASURES
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.machines import MachineHistory, market_of
from vast_harness.vast.client import VastClient

MB = 1_000_000
# Nothing is rented while the preflight's read-only calls run: an API that does not answer is said after this
# many seconds of retries, not after the client's whole retry budget (which is there to protect a DELETE).
PREFLIGHT_RETRY_S = 30.0
# Nothing is rented yet: a read that stalled for its whole answer bound (45 s, longer than the retry bound)
# is tried once more, not given up on.
PREFLIGHT_MIN_ATTEMPTS = 2
_T = TypeVar("_T")


class PlannedStep(BaseModel):
    """A step as the plan shows it: the command the host will run (placeholders expanded) and its timeout."""

    name: str
    run: str
    timeout_s: float


class PlanCaps(BaseModel):
    max_usd: float
    max_minutes: float


class ReceiptPlan(BaseModel):
    """The receipt as the dry run states it: per host up to `budget_s` on the host (plus its grace), billed at
    the host's price and counted against both caps; up to `hosts` hosts may take one (--boot-retries)."""

    enabled: bool
    budget_s: float
    grace_s: float
    boot_timeout_s: float
    hosts: int
    payload_bytes: int
    usd_per_host: float  # at the chosen offer's price: (budget + grace) x $/h
    gates: list[str]  # the measures that gate (per GPU where a reference or offer figure exists)
    recorded: list[str]

    def line(self) -> str:
        if not self.enabled:
            return "off ([receipt] enabled = false): the host's GPUs are not measured before the work"
        return (f"each of up to {self.hosts} host(s) (--boot-retries {self.hosts - 1}) boots (up to "
                f"{self.boot_timeout_s:g} s) and takes its receipt (up to {self.budget_s:g} s + {self.grace_s:g} s) "
                f"before any work, billed at its price (${self.usd_per_host:.4f} a receipt at this offer's) and "
                f"counted against both caps: inside the worst case, which bills the whole time cap; its payload, "
                f"{self.payload_bytes} bytes a host, is in the upload. Gates: {', '.join(self.gates) or 'none'}; "
                f"recorded: {', '.join(self.recorded) or 'none'}")


class RunPlan(BaseModel):
    """The chosen offer, the alternatives, and what the run will do: the dry run's whole output."""

    profile: str
    image: str
    image_digest_verified: bool
    chosen: Candidate
    alternatives: list[Candidate]
    closest_rejections: list[Rejection]
    offers_seen: int
    pages: int
    credit_usd: float
    steps: list[PlannedStep]
    pytest_node_ids: list[str]
    caps: PlanCaps
    remote_env_shown: dict[str, str]  # settings as given, secrets as ***
    remote_secret_names: list[str]
    bundle_sha256: str
    bundle_bytes: int
    any_driver: bool
    warnings: list[str]
    workdir: WorkdirRecord | None = None  # `vast-e2e run`: what the upload holds, before anything is paid
    artifacts: list[str] = []  # `vast-e2e run --artifact`: the globs pulled back
    requires: dict[str, Any] = Field(default_factory=dict)  # the profile's [requires], as checked on each offer
    dropped: list[DroppedFamily] = Field(default_factory=list)  # what [requires] dropped, per GPU family
    receipt: ReceiptPlan | None = None  # the receipt each host takes before the work (run/receipt.py)
    skipped_machines: int = 0  # machines the history skips: they failed a receipt before (vast-e2e machines)
    fit: GpuFit | None = None  # the profile's 1B runs on the chosen offer's GPU: how each runs, what it needs

    def offer_summary(self) -> OfferSummary:
        return offer_summary(self.chosen)

    def summary(self) -> dict[str, Any]:
        """The JSON form (`--json`): the same facts as the human table."""
        q = self.chosen.quote
        return {
            "profile": self.profile,
            "image": self.image,
            "image_sent": self.image.split(":", 1)[0] + "@" + self.image.partition("@")[2],
            "offer": self.offer_summary().model_dump(),
            "quote": q.model_dump() | {"arithmetic": q.arithmetic},
            "caps": self.caps.model_dump(),
            "credit_usd": self.credit_usd,
            "steps": [s.model_dump() for s in self.steps],
            "pytest_node_ids": self.pytest_node_ids,
            "remote_env": self.remote_env_shown, "remote_secrets": self.remote_secret_names,
            "bundle": {"sha256": self.bundle_sha256, "bytes": self.bundle_bytes},
            **({"workdir": self.workdir.model_dump(), "artifacts": self.artifacts} if self.workdir else {}),
            "offers_seen": self.offers_seen,
            "pages": self.pages,
            "alternatives": [c.offer.id for c in self.alternatives],
            "warnings": self.warnings,
            "requires": self.requires,
            "dropped_by_requires": [f.model_dump() for f in self.dropped],
            "receipt": self.receipt.model_dump() if self.receipt else None,
            "skipped_machines": self.skipped_machines,
            "fit": fit_summary(self.fit) if self.fit is not None else None,
        }


def fit_summary(fit: GpuFit) -> dict[str, Any]:
    """The memory fit on one GPU as `--json` shows it."""
    return {"gpu_gib": round(fit.gpu_gib, 2), "runs": [p.row() for p in fit.placements],
            "dropped": [p.run.tag for p in fit.dropped]}


def offer_summary(cand: Candidate) -> OfferSummary:
    """An offer as the plan, the quote file and the record show it."""
    o, q = cand.offer, cand.quote
    return OfferSummary(id=o.id, machine_id=o.machine_id, gpu_name=o.gpu_name, num_gpus=o.num_gpus,
                        driver_version=o.driver_version, driver_qualified=cand.driver_qualified,
                        cuda_max_good=o.cuda_max_good, pcie_bw_gbps=o.pcie_bw_gbps, dph_total_usd=o.dph_total,
                        dph_at_disk_usd=q.dph_at_disk_usd, reliability=o.reliability_score,
                        geolocation=o.geolocation)


def criteria_for(
    spec: RunSpec, *, credit_usd: float | None, bundle: Bundle, exclude_machine_ids: Iterable[int] = (),
    now_unix: float | None = None, max_dph_usd: float | None = None,
) -> OfferCriteria:
    prof = spec.profile
    return OfferCriteria(
        now_unix=now_unix,
        filters=spec.filters,
        image_cuda=prof.image_cuda,
        disk_gb=prof.disk_gb,
        min_duration_s=spec.max_seconds,
        max_minutes=spec.caps.max_minutes,
        max_usd=spec.caps.max_usd,
        max_usd_source=spec.max_usd_source,
        credit_usd=credit_usd,
        any_driver=spec.any_driver,
        upload_bytes=bundle.size_bytes + int(prof.transfer.upload_extra_mb * MB) + receipt_upload_bytes(spec),
        download_bytes=int(prof.transfer.expected_evidence_mb * MB),
        exclude_machine_ids=frozenset(exclude_machine_ids),
        skip_machine_ids=frozenset(MachineHistory(spec.state_dir).skipped(market_of(spec.api_url, sim=spec.sim))),
        requires=prof.requires,
        fit=spec.fit,
        bid=spec.interruptible,
        max_dph_usd=max_dph_usd,
    )


def receipt_upload_bytes(spec: RunSpec) -> int:
    """The receipt's payload, once per host that may take it: it goes up before the bundle, to every host."""
    if not spec.profile.receipt.enabled:
        return 0
    return receipt_payload().size_bytes * (spec.boot_retries + 1)


def receipt_plan(spec: RunSpec, dph_usd: float) -> ReceiptPlan:
    policy, grace_s = spec.profile.receipt, spec.timings.receipt_grace_s
    gates = [m for m in MEASURES if policy.rule(m).action == "gate"]
    return ReceiptPlan(enabled=policy.enabled, budget_s=policy.budget_s, grace_s=grace_s,
                       boot_timeout_s=spec.profile.boot_timeout_s, hosts=spec.boot_retries + 1, payload_bytes=receipt_payload().size_bytes,
                       usd_per_host=round((policy.budget_s + grace_s) / 3600.0 * dph_usd, 6), gates=gates,
                       recorded=[m for m in MEASURES if policy.rule(m).action == "record"])


def choose_offers(
    spec: RunSpec, client: VastClient, drivers: DriverPolicy, bundle: Bundle, *, credit_usd: float | None,
    exclude_machine_ids: Iterable[int] = (), explain_requires: bool = False, max_dph_usd: float | None = None,
) -> OfferChoice:
    criteria = criteria_for(spec, credit_usd=credit_usd, bundle=bundle, exclude_machine_ids=exclude_machine_ids,
                            now_unix=client.server_clock.now(),  # the credit read heard the server's Date
                            max_dph_usd=max_dph_usd)
    search = partial(client.search_offers, max_retry_s=PREFLIGHT_RETRY_S, min_attempts=PREFLIGHT_MIN_ATTEMPTS)
    return _preflight(client, lambda: search_ranked(search, criteria, drivers, explain_requires=explain_requires))


def account_credit_usd(client: VastClient) -> float:
    """The credit the account can spend now (`users/current`), asked within the preflight's retry bound."""
    return _preflight(client, lambda: client.current_user(max_retry_s=PREFLIGHT_RETRY_S,
                                                          min_attempts=PREFLIGHT_MIN_ATTEMPTS)).available_usd


def _preflight(client: VastClient, call: Callable[[], _T]) -> _T:
    start_s = now_s()  # the measured time, said as it was: retries stop early when a wait won't fit
    try:
        return call()
    except TransportError as exc:
        elapsed_s = now_s() - start_s
        raise TransportError(f"the Vast API at {client.base_url} gave no usable answer in {elapsed_s:.0f} s "
                             f"(retried for up to {PREFLIGHT_RETRY_S:g} s) ({exc})",
                             method=exc.method, path=exc.path) from exc


def refuse_bid(spec: RunSpec, rejected: list[Rejection]) -> None:
    """Exit 2 before renting when the interruptible terms, not the market, left no offer: no offer has a
    `min_bid` (none is interruptible), or a fixed `--bid` is below the `min_bid` of every offer it alone kept out."""
    terms = spec.interruptible
    if terms is None or not rejected:
        return
    if all(NO_BID_REASON in r.reasons for r in rejected):
        raise ConfigError(f"--interruptible: none of the {len(rejected)} offers seen is offered as interruptible "
                          "(no min_bid): rent on demand instead (drop --interruptible)")
    underbid = [r for r in rejected if len(r.reasons) == 1 and r.reasons[0].startswith("bid $")]
    if terms.bid_usd_per_h is not None and underbid:
        lowest = min(r.offer.min_bid_usd_per_h or 0.0 for r in underbid)
        raise ConfigError(f"--bid ${terms.bid_usd_per_h:.4f}/h is below the min_bid of every offer it would "
                          f"otherwise rent (lowest ${lowest:.4f}/h): raise it or use --bid auto")


def plan_run(spec: RunSpec, client: VastClient, drivers: DriverPolicy, bundle: Bundle, *,
             explain_requires: bool = False) -> RunPlan:
    """Preflight (credit) and offer choice. Raises NoOfferError (exit 5) with the closest rejects.
    `explain_requires` (the dry run): also name the GPU families `[requires]` drops, one more search."""
    credit = account_credit_usd(client)
    choice = choose_offers(spec, client, drivers, bundle, credit_usd=credit, explain_requires=explain_requires)
    fit = spec.fit
    if not choice.ranked and spec.interruptible is not None:
        refuse_bid(spec, choice.rejected)
    if not choice.ranked:
        seen = [*choice.largest_gpus, *(r.offer for r in choice.rejected)]
        short = memory_shortfall(fit, seen) if fit is not None else None
        raise NoOfferError(
            f"no offer satisfies the filters and caps ({choice.offers_seen} offers seen in {choice.pages} "
            f"page(s), max {usd(spec.caps.max_usd)} ({spec.max_usd_source}), {spec.caps.max_minutes:g} min, credit "
            f"{usd(credit)}){': ' + short if short else ''}",
            rejected=choice.closest_rejections(),
        )
    warnings = list(spec.hints)  # a setting that looks like a secret
    if not spec.profile.image_digest_verified:
        warnings.append("the image digest was not verified against the registry here; check it before paying")
    if not choice.ranked[0].driver_qualified:
        warnings.append("driver outside the qualified list: a valid run, but no bitwise claim (exit 4 on success)")
    return RunPlan(
        profile=spec.profile.name,
        image=spec.profile.image,
        image_digest_verified=spec.profile.image_digest_verified,
        chosen=choice.ranked[0],
        alternatives=choice.ranked[1 : 1 + max(spec.boot_retries, 3)],
        closest_rejections=choice.closest_rejections(),
        offers_seen=choice.offers_seen,
        pages=choice.pages,
        credit_usd=credit,
        steps=[PlannedStep(name=s.name, run=s.run, timeout_s=s.timeout_s) for s in spec.profile.steps],
        pytest_node_ids=list(spec.profile.pytest_node_ids),
        caps=PlanCaps(max_usd=spec.caps.max_usd, max_minutes=spec.caps.max_minutes),
        remote_env_shown=spec.shown_remote_env,
        remote_secret_names=sorted(spec.remote_secrets),
        bundle_sha256=bundle.sha256,
        bundle_bytes=bundle.size_bytes,
        any_driver=spec.any_driver,
        warnings=warnings,
        workdir=bundle.workdir,
        artifacts=list(spec.profile.artifacts),
        requires=spec.profile.requires.model_dump(exclude_defaults=True),
        dropped=choice.dropped,
        receipt=receipt_plan(spec, choice.ranked[0].quote.dph_at_disk_usd),
        skipped_machines=len(criteria_for(spec, credit_usd=credit, bundle=bundle).skip_machine_ids),
        fit=fit.on(choice.ranked[0].offer.gpu_ram_mb or 0.0) if fit is not None else None,
    )
