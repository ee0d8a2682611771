"""The fake MPS toolchain for CPU tests: executables for PATH, and helpers to drive them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

FAKE_DIR = Path(__file__).resolve().parent
REPO_ROOT = FAKE_DIR.parents[2]
FAKE_CLIENT = FAKE_DIR / "fake_client.py"
CONTROL = FAKE_DIR / "nvidia-cuda-mps-control"


def fake_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment with the fakes first on PATH and no ambient MPS variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "VH_MPS_", "FAKE_MPS_"))}
    env["PATH"] = f"{FAKE_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["FAKE_MPS_EVENTS"] = str(tmp_path / "events.log")
    env.update(extra)
    return env


def wrapper_cmd(tmp_path: Path, *opts: str, child: list[str] | None = None) -> list[str]:
    """`python -m remote.mps` with test-sized timeouts and a private default dir, then CMD."""
    base = [
        sys.executable, "-m", "remote.mps", "--manifest", str(tmp_path / "manifest.json"),
        "--default-pipe-dir", str(tmp_path / "default-pipe"), "--log-dir", str(tmp_path / "logs"),
        "--ready-timeout-s", "5", "--client-grace-s", "0.5", "--quit-timeout-s", "0.5", "--kill-wait-s", "0.5",
    ]
    return [*base, *opts, "--", *(child or [sys.executable, str(FAKE_CLIENT)])]


def start_fake_daemon(pipe_dir: Path, log_dir: Path, env: dict[str, str]) -> int:
    """A daemon started outside the wrapper (a 'foreign' one); returns its PID once it answers."""
    env = dict(env, CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(log_dir))
    subprocess.run([str(CONTROL), "-d"], env=env, check=True, timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pid_file = pipe_dir / "nvidia-cuda-mps-control.pid"
        ready = pid_file.exists() and pid_file.read_text().strip()
        if ready and query(pipe_dir, "get_server_list", env).returncode == 0:
            return int(pid_file.read_text())
        time.sleep(0.05)
    raise AssertionError(f"fake daemon in {pipe_dir} never answered")


def query(pipe_dir: Path, command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = dict(env, CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir))
    return subprocess.run([str(CONTROL)], input=command + "\n", check=False, text=True, capture_output=True,
                          env=env, timeout=10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def kill_quietly(pid: int | None) -> None:
    if pid and alive(pid):
        os.kill(pid, 9)
