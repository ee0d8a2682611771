"""`vast-e2e ssh NAME [-- CMD]`: a shell (or one command) on a kept host, with OpenSSH's `ssh` and the hold's key
from the state directory, the host held to the key its first connection saw. It is a run on the held instance
like the other commands (`HoldStages`): the cap guard deletes the host at the cap while the shell is open, the
idle deadline is pushed while it is, and from its end."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.host.bundle import Bundle
from vast_harness.kept.names import find
from vast_harness.kept.target import check_usable, held_spec, run_on_hold
from vast_harness.run.hold import HoldStages
from vast_harness.run.state import RunState, Stage
from vast_harness.run.tools import RunTools
from vast_harness.run.verdict import Outcome
from vast_harness.spec.resolve import RunOptions
from vast_harness.state.held import HeldHost, HeldStore

POLL_S = 0.2  # how often the open shell checks whether the hold must end (the cap guard fired)


def known_hosts_line(host: str, port: int, key_type: str, key_base64: str) -> str:
    return f"{host if port == 22 else f'[{host}]:{port}'} {key_type} {key_base64}\n"


class ShellStages(HoldStages):
    command = "ssh"

    def __init__(self, store: HeldStore, record: HeldHost, *, remote: list[str], ssh: str) -> None:
        super().__init__(store, record)
        self.remote, self.ssh = remote, ssh
        self.rc: int | None = None

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        t.cap_guard.start()
        return None

    def connect(self, t: RunTools, s: RunState) -> None:
        self.adopt(t, s)

    def arm(self, t: RunTools, s: RunState) -> None:
        self.check_switch(t, s)

    def work(self, t: RunTools, s: RunState, bundle: Bundle | None) -> None:
        s.stage = Stage.STEPS
        t.phases.start("ssh")
        session, record = s.session, self.record
        assert session is not None and record.key_path is not None
        endpoint = session.endpoint
        with tempfile.TemporaryDirectory(prefix="vh-known-") as tmp:
            known = Path(tmp) / "known_hosts"
            known.write_text(known_hosts_line(endpoint.host, endpoint.port, session.host_key_type,
                                              session.host_key_base64))
            argv = [self.ssh, "-i", record.key_path, "-p", str(endpoint.port), "-o", f"UserKnownHostsFile={known}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
                    "-o", "ServerAliveInterval=15", "-o", "GlobalKnownHostsFile=/dev/null",
                    f"root@{endpoint.host}", *self.remote]
            proc = subprocess.Popen(argv)
            try:
                while proc.poll() is None:
                    if s.cancelled.is_set():  # the cap (the guard deleted the host), or the hold must end
                        proc.terminate()
                        proc.wait(timeout=5)
                        s.check_cancelled()
                    try:
                        proc.wait(timeout=POLL_S)
                    except subprocess.TimeoutExpired:
                        continue
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self.rc = proc.returncode

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        if self.rc == 0:
            return ExitCode.PASSED, f"ssh to kept host {self.name} ended (rc 0)"
        return ExitCode.FAILED, f"ssh to kept host {self.name} ended with rc {self.rc}"


def ssh_host(name: str, remote: list[str], options: RunOptions, *, out: Output) -> int:
    ssh = shutil.which("ssh")
    if ssh is None:
        raise ConfigError("`vast-e2e ssh` runs OpenSSH's `ssh`, which is not on PATH")
    store, record = find(name)
    check_usable(store, record, "ssh")
    spec = held_spec(store, record, options.model_copy(update={"profile": "smoke", "command": None}))
    return run_on_hold(spec, record, ShellStages(store, record, remote=remote, ssh=ssh), out)
