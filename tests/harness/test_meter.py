"""The cost meter's rules one by one (vast_harness/caps/meter.py), on the fake clock: accrual from create to the
DELETE acknowledgement, re-pricing, transfers and their reservation, the one work deadline, the over-cap
verdict, and the two budgets computed nowhere else."""

from __future__ import annotations

import math
import threading

import pytest

from tests.harness.conftest import FakeClock
from vast_harness.caps.meter import (
    MAX_PLAUSIBLE_DPH_USD,
    TEARDOWN_MIN_S,
    CostMeter,
    finite_positive,
    minimum_cap_s,
    teardown_budget_s,
    usd_up,
)
from vast_harness.errors import CapReachedError
from vast_harness.spec.values import MAX_USD_LIMIT
from vast_harness.timings import Timings

T0 = 1000.0  # the fake clock's start


def meter(clock: FakeClock, *, max_usd: float = 1.0, max_seconds: float = 600.0, margin_s: float = 60.0) -> CostMeter:
    return CostMeter(max_usd=max_usd, max_seconds=max_seconds, teardown_margin_s=margin_s, clock=clock)


# ------------------------------------------------------------------------------- budgets and prices


def test_minimum_cap_is_boot_plus_margin() -> None:
    assert minimum_cap_s(Timings.real()) == 60.0 + 120.0
    assert minimum_cap_s(Timings.sim()) == 1.0 + 15.0
    assert minimum_cap_s(Timings.sim().model_copy(update={"teardown_margin_s": 2.0})) == 1.0 + 2.0


@pytest.mark.parametrize(("interval_s", "budget_s"), [(0.0, TEARDOWN_MIN_S), (0.5, 4.0 + TEARDOWN_MIN_S),
                                                      (10.0, 80.0 + TEARDOWN_MIN_S)])
def test_teardown_budget_leaves_eight_intervals_above_the_floor(interval_s: float, budget_s: float) -> None:
    assert teardown_budget_s(interval_s) == pytest.approx(budget_s)


@pytest.mark.parametrize(("value", "usable"), [(0.3, True), (1, True), (None, False), (0.0, False), (-0.1, False),
                                               (math.nan, False), (math.inf, False), (-math.inf, False),
                                               ("0.3", False)])
def test_finite_positive(value: object, usable: bool) -> None:
    assert finite_positive(value) is usable  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ accrual


