"""Which runs are alive: a registration per run, held locked for the run's whole life, and labels that say
when a run's own caps end it.

On this machine a run writes `<state>/live/<run_id>.json` (run id, pid, host, start, API URL, account
fingerprint, caps, the deadline by which its caps end it) and holds an exclusive `flock` on it until its
teardown is over. The kernel drops the lock when the process dies, however it dies (`kill -9` included), so
a probe that can take a shared lock on the file knows its run is dead; a reused pid does not hold the lock,
so it cannot pass for the run. The file is made under a temporary name, locked, then renamed into place, so
no probe ever sees it unlocked while its run lives.

Another machine cannot see those locks. It judges by the instance's label, `vh-<run_id>[-r<n>]-d<deadline>`
(the run's cap deadline in epoch seconds on the API server's clock, base 36: under 40 characters where Vast
allows 256), against the server's `Date`: a run whose deadline passed more than a teardown ago is over, so its
instance is an orphan. Old labels without a deadline are judged by their instance's `start_date` against the
longest time cap a run may have.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError, model_validator

from vast_harness.errors import ConfigError
from vast_harness.files import UnusableFile, kind_of, read_regular_file
from vast_harness.masking import MASKER
from vast_harness.state.process import ProcessId, this_process
from vast_harness.state.process import this_host as this_host  # re-exported: the run registers by it
from vast_harness.timings import MAX_MINUTES_LIMIT

LIVE_DIR = "live"
# A run id as new_run_id makes it: the strict form makes old labels (no deadline) unambiguous, even when
# their random part starts with "d".
_STRICT = re.compile(r"^vh-(?P<run>\d{8}T\d{6}Z-[0-9a-f]{6})(?:-r(?P<n>\d+))?(?:-d(?P<dl>[0-9a-z]{1,12}))?"
                     r"(?:-c(?P<left>[0-9a-z]{1,8}))?$")
_LOOSE = re.compile(r"^vh-(?P<run>.+?)(?:-r(?P<n>\d+))?(?:-d(?P<dl>[0-9a-z]{6}))?(?:-c(?P<left>[0-9a-z]{1,8}))?$")
# No run lives longer than this: its time cap's upper bound plus the dead-man switch's grace.
LABEL_PREFIX = "vh-"  # every instance a run creates is labelled vh-<run id>-...: reap and status find them by it
MAX_RUN_S = MAX_MINUTES_LIMIT * 60.0 + 3600.0

Liveness = Literal["live", "dead", "elsewhere"]


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def make_label(run_id: str, attempt: int, deadline_unix: float, left_s: float | None = None) -> str:
    """The label of a run's `attempt`-th create: its run id, the attempt, its cap deadline (server clock), and
    the seconds of cap left when the label was made. The deadline is as good as the clock that read it; the
    seconds left are not: added to the instance's own `start_date` (Vast's clock) they bound the run's end
    whatever a skewed `Date` made of the deadline."""
    left = f"-c{_b36(max(0, int(left_s) + 1))}" if left_s is not None else ""
    return f"{LABEL_PREFIX}{run_id}{f'-r{attempt}' if attempt else ''}-d{_b36(max(0, int(deadline_unix) + 1))}{left}"


class LabelInfo(BaseModel):
    run_id: str
    deadline_unix: float | None = None  # None: an old label, written before labels carried it
    left_s: float | None = None  # the cap left when the label was made (None on older labels)


def parse_label(label: str | None) -> LabelInfo | None:
    """The run id and cap deadline a `vh-` label carries, or None for a label that is not the harness's."""
    if not label or not label.startswith(LABEL_PREFIX):
        return None
    m = _STRICT.match(label) or _LOOSE.match(label)
    if m is None:
        return None
    dl, left = m.group("dl"), m.group("left")
    return LabelInfo(run_id=m.group("run"), deadline_unix=float(int(dl, 36)) if dl else None,
                     left_s=float(int(left, 36)) if left else None)


class Registration(BaseModel):
    """What one live run says about itself (`<state>/live/<run_id>.json`)."""

    run_id: str
    pid: int
    host: str
    started_unix: float  # wall clock: recorded, never compared
    api_url: str
    account: str | None = None  # the key's fingerprint (ledger.account_fingerprint), never the key
    profile: str
    gpu: str | None = None
    max_usd: float
    max_minutes: float
    # When the run's caps end it (time cap from its start), on the API server's clock once it has heard the
    # server, else on the wall clock at registration (deadline_clock says which).
    deadline_unix: float
    deadline_clock: Literal["server", "local wall clock"] = "local wall clock"
    labels: list[str] = []
    instance_ids: list[int] = []
    pid_start: str | None = None  # the pid's start time (state/process.py); filled in by the run itself
    # What a second terminal's `status` shows while the run tears down (its instances may no longer be listed):
    # the phase, and the absence proof's rounds so far with the last round's verdict.
    phase: Literal["running", "tearing down"] = "running"
    proof_rounds: int = 0
    last_round: str | None = None

    @model_validator(mode="after")
    def _own_start(self) -> Registration:
        if self.pid_start is None and self.pid == os.getpid():
            self.pid_start = this_process().start
        return self

    @property
    def process(self) -> ProcessId:
        return ProcessId(host=self.host, pid=self.pid, start=self.pid_start)


