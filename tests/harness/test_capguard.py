"""The cap guard (caps/guard.py) on its own: a meter on a fake clock, a fake DELETE; the guard's thread is real."""

from __future__ import annotations

import threading
import time

from tests.harness.conftest import FakeClock
from vast_harness.caps.guard import CapGuard
from vast_harness.caps.meter import CostMeter
from vast_harness.records import CreatedInstance, DeleteAck
from vast_harness.timings import TeardownBudget

T0 = 1000.0
MAX_S, MARGIN_S = 100.0, 20.0  # the guard fires at T0 + 100 - 0.25 * 20 = T0 + 95


def _inst(instance_id: int) -> CreatedInstance:
    return CreatedInstance(instance_id=instance_id, label=f"vh-{instance_id}", offer_id=1, machine_id=1,
                           dph_usd=1.0, t_created_mono=T0)


class Harness:
    def __init__(self, *instances: CreatedInstance, delete_s: float = 0.0) -> None:
        self.clock = FakeClock(T0)
        self.meter = CostMeter(max_usd=100.0, max_seconds=MAX_S, teardown_margin_s=MARGIN_S, clock=self.clock)
        self.instances = list(instances)
        self.deleted: list[tuple[int, float]] = []
        self.fired: list[str] = []
        self.delete_s = delete_s
        self.guard = CapGuard(meter=self.meter, live=lambda: [i.instance_id for i in self.instances], delete=self.delete,
                              on_fire=self.fired.append, describe_now=lambda: "step s")

    def delete(self, instance_id: int, land_by: float) -> DeleteAck:
        time.sleep(self.delete_s)
        self.deleted.append((instance_id, land_by))
        return DeleteAck(instance_id=instance_id, acknowledged=True, outcome="deleted", t_request_unix=0.0,
                         t_ack_unix=0.0, t_ack_mono=self.clock())

    def at(self, t: float, settle_s: float = 0.6) -> None:
        self.clock.now_s = T0 + t
        time.sleep(settle_s)  # the guard re-reads the clock every GUARD_POLL_S (0.25 s) of real time


def test_the_guard_waits_until_a_quarter_margin_before_the_cap_then_deletes_every_live_instance():
    h = Harness(_inst(1), _inst(2))
    h.guard.start()
    try:
        h.at(94.9)
        assert not h.deleted and not h.fired and not h.guard.fired
        h.at(MAX_S - TeardownBudget.GUARD_SHARE * MARGIN_S)
        assert sorted(i for i, _ in h.deleted) == [1, 2]
        assert all(land_by == T0 + MAX_S for _, land_by in h.deleted)  # it lands by the cap itself
        assert len(h.fired) == 1 and "cap guard sent the DELETE for instance(s) 1, 2" in h.fired[0]
        assert "(it was in step s)" in h.fired[0] and h.guard.fired_reason == h.fired[0]
        h.at(96.0)
        assert len(h.deleted) == 2  # once each
    finally:
        h.guard.stop()


def test_an_instance_the_teardown_claimed_is_left_to_it():
    h = Harness(_inst(1), _inst(2))
    h.guard.start()
    try:
        assert h.guard.claim(1) is None  # the teardown got there first: it sends its own DELETE
        h.at(95.5)
        assert [i for i, _ in h.deleted] == [2]
    finally:
        h.guard.stop()


def test_a_claim_while_the_guards_delete_is_in_flight_waits_for_its_answer():
    h = Harness(_inst(7), delete_s=0.8)
    h.guard.start()
    try:
        h.at(95.5, settle_s=0.35)  # the guard's DELETE is on its way
        started = time.monotonic()
        ack = h.guard.claim(7)
        assert ack is not None and ack.acknowledged and ack.outcome == "deleted"
        assert time.monotonic() - started > 0.1  # it waited for the answer rather than send a second DELETE
        assert [i for i, _ in h.deleted] == [7]
    finally:
        h.guard.stop()


def test_a_re_price_that_moves_the_cap_earlier_moves_the_guard_too():
    h = Harness(_inst(3))
    h.meter.start_instance(3, 1.0, T0)
    h.guard.start()
    try:
        h.at(10.0)
        assert not h.deleted
        h.meter.reprice(3, 3600.0 * 100.0 / 60.0)  # $100 now lasts 60 s from T0: the hard deadline is T0 + 60
        h.at(54.0)
        assert not h.deleted
        h.at(56.0)  # 60 - 5 = 55: past the guard's time, long before the time cap's
        assert [i for i, _ in h.deleted] == [3] and "dollar cap" in h.fired[0]
    finally:
        h.guard.stop()


def test_a_stopped_guard_never_deletes():
    h = Harness(_inst(1))
    h.guard.start()
    h.guard.stop()
    h.at(99.0)
    assert not h.deleted and not h.fired
    assert not any(t.name == "vh-cap-guard" and t.is_alive() for t in threading.enumerate())


def test_an_instance_a_create_named_is_deleted_before_the_run_booked_it():
    # The create's ledger line is written after its answer: a disk that holds that write must not hide the
    # billing instance from the guard.
    h = Harness()
    h.guard.note(11)
    h.guard.start()
    try:
        h.at(95.5)
        assert [i for i, _ in h.deleted] == [11]
    finally:
        h.guard.stop()


def test_billing_stops_at_the_guards_acknowledged_delete_while_the_run_is_stuck():
    """The run's main thread may be stuck on a disk that does not answer: the bill still ends at the DELETE the
    guard had acknowledged, not minutes later when the run's own teardown gets there."""
    h = Harness(_inst(3))
    h.meter.start_instance(3, 3600.0, T0)  # $1 a second
    h.guard.start()
    try:
        h.at(95.5)
        assert [i for i, _ in h.deleted] == [3]
        at_ack = h.meter.accrued_usd()
        h.at(400.0)  # long after, the run's teardown still has not run
        assert h.meter.accrued_usd() == at_ack
        assert 94.0 <= at_ack <= 96.0
    finally:
        h.guard.stop()
