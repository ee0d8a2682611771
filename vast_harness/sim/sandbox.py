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

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MARKER_VAR = "VAST_SIM_SANDBOX"
ROOT_PREFIX = "vast-sim-hosts-"  # a simulator's own sandbox root in the temp dir
OWNER_LOCK = ".simulator.lock"  # in a root: locked by its simulator while it runs
KILL_GRACE_S = 1.0
# Host variables passed through: locale, and what a GPU program needs to find the GPU (TMPDIR is the sandbox's).
_PASS_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "TORCH_")
_PASS_NAMES = frozenset({"LANG", "TZ", "LD_LIBRARY_PATH", "TERM"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SandboxClosed(RuntimeError):
    """The host was destroyed or went offline; nothing more may start in it."""


def container_env(home: Path, marker: str, vast_vars: dict[str, str], user_env: list[list[str]],
                  image_env: dict[str, str]) -> dict[str, str]:
    """The environment of a process on the host: allowlisted host vars, the image's (its own Python, PATH,
    directories inside the sandbox: sim/hostpython.py), Vast's vars, the create `env`."""
    env = {k: v for k, v in os.environ.items() if k in _PASS_NAMES or k.startswith(_PASS_PREFIXES)}
    env.update(image_env)
    env.update(HOME=str(home), PWD=str(home), SHELL="/bin/bash", USER="root", LOGNAME="root")
    for key, value in user_env:
        if _ENV_NAME.match(key):  # docker flags such as "-p 8000:8000" are not variables
            env[key] = value
    env.update(vast_vars)
    env[MARKER_VAR] = marker
    return env


def ssh_session_env(home: Path, marker: str, image_env: dict[str, str]) -> dict[str, str]:
    """An SSH session's environment: sshd's login variables and the image's, nothing from create."""
    return container_env(home, marker, {}, [], image_env)


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


class OwnedRoot:
    """The directory in the temp dir that holds a simulator's sandboxes, marked as that simulator's for as long
    as it runs: a lock file it holds locked (flock), which the kernel releases when the process ends, `kill -9`
    included. A later simulator or `vast-e2e reap` removes a root whose lock it can take (`reap_dead_roots`)."""

    def __init__(self, parent: Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX, dir=parent))
        pending = self.path / f"{OWNER_LOCK}.new"
        self._fd: int | None = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(self._fd, f"{os.getpid()}\n".encode())
        os.rename(pending, self.path / OWNER_LOCK)  # named once locked: no reaper ever takes a root being made

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class DeadSimulators:
    """What simulators that died without cleaning up (`kill -9`) left, and was removed: their hosts'
    processes (pids) and their sandbox roots (the bundle and the unpacked workdir of each host)."""

    pids: list[int]
    roots: list[Path]
    bytes_removed: int

    def line(self) -> str | None:
        """One line for the user, None when nothing was left."""
        if not self.pids and not self.roots:
            return None
        return (f"removed what {len(self.roots)} dead simulator(s) left: {len(self.roots)} sandbox dir(s) "
                f"({self.bytes_removed / 1e6:.1f} MB) in {tempfile.gettempdir()}, {len(self.pids)} host process(es)")


def reap_dead_simulators(parent: Path | None = None) -> DeadSimulators:
    """End the host processes of dead simulators, then remove their sandbox roots (the processes first: they
    work in those directories)."""
    pids = reap_orphans()
    roots = reap_dead_roots(parent)
    return DeadSimulators(pids=pids, roots=[path for path, _ in roots], bytes_removed=sum(n for _, n in roots))


def reap_dead_roots(parent: Path | None = None) -> list[tuple[Path, int]]:
    """Remove the sandbox roots in `parent` (the temp dir) whose simulator no longer runs: a root whose owner
    lock this process can take. A root without one (being made, or not a simulator's) and another user's are
    left alone. Returns each root removed with its size in bytes."""
    removed = []
    for entry in Path(parent or tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"):
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
            fd = os.open(entry / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: its simulator runs
        try:
            size = _tree_bytes(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append((entry, size))
        finally:
            os.close(fd)
    return removed


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


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
