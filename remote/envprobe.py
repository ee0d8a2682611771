"""Host environment probe: GPUs (names, UUIDs, memory), driver, package versions, relevant env.

`python -m remote.envprobe [--out FILE]` prints (or writes) one JSON object. It is the first step on a rented
host, so it uses the standard library and `nvidia-smi` only: it must report even when PyTorch is broken,
and it must be cheap (importing torch and creating a CUDA context cost ~4 s on an H200, measured in
.evidence/h200/proofs-2026-11-29). The torch-level facts (cuDNN, NCCL, the process's own device) are
recorded by the workload's evidence through `versions()` and `device_identity()`, which import torch lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
                "CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "VH_MPS_MODE")


_DRIVER_RE = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s")


def parse_proc_driver_version(text: str) -> str | None:
    found = _DRIVER_RE.search(text)
    return found.group(1) if found else None


def driver_version() -> str | None:
    """The kernel driver's version: /proc first (no process spawn), nvidia-smi second."""
    try:
        found = parse_proc_driver_version(Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found
    except OSError:
        pass
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            check=False, capture_output=True, text=True, timeout=20,
        )
    except subprocess.TimeoutExpired:
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None



def device_identity(device: torch.device) -> dict:
    """This process's device: name and UUID ("GPU-..." as nvidia-smi prints it)."""
    import torch

    if device.type != "cuda":
        return {"name": "cpu", "uuid": None, "index": None}
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return {"name": props.name, "uuid": f"GPU-{uuid}" if uuid is not None else None, "index": device.index,
            "total_mem_gib": round(props.total_memory / 2**30, 2), "sm_count": props.multi_processor_count}


def versions() -> dict:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "nccl": nccl, "driver": driver_version() if torch.cuda.is_available() else None,
            "python": platform.python_version()}


_SMI_FIELDS = ("index", "name", "uuid", "memory.total", "driver_version", "pci.bus_id", "pcie.link.gen.max",
               "pcie.link.width.max")
_PACKAGES = ("torch", "triton", "numpy", "pytest")


def smi_gpus() -> tuple[list[dict], str | None]:
    """Every GPU as nvidia-smi sees it (no CUDA context is created), or the reason there is none."""
    if not shutil.which("nvidia-smi"):
        return [], "nvidia-smi not found"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    rows = [dict(zip(_SMI_FIELDS, (c.strip() for c in line.split(",")), strict=False))
            for line in out.splitlines() if line.strip()]
    return rows, None


def package_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def probe() -> dict:
    gpus, why = smi_gpus()
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "packages": package_versions(),
            "driver": gpus[0]["driver_version"] if gpus else driver_version(), "gpus": gpus, "gpu_probe_error": why,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write here instead of stdout")
    args = ap.parse_args(argv)
    text = json.dumps(probe(), indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
