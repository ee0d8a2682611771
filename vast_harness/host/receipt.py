"""Take the receipt on the rented host: upload its own small payload into a private directory, run `vh-receipt`,
read its record back, bounded in time and bytes.

The payload (`RECEIPT_PAYLOAD`: `remote/receipt/` with its launcher `bin/vh-receipt`, and `remote/__init__.py`)
goes up for every kind of run: a `run -- CMD` uploads the user's workdir, not the harness's bundle, so the
receipt cannot ride in it. It unpacks under `~/.vh-receipt` (mode 700), apart from the bundle's `~/vh`, and the
launcher's folder is appended LAST to PATH: a host's own `vh-receipt` answers first (the simulator's hosts answer
that way, from their offer). A host that lies on purpose controls the machine and can answer anything: the
receipt catches degraded hardware, not a malicious host (docs/limits.md).

One command does it all (unpack, run, print the record), so a host refused on its receipt ran exactly that and
the arrival and dead-man checks before it. The launcher exits 3 when the image cannot measure (no python3, no
torch, a CPU-only torch): "not measured", the reason on its output.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from vast_harness.host.bundle import Bundle, build_bundle
from vast_harness.host.ssh import HostSession

RECEIPT_PAYLOAD = ("remote/__init__.py", "remote/receipt")
PRIVATE_DIR = ".vh-receipt"  # under the host's $HOME
UPLOAD_NAME = "vh-receipt.tar.gz"
LAUNCHER_DIR = "remote/receipt/bin"  # inside PRIVATE_DIR: appended last to PATH
PROGRAM = "vh-receipt"
NOT_MEASURED_RC = 3  # the launcher: this image cannot measure
SETUP_FAILED_RC = 97  # the payload could not be unpacked
RC_MARK, FILE_MARK = "VH-RECEIPT-RC", "VH-RECEIPT-FILE"
MAX_OUTPUT_BYTES = 4 << 20  # a receipt of 16 GPUs with every burn window is ~0.5 MB; more is a flood
MAX_OUTPUT_LINES_KEPT = 40  # the receipt's own console lines kept for the record


def receipt_payload(root: Path | None = None) -> Bundle:
    """The receipt's payload, reproducible (the same files give the same sha256)."""
    return build_bundle(root, RECEIPT_PAYLOAD) if root is not None else _shipped_payload()


@cache
def _shipped_payload() -> Bundle:
    return build_bundle(None, RECEIPT_PAYLOAD)


def receipt_command(budget_s: float) -> str:
    """The one command the host runs: unpack the payload privately, run `vh-receipt` from PATH (ours last), print
    its exit status, the record's path and the record."""
    d = f'"$HOME/{PRIVATE_DIR}"'
    # chmod: an installed wheel may not have kept the launcher's executable bit, which the tarball copies
    setup = (f'{{ rm -rf {d} && mkdir -p {d} && chmod 700 {d} && tar -xzf "$HOME/{UPLOAD_NAME}" -C {d} && '
             f'chmod 700 {d}/{LAUNCHER_DIR}/{PROGRAM} && rm -f "$HOME/{UPLOAD_NAME}"; }} '
             f'|| {{ echo "{RC_MARK} {SETUP_FAILED_RC}"; exit {SETUP_FAILED_RC}; }}')
    return "; ".join([
        f'{setup}',
        f'export PATH="$PATH:$HOME/{PRIVATE_DIR}/{LAUNCHER_DIR}"',
        f'{PROGRAM} --out {d}/receipt.json --budget-s {shlex.quote(f"{budget_s:g}")} 2>&1',
        f'echo "{RC_MARK} $?"',
        f'echo "{FILE_MARK} $HOME/{PRIVATE_DIR}/receipt.json"',
        f'cat {d}/receipt.json 2>/dev/null',
    ])


class ReceiptRead(BaseModel):
    """What the host answered: its record (parsed, and as sent), the launcher's status, its console lines."""

    doc: Any = None  # the parsed record, None when there was none to parse
    text: str = ""  # the record as the host sent it (what the evidence keeps)
    rc: int | None = None  # vh-receipt's exit status (None: no status came back)
    host_path: str | None = None  # where the record is on the host (a step may copy it: VH_RECEIPT)
    output: list[str] = Field(default_factory=list)  # the receipt's own lines (the last of them)
    problem: str = ""  # why no record could be used ("" when `doc` is one)
    answered: bool = True  # False: the link was lost or the command did not end by itself
    timed_out: bool = False
    seconds: float = 0.0
    bytes_read: int = 0

    @property
    def not_measured(self) -> bool:
        return self.rc == NOT_MEASURED_RC


