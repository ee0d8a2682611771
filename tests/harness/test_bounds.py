"""Every phase is bounded by the caps: the guarded run against the simulator over real HTTP and real SSH.

A stalled SSH link (a test-only TCP proxy between the harness and the host), a flooding step, a slow upload,
large evidence on a slow link, a search that shows a tenth of the billed price, a DELETE that lands after the
time cap, a full disk at teardown, and a time cap too short to boot in. The simulator's own record (billed
dollars, destroy time) is the judge, never the harness's word.
"""

from __future__ import annotations

import ast
import io
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from rich.console import Console

import vast_harness.run.rent as rent_mod
import vast_harness.run.teardown as teardown_mod
from tests.harness.netproxy import TcpProxy
from vast_harness.caps.meter import minimum_cap_s
from vast_harness.console.output import Output
from vast_harness.host.bundle import build_bundle
from vast_harness.market.plan import plan_run
from vast_harness.records import RESULT_SCHEMA_VERSION, RunRecord
from vast_harness.run.host_work import HostWork
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Offer

SCALE = 0.01
KEY = "sim-bounds-key"


SIM_OPTIONS = dict(seed=5, rate_scale=SCALE, boot_seconds=0.1, num_offers=300)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")  # faults cleared around each test


def make_spec(sim: SimServer, tmp_path: Path, steps: list[Step], *, max_minutes: float = 1.0,
              max_usd: float | None = None, **overrides) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": steps})
    caps = spec.caps.model_copy(update={"max_minutes": max_minutes} | ({"max_usd": max_usd} if max_usd else {}))
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY), "caps": caps}
                           ).with_timings(**{"teardown_margin_s": 2.0} | overrides)


def execute(run: GuardedRun, *, within_s: float):
    """Run in a worker so a harness that hangs fails the test instead of hanging it (no signals there)."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("result", run.execute()), daemon=True)
    worker.start()
    worker.join(within_s)
    assert not worker.is_alive(), f"the run did not finish within {within_s} s"
    return box["result"]


def sim_record(sim: SimServer, run: GuardedRun) -> list[dict]:
    ids = {i.instance_id for i in run.created}
    return [i for i in sim.state()["instances"] if i["id"] in ids]


def assert_within_caps(sim: SimServer, run: GuardedRun, spec: RunSpec, start_unix: float) -> None:
    """The simulator's record within both caps. The time cap counts from the run's own clock (`run.state.t0_unix`,
    taken as the run is made, before anything is searched or rented): on a loaded machine building the client
    before it took 14 s once, and a test clock started before that judged a run that kept its cap late."""
    insts = sim_record(sim, run)
    assert insts and not any(i["live"] for i in insts)
    billed = sum(i["billed_usd"] for i in insts)
    assert billed <= spec.caps.max_usd, f"billed ${billed:.6f} > cap ${spec.caps.max_usd:.6f}"
    assert start_unix <= run.state.t0_unix, "the run's clock started before the test did"
    phases = ", ".join(f"{p.name} +{p.t_start_unix - run.state.t0_unix:.2f}..+{(p.t_end_unix or 0) - run.state.t0_unix:.2f}"
                       for p in run.tools.phases.records)
    for i in insts:
        assert i["created_at"] >= run.state.t0_unix, "an instance was created before the run's clock started"
        lived_s = i["destroyed_at"] - run.state.t0_unix
        assert lived_s <= spec.max_seconds, (f"instance {i['id']} destroyed {lived_s:.2f} s after the run started "
                                             f"({run.state.t0_unix - start_unix:.2f} s after the test); phases: {phases}")


@pytest.fixture
def proxies(monkeypatch):
    """Route the run's SSH through TcpProxy instances the test can stall."""
    made: list[TcpProxy] = []
    real = rent_mod.endpoints_for

    def via_proxy(instance):
        out = []
        for ep in real(instance):
            proxy = TcpProxy(ep.host, ep.port)
            made.append(proxy)
            out.append(ep.model_copy(update={"port": proxy.port}))
        return out

    monkeypatch.setattr(rent_mod, "endpoints_for", via_proxy)
    yield made
    for proxy in made:
        proxy.close()


