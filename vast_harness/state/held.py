"""Kept hosts (`vast-e2e up NAME`): the durable record of each, the lock one command holds on it, its SSH key.

A kept host outlives the command that rented it: `up` rents and sets it up, then `exec`, `keep`, `ssh` and
`down` (each a process of its own, minutes or hours apart) work on it. What they share lives here, in the
user's state directory (`<state>/held/`, 0700):

* `<NAME>.json` (0600): the `HeldHost` record: the instance and its label, the API and account it belongs
  to, the caps and the deadlines (the hold's cap, and the idle deadline that each `exec` and `keep` push),
  the price billed and the bytes moved so far (a later command's meter starts from them), the SSH endpoints
  and the host key the first connection saw, and the manifest of what was uploaded (an `exec` sends the
  difference). Written whole (beside, then renamed), read-modify-written under `<NAME>.wlock`; created with
  `O_EXCL`, so two `up NAME` at once cannot both claim it. A record that ended is removed, never rewritten.
* `<NAME>.key/id_ed25519` (0600, in a 0700 dir): the host's one-time key, made by `up`, overwritten and
  removed when the hold ends.
* `<NAME>.lock`: the `flock` an `up` or an `exec` holds for its whole life, with `<NAME>.busy.json` saying
  who (pid, command, since): a second `exec` meanwhile is refused, naming the first. The kernel drops the
  lock when its process dies, `kill -9` included.
* `<NAME>.down.lock`: the `flock` a `down` holds (it never takes `<NAME>.lock`: it must not wait for an exec);
  a second `down` meanwhile waits for the first, then finds the hold ended.

Deadlines are instants on `clock.now_s` (CLOCK_BOOTTIME: one clock for every process of a boot, counting a
suspend, blind to wall-clock steps) stamped with the boot's id; a reading from another boot falls back to the
wall clock. A deadline never moves later by a clock: only an `exec` or `keep` pushes the idle one, and nothing
moves the cap's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from vast_harness.clock import boot_id, now_s
from vast_harness.errors import ConfigError
from vast_harness.files import UnusableFile, read_regular_file
from vast_harness.records import Attempt, Receipt, SshEndpoint
from vast_harness.state.process import this_host, this_process

HELD_DIR = "held"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a record with a 50,000-file manifest is a few MB

# outbid: its host was outbid between commands and is deleted (salvaged first); the next command rents another
HoldState = Literal["starting", "held", "outbid", "ending"]


class Instant(BaseModel):
    """A moment as this machine's processes compare it: `now_s()` of one boot, and the wall clock beside it."""

    boot: str | None  # clock.boot_id() when taken
    mono: float  # now_s() then
    unix: float  # time.time() then: recorded, and the fallback on another boot

    @classmethod
    def now(cls, after_s: float = 0.0) -> Instant:
        """Now, or `after_s` seconds from now."""
        return cls(boot=boot_id(), mono=now_s() + after_s, unix=time.time() + after_s)

    @classmethod
    def at_mono(cls, mono: float) -> Instant:
        """The moment `mono` on this process's `now_s` clock."""
        now_mono, now_unix = now_s(), time.time()
        return cls(boot=boot_id(), mono=mono, unix=now_unix + (mono - now_mono))

    def to_mono(self) -> float:
        """This moment on this process's `now_s` clock: exact on the same boot; else by the wall clock."""
        if self.boot is not None and self.boot == boot_id():
            return self.mono
        return now_s() + (self.unix - time.time())

    def left_s(self) -> float:
        """Seconds until this moment (negative: passed)."""
        return self.to_mono() - now_s()

    def plus(self, seconds: float) -> Instant:
        return Instant(boot=self.boot, mono=self.mono + seconds, unix=self.unix + seconds)


class HeldBid(BaseModel):
    """A kept host's interruptible terms, as `up --interruptible` took them (spec/interruptible.py's, kept here
    because the record is below the spec)."""

    bid_usd_per_h: float | None = None  # None: auto (the offer's min_bid plus a margin)
    max_interruptions: int
    checkpoint: str | None = None  # relative to the workdir
    wait_minutes: float | None = None  # --on-outbid wait:MINUTES
    checkpoint_max_mb: float
    ceiling_dph_usd: float | None = None  # the most any host of the hold may bill per hour (the worst case's)
    worst_case_usd: float | None = None  # the `up`'s worst case over k interruptions