def test_an_instance_accrues_from_its_start_to_its_delete_ack(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    m.start_instance(1, 3.6)  # $0.001/s
    fake_clock.sleep(100)
    assert m.accrued_usd() == pytest.approx(0.1)
    m.stop_instance(1, t_end=fake_clock() + 20)  # the DELETE's acknowledgement time, not "now"
    fake_clock.sleep(500)
    assert m.accrued_usd() == pytest.approx(0.12)  # frozen at the acknowledgement
    m.stop_instance(1, t_end=fake_clock())  # a second stop never moves the end
    assert m.accrued_usd() == pytest.approx(0.12)
    m.stop_instance(99, t_end=fake_clock())  # an id never started: nothing to stop
    assert m.live_usd_per_s() == 0.0


def test_an_explicit_start_bills_from_the_put(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    fake_clock.sleep(30)
    m.start_instance(1, 3.6, t_start=T0)  # the PUT went out 30 s ago
    assert m.accrued_usd() == pytest.approx(0.03)


def test_instances_accrue_side_by_side(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=10.0)
    m.start_instance(1, 3.6)
    m.start_instance(2, 7.2)
    assert m.live_usd_per_s() == pytest.approx(0.003)
    fake_clock.sleep(10)
    m.stop_instance(1, fake_clock())
    assert m.live_usd_per_s() == pytest.approx(0.002)
    fake_clock.sleep(10)
    assert m.accrued_usd() == pytest.approx(0.01 + 0.04)


@pytest.mark.parametrize("price", [math.nan, math.inf, 0.0, -1.0])
def test_an_unusable_search_price_is_refused_before_it_accrues(fake_clock: FakeClock, price: float) -> None:
    m = meter(fake_clock)
    with pytest.raises(CapReachedError, match="not a positive finite number"):
        m.start_instance(1, price)
    assert m.live_usd_per_s() == 0.0


# ------------------------------------------------------------------------------------------ re-price


def test_a_higher_billed_price_applies_from_the_start_and_tightens_the_deadline(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=3600)
    m.start_instance(1, 3.6)
    fake_clock.sleep(100)
    before = m.work_deadline()
    m.reprice(1, 7.2)
    assert m.accrued_usd() == pytest.approx(0.2)  # retroactive: the host billed it from the start
    assert m.work_deadline() < before
    assert m.work_deadline() == pytest.approx(fake_clock() + (1.0 - 0.2) / 0.002 - 60)
    change = m.price_changes[-1]
    assert (change.outcome, change.searched_dph_usd, change.billed_dph_usd) == ("tightened", 3.6, 7.2)


@pytest.mark.parametrize("billed", [3.6, 1.0, None])
def test_an_equal_lower_or_unsent_price_changes_nothing(fake_clock: FakeClock, billed: float | None) -> None:
    m = meter(fake_clock)
    m.start_instance(1, 3.6)
    before = m.work_deadline()
    m.reprice(1, billed)
    assert m.work_deadline() == before and m.price_changes == []
    m.reprice(99, 1000.0)  # an instance the meter does not know: nothing to re-price
    assert m.price_changes == []


def test_a_price_that_leaves_no_time_stops_the_run(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0)
    m.start_instance(1, 3.6)
    fake_clock.sleep(10)
    with pytest.raises(CapReachedError, match="leaves no time to work"):
        m.reprice(1, 3.6 * 2000)  # $2/s: the dollar cap is already spent
    assert m.price_changes[-1].outcome == "refused"


def test_a_higher_price_any_read_shows_counts_from_the_start_and_never_raises(fake_clock: FakeClock) -> None:
    # A list row or an absence-proof round: bookkeeping, even when the price leaves no time (the teardown calls it).
    m = meter(fake_clock, max_usd=1.0, max_seconds=3600)
    m.start_instance(1, 3.6)
    fake_clock.sleep(100)
    m.stop_instance(1, fake_clock())  # the DELETE was acknowledged: the price raised unseen still counts
    change = m.observe_price(1, 72.0, source="absence proof, list by id")
    assert m.accrued_usd() == pytest.approx(2.0)  # 100 s at $72/h: from the start, whenever it rose
    assert change is not None and (change.outcome, change.searched_dph_usd, change.billed_dph_usd, change.source) \
        == ("late", 3.6, 72.0, "absence proof, list by id")
    assert m.over_cap() is not None  # the verdict sees the cap passed: never exit 0
    assert m.observe_price(1, 36.0, source="list by id") is None  # lower: the higher price stands
    assert m.observe_price(99, 100.0, source="list by id") is None  # not an instance of this meter
    assert m.accrued_usd() == pytest.approx(2.0)


def test_a_higher_price_seen_in_time_tightens_the_deadline(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=3600)
    m.start_instance(1, 3.6)
    before = m.work_deadline()
    change = m.observe_price(1, 7.2, source="list by id")
    assert change is not None and change.outcome == "tightened" and m.work_deadline() < before


@pytest.mark.parametrize("price", [None, math.nan, math.inf, -1.0, 0.0])
def test_an_unreadable_price_a_read_shows_is_ignored_recorded_once_and_the_last_good_kept(
        fake_clock: FakeClock, price: float | None) -> None:
    m = meter(fake_clock)
    m.start_instance(1, 1.0)
    m.observe_price(1, 2.0, source="list by id")
    for _ in range(3):  # every proof round reads it again: recorded once
        m.observe_price(1, price, source="absence proof, list by id", reason="dph_total is null")
    ignored = [c for c in m.price_changes if c.outcome == "ignored"]
    assert [(c.billed_dph_usd, c.searched_dph_usd, c.reason) for c in ignored] == [(None, 2.0, "dph_total is null")]
    fake_clock.sleep(3600)
    assert m.accrued_usd() == pytest.approx(2.0)  # the last good price


@pytest.mark.parametrize("price", [math.nan, math.inf, -1.0, 0.0])
def test_an_unusable_billed_price_stops_the_run(fake_clock: FakeClock, price: float) -> None:
    m = meter(fake_clock)
    m.start_instance(1, 1.0)
    with pytest.raises(CapReachedError, match="positive finite"):
        m.reprice(1, price)
    assert m.price_changes[-1].outcome == "refused" and m.price_changes[-1].billed_dph_usd is None


@pytest.mark.parametrize("price", [1e306, 1e308, 1.7e308])
def test_a_huge_finite_billed_price_stops_the_run_and_every_figure_stays_finite(fake_clock: FakeClock,
                                                                               price: float) -> None:
    # Red team r8 B2: a row stating $1e306/h overflowed the accrued figure to inf and `usd_up` raised
    # OverflowError: exit 1, no harness-result.json, no absence proof. Such a price is billed at the ceiling:
    # it breaks any cap the harness allows (exit 6) and every figure the record writes is finite.
    m = meter(fake_clock, max_usd=MAX_USD_LIMIT)
    m.start_instance(1, 1.0)
    fake_clock.sleep(10)
    with pytest.raises(CapReachedError, match="the cap cannot be kept"):
        m.reprice(1, price)
    fake_clock.sleep(3 * 86400.0)  # the teardown hangs for days at that price
    assert math.isfinite(m.accrued_usd()) and math.isfinite(usd_up(m.accrued_usd()))
    assert math.isfinite(m.hard_deadline()) and m.over_cap() is not None
    change = m.price_changes[-1]
    assert change.outcome == "refused" and change.billed_dph_usd == price  # the record keeps what was stated


@pytest.mark.parametrize("price", [1e306, 1.7e308])
def test_a_huge_finite_price_any_read_shows_is_billed_at_the_ceiling_never_raising(fake_clock: FakeClock,
                                                                                  price: float) -> None:
    m = meter(fake_clock, max_usd=MAX_USD_LIMIT)
    m.start_instance(1, 1.0)
    fake_clock.sleep(86400.0 * 30)
    change = m.observe_price(1, price, source="absence proof, list by id")
    assert change is not None and change.outcome == "late" and change.billed_dph_usd == price
    assert math.isfinite(usd_up(m.accrued_usd())) and m.over_cap() is not None
    assert m.accrued_usd() == pytest.approx(30 * 24 * MAX_PLAUSIBLE_DPH_USD)


def test_usd_up_of_a_non_finite_figure_never_raises() -> None:
    assert usd_up(math.inf) == math.inf and math.isnan(usd_up(math.nan)) and usd_up(1e306) == 1e306


# ----------------------------------------------------------------------------------------- transfers


def test_bytes_either_way_are_billed_at_the_higher_rate(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    # no source says whose "up" inet_up_cost names: both directions at max(inet_up_cost, inet_down_cost)
    m.set_transfer(inet_down_cost_usd_per_gb=2.0, inet_up_cost_usd_per_gb=5.0)
    m.add_bytes(up=10**9 // 2)
    m.add_bytes(down=10**8)
    assert m.accrued_usd() == pytest.approx(2.5 + 0.5)


def test_a_second_transfer_price_never_lowers_the_first(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    m.set_transfer(inet_down_cost_usd_per_gb=2.0, inet_up_cost_usd_per_gb=5.0)
    m.set_transfer(inet_down_cost_usd_per_gb=None, inet_up_cost_usd_per_gb=1.0)  # the next offer's, cheaper
    m.add_bytes(up=10**9, down=10**9)
    assert m.accrued_usd() == pytest.approx(10.0)


def test_expected_transfers_are_reserved_until_they_happen(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=10**6)
    m.start_instance(1, 3.6)  # $0.001/s: the money lasts 1000 s
    assert m.hard_deadline() == pytest.approx(T0 + 1000)
    m.set_transfer(inet_down_cost_usd_per_gb=0.0, inet_up_cost_usd_per_gb=10.0, expected_down_bytes=2 * 10**7)
    assert m.hard_deadline() == pytest.approx(T0 + 1000 - 200)  # $0.20 of evidence kept back
    m.add_bytes(down=10**7)  # half of it moved: half the reservation becomes accrual, the sum is the same
    assert m.hard_deadline() == pytest.approx(T0 + 1000 - 200)
    m.add_bytes(down=2 * 10**7)  # more than expected: no negative reservation
    assert m.hard_deadline() == pytest.approx(T0 + 1000 - 300)


def test_byte_counts_are_exact_under_threads(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    workers = [threading.Thread(target=lambda: [m.add_bytes(up=1, down=2) for _ in range(2000)]) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert (m.bytes_up, m.bytes_down) == (16000, 32000)


# ------------------------------------------------------------------------------------------- deadlines


def test_the_time_cap_binds_when_nothing_bills(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_seconds=600, margin_s=60)
    assert m.hard_deadline() == T0 + 600 and m.work_deadline() == T0 + 540
    fake_clock.sleep(100)
    assert m.remaining_s() == pytest.approx(440)


def test_the_earlier_cap_binds(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=600)
    m.start_instance(1, 36.0)  # $0.01/s: money for 100 s
    assert m.hard_deadline() == pytest.approx(T0 + 100)
    m.stop_instance(1, fake_clock())  # nothing live: the money no longer runs out, the time cap is back
    assert m.hard_deadline() == pytest.approx(T0 + 600)


def test_a_phase_deadline_is_its_limit_or_the_work_deadline(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_seconds=600, margin_s=60)
    assert m.deadline(30) == T0 + 30
    assert m.deadline(10_000) == T0 + 540
    assert m.deadline() == T0 + 540


def test_check_stops_a_phase_with_no_time_left_naming_what_was_spent(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=600, margin_s=60)
    m.check("upload")  # time left: no error
    fake_clock.sleep(541)
    with pytest.raises(CapReachedError, match=r"cap reached before the evidence pull.*541 s of 600 s"):
        m.check("the evidence pull")


def test_affordable_bytes(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=1.0, max_seconds=10**6, margin_s=50)
    assert m.affordable_down_bytes(T0 + 100) == math.inf and m.affordable_up_bytes(T0 + 100) == math.inf
    m.start_instance(1, 3.6)  # $0.001/s
    m.set_transfer(inet_down_cost_usd_per_gb=1.0, inet_up_cost_usd_per_gb=10.0, expected_down_bytes=10**7)
    # until T0 + 100: $0.15 of compute (100 s + the 50 s margin) leaves $0.85 for evidence at $10/GB
    assert m.affordable_down_bytes(T0 + 100) == pytest.approx(0.85 / 10.0 * 1e9)
    # uploads also keep back the expected evidence ($0.10), and are priced at the higher rate too
    assert m.affordable_up_bytes(T0 + 100) == pytest.approx(0.75 / 10.0 * 1e9)
    assert m.affordable_down_bytes(T0 + 10**5) == 0.0  # never negative


# ------------------------------------------------------------------------------------------- over cap


def test_elapsed_time_ends_at_the_last_delete_ack(fake_clock: FakeClock) -> None:
    m = meter(fake_clock)
    fake_clock.sleep(5)
    assert m.elapsed_s() == 5  # nothing rented: the run's own time
    m.start_instance(1, 1.0)
    m.start_instance(2, 1.0)
    fake_clock.sleep(10)
    assert m.elapsed_s() == 15  # live: until now
    m.stop_instance(1, fake_clock() - 5)
    m.stop_instance(2, fake_clock() - 2)
    fake_clock.sleep(100)
    assert m.elapsed_s() == 13  # the later acknowledgement


def test_over_cap_by_money(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=0.01, max_seconds=600)
    m.start_instance(1, 0.36)  # $0.0001/s: over the cent after 100 s
    fake_clock.sleep(99)
    assert m.over_cap() is None
    fake_clock.sleep(2)
    assert "accrued $0.010100 is over the $0.01 cap" == m.over_cap()


def test_over_cap_by_time_counts_only_a_rented_instance(fake_clock: FakeClock) -> None:
    m = meter(fake_clock, max_usd=100.0, max_seconds=60)
    fake_clock.sleep(120)
    assert m.over_cap() is None  # no instance: nothing billed past the cap (a slow preflight)
    m.start_instance(1, 0.36, t_start=fake_clock())
    fake_clock.sleep(30)
    m.stop_instance(1, fake_clock())
    assert m.over_cap() == "the instance lived 150.0 s, over the 60.0 s cap"  # counted from the run's start


def test_binding_cap_names_the_cap_that_sets_the_deadline() -> None:
    # A run cut by its time cap names the time cap, not a price that never changed.
    clock = FakeClock()
    m = meter(clock, max_usd=1.0, max_seconds=600.0)
    m.start_instance(1, 0.36)  # $0.0001/s: $1 lasts 10,000 s, the time cap binds
    assert m.binding_cap() == "time"
    m.reprice(1, 36.0)  # $0.01/s: $1 lasts 100 s
    assert m.binding_cap() == "dollar"


def test_a_wait_that_gives_up_early_by_design_is_still_a_cut_by_the_cap() -> None:
    # An SSH connect starts no attempt it cannot finish, so it ends up to one attempt before the cap's work
    # deadline: that is still the cap ending the boot (exit 6), not "no host came up" (exit 1).
    clock = FakeClock(T0)
    m = meter(clock, max_seconds=100.0, margin_s=10.0)  # work deadline T0 + 90
    clock.now_s = T0 + 89.8
    assert not m.cut_by_cap()
    assert m.cut_by_cap(ends_early_s=0.25)
    clock.now_s = T0 + 89.0
    assert not m.cut_by_cap(ends_early_s=0.25)


def test_a_delete_that_deleted_nothing_bills_on_and_counts_against_the_time_cap() -> None:
    """Red team r6: a DELETE answered 200 "deleted" stopped the meter; the proof then saw the instance live,
    a second DELETE deleted it 216 s in, and the run reported the first DELETE's bill under a 180 s cap, exit 0."""
    clock = FakeClock(T0)
    m = meter(clock, max_seconds=180.0)
    m.start_instance(1, 3.6)  # $0.001 a second
    clock.sleep(10.0)
    m.stop_instance(1, clock())  # the first DELETE's 200, which deleted nothing
    clock.sleep(5.0)
    m.resume_instance(1)  # a proof round sees it live
    assert m.live_usd_per_s() == pytest.approx(0.001)
    clock.sleep(200.0)
    m.stop_instance(1, clock())  # the second DELETE
    m.end_instance_at(1, clock())  # the teardown settles on the DELETE that deleted it
    assert m.accrued_usd() == pytest.approx(0.215)
    assert m.elapsed_s() == pytest.approx(215.0)
    assert "over the 180.0 s cap" in (m.over_cap() or "")
    m.end_instance_at(1, T0 + 10.0)  # an earlier end replaces a later one: it is the DELETE that deleted it
    assert m.accrued_usd() == pytest.approx(0.010)


def test_recorded_dollars_round_up_never_under_the_bill() -> None:
    from vast_harness.caps.meter import usd_up

    assert usd_up(0.0016714901) == 0.001672  # to nearest it was 0.001671, under a bill of 0.00167149
    assert usd_up(0.001671) == 0.001671  # a figure already on the grid stays (no float-noise step up)
    assert usd_up(0.0) == 0.0
