"""The one owner of a run's instances: what the run rented (its `RentBook`), which of those are its own, and what
its cap guard may delete.

Whose an instance is: only a row that carries the run's own label is the run's. A create answer can name
another instance of the account (`wrong_contract`: the user's `prod-database`, an unlabelled console instance,
another run's). Before the run deletes an instance that no read has shown with its label (the boot's first read
failed, or the cap came first), one read of its row decides: another label, or none, and it is not the run's. A
row that cannot be read (reads lag creates; the API failed) decides nothing: it is deleted as before, as `reap`
does, and its absence proof says what is there. A row that does carry the run's label states the price the host
bills: the run's meter takes it like any row's.

Three moments ask, each with what it knows: the boot's poll has a read already (`check_boot_read`); the cap
guard has a second before the cap (`guard_may_delete`); the teardown has its budget (`check_before_delete`).
Whichever finds an instance not the run's first disowns it, once: the book, the ledger's `disowned` line, the
guard told to leave it, the user told.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter
from vast_harness.clock import Clock
from vast_harness.console.output import Output
from vast_harness.errors import CreateUnresolved, VastError
from vast_harness.instance.lifecycle import destroy
from vast_harness.records import CreatedInstance, DeleteAck
from vast_harness.run.instance_reads import take_own_row
from vast_harness.run.rent_book import RentBook
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance

OWNERSHIP_READ_S = 3.0  # the teardown's one read of a never-read instance's label before its DELETE
OWNERSHIP_GUARD_READ_S = 1.0  # the cap guard's, at most: a third of what is left before the hard deadline
MIN_GUARD_READ_S = 0.2  # the cap guard's, at least: a read cut shorter decides nothing


@dataclass(frozen=True)
class NotOurs:
    """A create answer named an instance whose row carries `row_label` (`""` for none): it was disowned.
    `label_rows`: the instances that do carry the run's label and that no teardown has handled: the run's own,
    whatever the create answered."""

    row_label: str
    label_rows: tuple[int, ...] = ()


@dataclass(frozen=True)
class Claim:
    """The teardown taking an instance over from the cap guard. `ack`: the guard's DELETE, when it sent one first
    (the teardown's first). `ours`: False when the guard's own check found the row carries another label: then
    no DELETE of ours may go to it, whatever the teardown's pending list said a moment before."""

    ack: DeleteAck | None
    ours: bool


class RunInstances:
    """A run's instances and whose they are. Built from its collaborators: `book` (a fresh `RentBook` unless one
    is given: a process that takes over a run rebuilds it from the ledger), the client its reads and the guard's
    DELETEs go through, the ledger its `disowned` lines go to, the meter (the clock, the hard deadline the guard's
    read is cut by, the price an own row states). It makes the run's cap guard, whose questions are its methods;
    `on_guard_fired` and `describe_now` are the run's side of the guard (caps/guard.py). Nothing here assumes one
    instance: the book holds every instance the run has had, the guard deletes every one still live."""

    def __init__(self, *, client: VastClient, ledger: Ledger, run_id: str, meter: CostMeter, out: Output,
                 on_guard_fired: Callable[[str], None], describe_now: Callable[[], str] = lambda: "",
                 book: RentBook | None = None) -> None:
        self.client, self.ledger, self.run_id, self.meter, self.out = client, ledger, run_id, meter, out
        self.book = book if book is not None else RentBook()
        self._disowning = threading.Lock()  # the guard's thread and the run's may find one instance at once
        self.guard = CapGuard(meter=meter, live=self.live_ids, delete=self._guard_delete, on_fire=on_guard_fired,
                              describe_now=describe_now, owned=self.guard_may_delete)

    @property
    def clock(self) -> Clock:
        return self.meter.now

    # ------------------------------------------------------------------------------------ the cap guard's
    def named(self, instance_id: int) -> None:
        """A create's answer named `instance_id`: it bills from now, booked or not, so the guard deletes it too."""
        self.guard.note(instance_id)

    def live_ids(self) -> list[int]:
        """The run's instances that still bill: what the guard deletes at the cap."""
        return [i.instance_id for i in self.book.live()]

    def guard_may_delete(self, instance_id: int) -> bool:
        """The cap guard's question before its DELETE: False for an instance whose row carries another label. One
        that no read has shown with the run's label is read first, for a third of what is left before the hard
        deadline (a second at most): the guard's DELETE must still land by the cap. The rows that carry the run's
        label are then only noted: the guard deletes them in its next pass, the one DELETE that lands by the cap."""
        if instance_id in self.book.disowned:
            return False
        inst = next((i for i in self.book.created if i.instance_id == instance_id), None)
        if inst is None or not _unread(inst):  # named a moment ago and not booked yet, or read as the run's
            return True
        within_s = max(MIN_GUARD_READ_S, min(OWNERSHIP_GUARD_READ_S, (self.meter.hard_deadline() - self.clock()) / 3))
        row_label = self._foreign_label(inst, within_s=within_s)
        if row_label is None:
            return True
        self._disown(inst, row_label, warning=f"instance {instance_id}, which the create answer named, carries "
                                              f"{_carries(row_label)}, not this run's: the cap guard leaves it alone")
        for row_id in self._label_rows(inst.label, within_s=within_s):
            self.guard.note(row_id)
        return False

    def _guard_delete(self, instance_id: int, land_by_mono: float) -> DeleteAck:
        return destroy(self.client, instance_id, max_retry_s=max(1.0, land_by_mono - self.clock()),
                       land_by_mono=land_by_mono, clock=self.clock)

    # ------------------------------------------------------------------------------------ the run's
    def check_boot_read(self, inst: CreatedInstance, read: Instance | None) -> None:
        """A boot poll's read of `inst`. A row with another label, or none, is not the run's: the create's answer,
        the one witness a wrong `new_contract` corrupts, named another's. It is disowned and the boot ends
        (CreateUnresolved, which says so: no warning besides): the poll has the row, no second read is made."""
        if read is None or read.label == inst.label:
            return
        row_label = read.label or ""
        self._disown(inst, row_label, warning=None)
        raise CreateUnresolved(
            f"the create answer named instance {inst.instance_id}, but its row carries {_carries(row_label)}, not "
            f"this run's {inst.label!r}: it is not this run's and is left alone; whether the create made an "
            f"instance of ours is unknown", label=inst.label)

    def check_before_delete(self, inst: CreatedInstance) -> NotOurs | None:
        """The teardown's question before its DELETE of `inst`: None when it is the run's to delete (a read showed
        it with the run's label, a DELETE of ours is already out for it, or its row cannot be read). Else it is
        disowned, and the rows that carry the run's label instead come back to be deleted at once, not after the
        label sweep's read-lag wait (the cap may be near); finding them settles the create."""
        if not _unread(inst) or self.guard.is_claimed(inst.instance_id):
            return None
        row_label = self._foreign_label(inst, within_s=OWNERSHIP_READ_S)
        if row_label is None:
            return None
        self._disown(inst, row_label, warning=(
            f"instance {inst.instance_id}, which the create answer named, carries {_carries(row_label)}, not this "
            f"run's {inst.label!r}: it is not this run's and is not deleted; the run's label is looked for instead"))
        label_rows = [i for i in self._label_rows(inst.label, within_s=OWNERSHIP_READ_S)
                      if i not in self.book.known_ids()]
        if label_rows:
            self.book.settle(inst.label)
        return NotOurs(row_label, tuple(label_rows))

    def claim(self, inst: CreatedInstance) -> Claim:
        """The teardown is about to DELETE `inst`: from now on the guard leaves it alone (a DELETE of the guard's
        already out is waited for and handed over). Asked after the claim, not before: the guard may disown it
        up to the moment it lets go."""
        ack = self.guard.claim(inst.instance_id)
        return Claim(ack=ack, ours=inst.instance_id not in self.book.disowned)

    # ------------------------------------------------------------------------------------ shared
    def _disown(self, inst: CreatedInstance, row_label: str, *, warning: str | None) -> None:
        """`inst` off the run's books, once, whichever moment found it first: the book (never waited on, billed or
        deleted as the run's; its create unknown again), the ledger's line (a reap neither deletes it as the
        run's nor counts it as what the run's label made), the guard (never its DELETE), the user."""
        with self._disowning:
            if inst.instance_id in self.book.disowned:
                return
            self.book.disown(inst, row_label)
        self.ledger.append(self.run_id, "disowned", inst.label, instance_id=inst.instance_id,
                           detail=f"its row carries {_carries(row_label)}")
        self.guard.forget(inst.instance_id)
        if warning is not None:
            self.out.warn(warning)

    def _foreign_label(self, inst: CreatedInstance, *, within_s: float) -> str | None:
        """The label (`""` for none) of `inst`'s row when it is not the run's; None when the row carries the run's
        label (its price then counts) or cannot be read. The v1 list by id first (the read that still answers when
        per-id reads fail: a refused v0 path, a 5xx), then one per-id attempt."""
        until = self.clock() + within_s
        try:
            row = next((r for r in self.client.list_instances(instance_id=inst.instance_id, within_s=within_s / 2)
                        if r.id == inst.instance_id), None)
        except VastError:
            row = None
        if row is None:
            try:
                row = self.client.get_instance(inst.instance_id, max_retry_s=0.0,
                                               within_s=max(0.1, until - self.clock()))
            except VastError:
                return None
        if row is None or row.id != inst.instance_id:
            return None
        if row.label == inst.label:
            take_own_row(self.meter, self.out, inst, row, source="ownership read")
            return None
        return row.label or ""

    def _label_rows(self, label: str, *, within_s: float) -> list[int]:
        """The instances whose rows carry `label`, the run's whatever any create answered; none when the list
        fails (the label sweep lists again)."""
        try:
            return [row.id for row in self.client.list_instances(label=label, within_s=within_s) if row.label == label]
        except VastError:
            return []


def _unread(inst: CreatedInstance) -> bool:
    """No read has shown `inst` with the run's label: only its create's answer says it is the run's."""
    return not (inst.seen or inst.label_seen)


def _carries(row_label: str) -> str:
    return f"the label {row_label!r}" if row_label else "no label"
