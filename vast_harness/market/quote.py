"""Worst-case cost of renting one offer for a run: pure arithmetic, shown to the user with its working.

worst case = time cap (h) x $/h at the real disk size
           + bundle upload (GB) x max(inet_up_cost, inet_down_cost)      (bytes into the host)
           + evidence download (GB) x max(inet_up_cost, inet_down_cost)  (bytes out of the host)

Both directions are priced at the higher rate: the $/GB units are sourced, but no source says whose "up"
`inet_up_cost` names (the renter's or the host's), so a host that prices the two differently can never make the
quote under-count (docs/vast-behaviours.md).

`dph_total` excludes bandwidth (docs/vast-behaviours.md), so both transfer terms are added; the disk part is
recomputed from `storage_cost` ($/GB/month, /720 for $/h) at the disk size we will ask for, since the
search may have priced a different `allocated_storage`.

An interruptible run (`terms`) is priced at the bid placed plus the disk, for the whole time cap: it has one instance
at a time (an outbid host is deleted and proven gone before the next is rented), so each host's boot, its seconds
paused while storage bills, and each re-boot are inside those hours, at no more than that $/h (a replacement dearer
than it is not rented: market/offers.py `max_dph_usd`). Each of the k interruptions it covers
(`--max-interruptions`) adds bytes: the checkpoint copied off the husk and up to the next host
(`--checkpoint`'s budget each way) and the bundle uploaded again, at the higher transfer rate. A replacement may
bill up to `headroom` x the first host's $/h (its machine is excluded, so the cheapest is seldom there twice), so
the hours are priced at that ceiling.

The $/h holds for the whole time cap: a rental contract locks its price until its end date, and a host's raise
applies only after it, once the renter accepts (docs/vast-behaviours.md); an offer whose end date falls inside
the time cap is refused (market/offers.py). The quote says until when the price is fixed, when the offer says.
"""

from __future__ import annotations

from pydantic import BaseModel

from vast_harness.caps.meter import BYTES_PER_GB
from vast_harness.console.when import utc
from vast_harness.spec.interruptible import Interruptible
from vast_harness.vast.models import Offer


class Quote(BaseModel):
    offer_id: int
    hours: float
    disk_gb: float
    dph_at_disk_usd: float
    compute_usd: float
    upload_gb: float
    upload_usd: float
    download_gb: float
    download_usd: float
    worst_case_usd: float
    contract_end_unix: float | None = None  # the offer's end date: a contract made now keeps its price until then
    # --interruptible: the bid placed, and what the k interruptions the worst case covers add
    bid_usd_per_h: float | None = None
    min_bid_usd_per_h: float | None = None
    interruptions: int = 0
    per_interruption_gb: float = 0.0
    interruptions_usd: float = 0.0
    ceiling_dph_usd: float | None = None  # the most any host of an interruptible run may bill per hour

    @property
    def arithmetic(self) -> str:
        fixed = ("" if self.contract_end_unix is None else
                 f"; the $/h is fixed by the contract until {utc(self.contract_end_unix)}, after the time cap")
        bid = ("" if self.bid_usd_per_h is None else
               f" (bid ${self.bid_usd_per_h:.4f}/h, min_bid ${self.min_bid_usd_per_h or 0:.4f}/h; any host of the "
               f"run at most ${self.ceiling_dph_usd or 0:.4f}/h, one at a time: every boot, re-boot and pause inside "
               "these hours)")
        interrupts = ("" if self.bid_usd_per_h is None else
                      f" + {self.interruptions} interruption(s) x {self.per_interruption_gb:.4f} GB (checkpoint off "
                      f"the husk and up again, the bundle again) = ${self.interruptions_usd:.4f}")
        return (
            f"{self.hours:.3f} h x ${self.ceiling_dph_usd or self.dph_at_disk_usd:.4f}/h (disk {self.disk_gb:g} GB){bid} = "
            f"${self.compute_usd:.4f}"
            f" + upload {self.upload_gb:.4f} GB = ${self.upload_usd:.4f}"
            f" + evidence {self.download_gb:.4f} GB = ${self.download_usd:.4f}{interrupts}"
            f" -> worst case ${self.worst_case_usd:.4f}{fixed}"
        )


def per_interruption_bytes(terms: Interruptible | None, upload_bytes: int) -> int:
    """What one interruption moves: the checkpoint off the husk and onto the next host, and the bundle again."""
    return 0 if terms is None else 2 * terms.checkpoint_max_bytes + upload_bytes


def worst_case_usd(
    offer: Offer, *, max_minutes: float, disk_gb: float, upload_bytes: int, download_bytes: int,
    terms: Interruptible | None = None,
) -> float:
    """The same sum as `quote_offer`, as one float: used to screen thousands of offers cheaply."""
    k = terms.max_interruptions if terms is not None else 0
    return (
        max_minutes / 60.0 * offer.dph_at_disk(disk_gb) * (terms.headroom if terms is not None else 1.0)
        + (upload_bytes + download_bytes + k * per_interruption_bytes(terms, upload_bytes)) / BYTES_PER_GB
        * offer.transfer_usd_per_gb
    )


def quote_offer(
    offer: Offer, *, max_minutes: float, disk_gb: float, upload_bytes: int, download_bytes: int,
    terms: Interruptible | None = None,
) -> Quote:
    hours = max_minutes / 60.0
    dph = offer.dph_at_disk(disk_gb)
    ceiling = dph * (terms.headroom if terms is not None else 1.0)  # the most any host of the run may bill
    upload_gb = upload_bytes / BYTES_PER_GB
    download_gb = download_bytes / BYTES_PER_GB
    compute = hours * ceiling
    upload = upload_gb * offer.transfer_usd_per_gb
    download = download_gb * offer.transfer_usd_per_gb
    k = terms.max_interruptions if terms is not None else 0
    per_gb = per_interruption_bytes(terms, upload_bytes) / BYTES_PER_GB
    interruptions = k * per_gb * offer.transfer_usd_per_gb
    # model_construct: every field is computed here from validated inputs; validation would double the cost
    # of ranking thousands of offers (scripts/bench/bench_offers.py).
    return Quote.model_construct(
        offer_id=offer.id,
        hours=hours,
        disk_gb=disk_gb,
        dph_at_disk_usd=dph,
        compute_usd=compute,
        upload_gb=upload_gb,
        upload_usd=upload,
        download_gb=download_gb,
        download_usd=download,
        worst_case_usd=compute + upload + download + interruptions,
        contract_end_unix=offer.end_date_unix,
        bid_usd_per_h=offer.bid_usd_per_h,
        min_bid_usd_per_h=offer.min_bid_usd_per_h if terms is not None else None,
        interruptions=k,
        per_interruption_gb=per_gb,
        interruptions_usd=interruptions,
        ceiling_dph_usd=ceiling if terms is not None else None,
    )
