"""A simulated host's SSH endpoint: paramiko server, public-key auth, exec, SFTP; two ports.

The host listens on loopback twice, like a Vast host: a "direct" port (published in `ports["22/tcp"]`)
and a "proxy" port (`ssh_host`/`ssh_port`). Both serve the same sandbox. Connections are accepted only
while the instance is running. Auth accepts the account's keys, the instance's attached keys, and any
key in the sandbox's $HOME/.ssh/authorized_keys (how an onstart installs a per-run key on real Vast).
Each exec runs `bash -c CMD` in its own process group (a shell request: bash reading the channel); stdout and
stderr are forwarded as produced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import IO, Any

import paramiko
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, OPEN_SUCCEEDED

from vast_harness.sim.faults import FaultPlan
from vast_harness.sim.sandbox import Sandbox, SandboxClosed
from vast_harness.sim.sftp import Meter, SandboxSFTP

ACCEPT_POLL_S = 0.2
READ_CHUNK = 65536
# Server-side transports log under their own name, silenced: a client hanging up is routine here and
# must not print "Socket exception" into the harness's terminal.
LOG_CHANNEL = "vast_harness.sim.ssh"
logging.getLogger(LOG_CHANNEL).addHandler(logging.NullHandler())
logging.getLogger(LOG_CHANNEL).propagate = False


class SshHost:
    """One instance's SSH presence: its listeners, live transports and exec sessions."""

    def __init__(self, instance_id: int, sandbox: Sandbox, host_key: paramiko.PKey,
                 is_authorized: Callable[[str], bool], faults: Callable[[], FaultPlan],
                 on_bytes: Callable[[int, int], None], on_exec: Callable[[], None] | None = None) -> None:
        self.instance_id = instance_id
        self.sandbox = sandbox
        self.host_key = host_key
        self.is_authorized = is_authorized  # (key blob) -> allowed by the account or the instance
        self.faults = faults
        self.on_bytes = on_bytes
        self.on_exec = on_exec  # told of each command run (the simulator counts them for judges)
        self.accepting = False
        self._closed = threading.Event()
        self._transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()
        self._listeners = [self._listen(), self._listen()]
        self.direct_port, self.proxy_port = (s.getsockname()[1] for s in self._listeners)
        for listener in self._listeners:
            threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                             name=f"sim-ssh-{instance_id}-{listener.getsockname()[1]}").start()

    @staticmethod
    def _listen() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.settimeout(ACCEPT_POLL_S)
        return sock

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if not self.accepting or self._closed.is_set() or self.faults().take("ssh_refuse"):
                _reset(conn)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        transport = paramiko.Transport(conn)
        transport.set_log_channel(LOG_CHANNEL)
        transport.add_server_key(self.host_key)
        slow = self.faults().take("slow_sftp")
        meter = Meter(self.on_bytes, slow.bytes_per_s if slow else None)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, SandboxSFTP,
                                        home=self.sandbox.home, meter=meter)
        with self._lock:
            if self._closed.is_set():
                _reset(conn)  # transport.close() is a no-op on a transport that never started
                return
            self._transports.append(transport)
        try:
            transport.start_server(server=_Session(self, transport))
        except (paramiko.SSHException, OSError, EOFError):
            transport.close()
            conn.close()

    def close(self) -> None:
        """Stop listening and cut every connection (destroy, offline, simulator stop)."""
        self._closed.set()
        self.accepting = False
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.close()
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()
            if isinstance(transport.sock, socket.socket):  # always, here: the host made it from its accept
                _reset(transport.sock)  # one registered but not yet started: its close() did nothing

    def run_exec(self, channel: paramiko.Channel, command: str, transport: paramiko.Transport) -> None:
        """Run one exec request to completion and report its exit status on the channel."""
        if self.on_exec is not None:
            self.on_exec()
        try:
            proc = self.sandbox.spawn(command, env=self.sandbox.ssh_env)
        except (SandboxClosed, OSError) as exc:
            with contextlib.suppress(Exception):
                channel.sendall_stderr(f"sim host: cannot run command: {exc}\n".encode())
                channel.send_exit_status(255)
                channel.close()
            return
        drop = self.faults().take("ssh_drop")
        if drop is not None:
            timer = threading.Timer(drop.seconds or 0.0, transport.close)
            timer.daemon = True
            timer.start()
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, channel.sendall), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, channel.sendall_stderr), daemon=True)]
        for pump in pumps:
            pump.start()
        threading.Thread(target=_feed_stdin, args=(channel, proc.stdin), daemon=True).start()
        rc = proc.wait()
        # As OpenSSH's sshd: the exit status when the command exits, then what its pipes still hold, then EOF.
        # A background process it started may hold the pipes open for ever; the client decides how long to read.
        with contextlib.suppress(Exception):
            channel.send_exit_status(rc if rc >= 0 else 128 - rc)  # signal N -> 128+N, as a shell reports
        for pump in pumps:
            pump.join()
        with contextlib.suppress(Exception):
            channel.shutdown_write()
            channel.close()


def _pump(stream: IO[bytes], send: Callable[[bytes], Any]) -> None:
    """Forward a pipe as bytes arrive; when the channel is gone, close the pipe (the writer gets EPIPE)."""
    fd = stream.fileno()
    try:
        while chunk := os.read(fd, READ_CHUNK):
            send(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        stream.close()


def _feed_stdin(channel: paramiko.Channel, stdin: IO[bytes]) -> None:
    try:
        while data := channel.recv(READ_CHUNK):
            stdin.write(data)
            stdin.flush()
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def _reset(conn: socket.socket) -> None:
    """Close with RST, so the client sees a refused/reset connection rather than a hang."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class _Session(paramiko.ServerInterface):
    def __init__(self, host: SshHost, transport: paramiko.Transport) -> None:
        self.host = host
        self.transport = transport

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        blob = key.get_base64()
        if self.host.is_authorized(blob) or blob in self.host.sandbox.authorized_key_blobs():
            return AUTH_SUCCESSFUL
        return AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=self.host.run_exec,
                         args=(channel, command.decode(errors="replace"), self.transport),
                         daemon=True, name=f"sim-exec-{self.host.instance_id}").start()
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        """A login shell (`ssh HOST` with no command): bash reading its commands from the channel, without a
        terminal (the pty request is ignored), in the sandbox like any command."""
        threading.Thread(target=self.host.run_exec, args=(channel, "exec bash", self.transport),
                         daemon=True, name=f"sim-shell-{self.host.instance_id}").start()
        return True

    def check_channel_pty_request(self, *args: Any) -> bool:
        return True  # accepted and ignored: commands run without a terminal

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return False  # like a default sshd (AcceptEnv unset)