class HeldHost(BaseModel):
    """One kept host, as every command of the hold reads and updates it (the module's docstring)."""

    version: int = 1
    name: str
    hold_id: str  # the `up`'s run id: the label's, every ledger line's, the evidence directory's
    machine: str = Field(default_factory=this_host)  # where it was made: its locks and clock are that machine's
    state: HoldState = "starting"
    sim: bool = False
    api_url: str
    account: str | None = None  # the key's fingerprint: a command with another key is refused
    sim_key: str | None = None  # the detached simulator's account key (--sim only: it bills nothing)
    # The --key-file the `up` was given (its path, never its bytes): each later command masks that key and leaves
    # out files holding it as the `up` did, given the flag or not (a --sim hold's commands need none).
    key_file: str | None = None
    key_file_sha256: str | None = None  # the key it held then: a command that cannot find it again is refused
    sim_pid: int | None = None  # the detached simulator of a --sim hold (stopped with the last hold on it)
    sim_pid_start: str | None = None
    evidence_dir: str  # <evidence>/<hold_id>: the hold's record, and each command's evidence below it
    max_usd: float
    max_minutes: float
    idle_minutes: float
    t0: Instant  # the hold's start: its meter's t0 (the time cap counts from here)
    cap_deadline: Instant  # t0 + the time cap: never moves
    hard_deadline: Instant | None = None  # the earlier of both caps at the price billed, at the last command
    idle_deadline: Instant | None = None  # pushed by each exec and keep, never past the cap
    switch_lead_s: float = 0.0  # the switch deletes this long before the caps' deadline (TeardownBudget.switch_s)
    host_cap_epoch: int | None = None  # the dead-man switch's own deadlines, on the host's clock (recorded)
    host_idle_epoch: int | None = None
    # The instance, once a create named it
    instance_id: int | None = None
    label: str | None = None
    labels: list[str] = Field(default_factory=list)  # every label a create of the hold sent
    offer_id: int | None = None
    machine_id: int | None = None
    gpu: str | None = None
    created: Instant | None = None  # the PUT: the meter bills from here
    dph_usd: float | None = None  # the highest price any read showed: billed from the create
    usd_per_byte: float = 0.0  # transfers, both ways, at the higher of the offer's two rates
    bytes_up: int = 0
    bytes_down: int = 0
    accrued_usd: float = 0.0  # at `seen_unix`, by the last command's meter
    seen_unix: float | None = None
    # SSH: where, with which key (0600, under <NAME>.key/), and the host key the first connection saw
    key_path: str | None = None
    endpoints: list[SshEndpoint] = Field(default_factory=list)
    host_key_fingerprint: str | None = None
    host_key_type: str | None = None
    host_key_base64: str | None = None
    # What the host delivered, as the `up` measured it before any work (run/receipt.py): each later command's
    # record carries it, and its steps find the host's file in VH_RECEIPT as a run's do
    receipt: Receipt | None = None
    receipt_path: str | None = None
    # The upload: the workdir and the manifest of what the host has (posix path -> sha256)
    workdir: str | None = None
    exclude: list[str] = Field(default_factory=list)
    include: list[str] = Field(default_factory=list)  # credential files the `up`'s --include took in
    workdir_max_mb: float | None = None
    manifest: dict[str, str] = Field(default_factory=dict)
    manifest_state: Literal["clean", "applying"] = "clean"  # applying: an upload was cut; the next sends all
    # The commands
    execs: int = 0
    last_exec_unix: float | None = None
    last_exec_rc: int | None = None
    exec_unfinished: bool = False  # an exec that never came back (killed): its command may still run there
    message: str = ""
    # --interruptible (docs/interruptible.md): the terms, the hosts so far, the outbid handled between commands
    bid: HeldBid | None = None
    setup: list[str] = Field(default_factory=list)  # the `up`'s --setup commands: a replacement runs them again
    attempts: list[Attempt] = Field(default_factory=list)  # every host of the hold, in order
    settled_usd: float = 0.0  # what the hold's earlier hosts (outbid, deleted, proven gone) accrued
    excluded_machines: list[int] = Field(default_factory=list)  # machines an outbid hit: not rented again
    host_home: str | None = None  # the host's $HOME: the checkpoint is copied off a stopped husk by path
    salvaged: str | None = None  # the checkpoint folder salvaged last: the next host's restore
    up_options: dict[str, Any] = Field(default_factory=dict)  # the `up`'s flags: a replacement is rented by them
    watcher_pid: int | None = None  # the detached watcher (kept/watch.py) that reads the instance between commands
    watcher_pid_start: str | None = None

    @property
    def outbids(self) -> int:
        """The outbids the hold met so far (hosts that ended outbid, pauses a host resumed from)."""
        return sum(a.ended.startswith("outbid") for a in self.attempts) + sum(a.pauses for a in self.attempts)

    @property
    def idle_s(self) -> float:
        return self.idle_minutes * 60.0

    @property
    def max_seconds(self) -> float:
        return self.max_minutes * 60.0

    def deadline(self) -> Instant:
        """When the hold ends on its own, when its switch deletes the host: the earliest of the time cap, the caps
        at the price billed (as the last command's meter saw them), both `switch_lead_s` early, and the idle
        deadline."""
        caps = [d.plus(-self.switch_lead_s) for d in (self.cap_deadline, self.hard_deadline) if d is not None]
        candidates = [*caps, *([self.idle_deadline] if self.idle_deadline is not None else [])]
        return min(candidates, key=lambda d: d.to_mono())

    def cap_end(self) -> Instant:
        """When the switch deletes the host at the caps (never later: no command moves it later)."""
        caps = [d for d in (self.cap_deadline, self.hard_deadline) if d is not None]
        return min(caps, key=lambda d: d.to_mono()).plus(-self.switch_lead_s)

    def left_s(self) -> float:
        return self.deadline().left_s()

    def expired(self) -> bool:
        return self.left_s() <= 0

    def why_deadline(self) -> str:
        """Which deadline ends the hold, for people."""
        which = self.deadline()
        if self.idle_deadline is not None and which is self.idle_deadline:
            return "idle"
        if self.hard_deadline is not None and self.hard_deadline.to_mono() < self.cap_deadline.to_mono() - 0.5:
            return "dollar cap"
        return "time cap"

    def accrued_now_usd(self) -> float:
        """An upper bound of what the hold has cost by now: its price from the create to now, and the bytes."""
        if self.created is None or self.dph_usd is None:
            return self.accrued_usd
        compute = max(0.0, now_s() - self.created.to_mono()) * self.dph_usd / 3600.0
        return max(self.accrued_usd, compute + (self.bytes_up + self.bytes_down) * self.usd_per_byte)


