"""Offer choice: the server-side query, the client-side re-check, driver qualification, paging, ranking.

The server filters are a first cut only: every filter is checked again here on the parsed offer, since Vast's
search has no documented guarantees and a stale or mis-typed row must never be rented. Ranking is by worst-case
cost (see quote.py), then reliability. Everything but `search_ranked` is a pure function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from vast_harness.console.money import usd
from vast_harness.console.when import utc
from vast_harness.market.quote import Quote, quote_offer, worst_case_usd
from vast_harness.market.requires import DroppedFamily, dropped_families, requires_query, requires_reasons
from vast_harness.spec.fit import WorkloadFit
from vast_harness.spec.interruptible import Interruptible
from vast_harness.spec.profile import DriverPolicy, Filters
from vast_harness.spec.requires import Requires
from vast_harness.vast.models import Offer

MAX_PAGES = 8
PAGE_LIMIT = 64
# Enough ranked candidates for the boot retries and a margin; paging stops once this many qualify.
WANTED_CANDIDATES = 8
LARGEST_LIMIT = 4  # offers asked for when naming the largest GPU on the market


class OfferCriteria(BaseModel):
    """What an offer must satisfy, gathered from the run spec."""

    filters: Filters
    image_cuda: float
    disk_gb: float
    min_duration_s: float
    max_minutes: float
    max_usd: float
    max_usd_source: str = "--max-usd"  # where the cap came from, named in a rejection (spec.resolve)
    credit_usd: float | None = None
    any_driver: bool = False
    upload_bytes: int = 0
    download_bytes: int = 0
    exclude_machine_ids: frozenset[int] = frozenset()
    skip_machine_ids: frozenset[int] = frozenset()  # failed a receipt before (state/machines.py)
    requires: Requires = Requires()  # the profile's [requires]: what the workload can run on
    fit: WorkloadFit | None = None  # the memory its 1B runs need, from the run's settings (spec/fit.py)
    now_unix: float | None = None  # the API server's clock at the search (its `Date`): an offer's end date against it
    bid: Interruptible | None = None  # --interruptible: bid offers, priced at the bid placed (spec/interruptible.py)
    max_dph_usd: float | None = None  # a replacement host may not bill more per hour than the plan's worst case assumed


class Candidate(BaseModel):
    offer: Offer
    quote: Quote
    driver_qualified: bool

    def row(self) -> dict[str, Any]:
        """One ranked offer as the offers table and its --json show it."""
        o = self.offer
        return {
            "id": o.id, "gpu": o.gpu_name, "n": o.num_gpus, "driver": o.driver_version, "qualified": self.driver_qualified,
            "cuda": o.cuda_max_good, "pcie_bw": o.pcie_bw_gbps, "dph": round(self.quote.dph_at_disk_usd, 4),
            "worst_case_usd": round(self.quote.worst_case_usd, 4), "reliability": round(o.reliability_score, 3),
            "location": o.geolocation,
        }


@dataclass(slots=True)
class Rejection:
    """An offer that failed, and why. A plain dataclass: thousands are made per search (bench_offers.py)."""

    offer: Offer
    worst_case_usd: float | None
    reasons: list[str]

    def row(self) -> dict[str, Any]:
        """One rejected offer as the rejections table and its --json show it."""
        o = self.offer
        return {
            "id": o.id, "gpu": o.gpu_name, "n": o.num_gpus, "driver": o.driver_version,
            "worst_case_usd": round(self.worst_case_usd, 4) if self.worst_case_usd is not None else None,
            "reasons": self.reasons,
        }


class OfferChoice(BaseModel):
    ranked: list[Candidate] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    pages: int = 0
    offers_seen: int = 0
    dropped: list[DroppedFamily] = Field(default_factory=list)  # per GPU family, what [requires] dropped and why
    largest_gpus: list[Offer] = Field(default_factory=list)  # with nothing ranked: the offers with the most memory

    def closest_rejections(self, n: int = 5) -> list[Rejection]:
        """The rejects a user most wants to see: fewest reasons, then cheapest worst case."""
        return sorted(
            self.rejected,
            key=lambda r: (len(r.reasons), r.worst_case_usd if r.worst_case_usd is not None else float("inf")),
        )[:n]


def build_query(
    criteria: OfferCriteria, *, exclude_ids: Iterable[int] = (), limit: int = PAGE_LIMIT, with_requires: bool = True
) -> dict[str, Any]:
    """The POST /api/v0/bundles/ body for these criteria (docs/vast-behaviours.md)."""
    f = criteria.filters
    query: dict[str, Any] = {
        # verified = false omits the field: the official CLI's `verified=any` deletes it from its query (vast.py
        # parse_query), its only way to widen; if the server's default is verified-only it narrows, never widens
        "verified": {"eq": True} if f.verified else None,
        "external": {"eq": False},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "num_gpus": {"eq": f.num_gpus},
        "cuda_max_good": {"gte": criteria.image_cuda},
        "reliability2": {"gte": f.min_reliability},
        "direct_port_count": {"gte": f.min_direct_ports},
        "disk_space": {"gte": criteria.disk_gb},
        "duration": {"gte": criteria.min_duration_s},
        "pcie_bw": {"gte": f.min_pcie_bw_gbps} if f.min_pcie_bw_gbps else None,
        "inet_down": {"gte": f.min_inet_down_mbps} if f.min_inet_down_mbps else None,
        "gpu_ram": {"gte": f.min_gpu_ram_gb * 1000} if f.min_gpu_ram_gb else None,
        "gpu_name": {"in": list(f.gpu_names)} if f.gpu_names else None,
        "id": {"notin": sorted(set(exclude_ids))} if exclude_ids else None,
        "order": [["dph_total", "asc"]],
        "type": "bid" if criteria.bid is not None else "on-demand",
        "allocated_storage": criteria.disk_gb,
        "limit": limit,
    }
    query = {k: v for k, v in query.items() if v is not None}
    if with_requires:
        query.update(_narrowed(query, requires_query(criteria.requires)))
    return query


def _narrowed(query: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`[requires]`'s narrowing laid over the filters' query: the stricter bound, the common GPU names."""
    out = dict(extra)
    if "gpu_ram" in extra and "gpu_ram" in query:
        out["gpu_ram"] = {"gte": max(extra["gpu_ram"]["gte"], query["gpu_ram"]["gte"])}
    if "gpu_name" in extra and "gpu_name" in query:
        common = [n for n in query["gpu_name"]["in"] if n in extra["gpu_name"]["in"]]
        out["gpu_name"] = {"in": common or query["gpu_name"]["in"]}  # none in common: the re-check drops all
    return out


