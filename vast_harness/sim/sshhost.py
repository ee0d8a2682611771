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
import socket
import threading
from collections.abc import Callable
from typing import Any

import paramiko
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, OPEN_SUCCEEDED

from vast_harness.sim.faults import FaultPlan
from vast_harness.sim.sandbox import Sandbox, SandboxClosed
from vast_harness.sim.sftp import Meter, SandboxSFTP
from vast_harness.sim.sshserve import (
    after_answer,
    feed_stdin,
    handshake,
    listen_loopback,
    pump,
    reset,
    server_transport,
    start_accepting,
)


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
        self._listeners = [listen_loopback(), listen_loopback()]
        self.direct_port, self.proxy_port = (s.getsockname()[1] for s in self._listeners)
        for listener in self._listeners:
            start_accepting(listener, self._closed, self._serve, admit=self._admits,
                            name=f"sim-ssh-{instance_id}-{listener.getsockname()[1]}")

    def _admits(self) -> bool:
        return self.accepting and not self._closed.is_set() and not self.faults().take("ssh_refuse")

    def _serve(self, conn: socket.socket) -> None:
        transport = server_transport(conn, self.host_key)
        slow = self.faults().take("slow_sftp")
        meter = Meter(self.on_bytes, slow.bytes_per_s if slow else None)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, SandboxSFTP,
                                        home=self.sandbox.home, meter=meter)
        with self._lock:
            if self._closed.is_set():
                reset(conn)  # transport.close() is a no-op on a transport that never started
                return
            self._transports.append(transport)
        handshake(transport, conn, _Session(self, transport))

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
                reset(transport.sock)  # one registered but not yet started: its close() did nothing

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
        pumps = [threading.Thread(target=pump, args=(proc.stdout, channel.sendall), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, channel.sendall_stderr), daemon=True)]
        for thread in pumps:
            thread.start()
        threading.Thread(target=feed_stdin, args=(channel, proc.stdin), daemon=True).start()
        rc = proc.wait()
        # As OpenSSH's sshd: the exit status when the command exits, then what its pipes still hold, then EOF.
        # A background process it started may hold the pipes open for ever; the client decides how long to read.
        with contextlib.suppress(Exception):
            channel.send_exit_status(rc if rc >= 0 else 128 - rc)  # signal N -> 128+N, as a shell reports
        for thread in pumps:
            thread.join()
        with contextlib.suppress(Exception):
            channel.shutdown_write()
            channel.close()


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
        self._run_once_answered(channel, command.decode(errors="replace"), f"sim-exec-{self.host.instance_id}")
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        """A login shell (`ssh HOST` with no command): bash reading its commands from the channel, without a
        terminal (the pty request is ignored), in the sandbox like any command."""
        self._run_once_answered(channel, "exec bash", f"sim-shell-{self.host.instance_id}")
        return True

    def _run_once_answered(self, channel: paramiko.Channel, command: str, name: str) -> None:
        thread = threading.Thread(target=self.host.run_exec, args=(channel, command, self.transport),
                                  daemon=True, name=name)
        after_answer(channel, thread.start)

    def check_channel_pty_request(self, *args: Any) -> bool:
        return True  # accepted and ignored: commands run without a terminal

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return False  # like a default sshd (AcceptEnv unset)

