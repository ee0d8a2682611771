"""Notifications (`--notify`, docs/notifications.md) from real runs on the simulator to a real receiver on
loopback (tests/harness/receiver.py) that answers 200, answers 500, or stalls: the teardown's time is the same
with or without them, no body holds the key, a secret or a receiver's token, every milestone arrives in the
documented schema (docs/notification.schema.json, validated here), and a bad URL stops the run before renting.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli
from tests.harness.receiver import Receiver
from vast_harness.actions.reap import reap_all
from vast_harness.console.notification import EVENTS, notification_schema
from vast_harness.console.notify import NOTIFY_FLUSH_S, Notifier, notify_url, shown_target
from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.vast.client import VastClient

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.01
KEY = "sim-notify-key-0c4f2a9d"
SECRET = "notify-secret-77e1b9c3"
SCHEMA = json.loads((ROOT / "docs" / "notification.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
SIM_OPTIONS = dict(seed=44, rate_scale=SCALE, boot_seconds=0.1, num_offers=400)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")


def make_spec(sim: SimServer, tmp_path: Path, steps: list[Step], notify: list[str]) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              remote_secret=[f"TRACKER_TOKEN={SECRET}"], notify=notify or None), environ={})
    prof = spec.profile.model_copy(update={"steps": steps})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
                           ).with_timings(teardown_margin_s=2.0)


def execute(sim: SimServer, spec: RunSpec, *, teardown_budget_s: float | None = None,
            during: threading.Thread | None = None) -> tuple[GuardedRun, ExitCode, float]:
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, max_retry_s=0.5) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        if teardown_budget_s is not None:
            run.state.teardown_budget_s = teardown_budget_s
        if during is not None:
            during.start()
        start = time.monotonic()
        result = run.execute()
    return run, result.exit_code, time.monotonic() - start


def events(receiver: Receiver, prefix: str) -> list[dict]:
    bodies = receiver.bodies(prefix)
    for body in bodies:
        VALIDATOR.validate(body)
    return bodies


def spec_caps(run: GuardedRun) -> dict[str, float]:
    return {"max_usd": run.spec.caps.max_usd, "max_minutes": run.spec.caps.max_minutes}


STALL_READ_S = 30.0
ECHO_SECRET = [Step(name="work", run='echo "token is $TRACKER_TOKEN"; sleep 0.5', timeout_s=30)]


# ------------------------------------------------------------------------------------------ the schema, the URLs
def test_the_schema_file_is_the_events_own_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA == notification_schema(), "regenerate docs/notification.schema.json from notification_schema()"
    assert set(SCHEMA["discriminator"]["mapping"]) == set(EVENTS)
    doc = (ROOT / "docs" / "notifications.md").read_text()
    assert all(f"`{name}`" in doc for name in EVENTS)  # every event described for people too


@pytest.mark.parametrize("url", ["https://hooks.example.com/services/T0/B0/xyz", "http://127.0.0.1:9/h",
                                 "http://localhost:8080/", "http://[::1]:99/x?token=1"])
def test_https_anywhere_and_plain_http_to_this_machine_are_accepted(url):
    assert notify_url(url) == url


@pytest.mark.parametrize(("url", "said"), [
    ("http://hooks.example.com/services/TOKEN-in-path-9f8e", "plain http to another machine"),
    ("ftp://hooks.example.com/x", "is not an https URL"),
    ("https://user:pw@hooks.example.com/x", "carries credentials"),
    ("hooks.example.com/x", "is not an https URL"),
    ("https://hooks.example.com/a b", "printable ASCII URL without spaces"),
    ("", "is empty"),
])
def test_a_bad_notify_url_is_exit_2_before_anything_is_rented(url, said, tmp_path):
    with pytest.raises(ConfigError, match=said):
        notify_url(url)
    done = cli("run", "--sim", "--notify", url, "--workdir", str(tmp_path), "--", "true", home=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--notify" in done.stderr and said in done.stderr and "renting offer" not in done.stderr
    assert "TOKEN-in-path-9f8e" not in done.stderr + done.stdout  # a webhook's URL is its token: masked
    assert not list((tmp_path / "state").rglob("harness-result.json"))


def test_the_config_files_notify_list_is_checked_and_a_flag_replaces_it(tmp_path):
    work = tmp_path / "wd"
    work.mkdir()
    (work / "train.py").write_text("print(1)\n")
    config = tmp_path / "config" / "vast-harness" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('notify = ["http://hooks.example.com/cfg-token-5d5d"]\n')
    done = cli("run", "--sim", "--dry-run", "--workdir", str(work), "--", "true", home=tmp_path)
    assert done.returncode == 2 and "notify (config file)" in done.stderr, done.stderr
    assert "cfg-token-5d5d" not in done.stderr
    spec = resolve(RunOptions(command=["true"], workdir=str(work), sim=True, dry_run=True,
                              notify=["https://flag.example.com/f"]),
                   environ={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert spec.notify == ["https://flag.example.com/f"]
    assert len(resolve(RunOptions(command=["true"], workdir=str(work), sim=True, dry_run=True,
                                  notify=[f"https://h.example.com/{i}" for i in range(8)]), environ={}).notify) == 8
    with pytest.raises(ConfigError, match="at most 8"):
        resolve(RunOptions(command=["true"], workdir=str(work), sim=True, dry_run=True,
                           notify=[f"https://h.example.com/{i}" for i in range(9)]), environ={})


def test_only_the_scheme_host_and_port_of_a_url_are_ever_shown():
    assert shown_target("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/…"
    assert shown_target("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert shown_target("http://[::1]:9/x?k=v") == "http://[::1]:9/…"


def test_posting_never_blocks_and_a_full_queue_drops_and_says_so():
    from vast_harness.console.notification import EventCaps, InterruptedEvent

    with Receiver(stall_s=5) as rx:
        notifier = Notifier([rx.url("/stall/q")], read_s=0.5, queue_max=2)
        made = [InterruptedEvent(run_id="r", sequence=i, time_unix=0.0, message="m", sim=True, profile="p",
                                 caps=EventCaps(max_usd=1, max_minutes=1), accrued_usd=0.0, elapsed_s=0.0,
                                 signal="SIGINT") for i in range(1, 7)]
        start = time.monotonic()
        for event in made:
            notifier.post(event)
        assert time.monotonic() - start < 0.1  # six posts to a receiver that never answers: no wait at all
        deliveries = notifier.close(wait_s=0.2)
    outcomes = sorted(d.outcome for d in deliveries)
    assert "dropped" in outcomes and "undelivered" in outcomes, deliveries
    assert len(deliveries) == 6 and all(d.target == "http://127.0.0.1:%d/… [1]" % rx.server.server_address[1]
                                        for d in deliveries)


# ------------------------------------------------------------------------------------------ real runs
def test_receivers_that_stall_or_fail_never_delay_the_teardown_and_never_see_a_secret(sim, tmp_path, monkeypatch):
    baseline, code, base_took = execute(sim, make_spec(sim, tmp_path / "base", ECHO_SECRET, []))
    assert code == ExitCode.PASSED
    # A stalled receiver is waited for 30 s per event here (3 s in a run): anything on the run's path that waited
    # for a delivery would add 30 s, far past what a loaded machine adds to a teardown.
    monkeypatch.setattr("vast_harness.run.notify.Notifier", functools.partial(Notifier, read_s=STALL_READ_S))
    with Receiver(stall_s=60) as rx:
        urls = [rx.url("/ok/tok-ok-a1b2c3"), rx.url("/fail/tok-fail-d4e5f6"), rx.url("/stall/tok-stall-0a0b0c")]
        run, code, took = execute(sim, make_spec(sim, tmp_path / "notify", ECHO_SECRET, urls))
        assert code == ExitCode.PASSED
    # The teardown took what it takes without receivers; the run waited for its last events NOTIFY_FLUSH_S at
    # most, after the teardown.
    teardown_s, base_teardown_s = run.state.timings["teardown_s"], baseline.state.timings["teardown_s"]
    assert teardown_s < base_teardown_s + STALL_READ_S / 3, (teardown_s, base_teardown_s)
    assert took < base_took + NOTIFY_FLUSH_S + STALL_READ_S / 3, (took, base_took)
    for prefix in ("/ok", "/fail"):
        got = events(rx, prefix)
        assert [e["event"] for e in got] == ["rented", "proven_gone"], got
        assert [e["sequence"] for e in got] == [1, 2] and got[-1]["outcome"]["absence"] == "gone"
        assert got[0]["instance"]["instance_id"] == run.created[0].instance_id
        assert got[0]["sim"] is True and got[0]["caps"] == spec_caps(run)
    assert events(rx, "/stall")[0]["event"] == "rented"  # it got the body, then held the connection
    raw = b"\n".join(g.body + repr(g.headers).encode() for g in rx.got)
    for leak in (KEY, SECRET, "tok-ok-a1b2c3", "tok-fail-d4e5f6", "tok-stall-0a0b0c"):
        assert leak.encode() not in raw, leak
    assert all(g.headers["Content-Type"] == "application/json" and "Authorization" not in g.headers
               and g.headers["X-Vast-Harness-Event"] in EVENTS for g in rx.got)
    record = json.loads((run.ev.dir / "notifications.json").read_text())
    said = {(d["target"], d["event"]) for d in record["deliveries"]}
    assert record["events"] == 2 and len(record["targets"]) == 3
    outcomes = {(d["event"], d["outcome"], d["status"]) for d in record["deliveries"]}
    assert ("rented", "delivered", 200) in outcomes and ("proven_gone", "delivered", 200) in outcomes
    assert ("rented", "failed", 500) in outcomes and ("proven_gone", "failed", 500) in outcomes
    assert {d["outcome"] for d in record["deliveries"] if d["status"] is None} <= {"failed", "undelivered"}
    assert len(said) == len(record["deliveries"]) == 6  # every event at every URL said once, one way or another
    text = (run.ev.dir / "notifications.json").read_text()
    assert "tok-" not in text and "notifications.json" in (run.ev.dir / "manifest.sha256").read_text()


def _interrupt_when_running(sim: SimServer) -> threading.Thread:
    """SIGINT to this process once the simulator has a live instance (the run's main thread gets it)."""
    def interrupt() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [i for i in sim.state()["instances"] if i["live"]]:
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGINT)

    return threading.Thread(target=interrupt, daemon=True)