def _broad_query(criteria: OfferCriteria, limit: int) -> dict[str, Any]:
    """The market's defaults and the GPU count only: what every filter's closest misses are found in."""
    return {k: v for k, v in build_query(criteria, limit=limit).items()
            if k in ("verified", "external", "rentable", "rented", "num_gpus", "order", "type", "allocated_storage",
                     "limit")}


def check_offer(offer: Offer, criteria: OfferCriteria) -> list[str]:
    """Every filter re-checked on the parsed offer; the reasons it fails (empty: it passes)."""
    f = criteria.filters
    reasons: list[str] = []
    if offer.num_gpus != f.num_gpus:
        reasons.append(f"num_gpus {offer.num_gpus} != {f.num_gpus}")
    if f.gpu_names and offer.gpu_name not in f.gpu_names:
        reasons.append(f"gpu {offer.gpu_name!r} not in {f.gpu_names}")
    if (offer.pcie_bw_gbps or 0.0) < f.min_pcie_bw_gbps:
        reasons.append(f"pcie_bw {offer.pcie_bw_gbps} < {f.min_pcie_bw_gbps} GB/s")
    if offer.cuda_max_good is None or offer.cuda_max_good < criteria.image_cuda:
        reasons.append(f"cuda_max_good {offer.cuda_max_good} < image CUDA {criteria.image_cuda}")
    if offer.reliability_score < f.min_reliability:
        reasons.append(f"reliability {offer.reliability_score:.3f} < {f.min_reliability}")
    if (offer.direct_port_count or 0) < f.min_direct_ports:
        reasons.append(f"direct ports {offer.direct_port_count} < {f.min_direct_ports}")
    if (offer.disk_space_gb or 0.0) < criteria.disk_gb:
        reasons.append(f"disk {offer.disk_space_gb} < {criteria.disk_gb} GB")
    if (offer.duration_s or 0.0) < criteria.min_duration_s:
        reasons.append(f"duration {(offer.duration_s or 0) / 60:.0f} min < time cap")
    elif criteria.now_unix is not None and offer.end_date_unix is not None \
            and offer.end_date_unix < criteria.now_unix + criteria.min_duration_s:
        # The contract would end then, and its price with it (Vast's docs): the two fields must agree
        reasons.append(f"ends {utc(offer.end_date_unix)}, inside the time cap")
    if f.min_inet_down_mbps and (offer.inet_down or 0.0) < f.min_inet_down_mbps:
        reasons.append(f"inet_down {offer.inet_down} < {f.min_inet_down_mbps}")
    if f.min_gpu_ram_gb and (offer.gpu_ram_mb or 0.0) < f.min_gpu_ram_gb * 1000:
        reasons.append(f"gpu_ram {offer.gpu_ram_mb} MB < {f.min_gpu_ram_gb} GB")
    if f.verified and offer.verified is False:
        reasons.append("not verified")
    if offer.rentable is False or offer.rented is True:
        reasons.append("not rentable")
    if offer.dph_base is None and offer.dph_total is None:
        reasons.append("no price")
    reasons.extend(price_faults(offer))
    reasons.extend(non_finite_fields(offer))
    if offer.machine_id is not None and offer.machine_id in criteria.exclude_machine_ids:
        reasons.append(f"machine {offer.machine_id} failed to boot earlier in this run")
    elif offer.machine_id is not None and offer.machine_id in criteria.skip_machine_ids:
        reasons.append(f"machine {offer.machine_id} failed its receipt before (`vast-e2e machines`; "
                       f"--forget {offer.machine_id} tries it again)")
    reasons.extend(requires_reasons(offer, criteria.requires, fit=criteria.fit))
    return reasons


