"""Per-process proof that this CUDA process really is an MPS client (docs/mps.md).

A CUDA process that cannot reach the daemon silently runs without MPS, so "the daemon is
running" proves nothing. Each process proves it for itself, after CUDA init:

1. `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (133 in cuda.h, CUDA 12.3+) read through libcuda in this process;
2. its PID among the clients of the daemon's server (`get_client_list`), or a `NEW CLIENT <pid>` line
   in the daemon's control.log;
3. the device by UUID (`cuDeviceGetUuid`), never by ordinal, so learner and helpers can be compared
   across different CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote import knobs
from remote.mps.control import DEFAULT_LOG_DIR, MpsError, control, find_control_binary, parse_pids

CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 133  # cuda.h: "contexts created on this device will be shared via MPS"
MODES = ("on", "off")


class MpsNotAttached(RuntimeError):
    """MPS was requested (VH_MPS_MODE=on) but this process is not proven to be an MPS client."""


class MpsUnexpectedlyAttached(MpsNotAttached):
    """VH_MPS_MODE=off, yet the process is an MPS client (a foreign daemon leaked in)."""


@dataclass(frozen=True)
class CudaDeviceFacts:
    mps_enabled_attr: int | None
    device_uuid: str | None
    error: str | None = None


def _format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"  # nvidia-smi's spelling


def probe_cuda_device(device_index: int) -> CudaDeviceFacts:
    """Read the MPS attribute and the UUID of CUDA ordinal `device_index` through libcuda."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return CudaDeviceFacts(None, None, f"cannot load libcuda.so.1: {exc}")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    value = ctypes.c_int(-1)
    raw = ctypes.create_string_buffer(16)
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    # The primary context is the one PyTorch uses; retaining it makes sure the MPS connection exists
    # before we look for our PID. It is deliberately never released: the process keeps using it.
    steps: tuple[tuple[str, Callable[[], int]], ...] = (
        ("cuInit", lambda: lib.cuInit(0)),
        ("cuDeviceGet", lambda: lib.cuDeviceGet(ctypes.byref(dev), device_index)),
        ("cuDevicePrimaryCtxRetain", lambda: lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
        ("cuDeviceGetUuid", lambda: get_uuid(raw, dev)),
        ("cuDeviceGetAttribute(MPS_ENABLED)",
         lambda: lib.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev)),
    )
    for name, call in steps:
        rc = call()
        if rc != 0:
            uuid = _format_uuid(raw.raw) if name == "cuDeviceGetAttribute(MPS_ENABLED)" else None
            return CudaDeviceFacts(None, uuid, f"{name} returned CUresult {rc}")
    return CudaDeviceFacts(int(value.value), _format_uuid(raw.raw))


def configured_mode() -> str:
    """`on` or `off` (unset: off); a value that is neither is a process that cannot prove anything."""
    try:
        return knobs.mps().mode or "off"
    except knobs.KnobError as exc:
        raise MpsNotAttached(str(exc)) from None


def _find_in_clients(pid: int, pipe_dir: Path) -> dict[str, Any]:
    binary = find_control_binary()
    servers = control(binary, pipe_dir, "get_server_list")
    if not servers.ok:
        raise MpsError(f"daemon reachable through {pipe_dir}: {servers.describe()}")
    evidence: dict[str, Any] = {"server_pids": parse_pids(servers.out), "client_list": None}
    for server_pid in evidence["server_pids"]:
        clients = control(binary, pipe_dir, f"get_client_list {server_pid}")
        if clients.ok and pid in parse_pids(clients.out):
            evidence["client_list"] = {"server_pid": server_pid, "client_pids": parse_pids(clients.out)}
    return evidence


def _find_in_log(pid: int) -> str | None:
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR) / "control.log"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    needle = f"NEW CLIENT {pid} from user"
    return next((line.strip() for line in text.splitlines() if needle in line), None)


def _prove_attached(pid: int, facts: CudaDeviceFacts, timeout_s: float) -> dict[str, Any]:
    """Evidence of attachment, or MpsError naming the first prerequisite that failed."""
    pipe_env = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe_env:
        raise MpsError("CUDA_MPS_PIPE_DIRECTORY exported before CUDA init: it is unset")
    if facts.error:
        raise MpsError(f"CUDA device probe: {facts.error}")
    if facts.mps_enabled_attr != 1:
        raise MpsError(
            f"CU_DEVICE_ATTRIBUTE_MPS_ENABLED == 1: read {facts.mps_enabled_attr}, so this process's "
            "CUDA context is not shared via MPS (silent fallback: daemon unreachable at CUDA init?)"
        )
    deadline = time.monotonic() + timeout_s
    while True:
        evidence = _find_in_clients(pid, Path(pipe_env))
        evidence["control_log_line"] = _find_in_log(pid)
        evidence["pipe_directory"] = pipe_env
        if evidence["client_list"] or evidence["control_log_line"]:
            return evidence
        if time.monotonic() >= deadline:
            raise MpsError(
                f"PID {pid} among the MPS server's clients: absent from get_client_list of servers "
                f"{evidence['server_pids']} and from control.log NEW CLIENT lines (PID namespace "
                "differs from the daemon's?)"
            )
        time.sleep(0.1)


def _write_record(record: dict[str, Any]) -> None:
    out_dir = knobs.mps().client_dir
    if not out_dir:
        return
    path = Path(out_dir) / f"{record['role']}-{record['rank']}-{record['pid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    tmp.replace(path)  # the wrapper never reads a half-written record


def attach_current_process(
    role: str,
    rank: int | None,
    device_index: int,
    *,
    probe: Callable[[int], CudaDeviceFacts] | None = None,
    timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Prove (mode "on") or record (mode "off") this process's MPS state; see the module doc.

    Call inside the CUDA process after CUDA init, before spawning helpers. Raises MpsNotAttached
    naming the rank and the failed prerequisite; the record is written to $VH_MPS_CLIENT_DIR either way.
    """
    mode = configured_mode()
    pid = os.getpid()
    facts = (probe or probe_cuda_device)(device_index)
    record = {
        "mode": mode, "pid": pid, "ppid": os.getppid(), "role": role, "rank": rank,
        "device_index": device_index, "device_uuid": facts.device_uuid,
        "mps_enabled_attr": facts.mps_enabled_attr, "attachment": None, "attached": False,
        "error": None, "hostname": socket.gethostname(), "unix_time": round(time.time(), 3),
    }
    who = f"rank {rank} ({role}, pid {pid})"
    try:
        if mode == "on":
            record["attachment"] = _prove_attached(pid, facts, timeout_s)
            record["attached"] = True
        elif facts.mps_enabled_attr == 1:
            raise MpsError(f"not an MPS client while {knobs.MPS_MODE}=off: CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 1")
    except MpsError as exc:
        record["error"] = f"{who}: prerequisite failed: {exc}"
        _write_record(record)
        cls = MpsNotAttached if mode == "on" else MpsUnexpectedlyAttached
        raise cls(record["error"]) from None
    _write_record(record)
    return record