def stall_at_teardown_pull(proxies: list[TcpProxy]) -> type[HostWork]:
    """Host work whose link goes silent exactly when the teardown's evidence pull starts."""

    class StallAtTeardownPull(HostWork):
        def pull_evidence(self, *, in_teardown: bool, max_s: float | None = None) -> None:
            if in_teardown:
                for proxy in proxies:
                    proxy.stall()
            super().pull_evidence(in_teardown=in_teardown, max_s=max_s)

    return StallAtTeardownPull


# ------------------------------------------------------------------------------------------- stalls


def test_stalled_link_at_the_teardown_pull_does_not_hold_the_delete(sim, tmp_path, proxies):
    # The step fails; the teardown's pull meets a silent link. The pull must not hold the DELETE: the silent
    # SFTP channel is closed after the stall timeout (1 s with a 2 s margin).
    spec = make_spec(sim, tmp_path, [Step(name="fail", run="echo x > evidence/a.txt; exit 7", timeout_s=20)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True),
                         host_work=stall_at_teardown_pull(proxies))
        result = execute(run, within_s=25)
    assert result.exit_code == 1 and "rc=7" in result.message
    assert run.teardowns[0].verdict == "gone"
    assert not any(i["live"] for i in sim_record(sim, run))
    assert run.pull is not None and not run.pull.complete
    assert run.state.timings["pull_s"] <= 0.25 * spec.teardown_margin_s + 1.5


def test_signal_abandons_a_stalled_teardown_pull_and_the_delete_still_runs(sim, tmp_path, proxies):
    # A long teardown margin gives the pull a long grace; SIGINT during it must cut it short, not be ignored.
    spec = make_spec(sim, tmp_path, [Step(name="fail", run="exit 3", timeout_s=20)], max_minutes=2.0,
                     teardown_margin_s=40.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True),
                         host_work=stall_at_teardown_pull(proxies))
        sent: list[float] = []

        def interrupt_once_stalled() -> None:
            while not (proxies and proxies[0]._stalled.is_set()):
                time.sleep(0.05)
            time.sleep(0.5)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_stalled, daemon=True).start()
        result = run.execute()  # main thread: the signal handlers are installed
    assert sent, "the pull never started"
    assert result.exit_code == 1
    assert run.teardowns[0].verdict == "gone"
    assert not any(i["live"] for i in sim_record(sim, run))
    assert run.state.timings["pull_s"] < 0.5 + 1.5  # grace was 10 s: the signal ended it


def test_stalled_link_at_the_pull_after_the_steps_is_abandoned_and_never_exit_0(sim, tmp_path, proxies):
    # The SFTP channel is silent past the stall timeout: the link is closed, the evidence is incomplete (exit 1).
    class StallAfterSteps(HostWork):
        def run_steps(self) -> None:
            super().run_steps()
            for proxy in proxies:
                proxy.stall()

    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo x > evidence/a.txt", timeout_s=20)], max_minutes=0.1)
    start_unix = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), host_work=StallAfterSteps)
        result = execute(run, within_s=20)
    assert result.exit_code == 1, result.message
    assert "evidence pull broke off" in result.message and "stalled" in result.message
    assert run.state.timings["pull_s"] < run.state.session.stall_timeout_s + 1.5
    assert run.teardowns[0].verdict == "gone"
    assert_within_caps(sim, run, spec, start_unix)


# ------------------------------------------------------------------------------------------- floods


