"""The owner of a run's instances (run/instances.py) on its own, against the simulator over loopback: whose an
instance is (only a row with the run's label is the run's), the one disown whichever moment finds it, and what the
cap guard may delete. The meter runs on a fake clock (the guard is fired by moving it); the guard's thread, the
client, the ledger file and the simulator are real."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from tests.harness.conftest import FakeClock
from vast_harness.caps.meter import CostMeter
from vast_harness.console.output import Output
from vast_harness.errors import CreateUnresolved
from vast_harness.records import CreatedInstance, InstanceTeardown
from vast_harness.run.instances import NotOurs, RunInstances
from vast_harness.sim import SimServer
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-owner-key"
SIM_OPTIONS = dict(seed=42, rate_scale=SCALE, boot_seconds=0.1, num_offers=50)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")

T0 = 1000.0
MAX_S, MARGIN_S = 100.0, 20.0  # the guard fires at T0 + 95
CHEAP_DPH = 0.0001  # below any simulated offer's price: a row of ours then raises it
_runs = itertools.count()  # one label per test: the module's simulator keeps every test's instances


class Said(Output):
    """The user's output, kept: what the owner warned."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


class Owner:
    """A run's owner of its instances, as `build_tools` makes it, with what it told the run kept."""

    def __init__(self, sim: SimServer, tmp_path: Path) -> None:
        self.sim = sim
        self.clock = FakeClock(T0)
        self.meter = CostMeter(max_usd=100.0, max_seconds=MAX_S, teardown_margin_s=MARGIN_S, clock=self.clock)
        self.ledger = Ledger(tmp_path / "ledger.jsonl")
        self.out = Said()
        self.fired: list[str] = []
        self.label = f"vh-20260101T000000Z-{next(_runs):06d}-0"  # the run's label: what its create sent
        self.client = VastClient(KEY, base_url=sim.url, pacing_scale=SCALE)
        self.instances = RunInstances(client=self.client, ledger=self.ledger, run_id="r", meter=self.meter,
                                      out=self.out, on_guard_fired=self.fired.append)

    def rent(self, label: str | None) -> int:
        """An instance of the account, labelled `label` (None: made in the console, never labelled)."""
        offer = self.client.search_offers({"limit": 5})[-1]
        body = {"image": "img", "disk": 10} | ({"label": label} if label else {})
        instance_id = self.client.create_instance(offer.id, body).new_contract
        assert instance_id is not None
        return instance_id

    def booked(self, instance_id: int, **fields: bool) -> CreatedInstance:
        """What a create answer named as the instance of the run's label, booked and billing."""
        self.instances.book.attempt(self.label, T0)
        inst = CreatedInstance(instance_id=instance_id, label=self.label, offer_id=1, machine_id=None, dph_usd=CHEAP_DPH,
                               t_created_mono=T0, **fields)
        self.instances.book.rented(inst)
        self.meter.start_instance(instance_id, CHEAP_DPH, T0)
        return inst

    def disowned_lines(self) -> list[tuple[int | None, str | None]]:
        return [(e.instance_id, e.detail) for e in self.ledger.entries() if e.event == "disowned"]

    def calls(self) -> int:
        return len(self.sim.state()["calls"])

    def live(self) -> set[int]:
        return {i["id"] for i in self.sim.state()["instances"] if i["live"]}

    def deletes_of(self, instance_id: int) -> list[str]:
        return [c["path"] for c in self.sim.state()["calls"]
                if c["method"] == "DELETE" and c["path"].rstrip("/").endswith(f"/{instance_id}")]

    def fire_guard(self) -> None:
        """Move the meter's clock to the guard's point, and give its thread time to act (it polls every 0.25 s)."""
        self.instances.guard.start()
        self.clock.now_s = T0 + MAX_S - 4.0
        end = time.monotonic() + 5.0
        while not self.fired and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)  # its DELETEs, after `on_fire`
        self.instances.guard.stop()


@pytest.fixture
def owner(sim: SimServer, tmp_path: Path):
    o = Owner(sim, tmp_path)
    try:
        yield o
    finally:
        o.instances.guard.stop(wait_s=5.0)  # a read it has in flight ends before the client closes
        o.client.close()


def test_a_row_with_the_runs_label_is_the_runs_and_states_its_price(owner):
    ours = owner.rent(owner.label)
    inst = owner.booked(ours)
    assert owner.instances.check_before_delete(inst) is None
    assert inst.label_seen, "the ownership read found the run's label"
    assert inst.dph_usd > CHEAP_DPH, "the price its row states is the one the run counts"
    assert owner.instances.guard_may_delete(ours)
    owner.instances.check_boot_read(inst, owner.client.get_instance(ours))  # does not raise
    assert owner.instances.book.created == [inst] and not owner.instances.book.disowned
    assert not owner.disowned_lines()
    assert [w for w in owner.out.warnings if f"instance {ours} bills" not in w] == [], "only its price is news"


