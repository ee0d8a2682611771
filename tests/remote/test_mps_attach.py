"""attach_current_process in-process: modes, prerequisites named on failure, the record it writes."""

from __future__ import annotations

import json
import os

import pytest

from remote.mps import CudaDeviceFacts, MpsNotAttached, MpsUnexpectedlyAttached, attach_current_process
from tests.remote.fake_mps import fake_env, query, start_fake_daemon

UUID = "GPU-0123abcd-0000-1111-2222-333344445555"


def probe(attr):
    return lambda _index: CudaDeviceFacts(attr, UUID)


@pytest.fixture
def env(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith(("CUDA_MPS_", "VH_MPS_"))]:
        monkeypatch.delenv(key)
    for key, value in fake_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("VH_MPS_CLIENT_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def daemon(env, monkeypatch):
    pipe, logs = env / "pipe", env / "logs"
    pid = start_fake_daemon(pipe, logs, dict(os.environ))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(logs))
    yield pipe
    query(pipe, "quit", dict(os.environ))
    del pid


def test_mode_off_by_default_records_without_raising(env):
    rec = attach_current_process("learner", 0, 0, probe=probe(0))
    assert rec["mode"] == "off" and rec["mps_enabled_attr"] == 0 and rec["attachment"] is None
    assert json.loads((env / f"learner-0-{os.getpid()}.json").read_text())["device_uuid"] == UUID


def test_mode_off_but_attached__raises(env):
    with pytest.raises(MpsUnexpectedlyAttached, match="VH_MPS_MODE=off"):
        attach_current_process("helper", 2, 0, probe=probe(1))


def test_bad_mode_value(env, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "yes")
    with pytest.raises(MpsNotAttached, match="VH_MPS_MODE"):
        attach_current_process("learner", 0, 0, probe=probe(1))


def test_mode_on_without_pipe_dir__names_the_prerequisite(env, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "on")
    with pytest.raises(MpsNotAttached, match=r"rank 3 \(learner.*CUDA_MPS_PIPE_DIRECTORY"):
        attach_current_process("learner", 3, 0, probe=probe(1))
    rec = json.loads((env / f"learner-3-{os.getpid()}.json").read_text())
    assert rec["attached"] is False and "CUDA_MPS_PIPE_DIRECTORY" in rec["error"]


def test_mode_on_attr_zero__silent_fallback_caught(daemon, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "on")
    with pytest.raises(MpsNotAttached, match="MPS_ENABLED == 1: read 0"):
        attach_current_process("learner", 0, 0, probe=probe(0))


def test_mode_on_pid_not_a_client(daemon, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "on")
    with pytest.raises(MpsNotAttached, match="among the MPS server's clients"):
        attach_current_process("learner", 0, 0, probe=probe(1), timeout_s=0.2)


def test_mode_on_registered_pid__evidence_from_client_list_and_log(daemon, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "on")
    query(daemon, f"fake_register_client {os.getpid()}", dict(os.environ))
    rec = attach_current_process("learner", 0, 0, probe=probe(1))
    assert rec["attached"] and os.getpid() in rec["attachment"]["client_list"]["client_pids"]
    assert f"NEW CLIENT {os.getpid()} from user" in rec["attachment"]["control_log_line"]


def test_mode_on_daemon_unreachable(env, monkeypatch):
    monkeypatch.setenv("VH_MPS_MODE", "on")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(env / "nothing-here"))
    with pytest.raises(MpsNotAttached, match="daemon reachable"):
        attach_current_process("learner", 0, 0, probe=probe(1))


@pytest.mark.gpu
def test_real_probe_reads_uuid_and_attribute():
    torch = pytest.importorskip("torch")  # imported here: torch's import is slow, the other tests need none
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.zeros(1, device="cuda")
    from remote.mps import probe_cuda_device

    facts = probe_cuda_device(0)
    assert facts.error is None and facts.mps_enabled_attr in (0, 1)
    assert facts.device_uuid.startswith("GPU-")