def test_flooding_step_is_cut_at_its_timeout_and_its_log_is_capped(sim, tmp_path):
    spec = make_spec(sim, tmp_path, [Step(name="flood", run="yes flood-line-of-output", timeout_s=2.0)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        run.ev.step_log_head_bytes, run.ev.step_log_tail_bytes = 100_000, 20_000
        result = execute(run, within_s=25)
    assert result.exit_code == 1 and "timed out" in result.message
    step = run.steps[0]
    assert step.timed_out and step.seconds < 2.0 + 1.5
    assert step.log_bytes > 1_000_000 and step.log_dropped_bytes > 0
    log = (run.ev.dir / "steps" / "flood.log").read_bytes()
    assert len(log) <= 100_000 + 20_000 + 500
    assert log.startswith(b"flood-line-of-output\n") and b"flood-line-of-output\n" in log[-20_000:]
    assert b"bytes in" in log and b"dropped here" in log
    assert run.teardowns[0].verdict == "gone"


@pytest.mark.slow
def test_flooding_step_is_cut_at_the_cap(sim, tmp_path):
    spec = make_spec(sim, tmp_path, [Step(name="flood", run="yes", timeout_s=120)], max_minutes=0.1)
    start_unix = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=20)
    assert result.exit_code == 6, result.message
    assert_within_caps(sim, run, spec, start_unix)


# -------------------------------------------------------------------------------------- slow links


def test_slow_upload_is_stopped_at_the_cap(sim, tmp_path):
    # SFTP at 500 B/s: the bundle would take minutes; the upload is stopped at the cap, never billed past it.
    sim.set_faults("slow_sftp:500")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=20)], max_minutes=0.1)
    # No receipt: its payload would meet the slow link first (that host is replaced: test_receipt_run.py)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"receipt": ReceiptPolicy(enabled=False)})})
    start_unix = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=20)
    assert result.exit_code == 6 and "upload" in result.message, result.message
    assert not run.steps
    assert_within_caps(sim, run, spec, start_unix)


@pytest.mark.slow
def test_large_evidence_on_a_slow_link_is_stopped_at_the_cap_and_never_exit_0(sim, tmp_path):
    # 3 MB of evidence at 200 kB/s is 15 s; the cap leaves ~7 s: the pull is stopped at the cap, never exit 0.
    sim.set_faults("slow_sftp:200000")
    steps = [Step(name="big", run="head -c 3000000 /dev/urandom > evidence/big.bin", timeout_s=20)]
    spec = make_spec(sim, tmp_path, steps, max_minutes=0.15)
    start_unix = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=25)
    assert result.exit_code == 6, result.message
    assert run.steps[0].rc == 0 and run.pull is not None and not run.pull.complete
    assert_within_caps(sim, run, spec, start_unix)
    res = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert res["exit_code"] == 6 and res["accrued_usd"] <= spec.caps.max_usd


# ------------------------------------------------------------------------------------------ prices


class TenthPriceClient(VastClient):
    """A search that shows a tenth of what the host bills (a stale cache, a hostile proxy)."""

    def search_offers(self, query: dict, **kw: object) -> list[Offer]:
        def tenth(v: float | None) -> float | None:
            return None if v is None else v / 10

        return [o.model_copy(update={"dph_base": tenth(o.dph_base), "dph_total": tenth(o.dph_total),
                                     "storage_cost_usd_per_gb_month": tenth(o.storage_cost_usd_per_gb_month)})
                for o in super().search_offers(query)]


def lied_worst_case(sim: SimServer, spec: RunSpec) -> float:
    with TenthPriceClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        return plan_run(spec, client, load_driver_policy(), build_bundle()).chosen.quote.worst_case_usd


def test_billed_price_above_the_search_price_tightens_the_deadline(sim, tmp_path):
    # At the search's price the cap covers 45 s of a 30 s time cap; at the billed price only 4.5 s.
    steps = [Step(name="long", run="sleep 30", timeout_s=60)]
    spec = make_spec(sim, tmp_path, steps, max_minutes=0.5)
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": lied_worst_case(sim, spec) * 1.5})})
    start_unix = time.time()
    with TenthPriceClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=40)
    assert result.exit_code == 6, result.message
    assert time.time() - start_unix < 15
    assert_within_caps(sim, run, spec, start_unix)
    res = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert res["price_changes"] and res["price_changes"][0]["outcome"] == "tightened"
    assert res["price_changes"][0]["billed_dph_usd"] > 5 * res["price_changes"][0]["searched_dph_usd"]


