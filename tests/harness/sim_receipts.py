"""Simulated hosts' receipts for the tests: an offer drawn like the simulator's market draws one, and the receipt
its `vh-receipt` (vast_harness/sim/host_receipt.py) answers for it, with faults."""

from __future__ import annotations

import random
from typing import Any

from vast_harness.sim.gpus import host_gpus, receipt_references
from vast_harness.sim.host_receipt import answer
from vast_harness.sim.market import CATALOG


def sim_offer(rng: random.Random, name: str) -> dict[str, Any]:
    gpu = next(g for g in CATALOG if g.name == name)
    num = rng.choice((1, 2, 4, 8))
    lanes = rng.choice((16, 8, 4))
    return {"gpu_name": name, "num_gpus": num, "gpu_ram": gpu.ram_mb, "compute_cap": gpu.compute_cap,
            "machine_id": rng.randint(1, 99_999), "pcie_bw": round(gpu.pcie_bw_gbs * lanes / 16 * rng.uniform(0.35, 1),
                                                                    1),
            "pci_gen": gpu.pci_gen if lanes > 4 else gpu.pci_gen - 1.0, "gpu_lanes": lanes,
            "gpu_mem_bw": gpu.mem_bw_gbs, "total_flops": round(gpu.tflops * num, 2),
            "bw_nvlink": gpu.nvlink_gbs if num > 1 else 0.0, "driver_version": "570.133.07", "cuda_max_good": 12.8}


def sim_receipt(offer: dict[str, Any], seed: int, faults: dict[str, float] | None = None) -> dict[str, Any]:
    reference, ecc = receipt_references(offer["gpu_name"])
    cfg = {"gpus": host_gpus(offer, lie=False), "offer": offer, "reference": reference, "ecc": ecc,
           "faults": faults or {}, "seed": seed, "driver": offer["driver_version"], "cuda": 12.8}
    return answer(cfg, 90.0)
