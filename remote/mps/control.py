"""Talk to `nvidia-cuda-mps-control`: find it, query it, start a private daemon, stop only our own.

Every query goes through the control binary on stdin (`echo CMD | nvidia-cuda-mps-control`), the
documented form (docs/mps.md). Liveness is never read off files alone: a pipe directory
outlives its daemon, so "live" means a pid file whose PID is a running MPS process AND a pipe that
answers `get_server_list` (docs/mps.md). Standard library only: this runs on the GPU host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from remote import knobs

PID_FILE_NAME = "nvidia-cuda-mps-control.pid"  # NVIDIA MPS docs, appendix tools
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")  # what the CUDA driver uses when the env var is unset
DEFAULT_LOG_DIR = Path("/var/log/nvidia-mps")
CONTROL_NAME = "nvidia-cuda-mps-control"
# AF_UNIX paths hold 107 bytes; the daemon puts `control_privileged` (18) in the pipe dir, and a
# too-long path only shows up as "Cannot find MPS control daemon process" (docs/mps.md), so stay well under.
PIPE_DIR_MAX_BYTES = 80
_FALLBACK_BINARIES = ("/usr/local/nvidia/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-control")
_NEW_SERVER_RE = re.compile(r"Starting new server (\d+)")
_VERSION_RE = re.compile(r"CUDA MPS Control binary version:\s*(\S+)")


class MpsError(RuntimeError):
    """MPS could not be started, reached or stopped as required; the message names the step."""


class ForeignDaemonError(MpsError):
    """A daemon we do not own is present (or configured) and the policy refuses it."""


@dataclass(frozen=True)
class ControlResult:
    command: str
    rc: int | None  # None: the control client did not finish within its timeout
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def describe(self) -> str:
        status = "timed out" if self.rc is None else f"rc={self.rc}"
        text = (self.out + self.err).strip().replace("\n", " | ")
        return f"`{self.command}` {status}: {text[:300] or '(no output)'}"


def find_control_binary(explicit: str | None = None) -> Path:
    """The control binary: --control-binary, then $VH_MPS_CONTROL_BIN, then PATH, then driver dirs."""
    for cand in (explicit, knobs.mps().control_bin, shutil.which(CONTROL_NAME)):
        if cand:
            path = Path(cand)
            if path.is_file() and os.access(path, os.X_OK):
                return path.resolve()
            raise MpsError(f"control binary {cand} is not an executable file")
    for cand in _FALLBACK_BINARIES:
        if os.access(cand, os.X_OK):
            return Path(cand)
    raise MpsError(f"{CONTROL_NAME} not found on PATH nor in {', '.join(_FALLBACK_BINARIES)}")


def control(binary: Path, pipe_dir: Path, command: str, timeout_s: float = 5.0) -> ControlResult:
    """Send one command to the daemon listening in `pipe_dir`, as `echo CMD | binary` does."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir))
    try:
        proc = subprocess.run(
            [str(binary)], input=command + "\n", check=False, capture_output=True, text=True, env=env, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        return ControlResult(command, None, _text(exc.stdout), _text(exc.stderr))
    return ControlResult(command, proc.returncode, proc.stdout, proc.stderr)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def parse_pids(text: str) -> list[int]:
    return [int(tok) for tok in text.split() if tok.isdigit()]


# ---- processes -------------------------------------------------------------------------------


def pid_alive(pid: int | None) -> bool:
    """True while `pid` runs; a zombie counts as gone (containers often lack a reaping init)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_mps_process(pid: int | None) -> bool:
    """Guard before any signal: we only ever signal MPS daemons/servers, never a reused PID."""
    return pid is not None and pid > 0 and pid_alive(pid) and "nvidia-cuda-mps" in proc_cmdline(pid)


def read_pid_file(pipe_dir: Path) -> int | None:
    try:
        text = (pipe_dir / PID_FILE_NAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def find_daemon_by_environ(pipe_dir: Path) -> int | None:
    """Fallback when the pid file is missing (its name is documented, not guaranteed across drivers):
    the control process whose environment names our private pipe directory."""
    needle = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or CONTROL_NAME not in proc_cmdline(int(entry.name)):
            continue
        try:
            if needle in (entry / "environ").read_bytes() + b"\0":
                return int(entry.name)
        except OSError:
            continue
    return None


def wait_gone(pids: list[int], timeout_s: float, alive_if: Callable[[int], bool] = pid_alive) -> list[int]:
    """Wait until no PID satisfies `alive_if`; return those that still do at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if alive_if(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


# ---- the daemon ------------------------------------------------------------------------------


@dataclass
class Daemon:
    """One control daemon and its pipe directory. `owned` is False for a daemon we only use."""

    binary: Path
    pipe_dir: Path
    log_dir: Path | None
    owned: bool
    daemon_pid: int | None = None
    foreign_source: str | None = None  # "env" | "default" for an external daemon
    readiness: list[str] = field(default_factory=list)

    def query(self, command: str, timeout_s: float = 5.0) -> ControlResult:
        return control(self.binary, self.pipe_dir, command, timeout_s)

    def env(self) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir)}
        if self.log_dir is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        return env

    def server_pids(self) -> list[int]:
        """Servers the daemon reports now, plus every server its control.log says it started."""
        pids: list[int] = []
        result = self.query("get_server_list")
        if result.ok:
            pids += parse_pids(result.out)
        pids += [int(m) for m in _NEW_SERVER_RE.findall(self.control_log_text())]
        return sorted(set(pids))

    def client_pids(self, server_pid: int) -> list[int]:
        result = self.query(f"get_client_list {server_pid}")
        return parse_pids(result.out) if result.ok else []

    def control_log_text(self) -> str:
        log_dir = self.log_dir or DEFAULT_LOG_DIR
        try:
            return (log_dir / "control.log").read_text(errors="replace")
        except OSError:
            return ""

    def binary_version(self) -> str | None:
        found = _VERSION_RE.findall(self.control_log_text())
        return found[-1] if found else None


