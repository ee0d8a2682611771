"""remote.checks.mps: a good manifest passes, each broken claim is named."""

from __future__ import annotations

import copy
import json

import pytest

from remote.checks.mps import check, check_manifest, main

UUID_A = "GPU-0123abcd-0000-1111-2222-333344445555"
UUID_B = "GPU-ffffffff-0000-1111-2222-333344445555"
SHA = "ab" * 32


def client(pid: int, role: str, rank: int | None = 0, uuid: str = UUID_A) -> dict:
    return {
        "pid": pid, "role": role, "rank": rank, "mode": "on", "mps_enabled_attr": 1, "attached": True,
        "error": None, "device_uuid": uuid, "control_log_confirmed": True,
        "attachment": {"server_pids": [900], "client_list": {"server_pid": 900, "client_pids": [pid]},
                       "control_log_line": f"[t Control 1] NEW CLIENT {pid} from user 0: Server already exists"},
    }


GOOD = {
    "kind": "mps", "schema_version": 1, "requested_mode": "on", "command": ["python", "train.py"],
    "server": {
        "ownership": "owned", "driver_version": "580.159.04", "pipe_directory": "/tmp/vhmps-x",
        "control_binary": {"path": "/usr/bin/nvidia-cuda-mps-control", "version": "13000", "sha256": SHA},
        "daemon_pid": 800, "server_pids": [900], "logs": {"control.log": {"sha256": SHA, "bytes": 10}},
        "stop": {"daemon_gone": True, "servers_gone": True, "pipe_dir_removed": True, "survivors": []},
    },
    "clients": [client(101, "learner"), client(102, "helper")],
    "child": {"pid": 101, "exit_code": 0}, "exit_code": 0, "errors": [], "verdict": "pass",
}


def mutate(path: str, value) -> dict:
    data = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


def test_good_manifest_passes(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(GOOD))
    assert check(path) == []
    assert main([str(path)]) == 0


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("clients.1.mps_enabled_attr", 0, "MPS_ENABLED is 0"),
        ("clients.1.mode", "off", "disagree"),
        ("clients.0.device_uuid", UUID_B, "different GPUs by UUID"),
        ("clients.0.device_uuid", "0", "not a GPU UUID"),
        ("clients.0.attachment", {"client_list": None, "control_log_line": None}, "not among the server's clients"),
        ("clients.0.control_log_confirmed", False, "no NEW CLIENT line"),
        ("clients", [], "no CUDA process reported"),
        ("server.stop.daemon_gone", False, "daemon_gone is not true"),
        ("server.stop.survivors", [800], "left running"),
        ("server.stop", KeyError, "stop missing"),
        ("server.server_pids", [], "no MPS server PID"),
        ("server.driver_version", None, "not a driver version"),
        ("server.driver_version", "for", "not a driver version"),
        ("server.logs", {"control.log": {"sha256": "nope"}}, "sha256"),
        ("server", KeyError, "missing host-level server record"),
        ("errors", ["boom"], "recorded errors"),
        ("child.exit_code", 3, "exit code 3"),
        ("requested_mode", "off", "must show MPS on"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_broken_claim_is_named(path, value, needle):
    errors = check_manifest(mutate(path, value))
    assert any(needle in e for e in errors), errors


def test_pid_in_another_servers_client_list_is_not_evidence():
    data = copy.deepcopy(GOOD)
    for rec in data["clients"]:
        rec["attachment"]["client_list"]["server_pid"] = 12345
        rec["attachment"]["control_log_line"] = None
    assert any("not among" in e for e in check_manifest(data))


def test_external_daemon_needs_no_stop_but_must_not_claim_one():
    data = mutate("server.ownership", "external")
    del data["server"]["stop"]
    assert check_manifest(data) == []
    assert any("never stopped" in e for e in check_manifest(mutate("server.ownership", "external")))


def test_unreadable_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    assert "unreadable" in check(path)[0]
    assert main([str(path)]) == 1


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023", "535.104.05"),
        (("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
          "(dvs-builder@U16-I2-C04-37-2)  Thu Oct 23 2025"), "580.159.04"),
        ("garbage", None),
    ],
    ids=["proprietary", "open-module", "unparsable"],
)
def test_driver_version_parsed_from_proc(text, version):
    from remote.mps.manifest import parse_proc_driver_version

    assert parse_proc_driver_version(text) == version