@pytest.mark.parametrize("decoy_label", ["prod-database", None])
@pytest.mark.parametrize("first", ["boot", "guard", "teardown"])
def test_a_row_with_another_label_or_none_is_disowned_once_whichever_moment_finds_it(owner, decoy_label, first):
    theirs = owner.rent(decoy_label)
    inst = owner.booked(theirs)
    row = owner.client.get_instance(theirs)
    assert row is not None

    def boot() -> None:
        with pytest.raises(CreateUnresolved, match="not this run's") as raised:
            owner.instances.check_boot_read(inst, row)
        assert raised.value.label == owner.label

    def guard() -> None:
        assert owner.instances.guard_may_delete(theirs) == "not_ours"

    def teardown() -> None:
        assert owner.instances.check_before_delete(inst) == NotOurs(row_label=decoy_label or "")

    moments = {"boot": boot, "guard": guard, "teardown": teardown}
    moments.pop(first)()
    for moment in moments.values():
        moment()
    carries = f"the label {decoy_label!r}" if decoy_label else "no label"
    assert owner.disowned_lines() == [(theirs, f"its row carries {carries}")]
    assert owner.instances.book.disowned == {theirs: decoy_label or ""}
    assert inst not in owner.instances.book.created and owner.label in owner.instances.book.unresolved
    assert len(owner.out.warnings) == (first != "boot"), owner.out.warnings  # the boot's error says it instead
    assert owner.live() >= {theirs} and not owner.deletes_of(theirs)


def test_the_guard_forgets_a_disowned_instance_it_was_told_of(owner):
    """A create's answer named it, so the guard was told (`named`); its row then showed another label. When the
    guard fires it deletes the run's instances and not that one: it is not even among what it names."""
    theirs, ours = owner.rent("prod-database"), owner.rent(owner.label)
    owner.instances.named(theirs, owner.label)
    inst = owner.booked(theirs)
    owner.booked(ours, seen=True)
    with pytest.raises(CreateUnresolved):
        owner.instances.check_boot_read(inst, owner.client.get_instance(theirs))
    owner.fire_guard()
    assert len(owner.fired) == 1 and owner.fired[0].endswith(f"for instance(s) {ours}"), owner.fired
    assert ours not in owner.live() and owner.deletes_of(ours)
    assert theirs in owner.live() and not owner.deletes_of(theirs)


@pytest.mark.parametrize("faults", [None, "5xx:list:*;5xx:show:*"], ids=["no row", "reads fail"])
def test_a_row_that_cannot_be_read_is_never_deleted(owner, faults):
    """No row (reads lag creates), or reads that fail: only the create's answer says the instance is the run's, and
    that answer is what a wrong `new_contract` corrupts. Neither the teardown nor the guard deletes it; it stays
    booked (the label sweep asks again), and a teardown that ends so leaves it alone, said."""
    theirs = owner.rent("prod-database")
    inst = owner.booked(theirs + 10_000 if faults is None else theirs)  # no such instance, or one we cannot read
    owner.sim.set_faults(faults)
    assert owner.instances.check_before_delete(inst, within_s=0.5) == NotOurs(row_label=None)
    assert owner.instances.guard_may_delete(inst.instance_id) == "unproven"
    assert owner.instances.book.created == [inst] and not owner.instances.book.disowned
    assert not owner.disowned_lines() and not owner.out.warnings
    owner.fire_guard()
    assert not owner.deletes_of(inst.instance_id), "the guard deleted an instance no read has shown as the run's"
    assert len(owner.fired) == 1 and "sent no DELETE" in owner.fired[0] and "not proven ours" in owner.fired[0]
    owner.instances.leave_alone(inst)
    assert inst not in owner.instances.book.created and owner.label in owner.instances.book.unresolved
    assert f"instance {inst.instance_id} named by the create answer; its label could not be read; left alone " \
           "(not proven ours)" in owner.out.warnings[-1]
    assert owner.live() >= {theirs}


def test_the_guard_asks_again_and_deletes_once_a_read_shows_the_runs_label(owner):
    """The guard fired while reads failed: it sent nothing. Reads come back: its next pass reads the run's label
    on the row and deletes it, before the cap."""
    ours = owner.rent(owner.label)
    inst = owner.booked(ours)
    owner.sim.set_faults("5xx:list:*;5xx:show:*")
    owner.instances.guard.start()
    owner.clock.now_s = T0 + MAX_S - 4.0
    end = time.monotonic() + 5.0
    while not owner.fired and time.monotonic() < end:
        time.sleep(0.05)
    assert owner.fired and not owner.deletes_of(ours)
    owner.sim.set_faults(None)
    end = time.monotonic() + 10.0
    while not owner.deletes_of(ours) and time.monotonic() < end:
        time.sleep(0.05)
    owner.instances.guard.stop()
    assert owner.deletes_of(ours) and ours not in owner.live() and inst.label_seen
    claim = owner.instances.claim(inst)
    assert claim.ours and claim.ack is not None and claim.ack.acknowledged