class Busy(BaseModel):
    """Who holds a kept host's lock (`<NAME>.busy.json`)."""

    pid: int
    host: str
    command: str  # "up", "exec", ...
    since_unix: float


def check_name(name: str) -> str:
    """A kept host's name: lowercase letters, digits and dashes, 1-32, starting with a letter or digit."""
    if not NAME_RE.fullmatch(name or ""):
        raise ConfigError(f"{name!r} is not a kept host's name: use 1-32 lowercase letters, digits and dashes, "
                          "starting with a letter or a digit (e.g. `train-a`)")
    return name


class HeldLock:
    """A held `flock` on `<NAME>.lock`: one command at a time works on a kept host. Released by `release`, or
    by the kernel when the process dies."""

    def __init__(self, fd: int, busy_path: Path | None) -> None:
        self._fd, self._busy_path = fd, busy_path

    def release(self) -> None:
        if self._fd < 0:
            return
        if self._busy_path is not None:
            with contextlib.suppress(OSError):
                self._busy_path.unlink()
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class HoldBusy(ConfigError):
    """Another command (`busy`) is working on the kept host (exit 2: nothing done)."""

    def __init__(self, message: str, busy: Busy | None) -> None:
        super().__init__(message)
        self.busy = busy


class HeldStore:
    """The kept hosts of one state directory (`<state>/held/`)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / HELD_DIR
        self.skipped: list[str] = []  # records `all` could not read, one line each

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def key_dir(self, name: str) -> Path:
        """Where the hold's one-time key is made (0700): `up` makes it, the end of the hold removes it."""
        return self.dir / f"{name}.key"

    def _ensure_dir(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"cannot make {self.dir} for kept hosts: {exc.strerror or exc}") from None

    # ------------------------------------------------------------------------------------ records
    def claim(self, record: HeldHost) -> None:
        """Write a new record; ConfigError when the name is held already (two `up NAME` at once: one wins)."""
        self._ensure_dir()
        try:
            fd = os.open(self.path(record.name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            raise ConfigError(f"{record.name!r} is already a kept host") from None
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path(record.name)}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(record.model_dump_json(indent=1))
            fh.flush()
            os.fsync(fh.fileno())

    def load(self, name: str) -> HeldHost | None:
        """The record, None when there is none; ConfigError naming the file when it cannot be read."""
        path = self.path(name)
        try:
            raw = read_regular_file(path, max_bytes=MAX_RECORD_BYTES, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except (UnusableFile, OSError) as exc:
            raise ConfigError(f"the kept host's record {path} cannot be read: {getattr(exc, 'strerror', None) or exc}"
                              ) from None
        try:
            return HeldHost.model_validate(json.loads(raw))
        except (ValueError, ValidationError, RecursionError) as exc:
            raise ConfigError(f"the kept host's record {path} is not one ({type(exc).__name__}); `vast-e2e reap` "
                              "still finds its instance by its label and the ledger") from None

    def save(self, record: HeldHost) -> None:
        """Replace the record whole (beside, then renamed): a full disk leaves the old one."""
        self._ensure_dir()
        path = self.path(record.name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(record.model_dump_json(indent=1))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    @contextlib.contextmanager
    def _write_lock(self, name: str) -> Iterator[None]:
        self._ensure_dir()
        fd = os.open(self.dir / f"{name}.wlock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def update(self, name: str, change: Callable[[HeldHost], None], *, ending_ok: bool = False) -> HeldHost | None:
        """Read, change, write back, under the record's write lock; None (nothing written) when the record is
        gone, or ending (unless `ending_ok`): a hold that is ending is never brought back by a late write."""
        with self._write_lock(name):
            record = self.load(name)
            if record is None or (record.state == "ending" and not ending_ok):
                return None
            change(record)
            self.save(record)
            return record

    def all(self) -> list[HeldHost]:
        """Every readable record, by name; the unreadable ones named in `skipped`."""
        self.skipped = []
        try:
            paths = sorted(self.dir.glob("*.json"))
        except OSError:
            return []
        found = []
        for path in paths:
            if path.name.endswith(".busy.json") or not NAME_RE.fullmatch(path.stem):
                continue
            try:
                record = self.load(path.stem)
            except ConfigError as exc:
                self.skipped.append(str(exc))
                continue
            if record is not None:
                found.append(record)
        return found

    def remove(self, name: str) -> None:
        """The hold ended: its key overwritten and removed (everything under `<NAME>.key/`), then the record and
        the lock files."""
        key_dir = self.key_dir(name)
        files = sorted((p for p in key_dir.rglob("*") if p.is_file() and not p.is_symlink()), reverse=True) \
            if key_dir.is_dir() and not key_dir.is_symlink() else []
        for key in files:
            with contextlib.suppress(OSError):
                size = key.stat().st_size
                with open(key, "r+b", buffering=0) as fh:
                    fh.write(b"\0" * size)
                    os.fsync(fh.fileno())
            with contextlib.suppress(OSError):
                key.unlink()
        if key_dir.is_dir() and not key_dir.is_symlink():
            for sub in sorted((p for p in key_dir.rglob("*") if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                key_dir.rmdir()
        with self._write_lock(name):
            with contextlib.suppress(OSError):
                self.path(name).unlink()
        for suffix in (".busy.json", ".lock", ".wlock", ".down.lock"):
            with contextlib.suppress(OSError):
                (self.dir / f"{name}{suffix}").unlink()

    # ------------------------------------------------------------------------------------ the key
    def make_key_dir(self, name: str) -> Path:
        """The 0700 directory the hold's key is made in (fresh: one left by an earlier hold is refused)."""
        self._ensure_dir()
        path = self.key_dir(name)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            raise ConfigError(f"{path} is left from an earlier hold of {name!r}; remove it (it holds a private "
                              "key) or pick another name") from None
        return path

    def key_usable(self, record: HeldHost) -> str | None:
        """Why the hold's key file cannot be used (none recorded, not under the hold's key dir, another owner,
        group/other access, a link), else None."""
        if record.key_path is None:
            return "no key recorded (its `up` did not get that far)"
        path = Path(record.key_path)
        if self.key_dir(record.name).resolve() not in path.resolve().parents:
            return f"{path} is not under {self.key_dir(record.name)}"
        try:
            st = path.lstat()
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return f"{path} must be yours and mode 600"
        return None

    # ------------------------------------------------------------------------------------ the busy lock
    def lock(self, name: str, command: str, *, wait_watch_s: float = 0.0) -> HeldLock:
        """Take the kept host for `command`; HoldBusy naming who has it when another command does. The hold's
        watcher (an outbid between commands, being handled) is waited for up to `wait_watch_s`."""
        self._ensure_dir()
        fd = os.open(self.dir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        until = now_s() + wait_watch_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                busy = self.busy(name)
                if busy is not None and busy.command == "watch" and now_s() < until:
                    time.sleep(0.2)
                    continue
            os.close(fd)
            busy = self.busy(name)
            who = (f"`{busy.command}` (pid {busy.pid}, started {time.time() - busy.since_unix:.0f} s ago)"
                   if busy else "another command")
            raise HoldBusy(f"kept host {name!r} is busy: {who} is working on it. One command at a time: wait "
                           "for it to end (Ctrl-C stops an exec and keeps the host), then run this again", busy
                           ) from None
        me = this_process()
        busy_path = self.dir / f"{name}.busy.json"
        with contextlib.suppress(OSError):
            tmp = busy_path.with_name(f".{busy_path.name}.{os.getpid()}.tmp")
            tmp.write_text(Busy(pid=me.pid, host=me.host, command=command, since_unix=time.time()).model_dump_json())
            os.replace(tmp, busy_path)
        return HeldLock(fd, busy_path)

    def down_lock(self, name: str, *, wait_s: float, on_wait: Callable[[str], None]) -> HeldLock:
        """One `down` of a kept host at a time (`down` never takes `lock`: it must not wait for an exec). A second
        waits for the first to end, up to `wait_s` (then HoldBusy), and finds what it left."""
        self._ensure_dir()
        fd = os.open(self.dir / f"{name}.down.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        until, told = now_s() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return HeldLock(fd, None)
            except OSError:
                if now_s() >= until:
                    os.close(fd)
                    raise HoldBusy(f"kept host {name!r}: another `down` has been deleting it for over {wait_s:.0f} "
                                   f"s; let it end (or stop it), then run `vast-e2e down {name}` again", None) from None
            if not told:
                on_wait(f"kept host {name}: another `down` is deleting it; waiting for it to end")
                told = True
            time.sleep(0.2)

    def busy(self, name: str) -> Busy | None:
        """Who works on the kept host now, None when nobody does (the lock is free)."""
        lock = self.dir / f"{name}.lock"
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held: read who
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)
        try:
            raw = read_regular_file(self.dir / f"{name}.busy.json", max_bytes=4096, follow_symlinks=False)
            return Busy.model_validate(json.loads(raw))
        except (OSError, UnusableFile, ValueError, ValidationError):
            return Busy(pid=0, host="?", command="a command", since_unix=time.time())
