"""A rental contract's price holds until its end date (issue 43 item 8; the sources: docs/vast-behaviours.md):
Vast's docs say a contract locks the price and the rental end date, and a host's raise is a pending increase
the renter accepts or rejects, applying only from that end date. So the worst case is exact while the
contract's end lies past the time cap; an offer whose end date falls inside the time cap is refused; and a
rented contract that ends inside it (the host shortened its offer after the search) moves the run's deadline in
to its end, billing any pending increase past it. Pure functions, the meter on the fake clock, and whole runs
on the simulator's sourced model (`contract_end`, `reprice`)."""

from __future__ import annotations

import time

import pytest

from tests.harness.conftest import FakeClock
from tests.harness.test_offers_quote import criteria, offer
from tests.harness.test_price_reads import KEY, execute, make_spec
from vast_harness.caps.meter import CostMeter
from vast_harness.console.output import Output
from vast_harness.market.offers import check_offer
from vast_harness.market.quote import quote_offer
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance, Offer, PendingPriceIncrease

NOW = 1_800_000_000.0  # the server's clock at the search (epoch seconds)
T0 = 1000.0


def test_an_offer_whose_end_date_falls_inside_the_time_cap_is_refused_naming_it():
    cap_s = 50 * 60
    inside = offer(end_date=NOW + cap_s - 1, duration=86400.0 * 7)  # duration says a week; the date says less
    assert any("ends 2027-01-15T08:" in r and "inside the time cap" in r
               for r in check_offer(inside, criteria(now_unix=NOW))), check_offer(inside, criteria(now_unix=NOW))
    assert not check_offer(offer(end_date=NOW + cap_s + 60), criteria(now_unix=NOW))
    assert not check_offer(offer(end_date=NOW + 1), criteria())  # no server time heard: the duration decides
    assert not check_offer(offer(end_date="soon"), criteria(now_unix=NOW))  # an unreadable date is no date


def test_the_quote_says_the_price_is_the_contracts_until_its_end():
    q = quote_offer(offer(end_date=NOW + 86400), max_minutes=50, disk_gb=60, upload_bytes=0, download_bytes=0)
    assert q.contract_end_unix == NOW + 86400
    assert q.arithmetic.endswith("; the $/h is fixed by the contract until 2027-01-16T08:00:00Z, after the time cap")
    assert "contract" not in quote_offer(offer(), max_minutes=50, disk_gb=60, upload_bytes=0,
                                         download_bytes=0).arithmetic


def test_rows_carry_the_contracts_end_and_a_pending_increase_its_factor():
    assert Instance.model_validate({"id": 1, "end_date": "1800000000.5"}).end_date_unix == 1800000000.5
    for odd in (None, "x", float("nan"), True, [1], 0, -5.0):  # 0 is no date (an open-ended offer), not 1970
        assert Instance.model_validate({"id": 1, "end_date": odd}).end_date_unix is None
        assert Offer.model_validate({"id": 1, "end_date": odd}).end_date_unix is None
    row = {"pending_price_increase_id": 5, "contract_id": 1, "old_gpu_costpersec": 0.001, "new_gpu_costpersec": 0.003,
           "old_disk_ram_costpersec": 1e-5, "new_disk_ram_costpersec": 5e-5}
    assert PendingPriceIncrease.model_validate(row).factor == pytest.approx(5.0)  # the larger ratio, unit-free
    assert PendingPriceIncrease.model_validate({**row, "new_disk_ram_costpersec": None}).factor == pytest.approx(3)
    assert PendingPriceIncrease.model_validate({"pending_price_increase_id": 5, "contract_id": 1}).factor is None


def _meter(clock: FakeClock, max_usd: float = 100.0) -> CostMeter:
    m = CostMeter(max_usd=max_usd, max_seconds=600.0, teardown_margin_s=60.0, clock=clock)
    m.start_instance(7, 3.6)  # $0.001/s
    return m


def test_a_contract_that_ends_inside_the_time_cap_is_the_runs_deadline(fake_clock: FakeClock):
    m = _meter(fake_clock)
    assert m.hard_deadline() == T0 + 600
    m.set_contract_end(7, end_s=T0 + 300, end_unix=NOW + 300)
    assert m.hard_deadline() == T0 + 300 and m.work_deadline() == T0 + 240
    assert m.binding_cap() == "contract" and "contract ends 2027-01-15T08:05:00Z" in m.cap_reached()
    m.set_contract_end(7, end_s=T0 + 900, end_unix=NOW + 900)  # extended past the cap (an accepted increase)
    assert m.hard_deadline() == T0 + 600 and m.binding_cap() == "time"


