"""Whose an instance is, read from its row: only a row that carries the label a create sent is that create's.

A create answer names an instance id, but it is the one witness a wrong `new_contract` corrupts (Vast's answer
naming another contract of the account: the user's database, another live run's host). Before anything deletes an
id on that answer alone, a read must show the id's row with the create's label. A row that cannot be read (reads
lag creates; the API fails) proves nothing either way: the id is left alone, and the create's own instance is
looked for by its label, the one thing a wrong answer cannot forge.

`read_owner` is one look (the row by id, then the label's rows); `await_owner` looks again every interval until a
look decides or its time is up. The run (`run/instances.py`) and `reap` both ask here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from vast_harness.clock import Clock, Sleep, now_s
from vast_harness.errors import VastError
from vast_harness.instance.absence import is_lingering
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance

OwnerKind = Literal["ours", "theirs", "unread"]


@dataclass(frozen=True)
class Owner:
    """What reads say of an instance a create answer named. `kind`: "ours" (a row of it carries the create's label),
    "theirs" (its row carries another label, or none), "unread" (no row of it could be read). `row`: the row read,
    if any (ours: its price counts; theirs: its label is said). `label_rows`: the other live instances whose rows
    carry the create's label: the create's own, whatever its answer named (read with the row, or alone)."""

    kind: OwnerKind
    row: Instance | None = None
    label_rows: tuple[int, ...] = ()

    @property
    def row_label(self) -> str:
        """The label the row carries (`""` for none, or when no row was read)."""
        return (self.row.label or "") if self.row is not None else ""

    @property
    def elsewhere(self) -> bool:
        """The create's label is on another instance: this one is not what the create made, read or not."""
        return self.kind != "ours" and bool(self.label_rows)


def read_row(client: VastClient, instance_id: int, *, within_s: float, clock: Clock = now_s) -> Instance | None:
    """The instance's row, or None when no read could show one (not found, failed, cut at `within_s`): the v1
    list by id first (it still answers when per-id reads fail: a refused v0 path, a 5xx), then one per-id attempt."""
    until = clock() + within_s
    try:
        row = next((r for r in client.list_instances(instance_id=instance_id, within_s=within_s / 2)
                    if r.id == instance_id), None)
    except VastError:
        row = None
    if row is None:
        left_s = until - clock()
        if left_s <= 0:
            return None
        try:
            row = client.get_instance(instance_id, max_retry_s=0.0, within_s=max(0.1, left_s))
        except VastError:
            return None
    return row if row is not None and row.id == instance_id else None


def label_rows(client: VastClient, label: str, *, within_s: float) -> list[Instance]:
    """The live rows (lingering destroyed ones left out) that carry `label`; none when the list fails."""
    try:
        return [r for r in client.list_instances(label=label, within_s=within_s)
                if r.label == label and not is_lingering(r)]
    except VastError:
        return []


def read_owner(client: VastClient, instance_id: int, label: str, *, within_s: float, clock: Clock = now_s) -> Owner:
    """One look at whose `instance_id` is: its row, then the rows that carry `label` (a row of `instance_id` among
    them is ours too: the list by label answers when the list by id does not). `within_s` bounds the look."""
    until = clock() + within_s
    row = read_row(client, instance_id, within_s=within_s * 2 / 3, clock=clock)
    if row is not None and row.label == label:
        return Owner("ours", row)
    rows = label_rows(client, label, within_s=max(0.1, until - clock()))
    mine = next((r for r in rows if r.id == instance_id), None)
    if mine is not None:
        return Owner("ours", mine, tuple(r.id for r in rows if r.id != instance_id))
    others = tuple(r.id for r in rows)
    if row is not None:
        return Owner("theirs", row, others)
    return Owner("unread", None, others)


def await_owner(client: VastClient, instance_id: int, label: str, *, until_mono: float, interval_s: float,
                look_s: float, clock: Clock = now_s, sleep: Sleep = time.sleep) -> Owner:
    """`read_owner` every `interval_s` (each look bounded by `look_s`) until a look decides (ours, theirs, or the
    label found on another instance) or `until_mono` (on `clock`) has passed; at least one look."""
    while True:
        owner = read_owner(client, instance_id, label, within_s=max(0.2, min(look_s, until_mono - clock())),
                           clock=clock)
        if owner.kind != "unread" or owner.elsewhere or clock() + interval_s > until_mono:
            return owner
        sleep(interval_s)


__all__ = ["Owner", "OwnerKind", "await_owner", "label_rows", "read_owner", "read_row"]
