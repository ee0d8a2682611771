"""One account, many runs, one clock (issue 20): the state dir, run registrations and labels, reap's orphans-only
rule, `status`, the server's clock, and the account chaos scenarios, against the simulator over real HTTP/SSH."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli, spawn
from tests.harness.test_runner import KEY, SCALE, make_spec
from vast_harness import chaos
from vast_harness.actions.reap import reap_all
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.state.dirs import legacy_ledgers, state_dir
from vast_harness.state.ledger import NOTHING_CREATED, Ledger
from vast_harness.state.registry import Registration, RunRegistry, make_label, parse_label, probe
from vast_harness.vast.client import VastClient
from vast_harness.vast.server_clock import ServerClock, parse_http_date
from vast_harness.views.orphans import judge
from vast_harness.views.status import collect

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=20, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as server:
        yield server


@pytest.fixture(autouse=True)
def _clear(sim):
    sim.set_faults(None)
    yield
    sim.set_faults(None)


# ------------------------------------------------------------------------------------------ pieces
def test_the_state_dir_follows_the_user_not_the_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME")  # the session's: platformdirs reads the process's own
    assert state_dir({"VAST_HARNESS_HOME": str(tmp_path / "h")}) == tmp_path / "h"
    assert state_dir({"XDG_STATE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "vast-harness"
    assert state_dir({"XDG_STATE_HOME": "relative"}) == Path.home() / ".local/state/vast-harness"  # XDG: ignored
    spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path / "s"), environ={})
    assert spec.evidence_dir == spec.state_dir == tmp_path / "s"  # evidence defaults to the state dir
    old = tmp_path / "cwd" / ".evidence" / "vast"
    old.mkdir(parents=True)
    (old / "ledger.jsonl").write_text("")
    assert legacy_ledgers(tmp_path / "s", evidence_dir=None, cwd=tmp_path / "cwd") == [old / "ledger.jsonl"]


def test_the_state_dir_is_the_native_place_on_macos_below_the_same_variables(tmp_path, monkeypatch):
    import platformdirs
    from platformdirs.macos import MacOS

    monkeypatch.setattr(platformdirs, "PlatformDirs", MacOS)  # what platformdirs picks on macOS
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert state_dir({}) == tmp_path / "Library" / "Application Support" / "vast-harness"
    assert state_dir({"XDG_STATE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "vast-harness"
    assert state_dir({"XDG_STATE_HOME": str(tmp_path / "x"), "VAST_HARNESS_HOME": str(tmp_path / "h")}) == tmp_path / "h"


def test_labels_carry_the_cap_deadline_and_old_labels_stay_unambiguous():
    label = make_label("20261201T094438Z-abc123", 2, 1_796_119_121.4)
    assert len(label) <= 60 and label.startswith("vh-20261201T094438Z-abc123-r2-d")
    info = parse_label(label)
    assert info.run_id == "20261201T094438Z-abc123" and info.deadline_unix == 1_796_119_122
    old = parse_label("vh-20261201T094438Z-d3a4b5")  # an old label whose random part starts with "d"
    assert old.run_id == "20261201T094438Z-d3a4b5" and old.deadline_unix is None
    assert parse_label("vh-20261201T094438Z-abc123-r1").deadline_unix is None
    assert parse_label("other") is None


def test_the_server_clock_comes_from_date_headers_and_moves_on_the_monotonic_clock():
    mono = [100.0]
    clock = ServerClock(mono=lambda: mono[0])
    assert clock.now() is None
    clock.observe("Tue, 01 Dec 2026 10:00:00 GMT")
    t = parse_http_date("Tue, 01 Dec 2026 10:00:00 GMT")
    mono[0] += 7.5
    assert clock.now() == pytest.approx(t + 7.5)
    assert clock.to_server(mono[0] + 60) == pytest.approx(t + 67.5)
    clock.observe("not a date")  # ignored, never a crash
    assert clock.now() == pytest.approx(t + 7.5)


def test_the_simulator_sends_date_and_the_client_reads_it(sim):
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        client.list_instances()
        assert abs(client.server_clock.now() - time.time()) < 2.0


def test_a_registration_is_live_while_held_and_dead_once_its_process_dies(tmp_path):
    reg = RunRegistry(tmp_path)
    held = reg.register(Registration(run_id="r1", pid=os.getpid(), host="h", started_unix=0, api_url="u",
                                     profile="smoke", max_usd=1, max_minutes=1, deadline_unix=0))
    assert probe(held.path) is True and reg.scan()["r1"].liveness in ("live", "elsewhere")
    held.release()
    assert "r1" not in reg.scan()
    # another process registers and is SIGKILLed: the kernel drops its lock, so it reads as dead
    code = ("import sys,time; from pathlib import Path; from vast_harness.state.registry import *; "
            "r = RunRegistry(Path(sys.argv[1])).register(Registration(run_id='r2', pid=0, host=this_host(), "
            "started_unix=0, api_url='u', profile='smoke', max_usd=1, max_minutes=1, deadline_unix=0)); "
            "print('up', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    assert reg.scan()["r2"].liveness == "live"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    assert reg.scan()["r2"].liveness == "dead"


def test_any_outcome_line_resolves_an_intent_and_a_later_unknown_reopens_it(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("r", "intent", "vh-a", offer_id=1)
    ledger.append("r", "create_failed", "vh-a", offer_id=1, verdict=NOTHING_CREATED,
                  detail="410 no_such_ask")  # refused: nothing rented (what lifecycle.create writes)
    ledger.append("r", "intent", "vh-b", offer_id=2)
    ledger.append("r", "create_failed", "vh-b", offer_id=2, detail="503")
    ledger.append("r", "create_unresolved", "vh-b", offer_id=2)  # ... and then no read settled it
    assert set(ledger.view().unresolved) == {"vh-b"}


def test_concurrent_writers_leave_every_line_whole(tmp_path):
    path = tmp_path / "ledger.jsonl"
    code = ("import sys; from pathlib import Path; from vast_harness.state.ledger import Ledger; l = Ledger(Path(sys.argv[1]));"
            " [l.append(sys.argv[2], 'intent', 'vh-' + 'x' * 3000, offer_id=i) for i in range(150)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), f"w{n}"], cwd=ROOT) for n in range(4)]
    assert [p.wait() for p in procs] == [0, 0, 0, 0]
    ledger = Ledger(path)
    assert len(ledger.entries()) == 600 and not ledger.bad_lines


def test_judge_orphans_and_live_runs(tmp_path):
    reg = RunRegistry(tmp_path)
    held = reg.register(Registration(run_id="live-run", pid=os.getpid(), host=__import__("socket").gethostname(),
                                     started_unix=0, api_url="u", profile="smoke", max_usd=1, max_minutes=1,
                                     deadline_unix=0))
    runs = reg.scan()
    now = 1_800_000_000.0
    ahead, past = make_label("other", 0, now + 600), make_label("other", 0, now - 3600)
    assert judge(None, ahead, None, runs=runs, known_runs=set(), server_now=now)[0] == "live"
    assert judge(None, past, None, runs=runs, known_runs=set(), server_now=now)[0] == "orphan"
    assert judge(None, ahead, None, runs=runs, known_runs=set(), server_now=None)[0] == "live"  # no Date: unsure
    # just past its deadline, inside the teardown grace: live, and said so (not "-175 s ahead")
    verdict, why = judge(None, make_label("other", 0, now - 175), None, runs=runs, known_runs=set(), server_now=now)
    assert verdict == "live" and re.search(r"passed 17[45] s ago, within the 200 s teardown grace", why), why
    assert judge("live-run", make_label("live-run", 0, now + 600), None, runs=runs, known_runs={"live-run"},
                 server_now=now)[0] == "live"
    assert judge("ended", "vh-ended", None, runs=runs, known_runs={"ended"}, server_now=now)[0] == "orphan"
    held.release()


def test_judge_names_the_pid_it_has_or_says_why_none(tmp_path):
    """A registration that cannot be read has no pid: the reason says so (or takes the ledger's), never 'pid ?'."""
    from vast_harness.state.process import ProcessId
    from vast_harness.state.registry import LiveRun

    label = make_label("r1", 0, 1_800_000_600.0)
    for liveness in ("live", "dead"):
        runs = {"r1": LiveRun(reg=None, run_id="r1", liveness=liveness, path=tmp_path / "r1.json")}
        why = judge("r1", label, None, runs=runs, known_runs=set(), server_now=1_800_000_000.0)[1]
        assert "pid unknown: its registration file is unreadable" in why and "?" not in why, why
        gone = ProcessId(pid=999_999_999, host="elsewhere")
        why = judge("r1", label, None, runs=runs, known_runs=set(), server_now=1_800_000_000.0,
                    processes={"r1": gone})[1]
        assert "pid 999999999, from its ledger" in why, why


# ------------------------------------------------------------------------------------------ runs and reaps
def _in_thread(run: GuardedRun) -> tuple[threading.Thread, dict]:
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("result", run.execute()), daemon=True)
    t.start()
    return t, box