def daemon_answers(binary: Path, pipe_dir: Path, timeout_s: float = 3.0) -> ControlResult | None:
    """The `get_server_list` reply if a daemon answers in `pipe_dir`, else None."""
    if not pipe_dir.is_dir():
        return None
    result = control(binary, pipe_dir, "get_server_list", timeout_s)
    return result if result.ok else None


def make_private_dirs(base_dir: Path, log_dir: Path | None) -> tuple[Path, Path]:
    """A fresh 0700 pipe directory with a short path, and the log directory (kept after stop)."""
    pipe_dir = Path(tempfile.mkdtemp(prefix="vhmps-", dir=base_dir))  # mkdtemp creates it 0700
    if len(os.fsencode(pipe_dir)) > PIPE_DIR_MAX_BYTES:
        pipe_dir.rmdir()
        raise MpsError(
            f"pipe directory {pipe_dir} is longer than {PIPE_DIR_MAX_BYTES} bytes; the daemon's unix "
            "sockets would not fit (AF_UNIX 107 bytes): pass a shorter --base-dir"
        )
    if log_dir is None:
        log_dir = Path(tempfile.mkdtemp(prefix="vhmps-log-", dir=base_dir))
    log_dir.mkdir(parents=True, exist_ok=True)
    return pipe_dir, log_dir.resolve()


def launch_daemon(binary: Path, pipe_dir: Path, log_dir: Path, timeout_s: float = 15.0) -> None:
    """Run `binary -d` and wait for it to return (it forks the daemon and exits)."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(log_dir))
    # A CUDA_VISIBLE_DEVICES seen by the daemon makes the server renumber devices, and clients
    # keeping the same list then break (docs/mps.md): the daemon sees every GPU, clients pick their own.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out_path = log_dir / "control-d.out"
    # Output goes to a file, not a pipe: a daemon that kept an inherited pipe open would hang us.
    with out_path.open("ab") as out:
        try:
            proc = subprocess.run(
                [str(binary), "-d"], check=False, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                timeout=timeout_s, start_new_session=True,
            )
        except subprocess.TimeoutExpired as exc:
            raise MpsError(f"`{binary} -d` did not return within {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        text = out_path.read_text(errors="replace").strip()[-400:]
        raise MpsError(f"`{binary} -d` exited {proc.returncode}: {text or '(no output)'}")


def wait_ready(daemon: Daemon, timeout_s: float) -> None:
    """Ready = pid file names a live MPS process AND the pipe answers `get_server_list`."""
    start = time.monotonic()
    deadline = start + timeout_s
    missing = "pid file absent"
    while time.monotonic() < deadline:
        pid, how = read_pid_file(daemon.pipe_dir), "pid file"
        if pid is None and time.monotonic() - start > 1.0:
            pid, how = find_daemon_by_environ(daemon.pipe_dir), "/proc environ (no pid file)"
        if pid is None:
            missing = f"pid file {daemon.pipe_dir / PID_FILE_NAME} absent"
        elif not is_mps_process(pid):
            missing = f"pid file names PID {pid}, which is not a live MPS process"
        else:
            result = daemon.query("get_server_list", timeout_s=max(0.5, deadline - time.monotonic()))
            if result.ok:
                daemon.daemon_pid = pid
                daemon.readiness = [f"daemon PID {pid} (from {how}) alive", result.describe()]
                return
            missing = f"pipe not answering: {result.describe()}"
        time.sleep(0.05)
    raise MpsError(f"MPS daemon not ready after {timeout_s:.1f} s: {missing}")


def apply_defaults(daemon: Daemon, thread_pct: int | None) -> float | None:
    """Set defaults before the first client (they bind servers started later), read them back."""
    if thread_pct is not None:
        result = daemon.query(f"set_default_active_thread_percentage {thread_pct}")
        if not result.ok:
            raise MpsError(f"cannot set the default active thread percentage: {result.describe()}")
    result = daemon.query("get_default_active_thread_percentage")
    try:
        return float(result.out.split()[0]) if result.ok else None
    except (IndexError, ValueError):
        return None
