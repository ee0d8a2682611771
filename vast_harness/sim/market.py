"""A seeded synthetic market of offers, and the search over it.

Offers carry the field names and shapes of `search_offers.yaml`. About half of the drivers fall inside
`profiles/qualified-drivers.toml` (a branch at or above its `min_version`); the rest are older builds of
those branches or other branches. Search applies the documented operators, the server-side default
filters, `order`, `limit`, `type` and `allocated_storage` (which reprices `dph_total`).
"""

from __future__ import annotations

import random
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# resources is a stdlib-only leaf: the simulator imports nothing else of the harness
from vast_harness.resources import profiles_dir
from vast_harness.sim.errors import invalid_args

QUALIFIED_DRIVERS_PATH = profiles_dir() / "qualified-drivers.toml"
HOURS_PER_MONTH = 720  # storage_cost is $/GB/month; Vast divides by 30 × 24 (docs/vast-behaviours.md)
DEFAULT_ALLOCATED_STORAGE_GB = 8.0  # search_offers.yaml: "Default is 8GB"
DEFAULT_LIMIT = 64  # the server's default limit is UNCONFIRMED; callers should always send one
DEFAULT_FILTERS = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False}}
OPERATORS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
ALIASES = {"cuda_vers": "cuda_max_good", "dph": "dph_total", "dlperf_usd": "dlperf_per_dphtotal",
           "flops_usd": "flops_per_dphtotal"}
NON_FILTER_KEYS = frozenset({"order", "limit", "type", "allocated_storage", "disable_bundling"})
# Cuda version each driver branch supports (NVIDIA's release notes).
CUDA_BY_BRANCH = {470: 11.4, 525: 12.0, 535: 12.2, 545: 12.3, 550: 12.4, 555: 12.5, 560: 12.6,
                  565: 12.7, 570: 12.8, 575: 12.9, 580: 13.0, 590: 13.1}
KNOWN_DRIVERS = ("535.183.01", "535.216.03", "545.29.06", "550.54.15", "550.127.05", "550.144.03",
                 "550.163.01", "560.35.03", "565.57.01", "570.86.10", "570.86.15", "570.124.06",
                 "570.133.07", "570.172.08", "575.51.03", "575.57.08", "575.64.03", "580.65.06",
                 "580.82.07", "580.95.05", "580.159.03", "590.44.01")
LOCATIONS = ("Texas, US", "Washington, US", "California, US", "Virginia, US", "Quebec, CA", "Ontario, CA",
             "Oslo, NO", "Stockholm, SE", "Helsinki, FI", "Frankfurt, DE", "Amsterdam, NL",
             "Warsaw, PL", "Prague, CZ", "Tokyo, JP", "Seoul, KR", "Taipei, TW", "Singapore, SG",
             "Sydney, AU", "Sao Paulo, BR", "Bucharest, RO")


@dataclass(frozen=True)
class Gpu:
    name: str
    ram_mb: int
    compute_cap: int
    tflops: float  # per GPU, as Vast's total_flops counts it
    mem_bw_gbs: float
    usd_per_gpu_h: float
    pci_gen: float
    pcie_bw_gbs: float  # a good x16 link; hosts sample below it
    min_branch: int  # oldest driver branch that supports the architecture
    nvlink_gbs: float
    weight: int  # relative frequency on the market


CATALOG: tuple[Gpu, ...] = (
    Gpu("RTX 5090", 32607, 1200, 104.8, 1792.0, 0.60, 5.0, 52.0, 570, 0.0, 8),
    Gpu("RTX 4090", 24564, 890, 82.6, 1008.0, 0.35, 4.0, 25.0, 525, 0.0, 14),
    Gpu("RTX 3090", 24576, 860, 35.6, 936.0, 0.18, 4.0, 24.0, 470, 0.0, 5),
    Gpu("L40S", 46068, 890, 91.6, 864.0, 0.80, 4.0, 25.0, 525, 0.0, 5),
    Gpu("A100 SXM4", 81920, 800, 78.0, 2039.0, 1.10, 4.0, 24.0, 470, 600.0, 5),
    Gpu("A100 PCIE", 40960, 800, 78.0, 1555.0, 0.75, 4.0, 24.0, 470, 0.0, 3),
    Gpu("H100 SXM", 81559, 900, 267.0, 3350.0, 2.10, 5.0, 53.0, 525, 900.0, 6),
    Gpu("H100 PCIE", 81559, 900, 204.0, 2000.0, 1.80, 5.0, 52.0, 525, 0.0, 3),
    Gpu("H200", 143771, 900, 267.0, 4800.0, 2.80, 5.0, 54.0, 535, 900.0, 4),
)


