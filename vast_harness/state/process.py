"""Which process a run is, so that liveness is judged by the process itself, not by one file's lock alone.

A run's registration is locked while it lives, but the lock is on an inode: an editor or a backup that replaces
the file, a move and copy back, or a deletion leaves a live run without it. So the registration and every
ledger line also carry the writing process: host, pid, and the pid's start time (`/proc/<pid>/stat` field 22,
clock ticks since boot), which tells a live run from an unrelated process that got the pid later.
"""

from __future__ import annotations

import os
import socket
from functools import cache

from pydantic import BaseModel


def this_host() -> str:
    return socket.gethostname()


def process_start(pid: int) -> str | None:
    """The start time of `pid` as the kernel counts it (Linux), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': fields count from the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def pid_exists(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    return True


class ProcessId(BaseModel):
    host: str
    pid: int
    start: str | None = None  # None: not readable where it was written (not Linux)

    def running(self) -> bool | None:
        """True when this process still runs, False when it does not, None when it cannot be told from here
        (another machine)."""
        if self.host != this_host():
            return None
        if not pid_exists(self.pid):
            return False
        now = process_start(self.pid)
        return self.start is None or now is None or now == self.start


@cache
def this_process() -> ProcessId:
    pid = os.getpid()
    return ProcessId(host=this_host(), pid=pid, start=process_start(pid))
