"""An instance gone with no DELETE of ours (run/instance_reads.py `vanished`): after the run's own dead-man
switch could have fired (the run was stopped past it: SIGSTOP, a suspended laptop), the reason says that the
switch most likely deleted it, instead of blaming "someone else" alone (red team round 5)."""

from __future__ import annotations

import pytest

from tests.harness.conftest import FakeClock
from vast_harness.caps.meter import CostMeter
from vast_harness.console.output import Output
from vast_harness.records import CreatedInstance
from vast_harness.run.instance_reads import InstanceReads
from vast_harness.run.rent_book import RentBook


def _reads(fake_clock: FakeClock, allowance_s: float | None) -> tuple[InstanceReads, CreatedInstance, list[str]]:
    meter = CostMeter(max_usd=10.0, max_seconds=600, teardown_margin_s=60, clock=fake_clock)
    inst = CreatedInstance(instance_id=7, label="vh-x", offer_id=1, machine_id=None, dph_usd=1.0, seen=True,
                           t_created_mono=meter.t0)
    meter.start_instance(7, 1.0, meter.t0)
    cancelled: list[str] = []
    reads = InstanceReads(client=None, ledger=None, run_id="r", meter=meter, book=RentBook(),  # type: ignore[arg-type]
                          out=Output(quiet=True), cancel=lambda why, _code: cancelled.append(why), poll_s=1.0,
                          switch_allowance_s=allowance_s)
    return reads, inst, cancelled


@pytest.mark.parametrize(("elapsed_s", "switch"), [(100.0, False), (629.0, False), (631.0, True), (5000.0, True)])
def test_gone_after_the_switchs_allowance_names_the_switch(fake_clock: FakeClock, elapsed_s: float, switch: bool):
    reads, inst, cancelled = _reads(fake_clock, allowance_s=630.0)
    fake_clock.sleep(elapsed_s)
    reads.vanished(inst, "a read of it no longer shows it")
    how = reads.book.vanished[7]
    assert how.startswith("a read of it no longer shows it")
    assert ("most likely this run's own dead-man switch" in how) == switch, how
    assert cancelled and how in cancelled[0]


def test_without_a_switch_allowance_nothing_is_guessed(fake_clock: FakeClock):
    reads, inst, _ = _reads(fake_clock, allowance_s=None)
    fake_clock.sleep(5000)
    reads.vanished(inst, "our first DELETE found it already gone")
    assert reads.book.vanished[7] == "our first DELETE found it already gone"