def _wait_seen(run: GuardedRun, limit_s: float = 30) -> None:
    end = time.monotonic() + limit_s
    while not (run.created and run.created[-1].seen) and time.monotonic() < end:
        time.sleep(0.05)
    assert run.created and run.created[-1].seen, "the run never reached its host"


@pytest.mark.slow
def test_a_reap_from_another_state_dir_lists_a_live_run_and_status_shows_it(sim, tmp_path, monkeypatch):
    spec = make_spec(sim, tmp_path / "a", [Step(name="long", run="sleep 5", timeout_s=30)])
    spec = spec.model_copy(update={"state_dir": tmp_path / "state-a", "evidence_dir": tmp_path / "state-a"})
    run = GuardedRun(spec, VastClient(KEY, base_url=sim.url, pacing_scale=SCALE), load_driver_policy(),
                     Output(quiet=True))
    thread, box = _in_thread(run)
    _wait_seen(run)
    time.sleep(1.5)  # the server's Date has one-second resolution: let some dollars accrue on its clock
    # status from the run's own state dir: the live instance, its accrued dollars, this machine
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        rows, problems = collect(spec, client)
    mine = [r for r in rows if r.instance_id == run.created[-1].instance_id]
    assert not problems and len(mine) == 1
    assert mine[0].state == "running" and mine[0].owner == "this machine" and mine[0].accrued_usd > 0
    assert mine[0].deadline_unix and mine[0].profile == "smoke"
    # a reap with another state dir (a second machine as far as it can tell): the label's deadline is ahead
    other = spec.model_copy(update={"state_dir": tmp_path / "state-b", "evidence_dir": tmp_path / "state-b"})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(other, client, Output(quiet=True)) == 0
    # and one from the run's own state dir: its registration is held
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        out = Output(json_mode=True, quiet=True)
        assert reap_all(spec, client, out) == 0
    thread.join(60)
    assert box["result"].exit_code == 0, box["result"].message
    doc = json.loads(next((tmp_path / "state-a").glob("reap-*/absence-proof.json")).read_text())
    assert [li["instance_id"] for li in doc["live"]] == [run.created[-1].instance_id] and not doc["instances"]


