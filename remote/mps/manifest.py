"""The MPS manifest: one host-level server record and one entry per CUDA process.

Read by `scripts/check_gpu_evidence.py --kind mps` (remote/checks/mps.py). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from remote.host.envprobe import driver_version, parse_proc_driver_version  # noqa: F401 (re-exported)
from remote.mps.control import Daemon

SCHEMA_VERSION = 1
# "NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." and, for the open modules,
# "NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...": the first dotted number.


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def log_digests(log_dir: Path | None) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file directly in the log dir (control.log, server.log, ...)."""
    if log_dir is None or not log_dir.is_dir():
        return {}
    return {
        p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(log_dir.iterdir()) if p.is_file()
    }


def load_client_records(client_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    records, errors = [], []
    for path in sorted(client_dir.glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            errors.append(f"client record {path.name} unreadable: {exc}")
    return records, errors


def confirm_in_log(records: list[dict[str, Any]], control_log: str) -> None:
    """The wrapper's own cross-check: each client PID has a NEW CLIENT line in our control.log."""
    for rec in records:
        rec["control_log_confirmed"] = f"NEW CLIENT {rec.get('pid')} from user" in control_log


def server_record(daemon: Daemon | None, binary: Path | None, **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "ownership": None if daemon is None else ("owned" if daemon.owned else "external"),
        "foreign_source": None if daemon is None else daemon.foreign_source,
        "driver_version": driver_version(),
        "control_binary": {
            "path": str(binary) if binary else None,
            "version": daemon.binary_version() if daemon else None,
            "sha256": sha256_file(binary) if binary and binary.is_file() else None,
        },
        "pipe_directory": str(daemon.pipe_dir) if daemon else None,
        "log_directory": str(daemon.log_dir) if daemon and daemon.log_dir else None,
        "daemon_pid": daemon.daemon_pid if daemon else None,
        "server_pids": [],
        "host_checks": {"readiness": daemon.readiness if daemon else []},
    }
    record.update(extra)
    return record


def build_manifest(*, command: list[str], server: dict[str, Any], clients: list[dict[str, Any]], child: dict[str, Any],
                   exit_code: int, errors: list[str]) -> dict[str, Any]:
    return {
        "kind": "mps",
        "schema_version": SCHEMA_VERSION,
        "requested_mode": "on",
        "hostname": socket.gethostname(),
        "created_unix": round(time.time(), 3),
        "command": command,
        "server": server,
        "clients": sorted(clients, key=lambda r: (str(r.get("rank")), str(r.get("role")), r.get("pid") or 0)),
        "child": child,
        "exit_code": exit_code,
        "errors": errors,
        "verdict": "pass" if exit_code == 0 and not errors else "fail",
    }


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
