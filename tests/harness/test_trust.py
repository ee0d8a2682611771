"""What the harness trusts, and what it must not: a `Date` header, a ledger line, a registration file, a config
file, an API URL and a money figure are each checked before anything is deleted, settled or sent.

Judged by the simulator's state where an instance is at stake (`/_sim/state`), and by exit codes and messages
for bad input: nothing of the user's is deleted, no unknown create is settled on one clock reading, no key
travels in clear, and no odd file hangs, floods or crashes a command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli
from vast_harness.actions.reap import reap_all
from vast_harness.console.output import Output
from vast_harness.errors import ConfigError
from vast_harness.sim import SimServer
from vast_harness.spec.profile import load_toml
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.spec.user import UserConfig
from vast_harness.state.ledger import Ledger
from vast_harness.state.process import ProcessId, process_start
from vast_harness.state.registry import Registration, RunRegistry, make_label, this_host
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance, User
from vast_harness.vast.url import validate_api_url
from vast_harness.views.orphans import judge

SCALE = 0.01
KEY = "sim-trust-key"
SIM_OPTIONS = dict(seed=35, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")


def spec_for(sim: SimServer, tmp_path: Path) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    return spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)})


def rent(sim: SimServer, label: str) -> int:
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        return client.create_instance(offer.id, {"image": "img", "disk": 10, "label": label}).new_contract


def live(sim: SimServer) -> set[int]:
    return {i["id"] for i in sim.state()["instances"] if i["live"]}


def reap(sim: SimServer, spec: RunSpec, out: Output | None = None) -> int:
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        return reap_all(spec, client, out or Output(quiet=True))


# ------------------------------------------------------------------------------------- what reap deletes
def test_reap_never_deletes_what_a_ledger_names_under_a_label_no_run_makes(sim, tmp_path, capsys):
    spec = spec_for(sim, tmp_path)
    theirs = rent(sim, "prod-database")
    ledger = Ledger.for_spec(spec)
    ledger.append("20200101T000000Z-abcdef", "created", "prod-database", offer_id=1, instance_id=theirs)
    ledger.append("20200101T000000Z-abcdef", "intent", "prod-database", offer_id=1)  # an unknown create too
    assert reap(sim, spec, Output()) == 3
    assert theirs in live(sim)
    assert "which no run of this harness makes" in capsys.readouterr().out


def test_a_ledger_reap_cannot_read_is_never_all_proven_absent(sim, tmp_path):
    spec = spec_for(sim, tmp_path)
    real = tmp_path / "real-ledger.jsonl"
    real.write_text("")
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    (spec.state_dir / "ledger.jsonl").symlink_to(real)
    assert reap(sim, spec) == 3


def test_a_run_of_another_machine_in_a_synced_ledger_is_judged_by_its_deadline(sim, tmp_path):
    spec = spec_for(sim, tmp_path)
    run_id = "20261203T100000Z-abc123"
    label = make_label(run_id, 0, time.time() + 600, left_s=600)
    iid = rent(sim, label)
    Ledger.for_spec(spec).append(run_id, "created", label, offer_id=1, instance_id=iid,
                                 host="othermachine", pid=1)  # type: ignore[typeddict-unknown-key]
    assert reap(sim, spec) == 0
    assert iid in live(sim), "a live run of another machine was reaped"


def test_a_server_clock_hours_ahead_does_not_make_a_live_run_an_orphan(sim, tmp_path, monkeypatch):
    spec = spec_for(sim, tmp_path)
    label = make_label("20261203T100000Z-def456", 0, time.time() + 240, left_s=240)
    iid = rent(sim, label)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        client.list_instances()
        skewed = client.server_clock.now
        monkeypatch.setattr(client.server_clock, "now", lambda: (skewed() or time.time()) + 7200)
        assert reap_all(spec, client, Output(quiet=True)) == 0
    assert iid in live(sim)

def test_reap_never_deletes_an_instance_whose_row_carries_another_label(sim, tmp_path, capsys):
    spec = spec_for(sim, tmp_path)
    theirs = rent(sim, "prod-database")  # the user's own instance, nothing to do with any run
    forged = make_label("20200101T000000Z-abcdef", 0, time.time() - 7 * 24 * 3600)
    Ledger.for_spec(spec).append("20200101T000000Z-abcdef", "created", forged, offer_id=1, instance_id=theirs)
    code = reap(sim, spec, Output())
    out = capsys.readouterr().out
    assert theirs in live(sim), "reap deleted an instance that does not carry the run's label"
    assert code == 3
    assert "'prod-database'" in out and "not deleted" in out


def test_reap_does_not_settle_an_unknown_create_on_one_skewed_server_reading(sim, tmp_path):
    """The create's answer was lost and its `Date` said 2 h earlier than the truth: by the server clock alone the
    create looks 2 h old, older than any read lag, so null reads would 'prove' the label empty. They may not."""
    spec = spec_for(sim, tmp_path)
    label = make_label("20261203T100000Z-abc123", 0, time.time() + 600)
    sim.set_faults("read_lag:60")  # the instance exists but no read shows it yet
    iid = rent(sim, label)
    skewed = Ledger(spec.state_dir / "ledger.jsonl", Ledger.for_spec(spec).target, lambda: time.time() - 7200)
    skewed.append("20261203T100000Z-abc123", "intent", label, offer_id=1)
    skewed.append("20261203T100000Z-abc123", "create_unresolved", label, offer_id=1)
    assert reap(sim, spec) == 3  # not "all proven absent"
    assert iid in live(sim)
    assert label in Ledger.for_spec(spec).view().unresolved  # still looked for by the next reap
    sim.set_faults("")


def test_a_label_deadline_from_a_skewed_clock_does_not_make_a_live_run_an_orphan():
    now = 1_800_000_000.0
    skewed_deadline = now - 7200 + 180  # a 3-min cap labelled by a run whose `Date` was 2 h behind
    row = Instance.model_validate({"id": 1, "start_date": now - 20, "label": "x"})
    old_label, new_label = make_label("run", 0, skewed_deadline), make_label("run", 0, skewed_deadline, left_s=180)
    for label in (old_label, new_label):
        verdict, why = judge(None, label, row, runs={}, known_runs=set(), server_now=now)
        assert verdict == "live", (label, why)
    # the same labels on an instance that really started 2 h ago are orphans
    old_row = Instance.model_validate({"id": 1, "start_date": now - 7200, "label": "x"})
    for label in (old_label, new_label):
        assert judge(None, label, old_row, runs={}, known_runs=set(), server_now=now)[0] == "orphan"


def test_a_replaced_or_deleted_registration_does_not_make_a_live_run_dead(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the live run's process
    try:
        registry = RunRegistry(tmp_path)
        (tmp_path / "live").mkdir(mode=0o700)
        path = tmp_path / "live" / "r1.json"
        # An editor's save, or a move and copy back: the file is there with its content, on a new inode that
        # no process locks.
        path.write_text(Registration(run_id="r1", pid=run.pid, pid_start=process_start(run.pid), host=this_host(),
                                     started_unix=0, api_url="u", profile="smoke", max_usd=1, max_minutes=1,
                                     deadline_unix=0).model_dump_json())
        found = registry.scan()["r1"]
        assert found.liveness == "live" and found.unlocked
        verdict, why = judge("r1", make_label("r1", 0, 1e8), None, runs=registry.scan(), known_runs={"r1"},
                             server_now=1e9)
        assert verdict == "orphan"  # its deadline is long past on the server's clock: that still decides
        verdict, why = judge("r1", "vh-r1", None, runs=registry.scan(), known_runs={"r1"}, server_now=1e9)
        assert verdict == "live" and "process is alive" in why, why
        path.unlink()  # deleted: the ledger's lines still name the run's process
        process = ProcessId(host=this_host(), pid=run.pid, start=process_start(run.pid))
        verdict, why = judge("r1", "vh-r1", None, runs=registry.scan(), known_runs={"r1"}, server_now=1e9,
                             processes={"r1": process})
        assert verdict == "live" and f"pid {run.pid}" in why, why
    finally:
        run.kill()
        run.wait()
    assert judge("r1", "vh-r1", None, runs=registry.scan(), known_runs={"r1"}, server_now=1e9,
                 processes={"r1": process})[0] == "orphan"


def test_a_dead_runs_process_is_not_mistaken_for_a_live_one(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    registry = RunRegistry(tmp_path)
    (tmp_path / "live").mkdir(mode=0o700)
    (tmp_path / "live" / "r2.json").write_text(Registration(
        run_id="r2", pid=child.pid, host=this_host(), started_unix=0, api_url="u", profile="smoke", max_usd=1,
        max_minutes=1, deadline_unix=0, pid_start="1").model_dump_json())
    assert registry.scan()["r2"].liveness == "dead"


# ------------------------------------------------------------------------------- whose directory it is
def test_a_state_dir_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "vh"
    shared.mkdir()
    shared.chmod(0o777)  # made by someone else for everyone, e.g. VAST_HARNESS_HOME=/tmp/vh
    with pytest.raises(ConfigError, match="writable by group or others"):
        resolve(RunOptions(profile="smoke", sim=True, state_dir=shared, dry_run=True), environ={})
    proc = cli("reap", "--api-url", "http://127.0.0.1:9", env={"VAST_HARNESS_HOME": str(shared),
                                                              "VAST_API_KEY": "a" * 64})
    assert proc.returncode == 2 and "writable by group or others" in proc.stderr, proc.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_a_state_dir_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to another user"):
        resolve(RunOptions(profile="smoke", sim=True, state_dir=theirs, evidence_dir=tmp_path / "ev"), environ={})


def test_a_ledger_that_is_a_link_is_neither_read_nor_written(tmp_path):
    from vast_harness.errors import LedgerWriteError

    victim = tmp_path / "their-ledger.jsonl"
    victim.write_text(json.dumps({"t_unix": 1, "run_id": "x", "event": "created", "label": "vh-x",
                                  "instance_id": 42}) + "\n")
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "ledger.jsonl").symlink_to(victim)
    ledger = Ledger(tmp_path / "state" / "ledger.jsonl")
    assert ledger.entries() == [] and "symbolic link" in ledger.bad_lines[0].reason
    with pytest.raises(LedgerWriteError, match="symbolic link"):
        ledger.append("r", "intent", "vh-r")
    assert victim.read_text().count("\n") == 1  # untouched


def test_evidence_is_private(tmp_path):
    from vast_harness.evidence.run import RunEvidence

    ev = RunEvidence(tmp_path / "ev" / "run-1")
    for d in (ev.dir, ev.dir / "steps", ev.dir / "remote"):
        assert d.stat().st_mode & 0o077 == 0, d


# ----------------------------------------------------------------------------------- files that are odd
def test_odd_registration_files_are_skipped_and_said_not_hung_on(tmp_path):
    live_dir = tmp_path / "live"
    live_dir.mkdir(mode=0o700)
    os.mkfifo(live_dir / "fifo.json")
    (live_dir / "zero.json").symlink_to("/dev/zero")
    (live_dir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    registry = RunRegistry(tmp_path)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("runs", registry.scan()), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "scan hung on a FIFO or read /dev/zero"
    runs = box["runs"]
    assert isinstance(runs, dict) and set(runs) == {"deep"}
    assert runs["deep"].reg is None
    said = " ".join(registry.skipped)
    assert "fifo.json" in said and "a FIFO" in said and "zero.json" in said


@pytest.mark.parametrize("kind", ["invalid-utf8", "directory", "dangling-link", "fifo", "dev-zero"])
def test_a_config_file_that_cannot_be_read_is_refused_naming_it(tmp_path, kind):
    conf = tmp_path / "xdg" / "vast-harness" / "config.toml"
    conf.parent.mkdir(parents=True)
    if kind == "invalid-utf8":
        conf.write_bytes(b"max_usd = 0.01\n# caf\xe9\n")
    elif kind == "directory":
        conf.mkdir()
    elif kind == "dangling-link":
        conf.symlink_to(tmp_path / "nowhere.toml")
    elif kind == "fifo":
        os.mkfifo(conf)
    else:
        conf.symlink_to("/dev/zero")
    with pytest.raises(ConfigError) as refused:
        UserConfig.load({"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert str(conf) in str(refused.value)


def test_a_config_with_one_bad_byte_is_exit_2_in_every_command_not_a_traceback(tmp_path):
    conf = tmp_path / "xdg" / "vast-harness" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_bytes(b"max_usd = 0.01\n# caf\xe9\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "VAST_HARNESS_HOME": str(tmp_path / "home"),
           "VAST_API_KEY": "a" * 64}
    nowhere = ["--api-url", "http://127.0.0.1:9"]  # the config is read before any request
    for args in (["--profile", "smoke", "--sim", "--dry-run"], ["reap", *nowhere], ["status", *nowhere],
                 ["check", *nowhere]):
        proc = cli(*args, env=env)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert "not UTF-8" in proc.stderr and str(conf) in proc.stderr, proc.stderr


def test_a_profile_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_toml(bad)


# ------------------------------------------------------------------------------------ keys and money
@pytest.mark.parametrize("url", ["http://198.51.100.7", "http://console.vast.ai", "http://10.0.0.1:8080/"])
def test_plain_http_to_another_machine_is_refused_before_any_request(url):
    with pytest.raises(ConfigError, match="in clear"):
        validate_api_url(url, environ={})
    assert validate_api_url(url, environ={"VAST_HARNESS_ALLOW_PLAIN_HTTP": "1"}) == url.rstrip("/")
    assert validate_api_url("http://127.0.0.1:8080", environ={}) == "http://127.0.0.1:8080"  # the simulator


@pytest.mark.parametrize("args", [["check"], ["--profile", "smoke", "--dry-run"], ["reap"], ["status"]])
def test_no_command_sends_the_key_over_plain_http(tmp_path, args):
    key = tmp_path / "key"
    key.write_text("a" * 64)
    key.chmod(0o600)
    t0 = time.monotonic()
    proc = cli(*args, env={"VAST_URL": "http://198.51.100.7", "VAST_API_KEY": "a" * 64,
                           "VAST_HARNESS_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "in clear" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 25  # refused, not tried (198.51.100.0/24 answers nothing)


@pytest.mark.parametrize(("raw", "credit"), [("1e400", None), ("true", None), ("NaN", None), ('"12.5"', 12.5),
                                             ("-3", -3.0)])
def test_a_money_figure_must_be_a_finite_number(raw, credit):
    user = User.model_validate(json.loads(f'{{"credit": {raw}, "balance": 2.0}}'))
    assert user.credit == credit
    assert user.available_usd == (credit if credit is not None else 2.0)


# ------------------------------------------------------------------------------------------- secrets
def test_a_secret_is_masked_as_json_writes_it_and_in_folder_names(sim, tmp_path):
    from vast_harness.run.runner import GuardedRun
    from vast_harness.spec.profile import Step, load_driver_policy

    secret = 'p\u00e4ss"w0\'rd\\-\u00fcml'  # a quote of each kind, a backslash, non-ASCII letters
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              remote_secret=[f"TOKEN={secret}"]), environ={})
    # The host writes the value into JSON both ways, and makes a folder (and a file in another) named after it.
    script = ("python3 -c \"import json,os; v=os.environ['TOKEN']; "
              "open('evidence/a.json','w').write(json.dumps({'t': v})); "
              "open('evidence/b.json','w').write(json.dumps({'t': v}, ensure_ascii=False)); "
              "os.makedirs('evidence/'+v, exist_ok=True); os.makedirs('evidence/x/'+v+'-d', exist_ok=True); "
              "open('evidence/x/'+v+'-d/f.txt','w').write('ok')\"; echo \"$TOKEN\" >> ~/.vh-deadman.log; "
              "python3 -c \"import os; print(repr(os.environ['TOKEN']), dict(t=os.environ['TOKEN']))\"; "
              "echo \"$TOKEN\" | python3 -c "
              "\"import json,sys; print(json.dumps(sys.stdin.read().strip()))\"")
    prof = spec.profile.model_copy(update={"steps": [Step(name="leak", run=script, timeout_s=30)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
                           ).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    assert result.exit_code == 0, result.message
    escaped = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]}
    for path in run.ev.dir.rglob("*"):
        rel = path.relative_to(run.ev.dir).as_posix()
        assert not any(v in rel for v in escaped), f"a secret in a name: {rel}"
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not any(v in text for v in escaped), path


def test_a_create_answer_naming_another_instance_is_neither_waited_on_nor_deleted(sim, tmp_path):
    from vast_harness.run.runner import GuardedRun
    from vast_harness.spec.profile import Step, load_driver_policy

    theirs = rent(sim, "prod-database")  # the account's own, unrelated instance
    sim.set_faults("wrong_contract")  # the run's create answer names it as the new contract
    spec = spec_for(sim, tmp_path)
    prof = spec.profile.model_copy(update={"steps": [Step(name="ok", run="true", timeout_s=10)]})
    spec = spec.model_copy(update={"profile": prof}).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    assert theirs in live(sim), "the run deleted an instance that is not its own"
    deletes = [c for c in sim.state()["calls"] if c["method"] == "DELETE" and str(theirs) in c["path"]]
    assert not deletes
    assert result.exit_code != 0, result.message
    labels = run.tools.book.labels()
    ours = [i for i in sim.state()["instances"] if i["label"] in labels]
    assert ours and not any(i["live"] for i in ours), "the run's own instance was left billing"


def test_a_create_answer_naming_an_unlabelled_instance_is_not_taken_for_ours(sim, tmp_path):
    """The create's answer is the one witness that `wrong_contract` corrupts, so it cannot vouch for a row that
    carries no label: only a row with the run's own label is waited on, billed or deleted as the run's."""
    from vast_harness.run.runner import GuardedRun
    from vast_harness.spec.profile import Step, load_driver_policy

    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:  # made in the console, never labelled
        offer = client.search_offers({"limit": 5})[-1]
        theirs = client.create_instance(offer.id, {"image": "img", "disk": 10}).new_contract
    assert next(i for i in sim.state()["instances"] if i["id"] == theirs)["label"] in (None, "")
    sim.set_faults("wrong_contract")
    spec = spec_for(sim, tmp_path)
    prof = spec.profile.model_copy(update={"steps": [Step(name="ok", run="true", timeout_s=10)]})
    spec = spec.model_copy(update={"profile": prof}).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    assert theirs in live(sim), "the run deleted an unlabelled instance that its create answer named"
    assert not [c for c in sim.state()["calls"] if c["method"] == "DELETE" and str(theirs) in c["path"]]
    assert result.exit_code != 0, result.message
    labels = run.tools.book.labels()
    ours = [i for i in sim.state()["instances"] if i["label"] in labels]
    assert ours and not any(i["live"] for i in ours), "the run's own instance was left billing"


def test_a_registration_overwritten_with_garbage_does_not_make_a_live_run_dead(tmp_path):
    """A backup tool's half-copy or an editor's bad save: the file is unlocked and no longer a registration, so it
    names no pid. The run's ledger lines still name its process, and while that runs the run is live."""
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the live run's process
    try:
        registry = RunRegistry(tmp_path)
        (tmp_path / "live").mkdir(mode=0o700)
        (tmp_path / "live" / "r3.json").write_text('{"run_id": "r3", "pid": ')
        assert registry.scan()["r3"].liveness == "dead" and registry.scan()["r3"].reg is None
        process = ProcessId(host=this_host(), pid=run.pid, start=process_start(run.pid))
        verdict, why = judge("r3", "vh-r3", None, runs=registry.scan(), known_runs={"r3"}, server_now=1e9,
                             processes={"r3": process})
        assert verdict == "live" and f"pid {run.pid}" in why, why
        # a stale copy naming a process that is gone (a backup of another day): the ledger's process still decides
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        (tmp_path / "live" / "r3.json").write_text(Registration(
            run_id="r3", pid=gone.pid, host=this_host(), started_unix=0, api_url="u", profile="smoke", max_usd=1,
            max_minutes=1, deadline_unix=0, pid_start="1").model_dump_json())
        assert registry.scan()["r3"].liveness == "dead"
        assert judge("r3", "vh-r3", None, runs=registry.scan(), known_runs={"r3"}, server_now=1e9,
                     processes={"r3": process})[0] == "live"
    finally:
        run.kill()
        run.wait()
    assert judge("r3", "vh-r3", None, runs=registry.scan(), known_runs={"r3"}, server_now=1e9,
                 processes={"r3": process})[0] == "orphan"