def test_a_run_whose_instance_is_deleted_under_it_says_so(sim, tmp_path):
    spec = make_spec(sim, tmp_path, [Step(name="long", run="sleep 4", timeout_s=30)])
    run = GuardedRun(spec, VastClient(KEY, base_url=sim.url, pacing_scale=SCALE), load_driver_policy(),
                     Output(quiet=True))
    thread, box = _in_thread(run)
    _wait_seen(run)
    end = time.monotonic() + 30
    while run.state.work is None and time.monotonic() < end:  # SSH is up: the step starts
        time.sleep(0.05)
    time.sleep(0.5)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:  # someone else's DELETE
        client.destroy_instance(run.created[-1].instance_id)
    thread.join(60)
    result = box["result"]
    assert result.exit_code == 1 and "deleted by someone else: no DELETE of ours" in result.message, result.message
    assert [t.verdict for t in run.teardowns] == ["gone"]


def test_reap_include_live_deletes_only_after_confirmation(sim, tmp_path):
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        iid = client.create_instance(offer.id, {"image": "x", "disk": 10,
                                                "label": make_label("elsewhere-run", 0, time.time() + 3600)}).new_contract
        spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path, proof_interval_s=0.05), environ={})
        spec = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)})
        asked: list[int] = []
        assert reap_all(spec, client, Output(quiet=True), include_live=True,
                        confirm=lambda live: asked.append(len(live)) or False) == 0
        assert asked == [1] and any(i["id"] == iid and i["live"] for i in sim.state()["instances"])
        assert reap_all(spec, client, Output(quiet=True), include_live=True, confirm=lambda live: True) == 0
    assert not any(i["id"] == iid and i["live"] for i in sim.state()["instances"])


def test_reap_include_live_without_a_terminal_needs_yes(sim, tmp_path):
    p = cli("reap", "--include-live", "--api-url", sim.url, "--pacing-scale", str(SCALE), key=KEY)
    assert p.returncode == 2 and "--yes" in p.stderr


@pytest.mark.slow
def test_sigint_during_a_step_sends_the_delete_within_a_second(sim, tmp_path):
    p = spawn("--profile", "smoke", "--api-url", sim.url, "--pacing-scale", str(SCALE), "--poll-interval", "0.1",
              "--proof-interval", "0.2", cwd=tmp_path, key=KEY, stdout=subprocess.DEVNULL, text=False)
    end = time.monotonic() + 90
    line = b""
    while b"step tiny-round" not in line and time.monotonic() < end:
        line = p.stderr.readline()
    assert b"step tiny-round" in line
    time.sleep(1.0)
    t_sig = time.time()
    p.send_signal(signal.SIGINT)
    p.stderr.read()
    p.stderr.close()
    assert p.wait(timeout=120) == 130
    deletes = [c["time"] for c in sim.state()["calls"] if c["method"] == "DELETE" and c["time"] >= t_sig]
    assert deletes and deletes[0] - t_sig < 1.0, deletes[:1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(set(chaos.ACCOUNT_KINDS)))
