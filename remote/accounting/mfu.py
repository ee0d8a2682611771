"""MFU accounting: dense bf16 peaks (FP32 accumulate, no sparsity) by GPU name, each with a source.

An unknown GPU is refused, never guessed (nanoGPT's hard-coded A100 gave "104% MFU on H100").
Patterns are matched in order against the lower-cased `torch.cuda.get_device_name()`; more specific
names come first (an "H100 PCIe" must not match the SXM row). The table is data, `remote/peaks.json`,
so that the control plane can read it without importing `remote/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from remote.host.paths import REMOTE_DIR

PEAKS_FILE = REMOTE_DIR / "peaks.json"  # the one sourced table; the control plane reads it as data


@dataclass(frozen=True)
class Peak:
    tflops: float
    source: str
    matched: str


def _load_table(path: Path = PEAKS_FILE) -> list[tuple[tuple[str, ...], float, str]]:
    """(lower-case substrings that must all appear, TFLOP/s, source); 0 = known but unsourced: refuse."""
    rows = json.loads(path.read_text())["peaks"]
    return [(tuple(r["match_all"]), float(r["tflops"]), str(r["source"])) for r in rows]


PEAK_TABLE: list[tuple[tuple[str, ...], float, str]] = _load_table()


class UnknownGpu(ValueError):
    """No sourced peak for this device name."""


def peak_for(device_name: str, override_tflops: float | None = None) -> Peak:
    if override_tflops is not None:
        if override_tflops <= 0:
            raise ValueError(f"--peak-tflops must be positive, got {override_tflops}")
        return Peak(override_tflops, "--peak-tflops (given on the command line)", device_name)
    name = device_name.lower()
    for needles, tflops, source in PEAK_TABLE:
        if all(n in name for n in needles):
            if tflops <= 0:
                break
            return Peak(tflops, source, " ".join(needles))
    raise UnknownGpu(f"no sourced bf16 dense peak for device {device_name!r}; pass --peak-tflops N "
                     f"(known: H100/H200 SXM, H100 PCIe/NVL, A100, RTX 5090, RTX 4090, B200)")


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_tflops: float) -> float:
    return tokens_per_s_per_gpu * flops_per_token / (peak_tflops * 1e12)
