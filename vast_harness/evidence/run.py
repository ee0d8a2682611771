"""A run's evidence directory: the files, their layout, the typed run record, and the closing manifest.

harness-result.json (a `RunRecord`, versioned), offer-quote.json, steps.tsv, steps/<name>.log, remote/,
absence-proof.json, notifications.json (with `--notify`), and manifest.sha256 (sha256 of every file above). Nothing here ever holds the API key or
a `--remote-secret` value: every text this module writes goes through the process's masker (masking.py), a JSON
document's strings before it is serialised (settings, `--remote-env`, are recorded as given, a key or a secret
in one masked). Artifacts (`artifacts/`) are the user's files and are not written here: they stay byte for byte.

Writing evidence never stops a teardown: every write catches OSError (a full disk, a read-only mount) and
records it in `write_failures`, which the run reports and turns into its exit code. Step logs are capped:
past `head_bytes` only the last `tail_bytes` are kept, with a line saying how much was dropped between.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, TypeVar

from vast_harness.files import open_append
from vast_harness.masking import MASKER, mask
from vast_harness.records import AbsenceSummary, InstanceTeardown, RunRecord

NOTIFICATIONS_FILE = "notifications.json"  # what became of each --notify event (run/notify.py)
RECEIPTS_DIR = "receipts"  # each host's receipt as it answered, <instance>.json (run/receipt.py)
STEP_LOG_HEAD_BYTES = 8 * 1024 * 1024
STEP_LOG_TAIL_BYTES = 2 * 1024 * 1024
_T = TypeVar("_T")


def write_whole(path: Path, text: str, errors: str = "strict") -> None:
    """Write `path` whole or not at all: a full disk leaves the old file (or none), never a truncated one,
    and no `.tmp` behind. Keys and secrets masked."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(mask(text), encoding="utf-8", errors=errors)
        tmp.replace(path)
    finally:
        with contextlib.suppress(OSError):  # a read-only disk refuses even the unlink of nothing
            tmp.unlink(missing_ok=True)


def manifest_line(digest: str, name: str) -> str:
    """One `sha256sum` line, escaped as GNU sha256sum escapes it: a name holding a backslash, newline or CR
    gets a leading backslash and those characters as `\\\\`, `\\n`, `\\r`. A host file named
    "x\\n<64 zeros>  harness-result.json" therefore stays one line and cannot add a forged entry."""
    if not any(ch in name for ch in "\\\n\r"):
        return f"{digest}  {name}"
    escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return f"\\{digest}  {escaped}"


def overall_absence(teardowns: list[InstanceTeardown], unresolved_labels: Iterable[str] = (),
                    not_ours: dict[int, str] | None = None) -> AbsenceSummary:
    verdicts: dict[int, str] = {t.instance_id: t.verdict for t in teardowns}
    unresolved = sorted(unresolved_labels)
    if unresolved or any(v != "gone" for v in verdicts.values()):
        verdict = "unproven"  # a create of unknown outcome may have made an instance that bills
    else:
        verdict = "gone" if verdicts else "nothing-created"
    return AbsenceSummary(verdict=verdict, per_instance=verdicts, unresolved_labels=unresolved,
                          not_ours=dict(not_ours or {}))