@pytest.mark.parametrize("milestone", ["interrupted", "not_proven_gone", "receipt_failed",
                                       pytest.param("cap_reached", marks=pytest.mark.slow)])
def test_every_milestone_arrives_in_the_documented_schema(milestone, sim, tmp_path):
    with Receiver() as rx:
        spec = make_spec(sim, tmp_path, ECHO_SECRET, [rx.url("/ok/m")])
        if milestone == "interrupted":
            spec = make_spec(sim, tmp_path, [Step(name="long", run="sleep 30", timeout_s=60)], [rx.url("/ok/m")])
            run, code, _ = execute(sim, spec, during=_interrupt_when_running(sim))
            expected, last = ["rented", "interrupted", "proven_gone"], ExitCode.INTERRUPTED
        elif milestone == "not_proven_gone":
            sim.set_faults("5xx:list:*:503")  # no list answers: absence cannot be proven
            run, code, _ = execute(sim, spec, teardown_budget_s=1.0)
            expected, last = ["rented", "not_proven_gone"], ExitCode.NOT_PROVEN_GONE
        elif milestone == "receipt_failed":  # an H100 whose HBM copies at half speed, then a healthy one
            sim.set_faults("hbm_slow:0.5:1")
            spec = spec.model_copy(update={"filters": spec.filters.model_copy(update={"gpu_names": ["H100 SXM"]}),
                                           "boot_retries": 1, "caps": spec.caps.model_copy(update={"max_usd": 5.0})})
            run, code, _ = execute(sim, spec)
            expected, last = ["rented", "receipt_failed", "rented", "proven_gone"], ExitCode.PASSED
        else:
            spec = make_spec(sim, tmp_path, [Step(name="long", run="sleep 30", timeout_s=60)], [rx.url("/ok/m")])
            spec = spec.model_copy(update={"caps": spec.caps.model_copy(update={"max_minutes": 0.1})})  # 6 s
            run, code, _ = execute(sim, spec)
            expected, last = ["rented", "cap_reached", "proven_gone"], ExitCode.CAP_REACHED
        got = events(rx, "/ok")
    assert code == last, run.state
    assert [e["event"] for e in got] == expected
    assert [e["sequence"] for e in got] == list(range(1, len(expected) + 1))
    assert got[-1]["outcome"]["exit_code"] == int(last) and got[-1]["outcome"]["exit_name"] == last.name
    if milestone == "interrupted":
        assert got[1]["signal"] == "SIGINT"
    if milestone == "not_proven_gone":
        assert got[-1]["outcome"]["absence"] == "unproven" and "reap" in got[-1]["message"]
        sim.set_faults(None)
        with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
            assert reap_all(spec, client, Output(quiet=True)) == 0
    if milestone == "cap_reached":
        assert "cap" in got[1]["reason"]
    if milestone == "receipt_failed":
        assert got[1]["instance"] == got[0]["instance"] and got[2]["instance"] != got[0]["instance"]
        assert any("hbm_copy" in line and "expected" in line for line in got[1]["failed"]), got[1]
    assert not [i for i in sim.state()["instances"] if i["live"]]


