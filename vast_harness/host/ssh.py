"""SSH to a rented host: a one-time run key, connect with retries, streamed commands, SFTP.

A fresh Vast host has no known host key, so unknown keys are accepted and their SHA256 fingerprint is
recorded for the evidence instead. Vast publishes two endpoints per instance, a direct port on the
host's public IP and a proxy gateway (`ssh_host:ssh_port`); sources disagree on which is more reliable
(docs/vast-behaviours.md), so `connect` tries direct first, proxy second, round after round until a
monotonic deadline. Auth failures are retried too: Vast's banner says "if authentication fails, try
again after a few seconds" while the onstart is still installing the key.

A command that loses its connection is reported (`connection_lost`), never silently re-run: a workload
step is not idempotent and a second run could double its cost.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import fnmatch
import logging
import os
import re
import shlex
import socket
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Self, TypeVar

import paramiko
import tenacity
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel

from vast_harness.clock import now_s
from vast_harness.errors import LocalDiskRefused, SshConnectError, SshTransferError, TransferAbandoned
from vast_harness.host.sftp_read import read_whole
from vast_harness.records import ConnectAttempt, SshEndpoint, StepOutcome
from vast_harness.timings import TeardownBudget
from vast_harness.vast.answer_bound import AnswerBound
from vast_harness.vast.models import Instance

# paramiko logs a failed handshake ("Error reading SSH protocol banner") with its traceback at ERROR; with
# no handler configured, Python's last-resort handler prints that to stderr. Failures reach the user as our
# own typed errors instead, so its records stay out of the console.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

RUN_KEY_COMMENT = "vh-run"
# A run's one-time key lives in a temp dir named `vh-key-<pid>-<run id>-<random>`: the pid lets `reap` tell a
# killed run's key from a live run's. Made (run_key_dir_prefix) and read (run_key_dir_pid) here only.
RUN_KEY_DIR_GLOB = "vh-key-*"
_RUN_KEY_DIR_PID = re.compile(r"^vh-key-(\d+)-")
KEEPALIVE_INTERVAL_S = 15
_RECV_CHUNK_BYTES = 32768
# A flooding command never lets `recv_ready` go false: read at most this much per turn, then look at the clock.
_DRAIN_TURN_BYTES = 1 << 20
# After the exit status, output still on its way is read until the channel's EOF, for at most this long: a
# background process the command started (a server, a daemon) may hold stdout open for ever, and the step ends
# on its command's exit status, not on that process (OpenSSH's sshd sends the status when the command exits).
EXIT_DRAIN_S = 2.0
_BUFFERED_READ_S = 5.0  # reading what is already here once the EOF came (at most the channel's window, 2 MiB)
# An abandoned transfer's worker gets this long to notice its closed link before we stop waiting for it.
_ABANDON_JOIN_S = 2.0
_POLL_INTERVAL_S = 0.1
_MAX_TREE_DEPTH = 16
# A progress bar redrawn with \r never ends its line: past this many characters, emit what we have.
_MAX_LINE_CHARS = 65536
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a failed connect attempt may raise; anything else is a bug and propagates.
_CONNECT_ERRORS = (paramiko.SSHException, OSError, EOFError)
_LOCAL_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}

LineCallback = Callable[[str, str], None]
_T = TypeVar("_T")


class TreePull(BaseModel):
    """What `pull_tree` brought back, and what it left behind (over the size budget) and why it stopped."""

    files: list[str] = []
    skipped: list[str] = []
    bytes: int = 0
    complete: bool = True
    detail: str = ""
    # When the pull is cut (deadline, abandon, link lost): the file being copied, then the files and folders
    # already listed but not reached. Folders not yet listed are not known, so "and more" may apply.
    left: list[str] = []
    # A host's file name with control characters is saved under an escaped name (remote -> local here):
    # written as sent, `ls` or `cat manifest.sha256` of the evidence would play it to the user's terminal.
    renamed: dict[str, str] = {}
    symlink: str = ""  # the root (or a folder on the way to it) was a symlink on the host: nothing pulled
    _current: str = ""
    _listed: list[str] = []
    _taken: set[str] = set()

    def local_name(self, rel: PurePosixPath, mask: Callable[[str], str] | None = None) -> str:
        """Where `rel` (the host's relative path) goes locally: as is when every character is printable,
        else escaped (`\\x1b`); with `mask`, a secret in it masked; a name already taken in this pull (two
        names that differ only in a secret's value mask alike) gets `~` appended, so each keeps its own."""
        remote = rel.as_posix()
        escaped = "/".join(_UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", part) for part in rel.parts)
        local = mask(escaped) if mask is not None else escaped
        while local in self._taken:
            local += "~"
        self._taken.add(local)
        if escaped != remote and local == escaped:  # a masked name is the record's `redacted`, never its value
            self.renamed[remote] = local
        return local


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 (0x9b is an 8-bit CSI)


class _OverBudget(Exception):
    """Raised inside an SFTP progress callback to stop a file that grew past the size budget."""


class RunKey:
    """A one-time ed25519 key: the private half lives only in a 0600 file inside a 0700 temp dir."""

    def __init__(self, path: Path, public_openssh: str) -> None:
        self.path = path
        self.public_openssh = public_openssh

    def __repr__(self) -> str:  # never the private key
        return f"RunKey(path={str(self.path)!r}, public={self.public_openssh[:40]!r}...)"

    def load(self) -> paramiko.Ed25519Key:
        return paramiko.Ed25519Key.from_private_key_file(str(self.path))

    def delete(self) -> None:
        """Overwrite the private key file, unlink it, remove its directory. Safe to call twice."""
        try:
            size = self.path.stat().st_size
            with open(self.path, "r+b", buffering=0) as fh:
                fh.write(b"\0" * size)
                os.fsync(fh.fileno())
            self.path.unlink()
        except FileNotFoundError:
            pass
        try:
            self.path.parent.rmdir()
        except OSError:
            pass  # gone already, or someone put other files there: leave them

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


def run_key_dir_prefix(run_id: str, pid: int | None = None) -> str:
    """Prefix of run `run_id`'s one-time key directory (the temp dir adds a random tail); pid: this process's."""
    return f"vh-key-{os.getpid() if pid is None else pid}-{run_id}-"


def run_key_dir_pid(name: str) -> int | None:
    """The pid of the run whose key directory is named `name`; None for a name without one (older runs')."""
    found = _RUN_KEY_DIR_PID.match(name)
    return int(found.group(1)) if found else None


def generate_run_key(dirpath: Path | None = None) -> RunKey:
    """Make a fresh ed25519 key in a new 0700 directory under `dirpath` (default: the system temp)."""
    keydir = Path(tempfile.mkdtemp(prefix="vh-key-", dir=dirpath))  # mkdtemp creates it 0700
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path = keydir / "id_ed25519"
    # O_EXCL|O_NOFOLLOW: never write through a planted file or link; 0600 from creation on, not chmod'ed.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return RunKey(path, f"{public.decode('ascii')} {RUN_KEY_COMMENT}")


def load_run_key(path: Path) -> RunKey:
    """A one-time key made before (a kept host's, under its hold's 0700 key dir), its public half derived."""
    private = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return RunKey(path, f"{public.decode('ascii')} {RUN_KEY_COMMENT}")


def endpoints_for(instance: Instance) -> list[SshEndpoint]:
    """The instance's SSH endpoints in the order to try them: direct first, proxy second."""
    found: list[SshEndpoint] = []
    if instance.direct_ssh:
        found.append(SshEndpoint(host=instance.direct_ssh[0], port=instance.direct_ssh[1], kind="direct"))
    if instance.proxy_ssh:
        found.append(SshEndpoint(host=instance.proxy_ssh[0], port=instance.proxy_ssh[1], kind="proxy"))
    return found


def shell_with_env(command: str, env: dict[str, str] | None) -> str:
    """Prefix `export K=V;` (values shell-quoted): sshd usually refuses the `env` request."""
    if not env:
        return command
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"remote env name {name!r} is not a valid shell variable name")
    exports = " ".join(f"export {k}={shlex.quote(str(v))};" for k, v in env.items())
    return f"{exports} {command}"


class _AcceptUnknownHostKey(paramiko.MissingHostKeyPolicy):
    """A fresh rented host has no known key: accept it. HostSession records the key the transport saw."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        return None


class _RoundFailed(Exception):
    """Every endpoint failed this round; tenacity waits and tries again."""


def _open_client(
    endpoint: SshEndpoint, pkey: paramiko.PKey, user: str, timeout_s: float
) -> paramiko.SSHClient:
    """One connect attempt, bounded as a whole by `timeout_s`: paramiko's own timeouts bound each phase (TCP,
    banner, key exchange, auth) separately, so at the deadline a timer shuts the socket down under whichever
    phase is waiting."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_AcceptUnknownHostKey())
    bound = AnswerBound(timeout_s)
    try:
        with bound:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
            bound.attach(sock)
            try:
                client.connect(
                    endpoint.host,
                    port=endpoint.port,
                    username=user,
                    pkey=pkey,
                    sock=sock,
                    timeout=timeout_s,
                    banner_timeout=timeout_s,
                    auth_timeout=timeout_s,
                    channel_timeout=timeout_s,
                    look_for_keys=False,
                    allow_agent=False,
                )
            except BaseException:
                sock.close()  # connect() closes only the transports it made; this socket is ours
                raise
        if bound.fired:  # cut just as the connect returned: the socket is dead
            raise TimeoutError(f"no SSH session within {timeout_s:.3g} s")
    except _CONNECT_ERRORS as exc:
        client.close()
        if bound.fired:
            raise TimeoutError(f"no SSH session within {timeout_s:.3g} s (it was at: {_describe(exc)})") from exc
        raise
    except BaseException:
        client.close()
        raise
    transport = client.get_transport()
    assert transport is not None  # connect() returned, so a transport exists
    transport.set_keepalive(KEEPALIVE_INTERVAL_S)
    return client


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Wake(threading.Event):
    """Set by the channel's two buffers when bytes or EOF arrive (paramiko's `BufferedPipe.set_event`); their
    clear() is ignored, the pump clears it itself before each drain.

    Why not select() on `channel.fileno()`: paramiko backs that with an os.pipe that `channel.close()` closes
    while the transport thread may still be signalling it on arriving bytes. The write to the closed pipe
    fails with EBADF inside the transport thread and kills the transport: a command that timed out while
    writing (a flood) took the whole SSH session with it, so the evidence pull after it found no link."""

    def clear(self) -> None:
        pass  # the buffers' "now empty"; ignored (see above)

    def rearm(self) -> None:
        super().clear()


class _LineSplitter:
    """Bytes in, whole lines out; decodes UTF-8 incrementally so a split character is not mangled."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> list[str]:
        self._pending += self._decoder.decode(data)
        *lines, self._pending = self._pending.split("\n")
        while len(self._pending) > _MAX_LINE_CHARS:
            lines.append(self._pending[:_MAX_LINE_CHARS])
            self._pending = self._pending[_MAX_LINE_CHARS:]
        return [line.removesuffix("\r") for line in lines]

    @property
    def pending(self) -> str:
        """The line not yet ended: a progress bar redrawn with `\\r` lives here until it finishes."""
        return self._pending

    def flush(self) -> list[str]:
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return [rest.removesuffix("\r")] if rest else []


class HostSession:
    """One connected host. Use `connect`; close with `close()` or a `with` block."""

    stall_timeout_s: float = 30.0  # an SFTP channel silent this long is a dead link

    def __init__(
        self,
        client: paramiko.SSHClient,
        endpoint: SshEndpoint,
        pkey: paramiko.PKey,
        user: str,
        attempt_timeout_s: float,
        clock: Callable[[], float] = now_s,
    ) -> None:
        self.clock = clock  # the run's monotonic clock: every deadline given to this session is on it
        self._client = client
        self._pkey = pkey
        self._user = user
        self._attempt_timeout_s = attempt_timeout_s
        self._sftp: paramiko.SFTPClient | None = None
        self.endpoint = endpoint
        server_key = self._transport.get_remote_server_key()
        self.host_key_type: str = server_key.get_name()
        self.host_key_fingerprint: str = server_key.fingerprint  # "SHA256:<base64>", as ssh-keygen -l
        self.host_key_base64: str = server_key.get_base64()  # a known_hosts line's key (a kept host's `ssh`)

    @classmethod
    def connect(
        cls,
        endpoints: list[SshEndpoint],
        key: RunKey,
        *,
        user: str = "root",
        deadline_monotonic: float,
        attempt_timeout_s: float = 10.0,
        retry_wait_s: float = 2.0,
        on_attempt: Callable[[ConnectAttempt], None] | None = None,
        clock: Callable[[], float] = now_s,
    ) -> HostSession:
        """Try each endpoint in order, round after round, until one accepts the key or time is up."""
        if not endpoints:
            raise SshConnectError("no SSH endpoint to try", attempts=[])
        pkey = key.load()
        attempts: list[ConnectAttempt] = []

        def one_round() -> HostSession:
            for endpoint in endpoints:
                remaining_s = deadline_monotonic - clock()
                if remaining_s < TeardownBudget.CONNECT_ATTEMPT_MIN_S:
                    break
                started = clock()
                try:
                    client = _open_client(endpoint, pkey, user, min(attempt_timeout_s, remaining_s))
                except _CONNECT_ERRORS as exc:
                    outcome, client = _describe(exc), None
                else:
                    outcome = "connected"
                attempt = ConnectAttempt(
                    number=len(attempts) + 1,
                    endpoint=endpoint,
                    ok=client is not None,
                    outcome=outcome,
                    seconds=round(clock() - started, 3),
                )
                attempts.append(attempt)
                if on_attempt is not None:
                    on_attempt(attempt)
                if client is not None:
                    return cls(client, endpoint, pkey, user, attempt_timeout_s, clock)
            raise _RoundFailed

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_RoundFailed),
            stop=lambda _state: deadline_monotonic - clock() < TeardownBudget.CONNECT_ATTEMPT_MIN_S,
            wait=lambda _state: max(0.0, min(retry_wait_s, deadline_monotonic - clock() - TeardownBudget.CONNECT_ATTEMPT_MIN_S)),
            reraise=True,
        )
        try:
            return retrying(one_round)
        except _RoundFailed:
            names = ", ".join(str(e) for e in endpoints)
            raise SshConnectError(
                f"could not open an SSH session as {user!r} to {names} before the deadline "
                f"({len(attempts)} attempts)",
                attempts=attempts,
            ) from None

    @property
    def _transport(self) -> paramiko.Transport:
        transport = self._client.get_transport()
        if transport is None:
            raise paramiko.SSHException("session is closed")
        return transport

    def is_active(self) -> bool:
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def run(
        self, command: str, *, on_line: LineCallback, timeout_s: float, env: dict[str, str] | None = None,
        stop: threading.Event | None = None, on_partial: LineCallback | None = None,
    ) -> StepOutcome:
        """Run `command`, streaming each stdout/stderr line to `on_line(stream, line)` as it arrives.
        `stop`, when set by another thread, ends the wait like the timeout does (the channel is closed).
        `on_partial(stream, text)`: after each read, the line not yet ended (a `\\r`-redrawn progress bar)."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        full_command = shell_with_env(command, env)
        started = self.clock()
        start_limit_s = min(self._attempt_timeout_s, timeout_s)

        def start() -> paramiko.Channel:
            chan = self._transport.open_session(timeout=start_limit_s)
            try:
                chan.exec_command(full_command)  # waits for the host's answer with no timeout of its own
            except paramiko.SSHException:
                # A host may end a short command before it answers the request (paramiko's server does, when
                # the command runs on its own thread): the exit status came first, the output is in the
                # channel, and the command ran. Without a status, it may not have: a failure to start.
                if not chan.status_event.is_set():
                    raise
            return chan

        try:
            # In a worker with a deadline: on a stalled link (TCP open, no bytes) exec_command never returns.
            channel = self.bounded("starting a command", start, deadline=started + start_limit_s)
        except (*_CONNECT_ERRORS, SshTransferError) as exc:
            # Deliberately not the command text: it may carry --remote-env values.
            return StepOutcome(
                rc=None,
                seconds=self.clock() - started,
                connection_lost=not self.is_active(),
                detail=f"could not start the command: {_describe(exc)}",
            )
        try:
            return self._pump(channel, on_line, started, started + timeout_s, stop, on_partial)
        finally:
            # Closing writes to the link: one that died just now must not replace the outcome with an
            # exception (the next command, or is_active(), sees the dead link).
            with contextlib.suppress(*_CONNECT_ERRORS):
                channel.close()

    def _pump(
        self, channel: paramiko.Channel, on_line: LineCallback, started: float, deadline: float,
        stop: threading.Event | None = None, on_partial: LineCallback | None = None,
    ) -> StepOutcome:
        splitters = {"stdout": _LineSplitter(), "stderr": _LineSplitter()}
        wake = _Wake()
        channel.in_buffer.set_event(wake)
        channel.in_stderr_buffer.set_event(wake)

        link_lost = [False]

        def drain(budget: float = _DRAIN_TURN_BYTES, until: float = deadline) -> bool:
            """True when both buffers were emptied (False: the byte budget, `until` or `stop` cut the turn)."""
            # Read both buffers every turn: a full stderr window must never stall stdout (or vice versa).
            # Bounded by bytes, by time and by `stop`: a command that floods must not keep us here past any.
            while budget > 0 and self.clock() < until and not (stop is not None and stop.is_set()):
                got = 0
                try:  # recv also sends the window adjust: on a link that just died paramiko raises from it
                    if channel.recv_ready():
                        data = channel.recv(_RECV_CHUNK_BYTES)
                        got += len(data)
                        for line in splitters["stdout"].feed(data):
                            on_line("stdout", line)
                        if on_partial is not None and splitters["stdout"].pending:
                            on_partial("stdout", splitters["stdout"].pending)
                    if channel.recv_stderr_ready():
                        data = channel.recv_stderr(_RECV_CHUNK_BYTES)
                        got += len(data)
                        for line in splitters["stderr"].feed(data):
                            on_line("stderr", line)
                        if on_partial is not None and splitters["stderr"].pending:
                            on_partial("stderr", splitters["stderr"].pending)
                except _CONNECT_ERRORS:
                    link_lost[0] = True
                    return True  # nothing more will come
                if not got:
                    return True
                budget -= got
            return False

        def drain_to_eof() -> str:
            """After the exit status: the output still on its way, read until the channel's EOF ("" once read
            whole) or for EXIT_DRAIN_S at most ("open": something the command left running holds the output)."""
            until = self.clock() + EXIT_DRAIN_S
            while True:
                wake.rearm()
                if channel.eof_received or channel.closed:  # nothing more comes: what is here is read whole
                    emptied = drain(budget=float("inf"), until=self.clock() + _BUFFERED_READ_S)
                    return "" if emptied or link_lost[0] else "unread"
                drain(budget=float("inf"), until=until)
                now = self.clock()
                if link_lost[0] or (stop is not None and stop.is_set()):
                    return ""  # lost or stopped: nothing is claimed about what the command left running
                if now >= until:
                    return "open"
                wake.wait(min(_POLL_INTERVAL_S, until - now))

        def flush() -> None:
            for stream, splitter in splitters.items():
                for line in splitter.flush():
                    on_line(stream, line)

        unread = ""
        left_open = False
        while True:
            wake.rearm()  # before the drain: bytes that arrive during it set it again
            emptied = drain()
            # status_event is set by exit-status and by channel close. The command's own output may still be on
            # its way (sshd sends the status when the command exits, then what its pipes still hold, then EOF).
            if link_lost[0] or channel.exit_status_ready():
                rest = "" if link_lost[0] else drain_to_eof()
                left_open = rest == "open"
                if link_lost[0]:
                    unread = "the link was lost while its output was still being read"
                elif rest == "unread":
                    unread = "output still arriving after the exit status was not read"
                elif left_open:
                    unread = (f"a background process it started kept its output open; not waited for past "
                              f"{EXIT_DRAIN_S:g} s (it runs on until the instance is deleted; its later output is "
                              "not read)")
                flush()
                break
            now = self.clock()
            if now >= deadline or (stop is not None and stop.is_set()):
                flush()
                return StepOutcome(
                    rc=None,
                    seconds=now - started,
                    timed_out=True,
                    detail=(f"timed out after {deadline - started:.1f} s" if now >= deadline
                            else f"stopped after {now - started:.1f} s") + "; channel closed",
                )
            if emptied:  # else bytes are already waiting
                wake.wait(min(_POLL_INTERVAL_S, deadline - now))  # exit status is seen within the poll interval
        seconds = self.clock() - started
        if channel.exit_status != -1:
            return StepOutcome(rc=channel.exit_status, seconds=seconds, detail=unread, output_left_open=left_open)
        if link_lost[0] or not self.is_active():
            return StepOutcome(
                rc=None,
                seconds=seconds,
                connection_lost=True,
                detail=f"connection to {self.endpoint} lost while the command ran",
            )
        return StepOutcome(
            rc=None, seconds=seconds, detail="channel closed without an exit status (killed by a signal?)"
        )

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self._client.open_sftp()
            # No byte for this long on the SFTP channel: the link is stalled (TCP open, peer silent).
            channel = self._sftp.get_channel()
            if channel is not None:  # open_sftp always opens one; the stub allows None
                channel.settimeout(self.stall_timeout_s)
        return self._sftp

    def _stalled(self, what: str) -> TransferAbandoned:
        self.abort()
        return TransferAbandoned(f"{what}: no byte for {self.stall_timeout_s:g} s, the link is stalled; "
                                 "it was closed")

    def put(
        self, local: Path, remote: str, *, on_progress: Callable[[int, int], None] | None = None,
        deadline: float | None = None, abandon: Callable[[], bool] | None = None,
    ) -> int:
        """Upload a file; returns the bytes written (paramiko checks the remote size matches).

        A host that drops mid-transfer raises SshTransferError (a HarnessError), never a raw paramiko error:
        the run must turn it into an exit code after teardown, not crash past it.
        With a `deadline` (monotonic) the transfer runs in a worker and is abandoned at it (TransferAbandoned).
        """

        def work() -> int:
            try:
                attrs = self._sftp_client().put(str(local), remote, callback=on_progress, confirm=True)
            except TimeoutError:
                raise self._stalled(f"upload to {remote}") from None
            except (*_CONNECT_ERRORS, paramiko.SFTPError) as exc:
                raise SshTransferError(f"upload to {remote} failed: {_describe(exc)}") from exc
            return int(attrs.st_size or 0)

        if deadline is None:
            return work()
        return self.bounded(f"upload to {remote}", work, deadline=deadline, abandon=abandon)

    def bounded(self, what: str, fn: Callable[[], _T], *, deadline: float,
                abandon: Callable[[], bool] | None = None) -> _T:
        """Run `fn` (SFTP work on this session) in a worker; at `deadline` or when `abandon()` says so, close
        the link under it and raise TransferAbandoned. The calling thread only waits in short slices, so
        signals are handled while a stalled link holds the worker."""
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread below
                box["error"] = exc

        worker = threading.Thread(target=work, daemon=True, name=f"vh-sftp {what}")
        worker.start()
        try:
            while worker.is_alive():
                now = self.clock()
                if now >= deadline or (abandon is not None and abandon()):
                    why = "its deadline passed" if now >= deadline else "it was abandoned"
                    self.abort()
                    worker.join(_ABANDON_JOIN_S)
                    raise TransferAbandoned(f"{what}: {why}; the SSH link was closed under it")
                worker.join(min(_POLL_INTERVAL_S, deadline - now))
        except BaseException:
            self.abort()  # an interrupt, too: never leave a worker writing behind our back
            raise
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    def get(self, remote: str, local: Path, *, max_bytes: float | None = None,
            on_bytes: Callable[[int], None] | None = None) -> int:
        """Download a file via a `.part` file, so a half-copied file never carries the final name.

        `max_bytes`: stop (SshTransferError) once the file grows past it; `on_bytes(n)` reports progress."""
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(local.name + ".part")
        seen = [0]

        def progress(done: int, total: int) -> None:
            if on_bytes is not None:
                on_bytes(done - seen[0])
            seen[0] = done
            if max_bytes is not None and done > max_bytes:
                raise _OverBudget(f"{remote} passed the {max_bytes:.0f}-byte budget")

        try:
            # 0600 from creation on (the host's files may be anything: a key among them), never through a link
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fd, 0o600)
                size = read_whole(self._sftp_client(), remote, fh, callback=progress)
            if partial.stat().st_size != size:
                raise SshTransferError(f"download of {remote}: {partial.stat().st_size} bytes written of {size}")
            partial.replace(local)
        except FileNotFoundError:
            raise
        except _OverBudget as exc:
            raise SshTransferError(f"download of {remote} stopped: {exc}") from exc
        except TimeoutError:
            raise self._stalled(f"download of {remote}") from None
        except OSError as exc:
            if exc.errno in _LOCAL_DISK_ERRNOS:  # paramiko maps no SFTP status to these: it is our disk
                raise LocalDiskRefused(f"download of {remote}: cannot write {local} here "
                                       f"({exc.strerror or exc})") from exc
            raise SshTransferError(f"download of {remote} failed: {_describe(exc)}") from exc
        except (paramiko.SSHException, EOFError, paramiko.SFTPError) as exc:
            raise SshTransferError(f"download of {remote} failed: {_describe(exc)}") from exc
        finally:
            partial.unlink(missing_ok=True)
        return local.stat().st_size

    def get_tree(self, remote_dir: str, local_dir: Path, pattern: str = "*") -> list[str]:
        """Pull regular files whose name matches `pattern`, recursively. Returns their relative paths."""
        return self._walk_pull(remote_dir, local_dir, pattern, TreePull(), None, None).files

    def list_files(self, remote_dir: str, *, max_files: int) -> list[tuple[str, int]]:
        """Regular files under `remote_dir` as (relative posix path, size), at most `max_files` of them and
        `_MAX_TREE_DEPTH` deep; symlinks and special files are left out, as `pull_tree` leaves them."""
        sftp = self._sftp_client()
        found: list[tuple[str, int]] = []
        pending: list[tuple[PurePosixPath, int]] = [(PurePosixPath("."), 0)]
        while pending and len(found) < max_files:
            rel_dir, depth = pending.pop()
            for entry in self._listing(sftp, remote_dir, rel_dir):
                assert entry.st_mode is not None  # _listing keeps only entries with a mode
                rel = rel_dir / entry.filename
                if stat.S_ISDIR(entry.st_mode) and depth + 1 < _MAX_TREE_DEPTH:
                    pending.append((rel, depth + 1))
                elif stat.S_ISREG(entry.st_mode):
                    found.append((rel.as_posix(), int(entry.st_size or 0)))
        return found[:max_files]

    def pull_tree(
        self, remote_dir: str, local_dir: Path, *, deadline: float, max_bytes: float,
        on_bytes: Callable[[int], None] | None = None, abandon: Callable[[], bool] | None = None,
        pattern: str = "*",
    ) -> TreePull:
        """`get_tree` with a deadline and a size budget: files that would pass the budget are skipped, and
        a pull still running at `deadline` (or abandoned) is cut by closing the link: what arrived is kept."""
        result = TreePull()
        try:
            self.bounded(f"pull of {remote_dir}", lambda: self._walk_pull(remote_dir, local_dir, pattern, result,
                                                                         max_bytes, on_bytes),
                         deadline=deadline, abandon=abandon)
        except SshTransferError as exc:
            result.complete, result.detail = False, str(exc)
            result.left = list(dict.fromkeys(n for n in [result._current, *result._listed]
                                             if n and n not in result.files and n not in result.skipped))
        if result.skipped and result.complete:
            result.complete, result.detail = False, f"{len(result.skipped)} file(s) over the size budget"
        result.files = sorted(result.files)
        return result

    def _listing(self, sftp: paramiko.SFTPClient, remote_dir: str, rel_dir: PurePosixPath
                 ) -> list[paramiko.SFTPAttributes]:
        """One host folder's entries by name, those a walk may take (no `.`/`..`, no `/` in a name, a mode
        given); a folder that vanished is empty, a listing that stalls is the session's stall."""
        try:
            entries = sftp.listdir_attr(str(PurePosixPath(remote_dir) / rel_dir))
        except FileNotFoundError:
            return []
        except TimeoutError:
            raise self._stalled(f"listing {remote_dir}/{rel_dir}") from None
        return [e for e in sorted(entries, key=lambda e: e.filename)
                if e.filename not in (".", "..") and "/" not in e.filename and e.st_mode is not None]

    def symlink_on_the_way(self, remote_dir: str) -> str | None:
        """The first folder of `remote_dir` (each part, from the login folder) that is a symlink on the host,
        else None: a pull follows none, its root included (`rm -rf ~/vh/evidence; ln -s / ~/vh/evidence` must
        not bring the host's, or on --sim the user's, other files back). A part that is missing is not a link."""
        sftp = self._sftp_client()
        parts = PurePosixPath(remote_dir).parts
        for i in range(len(parts)):
            here = PurePosixPath(*parts[: i + 1])
            if here.as_posix() == "/":
                continue
            try:
                st = sftp.lstat(here.as_posix())
            except FileNotFoundError:
                return None
            except TimeoutError:
                raise self._stalled(f"checking {here}") from None
            if stat.S_ISLNK(st.st_mode or 0):
                return here.as_posix()
        return None

    def _walk_pull(self, remote_dir: str, local_dir: Path, pattern: str, result: TreePull,
                   max_bytes: float | None, on_bytes: Callable[[int], None] | None) -> TreePull:
        """Files that vanish between listing and copying are skipped. Symlinks and special files are skipped
        too: a host's link could point the copy at a path it should not read; a root that is one (or lies
        under one) is not walked at all."""
        if (link := self.symlink_on_the_way(remote_dir)) is not None:
            result.symlink, result.complete = link, False
            result.detail = f"{link} on the host is a symlink: not followed (a pull takes only the host's own tree)"
            return result
        sftp = self._sftp_client()
        pending: list[tuple[PurePosixPath, int]] = [(PurePosixPath("."), 0)]
        while pending:
            rel_dir, depth = pending.pop()
            listing = self._listing(sftp, remote_dir, rel_dir)
            # what a cut would leave: this folder's entries not reached yet, and the folders still pending
            result._listed = [(rel_dir / e.filename).as_posix() + ("/" if stat.S_ISDIR(e.st_mode or 0) else "")
                              for e in listing] + [f"{d.as_posix()}/" for d, _ in pending]
            for entry in listing:
                name = entry.filename
                rel = rel_dir / name
                if result._listed and result._listed[0].rstrip("/") == rel.as_posix():
                    reached = result._listed.pop(0)
                    if reached.endswith("/"):  # a folder reached here is walked later: still left
                        result._listed.append(reached)
                if stat.S_ISDIR(entry.st_mode or 0) and depth + 1 < _MAX_TREE_DEPTH:
                    pending.append((rel, depth + 1))
                elif stat.S_ISREG(entry.st_mode or 0) and fnmatch.fnmatch(name, pattern):
                    left = None if max_bytes is None else max_bytes - result.bytes
                    if left is not None and (entry.st_size or 0) > left:
                        result.skipped.append(rel.as_posix())
                        continue
                    result._current = rel.as_posix()
                    local = result.local_name(rel)
                    try:
                        size = self.get(str(PurePosixPath(remote_dir) / rel), local_dir / local, max_bytes=left,
                                        on_bytes=on_bytes)
                    except FileNotFoundError:
                        continue
                    except LocalDiskRefused:
                        raise  # the pull stops: every further file would meet the same full disk
                    except SshTransferError:
                        if not self.is_active():
                            raise
                        result.skipped.append(rel.as_posix())  # grew past the budget while copied
                        continue
                    result.bytes += size
                    result.files.append(local)
                    result._current = ""
        result.files.sort()
        return result

    def reopen(self, timeout_s: float | None = None) -> str | None:
        """After a loss: a new link to the endpoint we used, for what comes next (the evidence pull); no
        command is ever re-run on it by this call. The host must show the key it showed first (another key
        there is not our instance). None once open; else why not, and the session is left as it was."""
        limit_s = self._attempt_timeout_s if timeout_s is None else max(0.1, min(timeout_s, self._attempt_timeout_s))
        try:
            client = _open_client(self.endpoint, self._pkey, self._user, limit_s)
        except _CONNECT_ERRORS as exc:
            return f"a new connection to {self.endpoint} failed: {_describe(exc)}"
        transport = client.get_transport()
        shown = transport.get_remote_server_key().fingerprint if transport is not None else "none"
        if shown != self.host_key_fingerprint:
            client.close()
            return (f"{self.endpoint} now shows host key {shown}, not {self.host_key_fingerprint}: "
                    "not the host this run connected to")
        old, old_sftp = self._client, self._sftp
        self._client, self._sftp = client, None
        old_transport = old.get_transport()
        if old_transport is not None:
            old_transport.close()  # first: closing the SFTP client politely would write to the dead link
        with contextlib.suppress(*_CONNECT_ERRORS):
            if old_sftp is not None:
                old_sftp.close()
            old.close()
        return None

    def abort(self) -> None:
        """Close the link now, without any polite exchange: a stalled peer cannot hold this call."""
        transport = self._client.get_transport()
        if transport is not None:
            transport.close()  # wakes every thread blocked on one of its channels

    def close(self) -> None:
        # The transport first: a graceful SFTP close writes to the link, and on a stalled link with a full
        # send buffer that write would wait forever.
        self.abort()
        if self._sftp is not None:
            try:
                self._sftp.close()
            except _CONNECT_ERRORS:
                pass
            self._sftp = None
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ConnectAttempt",
    "HostSession",
    "RunKey",
    "SshEndpoint",
    "StepOutcome",
    "TreePull",
    "endpoints_for",
    "generate_run_key",
    "run_key_dir_pid",
    "run_key_dir_prefix",
    "shell_with_env",
]