def test_billed_price_that_breaks_the_cap_stops_the_run_at_once(sim, tmp_path):
    # At the billed price the cap covers ~3 s, less than the 5 s teardown margin: stop at the first read.
    steps = [Step(name="long", run="sleep 30", timeout_s=60)]
    spec = make_spec(sim, tmp_path, steps, max_minutes=0.5, teardown_margin_s=5.0)
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": lied_worst_case(sim, spec) * 1.01})})
    start_unix = time.time()
    with TenthPriceClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=30)
    assert result.exit_code == 6 and "bills" in result.message, result.message
    assert not run.steps and run.state.session is None
    assert_within_caps(sim, run, spec, start_unix)


@pytest.mark.slow
def test_a_run_over_its_time_cap_is_never_exit_0(sim, tmp_path):
    # Everything passes, but every DELETE hangs past the time cap (one hung DELETE alone is now cut and
    # retried in time): the instance outlived the cap. Exit 6.
    sim.set_faults("hang:destroy:6:*")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=20)], max_minutes=0.1)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=40)
    assert [s.rc for s in run.steps] == [0]
    assert run.teardowns[0].verdict == "gone"
    assert result.exit_code == 6 and "over the cap" in result.message, result.message
    res = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert res["exit_code"] == 6 and "cap" in res["over_cap"]


# ---------------------------------------------------------------------------------------- disk full


def test_disk_full_at_teardown_does_not_stop_the_delete_or_the_proof(sim, tmp_path):
    # After the steps, every ledger and result write fails with ENOSPC (the files point at /dev/full).
    class DiskFillsAfterSteps(HostWork):
        def run_steps(self) -> None:
            super().run_steps()
            ledger_path.unlink()
            ledger_path.symlink_to("/dev/full")
            for name in ("harness-result.json.tmp", "absence-proof.json.tmp", "manifest.sha256"):
                (self.ev.dir / name).symlink_to("/dev/full")

    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo hi", timeout_s=20)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), host_work=DiskFillsAfterSteps)
        ledger_path = run.tools.ledger.path
        result = execute(run, within_s=30)
    assert run.teardowns[0].verdict == "gone"
    assert not any(i["live"] for i in sim_record(sim, run))
    assert result.exit_code == 1, result.message
    assert "write(s) failed" in result.message and "ledger delete_ack" in result.message
    # every write that failed is named, not the first three: the record may be one of them
    lost = run.ev.write_failures + [f"ledger {f}" for f in run.tools.ledger.write_failures]
    missing = [f for f in lost if f.split(":", 1)[0] not in result.message]
    assert len(lost) > 3 and not missing, (missing, result.message)


def test_a_result_file_says_what_the_process_says_when_an_evidence_write_fails_at_the_end(sim, tmp_path):
    # absence-proof.json fails on a full disk, so the process exits 1 "evidence incomplete": harness-result.json
    # (written just after, fine) and report.html must say the same, not exit 0 "passed".
    class DiskFillsAfterSteps(HostWork):
        def run_steps(self) -> None:
            super().run_steps()
            (self.ev.dir / "absence-proof.json.tmp").symlink_to("/dev/full")

    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo hi", timeout_s=20)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), host_work=DiskFillsAfterSteps)
        result = execute(run, within_s=30)
    assert run.teardowns[0].verdict == "gone"
    assert result.exit_code == 1 and "absence-proof.json" in result.message, result.message
    res = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert (res["exit_code"], res["message"]) == (1, result.message)
    assert [f.split(":")[0] for f in res["evidence_write_failures"]] == ["absence-proof.json"]
    assert "the evidence is incomplete" in (run.ev.dir / "report.html").read_text()
    listed = {line.split("  ", 1)[1] for line in (run.ev.dir / "manifest.sha256").read_text().splitlines()}
    assert {"harness-result.json", "report.html"} <= listed and "absence-proof.json" not in listed