def test_an_event_that_cannot_be_made_is_recorded_never_raised_into_the_run(tmp_path):
    from vast_harness.run.notify import RunNotifier

    class BrokenMeter:  # the run's meter failing mid-event: what a bug in an event looks like to the run
        def accrued_usd(self) -> float:
            raise ArithmeticError("no figure")

        def elapsed_s(self) -> float:
            return 1.0

    (tmp_path / "w.py").write_text("print(1)\n")
    spec = resolve(RunOptions(command=["true"], workdir=str(tmp_path), sim=True, dry_run=True,
                              notify=["https://relay.example.com/x"]), environ={})
    notifier = RunNotifier(spec, "r1", BrokenMeter())  # type: ignore[arg-type]
    notifier.cap_reached("the cost cap")  # no raise: the cap guard's thread goes on to its DELETE
    notifier.interrupted("SIGINT")
    deliveries = notifier.notifier.close(0.0)
    assert [(d.event, d.outcome, d.error) for d in deliveries] == [
        ("cap_reached", "failed", "not made: ArithmeticError"), ("interrupted", "failed", "not made: ArithmeticError")]


# ------------------------------------------------------------------------------------------ an interruptible run
OUTBIDS = {  # family (chaos/interrupt.py), --max-interruptions -> the events, in order, and the run's exit
    "outbid_running": (2, ["rented", "outbid", "rented", "replaced", "proven_gone"], ExitCode.PASSED),
    "outbid_boot": (2, ["rented", "outbid", "rented", "replaced", "proven_gone"], ExitCode.PASSED),
    "outbid_wait_resumes": (2, ["rented", "outbid", "resumed", "proven_gone"], ExitCode.PASSED),
    "outbid_past_the_limit": (0, ["rented", "outbid", "proven_gone"], ExitCode.FAILED),
}


