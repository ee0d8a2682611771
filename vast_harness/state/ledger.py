"""The write-ahead ledger: `.evidence/vast/ledger.jsonl`, one fsync'd JSON line per create intent and outcome.

Written *before* each PUT and the moment any response carries `new_contract`, so that a harness killed at any
point leaves enough on disk for `reap` to find and delete what it may have rented.

Writes are checked: the intent must be whole and on disk before the PUT (`LedgerWriteError` otherwise, so
the caller never creates). Later lines (outcomes, deletes, proofs) are recorded best effort: a full disk must
never stop a teardown, and a missing outcome only makes `reap` look again. Reads are tolerant: a torn,
non-UTF-8 or malformed line is skipped and reported, never fatal. Each line names the API and the account
(a key fingerprint, never the key) its instance belongs to, so `reap` with another key does not read
"not visible to this key" as "gone"; and, when the writer has heard the API server, the server's time
(`server_unix`), because another process judging a line's age must not trust either machine's wall clock.

The ledger lives in the user's state directory (state/dirs.py) and is shared by every run, fleet and reap of
that user: each line is written under an exclusive `flock`, so concurrent writers never tear or interleave.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, Unpack

from pydantic import BaseModel, Field, SecretStr, StrictInt, ValidationError

from vast_harness.errors import LedgerWriteError
from vast_harness.files import UnusableFile, read_regular_file
from vast_harness.masking import MASKER
from vast_harness.state.process import ProcessId, this_process


class LedgerSpec(Protocol):
    """What the ledger reads of a run spec (spec.resolve.RunSpec): where the user's state lives, and the API
    and account its lines are stamped with. Structural, so the state layer imports nothing of spec/."""

    @property
    def state_dir(self) -> Path: ...
    @property
    def api_url(self) -> str: ...
    @property
    def api_key(self) -> SecretStr | None: ...

Event = Literal["intent", "created", "create_unknown", "create_unresolved", "create_failed", "delete_ack",
                "absence", "label_swept", "seen", "disowned", "repriced", "outbid"]
REQUIRED_EVENTS = frozenset({"intent"})  # no PUT without it on disk
OUTCOME_EVENTS = ("created", "create_failed", "delete_ack")  # events that name an instance a run owned
# `create_failed` verdict for an answer that says nothing was created (410 no_such_ask, 429): the label is settled,
# `reap` need not look for it (a 5xx create_failed carries no verdict: it may still have created)
NOTHING_CREATED = "nothing_created"
# A create's story, per label: the last of these decides whether its outcome is still unknown.
# `disowned`: the instance a create answer named is not the run's, so what that create made is unknown again
_CREATE_EVENTS = frozenset({"intent", "create_unknown", "create_unresolved", "created", "create_failed", "disowned"})
_OPEN_CREATE_EVENTS = frozenset({"intent", "create_unknown", "create_unresolved", "disowned"})
MAX_LINE_BYTES = 64 * 1024
MAX_LEDGER_BYTES = 512 * 1024 * 1024  # years of lines; past this the file is not a ledger
LEDGER_FILE = "ledger.jsonl"  # in the state dir, shared by every run, fleet and reap of the user


def new_run_id(prefix: str = "", *, unique: bool = True) -> str:
    """The id of a run (its evidence subdirectory, its ledger lines): `<prefix>YYYYmmddTHHMMSSZ` in UTC, so ids
    sort by time, then `-` and 6 random hex unless `unique` is False."""
    stamp = prefix + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{stamp}-{secrets.token_hex(3)}" if unique else stamp


def account_fingerprint(api_key: str) -> str:
    """Which account a key is, for the ledger: the first 12 hex of its sha256 (never the key itself)."""
    return hashlib.sha256(api_key.strip().encode("utf-8", "surrogateescape")).hexdigest()[:12]


class LedgerTarget(BaseModel):
    """The API and account an instance belongs to: only a client of the same target can prove it gone."""

    api_url: str
    account: str

    def describe(self) -> str:
        return f"{self.api_url} (account key fingerprint {self.account})"


class LedgerEntry(BaseModel):
    t_unix: float
    run_id: str
    event: Event
    label: str
    offer_id: StrictInt | None = None
    instance_id: StrictInt | None = None
    verdict: str | None = None  # for "absence": gone | unknown | present
    detail: str | None = None
    api_url: str | None = None  # the target; absent on lines written before targets were recorded
    account: str | None = None
    server_unix: float | None = None  # the API server's clock when written (its Date header), if known
    # The process that wrote the line (state/process.py): a run whose registration file was lost is still
    # known alive by its process. Absent on lines written before it was recorded.
    host: str | None = None
    pid: int | None = None
    pid_start: str | None = None
    # Where the run's evidence is (its directory), so `costs`, `logs` and `report` find its record wherever it
    # was written; and the quoted $/h on a create's intent, so a run killed before its record still gets an
    # estimated cost (a `repriced` line: a higher $/h a read of the instance showed). Absent on lines written
    # before they were recorded.
    evidence: str | None = None
    dph_usd: float | None = None

    @property
    def process(self) -> ProcessId | None:
        if self.host is None or self.pid is None:
            return None
        return ProcessId(host=self.host, pid=self.pid, start=self.pid_start)

    @property
    def target(self) -> LedgerTarget | None:
        if self.api_url is None or self.account is None:
            return None
        return LedgerTarget(api_url=self.api_url, account=self.account)


class EntryFields(TypedDict, total=False):
    """The optional fields of a LedgerEntry that `Ledger.append` takes as keywords."""

    offer_id: int | None
    instance_id: int | None
    verdict: str | None
    detail: str | None
    api_url: str | None
    account: str | None
    dph_usd: float | None


class BadLine(BaseModel):
    line_no: int
    reason: str


class LedgerView(BaseModel):
    """What the ledger says is still open, and the lines it could not read."""

    pending: dict[int, LedgerEntry] = Field(default_factory=dict)  # created, never proven gone
    # instances a read showed or a DELETE acknowledged deleting: only for these do null reads soon mean gone
    seen: set[int] = Field(default_factory=set)
    unresolved: dict[str, LedgerEntry] = Field(default_factory=dict)  # label -> intent whose outcome is unknown
    bad_lines: list[BadLine] = Field(default_factory=list)


class Ledger:
    def __init__(self, path: Path, target: LedgerTarget | None = None,
                 server_clock: Callable[[], float | None] | None = None, *, evidence_dir: Path | None = None) -> None:
        self.path = path
        self.target = target
        self.server_clock = server_clock
        self.evidence_dir = evidence_dir  # stamped on every line: where the writing run's record will be
        self.bad_lines: list[BadLine] = []  # from the last read
        self.write_failures: list[str] = []  # best-effort lines that did not reach the disk
        # No directory is made here: a reader (status, costs, a reap's look) must leave the disk as it found it.

    @classmethod
    def for_spec(cls, spec: LedgerSpec, server_clock: Callable[[], float | None] | None = None, *,
                 evidence_dir: Path | None = None) -> Ledger:
        """The ledger of `spec`'s state dir, stamping every line with the spec's API and account (and the
        server's time, from `server_clock`; the run's evidence directory, `evidence_dir`)."""
        return cls(spec.state_dir / LEDGER_FILE, target_of(spec), server_clock, evidence_dir=evidence_dir)

    # ------------------------------------------------------------------------------------ writing
    def append(self, run_id: str, event: Event, label: str, **fields: Unpack[EntryFields]) -> LedgerEntry:
        data: dict[str, Any] = dict(fields)
        if self.target is not None:
            data = {"api_url": self.target.api_url, "account": self.target.account} | data
        server_now = self.server_clock() if self.server_clock is not None else None
        if server_now is not None:
            data.setdefault("server_unix", round(server_now, 3))
        if self.evidence_dir is not None:
            data.setdefault("evidence", str(self.evidence_dir))
        me = this_process()
        data = {"host": me.host, "pid": me.pid, "pid_start": me.start, **data}
        entry = LedgerEntry(t_unix=time.time(), run_id=run_id, event=event, label=label, **data)
        line = (entry.model_dump_json(exclude_none=True) + "\n").encode()
        try:
            write_line(self.path, line)
        except LedgerWriteError as exc:
            if event in REQUIRED_EVENTS:
                raise
            # An outcome that did not reach the disk must not stop a create's follow-up or a teardown.
            self.write_failures.append(f"{event} {label}: {exc}")
        return entry

    # ------------------------------------------------------------------------------------ reading
    def entries(self) -> list[LedgerEntry]:
        """Every readable line; unreadable ones are skipped and listed in `bad_lines`."""
        self.bad_lines = []
        try:
            data = read_regular_file(self.path, max_bytes=MAX_LEDGER_BYTES, follow_symlinks=False)
        except FileNotFoundError:
            return []
        except UnusableFile as exc:
            self.bad_lines.append(BadLine(line_no=0, reason=f"{self.path} not read: it is {exc.strerror}"))
            return []
        except OSError as exc:
            self.bad_lines.append(BadLine(line_no=0, reason=f"cannot read {self.path}: {exc.strerror}"))
            return []
        out: list[LedgerEntry] = []
        for n, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            reason = _bad_reason(raw)
            if reason is None:
                try:
                    out.append(LedgerEntry.model_validate(json.loads(raw.decode("utf-8"))))
                    continue
                except ValidationError as exc:
                    first = exc.errors()[0]
                    reason = f"field {'.'.join(str(p) for p in first['loc']) or '?'}: {first['msg']}"
                except (ValueError, RecursionError) as exc:
                    reason = f"not JSON ({type(exc).__name__})"
            self.bad_lines.append(BadLine(line_no=n, reason=reason))
        return out

    def view(self) -> LedgerView:
        """Instances created and never proven gone; labels whose create may have made an instance."""
        entries = self.entries()
        created: dict[int, LedgerEntry] = {}
        gone: set[int] = set()
        labels_with_instance: set[str] = set()
        intents: dict[str, LedgerEntry] = {}
        last_create_event: dict[str, str] = {}
        swept: set[str] = set()
        seen: set[int] = set()
        disowned: set[int] = set()  # a create answer named them, but their rows carry another label: not the run's
        for e in entries:
            if e.instance_id is not None and (e.event == "seen" or (e.event == "delete_ack" and e.detail == "deleted")):
                seen.add(e.instance_id)
            if e.event in _OPEN_CREATE_EVENTS:
                intents.setdefault(e.label, e)
            if e.event in _CREATE_EVENTS:
                # a create_failed settles only when its answer said nothing was created (a 5xx may have)
                open_failure = e.event == "create_failed" and e.verdict != NOTHING_CREATED and e.instance_id is None
                last_create_event[e.label] = "create_unknown" if open_failure else e.event
            if e.instance_id is not None and e.event in OUTCOME_EVENTS:
                created.setdefault(e.instance_id, e)
                labels_with_instance.add(e.label)
            if e.event == "absence" and e.verdict == "gone" and e.instance_id is not None:
                gone.add(e.instance_id)
            if e.event == "label_swept" or (e.event == "create_failed" and e.verdict == NOTHING_CREATED):
                swept.add(e.label)
            if e.event == "disowned" and e.instance_id is not None:
                disowned.add(e.instance_id)
        if disowned:  # neither pending as the run's, nor evidence that the run's label made an instance
            created = {i: e for i, e in created.items() if i not in disowned}
            labels_with_instance = {e.label for e in entries if e.instance_id is not None
                                    and e.event in OUTCOME_EVENTS and e.instance_id not in disowned}
        pending = {i: e for i, e in created.items() if i not in gone}
        # An intent with no recorded instance may still have created one (a create that timed out, a held
        # create, a kill between PUT and answer): `reap` looks for its label until a sweep found nothing. Any
        # outcome line settles it (a refused create's `create_failed` too, not a 5xx's) unless a later line
        # reopens it.
        unresolved = {lab: e for lab, e in intents.items() if lab not in labels_with_instance and lab not in swept
                      and last_create_event.get(lab) in _OPEN_CREATE_EVENTS}
        return LedgerView(pending=pending, unresolved=unresolved, seen=seen, bad_lines=list(self.bad_lines))

    def unproven(self) -> tuple[dict[int, LedgerEntry], set[str]]:
        """Instances created but never proven gone, and labels whose create outcome is unknown."""
        v = self.view()
        return v.pending, set(v.unresolved)


def write_line(path: Path, line: bytes, *, what: str = "the ledger") -> None:
    """One whole line appended to `path`, on a fresh line, on disk (fsync) before returning; LedgerWriteError
    (naming `what` and the path) otherwise. Every ledger-like file is written here: the user's ledger and a
    fleet's `fleet.jsonl`. Keys and secrets masked (a line's URL or detail may quote one)."""
    line = MASKER.data(line)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerWriteError(f"cannot create the directory {path.parent} of {what}: {exc.strerror}") from None
    created = not path.exists()
    try:
        # O_APPEND keeps concurrent writers' lines whole; O_RDWR lets us look at the last byte.
        # Never through a link: a ledger.jsonl that points at someone else's file is not the user's ledger.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LedgerWriteError(f"{what} {path} is a symbolic link: refused (it may point at another user's "
                                   "file); remove the link") from None
        raise LedgerWriteError(f"cannot open {what} {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another writer's torn-line check and write never interleave with ours
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a torn last line (a kill mid-write) must not swallow this one
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise LedgerWriteError(f"short write to {what} {path}: {written} of {len(line)} bytes (disk full?)")
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # still under the lock: no one else has written since `size`
                os.ftruncate(fd, size)  # no torn half-line left for the next reader or writer
            raise
    except OSError as exc:
        raise LedgerWriteError(f"cannot write {what} {path}: "
                               f"{exc.strerror or errno.errorcode.get(exc.errno or 0, exc)}") from None
    finally:
        os.close(fd)  # releases the lock
    if created:  # the new file's directory entry must be durable too
        try:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass  # some filesystems refuse fsync on a directory; the file itself is synced


def target_of(spec: LedgerSpec) -> LedgerTarget | None:
    """The API and account a spec's runs belong to (None before the --sim key exists)."""
    if spec.api_key is None:
        return None
    return LedgerTarget(api_url=spec.api_url, account=account_fingerprint(spec.api_key.get_secret_value()))


def _bad_reason(raw: bytes) -> str | None:
    if len(raw) > MAX_LINE_BYTES:
        return f"line longer than {MAX_LINE_BYTES} bytes"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte {exc.start})"
    return None
