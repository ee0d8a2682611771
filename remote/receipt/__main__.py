"""`python -m remote.receipt --out receipt.json [--budget-s 90] [--device cuda|cpu]`: measure what this host's
GPUs deliver and write the receipt (one JSON object). The whole run, torch's import included, stays inside
`--budget-s`: the sustained burn gets what the short measures leave (at most `--burn-s`). Exit 0 once the record
is written, whatever it says (the control plane judges it); 2 on bad usage; 1 when no record could be written.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the budget counts from here, torch's import included

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# nvidia-smi numbers GPUs in PCI bus order; make torch agree before CUDA starts (the UUIDs are matched anyway).
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

import torch  # noqa: E402

from remote.receipt import collective, measure, smi  # noqa: E402

SCHEMA = "vh-receipt"
VERSION = 1
DEFAULT_BUDGET_S = 90.0
DEFAULT_BURN_S = 45.0  # delivered.md's proposed gate: a sustained burn of ~45 s
MIN_BURN_S = 5.0
RESERVE_S = 6.0  # the JSON, the last ECC read, the joins: kept back from the burn


def left_s(budget_s: float) -> float:
    return budget_s - (time.perf_counter() - T0)


# The short measures' seconds at a full budget, per GPU; a smaller budget scales them down (never below a fifth),
# so the burn keeps at least MIN_BURN_S and the whole run its budget.
SHORT_S = {"matmul_shape": 1.5, "hbm_copy": 1.5, "host_copy": 2.5}
SHORT_OVERHEAD_S = 8.0  # nvidia-smi reads, the pinned buffer, thread start-up: measured ~5 s on a lent H100


class Phases:
    """Seconds spent in each phase, on the record: where a budget went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 3)


def short_scale(budget_s: float, n: int, shapes: int) -> float:
    """The factor on SHORT_S that leaves the burn MIN_BURN_S inside the budget (1.0 when all fits)."""
    full = shapes * SHORT_S["matmul_shape"] + SHORT_S["hbm_copy"] + n * 2 * SHORT_S["host_copy"]
    room = left_s(budget_s) - RESERVE_S - MIN_BURN_S - SHORT_OVERHEAD_S
    return max(0.2, min(1.0, room / full))


def gpu_identity(i: int) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(i)
    raw = getattr(p, "uuid", None)
    uuid = None if raw is None else str(raw) if str(raw).startswith("GPU-") else f"GPU-{raw}"
    return {"torch_index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 2),
            "compute_capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
            "uuid": uuid}


def smi_index_by_uuid() -> dict[str, int]:
    rows, _ = smi.query_gpu(("index", "uuid"))
    found = {str(r.get("uuid")): smi.as_int(r.get("index")) for r in rows if isinstance(r.get("uuid"), str)}
    return {uuid: index for uuid, index in found.items() if index is not None}


def link_under_load(samples: list[dict[str, Any]], smi_index: int | None) -> dict[str, Any]:
    mine = [s for s in samples if smi_index is not None and s.get("index") == float(smi_index)]
    gens = [s["pcie.link.gen.current"] for s in mine if isinstance(s.get("pcie.link.gen.current"), float)]
    widths = [s["pcie.link.width.current"] for s in mine if isinstance(s.get("pcie.link.width.current"), float)]
    return {"gen_under_load": int(max(gens)) if gens else None, "width_under_load": int(max(widths)) if widths else None,
            "samples": len(mine)}


def burn_clocks(samples: list[dict[str, Any]], smi_index: int | None) -> dict[str, Any]:
    """The SM clock, power, temperature and the share of samples in which each clock-event reason was active,
    for one GPU during the burn."""
    mine = [s for s in samples if smi_index is not None and s.get("index") == float(smi_index)]

    def nums(key: str) -> list[float]:
        return [s[key] for s in mine if isinstance(s.get(key), float)]

    clocks, power, temp, max_clock = nums("clocks.sm"), nums("power.draw"), nums("temperature.gpu"), nums("clocks.max.sm")
    reasons: dict[str, float] = {}
    with_reasons = [s for s in mine if "event_reasons" in s]
    for name in smi.EVENT_REASON_BITS:
        hits = sum(1 for s in with_reasons if name in str(s["event_reasons"]).split(","))
        if hits:
            reasons[name] = round(hits / len(with_reasons), 3)
    return {"samples": len(mine),
            "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
            "sm_clock_mhz_min": min(clocks) if clocks else None,
            "sm_clock_max_mhz": max(max_clock) if max_clock else None,
            "power_w_median": round(statistics.median(power), 1) if power else None,
            "temp_c_max": max(temp) if temp else None,
            "event_reasons_read": bool(with_reasons),
            "event_reasons_share": reasons}


def memory_health() -> dict[str, Any]:
    """ECC counters (per index) and remapped rows (per UUID), as the driver reports them; what it refuses is
    named, not guessed."""
    ecc, refused = smi.query_each(smi.ECC_FIELDS)
    remap, remap_why = smi.remapped_rows()
    return {"ecc": {str(smi.as_int(r.get("index"))): r for r in ecc},
            "ecc_refused": refused, "remap": {str(r.get("gpu_uuid")): r for r in remap}, "remap_error": remap_why}