def test_past_the_contracts_end_it_bills_a_pending_increase_from_then(fake_clock: FakeClock):
    m = _meter(fake_clock)
    m.set_contract_end(7, end_s=T0 + 100, end_unix=NOW + 100, after_factor=4.0)
    fake_clock.sleep(100)
    assert m.accrued_usd() == pytest.approx(0.1)
    fake_clock.sleep(10)  # a teardown that ran past the end: 4x from the end on
    assert m.accrued_usd() == pytest.approx(0.1 + 10 * 0.004)
    m.set_contract_end(7, end_s=T0 + 100, end_unix=NOW + 100, after_factor=0.5)  # never below the contract's
    assert m.accrued_usd() == pytest.approx(0.1 + 10 * 0.001)
    m.stop_instance(7, fake_clock.now_s)
    assert m.live_usd_per_s() == 0.0


def test_a_contract_that_already_ended_leaves_no_time_to_work(fake_clock: FakeClock):
    m = _meter(fake_clock)
    m.set_contract_end(7, end_s=T0 - 5, end_unix=NOW - 5)
    assert m.remaining_s() < 0 and m.cut_by_cap()


# ------------------------------------------------------------------------------------ whole runs, simulated

SIM_OPTIONS = dict(seed=11, rate_scale=0.01, boot_seconds=0.1, num_offers=300)  # conftest.sim


def _run(sim, tmp_path, faults: str, step: str, *, max_usd: float | None = None):
    sim.set_faults(faults)
    spec = make_spec(sim, tmp_path, [Step(name="s", run=step, timeout_s=60)], max_usd=max_usd, poll_s=0.25)
    out = Output(json_mode=True, quiet=True)
    warnings: list[str] = []
    out.warn = warnings.append  # type: ignore[method-assign]
    with VastClient(KEY, base_url=sim.url, pacing_scale=0.01) as client:
        run = GuardedRun(spec, client, load_driver_policy(), out)
        started = time.monotonic()
        result = execute(run, within_s=60)
    (record,) = [i for i in sim.state()["instances"] if i["id"] in {c.instance_id for c in run.created}]
    return run, result, record, warnings, time.monotonic() - started


@pytest.mark.usefixtures("clean_sim")
def test_a_rented_contract_that_ends_inside_the_time_cap_ends_the_run_before_vast_stops_it(sim, tmp_path):
    """The host moved its offer's end in after the search: the contract ends 6 s after the create, inside the
    run's 30 s cap. The run's work ends before it (exit 6 naming the contract), the instance is deleted before
    Vast would stop it, and a pending increase on it (asked 5x at the boot) is what any time past it counts at."""
    run, result, record, warnings, took_s = _run(sim, tmp_path, "contract_end:6;reprice:5:0", "sleep 25")
    assert result.exit_code == 6 and "contract ends" in result.message, result.message
    assert took_s < 20  # cut at the contract's end, not the step's 25 s
    assert not record["live"] and record["destroyed_at"] < record["end_date"] and not record["expired"]
    assert any("contract ends" in w and "before the time cap" in w for w in warnings), warnings
    assert any("5x its price from the contract's end" in w for w in warnings), warnings
    assert run.meter.accrued_usd() >= record["billed_usd"]


@pytest.mark.usefixtures("clean_sim")
def test_a_host_raising_its_price_mid_run_costs_the_run_nothing_more(sim, tmp_path):
    """Issue 43 item 8, on the sourced model: a 200x raise mid-step used to overshoot a $0.10 cap by one poll
    (2.5-3.1x). As Vast does it, the running contract keeps its price (the raise is a pending increase, from the
    contract's end, days away): the run passes under its cap and its record bills what the simulator billed."""
    run, result, record, warnings, _ = _run(sim, tmp_path, "reprice:200:0.3", "sleep 2", max_usd=0.1)
    assert result.exit_code == 0, result.message
    assert record["price_increase"] == {"id": record["price_increase"]["id"], "factor": 200.0, "accepted": False}
    assert record["billed_usd"] < 0.1 and run.meter.accrued_usd() >= record["billed_usd"]
    assert not [c for c in run.meter.price_changes if c.billed_dph_usd] and not warnings