class HeldRegistration:
    """The run's own registration: locked from `register` until `release`. `update` rewrites it in place
    (the lock is on the file, so the file is never replaced)."""

    def __init__(self, path: Path, fd: int, reg: Registration) -> None:
        self.path, self._fd, self.reg = path, fd, reg

    def update(self, **fields: object) -> None:
        self.reg = self.reg.model_copy(update=fields)
        data = MASKER.data(self.reg.model_dump_json().encode())
        with contextlib.suppress(OSError):  # best effort: the lock, not the content, is the liveness
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
            os.fsync(self._fd)

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # first, so no probe finds it unlocked and calls the run dead meanwhile
        os.close(self._fd)
        self._fd = -1


class LiveRun(BaseModel):
    reg: Registration | None  # None: the file could not be read (still locked: live)
    run_id: str
    liveness: Liveness
    path: Path
    unlocked: bool = False  # live by its process although nothing holds the file's lock


MAX_REGISTRATION_BYTES = 64 * 1024  # a registration is under 1 KB


class RunRegistry:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / LIVE_DIR
        self.skipped: list[str] = []  # registrations `scan` could not use, one line each (callers say them)

    def register(self, reg: Registration) -> HeldRegistration:
        """Write and lock the run's registration; ConfigError (nothing rented) when the state dir refuses."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            final = self.dir / f"{reg.run_id}.json"
            tmp = self.dir / f".{reg.run_id}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot register the run in {self.dir}: {exc.strerror or exc}; set "
                              "VAST_HARNESS_HOME to a writable directory. Nothing rented") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, MASKER.data(reg.model_dump_json().encode()))
            os.fsync(fd)
            os.replace(tmp, final)  # the same inode, still locked, now under its name
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise ConfigError(f"cannot register the run in {self.dir}: {exc.strerror or exc}; nothing rented") from None
        return HeldRegistration(final, fd, reg)

    def scan(self) -> dict[str, LiveRun]:
        """Every registration here, with whether its run is alive (probed by its lock)."""
        out: dict[str, LiveRun] = {}
        try:
            paths = sorted(self.dir.glob("*.json"))
        except OSError:
            return out
        host = this_host()
        self.skipped = []
        for path in paths:
            run_id = path.name[: -len(".json")]
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue  # gone meanwhile
            if not stat.S_ISREG(mode):  # a FIFO would hang the probe, a link to /dev/zero fill memory
                self.skipped.append(f"registration {path} skipped: it is {kind_of(mode)}, not a regular file")
                continue
            alive = probe(path)
            if alive is None:
                continue  # gone meanwhile: its run ended
            reg = _read(path)
            if reg is not None and reg.host != host:  # a shared state dir: locks do not cross machines
                out[run_id] = LiveRun(reg=reg, run_id=run_id, liveness="elsewhere", path=path)
                continue
            if not alive and reg is not None and reg.process != this_process() and reg.process.running():
                # The file lost its lock (replaced, or moved and copied back) but its run's process is alive.
                out[run_id] = LiveRun(reg=reg, run_id=run_id, liveness="live", path=path, unlocked=True)
                continue
            out[run_id] = LiveRun(reg=reg, run_id=run_id, liveness="live" if alive else "dead", path=path)
        return out

    def forget(self, run: LiveRun) -> None:
        """Remove a dead run's registration (after its instances are proven gone)."""
        if run.liveness == "dead" and probe(run.path) is False:
            with contextlib.suppress(OSError):
                run.path.unlink()


def probe(path: Path) -> bool | None:
    """True while a process holds the file's lock, False when none does, None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return True  # cannot look: never call a run dead on that
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True  # held (EWOULDBLOCK), or a lock we cannot take: either way never "dead"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _read(path: Path) -> Registration | None:
    for _ in range(3):  # an update in place can be caught half-written: look again
        try:
            raw = read_regular_file(path, max_bytes=MAX_REGISTRATION_BYTES, follow_symlinks=False)
            return Registration.model_validate(json.loads(raw))
        except UnusableFile:
            return None
        except (OSError, ValueError, ValidationError, RecursionError):  # RecursionError: JSON nested 100k deep
            time.sleep(0.02)
    return None
