"""The watcher of an interruptible kept host as a process (`kept/watch.py` is its loop): started detached, in a
session of its own (it outlives the command that started it), found running by its pid and the pid's start."""

from __future__ import annotations

import subprocess
import sys

from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.process import ProcessId, this_host

WATCH_INTERVAL_S = 30.0  # one read of the instance per this (scaled by the pacing, as the client's own pacing)
MIN_INTERVAL_S = 0.5

_LAUNCHER = ("import subprocess, sys\n"
             "with open(sys.argv[1], 'ab') as log:\n"
             "    p = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,"
             " start_new_session=True)\n"
             "print(p.pid)\n")


def interval_s(pacing_scale: float) -> float:
    return max(MIN_INTERVAL_S, WATCH_INTERVAL_S * pacing_scale)


def watcher_running(record: HeldHost) -> bool:
    if record.watcher_pid is None:
        return False
    return ProcessId(host=this_host(), pid=record.watcher_pid, start=record.watcher_pid_start).running() is True


def start_watcher(store: HeldStore, record: HeldHost, *, pacing_scale: float) -> int | None:
    """Start the hold's watcher, detached (its own session: it outlives the command), unless one runs; its pid.
    It writes its own pid into the record (a second one, finding a first running, exits)."""
    if record.bid is None or watcher_running(record):
        return None
    log = store.dir / f"watch-{record.name}.log"
    argv = [sys.executable, "-m", "vast_harness.kept.watch", record.name, "--state-dir", str(store.dir.parent),
            "--interval", f"{interval_s(pacing_scale):g}", "--pacing-scale", f"{pacing_scale:g}"]
    launched = subprocess.run([sys.executable, "-c", _LAUNCHER, str(log), *argv], cwd=str(store.dir),
                              capture_output=True, text=True, timeout=30, check=False)
    try:
        return int(launched.stdout.strip())
    except ValueError:
        return None
