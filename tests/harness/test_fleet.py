"""The fleet against the simulator over real HTTP and SSH: three GPU types end to end, the preflight refusal,
SIGINT with every run live, the total cap reached while running, and `GuardedRun.cancel` mid-step.

Every verdict is the simulator's own record (`/_sim/state`), not the harness's word.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli, spawn
from vast_harness.console.output import Output
from vast_harness.errors import PRECEDENCE, worst
from vast_harness.fleet.plan import parse_gpus
from vast_harness.fleet.run import run_fleet
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.state.ledger import Ledger
from vast_harness.state.registry import LabelInfo, parse_label
from vast_harness.vast.client import VastClient
from vast_harness.vast.pacing import endpoint_key

SCALE = 0.1
KEY = "sim-fleet-key"
GPUS = ["RTX 5090", "RTX 4090", "H100 SXM"]
NONE = LabelInfo(run_id="")  # what a label that is not the harness's parses to, for the filters below

pytestmark = pytest.mark.slow


SIM_OPTIONS = dict(seed=0, rate_scale=SCALE, boot_seconds=0.5, num_offers=1000)  # conftest.sim


def live(sim: SimServer) -> list[dict]:
    return [i for i in sim.state()["instances"] if i["live"]]


def base_spec(sim: SimServer, tmp_path: Path, **kw):
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.2,
                              poll_s=0.2, **kw), environ={})
    return spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)})


def test_worst_exit_precedence():
    assert worst([0, 4, 6, 3, 130]) == 3  # 3 beats everything
    assert worst([0, 130, 1]) == 130
    assert worst([0, 1, 6, 5]) == 1
    assert worst([0, 4]) == 4
    assert worst([]) == 0
    assert PRECEDENCE[0] == 3
    assert parse_gpus(" RTX 4090, H100 SXM,RTX 4090,") == ["RTX 4090", "H100 SXM"]


class OverlapRecorder(httpx.HTTPTransport):
    """The client's real transport (no keep-alive, as the client's own), counting per endpoint (the pacing's key:
    method and path) the requests in flight from send until their body is read and closed."""

    def __init__(self) -> None:
        super().__init__(limits=httpx.Limits(max_keepalive_connections=0))
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.requests = 0

    def _done(self, key: str) -> None:
        with self.lock:
            self.in_flight[key] -= 1

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = endpoint_key(request.method, request.url.path)
        with self.lock:
            self.requests += 1
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.in_flight[key])
        try:
            resp = super().handle_request(request)
        except BaseException:
            self._done(key)
            raise
        inner, done = resp.stream, self._done

        class Closing(httpx.SyncByteStream):
            def __iter__(self):
                yield from inner  # type: ignore[union-attr]

            def close(self) -> None:
                try:
                    inner.close()  # type: ignore[union-attr]
                finally:
                    done(key)

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Closing(), extensions=resp.extensions)


def test_three_gpu_types_end_to_end_with_reports(sim, tmp_path):
    spec = base_spec(sim, tmp_path)
    out = Output(json_mode=True, quiet=True)
    wire = OverlapRecorder()
    # A slow search and user read (slower than their intervals): the three runs plan at once, so without the
    # per-endpoint serialisation their requests would overlap (and arrive closer than Vast's intervals).
    sim.set_faults("hang:search:0.4:*;hang:user:0.4:*")
    try:
        with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, transport=wire) as client:
            code = run_fleet(spec, GPUS, client, load_driver_policy(), out, total_usd=2.0, per_run_usd=0.6,
                             parallel=3)
    finally:
        sim.set_faults(None)
    assert code == 0
    # three runs on one client, and never two requests to one Vast endpoint in flight at once
    assert wire.requests > 30 and set(wire.peak.values()) == {1}, wire.peak
    assert not live(sim)
    fleet_dir = next((tmp_path / "ev").glob("fleet-*"))
    result = json.loads((fleet_dir / "fleet-result.json").read_text())
    rows = result["rows"]
    assert sorted(r["gpu"] for r in rows) == sorted(GPUS)
    costs = [r["usd_per_mtok"] for r in rows]
    assert all(c > 0 for c in costs)
    measured = [r["tflops_per_usd_h"] for r in rows]  # ranked by what each host's receipt delivered per $/h
    assert all(m > 0 for m in measured) and measured == sorted(measured, reverse=True)
    for r in rows:
        assert r["exit_code"] == 0 and r["absence"] == "gone" and r["replay_match"] is True
        assert r["usd_per_mtok"] == pytest.approx(r["dph_usd"] / (r["tokens_per_s"] * 3600 / 1e6))
        assert r["tflops_per_usd_h"] == pytest.approx(r["receipt_tflops"] / r["dph_usd"], rel=1e-3)
        run_dir = Path(r["evidence_dir"])
        assert run_dir.parent == fleet_dir and (run_dir / "report.html").is_file()
        run_html = (run_dir / "report.html").read_text()  # one measurement: its table, and no one-bar chart
        assert 'class="mfu"' in run_html and "MFU per measurement" not in run_html
    # the runs' MFU is against a nominal peak per GPU type, so it differs by type
    assert len({round(r["mfu"], 6) for r in rows}) == 3
    # reap reads the user's ledger (the state dir's): every fleet run's create and absence lines are there,
    # each stamped with the API and the account like a single run's
    entries = Ledger(spec.state_dir / "ledger.jsonl").entries()
    assert {e.run_id for e in entries} == {r["run_id"] for r in rows}
    assert entries and all(e.api_url == spec.api_url and e.account for e in entries)
    assert len({e.account for e in entries}) == 1
    assert Ledger(spec.state_dir / "ledger.jsonl").unproven() == ({}, set())
    events = [json.loads(line)["event"] for line in (fleet_dir / "fleet.jsonl").read_text().splitlines()]
    assert events[0] == "fleet-start" and events[-1] == "fleet-end" and events.count("run-end") == 3
    html = (fleet_dir / "fleet-report.html").read_text()
    assert "data:image/svg+xml;base64," in html and all(g in html for g in GPUS)
    # a simulated fleet says so at the top, and its CPU round's MFU figures are greyed out
    assert "(SIMULATED)</h1>" in html and html.count('<td class="sim num">') >= 4 * 3
    # the simulator billed each instance no more than its run's cap, and the fleet no more than its total
    ids = {r["run_id"] for r in rows}
    billed = [i["billed_usd"] for i in sim.state()["instances"] if (parse_label(i["label"]) or NONE).run_id in ids]
    assert len(billed) == 3 and sum(billed) <= 2.0


def test_summed_worst_cases_over_the_total_cap_refuse_before_renting(sim, tmp_path):
    before = len(sim.state()["instances"])
    p = cli("fleet", "--profile", "smoke", "--gpus", ",".join(GPUS), "--max-usd", "0.1", "--per-run-usd", "0.5",
            "--json", "--api-url", sim.url, "--pacing-scale", str(SCALE), "--evidence-dir", str(tmp_path), key=KEY)
    assert p.returncode == 5, p.stderr
    doc = json.loads(p.stdout)
    assert "exceed the total cap" in doc["error"] and len(doc["preflight"]["rows"]) == 3
    assert doc["preflight"]["worst_case_sum_usd"] > 0.1
    assert len(sim.state()["instances"]) == before  # nothing rented
    assert "GPU" in p.stderr and "worst case" in p.stderr  # the table


def test_sigint_with_every_run_live_tears_all_down(sim, tmp_path):
    before = {i["id"] for i in sim.state()["instances"]}
    proc = spawn("fleet", "--profile", "smoke", "--gpus", ",".join(GPUS), "--max-usd", "2", "--parallel", "3",
                 "--api-url", sim.url, "--pacing-scale", str(SCALE), "--poll-interval", "0.2", "--proof-interval",
                 "0.2", "--evidence-dir", str(tmp_path), key=KEY)
    deadline = time.monotonic() + 90
    mine: list[dict] = []
    while time.monotonic() < deadline:
        mine = [i for i in live(sim) if i["id"] not in before and i["actual_status"] == "running"]
        if len(mine) == 3:
            break
        time.sleep(0.1)
    assert len(mine) == 3, "three runs were never live at once"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # a second Ctrl-C must not skip any teardown
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "teardown is in progress" in stderr
    state = {i["id"]: i for i in sim.state()["instances"]}
    assert all(not state[i["id"]]["live"] for i in mine)
    assert not [i for i in live(sim) if i["id"] not in before]
    fleet_dir = next(tmp_path.glob("fleet-*"))
    result = json.loads((fleet_dir / "fleet-result.json").read_text())
    assert {r["exit_code"] for r in result["rows"]} == {130}
    assert {r["absence"] for r in result["rows"]} == {"gone"}
    for r in result["rows"]:
        proof = json.loads((Path(r["evidence_dir"]) / "absence-proof.json").read_text())
        assert proof["verdict"] == "gone"
    # and reap, reading the same ledger, finds nothing left to do
    p = cli("reap", "--api-url", sim.url, "--evidence-dir", str(tmp_path), "--pacing-scale", str(SCALE),
            "--proof-interval", "0.2", "--json", key=KEY)
    assert p.returncode == 0 and json.loads(p.stdout)["unproven"] == []


def test_total_cap_reached_while_running_cancels_every_run(sim, tmp_path):
    spec = base_spec(sim, tmp_path)
    # Steps that outlast the cap: the total must be reached while the runs are still working.
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(
        update={"steps": [Step(name="long", run="sleep 60", timeout_s=120)]})})
    gpus = ["RTX 4090", "RTX 5090"]
    out = Output(json_mode=True, quiet=True)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        # Each run alone fits its own cap, together they cannot: only the live monitor holds the total.
        code = run_fleet(spec, gpus, client, load_driver_policy(), out, total_usd=0.0045, per_run_usd=0.5,
                         parallel=2, allow_overcommit=True)
    assert code == 6
    fleet_dir = next((tmp_path / "ev").glob("fleet-*"))
    result = json.loads((fleet_dir / "fleet-result.json").read_text())
    assert "fleet total cap" in result["stop_reason"] and result["cap_events"]
    assert {r["exit_code"] for r in result["rows"]} == {6}
    ids = {r["run_id"] for r in result["rows"]}
    mine = [i for i in sim.state()["instances"] if (parse_label(i["label"]) or NONE).run_id in ids]
    assert len(mine) == 2 and not [i for i in mine if i["live"]]
    assert sum(i["billed_usd"] for i in mine) <= 0.0045  # the simulator's bill, not the harness's estimate
    assert any(json.loads(line)["event"] == "cancel" for line in (fleet_dir / "fleet.jsonl").read_text().splitlines())


def test_cancel_stops_a_running_step_and_tears_down(sim, tmp_path):
    spec = base_spec(sim, tmp_path)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(
        update={"steps": [Step(name="long", run="sleep 60", timeout_s=120)]})})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(result=run.execute()))
        t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (run.ev.dir / "steps" / "long.log").exists():
            time.sleep(0.05)
        started = time.monotonic()
        run.cancel("test cancel", exit_code=6)
        t.join(timeout=60)
    assert box["result"].exit_code == 6 and "test cancel" in box["result"].message
    assert time.monotonic() - started < 15  # not the step's 60 s
    assert run.steps[0].timed_out and "stopped" in run.steps[0].detail
    assert not [i for i in live(sim) if i["id"] == run.created[0].instance_id]
    assert json.loads((run.ev.dir / "harness-result.json").read_text())["absence"]["verdict"] == "gone"


def test_kill9_of_the_fleet_mid_parallel_creates_then_reap_leaves_nothing_live(sim, tmp_path):
    """kill -9 while three creates are held by the server (they land after the fleet is dead): `reap`, reading
    the shared ledger, finds every one by its label and proves it gone."""
    before = {i["id"] for i in sim.state()["instances"]}
    sim.set_faults("create_hold:1.5:3")
    try:
        proc = spawn("fleet", "--profile", "smoke", "--gpus", ",".join(GPUS), "--max-usd", "2", "--parallel", "3",
                     "--api-url", sim.url, "--pacing-scale", str(SCALE), "--poll-interval", "0.2", "--proof-interval",
                     "0.2", "--evidence-dir", str(tmp_path), key=KEY, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
        ledger = tmp_path / "vh-state" / "ledger.jsonl"  # the state dir (tests/conftest.py)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # every run has written its intent: three PUTs are in flight
            if ledger.exists() and ledger.read_text().count('"intent"') >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert ledger.read_text().count('"intent"') >= 3, "the creates never started"
        time.sleep(2.5)  # the held creates land after the fleet is dead
        landed = [i for i in live(sim) if i["id"] not in before]
        assert landed, "the kill came after the creates were answered: nothing tested"
    finally:
        sim.set_faults(None)
    p = cli("reap", "--api-url", sim.url, "--evidence-dir", str(tmp_path), "--pacing-scale", str(SCALE),
            "--proof-interval", "0.2", "--json", key=KEY)
    # 0, or 3 only for a create whose outcome is still unknown with no instance carrying its label (not seen is
    # not gone: reap says so rather than "all absent")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 or (p.returncode == 3 and doc["unproven"] == []
                                 and all("unknown outcome" in line for line in doc["not_proven"])), doc
    assert not [i for i in live(sim) if i["id"] not in before]


HOSTILE_SCRIPT = """
import json
base = {"schema": "vast-harness/mfu/1", "device": "cuda", "world_size": 1, "micro_batch": 8}
open("evidence/mfu-str.json", "w").write(json.dumps(base | {"mfu": "abc", "tokens_per_s": "x"}))
open("evidence/mfu-big.json", "w").write(json.dumps(base)[:-1] + ', "mfu": 1' + "0" * 400 + "}")
open("evidence/mfu-inf.json", "w").write(json.dumps(base | {"mfu": float("inf"), "tokens_per_s": float("inf")}))
open("evidence/mfu-deep.json", "w").write("[" * 100000 + "]" * 100000)
"""


def test_a_host_writing_hostile_json_never_crashes_the_fleet(sim, tmp_path):
    """"mfu": "abc", 10**400, Infinity and a 100,000-deep file once ended the fleet in a traceback, exit 1 and no
    fleet-report.html (after its instances were proven gone); they are now invalid figures in the report."""
    import shlex

    spec = base_spec(sim, tmp_path)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"steps": [
        Step(name="hostile", run=f"python3 -c {shlex.quote(HOSTILE_SCRIPT)}", timeout_s=60)]})})
    out = Output(json_mode=True, quiet=True)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = run_fleet(spec, GPUS[:2], client, load_driver_policy(), out, total_usd=2.0, per_run_usd=0.6,
                         parallel=2)
    assert code == 0
    assert not live(sim)
    fleet_dir = next((tmp_path / "ev").glob("fleet-*"))
    text = (fleet_dir / "fleet-result.json").read_text()
    assert "Infinity" not in text
    rows = json.loads(text)["rows"]
    assert [r["usd_per_mtok"] for r in rows] == [None, None]
    html = (fleet_dir / "fleet-report.html").read_text()
    assert "not finite" in html and "nested too deeply" in html and "not a number" in html


FIXED_FLEET_ID = "fleet-20260101T000000Z-0ff11e"


def _fleet_rows_and_instances(sim: SimServer, fleet_dir: Path) -> tuple[dict, list[dict]]:
    result = json.loads((fleet_dir / "fleet-result.json").read_text())
    ids = {r["run_id"] for r in result["rows"]}
    mine = [i for i in sim.state()["instances"] if (parse_label(i["label"]) or NONE).run_id in ids]
    return result, mine


def test_a_fleet_ledger_that_cannot_be_written_fails_a_passing_fleet_and_tears_everything_down(
        sim, tmp_path, monkeypatch, capsys):
    """fleet.jsonl is a directory, so every fleet-ledger write is refused. Its append once raised out of the
    fleet (a traceback, no fleet-result.json); now the runs go on, every instance is proven gone in the
    simulator's own record, and a fleet whose runs all passed exits 1 naming the incomplete fleet ledger."""
    spec = base_spec(sim, tmp_path)
    monkeypatch.setattr("vast_harness.fleet.run.new_fleet_id", lambda: FIXED_FLEET_ID)
    fleet_dir = tmp_path / "ev" / FIXED_FLEET_ID
    (fleet_dir / "fleet.jsonl").mkdir(parents=True)
    out = Output(json_mode=True, quiet=True)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = run_fleet(spec, GPUS[:2], client, load_driver_policy(), out, total_usd=2.0, per_run_usd=0.6,
                         parallel=2)
    assert code == 1
    result, mine = _fleet_rows_and_instances(sim, fleet_dir)
    assert [r["exit_code"] for r in result["rows"]] == [0, 0]  # the runs themselves passed
    assert len(mine) == 2 and not [i for i in mine if i["live"]]
    assert {r["absence"] for r in result["rows"]} == {"gone"}
    assert result["exit_code"] == 1
    assert "fleet ledger" in result["message"] and "fleet.jsonl" in result["message"]
    assert "incomplete" in result["message"]
    # every event the fleet could not write is named: start, two run starts and ends, end
    failures = result["fleet_ledger_write_failures"]
    assert sorted(f.split(":")[0] for f in failures) == sorted(["fleet-start", "run-start", "run-start", "run-end",
                                                                 "run-end", "fleet-end"])
    assert all("cannot open the fleet ledger" in f and "Is a directory" in f for f in failures)
    err = capsys.readouterr().err
    assert "the fleet goes on" in err  # said when the first line failed, not only at the end
    assert "error:" in err and "is incomplete" in err


