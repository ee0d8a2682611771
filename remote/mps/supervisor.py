"""The watcher that stops our daemon when the wrapper dies without doing it (SIGKILL, OOM kill).

Started by the wrapper right after `nvidia-cuda-mps-control -d`, in its own session (so a terminal
Ctrl-C or a kill of the training process group never reaches it). It holds the read end of a pipe
whose only write end the wrapper holds: EOF without a `released` line means the wrapper is gone (no
PID polling, so no PID-reuse race). It then asks the child tree to stop (SIGTERM to its process group),
and runs the same stop as the wrapper (remote.mps.stop), writing its report to
<log_dir>/supervisor-stop.json.

Protocol on the pipe, one line each: `child <pid> <start_ticks>`, `released`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from remote.mps.control import Daemon, pid_alive, wait_gone
from remote.mps.stop import StopTimeouts, stop_owned


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: tells a process from a later one that reused its PID."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _read_until_eof(fd: int) -> tuple[bool, tuple[int, int] | None]:
    """Follow the wrapper's lines; return (released, child) once the pipe closes or says released."""
    buf, child = b"", None
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return False, child
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            words = line.decode(errors="replace").split()
            if words[:1] == ["released"]:
                return True, child
            if words[:1] == ["child"] and len(words) == 3:
                child = (int(words[1]), int(words[2]))


def _stop_child(child: tuple[int, int] | None, grace_s: float) -> str:
    if child is None:
        return "no child was started"
    pid, ticks = child
    if not pid_alive(pid) or start_ticks(pid) != ticks:
        return f"child {pid} already gone"
    try:
        os.killpg(pid, signal.SIGTERM)  # the child leads its own process group (see remote.mps)
    except ProcessLookupError:
        return f"child {pid} already gone"
    if not wait_gone([pid], grace_s):
        return f"child {pid} exited after SIGTERM"
    return f"child {pid} still running after SIGTERM; its MPS clients are drained by the stop"


def _kill_child_group(child: tuple[int, int] | None) -> None:
    if child and pid_alive(child[0]) and start_ticks(child[0]) == child[1]:
        try:
            os.killpg(child[0], signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remote.mps.supervisor")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--pipe-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--client-grace-s", type=float, default=10.0)
    parser.add_argument("--quit-timeout-s", type=float, default=10.0)
    parser.add_argument("--kill-wait-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's EOF (or `released`) ends our watch
    released, child = _read_until_eof(args.fd)
    if released:
        return 0
    daemon = Daemon(Path(args.binary), Path(args.pipe_dir), Path(args.log_dir), owned=True)
    child_note = _stop_child(child, args.client_grace_s)
    timeouts = StopTimeouts(
        client_grace_s=args.client_grace_s, quit_timeout_s=args.quit_timeout_s, kill_wait_s=args.kill_wait_s
    )
    report = stop_owned(daemon, by="supervisor", timeouts=timeouts).to_dict()
    _kill_child_group(child)
    report.update(child=child_note, unix_time=round(time.time(), 3))
    (Path(args.log_dir) / "supervisor-stop.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
