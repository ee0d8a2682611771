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

The $/h holds for the whole time cap: a rental contract locks its price until its end date, and a host's raise
applies only after it, once the renter accepts (docs/vast-behaviours.md); an offer whose end date falls inside
the time cap is refused (market/offers.py). The quote says until when the price is fixed, when the offer says.
"""

from __future__ import annotations

from pydantic import BaseModel

from vast_harness.caps.meter import BYTES_PER_GB
from vast_harness.console.when import utc
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

    @property
    def arithmetic(self) -> str:
        fixed = ("" if self.contract_end_unix is None else
                 f"; the $/h is fixed by the contract until {utc(self.contract_end_unix)}, after the time cap")
        return (
            f"{self.hours:.3f} h x ${self.dph_at_disk_usd:.4f}/h (disk {self.disk_gb:g} GB) = ${self.compute_usd:.4f}"
            f" + upload {self.upload_gb:.4f} GB = ${self.upload_usd:.4f}"
            f" + evidence {self.download_gb:.4f} GB = ${self.download_usd:.4f}"
            f" -> worst case ${self.worst_case_usd:.4f}{fixed}"
        )


def worst_case_usd(
    offer: Offer, *, max_minutes: float, disk_gb: float, upload_bytes: int, download_bytes: int
) -> float:
    """The same sum as `quote_offer`, as one float: used to screen thousands of offers cheaply."""
    return (
        max_minutes / 60.0 * offer.dph_at_disk(disk_gb)
        + (upload_bytes + download_bytes) / BYTES_PER_GB * offer.transfer_usd_per_gb
    )


def quote_offer(
    offer: Offer, *, max_minutes: float, disk_gb: float, upload_bytes: int, download_bytes: int
) -> Quote:
    hours = max_minutes / 60.0
    dph = offer.dph_at_disk(disk_gb)
    upload_gb = upload_bytes / BYTES_PER_GB
    download_gb = download_bytes / BYTES_PER_GB
    compute = hours * dph
    upload = upload_gb * offer.transfer_usd_per_gb
    download = download_gb * offer.transfer_usd_per_gb
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
        worst_case_usd=compute + upload + download,
        contract_end_unix=offer.end_date_unix,
    )
