"""A simulated host's GPUs: an `nvidia-smi` and a `vh-receipt` on its PATH that answer from the instance's offer.

The simulator's hosts have no GPU (or the machine's own, which is not the offer's), so each host gets a small
`nvidia-smi` program that reports the offer's GPUs as a real one would: `--query-gpu=FIELDS --format=csv[,
noheader][,nounits]` for the fields the harness and the workload ask for, and the plain table's header with
the driver and CUDA version. The `gpu_mismatch` fault makes it lie: it reports another GPU than the offer's.
Its `vh-receipt` (sim/host_receipt.py) answers the harness's receipt the same way, from the offer, the receipt's
reference table and the receipt faults (`pcie_slow`, `gpu_slow`, `hbm_slow`, `throttle`, `ecc_error`).
"""

from __future__ import annotations

import json
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

# resources is a stdlib-only leaf: the simulator imports nothing else of the harness
from vast_harness.resources import profiles_dir

REFERENCES_PATH = profiles_dir() / "receipt-references.toml"
HOST_RECEIPT = Path(__file__).with_name("host_receipt.py")

# How nvidia-smi names each GPU of the simulated catalog (sim/market.py CATALOG), from NVIDIA's drivers.
SMI_NAMES = {
    "RTX 5090": "NVIDIA GeForce RTX 5090",
    "RTX 4090": "NVIDIA GeForce RTX 4090",
    "RTX 3090": "NVIDIA GeForce RTX 3090",
    "L40S": "NVIDIA L40S",
    "A100 SXM4": "NVIDIA A100-SXM4-80GB",
    "A100 PCIE": "NVIDIA A100-PCIE-40GB",
    "H100 SXM": "NVIDIA H100 80GB HBM3",
    "H100 PCIE": "NVIDIA H100 PCIe",
    "H200": "NVIDIA H200",
}
# What a lying host reports instead: a GPU the offer did not name, with its own memory and capability.
_LIE = {"name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576, "compute_cap": "8.6"}
_LIE_FOR_A_3090 = {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "compute_cap": "8.9"}
BIN_DIR = ".sim/bin"

_PROGRAM = '''#!{python}
"""nvidia-smi as the simulator's host answers it (vast_harness/sim/gpus.py): the offer's GPUs."""
import sys
GPUS = {gpus}
DRIVER, CUDA = {driver!r}, {cuda!r}
LINK = {link!r}
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is None:
    if args:
        sys.stderr.write("nvidia-smi (simulated): only --query-gpu and the plain table are answered\\n")
        sys.exit(2)
    print("+" + "-" * 89 + "+")
    print(f"| NVIDIA-SMI {{DRIVER:<22}} Driver Version: {{DRIVER:<14}} CUDA Version: {{CUDA:<9}}|")
    print("+" + "-" * 89 + "+")
    for i, g in enumerate(GPUS):
        print(f"| {{i:>3}}  {{g['name']:<40}} | {{g['memory_mib']:>6}}MiB |")
    sys.exit(0)
fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv").split(",")
fields = [f.strip() for f in query.split(",")]
def value(i, g, field):
    units = "nounits" not in fmt
    table = {{"index": str(i), "name": g["name"], "uuid": f"GPU-{{g['uuid']}}",
             "memory.total": f"{{g['memory_mib']}} MiB" if units else str(g["memory_mib"]),
             "driver_version": DRIVER, "compute_cap": g["compute_cap"], "pci.bus_id": f"00000000:{{i + 1:02X}}:00.0",
             "pcie.link.gen.max": LINK[0], "pcie.link.width.max": LINK[1]}}
    if field not in table:
        sys.stderr.write(f'Field "{{field}}" is not a valid field to query.\\n')
        sys.exit(2)
    return table[field]
rows = [", ".join(value(i, g, f) for f in fields) for i, g in enumerate(GPUS)]
if "noheader" not in fmt:
    print(", ".join(fields))
print("\\n".join(rows))
'''


def host_gpus(offer: dict[str, Any], *, lie: bool) -> list[dict[str, Any]]:
    """The GPUs the host reports: the offer's (count, name as nvidia-smi spells it, memory, capability), or
    with `lie` another GPU than the offer's."""
    name = str(offer.get("gpu_name") or "")
    gpu = {"name": SMI_NAMES.get(name, f"NVIDIA {name}"), "memory_mib": int(offer.get("gpu_ram") or 0),
           "compute_cap": f"{int(offer.get('compute_cap') or 0) / 100:.1f}"}
    if lie:
        gpu = dict(_LIE_FOR_A_3090 if gpu["name"] == _LIE["name"] else _LIE)
    count = int(offer.get("num_gpus") or 1)
    machine = int(offer.get("machine_id") or 0)
    return [gpu | {"uuid": f"{machine:08x}-0000-4000-8000-{i:012x}"} for i in range(count)]


def install_nvidia_smi(home: Path, offer: dict[str, Any], *, lie: bool) -> Path:
    """Write the host's `nvidia-smi` under `home` and return its directory (to go first on the host's PATH)."""
    bin_dir = home / BIN_DIR
    bin_dir.mkdir(parents=True, exist_ok=True)
    program = _PROGRAM.format(python=sys.executable, gpus=json.dumps(host_gpus(offer, lie=lie)),
                              driver=str(offer.get("driver_version") or ""), cuda=f"{offer.get('cuda_max_good')}",
                              link=(str(int(float(offer.get("pci_gen") or 4))), str(int(offer.get("gpu_lanes") or 16))))
    path = bin_dir / "nvidia-smi"
    path.write_text(program)
    path.chmod(0o755)
    return bin_dir


def receipt_references(gpu_name: str, path: Path = REFERENCES_PATH) -> tuple[dict[str, float], bool]:
    """What the reference table says this receipt's method reaches on `gpu_name` (matmul, burn, hbm_copy; empty
    for a GPU it has no figure for) and whether the GPU reports ECC (a name it does not know: not a GeForce)."""
    try:
        table = tomllib.loads(path.read_text()).get("gpu", {})
    except (OSError, tomllib.TOMLDecodeError):
        table = {}
    want = " ".join(gpu_name.lower().split())
    row = next((r for name, r in table.items() if " ".join(name.lower().split()) == want), None)
    if row is None:
        return {}, "rtx" not in want and "geforce" not in want
    figures = {m: float(row[m]["value"]) for m in ("matmul", "burn", "hbm_copy")
               if isinstance(row.get(m), dict) and row[m].get("value")}
    return figures, bool(row.get("ecc"))


def install_receipt(home: Path, offer: dict[str, Any], *, faults: dict[str, float], seed: int,
                    report: Path | None = None, torch: bool = True) -> Path:
    """Write the host's `vh-receipt` (sim/host_receipt.py with this host's config) beside its `nvidia-smi`."""
    bin_dir = home / BIN_DIR
    bin_dir.mkdir(parents=True, exist_ok=True)
    reference, ecc = receipt_references(str(offer.get("gpu_name") or ""))
    config = {"gpus": host_gpus(offer, lie=False), "offer": {k: offer.get(k) for k in (
        "gpu_name", "num_gpus", "pcie_bw", "pci_gen", "gpu_lanes", "gpu_mem_bw", "total_flops", "bw_nvlink")},
        "reference": reference, "ecc": ecc, "faults": faults, "seed": seed,
        "driver": offer.get("driver_version"), "cuda": offer.get("cuda_max_good"),
        "report": str(report) if report else None, "torch": torch}
    config_path = bin_dir / "vh-receipt.json"
    config_path.write_text(json.dumps(config))
    path = bin_dir / "vh-receipt"
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(HOST_RECEIPT))} "
                    f"{shlex.quote(str(config_path))} \"$@\"\n")
    path.chmod(0o755)
    return bin_dir