def pack_driver(version: str) -> int:
    """'570.133.07' -> 570133007 (zero-padded triplets, as Vast's driver_vers and the CLI do)."""
    parts = [int(p) for p in version.split(".")] + [0, 0]
    return parts[0] * 1_000_000 + parts[1] * 1_000 + parts[2]


def load_qualified(path: Path = QUALIFIED_DRIVERS_PATH) -> list[tuple[int, int]]:
    """(branch, packed min_version) per entry of the qualified-drivers file; empty when it is absent."""
    if not path.is_file():
        return []
    with path.open("rb") as fh:
        entries = tomllib.load(fh).get("driver", [])
    return [(int(e["branch"]), pack_driver(str(e["min_version"]))) for e in entries]


def is_qualified(version: str, qualified: list[tuple[int, int]]) -> bool:
    packed = pack_driver(version)
    return any(packed // 1_000_000 == branch and packed >= low for branch, low in qualified)


def _driver_pools(gpu: Gpu, qualified: list[tuple[int, int]]) -> tuple[list[str], list[str]]:
    usable = [v for v in KNOWN_DRIVERS if int(v.split(".")[0]) >= gpu.min_branch]
    good = [v for v in usable if is_qualified(v, qualified)]
    return good, [v for v in usable if v not in good]


def generate_offers(rng: random.Random, count: int, now: float,
                    qualified: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """`count` offers, one machine each, drawn from `rng` only (same seed, same market)."""
    qualified = load_qualified() if qualified is None else qualified
    weights = [g.weight for g in CATALOG]
    next_id = rng.randint(10_000_000, 20_000_000)
    machine_ids = rng.sample(range(10_000, 99_999), count) if count < 89_000 else list(range(count))
    offers = []
    for index in range(count):
        gpu = rng.choices(CATALOG, weights)[0]
        next_id += rng.randint(1, 997)
        offers.append(_offer(rng, gpu, next_id, machine_ids[index], now, qualified))
    return offers


def _offer(rng: random.Random, gpu: Gpu, offer_id: int, machine_id: int, now: float,
           qualified: list[tuple[int, int]]) -> dict[str, Any]:
    num = rng.choices((1, 2, 4, 8), (8, 4, 3, 2))[0]
    good, other = _driver_pools(gpu, qualified)
    driver = rng.choice(good if good and (rng.random() < 0.5 or not other) else other)
    branch = int(driver.split(".")[0])
    lanes = rng.choices((16, 8, 4), (7, 2, 1))[0]
    # Most hosts measure close to their link's rate; a minority (risers, bifurcation, contention) far below.
    link_share = rng.uniform(0.85, 1.0) if rng.random() < 0.7 else rng.uniform(0.35, 0.85)
    pcie_bw = round(gpu.pcie_bw_gbs * lanes / 16 * link_share, 1)
    dph_base = round(gpu.usd_per_gpu_h * num * rng.uniform(0.75, 1.5), 4)
    cpu_cores = None if rng.random() < 0.08 else num * rng.choice((8, 12, 16, 24, 32))
    reliability = round(rng.uniform(0.9, 0.9999) if rng.random() < 0.85 else rng.uniform(0.6, 0.95), 4)
    duration_s = round(rng.uniform(0.5, 180) * 86_400, 2)
    inet_up_cost, inet_down_cost = round(rng.uniform(0.001, 0.02), 5), round(rng.uniform(0.001, 0.02), 5)
    geolocation = rng.choice(LOCATIONS)
    return {
        "id": offer_id, "ask_contract_id": offer_id, "bundle_id": offer_id + 400_000_000,
        "bundled_results": None, "machine_id": machine_id, "host_id": 10_000 + machine_id // 7,
        "gpu_name": gpu.name, "num_gpus": num, "gpu_ram": gpu.ram_mb, "gpu_total_ram": gpu.ram_mb * num,
        "gpu_frac": 1.0, "gpu_arch": "nvidia", "gpu_ids": [machine_id * 10 + i for i in range(num)],
        "gpu_lanes": lanes, "gpu_mem_bw": gpu.mem_bw_gbs, "gpu_max_power": 450, "gpu_max_temp": 83,
        "gpu_display_active": False, "bw_nvlink": gpu.nvlink_gbs if num > 1 else 0.0,
        "compute_cap": gpu.compute_cap, "cuda_max_good": CUDA_BY_BRANCH.get(branch, 12.0),
        "driver_version": driver, "driver_vers": pack_driver(driver),
        "pci_gen": gpu.pci_gen if lanes > 4 else gpu.pci_gen - 1.0, "pcie_bw": pcie_bw,
        "total_flops": round(gpu.tflops * num, 2), "dlperf": round(gpu.tflops * num * 0.85, 3),
        "cpu_arch": "amd64", "cpu_cores": cpu_cores,
        "cpu_cores_effective": float(cpu_cores or num * 8), "cpu_ghz": round(rng.uniform(2.0, 3.8), 2),
        "cpu_name": rng.choice(("AMD EPYC 7543 32-Core Processor", "Intel Xeon Platinum 8480+",
                                "AMD Ryzen 9 7950X 16-Core Processor", "AMD EPYC 9354 32-Core Processor")),
        "cpu_ram": num * rng.choice((32_768, 65_536, 131_072)), "has_avx": 1,
        "disk_space": float(rng.choice((100, 250, 500, 1000, 2000, 4000))),
        "disk_bw": round(rng.uniform(500, 6000), 1), "disk_name": rng.choice(("Samsung 990 PRO", "KIOXIA")),
        "dph_base": dph_base, "storage_cost": round(rng.uniform(0.05, 0.3), 6),
        "inet_up_cost": inet_up_cost, "inet_down_cost": inet_down_cost,
        "internet_up_cost_per_tb": round(inet_up_cost * 1000, 3),
        "internet_down_cost_per_tb": round(inet_down_cost * 1000, 3),
        "inet_up": round(rng.uniform(50, 5000), 1), "inet_down": round(rng.uniform(50, 5000), 1),
        "min_bid": round(dph_base * rng.uniform(0.4, 0.7), 4), "is_bid": False,
        "credit_discount_max": 0.4, "reliability": round(min(1.0, reliability + 0.002), 4),
        "reliability2": reliability, "reliability_mult": round(reliability * 0.95, 4),
        "expected_reliability": reliability, "geolocation": geolocation,
        "geolocode": 1000 + LOCATIONS.index(geolocation), "duration": duration_s,
        "start_date": round(now - rng.uniform(3_600, 3_600_000), 1), "end_date": round(now + duration_s, 1),
        "direct_port_count": rng.choice((0, 4, 16, 64, 200, 500)), "static_ip": rng.random() < 0.7,
        "public_ipaddr": f"203.0.113.{machine_id % 250 + 1}", "hostname": None, "webpage": None,
        "verified": rng.random() < 0.85, "verification": "verified", "vericode": 1,
        "rentable": rng.random() < 0.95, "rented": False, "external": rng.random() < 0.1,
        "datacenter": rng.random() < 0.4, "hosting_type": rng.choice((0, 0, 1)), "vms_enabled": False,
        "is_vm_deverified": False, "mobo_name": rng.choice(("ROMED8-2T", "WRX80", "X13DEG")),
        "os_version": rng.choice(("22.04", "24.04")), "logo": "/static/logos/vastai_small2.png",
        "resource_type": "gpu", "cluster_id": None, "avail_vol_ask_id": None, "avail_vol_dph": None,
        "avail_vol_size": None, "nw_disk_min_bw": None, "nw_disk_max_bw": None, "nw_disk_avg_bw": None,
        "time_remaining": "", "time_remaining_isbid": "", "discount_rate": 0.0, "discounted_hourly": 0.0,
    }


def priced(offer: dict[str, Any], storage_gb: float, bid: bool, rn: int = 0, now: float | None = None) -> dict[str, Any]:
    """A copy of `offer` with the price fields computed for `storage_gb` of disk (docs/vast-behaviours.md), and
    with `now`, its `duration` as Vast states it: the seconds from now to its end date (search_offers.yaml)."""
    out = dict(offer)
    if now is not None:
        out["duration"] = max(0.0, float(offer["end_date"]) - now)
    gpu_h = offer["min_bid"] if bid else offer["dph_base"]
    disk_h = storage_gb * offer["storage_cost"] / HOURS_PER_MONTH
    total = gpu_h + disk_h
    out.update(
        dph_total=total, dph_total_adj=total, discounted_dph_total=total, storage_total_cost=disk_h,
        vram_costperhour=total / max(1, offer["gpu_total_ram"]), is_bid=bid, rn=rn,
        dlperf_per_dphtotal=offer["dlperf"] / total, flops_per_dphtotal=offer["total_flops"] / total,
        score=offer["dlperf"] / total * offer["reliability2"],
        search={"gpuCostPerHour": gpu_h, "diskHour": disk_h, "totalHour": total,
                "discountTotalHour": 0, "discountedTotalPerHour": total},
        instance={"gpuCostPerHour": 0, "diskHour": disk_h, "totalHour": disk_h,
                  "discountTotalHour": 0, "discountedTotalPerHour": disk_h},
    )
    return out


def _as_float(value: Any, field: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise invalid_args(f"Error in query: {field} expects a number, got {value!r}") from None


def _normalise(field: str, value: Any) -> Any:
    """Map a query value onto the stored form (CLI conventions: RTX_4090, packed drivers)."""
    if isinstance(value, list):
        return [_normalise(field, v) for v in value]
    if field == "gpu_name" and isinstance(value, str):
        return value.replace("_", " ")
    if field == "driver_version" and value is not None:
        return pack_driver(value) if isinstance(value, str) else int(_as_float(value, field))
    return value


def _offer_value(offer: dict[str, Any], field: str, query: Any) -> Any:
    if field == "driver_version":
        return offer["driver_vers"]
    if field == "geolocation" and offer["geolocation"]:
        sample = query[0] if isinstance(query, list) and query else query
        if isinstance(sample, str) and len(sample) == 2:  # two-letter country code form
            return offer["geolocation"].rsplit(", ", 1)[-1]
    return offer.get(field)


def _coerce(have: Any, want: Any) -> Any:
    """The official CLI sends numbers from its query string as strings (`"num_gpus": {"eq": "1"}`, seen with
    vastai 1.9.1); the server compares them as numbers, so the simulator does too."""
    if isinstance(want, list):
        return [_coerce(have, w) for w in want]
    if isinstance(have, (int, float)) and not isinstance(have, bool) and isinstance(want, str):
        try:
            return float(want)
        except ValueError:
            return want
    return want


def compare(have: Any, op: str, want: Any) -> bool:
    want = _coerce(have, want)
    # bool(): the values are JSON scalars and lists, whose comparisons are bools already
    if op == "eq":
        return bool(have == want)
    if op == "neq":
        return bool(have != want)
    if op in ("in", "notin"):
        return (have in want) == (op == "in")
    if have is None or want is None:
        return False
    try:
        if op == "gt":
            return bool(have > want)
        if op == "gte":
            return bool(have >= want)
        if op == "lt":
            return bool(have < want)
        return bool(have <= want)
    except TypeError:
        return False


def parse_filters(body: dict[str, Any], known_fields: set[str]) -> list[tuple[str, str, Any]]:
    """The (field, op, value) triples of a search body, with the server defaults where absent."""
    merged = {**DEFAULT_FILTERS, **{k: v for k, v in body.items() if k not in NON_FILTER_KEYS}}
    triples = []
    for raw_field, condition in merged.items():
        field = ALIASES.get(raw_field, raw_field)
        if field not in known_fields:
            raise invalid_args(f"Error in query: {raw_field} is not a valid search key")
        if not isinstance(condition, dict):
            raise invalid_args(f"Error in query: {raw_field} needs an object like {{\"eq\": value}}")
        for op, value in condition.items():
            if op not in OPERATORS:
                raise invalid_args(f"Error in query: unknown operator {op!r} on {raw_field}")
            if op in ("in", "notin") and not isinstance(value, list):
                raise invalid_args(f"Error in query: {op} on {raw_field} needs a list")
            triples.append((field, op, _normalise(field, value)))
    return triples


def _parse_order(body: dict[str, Any], known_fields: set[str]) -> list[tuple[str, bool]]:
    order = body.get("order", [["score", "desc"]])
    if not isinstance(order, list):
        raise invalid_args("Error in query: order must be a list of [field, direction]")
    keys = []
    for item in order:
        if not (isinstance(item, list) and 1 <= len(item) <= 2 and isinstance(item[0], str)):
            raise invalid_args(f"Error in query: bad order entry {item!r}")
        field = ALIASES.get(item[0], item[0])
        if field not in known_fields:
            raise invalid_args(f"Error in query: cannot order by {item[0]}")
        keys.append((field, len(item) == 2 and str(item[1]).lower() == "desc"))
    return keys


def search(offers: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    """Filter, order and limit `offers` (the whole market, rented ones included) for a search body."""
    kind = str(body.get("type", "ondemand")).replace("-", "")
    if kind not in ("ondemand", "bid", "reserved", "interruptible"):
        raise invalid_args(f"Error in query: unknown type {body.get('type')!r}")
    storage_gb = _as_float(body.get("allocated_storage", DEFAULT_ALLOCATED_STORAGE_GB), "allocated_storage")
    limit = int(_as_float(body.get("limit", DEFAULT_LIMIT), "limit"))
    if not offers:
        return []
    known = set(priced(offers[0], storage_gb, False))
    triples = parse_filters(body, known)
    order = _parse_order(body, known)
    bid = kind in ("bid", "interruptible")
    matched = []
    now = time.time()
    for offer in offers:
        view = priced(offer, storage_gb, bid, now=now)
        if all(compare(_offer_value(view, f, v), op, v) for f, op, v in triples):
            matched.append(view)
    for field, descending in reversed(order):  # stable sorts, last key first; nulls always last
        present = [o for o in matched if o.get(field) is not None]
        missing = [o for o in matched if o.get(field) is None]
        present.sort(key=lambda o: o[field], reverse=descending)
        matched = present + missing
    result = matched[: max(0, limit)]
    for rank, offer in enumerate(result, start=1):
        offer["rn"] = rank
    return result
