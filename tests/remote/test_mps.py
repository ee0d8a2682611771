"""`python -m remote.mps` end to end against the fake nvidia-cuda-mps-control (tests/remote/fake_mps)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from remote.checks.mps import check
from tests.remote.fake_mps import (
    FAKE_CLIENT,
    alive,
    fake_env,
    kill_quietly,
    query,
    start_fake_daemon,
    wait_until,
    wrapper_cmd,
)

pytestmark = pytest.mark.timeout(60)


def run_wrapper(tmp_path: Path, *opts: str, child: list[str] | None = None, env: dict | None = None,
                **extra_env: str) -> subprocess.CompletedProcess:
    env = env or fake_env(tmp_path, **extra_env)
    return subprocess.run(wrapper_cmd(tmp_path, *opts, child=child), env=env, check=False, capture_output=True,
                          text=True, timeout=45, cwd=tmp_path)


def manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "manifest.json").read_text())


def events(tmp_path: Path) -> list[str]:
    path = tmp_path / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def client(*args: str) -> list[str]:
    return [sys.executable, str(FAKE_CLIENT), *args]


def assert_stopped(m: dict) -> None:
    server = m["server"]
    assert server["stop"]["daemon_gone"] and server["stop"]["servers_gone"]
    assert not alive(server["daemon_pid"])
    assert not any(alive(p) for p in server["server_pids"])
    assert not Path(server["pipe_directory"]).exists()  # pipe dir removed ...
    assert (Path(server["log_directory"]) / "control.log").exists()  # ... logs kept


def test_learner_and_helper_attach__exit_0_and_manifest_validates(tmp_path):
    proc = run_wrapper(tmp_path, "--thread-pct", "50", child=client("--helper", "--role helper --rank 0"))
    assert proc.returncode == 0, proc.stderr
    m = manifest(tmp_path)
    assert check(tmp_path / "manifest.json") == []
    assert {c["role"] for c in m["clients"]} == {"learner", "helper"}
    assert m["server"]["ownership"] == "owned" and m["server"]["default_active_thread_percentage"] == 50.0
    assert m["server"]["driver_version"] == "580.00.01" and m["server"]["control_binary"]["version"] == "13000"
    assert set(m["server"]["logs"]) >= {"control.log"}
    pipe = Path(m["server"]["pipe_directory"])
    assert len(str(pipe)) <= 80 and pipe.name.startswith("vhmps-")
    assert events(tmp_path).index("set_default_active_thread_percentage 50") < events(tmp_path).index(
        f"fake_register_client {m['child']['pid']}")  # defaults before the first client
    assert_stopped(m)


def test_child_exit_code_is_returned(tmp_path):
    proc = run_wrapper(tmp_path, child=client("--exit", "7"))
    assert proc.returncode == 7
    assert manifest(tmp_path)["child"]["exit_code"] == 7
    assert check(tmp_path / "manifest.json")  # a failed command is not valid evidence


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--no-attach"], "no CUDA process reported"),
        (["--attr", "0"], "MPS_ENABLED is 0"),
        (["--no-register"], "not attached"),
    ],
    ids=["never-called-attach", "attribute-0-fallback", "pid-not-a-client"],
)
def test_not_attached__fails_closed(tmp_path, args, needle):
    """The command 'succeeds' (exit 0 or its own 3), the wrapper still fails and says why."""
    proc = run_wrapper(tmp_path, child=client(*args))
    assert proc.returncode != 0
    m = manifest(tmp_path)
    assert m["verdict"] == "fail" and any(needle in e for e in m["errors"]), m["errors"]
    assert check(tmp_path / "manifest.json")
    assert_stopped(m)


def test_ranks_disagree_on_mode__run_level_error(tmp_path):
    proc = run_wrapper(tmp_path, child=client("--helper", "--role learner --rank 1 --mode off --attr 0"))
    assert proc.returncode == 1
    errors = manifest(tmp_path)["errors"]
    assert any("disagree on the configured MPS mode" in e for e in errors), errors


def test_foreign_daemon_in_env__refused_and_left_alone(tmp_path):
    env = fake_env(tmp_path)
    foreign = start_fake_daemon(tmp_path / "foreign", tmp_path / "foreign-logs", env)
    try:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(tmp_path / "foreign")
        proc = run_wrapper(tmp_path, env=env, child=client())
        assert proc.returncode == 2 and "already set" in proc.stderr
        assert alive(foreign) and "quit" not in events(tmp_path)
    finally:
        query(tmp_path / "foreign", "quit", env)
        kill_quietly(foreign)


def test_foreign_daemon__used_as_external_never_stopped(tmp_path):
    env = fake_env(tmp_path)
    foreign = start_fake_daemon(tmp_path / "foreign", tmp_path / "foreign-logs", env)
    try:
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "foreign"),
                   CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "foreign-logs"))
        proc = run_wrapper(tmp_path, "--foreign", "use", env=env, child=client())
        assert proc.returncode == 0, proc.stderr
        m = manifest(tmp_path)
        assert m["server"]["ownership"] == "external" and m["server"]["foreign_source"] == "env"
        assert m["server"]["daemon_pid"] == foreign and m["server"].get("stop") is None
        assert check(tmp_path / "manifest.json") == []
        assert alive(foreign) and "quit" not in events(tmp_path)
        assert (tmp_path / "foreign" / "nvidia-cuda-mps-control.pid").exists()
    finally:
        query(tmp_path / "foreign", "quit", env)
        kill_quietly(foreign)


def test_live_daemon_in_default_dir__refused(tmp_path):
    env = fake_env(tmp_path)
    foreign = start_fake_daemon(tmp_path / "default-pipe", tmp_path / "foreign-logs", env)
    try:
        proc = run_wrapper(tmp_path, env=env, child=client())
        assert proc.returncode == 2 and "already answers" in proc.stderr
        assert alive(foreign)
    finally:
        query(tmp_path / "default-pipe", "quit", env)
        kill_quietly(foreign)


def test_stale_default_dir__ignored_and_private_daemon_used(tmp_path):
    stale = tmp_path / "default-pipe"
    stale.mkdir()
    (stale / "nvidia-cuda-mps-control.pid").write_text("999999\n")  # no such process
    (stale / "control").write_text("")  # a socket file that nobody listens on
    proc = run_wrapper(tmp_path, child=client())
    assert proc.returncode == 0, proc.stderr
    m = manifest(tmp_path)
    assert "stale" in m["server"]["stale_default_pipe_dir"]
    assert m["server"]["pipe_directory"] != str(stale)


def test_stale_pipe_dir_in_env__refused_even_with_use(tmp_path):
    stale = tmp_path / "stale"
    stale.mkdir()
    proc = run_wrapper(tmp_path, "--foreign", "use", child=client(), CUDA_MPS_PIPE_DIRECTORY=str(stale))
    assert proc.returncode == 2 and "stale" in proc.stderr


def test_slow_daemon__waited_for(tmp_path):
    proc = run_wrapper(tmp_path, child=client(), FAKE_MPS_READY_DELAY_S="0.6")
    assert proc.returncode == 0, proc.stderr


def test_daemon_fails_to_start__exit_2_nothing_run(tmp_path):
    proc = run_wrapper(tmp_path, child=client("--ready-file", str(tmp_path / "ran")), FAKE_MPS_START_FAIL="1")
    assert proc.returncode == 2 and "-d` exited 1" in proc.stderr
    assert not (tmp_path / "ran").exists()
    assert manifest(tmp_path)["verdict"] == "fail"


def test_quit_hangs__escalation_by_pid(tmp_path):
    proc = run_wrapper(tmp_path, child=client(), FAKE_MPS_QUIT_HANG="1", FAKE_MPS_IGNORE_SIGTERM="1")
    assert proc.returncode == 0, proc.stderr
    stop = manifest(tmp_path)["server"]["stop"]
    assert "timed out" in stop["quit"]
    daemon_pid = manifest(tmp_path)["server"]["daemon_pid"]
    assert {"pid": daemon_pid, "signal": "SIGKILL"} in stop["escalated"]
    assert_stopped(manifest(tmp_path))


@pytest.mark.slow
def test_stuck_client__terminate_client_then_sigkill(tmp_path):
    helper = "--role helper --rank 0 --ignore-sigterm --sleep-s 30"
    proc = run_wrapper(tmp_path, child=client("--detach-helpers", "--helper", helper))
    assert proc.returncode == 0, proc.stderr
    stop = manifest(tmp_path)["server"]["stop"]
    [term] = stop["terminated_clients"]
    assert term["sigkill"] and not alive(term["client_pid"])
    assert f"terminate_client {term['server_pid']} {term['client_pid']}" in events(tmp_path)


def _start_background(tmp_path: Path, **extra: str) -> tuple[subprocess.Popen, int, Path]:
    ready = tmp_path / "ready"
    wrapper = subprocess.Popen(wrapper_cmd(tmp_path, child=client("--ready-file", str(ready), "--sleep-s", "30")),
                               env=fake_env(tmp_path, **extra), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_until(lambda: ready.exists() and ready.read_text().endswith("\n")), "child never started"
    child_pid, pipe_dir = ready.read_text().split()
    return wrapper, int(child_pid), Path(pipe_dir)


def test_sigterm__forwarded_to_child_then_stop(tmp_path):
    wrapper, child_pid, pipe_dir = _start_background(tmp_path)
    daemon_pid = int((pipe_dir / "nvidia-cuda-mps-control.pid").read_text())
    wrapper.send_signal(signal.SIGTERM)
    _, err = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 143, err  # the child's own exit code for SIGTERM
    m = manifest(tmp_path)
    assert m["child"]["signals_forwarded"] == ["SIGTERM"]
    assert not alive(child_pid) and not alive(daemon_pid) and not pipe_dir.exists()


def test_sigkill_of_wrapper__supervisor_leaves_no_orphan(tmp_path):
    wrapper, child_pid, pipe_dir = _start_background(tmp_path)
    daemon_pid = int((pipe_dir / "nvidia-cuda-mps-control.pid").read_text())
    servers = query(pipe_dir, "get_server_list", fake_env(tmp_path)).stdout.split()
    try:
        wrapper.kill()
        wrapper.communicate(timeout=10)
        assert wait_until(lambda: not alive(daemon_pid) and not pipe_dir.exists(), 15), "daemon orphaned"
        assert all(wait_until(lambda p=int(s): not alive(p), 5) for s in servers)
        assert wait_until(lambda: not alive(child_pid), 5)
        report = json.loads((tmp_path / "logs" / "supervisor-stop.json").read_text())
        assert report["by"] == "supervisor" and report["daemon_gone"]
    finally:
        kill_quietly(child_pid)
        kill_quietly(daemon_pid)


def test_usage_errors__exit_2(tmp_path):
    env = fake_env(tmp_path)
    for argv in (["--thread-pct", "5"], ["--thread-pct", "0", "--", "true"], ["--"]):
        proc = subprocess.run([sys.executable, "-m", "remote.mps", *argv], env=env, check=False, capture_output=True,
                              text=True, timeout=20)
        assert proc.returncode == 2, (argv, proc.stderr)
