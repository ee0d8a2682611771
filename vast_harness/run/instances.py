"""The one owner of a run's instances: what the run rented (its `RentBook`), which of those are its own, and what
its cap guard may delete.

Whose an instance is: only a row that carries the run's own label is the run's. A create answer can name
another instance of the account (`wrong_contract`: the user's `prod-database`, an unlabelled console instance,
another run's). No DELETE of the run's (the teardown's, the cap guard's) goes to an instance until a read has shown
its row with the run's label (instance/ownership.py): another label, or none, and it is disowned; no row at all
(reads lag creates; the API failed) proves nothing, so it is not deleted either, and the run looks for its own by
its label. A teardown that ends with it still unread leaves it alone, said and recorded (exit 3, `reap` reads it
later). A row that does carry the run's label states the price the host bills: the run's meter takes it like any
row's.

Three moments ask, each with what it knows: the boot's poll has a read already (`check_boot_read`); the cap
guard has a second before the cap (`guard_may_delete`); the teardown has its budget (`check_before_delete`, asked
again by the label sweep until the budget ends, then `leave_alone`). Whichever finds an instance not the run's
first disowns it, once: the book, the ledger's `disowned` line, the guard told to leave it, the user told.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from vast_harness.caps.guard import CapGuard, Owned
from vast_harness.caps.meter import CostMeter
from vast_harness.clock import Clock
from vast_harness.console.output import Output
from vast_harness.errors import CreateUnresolved
from vast_harness.instance.lifecycle import destroy
from vast_harness.instance.ownership import Owner, read_owner
from vast_harness.records import CreatedInstance, DeleteAck
from vast_harness.run.instance_reads import take_own_row
from vast_harness.run.rent_book import RentBook
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance

OWNERSHIP_READ_S = 3.0  # the teardown's look at a never-read instance's label, each time it asks
OWNERSHIP_GUARD_READ_S = 1.0  # the cap guard's, at most: a third of what is left before the hard deadline
MIN_GUARD_READ_S = 0.2  # the cap guard's, at least: a read cut shorter decides nothing


@dataclass(frozen=True)
class NotOurs:
    """No DELETE of the run's may go to an instance a create answer named. `row_label`: the label its row carries
    (`""` for none: it was disowned), or None when no read could show its row (not proven the run's: left alone
    for now, asked again until the teardown's budget ends). `label_rows`: the instances that do carry the run's
    label and that no teardown has handled: the run's own, whatever the create answered."""

    row_label: str | None
    label_rows: tuple[int, ...] = ()


@dataclass(frozen=True)
class Claim:
    """The teardown taking an instance over from the cap guard. `ack`: the guard's DELETE, when it sent one first
    (the teardown's first; the guard sends one only to an instance a read has shown as the run's). `ours`: False
    when the guard's own check found it is not the run's (its row carries another label, or the run's label is on
    another instance): then no DELETE of ours may go to it, whatever the teardown's pending list said a moment
    before."""

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
        self._label_ids: set[int] = set()  # rows an ownership read showed with one of the run's labels: the run's
        self._named_labels: dict[int, str] = {}  # what each create answer named -> the label that create sent
        self.guard = CapGuard(meter=meter, live=self.live_ids, delete=self._guard_delete, on_fire=on_guard_fired,
                              describe_now=describe_now, owned=self.guard_may_delete)

    @property
    def clock(self) -> Clock:
        return self.meter.now

    # ------------------------------------------------------------------------------------ the cap guard's
    def named(self, instance_id: int, label: str) -> None:
        """A create's answer for `label` named `instance_id`: it bills from now, booked or not, so the guard asks
        about it too (and deletes it once a read has shown `label` on its row)."""
        self._named_labels[instance_id] = label
        self.guard.note(instance_id)

    def live_ids(self) -> list[int]:
        """The run's instances that still bill: what the guard deletes at the cap."""
        return [i.instance_id for i in self.book.live()]

    def guard_may_delete(self, instance_id: int) -> Owned:
        """The cap guard's question before its DELETE (caps/guard.py `Owned`): "ours" only for an instance a read
        has shown with the run's label. One that no read has shown so is read first, for a third of what is left
        before the hard deadline (a second at most): the guard's DELETE must still land by the cap. Another
        label, or none: "not_ours" (disowned). No row: "unproven" (the guard asks again at its next pass). The
        rows that carry the run's label are noted: the guard deletes them in its next pass."""
        if instance_id in self.book.disowned or instance_id in self.book.left_alone:
            return "not_ours"
        if instance_id in self._label_ids:  # a row with the run's label, found by an ownership read
            return "ours"
        within_s = max(MIN_GUARD_READ_S, min(OWNERSHIP_GUARD_READ_S, (self.meter.hard_deadline() - self.clock()) / 3))
        inst = next((i for i in self.book.created if i.instance_id == instance_id), None)
        if inst is None:  # named a moment ago, not booked yet (its ledger line is being written): its row decides
            label = self._named_labels.get(instance_id)
            if label is None:
                return "unproven"
            unbooked = read_owner(self.client, instance_id, label, within_s=within_s, clock=self.clock)
            if unbooked.kind == "ours":
                self._label_ids.add(instance_id)
                return "ours"
            return "not_ours" if unbooked.kind == "theirs" else "unproven"  # the teardown disowns it once booked
        if not _unread(inst):
            return "ours"
        owner = read_owner(self.client, instance_id, inst.label, within_s=within_s, clock=self.clock)
        if owner.kind == "ours":
            self._own_row(inst, owner, record=False)
            return "ours"
        for row_id in owner.label_rows:
            self._label_ids.add(row_id)
            self.guard.note(row_id)
        if owner.kind == "theirs":
            self._disown(inst, owner.row_label, warning=(
                f"instance {instance_id}, which the create answer named, carries {_carries(owner.row_label)}, not "
                "this run's: the cap guard leaves it alone"))
            return "not_ours"
        if owner.elsewhere:
            self._elsewhere(inst, owner, by="the cap guard")
            return "not_ours"
        return "unproven"

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

    def check_before_delete(self, inst: CreatedInstance, *, within_s: float = OWNERSHIP_READ_S) -> NotOurs | None:
        """The teardown's question before its DELETE of `inst`: None when it is the run's to delete (a read has
        shown it with the run's label, now or before). Else no DELETE of the run's may go to it (`NotOurs`), and the
        rows that carry the run's label instead come back to be deleted at once, not after the label sweep's
        read-lag wait (the cap may be near); finding them settles the create. Another label, or none: disowned.
        No row: it stays booked, unproven, for the label sweep to ask again (`within_s` bounds each look); found
        with the run's label on another instance, it is left alone at once."""
        if not _unread(inst):
            return None
        owner = read_owner(self.client, inst.instance_id, inst.label, within_s=within_s, clock=self.clock)
        if owner.kind == "ours":
            self._own_row(inst, owner)
            return None
        label_rows = tuple(i for i in owner.label_rows if i not in self.book.known_ids())
        for row_id in label_rows:  # the run's: the guard deletes them by the cap if the teardown is not there yet
            self._label_ids.add(row_id)
            self.guard.note(row_id)
        if owner.kind == "theirs":
            self._disown(inst, owner.row_label, warning=(
                f"instance {inst.instance_id}, which the create answer named, carries {_carries(owner.row_label)}, "
                f"not this run's {inst.label!r}: it is not this run's and is not deleted; the run's label is looked "
                "for instead"))
        elif owner.elsewhere:
            self._elsewhere(inst, owner, by="the teardown")
        if label_rows or owner.elsewhere:
            self.book.settle(inst.label)
        return NotOurs(owner.row_label if owner.kind == "theirs" else None, label_rows)

    def leave_alone(self, inst: CreatedInstance) -> None:
        """The teardown's budget is over and no read has shown `inst`'s row: it is not proven the run's, so no
        DELETE of the run's went to it. It leaves the book (never recorded, billed or deleted as the run's), the
        create's outcome stays unknown (exit 3), and the user is told; its ledger line stays, so `reap` reads its
        label later (and looks for the run's)."""
        why = (f"instance {inst.instance_id} named by the create answer; its label could not be read; left alone "
               f"(not proven ours): no DELETE of this run's went to it")
        self.book.leave_alone(inst, why)
        self.guard.forget(inst.instance_id)
        self.out.warn(f"{why}; whether the create of {inst.label} made an instance is unknown: run `vast-e2e reap`")

    def claim(self, inst: CreatedInstance) -> Claim:
        """The teardown is about to DELETE `inst`: from now on the guard leaves it alone (a DELETE of the guard's
        already out is waited for and handed over). Asked after the claim, not before: the guard may disown it
        up to the moment it lets go."""
        ack = self.guard.claim(inst.instance_id)
        return Claim(ack=ack, ours=inst.instance_id not in self.book.disowned
                     and inst.instance_id not in self.book.left_alone)

    # ------------------------------------------------------------------------------------ shared
    def _disown(self, inst: CreatedInstance, row_label: str, *, warning: str | None) -> None:
        """`inst` off the run's books, once, whichever moment found it first: the book (never waited on, billed or
        deleted as the run's; its create unknown again), the ledger's line (a reap neither deletes it as the
        run's nor counts it as what the run's label made), the guard (never its DELETE), the user."""
        with self._disowning:
            if inst.instance_id in self.book.disowned or inst.instance_id in self.book.left_alone:
                return
            self.book.disown(inst, row_label)
        self.ledger.append(self.run_id, "disowned", inst.label, instance_id=inst.instance_id,
                           detail=f"its row carries {_carries(row_label)}")
        self.guard.forget(inst.instance_id)
        if warning is not None:
            self.out.warn(warning)

    def _elsewhere(self, inst: CreatedInstance, owner: Owner, *, by: str) -> None:
        """No read could show `inst`'s row, but the run's label is on another instance: that one is what the
        create made, so `inst` is not, and is never deleted (the ledger's `disowned` line settles it for `reap`)."""
        others = ", ".join(str(i) for i in owner.label_rows)
        why = (f"instance {inst.instance_id} named by the create answer; its label could not be read; left alone "
               f"(not proven ours): the run's label {inst.label!r} is on instance {others}")
        with self._disowning:
            if inst.instance_id in self.book.left_alone or inst.instance_id in self.book.disowned:
                return
            self.book.leave_alone(inst, why)
        self.ledger.append(self.run_id, "disowned", inst.label, instance_id=inst.instance_id,
                           detail=f"its label could not be read; the run's label is on instance {others}")
        self.guard.forget(inst.instance_id)
        self.out.warn(f"{why} ({by})")

    def _own_row(self, inst: CreatedInstance, owner: Owner, *, record: bool = True) -> None:
        """A row of `inst` with the run's label: the run's, and its price counts. `record` (not the cap guard's:
        it writes nothing to disk before its DELETE): seen too (null reads may now prove it gone; the ledger's
        `seen` line tells a reap its label was read)."""
        if owner.row is not None:
            take_own_row(self.meter, self.out, inst, owner.row, source="ownership read")
        inst.label_seen = True
        if record and not inst.seen:
            inst.seen = True
            self.ledger.append(self.run_id, "seen", inst.label, instance_id=inst.instance_id,
                               detail="in the ownership read")


def _unread(inst: CreatedInstance) -> bool:
    """No read has shown `inst` with the run's label: only its create's answer says it is the run's."""
    return not (inst.seen or inst.label_seen)


def _carries(row_label: str) -> str:
    return f"the label {row_label!r}" if row_label else "no label"
