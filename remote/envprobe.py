"""Host environment probe: GPUs (names, UUIDs, memory), driver, CUDA, cuDNN, NCCL, torch, relevant env.

`python -m remote.envprobe [--out FILE]` prints (or writes) one JSON object. Standard library + torch only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

import torch

ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
                "CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "VH_MPS_MODE")


def driver_version() -> str | None:
    """From nvidia-smi, else /proc (torch does not expose the driver version)."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            if out.strip():
                return out.strip().splitlines()[0].strip()
        except (subprocess.SubprocessError, OSError):
            pass
    try:
        with open("/proc/driver/nvidia/version") as fh:
            for word in fh.read().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    return None


def device_identity(device: torch.device) -> dict:
    """This process's device: name and UUID ("GPU-..." as nvidia-smi prints it)."""
    if device.type != "cuda":
        return {"name": "cpu", "uuid": None, "index": None}
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return {"name": props.name, "uuid": f"GPU-{uuid}" if uuid is not None else None, "index": device.index,
            "total_mem_gib": round(props.total_memory / 2**30, 2), "sm_count": props.multi_processor_count}


def versions() -> dict:
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


def probe() -> dict:
    gpus = [device_identity(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "versions": versions(), "gpus": gpus,
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