def run_cuda(budget_s: float, burn_cap_s: float, notes: list[str], phases: Phases) -> dict[str, Any]:
    n = phases.timed("cuda_init", torch.cuda.device_count)
    if n == 0:
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    devices = [torch.device("cuda", i) for i in range(n)]
    gpus = phases.timed("cuda_init", lambda: [gpu_identity(i) for i in range(n)])
    by_uuid = phases.timed("smi_reads", smi_index_by_uuid)
    for g in gpus:
        g["smi_index"] = by_uuid.get(str(g["uuid"]))
    if any(g["smi_index"] is None for g in gpus) and len(by_uuid) == n and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # Same count, no subset: both sides number in PCI bus order (CUDA_DEVICE_ORDER above).
        notes.append("torch gave no UUIDs nvidia-smi knows: GPUs matched by PCI bus order")
        for g in gpus:
            g["smi_index"] = g["torch_index"]
    for g in gpus:
        if g["smi_index"] is None and smi.available():
            notes.append(f"GPU {g['torch_index']}: its UUID is not among nvidia-smi's; clocks and link not matched")
    link_max, link_refused = phases.timed("smi_reads", lambda: smi.query_each(smi.LINK_MAX_FIELDS))
    link_max_by_index = {r.get("index"): r for r in link_max}
    health_before = phases.timed("smi_reads", memory_health)
    reason_name = phases.timed("smi_reads", smi.reason_field)
    if reason_name is None and smi.available():
        notes.append("this driver reports no clock-event reasons (neither clocks_event_reasons nor "
                     "clocks_throttle_reasons): throttling is judged by the burn's rate alone")

    scale = short_scale(budget_s, n, len(measure.CUDA_SHAPES))
    if scale < 1.0:
        notes.append(f"a {budget_s:g} s budget: the short measures ran {scale:.2f}x their usual length")

    # Short measures: each GPU at once (independent resources), in threads.
    def short(dev: torch.device) -> dict[str, Any]:
        torch.cuda.set_device(dev)
        shapes = []
        for m, nn, k in measure.CUDA_SHAPES:
            t = measure.matmul(dev, (m, nn, k), seconds=SHORT_S["matmul_shape"] * scale)
            shapes.append({"m": m, "n": nn, "k": k, **t.as_dict()})
        medians = [s["median"] for s in shapes if s.get("median") is not None]
        return {"matmul": {"shapes": shapes, "tflops": max(medians) if medians else None},
                "hbm_copy": measure.device_copy(dev, seconds=SHORT_S["hbm_copy"] * scale).as_dict()}

    def all_short() -> None:
        with ThreadPoolExecutor(max_workers=n) as pool:
            for g, res in zip(gpus, pool.map(short, devices), strict=True):
                g.update(res)

    phases.timed("matmul_and_hbm", all_short)

    # Host <-> device: one GPU at a time (they may share a PCIe switch), the link read while the copies run.
    host = phases.timed("pinned_alloc", measure.pinned_buffer)
    copy_s = SHORT_S["host_copy"] * scale

    def copies(dev: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
        return (measure.host_copy(dev, "h2d", seconds=copy_s, host=host).as_dict(),
                measure.host_copy(dev, "d2h", seconds=copy_s, host=host).as_dict())

    for g, dev in zip(gpus, devices, strict=True):
        with smi.Sampler(interval_s=0.4) as sampler:
            g["h2d"], g["d2h"] = phases.timed("host_copies", lambda: copies(dev))  # noqa: B023 (called at once)
        row = link_max_by_index.get(float(g["smi_index"])) if g["smi_index"] is not None else None
        g["pcie_link"] = {"gen_max": smi.as_int(row.get("pcie.link.gen.max")) if row else None,
                          "width_max": smi.as_int(row.get("pcie.link.width.max")) if row else None,
                          **link_under_load(sampler.samples, g["smi_index"]), "sampler_error": sampler.error,
                          "refused": link_refused}

    result: dict[str, Any] = {"gpus": gpus, "p2p": None, "allreduce": None}
    if n > 1:
        result["p2p"] = phases.timed("p2p", lambda: collective.p2p(list(range(n))))
        result["allreduce"] = phases.timed("allreduce", lambda: collective.allreduce(n, backend="nccl"))

    # The burn: every GPU at once, for what the budget leaves.
    burn_s = min(burn_cap_s, left_s(budget_s) - RESERVE_S)
    if burn_s < MIN_BURN_S:
        notes.append(f"the burn got {max(burn_s, 0):.1f} s of the {budget_s:g} s budget, under {MIN_BURN_S:g} s: "
                     "not run")
        for g in gpus:
            g["burn"] = {"error": "budget spent before the burn"}
    else:
        def all_burn() -> list[measure.BurnResult]:
            with ThreadPoolExecutor(max_workers=n) as pool:
                return list(pool.map(lambda d: measure.burn(d, seconds=burn_s), devices))

        with smi.Sampler(interval_s=0.5, reason_name=reason_name) as sampler:
            burns = phases.timed("burn", all_burn)
        for g, b in zip(gpus, burns, strict=True):
            g["burn"] = {**b.summary(), **burn_clocks(sampler.samples, g["smi_index"]), "sampler_error": sampler.error}
    health_after = phases.timed("smi_reads", memory_health)
    for g in gpus:
        idx = str(g["smi_index"])
        g["ecc_before"] = health_before["ecc"].get(idx)
        g["ecc_after"] = health_after["ecc"].get(idx)
        g["remap"] = health_after["remap"].get(str(g["uuid"]))
    result["ecc_refused"] = health_after["ecc_refused"]
    result["remap_error"] = health_after["remap_error"]
    drivers, _ = phases.timed("smi_reads", lambda: smi.query_gpu(("driver_version",)))
    result["driver"] = drivers[0]["driver_version"] if drivers else None
    return result


def run_cpu(budget_s: float, burn_cap_s: float, world: int, notes: list[str], phases: Phases) -> dict[str, Any]:
    """The same record from the CPU: what the tests and a GPU-less host exercise. No link, clocks or ECC. One
    thread: on a shared machine a thread pool's spin-waits stall whole windows, and the record is a stand-in."""
    dev = torch.device("cpu")
    torch.set_num_threads(1)
    notes.append("cpu: one thread (torch.set_num_threads(1))")
    shapes = []
    for m, n, k in measure.CPU_SHAPES:
        t = measure.matmul(dev, (m, n, k), seconds=0.3)
        shapes.append({"m": m, "n": n, "k": k, **t.as_dict()})
    medians = [s["median"] for s in shapes if s.get("median") is not None]
    gpu: dict[str, Any] = {"torch_index": 0, "name": f"cpu ({platform.processor() or platform.machine()})",
                           "uuid": None, "smi_index": None,
                           "matmul": {"shapes": shapes, "tflops": max(medians) if medians else None},
                           "hbm_copy": measure.device_copy(dev, seconds=0.3).as_dict(),
                           "h2d": measure.host_copy(dev, "h2d", seconds=0).as_dict(),
                           "d2h": measure.host_copy(dev, "d2h", seconds=0).as_dict()}
    result: dict[str, Any] = {"gpus": [gpu], "p2p": None, "allreduce": None, "driver": None}
    if world > 1:  # before the burn, which takes what is left (as on the GPUs)
        result["allreduce"] = phases.timed("allreduce", lambda: collective.allreduce(world, backend="gloo",
                                                                                    nbytes=4 << 20))
    burn_s = min(burn_cap_s, max(0.0, left_s(budget_s) - RESERVE_S))
    gpu["burn"] = measure.burn(dev, seconds=burn_s).summary() if burn_s > 0 else {"error": "budget spent"}
    notes.append("measured on the CPU: no PCIe link, clocks or ECC")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m remote.receipt", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    ap.add_argument("--burn-s", type=float, default=DEFAULT_BURN_S, help="the sustained burn, at most")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--cpu-world", type=int, default=1, help="CPU only: gloo ranks for the all-reduce")
    args = ap.parse_args(argv)
    if not (args.budget_s > 0 and args.burn_s >= 0 and args.cpu_world >= 1):
        ap.error("--budget-s must be > 0, --burn-s >= 0, --cpu-world >= 1")
    notes: list[str] = []
    phases = Phases()
    phases.seconds["import"] = round(time.perf_counter() - T0, 3)
    started = time.time()
    try:
        if args.device == "cuda":
            body = run_cuda(args.budget_s, args.burn_s, notes, phases)
        else:
            body = run_cpu(args.budget_s, args.burn_s, args.cpu_world, notes, phases)
    except Exception as exc:  # a receipt that broke is still a record: the control plane refuses the host on it
        body = {"gpus": [], "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    record = {"schema": SCHEMA, "version": VERSION, "device": args.device, "budget_s": args.budget_s,
              "started_unix": round(started, 3), "wall_s": round(time.perf_counter() - T0, 3),
              "torch": torch.__version__, "cuda_runtime": torch.version.cuda, "hostname": platform.node(),
              **body, "phase_s": phases.seconds, "notes": notes}
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        print(f"error: could not write {args.out}: {exc}", file=sys.stderr)
        return 1
    if record.get("error"):
        print(f"receipt: broke: {record['error']}", file=sys.stderr)
    for g in record["gpus"]:
        burn = g.get("burn") or {}
        print(f"receipt: GPU {g['torch_index']} {g['name']}: matmul {g['matmul']['tflops']} TFLOP/s, "
              f"copy {g['hbm_copy'].get('median')} GB/s, h2d {g['h2d'].get('median')} GB/s, "
              f"d2h {g['d2h'].get('median')} GB/s, burn median {burn.get('tflops_median')} TFLOP/s")
    print(f"receipt: {args.out} written in {record['wall_s']:.1f} s (budget {args.budget_s:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