@pytest.mark.parametrize("family", sorted(OUTBIDS))
def test_an_outbid_and_how_the_run_goes_on_arrive_in_the_documented_schema(family, sim, tmp_path):
    """The simulator's `outbid` faults (docs/interruptible.md): each outbid says the host, its machine, the stage it
    was seen at, its number of --max-interruptions and what happens next; the run going on says where."""
    from tests.tools import require_rsync
    from vast_harness.chaos.engine import _client
    from vast_harness.chaos.interrupt import FAMILIES, ON_OUTBID, interrupt_spec

    require_rsync()
    limit, expected, exit_code = OUTBIDS[family]
    with Receiver() as rx:
        spec = interrupt_spec(sim.url, tmp_path, steps=30, step_s=0.1, max_interruptions=limit,
                              on_outbid=ON_OUTBID.get(family))
        spec = spec.model_copy(update={"notify": [rx.url("/ok/outbid-tok-9a8b")]})
        sim.set_faults(f"{FAMILIES[family]};seed=1")
        with _client(sim.url) as client:
            run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
            result = run.execute()
        got = events(rx, "/ok")
    assert result.exit_code == exit_code, result.message
    assert [e["event"] for e in got] == expected, [(e["event"], e["message"]) for e in got]
    assert [e["sequence"] for e in got] == list(range(1, len(expected) + 1))
    first = run.created[0]
    outbid = got[1]
    assert outbid["instance"] == got[0]["instance"]  # the host as rented: id, machine, GPU
    assert outbid["instance"]["instance_id"] == first.instance_id and outbid["instance"]["machine_id"] == first.machine_id
    assert outbid["interruption"] == 1 and outbid["max_interruptions"] == limit
    assert f"instance {first.instance_id}" in outbid["reason"] and "(1 of at most" in outbid["message"]
    if family == "outbid_running":
        assert (outbid["next"], outbid["stage"]) == ("salvage_and_replace", "steps"), outbid
        replaced = got[3]
        assert replaced["instance"] == got[2]["instance"] and replaced["replaces"] == first.instance_id
        assert replaced["instance"]["machine_id"] != first.machine_id  # the outbid machine is excluded
        record = json.loads((run.ev.dir / "harness-result.json").read_text())
        assert replaced["checkpoint_bytes"] == record["attempts"][0]["salvaged_bytes"] > 0
    elif family == "outbid_boot":  # paused before it ran: nothing to salvage
        assert (outbid["next"], outbid["stage"]) == ("replace", "rent"), outbid
        assert got[3]["replaces"] == first.instance_id and got[3]["checkpoint_bytes"] == 0
    elif family == "outbid_wait_resumes":
        assert outbid["next"] == "wait" and got[2]["instance"] == outbid["instance"]
        assert got[2]["paused_s"] > 0 and got[2]["interruption"] == 1
    else:
        assert outbid["next"] == "stop" and got[-1]["outcome"]["exit_code"] == int(ExitCode.FAILED)
    assert b"outbid-tok-9a8b" not in b"".join(g.body for g in rx.got)
    assert not [i for i in sim.state()["instances"] if i["live"]]