def test_account_scenarios_hold_every_invariant(kind):
    seed = next(s for s in range(100) if chaos.draw_account(s).kind == kind)
    outcome = chaos.run_account(chaos.draw_account(seed))
    assert not outcome.violations, (outcome.summary(), [v.detail[:400] for v in outcome.violations], outcome.log[-3000:])


def test_the_cap_cut_is_decided_once_on_the_meters_clock(fake_clock):
    from vast_harness.caps.meter import CAP_CUT_SLACK_S, CostMeter

    meter = CostMeter(max_usd=10.0, max_seconds=100.0, teardown_margin_s=20.0, clock=fake_clock)
    wd = meter.work_deadline()  # t0 + 100 - 20, on the fake clock (no instance: no money deadline)
    assert wd == fake_clock() + 80.0 and not meter.cut_by_cap()
    fake_clock.sleep(80.0 - CAP_CUT_SLACK_S - 0.01)
    assert not meter.cut_by_cap()  # a phase's own timeout this early is not the cap's
    fake_clock.sleep(0.02)
    assert meter.cut_by_cap() and meter.now() == fake_clock()
    phase = meter.deadline(5.0)  # a phase deadline the meter handed out, before the work deadline
    assert meter.cut_by_cap(phase)
    # a wall-clock step does not exist for the meter: only its (monotonic) clock moves its deadlines
    fake_clock.sleep(7200.0)
    assert meter.remaining_s() < 0 and meter.cut_by_cap()


def test_status_shows_a_hostile_label_escaped(sim, tmp_path):
    # Anyone with the account key can label an instance: the label reaches `status`'s table, never the terminal raw.
    import io

    from rich.console import Console

    from vast_harness.views.status import show_status

    spec = make_spec(sim, tmp_path, [])
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        made = client.create_instance(offer.id, {"image": spec.profile.image, "disk": 10, "runtype": "ssh",
                                                 "label": "vh-\x1b]0;PWN\x07\x1b[2J-x"})
        try:
            sink = io.StringIO()
            out = Output()
            out.out = out.err = Console(file=sink, force_terminal=True, width=300)
            show_status(spec, client, out)
        finally:
            client.destroy_instance(made.new_contract)
    shown = sink.getvalue()
    assert "PWN" in shown and "]0;PWN" not in shown.replace("\\x1b]0;PWN", "")
    assert "\x1b]0" not in shown and "\x1b[2J" not in shown and "\x07" not in shown


def test_status_with_a_refused_key_is_bad_input_not_an_empty_account(tmp_path):
    # A refused key is bad configuration (exit 2), not a "problem" row (exit 1) beside an empty table.
    from vast_harness.errors import AuthError, ExitCode, exit_code_for

    with SimServer(seed=31, rate_scale=SCALE, api_keys=["another-key"]) as other:
        spec = make_spec(other, tmp_path, [])
        with VastClient(KEY, base_url=other.url, pacing_scale=SCALE) as client, \
                pytest.raises(AuthError) as info:
            collect(spec, client)
    assert exit_code_for(info.value) == ExitCode.BAD_INPUT


def test_a_reap_on_a_full_disk_still_deletes_the_orphans_and_says_what_it_could_not_write(sim, tmp_path,
                                                                                          monkeypatch, capsys):
    # Reaping is what saves money when a disk has filled up under a run: refusing it ("not writable; nothing
    # was rented", exit 2) would leave the orphan billing. Its evidence is best effort; the deletes and proofs
    # are not.
    import errno

    from vast_harness.cli import app as cli

    sim.set_faults("started_earlier:7200")  # an orphan left earlier: its row started 2 h ago
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        iid = client.create_instance(offer.id, {"image": "x", "disk": 10,
                                                "label": make_label("dead-run", 0, time.time() - 3600)}).new_contract
    real_write = os.write

    def write(fd, data):
        target = ""
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("VAST_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "reap", "--api-url", sim.url, "--pacing-scale", str(SCALE),
                                      "--proof-interval", "0.05", "--evidence-dir", str(tmp_path / "ev")])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    err = capsys.readouterr().err
    assert not any(i["id"] == iid and i["live"] for i in sim.state()["instances"]), err
    assert exited.value.code == 0, err
    assert "No space" in err and "nothing was rented" not in err and "Traceback" not in err, err