def test_a_full_disk_under_the_fleet_ledger_still_cancels_every_run_at_the_total_cap(sim, tmp_path, monkeypatch):
    """The disk fills once the fleet and its two runs have started: every later write of fleet.jsonl fails with
    ENOSPC, the cancel's first. That append once raised out of the monitor before the cancel reached any run (the
    runs went on past the total cap, then the fleet ended in a traceback); now every run is cancelled at the cap,
    proven gone in the simulator's record, and the failed writes are named."""
    import errno

    real_open, real_write, real_close = os.open, os.write, os.close
    fleet_fds: set[int] = set()
    written: list[int] = []

    def fake_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if str(path).endswith("fleet.jsonl"):
            fleet_fds.add(fd)
        return fd

    def fake_write(fd, data):
        if fd in fleet_fds:
            if len(written) >= 3:  # fleet-start and the two run-starts reached the disk; then it is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written.append(fd)
        return real_write(fd, data)

    def fake_close(fd):
        fleet_fds.discard(fd)
        return real_close(fd)

    spec = base_spec(sim, tmp_path)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(
        update={"steps": [Step(name="long", run="sleep 60", timeout_s=120)]})})
    out = Output(json_mode=True, quiet=True)
    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "write", fake_write)
    monkeypatch.setattr(os, "close", fake_close)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = run_fleet(spec, ["RTX 4090", "RTX 5090"], client, load_driver_policy(), out, total_usd=0.0045,
                         per_run_usd=0.5, parallel=2, allow_overcommit=True)
    monkeypatch.undo()
    assert code == 6
    fleet_dir = next((tmp_path / "ev").glob("fleet-*"))
    result, mine = _fleet_rows_and_instances(sim, fleet_dir)
    assert "fleet total cap" in result["stop_reason"]
    assert {r["exit_code"] for r in result["rows"]} == {6}
    assert len(mine) == 2 and not [i for i in mine if i["live"]]
    assert sum(i["billed_usd"] for i in mine) <= 0.0045
    lines = (fleet_dir / "fleet.jsonl").read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["fleet-start", "run-start", "run-start"]
    failures = result["fleet_ledger_write_failures"]
    assert any(f.startswith("cancel:") for f in failures) and all("No space left" in f for f in failures)
    assert "fleet ledger" in result["message"]