def test_a_result_file_the_disk_never_took_is_not_said_removed(sim, tmp_path):
    # Red team round 5 (an evidence disk made read-only or full during the teardown): harness-result.json was
    # never written, yet the run warned "removed harness-result.json: it said exit 0". A warning names only what
    # happened; the failed write itself is named in the exit message.
    class DiskFillsAfterSteps(HostWork):
        def run_steps(self) -> None:
            super().run_steps()
            (self.ev.dir / "harness-result.json.tmp").mkdir()  # every write of the record fails, as on a ro disk

    class Warnings(Output):
        def warn(self, message: str) -> None:
            warned.append(message)

    warned: list[str] = []
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo hi", timeout_s=20)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Warnings(quiet=True), host_work=DiskFillsAfterSteps)
        result = execute(run, within_s=30)
    assert run.teardowns[0].verdict == "gone"
    assert result.exit_code == 1 and "harness-result.json" in result.message, result.message
    assert not (run.ev.dir / "harness-result.json").exists()
    assert not [w for w in warned if "harness-result.json" in w and "said exit" in w], warned


# --------------------------------------------------------------------------------------- caps, record


def test_time_cap_below_boot_plus_teardown_is_refused_before_renting(sim, tmp_path):
    before = len(sim.state()["instances"])
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=20)], max_minutes=0.003)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=20)
    minimum_s = minimum_cap_s(spec.timings, spec.profile.receipt)
    assert result.exit_code == 2 and "minimum" in result.message and f"{minimum_s / 60:.3g} min" in result.message
    assert len(sim.state()["instances"]) == before and not run.created


def test_a_run_refused_before_any_create_asks_the_api_nothing_after(sim, tmp_path):
    # No PUT was sent, so no instance can carry the run's label: the teardown's label sweep has nothing to look
    # for, and against an API that does not answer it must not spend the client's retries (minutes) on it.
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=20)], max_minutes=0.003)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=20)
        assert result.exit_code == 2
        assert client.stats.total == 0, client.stats


def test_result_record_is_typed_and_versioned(sim, tmp_path):
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="echo '{}' > evidence/r.json", timeout_s=20)])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=30)
    assert result.exit_code == 0, result.message
    raw = json.loads((run.ev.dir / "harness-result.json").read_text())
    record = RunRecord.model_validate(raw)
    assert record.schema_version == RESULT_SCHEMA_VERSION == 2
    assert record.pull is not None and record.pull.complete and record.pull.files == 1
    for field in ("profile", "offer", "driver_qualified", "caps", "worst_case_usd", "accrued_usd", "timings",
                  "steps", "absence", "exit_code", "finished_unix", "instances", "host_key", "bytes"):
        assert field in raw, field
    assert raw["absence"]["verdict"] == "gone"
    assert raw["accrued_usd"] <= raw["caps"]["max_usd"] and raw["over_cap"] is None


def test_evidence_module_does_not_import_the_runner():
    source = (Path(rent_mod.__file__).parents[1] / "evidence" / "run.py").read_text()
    imported = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert "vast_harness.run.runner" not in imported


# ---------------------------------------------------------------------------------------- floods


def execute_on_a_console(sim: SimServer, spec: RunSpec) -> tuple[GuardedRun, Any, io.StringIO]:
    """A run whose console (not quiet: every line goes through rich, as a user's does) writes to a buffer."""
    buf = io.StringIO()
    out = Output(quiet=False)
    out.out = out.err = Console(file=buf, width=140)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), out)
        result = execute(run, within_s=60)
    return run, result, buf


def test_a_step_that_floods_its_output_is_read_whole_and_ends_when_the_host_command_does(sim, tmp_path):
    # The console must not throttle the read: printing every line through rich (~0.4 ms each) would read ~30 KB/s,
    # hold a step that ended on the host to its timeout, and cut the last drain after the exit status, leaving
    # its log silently short.
    spec = make_spec(sim, tmp_path, [Step(name="seq", run="seq 1 300000", timeout_s=60)])
    run, result, buf = execute_on_a_console(sim, spec)
    step = run.steps[0]
    assert result.exit_code == 0 and step.rc == 0, result.message
    assert step.seconds < 15, step  # the host needs well under a second
    assert step.log_bytes == 1988895 and step.log_dropped_bytes == 0, step
    log = (run.ev.dir / "steps" / "seq.log").read_bytes()
    assert log.endswith(b"299999\n300000\n")
    assert "not shown" in buf.getvalue()  # the console says it skipped lines, and where they are
    assert buf.getvalue().count("\n") < 5000


