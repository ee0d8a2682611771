#!/usr/bin/env python3
"""How long offer choice takes: parse, re-check, qualify, quote and rank N offers (target: 3,000 in < 50 ms).

Offers come from the simulator's seeded market (no HTTP in the timed region: the figure is the harness's own
work on a page it already has). Prints the median and p95 of several repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

import random  # noqa: E402

from vast_harness.market.offers import OfferCriteria, choose  # noqa: E402
from vast_harness.sim.market import generate_offers  # noqa: E402
from vast_harness.spec.profile import Filters, load_driver_policy
from vast_harness.vast.models import Offer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--offers", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    raw = generate_offers(random.Random(0), args.offers, time.time())
    drivers = load_driver_policy()
    criteria = OfferCriteria(filters=Filters(num_gpus=1, min_pcie_bw_gbps=10, min_reliability=0.95), image_cuda=12.8,
                             disk_gb=40, min_duration_s=3600, max_minutes=60, max_usd=5.0, credit_usd=100.0,
                             upload_bytes=10**7, download_bytes=10**7)
    parse_ms, choose_ms = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        offers = [Offer.model_validate(o) for o in raw]
        t1 = time.perf_counter()
        choice = choose(offers, criteria, drivers)
        t2 = time.perf_counter()
        parse_ms.append((t1 - t0) * 1e3)
        choose_ms.append((t2 - t1) * 1e3)
    total = [p + c for p, c in zip(parse_ms, choose_ms, strict=True)]
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    print(f"offers: {len(raw)}   ranked: {len(choice.ranked)}   rejected: {len(choice.rejected)}   reps: {args.reps}")
    print(f"{'stage':<22}{'median ms':>12}{'p95 ms':>10}")
    for name, xs in (("parse (pydantic)", parse_ms), ("check+quote+rank", choose_ms), ("total", total)):
        print(f"{name:<22}{statistics.median(xs):>12.1f}{q(xs, 0.95):>10.1f}")
    verdict = "PASS" if statistics.median(total) < 50 else "MISS"
    print(f"target 3,000 offers < 50 ms (median total): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
