"""Validate a receipt (written by `python -m remote.receipt`): its shape and what it claims to have measured.

A receipt is evidence of what a host delivered, so the checks are about the measurement, not the verdict (the
control plane compares the figures with the offer and the reference table): every GPU has a positive, finite
matmul rate, HBM copy, host<->device copies with the link read under load, a burn of enough windows with the
clocks sampled, and the ECC read before and after; with several GPUs, an all-reduce whose sum was right; and
the whole run stayed within its budget. Standard library only: it also runs on the GPU host.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

SCHEMA, VERSION = "vh-receipt", 1
MIN_BURN_WINDOWS = 10
BUDGET_SLACK = 1.05  # the budget is kept by construction; 5% covers the interpreter's exit and the JSON write


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def gpu_errors(i: int, g: Any, *, cuda: bool) -> list[str]:
    who = f"gpus[{i}]"
    if not isinstance(g, dict):
        return [f"{who}: not an object"]
    errors: list[str] = []
    matmul = g.get("matmul") or {}
    if not _positive(matmul.get("tflops")):
        errors.append(f"{who}: no positive matmul TFLOP/s ({matmul.get('tflops')!r})")
    for key in ("hbm_copy", *(("h2d", "d2h") if cuda else ())):
        m = g.get(key) or {}
        if not _positive(m.get("median")):
            errors.append(f"{who}: {key}: no positive median GB/s ({m.get('error') or m.get('median')!r})")
    burn = g.get("burn") or {}
    if not isinstance(burn.get("windows"), int) or burn["windows"] < MIN_BURN_WINDOWS:
        errors.append(f"{who}: burn: {burn.get('windows')!r} timed windows, fewer than {MIN_BURN_WINDOWS} "
                      f"({burn.get('error') or 'too short'})")
    elif not _positive(burn.get("tflops_median")):
        errors.append(f"{who}: burn: no positive median TFLOP/s")
    if cuda:
        if not (isinstance(burn.get("samples"), int) and burn["samples"] > 0):
            errors.append(f"{who}: burn: the clocks were never sampled ({burn.get('sampler_error')!r})")
        elif not _positive(burn.get("sm_clock_mhz_median")):
            errors.append(f"{who}: burn: no SM clock read during the burn")
        link = g.get("pcie_link") or {}
        if not (_positive(link.get("gen_under_load")) and _positive(link.get("width_under_load"))):
            errors.append(f"{who}: pcie_link: generation and width not read under load "
                          f"({link.get('sampler_error') or link.get('samples')!r} samples)")
        if not isinstance(g.get("ecc_before"), dict) or not isinstance(g.get("ecc_after"), dict):
            errors.append(f"{who}: the ECC counters were not read before and after the burn")
    return errors


def check_record(rec: Any) -> list[str]:
    if not isinstance(rec, dict):
        return ["not a JSON object"]
    if rec.get("schema") != SCHEMA or rec.get("version") != VERSION:
        return [f"schema {rec.get('schema')!r} version {rec.get('version')!r}, expected {SCHEMA!r} {VERSION}"]
    errors: list[str] = []
    cuda = rec.get("device") == "cuda"
    gpus = rec.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return ["gpus: none measured"]
    for i, g in enumerate(gpus):
        errors += gpu_errors(i, g, cuda=cuda)
    if not (_positive(rec.get("budget_s")) and _positive(rec.get("wall_s"))):
        errors.append("budget_s / wall_s missing")
    elif rec["wall_s"] > rec["budget_s"] * BUDGET_SLACK:
        errors.append(f"wall_s {rec['wall_s']} over the budget {rec['budget_s']} (x{BUDGET_SLACK})")
    if cuda and len(gpus) > 1:
        ar = rec.get("allreduce") or {}
        if not (_positive(ar.get("busbw_gbps")) and ar.get("correct") is True):
            errors.append(f"allreduce: no correct all-reduce across {len(gpus)} GPUs ({ar.get('error')!r})")
        if not isinstance(rec.get("p2p"), list) or len(rec["p2p"]) != len(gpus) * (len(gpus) - 1):
            errors.append("p2p: not every ordered pair of GPUs measured")
    return errors


def check(path: Path) -> list[str]:
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return [f"unreadable: {exc}"]
    return check_record(rec)


if __name__ == "__main__":
    failed = 0
    for arg in sys.argv[1:]:
        problems = check(Path(arg))
        failed |= bool(problems)
        print(f"{'ok  ' if not problems else 'FAIL'} {arg}", *(f"\n     - {p}" for p in problems))
    sys.exit(1 if failed else 0)
