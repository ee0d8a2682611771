"""Validate an MPS manifest (written by `python -m remote.mps`): its shape and its claims.

`check(path)` returns a list of problems, empty when the manifest proves that every CUDA process of
the run was an MPS client of one daemon, and (for a daemon we owned) that the daemon was stopped
and is gone. `python -m remote.checks.mps FILE...` prints them and exits 1 on any.
Standard library only: it also runs on the GPU host.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

_UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")


def _is_pid(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _attachment_errors(who: str, rec: dict[str, Any], server_pids: list[int]) -> list[str]:
    ev = rec.get("attachment")
    if not isinstance(ev, dict):
        return [f"{who}: no attachment evidence"]
    pid = rec.get("pid")
    listed = ev.get("client_list")
    line = ev.get("control_log_line")
    in_list = isinstance(listed, dict) and pid in (listed.get("client_pids") or []) and (
        listed.get("server_pid") in server_pids
    )
    in_log = isinstance(line, str) and f"NEW CLIENT {pid} from user" in line
    if not (in_list or in_log):
        return [f"{who}: PID not among the server's clients (client list or control.log NEW CLIENT line)"]
    return []


def client_claim_errors(clients: Any, server: dict[str, Any]) -> list[str]:
    """Per-process claims: attribute 1, PID among the clients, one mode, one GPU UUID per rank."""
    if not isinstance(clients, list) or not clients:
        return ["clients: no CUDA process reported its MPS attachment (attach_current_process)"]
    errors: list[str] = []
    server_pids = server.get("server_pids") or []
    owned = server.get("ownership") == "owned"
    modes = {rec.get("mode") for rec in clients if isinstance(rec, dict)}
    if len(modes) > 1:
        errors.append(f"clients disagree on the configured MPS mode: {sorted(map(str, modes))}")
    uuid_by_rank: dict[object, set[object]] = {}
    pids = [rec.get("pid") for rec in clients if isinstance(rec, dict)]
    if len(pids) != len(set(pids)):
        errors.append("clients: a PID appears twice")
    for i, rec in enumerate(clients):
        if not isinstance(rec, dict):
            errors.append(f"clients[{i}]: not an object")
            continue
        who = f"clients[{i}] rank {rec.get('rank')} ({rec.get('role')}, pid {rec.get('pid')})"
        if not _is_pid(rec.get("pid")):
            errors.append(f"{who}: pid missing or not a positive integer")
        if not isinstance(rec.get("role"), str) or not rec.get("role"):
            errors.append(f"{who}: role missing")
        if rec.get("rank") is not None and not isinstance(rec.get("rank"), int):
            errors.append(f"{who}: rank must be an integer or null")
        if rec.get("mode") != "on":
            errors.append(f"{who}: mode is {rec.get('mode')!r}, the run requested 'on'")
        if rec.get("mps_enabled_attr") != 1:
            errors.append(f"{who}: CU_DEVICE_ATTRIBUTE_MPS_ENABLED is {rec.get('mps_enabled_attr')!r}, not 1")
        if rec.get("attached") is not True or rec.get("error"):
            errors.append(f"{who}: not attached: {rec.get('error') or 'attached is not true'}")
        if not isinstance(rec.get("device_uuid"), str) or not _UUID_RE.match(rec["device_uuid"]):
            errors.append(f"{who}: device_uuid {rec.get('device_uuid')!r} is not a GPU UUID")
        errors += _attachment_errors(who, rec, server_pids)
        if owned and rec.get("control_log_confirmed") is not True:
            errors.append(f"{who}: no NEW CLIENT line for this PID in our daemon's control.log")
        uuid_by_rank.setdefault(rec.get("rank"), set()).add(rec.get("device_uuid"))
    for rank, uuids in uuid_by_rank.items():
        if len(uuids) > 1:
            errors.append(f"rank {rank}: learner and helpers on different GPUs by UUID: {sorted(map(str, uuids))}")
    return errors


def _server_errors(server: object) -> list[str]:
    if not isinstance(server, dict):
        return ["server: missing host-level server record"]
    errors = []
    if server.get("ownership") not in ("owned", "external"):
        errors.append(f"server.ownership {server.get('ownership')!r} is not 'owned' or 'external'")
    if not _VERSION_RE.match(str(server.get("driver_version"))):
        errors.append(f"server.driver_version {server.get('driver_version')!r} is not a driver version")
    binary = server.get("control_binary") or {}
    if not isinstance(binary.get("path"), str) or not _SHA_RE.match(str(binary.get("sha256"))):
        errors.append("server.control_binary needs path and sha256")
    if not isinstance(server.get("pipe_directory"), str):
        errors.append("server.pipe_directory missing")
    if not _is_pid(server.get("daemon_pid")):
        errors.append("server.daemon_pid missing")
    spids = server.get("server_pids")
    if not isinstance(spids, list) or not spids or not all(_is_pid(p) for p in spids):
        errors.append("server.server_pids: no MPS server PID recorded")
    logs = server.get("logs")
    if not isinstance(logs, dict) or any(not _SHA_RE.match(str((v or {}).get("sha256"))) for v in logs.values()):
        errors.append("server.logs must map file names to sha256 digests")
    elif server.get("ownership") == "owned" and "control.log" not in logs:
        errors.append("server.logs lacks control.log for a daemon we owned")
    return errors + _stop_errors(server)


def _stop_errors(server: dict[str, Any]) -> list[str]:
    stop = server.get("stop")
    if server.get("ownership") != "owned":
        return [] if stop is None else ["server.stop present for an external daemon (never stopped)"]
    if not isinstance(stop, dict):
        return ["server.stop missing for a daemon we owned"]
    errors = []
    for key in ("daemon_gone", "servers_gone", "pipe_dir_removed"):
        if stop.get(key) is not True:
            errors.append(f"server.stop.{key} is not true")
    if stop.get("survivors"):
        errors.append(f"server.stop.survivors: MPS processes left running: {stop['survivors']}")
    return errors


def check_manifest(data: object) -> list[str]:
    if not isinstance(data, dict):
        return ["manifest is not a JSON object"]
    errors = []
    if data.get("kind") != "mps" or data.get("schema_version") != 1:
        errors.append("not an MPS manifest of schema_version 1")
    if data.get("requested_mode") != "on":
        errors.append(f"requested_mode is {data.get('requested_mode')!r}; this evidence must show MPS on")
    server = data.get("server")
    errors += _server_errors(server)
    errors += client_claim_errors(data.get("clients"), server if isinstance(server, dict) else {})
    if data.get("errors"):
        errors.append(f"the run recorded errors: {data['errors']}")
    child = data.get("child") or {}
    if child.get("exit_code") != 0:
        errors.append(f"child command exit code {child.get('exit_code')!r}, not 0")
    if data.get("exit_code") != 0 or data.get("verdict") != "pass":
        errors.append(f"wrapper exit_code {data.get('exit_code')!r} / verdict {data.get('verdict')!r}")
    return errors


def check(path: Path) -> list[str]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path}: unreadable: {exc}"]
    return check_manifest(data)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m remote.checks.mps MANIFEST.json...", file=sys.stderr)
        return 2
    bad = 0
    for path in paths:
        problems = check(Path(path))
        bad += bool(problems)
        print(f"{path}: {'OK' if not problems else 'INVALID'}")
        for problem in problems:
            print(f"  - {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
