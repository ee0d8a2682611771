"""The guarded run against the simulator over real HTTP and real SSH: evidence, exit codes, teardown, reap.

Each test names the fault it injects; every test checks the simulator's own record, not the harness's word.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from vast_harness.actions.reap import reap_all
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-runner-key"


SIM_OPTIONS = dict(seed=3, rate_scale=SCALE, boot_seconds=0.1, num_offers=400)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")  # faults cleared around each test


def make_spec(sim: SimServer, tmp_path: Path, steps: list[Step], **overrides) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              remote_secret=["SECRET_TOKEN=hunter2-value"], remote_env=["BACKEND=flash"]), environ={})
    prof = spec.profile.model_copy(update={"steps": steps, **overrides.pop("profile", {})})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)} | overrides
                           ).with_timings(teardown_margin_s=2.0)


def run(sim: SimServer, spec: RunSpec):
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    return run, result


def live_ids(sim: SimServer) -> set[int]:
    return {i["id"] for i in sim.state()["instances"] if i["live"]}


def test_happy_path_writes_the_whole_evidence_layout(sim, tmp_path):
    steps = [Step(name="hello", run="echo hi; echo oops >&2; echo '{\"ok\": 1}' > evidence/out.json", timeout_s=30)]
    r, result = run(sim, make_spec(sim, tmp_path, steps))
    assert result.exit_code == 0, result.message
    d = r.ev.dir
    for name in ("harness-result.json", "offer-quote.json", "steps.tsv", "steps/hello.log", "remote/out.json",
                 "absence-proof.json", "manifest.sha256"):
        assert (d / name).is_file(), name
    assert (d / "steps.tsv").read_text().startswith("hello\t0\t")
    assert "hi" in (d / "steps/hello.log").read_text() and "oops" in (d / "steps/hello.log").read_text()
    res = json.loads((d / "harness-result.json").read_text())
    assert res["absence"]["verdict"] == "gone" and res["exit_code"] == result.exit_code
    assert res["remote_env"] == {"OMP_NUM_THREADS": "1", "BACKEND": "flash", "SECRET_TOKEN": "***"}
    assert res["remote_secrets"] == ["SECRET_TOKEN"]
    assert res["host_key"]["fingerprint"].startswith("SHA256:")
    assert res["accrued_usd"] <= res["caps"]["max_usd"]
    manifest = (d / "manifest.sha256").read_text()
    assert "harness-result.json" in manifest and "remote/out.json" in manifest
    # the simulator agrees: deleted, and billed no more than the cap
    inst = next(i for i in sim.state()["instances"] if i["id"] == r.created[0].instance_id)
    assert not inst["live"] and inst["billed_usd"] <= res["caps"]["max_usd"]
    # nothing secret anywhere in the evidence
    for path in d.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "hunter2-value" not in text and KEY not in text, path


def test_failed_step_exits_1_and_still_deletes(sim, tmp_path):
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="boom", run="exit 7", timeout_s=10),
                                                   Step(name="never", run="echo no", timeout_s=10)]))
    assert result.exit_code == 1 and "rc=7" in result.message
    assert [s.name for s in r.steps] == ["boom"]
    assert not live_ids(sim) & {i.instance_id for i in r.created}


@pytest.mark.slow
def test_cap_stops_the_run_with_exit_6(sim, tmp_path):
    spec = make_spec(sim, tmp_path, [Step(name="long", run="sleep 30", timeout_s=60)])
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_minutes": 0.1})})  # 6 s, 2 s margin
    start = time.monotonic()
    r, result = run(sim, spec)
    assert result.exit_code == 6, result.message
    assert time.monotonic() - start < 15
    assert r.teardowns[0].verdict == "gone"


@pytest.mark.slow
def test_every_phase_runs_on_the_runs_own_clock(sim, tmp_path):
    # The run's clock is injected (GuardedRun(clock=...)). One far from time.monotonic catches any phase
    # that compares a deadline with another clock: it would cut a step at once or never, or wait a week.
    week_s = 7 * 86400.0

    def offset_clock() -> float:
        return time.monotonic() + week_s

    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo hi", timeout_s=10),
                                     Step(name="long", run="sleep 30", timeout_s=60)])
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_minutes": 0.12})})  # 7.2 s
    start = time.monotonic()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        r = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), clock=offset_clock)
        result = r.execute()
    took_s = time.monotonic() - start
    assert result.exit_code == 6, result.message  # the cap cut the long step, on the offset clock
    assert 3.0 < took_s < 15, took_s
    assert [s.name for s in r.steps] == ["ok", "long"] and r.steps[0].rc == 0
    assert r.teardowns[0].verdict == "gone" and not live_ids(sim) & {i.instance_id for i in r.created}
    assert r.meter.t0 >= week_s and r.created[0].t_created_mono >= week_s
    assert 0 < r.state.timings["total_s"] < 15 and 0 <= r.state.timings["teardown_s"] < 10
    res = json.loads((r.ev.dir / "harness-result.json").read_text())
    assert all(0 <= p["t_end_unix"] - p["t_start_unix"] < 15 for p in res["phases"])


def test_step_timeout_is_a_failed_step(sim, tmp_path):
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="slow", run="sleep 5", timeout_s=0.5)]))
    assert result.exit_code == 1 and "timed out" in result.message
    assert r.steps[0].timed_out


@pytest.mark.slow
def test_delete_failing_twice_is_retried_and_proven(sim, tmp_path):
    sim.set_faults("delete_fail:2")
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)]))
    assert result.exit_code == 0, result.message
    assert r.teardowns[0].verdict == "gone"
    assert not live_ids(sim) & {i.instance_id for i in r.created}


def test_create_timeout_is_followed_by_a_list_by_label_not_a_second_create(sim, tmp_path):
    sim.set_faults("create_timeout")
    before = len(sim.state()["instances"])
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)]))
    assert result.exit_code == 0, result.message
    assert len(sim.state()["instances"]) == before + 1  # exactly one rented
    events = [e.event for e in Ledger(r.spec.state_dir / "ledger.jsonl").entries() if e.run_id == r.run_id]
    assert events[:3] == ["intent", "create_unknown", "created"]


def test_offer_taken_moves_to_the_next_offer(sim, tmp_path):
    sim.set_faults("offer_taken")
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)]))
    assert result.exit_code == 0, result.message
    assert len(r.created) == 1


@pytest.mark.slow
def test_boot_failure_retries_on_another_machine(sim, tmp_path):
    sim.set_faults("boot_stall:1")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)],
                     profile={"boot_timeout_s": 2.0}, boot_retries=1)
    r, result = run(sim, spec)
    assert result.exit_code == 0, result.message
    assert len(r.created) == 2 and r.created[0].machine_id != r.created[1].machine_id
    assert all(t.verdict == "gone" for t in r.teardowns)


def test_boot_failure_without_retries_fails_cleanly(sim, tmp_path):
    sim.set_faults("boot_stall:1")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)],
                     profile={"boot_timeout_s": 1.0}, boot_retries=0)
    r, result = run(sim, spec)
    assert result.exit_code == 1 and "no host came up" in result.message
    assert r.teardowns[0].verdict == "gone"


def test_ssh_drop_is_reported_not_retried(sim, tmp_path):
    sim.set_faults("ssh_drop:0.5")
    # No receipt: the drop must land in the step (one during the receipt replaces the host: test_receipt_run.py)
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="drop", run="sleep 3; echo done", timeout_s=20)],
                                   profile={"receipt": ReceiptPolicy(enabled=False)}))
    assert result.exit_code == 1 and "connection lost" in result.message
    assert r.steps[0].connection_lost and r.steps[0].reconnect_ok is not None


def test_a_signal_while_the_live_view_starts_is_exit_130_not_a_traceback(sim, tmp_path, monkeypatch):
    # Seen once in the suite: Ctrl-C 1 s after launch landed in start_view, outside the run's try, and the
    # Interrupted went past every handler (a traceback, exit 1).
    import signal as signal_mod

    from vast_harness.errors import Interrupted

    def interrupted(self, snapshot) -> None:
        raise Interrupted(signal_mod.SIGINT)

    monkeypatch.setattr(Output, "start_view", interrupted)
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)]))
    assert result.exit_code == 130 and "SIGINT" in result.message, result.message
    assert not r.created


def test_after_a_dropped_step_the_evidence_is_pulled_over_a_new_connection(sim, tmp_path):
    # `ssh_drop` mid-step and a reconnect probe that succeeds: the evidence the step had written (blob.bin) is
    # pulled over the new connection, not left behind with `pull: null` and nothing said.
    sim.set_faults("ssh_drop:1.0")
    steps = [Step(name="drop", run="mkdir -p evidence; head -c 100000 /dev/urandom > evidence/blob.bin; sleep 5",
                  timeout_s=20)]
    r, result = run(sim, make_spec(sim, tmp_path, steps))
    assert result.exit_code == 1 and "connection lost" in result.message
    assert r.steps[0].connection_lost and r.steps[0].reconnect_ok is True
    assert r.pull is not None and r.pull.files == 1 and r.pull.complete, r.pull
    assert (r.ev.dir / "remote" / "blob.bin").stat().st_size == 100000
    assert r.teardowns[0].verdict == "gone"


def test_unprovable_absence_exits_3_and_reap_cleans_up(sim, tmp_path):
    # Every list answers 503 for a while: the per-id read alone must never be taken as proof.
    sim.set_faults("5xx:list:*:503")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, max_retry_s=0.5) as client:
        r = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        r.state.teardown_budget_s = 1.0
        result = r.execute()
    assert result.exit_code == 3 and "reap" in result.message
    pending, _ = Ledger(spec.state_dir / "ledger.jsonl").unproven()
    assert {i.instance_id for i in r.created} <= set(pending)
    sim.set_faults(None)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output(quiet=True)) == 0
    assert not live_ids(sim) & {i.instance_id for i in r.created}
    assert not Ledger(spec.state_dir / "ledger.jsonl").unproven()[0]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_mid_step_tears_down_and_exits_130(sim, tmp_path, signum):
    spec = make_spec(sim, tmp_path, [Step(name="wait", run="sleep 20", timeout_s=30)])
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signum))
    timer.start()
    try:
        r, result = run(sim, spec)
    finally:
        timer.cancel()
    assert result.exit_code == 130 and signum.name in result.message
    assert r.teardowns and r.teardowns[0].verdict == "gone"
    assert not live_ids(sim) & {i.instance_id for i in r.created}


@pytest.mark.slow
def test_second_ctrl_c_does_not_skip_teardown(sim, tmp_path, capsys):
    # A 1.5 s proof interval keeps teardown busy long enough for the second signal to land inside it.
    spec = make_spec(sim, tmp_path, [Step(name="wait", run="sleep 20", timeout_s=30)]).with_timings(
        proof_interval_s=1.5)
    timers = [threading.Timer(t, lambda: os.kill(os.getpid(), signal.SIGINT)) for t in (1.5, 2.3)]
    for t in timers:
        t.start()
    try:
        with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
            r = GuardedRun(spec, client, load_driver_policy(), Output())
            result = r.execute()
    finally:
        for t in timers:
            t.cancel()
    assert result.exit_code == 130
    assert "teardown is in progress" in capsys.readouterr().err
    assert r.teardowns[0].verdict == "gone"
    assert not live_ids(sim) & {i.instance_id for i in r.created}


@pytest.mark.slow
def test_one_ctrl_c_during_the_pull_keeps_what_was_copied_and_names_what_was_left(sim, tmp_path):
    # One SIGINT 3 s into a 10 s pull: exit 130 and gone, and the record keeps what was copied and names what
    # was left (not files 0, left [], detail ""), so the teardown can try again.
    from vast_harness.run.host_work import HostWork

    class SignalDuringPull(HostWork):
        def pull_evidence(self, *, in_teardown: bool, max_s: float | None = None) -> None:
            if not in_teardown:
                threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            super().pull_evidence(in_teardown=in_teardown, max_s=max_s)

    sim.set_faults("slow_sftp:60000")  # 600 KB: a 10 s pull
    steps = [Step(name="mk", run="mkdir -p evidence; echo '{}' > evidence/a.json; "
                               "head -c 600000 /dev/urandom > evidence/big.bin", timeout_s=20)]
    spec = make_spec(sim, tmp_path, steps)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        r = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), host_work=SignalDuringPull)
        result = r.execute()
    assert result.exit_code == 130, result.message
    assert r.teardowns[0].verdict == "gone"
    assert (r.ev.dir / "remote" / "a.json").is_file()  # copied whole before the signal: kept
    assert r.pull is not None and not r.pull.complete and "big.bin" in r.pull.left, r.pull


def test_no_offer_exits_5_and_rents_nothing(sim, tmp_path):
    before = len(sim.state()["instances"])
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)])
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": 0.0001})})
    r, result = run(sim, spec)
    assert result.exit_code == 5
    assert len(sim.state()["instances"]) == before


def test_create_error_that_still_creates_is_deleted_and_the_next_host_tried(sim, tmp_path):
    sim.set_faults("create_stopped")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)], boot_retries=1)
    r, result = run(sim, spec)
    assert result.exit_code == 0, result.message
    assert len(r.created) == 2 and r.created[0].status == "created_with_error"
    assert all(t.verdict == "gone" for t in r.teardowns)
    assert not live_ids(sim) & {i.instance_id for i in r.created}


def test_every_offer_taken_and_nothing_rented_is_exit_5(sim, tmp_path):
    sim.set_faults("offer_taken:*")
    before = len(sim.state()["instances"])
    r, result = run(sim, make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=10)]))
    assert result.exit_code == 5, result.message
    assert len(sim.state()["instances"]) == before and not r.created