@pytest.mark.parametrize("decoy_label", ["prod-database", None])
def test_a_create_answer_naming_another_instance_is_not_deleted_when_no_boot_read_judged_it(sim, tmp_path,
                                                                                             decoy_label):
    """The boot's first read fails (a 410 on the v0 path), so no read ever compared the named row's label with the
    run's before the teardown: the teardown must not DELETE what the create answer named on that answer alone."""
    from vast_harness.run.runner import GuardedRun
    from vast_harness.spec.profile import Step, load_driver_policy

    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[-1]
        body = {"image": "img", "disk": 10} | ({"label": decoy_label} if decoy_label else {})
        theirs = client.create_instance(offer.id, body).new_contract
    sim.set_faults("wrong_contract;v0_deprecated:1")
    spec = spec_for(sim, tmp_path)
    prof = spec.profile.model_copy(update={"steps": [Step(name="ok", run="true", timeout_s=10)]})
    spec = spec.model_copy(update={"profile": prof}).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        run.execute()
    assert not [c for c in sim.state()["calls"] if c["method"] == "DELETE" and str(theirs) in c["path"]]
    assert theirs in live(sim), "the teardown deleted an instance its create answer named but that is not its own"
    labels = run.tools.book.labels()
    ours = [i for i in sim.state()["instances"] if i["label"] in labels]
    assert ours and not any(i["live"] for i in ours), "the run's own instance was left billing"