@pytest.mark.slow
def test_a_step_cut_by_the_time_cap_says_the_time_cap_cut_it(sim, tmp_path):
    # The message and the record name the time cap, not "the cap (time/cost)" nor "timed out" against the
    # step's own longer timeout; under a re-price, no "its output is billed bandwidth" when no bytes were billed.
    spec = make_spec(sim, tmp_path, [Step(name="sl", run="sleep 60", timeout_s=120)], max_minutes=0.1)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=40)
    assert result.exit_code == 6 and "the time cap is reached" in result.message, result.message
    assert "the time cap is reached" in run.steps[0].detail and "own timeout is 120 s" in run.steps[0].detail


def test_a_flood_of_long_lines_reaches_the_console_cut_short(sim, tmp_path):
    # A line budget that counts lines is not enough: one 30 MB line wraps to tens of thousands of rows. Each
    # shown line is cut at 1,000 characters; the log keeps the bytes.
    spec = make_spec(sim, tmp_path, [Step(name="long", run="head -c 5000000 /dev/zero | tr '\\0' x; echo; echo TAIL",
                                          timeout_s=60)])
    run, result, buf = execute_on_a_console(sim, spec)
    assert result.exit_code == 0, result.message
    assert len(buf.getvalue()) < 400_000, len(buf.getvalue())
    assert "more characters in the log" in buf.getvalue()
    assert (run.ev.dir / "steps" / "long.log").read_bytes().endswith(b"TAIL\n")


# -------------------------------------------------------------- what comes before the DELETE, at the cap


def _capped(sim: SimServer, tmp_path: Path, run: str, **kw) -> RunSpec:
    return make_spec(sim, tmp_path, [Step(name="s", run=run, timeout_s=60)], max_minutes=0.1, **kw)


def run_capped(sim: SimServer, tmp_path: Path, step: str, *, within_s: float = 30, client_kw: dict | None = None,
               **run_kw: Any) -> tuple[RunSpec, GuardedRun, Any]:
    """A 6 s-capped run (2 s margin) of one step; within caps is asserted from the simulator's record."""
    spec = _capped(sim, tmp_path, step)
    start = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, **(client_kw or {})) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), **run_kw)
        result = execute(run, within_s=within_s)
    assert result.exit_code == 6, result.message
    assert_within_caps(sim, run, spec, start)
    return spec, run, result


@pytest.mark.slow
def test_a_deadman_check_the_cap_cuts_on_a_stalled_link_is_a_cap_stop(sim, tmp_path, proxies, monkeypatch):
    # The link goes silent as the check starts: the check waits to its timeout, the cap's work deadline. That
    # is the cap stopping the run (exit 6), not a switch that cannot act (exit 1, "onstart did not run?").
    real = rent_mod.check_armed

    def on_a_stalled_link(session, **kw):
        for proxy in proxies:
            proxy.stall()
        return real(session, **kw)

    monkeypatch.setattr(rent_mod, "check_armed", on_a_stalled_link)
    _, _, result = run_capped(sim, tmp_path, "true")
    assert "dead-man switch was being checked" in result.message and "onstart did not run" not in result.message


@pytest.mark.slow
def test_the_switch_log_read_on_a_stalled_link_leaves_the_delete_its_half_of_the_margin(sim, tmp_path, proxies,
                                                                                         monkeypatch):
    # After a step the cap cut, the link goes silent as the teardown reads the switch's log: that read (3 s
    # of its own) must end by the meter's prelude deadline, so the DELETE lands before the cap.
    real = teardown_mod.read_log
    timeouts: list[float] = []

    def on_a_stalled_link(session, *, timeout_s):
        timeouts.append(timeout_s)
        for proxy in proxies:
            proxy.stall()
        return real(session, timeout_s=timeout_s)

    monkeypatch.setattr(teardown_mod, "read_log", on_a_stalled_link)
    spec, _, _ = run_capped(sim, tmp_path, "sleep 30")
    assert timeouts and max(timeouts) <= TeardownBudget.PRELUDE_SHARE * spec.teardown_margin_s