@pytest.mark.parametrize("refused", [("fleet-result.json", "fleet-report.html"), ("fleet-report.html",)])
def test_a_fleet_result_that_cannot_be_written_is_said_and_never_a_traceback(sim, tmp_path, monkeypatch, capsys,
                                                                             refused):
    """A full disk (ENOSPC) when fleet-result.json or the report is written is said, never a traceback or a
    0-byte result: the fleet's own verdict is kept (a pass becomes 1: its evidence is incomplete), every
    instance is still gone, no half-written file is left."""
    import errno

    spec = base_spec(sim, tmp_path)
    monkeypatch.setattr("vast_harness.fleet.run.new_fleet_id", lambda: FIXED_FLEET_ID)
    real_write_text = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(refused):
            real_write_text(self, "partial")  # the first bytes land, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = Output(json_mode=True, quiet=True)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = run_fleet(spec, GPUS[:2], client, load_driver_policy(), out, total_usd=2.0, per_run_usd=0.6,
                         parallel=2)
    assert code == 1
    assert not live(sim)
    fleet_dir = tmp_path / "ev" / FIXED_FLEET_ID
    assert not list(fleet_dir.glob("*.tmp")) and not (fleet_dir / "fleet-report.html").exists()
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())  # the console wraps long lines
    assert "could not be written" in err and "No space left on device" in err and "Traceback" not in err
    summary = json.loads(captured.out)
    assert summary["exit_code"] == 1 and summary["report"] is None
    result = fleet_dir / "fleet-result.json"
    if "fleet-result.json" in refused:
        assert not result.exists() and "result and report could not be written" in summary["message"]
    else:  # the result says what the process says: exit 1 and "not written", never exit 0
        on_disk = json.loads(result.read_text())
        assert on_disk["exit_code"] == 1 and on_disk["message"] == summary["message"]
        assert "the fleet's report could not be written" in on_disk["message"]


