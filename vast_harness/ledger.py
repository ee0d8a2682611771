"""The write-ahead ledger: `.evidence/vast/ledger.jsonl`, one fsync'd JSON line per create intent and outcome.

Written *before* each PUT and the moment any response carries `new_contract`, so that a harness killed at any
point leaves enough on disk for `reap` to find and delete what it may have rented.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

# create_unresolved: a create whose outcome stayed unknown (answer lost, interrupted while held): `reap` must
# keep looking for its label.
Event = Literal["intent", "created", "create_unknown", "create_unresolved", "create_failed", "delete_ack",
                "absence"]


class LedgerEntry(BaseModel):
    t_unix: float
    run_id: str
    event: Event
    label: str
    offer_id: int | None = None
    instance_id: int | None = None
    verdict: str | None = None  # for "absence": gone | unknown | present
    detail: str | None = None


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, run_id: str, event: Event, label: str, **fields) -> LedgerEntry:
        entry = LedgerEntry(t_unix=time.time(), run_id=run_id, event=event, label=label, **fields)
        line = (entry.model_dump_json(exclude_none=True) + "\n").encode()
        # O_APPEND keeps concurrent runs' lines whole; fsync makes the intent durable before the PUT.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry

    def entries(self) -> list[LedgerEntry]:
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_text().splitlines():
            try:
                out.append(LedgerEntry.model_validate(json.loads(raw)))
            except (ValueError, TypeError):
                continue  # a line torn by a kill mid-write: the next lines still count
        return out

    def unproven(self) -> tuple[dict[int, LedgerEntry], set[str]]:
        """Instances created but never proven gone, and labels whose create outcome is unknown."""
        created: dict[int, LedgerEntry] = {}
        gone: set[int] = set()
        labels_with_instance: set[str] = set()
        intents: set[str] = set()
        for e in self.entries():
            if e.event == "intent":
                intents.add(e.label)
            if e.instance_id is not None and e.event in ("created", "create_failed", "delete_ack"):
                created.setdefault(e.instance_id, e)
                labels_with_instance.add(e.label)
            if e.event == "absence" and e.verdict == "gone" and e.instance_id is not None:
                gone.add(e.instance_id)
        pending = {i: e for i, e in created.items() if i not in gone}
        # An intent with no recorded instance may still have created one (a create that timed out).
        return pending, intents - labels_with_instance