# Every number a filter above or the quote reads. A NaN passes any `<` check (every comparison with NaN is
# false: `reliability2: NaN` used to pass `min_reliability 0.95`), so each must be finite, said with the reason.
_FILTERED_NUMBERS = ("pcie_bw_gbps", "cuda_max_good", "reliability", "reliability2", "disk_space_gb", "duration_s",
                     "inet_down", "gpu_ram_mb")


def non_finite_fields(offer: Offer) -> list[str]:
    """The filtered fields that are NaN or infinite (prices are `price_faults`'s)."""
    return [f"{Offer.model_fields[name].alias or name} {value} is not a finite number"
            for name in _FILTERED_NUMBERS
            if isinstance(value := getattr(offer, name), float) and not math.isfinite(value)]


def price_faults(offer: Offer) -> list[str]:
    """Prices that cannot be trusted: non-finite, or not positive ($/h) / negative (storage, bandwidth).

    Written as positive checks (`isfinite and > 0`), since every comparison with NaN is false."""
    faults = []
    for name, value in (("dph_total", offer.dph_total), ("dph_base", offer.dph_base)):
        if value is not None and not (math.isfinite(value) and value > 0):
            faults.append(f"{name} price {value} is not a positive finite number")
    for name, value in (("storage_cost", offer.storage_cost_usd_per_gb_month),
                        ("inet_up_cost", offer.inet_up_cost_usd_per_gb),
                        ("inet_down_cost", offer.inet_down_cost_usd_per_gb)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            faults.append(f"{name} {value} is not a finite non-negative number")
    return faults


def choose(offers: Iterable[Offer], criteria: OfferCriteria, drivers: DriverPolicy) -> OfferChoice:
    """Check, qualify, quote and rank. Pure: the same offers give the same choice."""
    choice = OfferChoice()
    for offer in offers:
        choice.offers_seen += 1
        offer, bid_reasons = with_bid(offer, criteria.bid)
        reasons = check_offer(offer, criteria) + bid_reasons
        qualified = drivers.qualifies(offer.driver_version)
        if not qualified and not criteria.any_driver:
            reasons.append(f"driver {offer.driver_version} not qualified (--any-driver to allow)")
        worst = None
        if (offer.dph_base is not None or offer.dph_total is not None) and not price_faults(offer):
            worst = worst_case_usd(offer, max_minutes=criteria.max_minutes, disk_gb=criteria.disk_gb,
                                   upload_bytes=criteria.upload_bytes, download_bytes=criteria.download_bytes,
                                   terms=criteria.bid)
            if criteria.max_dph_usd is not None and offer.dph_at_disk(criteria.disk_gb) > criteria.max_dph_usd + 1e-9:
                reasons.append(f"{offer.dph_at_disk(criteria.disk_gb):.4f} $/h > the {criteria.max_dph_usd:.4f} $/h "
                               "the plan's worst case assumed for every host of the run")
            if worst > criteria.max_usd:
                reasons.append(f"worst case {usd(worst)} > the cost cap {usd(criteria.max_usd)} "
                               f"({criteria.max_usd_source})")
            if criteria.credit_usd is not None and worst > criteria.credit_usd:
                reasons.append(f"worst case {usd(worst)} > credit {usd(criteria.credit_usd)}")
        if reasons or worst is None:
            choice.rejected.append(Rejection(offer=offer, worst_case_usd=worst, reasons=reasons))
        else:
            quote = quote_offer(offer, max_minutes=criteria.max_minutes, disk_gb=criteria.disk_gb,
                                upload_bytes=criteria.upload_bytes, download_bytes=criteria.download_bytes,
                                terms=criteria.bid)
            choice.ranked.append(Candidate.model_construct(offer=offer, quote=quote, driver_qualified=qualified))
    # Cheapest worst case first; among equals the more reliable host; then id for a stable order.
    choice.ranked.sort(key=lambda c: (round(c.quote.worst_case_usd, 6), -c.offer.reliability_score, c.offer.id))
    return choice


NO_BID_REASON = "no min_bid: not offered as interruptible"


def with_bid(offer: Offer, terms: Interruptible | None) -> tuple[Offer, list[str]]:
    """An interruptible run's view of `offer`: its GPU priced at the bid placed (what the create's `price` says
    and the host bills), with why it cannot be bid on (no `min_bid`, or a fixed bid below it). Unchanged for an
    on-demand run."""
    if terms is None:
        return offer, []
    floor = offer.min_bid_usd_per_h
    if floor is None or not math.isfinite(floor) or floor < 0:
        return offer, [NO_BID_REASON]
    bid = terms.bid_for(floor)
    reasons = [] if bid >= floor else [f"bid ${bid:.4f}/h < min_bid ${floor:.4f}/h"]
    return offer.model_copy(update={"dph_base": bid, "dph_total": None, "bid_usd_per_h": bid}), reasons


def search_ranked(
    search: Callable[[dict[str, Any]], list[Offer]],
    criteria: OfferCriteria,
    drivers: DriverPolicy,
    *,
    max_pages: int = MAX_PAGES,
    page_limit: int = PAGE_LIMIT,
    wanted: int = WANTED_CANDIDATES,
    explain_requires: bool = False,
) -> OfferChoice:
    """Page through the search (Vast has no pagination: exclude the ids already seen) and rank.

    Stops after `max_pages`, when a page comes back short (the market is exhausted), or once `wanted`
    candidates qualify. `explain_requires` (offers, --dry-run): one more read-only page without the
    `[requires]` narrowing, so the GPU families it drops are named with their reasons.
    """
    seen: dict[int, Offer] = {}
    pages = 0
    choice = OfferChoice()
    while pages < max_pages:
        page = search(build_query(criteria, exclude_ids=seen.keys(), limit=page_limit))
        pages += 1
        fresh = [o for o in page if o.id not in seen]
        for offer in fresh:
            seen[offer.id] = offer
        choice = choose(seen.values(), criteria, drivers)
        if len(page) < page_limit or not fresh or len(choice.ranked) >= wanted:
            break
    if not choice.ranked and pages < max_pages:
        # Nothing fits: one broader read-only search (the market's defaults and the GPU count only) so the
        # user sees the closest offers and exactly which filter each one fails.
        pages += 1
        extra = [o for o in search(_broad_query(criteria, page_limit)) if o.id not in seen]
        widened = choose([*seen.values(), *extra], criteria, drivers)
        choice.rejected = widened.rejected
        choice.offers_seen = widened.offers_seen
    if not choice.ranked and criteria.fit is not None and pages < max_pages:
        # The runs may need more memory than any GPU has: the largest offered, so the answer can name it.
        pages += 1
        largest = search(_broad_query(criteria, LARGEST_LIMIT) | {"order": [["gpu_ram", "desc"]]})
        choice.largest_gpus = [o for o in largest if o.gpu_ram_mb is not None and math.isfinite(o.gpu_ram_mb)]
    if explain_requires and (not criteria.requires.is_empty() or criteria.fit is not None):
        # The search was narrowed by [requires]: what it kept out is seen only by asking without it.
        pages += 1
        unnarrowed = search(build_query(criteria, limit=page_limit, with_requires=False))
        choice.dropped = dropped_families({o.id: o for o in [*seen.values(), *unnarrowed]}.values(),
                                          criteria.requires, fit=criteria.fit)
    choice.pages = pages
    return choice