def blocked_in_the_pull(block_s: float) -> type[HostWork]:
    """Host work whose in-run evidence pull blocks the main thread, deaf to every deadline: a disk that takes
    seconds per write (an NFS home, a saturated CI machine), or a library call that ignores its timeout."""

    class BlockedInThePull(HostWork):
        def pull_evidence(self, *, in_teardown: bool, max_s: float | None = None) -> None:
            if not in_teardown:
                time.sleep(block_s)
            super().pull_evidence(in_teardown=in_teardown, max_s=max_s)

    return BlockedInThePull


@pytest.mark.slow
def test_a_main_thread_blocked_past_the_cap_does_not_keep_the_instance(sim, tmp_path):
    # Every wait is bounded, but a blocked thread waits on nothing the meter can cut: the cap guard deletes
    # the instance before the cap on its own, and the run ends exit 6 naming it, whenever the thread returns.
    spec, run, result = run_capped(sim, tmp_path, "true", within_s=60, host_work=blocked_in_the_pull(12.0))
    assert "cap guard sent the DELETE for instance" in result.message, result.message
    proof = json.loads(next((tmp_path / "ev").glob("*/absence-proof.json")).read_text())
    assert proof["verdict"] == "gone"
    assert [d["outcome"] for d in proof["instances"][0]["deletes"]][:1] == ["deleted"]  # the guard's, once
    assert "someone else" not in result.message and not run.book.vanished
    assert run.state.timings["cap_guard_fired_s"] <= spec.max_seconds


@pytest.mark.slow
def test_a_price_read_out_while_our_delete_goes_blames_no_one(sim, tmp_path):
    # A price read the API holds may come back empty after the run's own DELETE: a read that returns once a
    # DELETE of ours is on its way says nothing about anyone else, so no "deleted by someone else".
    class HoldThePriceRead(HostWork):
        def upload(self, bundle):
            sim.set_faults("hang:show:9:1")  # the price watch's next read
            return super().upload(bundle)

    spec = _capped(sim, tmp_path, "sleep 30")
    start = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), host_work=HoldThePriceRead)
        result = execute(run, within_s=30)
        time.sleep(max(0.0, start + 12.0 - time.time()))  # the held read comes back, on an open client
    assert result.exit_code == 6, result.message
    assert_within_caps(sim, run, spec, start)
    assert not run.book.vanished, run.book.vanished
    assert "someone else" not in result.message, result.message


@pytest.mark.slow
def test_a_create_whose_ledger_line_takes_past_the_cap_to_write_does_not_keep_the_instance(sim, tmp_path,
                                                                                           monkeypatch):
    # The instance bills from the create's answer, and its "created" line is written after it: a disk that
    # holds that write for 10 s must not hide the instance from the cap and the teardown until then.
    import vast_harness.state.ledger as ledger_mod

    real = ledger_mod.write_line

    def slow_created(path, line, **kw):
        if b'"event":"created"' in line:
            time.sleep(10.0)
        return real(path, line, **kw)

    monkeypatch.setattr(ledger_mod, "write_line", slow_created)
    _, _, result = run_capped(sim, tmp_path, "true", within_s=60)
    assert "cap guard sent the DELETE for instance" in result.message, result.message


@pytest.mark.slow
def test_a_boot_read_that_hangs_at_the_cap_does_not_hold_the_delete_past_it(sim, tmp_path):
    # The boot polls the instance under the client's own bounds (here a 20 s answer, and retries): a read that
    # hangs must not hold the boot to the cap. A poll's read is cut after 2 s (the list row read in its place,
    # red team r10), the next poll finds the instance, and the 6 s-capped run passes inside its caps; before
    # that cut the hang held the boot to the cap's work deadline (exit 6, the DELETE still in time).
    from vast_harness.vast.client import Timeouts

    sim.set_faults("hang:show:20:1")
    spec = _capped(sim, tmp_path, "true")
    # The receipt is off: it needs 2.5 s of the 6 s cap, which a loaded machine's boot can leave it short of
    # (exit 6, rightly): this test is about the boot's read
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"receipt": ReceiptPolicy(enabled=False)})})
    start = time.time()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, timeouts=Timeouts(read_s=30, total_s=20)) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=30)
    assert result.exit_code == 0, result.message
    assert_within_caps(sim, run, spec, start)