def test_an_interruptible_fleet_replaces_an_outbid_run_host_within_its_total(sim, tmp_path):
    # `fleet --interruptible`: every run bids; one host is outbid while it works, and its run deletes the husk,
    # proves it gone and replays its profile on another host. The simulator's bill stays under the summed
    # worst cases (each covering its run's --max-interruptions) and the fleet's total.
    spec = base_spec(sim, tmp_path, interruptible=True, max_interruptions=1)
    out = Output(json_mode=True, quiet=True)
    sim.set_faults("outbid:0.3")
    try:
        with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
            code = run_fleet(spec, GPUS[:2], client, load_driver_policy(), out, total_usd=2.0, per_run_usd=0.6,
                             parallel=2)
    finally:
        sim.set_faults(None)
    assert code == 0
    fleet_dir = next((tmp_path / "ev").glob("fleet-*"))
    result, mine = _fleet_rows_and_instances(sim, fleet_dir)
    assert not [i for i in mine if i["live"]]
    assert all(i["is_bid"] for i in mine) and sum(i["outbids"] for i in mine) == 1
    assert len(mine) == 3  # two runs, one of them on a replacement
    records = [json.loads(p.read_text()) for p in fleet_dir.rglob("harness-result.json")]
    hosts = sorted(len(r["attempts"]) for r in records)
    assert hosts == [1, 2], hosts
    worst = sum(r["worst_case_usd"] for r in records)  # each run's dry-run worst case, k interruptions included
    assert sum(i["billed_usd"] for i in mine) <= min(result["total_cap_usd"], worst)
