"""A simulated host's receipt: the `vh-receipt` on its PATH answers as `python -m remote.receipt` would, from the
instance's offer, the receipt's reference table and its faults, with seeded ±3% noise (sim/gpus.py installs it
before the harness's own launcher on PATH, as it installs `nvidia-smi`).

A healthy host reports what the reference table says this receipt's method reaches on its GPU (an unreferenced
GPU: the offer's own figures), its PCIe copies at the offer's `pcie_bw`, its link as the offer's `pci_gen` and
`gpu_lanes`. The faults make it lie, each on the next COUNT instances (sim/faults.py):

    pcie_slow:FACTOR   host<->device copies at FACTOR of the offer's pcie_bw
    gpu_slow:FACTOR    matmul and the sustained burn at FACTOR
    hbm_slow:FACTOR    the HBM copy at FACTOR
    throttle:SECONDS   SECONDS into the burn the clocks drop (its windows at THROTTLED_SHARE, a HW thermal
                       slowdown active in those samples); a burn shorter than SECONDS shows nothing
    ecc_error          an uncorrectable ECC error appears during the burn (a GPU that reports ECC only)

An image whose name names no torch ("pytorch/pytorch" does) has none on the simulated host: its `vh-receipt`
then says so and exits 3, as the harness's launcher does on such an image ("not measured").

Run as a script (`python host_receipt.py CONFIG --out FILE --budget-s S`), standard library only: the simulator's
host imports nothing. It answers at once (the burn's seconds are the simulated timeline, not slept) and leaves a
copy of its answer where the simulator reads it (`/_sim/state` `receipt`), for judges.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

NOISE = 0.03  # ±3%: the spread of a healthy host, drawn per figure from the instance's seed
THROTTLED_SHARE = 0.55  # a throttled GPU's burn windows, of its healthy rate
BURN_WINDOW_S = 0.5  # remote/receipt/measure.py BURN_WINDOW_S
FULL_BURN_S = 45.0  # remote/receipt/__main__.py DEFAULT_BURN_S
DATACENTER_SM_MHZ, MAX_SM_MHZ = 1400.0, 1980.0


def _noisy(rng: random.Random, value: float) -> float:
    return round(value * (1.0 + rng.uniform(-NOISE, NOISE)), 3)


def _timed(rng: random.Random, value: float, iterations: int = 200) -> dict[str, Any]:
    median = _noisy(rng, value)
    return {"median": median, "best": round(median * 1.02, 3), "worst": round(median * 0.95, 3),
            "iterations": iterations, "seconds": 1.5, "error": None}


def _gpu(i: int, cfg: dict[str, Any], rng: random.Random, burn_s: float) -> dict[str, Any]:
    g, offer, ref, faults = cfg["gpus"][i], cfg["offer"], cfg["reference"], cfg["faults"]
    n = max(1, len(cfg["gpus"]))
    gpu_factor, hbm_factor = float(faults.get("gpu_slow", 1.0)), float(faults.get("hbm_slow", 1.0))
    pcie_factor = float(faults.get("pcie_slow", 1.0))
    matmul = (ref.get("matmul") or float(offer.get("total_flops") or 100.0) / n) * gpu_factor
    burn_rate = (ref.get("burn") or matmul / gpu_factor * 0.99) * gpu_factor
    hbm = (ref.get("hbm_copy") or float(offer.get("gpu_mem_bw") or 1000.0) * 0.9) * hbm_factor
    pcie = float(offer.get("pcie_bw") or 10.0) * pcie_factor
    shapes = [{"m": m, "n": nn, "k": k, **_timed(rng, matmul * share)}
              for (m, nn, k), share in (((8192, 8192, 8192), 1.0), ((16384, 16384, 2048), 0.96),
                                         ((16384, 2048, 8192), 0.98))]
    throttle_at = faults.get("throttle")
    windows, times, reasons_after = [], [], None
    for w in range(max(10, int(burn_s / BURN_WINDOW_S))):
        t = round(w * BURN_WINDOW_S, 3)
        throttled = throttle_at is not None and t >= float(throttle_at)
        windows.append(_noisy(rng, burn_rate * (THROTTLED_SHARE if throttled else 1.0)))
        times.append(t)
        if throttled and reasons_after is None:
            reasons_after = w
    half = len(windows) // 2
    datacenter = bool(cfg.get("ecc"))
    throttled_share = 0.0 if reasons_after is None else round((len(windows) - reasons_after) / len(windows), 3)
    reasons = {"sw_power_cap": 0.98} if datacenter else {}
    if throttled_share:
        reasons["hw_thermal_slowdown"] = throttled_share
    ordered = sorted(windows)
    burn = {"seconds": round(len(windows) * BURN_WINDOW_S, 3), "windows": len(windows),
            "tflops_median": ordered[len(ordered) // 2], "tflops_min": ordered[0],
            "tflops_first_half": sorted(windows[:half])[half // 2], "tflops_second_half": sorted(windows[half:])[
                (len(windows) - half) // 2], "windows_tflops": windows, "windows_t_s": times, "error": None,
            "samples": len(windows), "sm_clock_mhz_median": DATACENTER_SM_MHZ * (THROTTLED_SHARE if throttled_share
                                                                                  > 0.5 else 1.0),
            "sm_clock_mhz_min": DATACENTER_SM_MHZ * (THROTTLED_SHARE if throttled_share else 0.95),
            "sm_clock_max_mhz": MAX_SM_MHZ, "power_w_median": 690.0 if datacenter else 440.0, "temp_c_max": 63.0,
            "event_reasons_read": True, "event_reasons_share": reasons, "sampler_error": None}
    gen, width = int(float(offer.get("pci_gen") or 4)), int(offer.get("gpu_lanes") or 16)
    errors = 1.0 if faults.get("ecc_error") else 0.0
    ecc = ({"index": float(i), "ecc.mode.current": "Enabled", "ecc.errors.uncorrected.volatile.total": 0.0,
            "ecc.errors.uncorrected.aggregate.total": 0.0, "ecc.errors.corrected.volatile.total": 0.0,
            "retired_pages.pending": None} if datacenter else
           {"index": float(i), "ecc.mode.current": None, "ecc.errors.uncorrected.volatile.total": None,
            "ecc.errors.uncorrected.aggregate.total": None, "ecc.errors.corrected.volatile.total": None,
            "retired_pages.pending": None})
    after = dict(ecc)
    if datacenter:
        after["ecc.errors.uncorrected.volatile.total"] = errors
        after["ecc.errors.uncorrected.aggregate.total"] = errors
    uuid = f"GPU-{g['uuid']}"
    return {"torch_index": i, "name": g["name"], "memory_gib": round(g["memory_mib"] / 1024, 2),
            "compute_capability": g["compute_cap"], "multiprocessors": 132, "uuid": uuid, "smi_index": i,
            "matmul": {"shapes": shapes, "tflops": max(s["median"] for s in shapes)},
            "hbm_copy": _timed(rng, hbm), "h2d": _timed(rng, pcie, 400), "d2h": _timed(rng, pcie * 0.995, 400),
            "pcie_link": {"gen_max": gen, "width_max": width, "gen_under_load": gen, "width_under_load": width,
                          "samples": 13, "sampler_error": None, "refused": {}},
            "burn": burn, "ecc_before": ecc, "ecc_after": after,
            "remap": ({"gpu_uuid": uuid, "remapped_rows.correctable": 0.0, "remapped_rows.uncorrectable": 0.0,
                       "remapped_rows.pending": "No", "remapped_rows.failure": "No"} if datacenter else None)}


def answer(cfg: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """The receipt this host gives (remote/receipt's schema, version 1)."""
    started = time.time()
    rng = random.Random(cfg["seed"])
    burn_s = FULL_BURN_S if budget_s >= 60 else max(5.0, budget_s / 2)
    gpus = [_gpu(i, cfg, rng, burn_s) for i in range(len(cfg["gpus"]))]
    n, offer = len(gpus), cfg["offer"]
    p2p = allreduce = None
    if n > 1:
        link = float(offer.get("bw_nvlink") or 0.0) * 0.88 or float(offer.get("pcie_bw") or 10.0) * 0.8
        p2p = [{"src": a, "dst": b, "peer_access": True, "gbps": _noisy(rng, link)}
               for a in range(n) for b in range(n) if a != b]
        allreduce = {"world": n, "backend": "nccl", "bytes": 1 << 30, "busbw_gbps": _noisy(rng, link * 0.9),
                     "median_s": 0.01, "correct": True, "seconds": 2.0}
    return {"schema": "vh-receipt", "version": 1, "device": "cuda", "budget_s": budget_s,
            "started_unix": round(started, 3), "wall_s": round(time.time() - started + 0.05, 3),
            "torch": "simulated", "cuda_runtime": str(cfg.get("cuda") or ""), "hostname": "sim-host",
            "gpus": gpus, "p2p": p2p, "allreduce": allreduce, "ecc_refused": {}, "remap_error": None,
            "driver": cfg.get("driver"), "phase_s": {"burn": burn_s},
            "notes": ["simulated: answered from the offer and the simulator's faults (vast_harness/sim/host_receipt.py)"]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="vh-receipt (simulated)")
    ap.add_argument("config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--burn-s", type=float, default=FULL_BURN_S)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    cfg = json.loads(args.config.read_text())
    if not cfg.get("torch", True):  # as the harness's own launcher says it in an image without torch
        print("vh-receipt: no torch in this image (simulated: the image's name names no torch)", file=sys.stderr)
        return 3
    record = answer(cfg, args.budget_s)
    text = json.dumps(record, indent=1) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if cfg.get("report"):  # the simulator's own copy (outside the sandbox, which a destroy removes)
        try:
            Path(cfg["report"]).write_text(text)
        except OSError:
            pass
    for g in record["gpus"]:
        print(f"receipt: GPU {g['torch_index']} {g['name']}: matmul {g['matmul']['tflops']} TFLOP/s, copy "
              f"{g['hbm_copy']['median']} GB/s, h2d {g['h2d']['median']} GB/s, burn median "
              f"{g['burn']['tflops_median']} TFLOP/s (simulated)")
    print(f"receipt: {args.out} written in {record['wall_s']:.1f} s (budget {args.budget_s:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