@pytest.mark.slow
def test_one_hung_delete_near_the_cap_is_cut_and_retried_in_time(sim, tmp_path):
    # A step that runs to the cap's work deadline, then a first DELETE the API holds for 6 s: cut at half the
    # time left to the cap, the retry lands before it (an uncut one would carry the DELETE past the cap).
    sim.set_faults("hang:destroy:6:1")
    _, run, _ = run_capped(sim, tmp_path, "sleep 30", within_s=40,
                           client_kw=dict(retry_wait_min_s=0.02, retry_wait_max_s=0.2))
    assert len(run.teardowns[0].deletes) == 1 and run.teardowns[0].verdict == "gone"


def test_a_reprice_during_a_slow_evidence_pull_is_seen_and_never_exit_0(sim, tmp_path):
    # The host re-prices 200x while a slow pull runs after the steps. A price read only during the steps would
    # pass (exit 0) while billing many times the dollar cap: the price watch covers the upload and the pull,
    # and a cancel abandons either.
    sim.set_faults("slow_sftp:100000;reprice_silent:200:1.5")
    steps = [Step(name="ev", run="head -c 2000000 /dev/urandom > evidence/e.bin", timeout_s=20)]
    spec = make_spec(sim, tmp_path, steps, max_minutes=0.5, poll_s=0.25)
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": 0.01})})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=40)
    assert result.exit_code == 6, result.message
    assert run.meter.price_changes, "the re-price was never read"
    assert run.pull is not None and not run.pull.complete
    res = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert res["exit_code"] == 6


@pytest.mark.slow
def test_a_list_that_hangs_holds_neither_the_absence_proof_nor_the_sweep_past_their_budgets(sim, tmp_path):
    # With every v1 list hanging 100 s, each proof round's two lists (and the final label sweep, with retries)
    # are held to the teardown's budget, not the client's own bounds, which would run far past the cap.
    sim.set_faults("hang:list:100:*")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="true", timeout_s=20)], max_minutes=1.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        run.state.teardown_budget_s = 3.0
        started = time.monotonic()
        result = execute(run, within_s=60)
        took_s = time.monotonic() - started
    assert result.exit_code == 3, result.message  # the lists never answered: absence is not proven
    assert took_s < 15, f"the run took {took_s:.1f} s with a 3 s teardown budget"
    assert not any(i["live"] for i in sim_record(sim, run))  # the DELETE itself went out and landed


@pytest.mark.slow
def test_delete_retries_near_the_cap_are_not_spaced_past_it(sim, tmp_path):
    # Five failed DELETEs with the backoff grown toward 20 s would carry the instance past the cap. Before the
    # cap each wait is at most a quarter of the time left.
    sim.set_faults("delete_fail:5:503")
    _, run, _ = run_capped(sim, tmp_path, "sleep 30", within_s=60)  # production backoff: 1 s .. 20 s
    assert run.teardowns[0].verdict == "gone"


@pytest.mark.slow
def test_a_reprice_while_the_api_holds_our_delete_is_billed_and_never_exit_0(sim, tmp_path):
    # The host re-prices 5000x while the API holds our DELETE: the price is re-read while a DELETE is in
    # flight, so the bill is seen and the run never passes (exit 0) far over its cap.
    sim.set_faults("hang:destroy:3:1;reprice_silent:5000:2")
    spec = make_spec(sim, tmp_path, [Step(name="ok", run="sleep 1", timeout_s=20)], max_minutes=1.0, poll_s=0.25)
    spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_usd": 0.05})})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = execute(run, within_s=40)
    billed = sum(i["billed_usd"] for i in sim_record(sim, run))
    assert billed > spec.caps.max_usd  # the scenario: the host did bill over the cap
    assert result.exit_code == 6, result.message
    assert run.meter.price_changes