def test_an_unread_instance_is_left_alone_at_once_when_the_runs_label_is_on_another(owner):
    """No read shows the named row, but the run's label is on another instance: that one is what the create made.
    The named one is left alone (a `disowned` line settles it for reap), the other comes back to be deleted."""
    ours = owner.rent(owner.label)
    inst = owner.booked(ours + 10_000)  # no such row
    assert owner.instances.check_before_delete(inst, within_s=1.0) == NotOurs(row_label=None, label_rows=(ours,))
    assert inst.instance_id in owner.instances.book.left_alone and inst not in owner.instances.book.created
    assert owner.label not in owner.instances.book.unresolved, "the run's label was found: the create is settled"
    assert [i for i, _ in owner.disowned_lines()] == [inst.instance_id]
    assert f"is on instance {ours}" in owner.out.warnings[-1]


def test_what_the_guard_may_delete(owner):
    """Without a read: what a read showed with the run's label (what a create named a moment ago and the run has not
    booked yet is not proven: asked again). After a read: not what carries another label; and what carries the
    run's label, which no create named, is noted for the guard, which then deletes it."""
    theirs, ours = owner.rent("prod-database"), owner.rent(owner.label)
    shown = owner.booked(owner.rent(owner.label), seen=True)
    listed = owner.booked(owner.rent(owner.label), label_seen=True)
    before = owner.calls()
    assert owner.instances.guard_may_delete(theirs) == "unproven", "a create named it a moment ago: not booked"
    assert owner.instances.guard_may_delete(shown.instance_id) == "ours"
    assert owner.instances.guard_may_delete(listed.instance_id) == "ours"
    assert owner.calls() == before, "none of them needed a read"
    owner.booked(theirs)
    assert owner.instances.guard_may_delete(theirs) == "not_ours"
    assert owner.instances.guard_may_delete(theirs) == "not_ours", "once disowned, it stays so"
    assert len(owner.disowned_lines()) == 1
    assert sorted(owner.instances.live_ids()) == sorted([shown.instance_id, listed.instance_id])
    owner.fire_guard()
    assert not owner.live() & {ours, shown.instance_id, listed.instance_id}, "the run's label: all deleted"
    assert theirs in owner.live() and not owner.deletes_of(theirs)


def test_the_teardown_is_handed_the_runs_label_rows_the_create_did_not_name(owner):
    """The create answered with another's instance; the run's own carries its label: the teardown gets it to
    delete at once (not one it has already torn down), and the create is settled."""
    theirs, ours, done = owner.rent("prod-database"), owner.rent(owner.label), owner.rent(owner.label)
    owner.instances.book.torn_down(InstanceTeardown(instance_id=done))
    inst = owner.booked(theirs)
    assert owner.instances.check_before_delete(inst) == NotOurs(row_label="prod-database", label_rows=(ours,))
    assert owner.label not in owner.instances.book.unresolved, "its row was found: the create is settled"
    assert owner.live() >= {theirs, ours} and not owner.deletes_of(theirs)


def test_without_a_row_of_the_runs_label_the_create_stays_unknown(owner):
    inst = owner.booked(owner.rent(None))
    assert owner.instances.check_before_delete(inst) == NotOurs(row_label="")
    assert owner.label in owner.instances.book.unresolved, "the label sweep looks for it"


def test_an_instance_the_guard_read_as_the_runs_needs_no_second_read(owner):
    """The guard read the unread row, found the run's label and deleted it: the teardown takes its answer, and its
    own ownership check makes no second read."""
    ours = owner.rent(owner.label)
    inst = owner.booked(ours)
    owner.fire_guard()
    assert owner.deletes_of(ours) and inst.label_seen
    before = owner.calls()
    assert owner.instances.check_before_delete(inst) is None
    assert owner.calls() == before and not owner.disowned_lines()


def test_an_instance_the_guard_found_not_ours_is_not_deleted_by_the_teardown_that_takes_over(owner):
    """Near the cap the guard claims an unread instance, reads its row, finds another label and sends nothing. The
    teardown, whose pending list still held it, takes over: the claim must say it is not the run's (it used to hand
    back no answer, and the teardown then sent its own DELETE to the other instance)."""
    theirs = owner.rent("prod-database")
    inst = owner.booked(theirs)
    owner.fire_guard()
    assert theirs in owner.instances.book.disowned and owner.deletes_of(theirs) == []
    claim = owner.instances.claim(inst)
    assert not claim.ours and claim.ack is None  # the teardown stops there: no read, no DELETE
    assert theirs in owner.live()


def test_the_teardown_takes_over_the_guards_delete_of_its_own_instance(owner):
    ours = owner.rent(owner.label)
    inst = owner.booked(ours, seen=True)
    owner.fire_guard()
    claim = owner.instances.claim(inst)
    assert claim.ours and claim.ack is not None and claim.ack.acknowledged
    assert owner.deletes_of(ours), "the guard's DELETE went out"
