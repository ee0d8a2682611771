"""A simulated host's "container": a private HOME directory, the Vast environment, and its processes.

Every command runs as `bash -c CMD` in its own process group (start_new_session) with HOME = cwd = the
sandbox, so destroy can end it with SIGTERM, then SIGKILL after a grace period. The onstart sees the
container's whole environment (Vast's variables and the create-time `env`); an SSH session sees only what
sshd gives it, as on Vast, where create-time variables are not visible in SSH sessions unless exported to
/etc/environment (docs: docker-environment). Each process also
carries a per-sandbox marker variable, so a child that escaped into its own session (setsid) is still
found through /proc and ended. The environment is built from an allowlist: the simulator's own
environment may hold an API key, and nothing of it must reach the host.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MARKER_VAR = "VAST_SIM_SANDBOX"
KILL_GRACE_S = 1.0
# Host variables passed through: locale, temp dir, and what a GPU program needs to find the GPU.
_PASS_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "TORCH_")
_PASS_NAMES = frozenset({"LANG", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "TERM"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SandboxClosed(RuntimeError):
    """The host was destroyed or went offline; nothing more may start in it."""


def container_env(home: Path, marker: str, vast_vars: dict[str, str],
                  user_env: list[list[str]]) -> dict[str, str]:
    """The environment of a process on the host: allowlisted host vars, Vast's vars, the create `env`."""
    env = {k: v for k, v in os.environ.items() if k in _PASS_NAMES or k.startswith(_PASS_PREFIXES)}
    # python/python3 must resolve to the interpreter running the simulator (it has torch for the
    # tiny CPU workload), so its directory goes first.
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{path}", HOME=str(home), PWD=str(home),
               SHELL="/bin/bash", USER="root", LOGNAME="root")
    for key, value in user_env:
        if _ENV_NAME.match(key):  # docker flags such as "-p 8000:8000" are not variables
            env[key] = value
    env.update(vast_vars)
    env[MARKER_VAR] = marker
    return env


def ssh_session_env(home: Path, marker: str) -> dict[str, str]:
    """An SSH session's environment: sshd's login variables and the image's PATH, nothing from create."""
    return container_env(home, marker, {}, [])


class Sandbox:
    def __init__(self, home: Path, env: dict[str, str], ssh_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.env = env
        self.ssh_env = ssh_env if ssh_env is not None else env
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self.closed = False
        (home / ".ssh").mkdir(parents=True, exist_ok=True)

    def spawn(self, command: str, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = subprocess.PIPE, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `bash -c command` in its own process group; SandboxClosed once the host is gone."""
        with self._lock:
            if self.closed:
                raise SandboxClosed(f"host {self.home.name} is gone")
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.home, env=env or self.env, stdin=stdin,
                                    stdout=stdout, stderr=stderr, start_new_session=True)
            self._procs = [p for p in self._procs if p.poll() is None] + [proc]
            return proc

    def start_onstart(self, script: str) -> subprocess.Popen[bytes]:
        """Run the instance's onstart in the background, logging to $HOME/onstart.log (as Vast does)."""
        log: IO[bytes]
        with (self.home / "onstart.log").open("ab") as log:
            return self.spawn(script, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def authorized_key_blobs(self) -> set[str]:
        """Base64 blobs of the keys in $HOME/.ssh/authorized_keys (options and comments ignored)."""
        path = self.home / ".ssh" / "authorized_keys"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return set()
        blobs = set()
        for line in text.splitlines():
            tokens = line.split()
            for i, token in enumerate(tokens[:-1]):
                if token.startswith(("ssh-", "ecdsa-", "sk-")):
                    blobs.add(tokens[i + 1])
                    break
        return blobs

    def live_pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]

    def close(self, grace_s: float = KILL_GRACE_S) -> None:
        """Refuse new processes, then end every process of this host: SIGTERM, grace, SIGKILL."""
        with self._lock:
            self.closed = True
            procs = list(self._procs)
        groups = {p.pid for p in procs if p.poll() is None} | set(_marked_pids(self.env[MARKER_VAR]))
        _signal_all(groups, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (any(p.poll() is None for p in procs)
                                               or _marked_pids(self.env[MARKER_VAR])):
            time.sleep(0.02)
        _signal_all(groups | set(_marked_pids(self.env[MARKER_VAR])), signal.SIGKILL)
        for proc in procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass  # unkillable (D state); nothing more a user-space host could do

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def _signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        for send in (os.killpg, os.kill):  # the group first; a lone escaped process by pid
            try:
                send(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def marker_for(instance_id: int, token: int) -> str:
    """A sandbox's marker: the simulator's own pid first, so a later simulator can tell a dead one's hosts."""
    return f"{os.getpid()}-{instance_id}-{token}"


def reap_orphans() -> list[int]:
    """End the host processes of simulators that died without closing them (kill -9 of a standalone `sim`):
    a host's dead-man switch retries its DELETE for ever against an API that is gone. A process is an orphan
    when its marker names a simulator pid that no longer runs; a live simulator's hosts are left alone.
    Returns the pids signalled (Linux /proc; nothing elsewhere)."""
    found = []
    for pid, marker in _markers():
        owner = marker.split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            found.append(pid)
    _signal_all(set(found), signal.SIGKILL)
    return found


def _marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries this sandbox's marker (Linux /proc; empty elsewhere)."""
    return [pid for pid, found in _markers() if found == marker]


def _markers() -> Iterator[tuple[int, str]]:
    """(pid, sandbox marker) of every live process that carries one (Linux /proc; nothing elsewhere)."""
    needle = f"{MARKER_VAR}=".encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        marker = next((v[len(needle):].decode(errors="replace") for v in env if v.startswith(needle)), None)
        if marker is not None and _alive(int(entry)):
            yield int(entry), marker


def _alive(pid: int) -> bool:
    """False for zombies, which still show their environment until reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
