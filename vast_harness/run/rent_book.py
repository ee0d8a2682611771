"""What one guarded run has sent, rented and proven gone: the facts its teardown and its verdict decide from.

Every create attempt is written down before its PUT (label -> the moment it was sent) and stays *unresolved*
until an answer or a read settles it; every instance a create (or the final label sweep) found is *created*;
every teardown report is kept. The runner asks the book, not lists of its own, what is left to delete and
what may still bill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vast_harness.records import CreatedInstance, InstanceTeardown


@dataclass(frozen=True)
class Rented:
    """A create that rented `instance` (it bills from its PUT until its DELETE)."""

    instance: CreatedInstance


@dataclass(frozen=True)
class NotRented:
    """A create the market answered with "nothing rented" (offer taken, refused, 429): try the next offer."""

    why: str


CreateOutcome = Rented | NotRented


@dataclass
class RentBook:
    attempts: dict[str, float] = field(default_factory=dict)  # label -> run-clock time its PUT was sent
    offers: dict[str, tuple[int, float]] = field(default_factory=dict)  # label -> (offer id, quoted $/h) it was sent for
    unresolved: set[str] = field(default_factory=set)  # labels whose create no answer or read has settled
    created: list[CreatedInstance] = field(default_factory=list)
    teardowns: list[InstanceTeardown] = field(default_factory=list)
    vanished: dict[int, str] = field(default_factory=dict)  # instance id -> how we learnt someone else deleted it
    excluded_machines: set[int] = field(default_factory=set)  # machines that failed to boot in this run
    disowned: dict[int, str] = field(default_factory=dict)  # instance id -> the label its row carried (not ours)
    # instance id -> why no DELETE of ours went to it: a create answer named it, no read ever showed its label
    left_alone: dict[int, str] = field(default_factory=dict)
    named_for: dict[int, str] = field(default_factory=dict)  # disowned or left alone -> the label whose create named it

    # ------------------------------------------------------------------------------------ creates
    def attempt(self, label: str, t_sent: float, offer: tuple[int, float] | None = None) -> None:
        """A PUT is about to leave with `label` (for `offer`: id, quoted $/h): from now on it may have created
        something."""
        self.attempts[label] = t_sent
        if offer is not None:
            self.offers[label] = offer
        self.unresolved.add(label)

    def withdraw(self, label: str) -> None:
        """The create's intent never reached the ledger, so its PUT was never sent: nothing to look for."""
        self.attempts.pop(label, None)
        self.unresolved.discard(label)

    def settle(self, label: str) -> None:
        """An answer or a read said what `label`'s create did."""
        self.unresolved.discard(label)

    def rented(self, inst: CreatedInstance) -> None:
        self.created.append(inst)

    def disown(self, inst: CreatedInstance, row_label: str) -> None:
        """A create's answer named an instance whose row carries another label: it is not this run's. It leaves
        the book (never waited on, billed or deleted as ours) and the create's outcome is unknown again: the
        run's own instance, if the create made one, carries the run's label, and the label sweep looks for it."""
        if inst.instance_id in self.disowned:
            return  # the boot's read, the teardown's check and the cap guard may each find it: once is enough
        self.created = [i for i in self.created if i.instance_id != inst.instance_id]
        self.disowned[inst.instance_id] = row_label
        self.named_for[inst.instance_id] = inst.label
        self.unresolved.add(inst.label)

    def leave_alone(self, inst: CreatedInstance, why: str) -> None:
        """A create's answer named an instance whose row no read could show: it is not proven this run's, so it
        leaves the book like a disowned one (never deleted, billed or recorded as ours), and the create's outcome
        is unknown again unless the run's label was found on another instance (the caller settles it then)."""
        if inst.instance_id in self.left_alone or inst.instance_id in self.disowned:
            return
        self.created = [i for i in self.created if i.instance_id != inst.instance_id]
        self.left_alone[inst.instance_id] = why
        self.named_for[inst.instance_id] = inst.label
        self.unresolved.add(inst.label)

    def not_ours(self, label: str) -> list[int]:
        """What `label`'s create answer named that turned out not the run's (disowned or left alone)."""
        return [i for i, lab in self.named_for.items() if lab == label]

    def latest(self) -> CreatedInstance | None:
        return self.created[-1] if self.created else None

    def labels(self) -> set[str]:
        """Every label a PUT was sent for, and every label an instance of this run carries."""
        return set(self.attempts) | {i.label for i in self.created}

    # ------------------------------------------------------------------------------------ teardowns
    def torn_down(self, report: InstanceTeardown) -> None:
        self.teardowns.append(report)

    def known_ids(self) -> set[int]:
        """Instances that have had their teardown (proven gone or not)."""
        return {t.instance_id for t in self.teardowns}

    def pending(self) -> list[CreatedInstance]:
        """Instances of this run that no teardown has handled yet."""
        done = self.known_ids()
        return [i for i in self.created if i.instance_id not in done]

    def live(self) -> list[CreatedInstance]:
        """Instances still ours to bill: not torn down, not deleted by someone else."""
        return [i for i in self.created if i.absence is None and i.instance_id not in self.vanished]

    def unproven(self) -> list[int]:
        """Instances whose teardown did not prove them gone: they may still bill (exit 3)."""
        return [t.instance_id for t in self.teardowns if t.verdict != "gone"]
