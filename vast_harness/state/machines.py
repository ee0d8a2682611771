"""The machines' history (`<state>/machines.jsonl`): every receipt a machine gave this user, one line each, so a
machine that failed its receipt is skipped the next time (`market/plan.py` excludes it before renting) and
`vast-e2e machines` can list what each delivered, when.

Written like the ledger (`ledger.write_line`: whole lines, `flock`, fsync), best effort: a line that cannot be
written is said, never raised (the host was judged; its refusal stands). Lines name the API they are about, so
the simulator's machine ids never skip a real machine. `vast-e2e machines --forget ID` (or `--forget-all`)
appends a `forget` line: the history keeps what happened, and the machine is tried again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from vast_harness.files import UnusableFile, read_regular_file
from vast_harness.state.ledger import write_line

MACHINES_FILE = "machines.jsonl"
EMBEDDED_SIM = "embedded simulator"  # --sim: each run's simulator has its own port, one seeded market
MAX_HISTORY_BYTES = 64 * 1024 * 1024
MAX_FAILED_KEPT = 8  # failed checks per line: enough to say why, never the whole receipt


def market_of(api_url: str, *, sim: bool) -> str:
    """Whose machine ids a line is about: the API's URL, or the embedded simulator's market (its URL changes with
    every `--sim` run; its machines do not)."""
    return EMBEDDED_SIM if sim else api_url


class FailedMeasure(BaseModel):
    measure: str
    gpu: int | None = None
    measured: float | None = None
    expected: float | None = None
    unit: str = ""
    line: str = ""  # the check as the console said it


class MachineLine(BaseModel):
    """One line of the history: a receipt a machine gave, or a `forget` (machine_id None: every machine)."""

    v: int = 1
    event: Literal["receipt", "forget"]
    t_unix: float = Field(default_factory=time.time)
    api_url: str  # the market: market_of()
    machine_id: int | None = None
    offer_id: int | None = None
    instance_id: int | None = None
    run_id: str | None = None
    gpu_name: str | None = None
    num_gpus: int | None = None
    verdict: Literal["passed", "failed", "not_measured"] | None = None
    failed: list[FailedMeasure] = Field(default_factory=list)
    reason: str = ""
    simulated: bool = False


class MachineRecord(BaseModel):
    """A machine as the history tells it (for one API): its receipts in order, and whether it is skipped."""

    machine_id: int
    gpu_name: str | None = None
    receipts: list[MachineLine] = Field(default_factory=list)  # since the last forget
    forgotten: int = 0  # receipts before a forget

    @property
    def last(self) -> MachineLine | None:
        return self.receipts[-1] if self.receipts else None

    @property
    def skipped(self) -> bool:
        """Its last receipt failed: a later run does not rent it (until `vast-e2e machines --forget`)."""
        return self.last is not None and self.last.verdict == "failed"


class MachineHistory:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / MACHINES_FILE
        self.bad_lines = 0

    def append(self, line: MachineLine) -> None:
        """One line, whole and on disk; LedgerWriteError when it cannot be (the caller says it, best effort)."""
        write_line(self.path, (line.model_dump_json() + "\n").encode(), what="the machines' history")

    def lines(self) -> list[MachineLine]:
        """Every readable line, in order; unreadable ones are counted in `bad_lines`, never fatal."""
        self.bad_lines = 0
        try:
            data = read_regular_file(self.path, max_bytes=MAX_HISTORY_BYTES, follow_symlinks=False)
        except (FileNotFoundError, UnusableFile, OSError):
            return []
        out = []
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                out.append(MachineLine.model_validate(json.loads(raw.decode("utf-8"))))
            except (ValueError, UnicodeDecodeError, RecursionError, ValidationError):
                self.bad_lines += 1
        return out

    def machines(self, api_url: str) -> dict[int, MachineRecord]:
        """Each machine of `api_url` the history knows, by id, in the order first seen."""
        found: dict[int, MachineRecord] = {}
        for line in self.lines():
            if line.api_url != api_url:
                continue
            if line.event == "forget":
                for mid, rec in found.items():
                    if line.machine_id is None or line.machine_id == mid:
                        rec.forgotten += len(rec.receipts)
                        rec.receipts = []
                continue
            if line.machine_id is None:
                continue
            rec = found.setdefault(line.machine_id, MachineRecord(machine_id=line.machine_id))
            rec.receipts.append(line)
            rec.gpu_name = line.gpu_name or rec.gpu_name
        return found

    def skipped(self, api_url: str) -> set[int]:
        """The machines whose last receipt (since any forget) failed."""
        return {mid for mid, rec in self.machines(api_url).items() if rec.skipped}

    def forget(self, api_url: str, machine_id: int | None) -> None:
        """The machine (or, None, every machine of `api_url`) is tried again; its receipts stay listed."""
        self.append(MachineLine(event="forget", api_url=api_url, machine_id=machine_id))
