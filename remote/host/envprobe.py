"""Host environment probe: GPUs (names, UUIDs, memory), driver, package versions, relevant env, and the
image check.

`python -m remote.host.envprobe [--out FILE] [--expect-torch V --expect-cuda V --expect-cudnn V]` prints (or
writes) one JSON object. It is the first step on a rented host, so it uses the standard library and
`nvidia-smi` only: it must report even when PyTorch is broken, and it must be cheap (importing torch and
creating a CUDA context cost ~4 s on an H200, measured in .evidence/h200/proofs-2026-11-29). So the image's
torch, CUDA runtime and cuDNN are read from the installed files, not from an imported torch: the torch
distribution's version, `torch/version.py` (what `torch.version.cuda` returns), and the cuDNN that torch
loads (the nvidia-cudnn wheel's metadata, else a cudnn_version.h, else a libcudnn.so.N name). With
`--expect-*`, a mismatch writes the record and exits 3 naming both values, before any workload minute.
The torch-level facts (NCCL, the process's own device) are recorded by the workload's evidence through
`versions()` and `device_identity()`, which import torch lazily.

Values of the run's `--remote-secret` variables (named by the harness in VH_MASKED_ENV) are recorded as "***":
evidence keeps their names, never their values.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from remote import knobs

# and the MPS knobs (remote.knobs); VAST_SIM_HOST is what a simulated host says it offers (its Python, network)
ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
                "CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "VAST_SIM_HOST")
MASK = "***"
IMAGE_MISMATCH_EXIT = 3


def masked_names(environ: dict[str, str] | None = None) -> set[str]:
    """The run's secret variables' names (the harness lists them in the environment, `remote.knobs`)."""
    host = knobs.host() if environ is None else knobs.HostKnobs.from_env(environ)
    return set(host.masked_env)


def mask_env(env: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """`env` with the value of every masked name replaced by "***" (the names stay)."""
    hidden = masked_names(environ)
    return {k: MASK if k in hidden else v for k, v in env.items()}


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



def device_identity(device: torch.device) -> dict[str, Any]:
    """This process's device: name and UUID ("GPU-..." as nvidia-smi prints it)."""
    import torch

    if device.type != "cuda":
        return {"name": "cpu", "uuid": None, "index": None}
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return {"name": props.name, "uuid": f"GPU-{uuid}" if uuid is not None else None, "index": device.index,
            "total_mem_gib": round(props.total_memory / 2**30, 2), "sm_count": props.multi_processor_count}


def versions() -> dict[str, Any]:
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


def smi_gpus() -> tuple[list[dict[str, Any]], str | None]:
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


def _torch_dir() -> Path | None:
    """The installed torch package's directory, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _module_constant(path: Path, name: str) -> str | None:
    """A top-level `name = '...'` (or annotated) string constant of a Python file, read without running it."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return None


_CUDNN_DISTS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")
_CUDNN_HEADER_RE = re.compile(r"#define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)")


def _cudnn_version(torch_dir: Path | None) -> tuple[str | None, str | None]:
    """(version, where it was read) of the cuDNN torch loads: the pip wheel torch depends on, else a
    header, else the soname of a libcudnn beside torch or in the system's library directories."""
    for dist in _CUDNN_DISTS:
        try:
            return metadata.version(dist), f"{dist} metadata"
        except metadata.PackageNotFoundError:
            continue
    roots = [Path(sys.prefix), Path("/usr/local/cuda"), Path("/usr")]
    headers = [h for r in roots for h in (r / "include" / "cudnn_version.h",
                                          r / "include" / "x86_64-linux-gnu" / "cudnn_version_v9.h")]
    for header in headers:
        try:
            found = dict(_CUDNN_HEADER_RE.findall(header.read_text()))
        except OSError:
            continue
        if "MAJOR" in found:
            return ".".join(found[k] for k in ("MAJOR", "MINOR", "PATCHLEVEL") if k in found), str(header)
    lib_dirs = ([torch_dir / "lib"] if torch_dir else []) + [Path(sys.prefix) / "lib", Path("/usr/local/cuda/lib64"),
                                                             Path("/usr/lib/x86_64-linux-gnu")]
    for lib_dir in lib_dirs:
        names = sorted(glob.glob(str(lib_dir / "libcudnn.so.*")), key=len, reverse=True)
        if names:
            return Path(names[0]).name.removeprefix("libcudnn.so."), names[0]
    return None, None


def image_facts() -> dict[str, Any]:
    """torch, torch.version.cuda and cuDNN as installed in this image, read from files (torch not imported)."""
    torch_dir = _torch_dir()
    # version.py holds torch.__version__ with its local part (2.11.0+cu128); the metadata may drop it
    torch_version = _module_constant(torch_dir / "version.py", "__version__") if torch_dir else None
    if torch_version is None:
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
    cuda = _module_constant(torch_dir / "version.py", "cuda") if torch_dir else None
    cudnn, cudnn_source = _cudnn_version(torch_dir)
    return {"torch": torch_version, "cuda": cuda, "cudnn": cudnn, "cudnn_source": cudnn_source,
            "torch_dir": str(torch_dir) if torch_dir else None}


def version_matches(expected: str, actual: str | None) -> bool:
    """Dotted-prefix match on the public version: "2.11.0" accepts "2.11.0+cu128", "9" accepts "9.10.2.21"."""
    if actual is None:
        return False
    want, have = expected.split("."), actual.split("+", 1)[0].split(".")
    return have[: len(want)] == want


def image_mismatches(facts: dict[str, Any], expect: dict[str, str]) -> list[str]:
    """One line per declared value the image does not have, naming both."""
    labels = {"torch": "torch", "cuda": "CUDA runtime (torch.version.cuda)", "cudnn": "cuDNN"}
    return [f"{labels[k]}: the profile declares {want}, the image has {facts.get(k) or 'none'}"
            for k, want in expect.items() if not version_matches(want, facts.get(k))]


def probe() -> dict[str, Any]:
    gpus, why = smi_gpus()
    env = dict(sorted(({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
                       | knobs.given(knobs.MpsKnobs)).items()))
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "packages": package_versions(), "image": image_facts(),
            "driver": gpus[0]["driver_version"] if gpus else driver_version(), "gpus": gpus, "gpu_probe_error": why,
            "env": mask_env(env), "remote_env_names": sorted(masked_names())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write here instead of stdout")
    ap.add_argument("--expect-torch", help="the torch version the profile declares (dotted prefix)")
    ap.add_argument("--expect-cuda", help="the CUDA runtime torch was built with (torch.version.cuda)")
    ap.add_argument("--expect-cudnn", help="the cuDNN version torch loads (dotted prefix, e.g. 9)")
    args = ap.parse_args(argv)
    record = probe()
    expect = {k: v for k, v in (("torch", args.expect_torch), ("cuda", args.expect_cuda),
                                ("cudnn", args.expect_cudnn)) if v}
    mismatches = image_mismatches(record["image"], expect)
    record["image_check"] = {"expected": expect, "mismatches": mismatches,
                             "verdict": "none declared" if not expect else "mismatch" if mismatches else "match"}
    text = json.dumps(record, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    if mismatches:
        print("image check failed, the workload would not run on this image: " + "; ".join(mismatches),
              file=sys.stderr)
        return IMAGE_MISMATCH_EXIT
    if expect:
        print(f"image check passed: torch {record['image']['torch']}, CUDA {record['image']['cuda']}, "
              f"cuDNN {record['image']['cudnn']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