class StepLog:
    """A step's log with a size cap: the first `head_bytes` and the last `tail_bytes`, and what was dropped."""

    def __init__(self, path: Path, head_bytes: int, tail_bytes: int, on_error: Callable[[str, OSError], None]):
        self.path, self._on_error = path, on_error
        self._head_left, self._tail_cap = head_bytes, tail_bytes
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self.total_bytes = 0
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self._fh: IO[bytes] | None = None
        try:
            self._fh = open_append(path)  # never held by a FIFO planted where the log goes
        except OSError as exc:
            on_error(f"steps/{path.name}", exc)

    def write(self, line: str) -> bool:
        """Record one line, masked; True while it falls in the head (worth showing live), False once in the tail."""
        data = mask(line).encode("utf-8", "replace") + b"\n"
        self.total_bytes += len(data)
        if len(data) <= self._head_left:
            self._head_left -= len(data)
            self._put(data)
            return True
        self._head_left = 0  # from here on everything goes through the tail, in order
        self._tail.append(data)
        self._tail_bytes += len(data)
        while self._tail_bytes > self._tail_cap and self._tail:
            old = self._tail.popleft()
            self._tail_bytes -= len(old)
            self.dropped_bytes += len(old)
            self.dropped_lines += 1
        return False

    def _put(self, data: bytes) -> None:
        if self._fh is None:
            return
        try:
            self._fh.write(data)
            self._fh.flush()  # on disk as it comes: `vast-e2e logs -f` follows the file from another process
        except OSError as exc:
            self._on_error(f"steps/{self.path.name}", exc)
            self._drop_handle()

    def _drop_handle(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass

    def close(self) -> None:
        if self.dropped_bytes:
            self._put(f"[vast-harness: {self.dropped_bytes} bytes in {self.dropped_lines} lines dropped here; "
                      f"the log keeps its first and last bytes, {self.total_bytes} bytes were printed]\n"
                      .encode())
        while self._tail:
            self._put(self._tail.popleft())
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self._on_error(f"steps/{self.path.name}", exc)
            self._fh = None


class RunEvidence:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.write_failures: list[str] = []
        self.step_log_head_bytes = STEP_LOG_HEAD_BYTES
        self.step_log_tail_bytes = STEP_LOG_TAIL_BYTES
        # Private: step logs and pulled files may hold what a host printed about the user's work. A directory that
        # cannot be made (checked before renting, but a file may take its place since) fails each write in turn,
        # recorded: it must never stop a teardown.
        for sub in (self.dir, self.dir / "steps", self.dir / "remote"):
            self.guarded(f"{sub.name}/", functools.partial(sub.mkdir, parents=True, exist_ok=True, mode=0o700))

    def _failed(self, what: str, exc: OSError) -> None:
        self.write_failures.append(f"{what}: {exc.strerror or exc}")

    def guarded(self, what: str, fn: Callable[[], _T]) -> _T | None:
        """Run a write; an OSError is recorded, never raised (a full disk must not stop the teardown)."""
        try:
            return fn()
        except OSError as exc:
            self._failed(what, exc)
            return None

    def write_json(self, name: str, payload: Any) -> Path | None:
        path = self.dir / name

        def write() -> Path:
            # A command, a glob, a URL or a host's file name may hold a key or a secret: masked in every string
            plain = json.loads(json.dumps(payload, default=str))
            write_whole(path, json.dumps(MASKER.json_value(plain), indent=2) + "\n")  # never a half-written file
            return path

        return self.guarded(name, write)

    def step_log(self, name: str) -> StepLog:
        return StepLog(self.dir / "steps" / f"{name}.log", self.step_log_head_bytes, self.step_log_tail_bytes,
                       self._failed)

    def append_step_tsv(self, name: str, rc: int | None, seconds: float, end: str = "") -> None:
        """One row; `end` (interrupted, timed_out, connection_lost) when the step did not end by itself: a
        reader whose record lacks the step (a kept host's later command's) still says how it ended."""
        def write() -> None:
            with open_append(self.dir / "steps.tsv") as fh:
                row = f"{name}\t{'NA' if rc is None else rc}\t{seconds:.3f}" + (f"\t{end}" if end else "")
                fh.write(mask(row + "\n").encode())

        self.guarded("steps.tsv", write)

    def write_result(self, record: RunRecord, teardowns: list[InstanceTeardown], proof_interval_s: float) -> None:
        self.write_json("absence-proof.json", {
            "interval_s": proof_interval_s,
            "instances": [t.model_dump() for t in teardowns],
            "verdict": record.absence.verdict,
            "unresolved_labels": record.absence.unresolved_labels,
            "not_ours": {str(i): why for i, why in record.absence.not_ours.items()},
        })
        self.write_json("harness-result.json", record.model_dump(mode="json"))
        self.write_manifest()

    def rewrite_result(self, record: RunRecord) -> bool:
        """Replace harness-result.json with `record` (the verdict changed after it was written) and the manifest;
        a result that cannot be replaced is removed rather than left saying something else. False then."""
        path = self.dir / "harness-result.json"
        if self.write_json(path.name, record.model_dump(mode="json")) is None:
            self.guarded(path.name, lambda: path.unlink(missing_ok=True))
            self.write_manifest()
            return False
        self.write_manifest()
        return True

    def write_manifest(self) -> None:
        def write() -> None:
            lines = []
            for path in sorted(p for p in self.dir.rglob("*")
                               if p.is_file() and p.name not in ("manifest.sha256", "manifest.sha256.tmp")):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                lines.append(manifest_line(digest, path.relative_to(self.dir).as_posix()))
            write_whole(self.dir / "manifest.sha256", "\n".join(lines) + "\n", errors="surrogateescape")

        self.guarded("manifest.sha256", write)