def upload_payload(session: HostSession, payload: Bundle, *, deadline: float,
                   on_bytes: Callable[[int], None], abandon: Callable[[], bool]) -> int:
    """The payload to `~/vh-receipt.tar.gz` (the command unpacks it); the bytes sent, each reported."""
    reported = [0]

    def progress(done: int, total: int) -> None:
        on_bytes(done - reported[0])
        reported[0] = done

    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as fh:
        fh.write(payload.data)
        fh.flush()
        sent = session.put(Path(fh.name), UPLOAD_NAME, on_progress=progress, deadline=deadline, abandon=abandon)
    on_bytes(max(0, sent - reported[0]))
    return sent


def run_receipt(session: HostSession, *, budget_s: float, timeout_s: float, stop: threading.Event,
                on_bytes: Callable[[int], None]) -> ReceiptRead:
    """Run the receipt's command and read what it prints, at most MAX_OUTPUT_BYTES (a host that floods is cut
    and refused); `on_bytes` is told of every byte read (billed bandwidth)."""
    before: list[str] = []
    record: list[str] = []
    state: dict[str, Any] = {"rc": None, "path": None, "in_record": False, "bytes": 0}
    flood = threading.Event()
    cut = threading.Event()  # the flood or the caller's stop

    def keep(stream: str, line: str) -> None:
        if flood.is_set():
            return
        state["bytes"] += len(line) + 1
        on_bytes(len(line) + 1)
        if state["bytes"] > MAX_OUTPUT_BYTES:
            flood.set()
            cut.set()
            return
        if state["in_record"]:
            record.append(line)
        elif line.startswith(RC_MARK + " ") and state["rc"] is None:
            word = line[len(RC_MARK) + 1:].strip()
            state["rc"] = int(word) if word.isdigit() else None
        elif line.startswith(FILE_MARK + " ") and state["rc"] is not None:
            state["path"], state["in_record"] = line[len(FILE_MARK) + 1:].strip()[:4096], True
        else:
            before.append(line[:2000])
            del before[:-MAX_OUTPUT_LINES_KEPT]

    done = threading.Event()

    def relay() -> None:  # the caller's stop (a cancel, the cap) ends the wait like a flood does
        while not done.wait(0.1):
            if stop.is_set():
                cut.set()
                return

    threading.Thread(target=relay, daemon=True, name="vh-receipt-stop").start()
    try:
        outcome = session.run(receipt_command(budget_s), on_line=keep, timeout_s=max(0.05, timeout_s), stop=cut)
    finally:
        done.set()
    read = ReceiptRead(rc=state["rc"], host_path=state["path"], output=before, seconds=round(outcome.seconds, 3),
                       bytes_read=state["bytes"], timed_out=outcome.timed_out and not flood.is_set(),
                       answered=outcome.rc is not None or flood.is_set())
    if flood.is_set():
        read.problem = f"the receipt answered more than {MAX_OUTPUT_BYTES} bytes (flooding): refused"
        return read
    if outcome.rc is None:
        read.problem = f"the receipt did not finish: {outcome.detail or 'no exit status'}"
        return read
    if read.rc == SETUP_FAILED_RC:
        read.problem = "the receipt's payload could not be unpacked on the host: " + " | ".join(before[-3:])
        return read
    if read.not_measured:
        read.problem = next((line.removeprefix("vh-receipt: ") for line in reversed(before)
                             if line.startswith("vh-receipt: ")), "this image cannot measure")[:300]
        return read
    read.text = "\n".join(record)
    if not read.text.strip():
        read.problem = f"the receipt wrote no record (exit {read.rc}): " + (" | ".join(before[-3:]) or "no output")
        return read
    try:
        read.doc = json.loads(read.text)
    except RecursionError:
        read.problem = "the receipt's record is nested too deeply to read"
    except ValueError as exc:
        read.problem = f"the receipt's record is not JSON ({str(exc)[:120]})"
    return read
