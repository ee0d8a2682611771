"""The machine's copy daemon: how `vastai copy INSTANCE:PATH LOCAL` reaches a stopped instance's disk.

The official CLI (vast-cli `vastai/api/storage.py::copy`, `cli/commands/storage.py::copy`) sends
`PUT /api/v0/commands/rsync/` with `{"client_id": "me", "src_id", "dst_id", "src_path", "dst_path"}` when one
side is local (`None`), reads `src_addr`/`src_port` from the answer and runs::

    rsync -arz -e "ssh -p SRC_PORT -o StrictHostKeyChecking=no" vastai_kaalia@SRC_ADDR::SRC_ID/SRC_PATH DST

that is rsync's daemon protocol over SSH: the SSH server runs `rsync --server --daemon .` and serves a module
named after the instance. This is that server, one per simulator, on loopback: user `vastai_kaalia`, a key the
account or the instance holds, an exec of `rsync --server --daemon` only, a module per instance a copy was
asked for (its id and `C.<id>`) rooted at `/`, where the simulated container's absolute paths are, read only.
Bytes it sends are billed to the instance as bytes leaving the host. It serves a stopped instance: that is the
point (Vast's data-movement guide: copy works on a stopped instance). Which keys the real daemon takes is
UNCONFIRMED (the CLI passes `-i IDENTITY`): the canary measures it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, OPEN_SUCCEEDED

from vast_harness.sim.sshserve import (
    after_answer,
    feed_stdin,
    handshake,
    listen_loopback,
    pump,
    server_transport,
    start_accepting,
)

COPY_USER = "vastai_kaalia"
DAEMON_COMMAND = "rsync --server --daemon"


class CopyDaemon:
    """Serves `grants`: instance id -> (the keys that may copy from it, its module root, refused by a fault)."""

    def __init__(self, host_key: paramiko.PKey, *, on_bytes: Callable[[int, int], None],
                 bytes_per_s: float | None = None) -> None:
        self.host_key = host_key
        self.on_bytes = on_bytes  # (instance id, bytes sent to the client)
        self.bytes_per_s = bytes_per_s  # the copy's rate (a canary's measure, sim/calibrate.py); None: as fast as it goes
        self._grants: dict[int, tuple[Callable[[str], bool], bool]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._dir = Path(tempfile.mkdtemp(prefix="vh-sim-copyd-"))
        self._listener = listen_loopback()
        self.port = self._listener.getsockname()[1]
        start_accepting(self._listener, self._closed, self._serve, name="sim-copyd")

    def grant(self, instance_id: int, authorized: Callable[[str], bool], *, refuse: bool) -> None:
        """A copy was asked for `instance_id`: keys `authorized` accepts may read it until the simulator ends."""
        with self._lock:
            self._grants[instance_id] = (authorized, refuse)

    def revoke(self, instance_id: int) -> None:
        with self._lock:
            self._grants.pop(instance_id, None)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _serve(self, conn: socket.socket) -> None:
        handshake(server_transport(conn, self.host_key), conn, _CopySession(self))

    def authorized(self, blob: str) -> list[int]:
        """The instances whose copy grant accepts this key."""
        with self._lock:
            return [i for i, (ok, _) in self._grants.items() if ok(blob)]

    def refused(self, instance_id: int) -> bool:
        with self._lock:
            return self._grants.get(instance_id, (None, False))[1]

    def run_daemon(self, channel: paramiko.Channel, instance_ids: list[int]) -> None:
        """One `rsync --server --daemon .` over the channel, its modules the instances this key may read."""
        conf = self._dir / f"rsyncd-{threading.get_ident()}.conf"
        modules = []
        for iid in instance_ids:
            for name in (str(iid), f"C.{iid}"):
                root = "/nonexistent-vh-copy-refused" if self.refused(iid) else "/"  # copy_fail: chdir fails
                modules.append(f"[{name}]\n    path = {root}\n    read only = yes\n    use chroot = no\n"
                               f"    uid = {os.getuid()}\n    gid = {os.getgid()}\n")
        conf.write_text(f"log file = {self._dir / 'rsyncd.log'}\n" + "".join(modules))
        proc = subprocess.Popen(["rsync", "--server", "--daemon", f"--config={conf}", "."], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        billed = instance_ids[0] if len(instance_ids) == 1 else None

        def send(chunk: bytes) -> Any:
            if billed is not None:
                self.on_bytes(billed, len(chunk))
            if self.bytes_per_s:
                time.sleep(len(chunk) / self.bytes_per_s)
            return channel.sendall(chunk)

        pumps = [threading.Thread(target=pump, args=(proc.stdout, send), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, channel.sendall_stderr), daemon=True)]
        for thread in pumps:
            thread.start()
        threading.Thread(target=feed_stdin, args=(channel, proc.stdin), daemon=True).start()
        rc = proc.wait()
        with contextlib.suppress(Exception):
            channel.send_exit_status(rc)
        for thread in pumps:
            thread.join()
        with contextlib.suppress(Exception):
            channel.shutdown_write()
            channel.close()
        with contextlib.suppress(OSError):
            conf.unlink()


class _CopySession(paramiko.ServerInterface):
    def __init__(self, daemon: CopyDaemon) -> None:
        self.daemon = daemon
        self.instances: list[int] = []

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username != COPY_USER:
            return AUTH_FAILED
        self.instances = self.daemon.authorized(key.get_base64())
        return AUTH_SUCCESSFUL if self.instances else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return OPEN_SUCCEEDED if kind == "session" else OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if not command.decode(errors="replace").startswith(DAEMON_COMMAND):
            return False  # the daemon protocol only: no shell, no other command
        after_answer(channel, threading.Thread(target=self.daemon.run_daemon, args=(channel, list(self.instances)),
                                               daemon=True, name="sim-copyd-exec").start)
        return True
