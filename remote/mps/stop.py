"""Stop a daemon we own, in the order that does not wedge the server (docs/mps.md).

1. let clients exit on their own (bounded);
2. a client still connected gets `terminate_client <server> <client>` (its contexts are torn down
   server-side, so killing it can no longer corrupt the server), then SIGKILL of that PID;
3. `quit`, then wait (bounded) until the daemon and server PIDs are gone;
4. survivors get SIGTERM then SIGKILL, by PID, and only PIDs that are MPS processes;
5. the pipe directory is removed, the logs kept.

Used by the wrapper on every exit path and by the supervisor when the wrapper died.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from remote.mps.control import (
    Daemon,
    find_daemon_by_environ,
    is_mps_process,
    pid_alive,
    read_pid_file,
    wait_gone,
)


@dataclass
class StopTimeouts:
    client_grace_s: float = 10.0
    terminate_wait_s: float = 2.0
    quit_timeout_s: float = 10.0
    gone_wait_s: float = 10.0
    kill_wait_s: float = 5.0


@dataclass
class StopReport:
    by: str  # "wrapper" | "supervisor"
    server_pids: list[int] = field(default_factory=list)
    clients_left_at_stop: list[int] = field(default_factory=list)
    terminated_clients: list[dict[str, Any]] = field(default_factory=list)
    quit: str = ""
    escalated: list[dict[str, Any]] = field(default_factory=list)
    daemon_gone: bool = False
    servers_gone: bool = False
    survivors: list[int] = field(default_factory=list)
    pipe_dir_removed: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _live_clients(daemon: Daemon, server_pids: list[int]) -> list[tuple[int, int]]:
    return [(s, c) for s in server_pids for c in daemon.client_pids(s) if pid_alive(c) and c != os.getpid()]


def drain_clients(daemon: Daemon, servers: list[int], t: StopTimeouts, report: StopReport) -> None:
    deadline = time.monotonic() + t.client_grace_s
    pairs = _live_clients(daemon, servers)
    while pairs and time.monotonic() < deadline:
        time.sleep(0.1)
        pairs = _live_clients(daemon, servers)
    report.clients_left_at_stop = sorted({c for _, c in pairs})
    for server_pid, client_pid in pairs:
        result = daemon.query(f"terminate_client {server_pid} {client_pid}", timeout_s=t.terminate_wait_s + 3)
        still = wait_gone([client_pid], t.terminate_wait_s)
        killed = False
        if still:
            try:
                os.kill(client_pid, signal.SIGKILL)  # safe now: its contexts were terminated
                killed = True
            except ProcessLookupError:
                pass
            wait_gone([client_pid], t.kill_wait_s)
        report.terminated_clients.append(
            {"server_pid": server_pid, "client_pid": client_pid, "reply": result.describe(), "sigkill": killed}
        )


def _escalate(pids: list[int], t: StopTimeouts, report: StopReport) -> list[int]:
    for sig, wait_s in ((signal.SIGTERM, t.kill_wait_s), (signal.SIGKILL, t.kill_wait_s)):
        alive = [p for p in pids if is_mps_process(p)]
        if not alive:
            return []
        for pid in alive:
            try:
                os.kill(pid, sig)
                report.escalated.append({"pid": pid, "signal": signal.Signals(sig).name})
            except ProcessLookupError:
                pass
        wait_gone(alive, wait_s, alive_if=is_mps_process)
    return [p for p in pids if is_mps_process(p)]


def stop_owned(daemon: Daemon, by: str, timeouts: StopTimeouts | None = None,
               server_pids: list[int] | None = None) -> StopReport:
    """Stop `daemon` (which must be ours) and verify its processes are gone. `server_pids`, when the
    caller just read them, saves a round trip; None asks the daemon."""
    if not daemon.owned:
        raise ValueError("stop_owned called on an external daemon; external daemons are never stopped")
    t = timeouts or StopTimeouts()
    t0 = time.monotonic()
    report = StopReport(by=by)
    daemon_pid = daemon.daemon_pid or read_pid_file(daemon.pipe_dir) or find_daemon_by_environ(daemon.pipe_dir)
    if server_pids is None:
        server_pids = daemon.server_pids() if pid_alive(daemon_pid) else []
    servers = server_pids
    report.server_pids = servers
    if servers:
        drain_clients(daemon, servers, t, report)
    if pid_alive(daemon_pid):
        report.quit = daemon.query("quit", timeout_s=t.quit_timeout_s).describe()
    else:
        report.quit = "daemon already gone; quit not sent"
    # Servers named only by an old control.log line may have exited long ago and their PIDs been
    # reused: only a live *MPS* process counts as a survivor, and only those are ever signalled.
    ours = [p for p in [daemon_pid, *servers] if p]
    survivors = wait_gone(ours, t.gone_wait_s, alive_if=is_mps_process)
    if survivors:
        survivors = _escalate(survivors, t, report)
    report.survivors = survivors
    report.daemon_gone = not is_mps_process(daemon_pid)
    report.servers_gone = not any(is_mps_process(p) for p in servers)
    shutil.rmtree(daemon.pipe_dir, ignore_errors=True)
    report.pipe_dir_removed = not daemon.pipe_dir.exists()
    report.seconds = round(time.monotonic() - t0, 3)
    return report
