"""The dead-man switch proven armed before the workload, fixed on the host's clock, and loud when it cannot act
(docs/vast-behaviours.md: the container key, the v0 path family). Real runs against the simulator: the switch
is the onstart's own script on the simulated host, the harness checks it over real SSH."""

from __future__ import annotations

import json
import time

import pytest

from tests.harness.test_market_behaviours import OK, SIM_OPTIONS, execute, guarded, of_run  # noqa: F401 - conftest.sim reads SIM_OPTIONS
from tests.harness.test_runner import KEY, SCALE, make_spec
from vast_harness.actions.reap import reap_all
from vast_harness.console.output import Output
from vast_harness.host import deadman
from vast_harness.host.onstart import build_onstart
from vast_harness.vast.client import VastClient


@pytest.fixture(autouse=True)
def _clear(sim):  # noqa: F811
    sim.set_faults(None)
    yield
    sim.set_faults(None)


def _record(r) -> dict:
    return json.loads((r.ev.dir / "harness-result.json").read_text())


def test_an_armed_switch_is_recorded_with_its_deadline_and_log(sim, tmp_path):  # noqa: F811
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    result = execute(r)
    assert result.exit_code == 0, result.message
    rec = _record(r)["deadman"]
    assert rec["armed"] and rec["probe_status"] == 200 and abs(rec["host_clock_skew_s"]) < 5
    # the deadline the switch reads: what was left of cap + grace when SSH came up, on the host's clock
    allowance = int(r.spec.max_seconds + r.spec.deadman_grace_s)
    assert rec["allowance_s"] == allowance and 0 < allowance - rec["remaining_s"] < 30
    assert abs(rec["fires_at_host_epoch"] - (r.created[0].t_created_unix + allowance)) < 5
    log = (r.ev.dir / "deadman.log").read_text()
    assert " ARM 200 " in log and "armed: deletes at host epoch" in log
    assert "dead-man</td><td>armed, fires at " in (r.ev.dir / "report.html").read_text()


def test_a_user_clock_an_hour_ahead_does_not_move_the_deadline(sim, tmp_path, monkeypatch):  # noqa: F811
    # The finding: the deadline was the user's epoch compared with the host's clock (1 h ahead: fired at +4,381 s
    # instead of +780 s). Now the host's clock alone decides; the skew is recorded and said.
    monkeypatch.setattr(deadman, "_user_clock", lambda: time.time() + 3600)
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    result = execute(r)
    assert result.exit_code == 0, result.message
    rec = _record(r)["deadman"]
    assert rec["skew_large"] and abs(rec["host_clock_skew_s"] + 3600) < 5
    allowance = int(r.spec.max_seconds + r.spec.deadman_grace_s)
    assert abs(rec["fires_at_host_epoch"] - (time.time() + allowance)) < 30  # host clock: not an hour late


@pytest.mark.parametrize("ahead_s", [3600, -3600])
def test_the_onstart_carries_no_user_epoch(monkeypatch, ahead_s):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + ahead_s)
    skewed = build_onstart(public_key="ssh-ed25519 AAAA k", api_url="https://x", deadman_after_s=780)
    monkeypatch.setattr(time, "time", real)
    assert skewed == build_onstart(public_key="ssh-ed25519 AAAA k", api_url="https://x", deadman_after_s=780)
    assert "+780" in skewed  # host now + the allowance, written by the first onstart


def test_a_refused_container_key_fails_the_run_closed(sim, tmp_path):  # noqa: F811
    sim.set_faults("container_key_refused")
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    result = execute(r)
    assert result.exit_code == 1
    assert "dead-man switch" in result.message and "401" in result.message
    assert not r.steps  # before any workload
    assert [t.verdict for t in r.teardowns] == ["gone"] and not [i for i in of_run(sim, r) if i["live"]]
    rec = _record(r)["deadman"]
    assert not rec["armed"] and rec["probe_status"] == 401
    assert "DEADMAN-BROKEN" in (r.ev.dir / "deadman.log").read_text()


def test_allow_unarmed_runs_anyway_and_records_it(sim, tmp_path):  # noqa: F811
    sim.set_faults("container_key_refused")
    r = guarded(sim, make_spec(sim, tmp_path, OK, allow_unarmed_deadman=True))
    result = execute(r)
    assert result.exit_code == 0, result.message
    rec = _record(r)["deadman"]
    assert not rec["armed"] and rec["allowed_unarmed"] and "401" in rec["problem"]
    assert "NOT ARMED" in (r.ev.dir / "report.html").read_text()


def test_a_410_on_every_v0_instance_path_is_never_gone_and_named(sim, tmp_path):  # noqa: F811
    sim.set_faults("v0_deprecated")
    r = guarded(sim, make_spec(sim, tmp_path, OK), teardown_budget_s=2.0)
    result = execute(r)
    assert result.exit_code == 3, result.message  # never read as gone
    assert "RETIRED" in result.message and [t.verdict for t in r.teardowns] != ["gone"]
    deletes = r.teardowns[0].deletes
    assert deletes and "RETIRED" in deletes[0].outcome  # the harness names it loudly
    assert [i["live"] for i in of_run(sim, r)] == [True]
    sim.set_faults(None)  # Vast brings the path back (or the harness is updated): reap cleans up
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(r.spec, client, Output(quiet=True)) == 0
    assert not [i for i in of_run(sim, r) if i["live"]]


class _CutSession:
    """A host whose link stalls once the check has printed its clock and deadline: the command times out."""

    def run(self, command, *, on_line, timeout_s, **_):
        from vast_harness.records import StepOutcome

        on_line("stdout", f"VHCLOCK {int(time.time())}")
        on_line("stdout", f"VHDEADLINE {int(time.time()) + 60}")
        return StepOutcome(rc=None, seconds=timeout_s, timed_out=True, detail=f"timed out after {timeout_s:.1f} s")


def test_a_check_cut_off_on_the_host_says_so_not_that_the_onstart_never_ran():
    # A check the link cut (a stalled SSH link under a cap) says the check was cut, not that the onstart never
    # ran: the host said nothing either way.
    status = deadman.check_armed(_CutSession(), instance_id=7, allowance_s=60, elapsed_s=1.0, timeout_s=3.0,
                                 allow_unarmed=False)
    assert not status.armed
    assert "did not finish" in status.problem and "timed out after 3.0 s" in status.problem
    assert "onstart did not run" not in status.problem

