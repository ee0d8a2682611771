"""MFU accounting: dense bf16 peaks (FP32 accumulate, no sparsity) by GPU name, each with a source.

An unknown GPU is refused, never guessed (nanoGPT's hard-coded A100 gave "104% MFU on H100").
Patterns are matched in order against the lower-cased `torch.cuda.get_device_name()`; more specific
names come first (an "H100 PCIe" must not match the SXM row).
"""

from __future__ import annotations

from dataclasses import dataclass

TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/main/torchtitan/tools/utils.py (get_peak_flops)"
H100_DS = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
H200_DS = "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
A100_DS = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
BLACKWELL_WP = "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf"
ADA_WP = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
B200_DS = "https://resources.nvidia.com/en-us-blackwell-architecture"


@dataclass(frozen=True)
class Peak:
    tflops: float
    source: str
    matched: str


# (lower-case substrings that must all appear, TFLOP/s, source); 0 = known but unsourced: refuse
PEAK_TABLE: list[tuple[tuple[str, ...], float, str]] = [
    (("h200", "nvl"), 0.0, "H200 NVL dense bf16 peak unconfirmed (docs/mfu.md): pass --peak-tflops"),
    (("h200",), 989.0, f"{H200_DS}; {TORCHTITAN}"),
    (("h100", "pcie"), 756.0, f"{H100_DS}; {TORCHTITAN}"),
    (("h100", "nvl"), 835.0, f"{H100_DS}; {TORCHTITAN}"),
    (("h100",), 989.0, f"{H100_DS} (SXM); {TORCHTITAN}"),
    (("a100",), 312.0, f"{A100_DS}; {TORCHTITAN}"),
    (("rtx 5090",), 209.5, f"{BLACKWELL_WP} (bf16, FP32 accumulate; 419 is FP16 accumulate)"),
    (("rtx 4090",), 165.2, f"{ADA_WP} (bf16, FP32 accumulate)"),
    (("b200",), 2250.0, f"{B200_DS} (dense; 4.5 PF is the sparse figure)"),
]


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
