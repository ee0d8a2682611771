"""A create answer that names an instance whose label no read has shown (red team 42, F1): the run, its cap guard
and `reap` never DELETE it on that answer alone, and the run's own instance is still found by its label.

The simulator's `wrong_contract` fault makes the create answer name the account's oldest live instance (here "the
user's prod database", rented first on a fresh account); a read outage (`5xx:show`, `5xx:list`) or a read lag
(`read_lag`) keeps its row unread when the teardown, the guard or a reap starts. Every test is judged by the
simulator's own record (`/_sim/state`): the decoy live with no DELETE ever sent to it, and the run's own instance
deleted, or the run at exit 3 naming what it left for `reap`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from tests.harness.clirun import spawn
from vast_harness.actions.reap import reap_all
from vast_harness.console.output import Output
from vast_harness.errors import Interrupted
from vast_harness.records import CreatedInstance
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.ledger import Ledger
from vast_harness.state.registry import make_label
from vast_harness.vast.client import VastClient

SCALE = 0.01
SIM_OPTIONS = dict(seed=42, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")
PROD = "the user's prod database"
OK = [Step(name="ok", run="true", timeout_s=10)]


def account() -> str:
    """A fresh account of the simulator: its decoy is its oldest live instance, the one `wrong_contract` names."""
    return f"sim-f1-{uuid.uuid4().hex[:12]}"


def rent_decoy(sim: SimServer, key: str, label: str | None = PROD) -> int:
    """The user's own instance, made outside the harness, on the dearest offer: a price taken from its row shows."""
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = max(client.search_offers({"limit": 1000}), key=lambda o: o.dph_total or 0.0)
        body: dict[str, Any] = {"image": "postgres:16", "disk": 20} | ({"label": label} if label else {})
        made = client.create_instance(offer.id, body).new_contract
    assert made is not None
    return made


def row(sim: SimServer, instance_id: int) -> dict[str, Any]:
    return next(i for i in sim.state()["instances"] if i["id"] == instance_id)


def deletes_of(sim: SimServer, instance_id: int) -> list[str]:
    return [c["path"] for c in sim.state()["calls"]
            if c["method"] == "DELETE" and c["path"].rstrip("/").endswith(f"/{instance_id}")]


def own_rows(sim: SimServer, run_id: str) -> list[dict[str, Any]]:
    return [i for i in sim.state()["instances"] if (i["label"] or "").startswith(f"vh-{run_id}")]


def assert_left_alone(sim: SimServer, decoy: int) -> None:
    assert not deletes_of(sim, decoy), f"a DELETE went to instance {decoy}, which is not the run's"
    assert row(sim, decoy)["live"], f"instance {decoy}, which is not the run's, was destroyed"


def spec_for(sim: SimServer, tmp_path: Path, key: str, **caps: float) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", state_dir=tmp_path / "state",
                              proof_interval_s=0.1, **caps), environ={})
    prof = spec.profile.model_copy(update={"steps": OK})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(key)}
                           ).with_timings(teardown_margin_s=2.0)


def run(sim: SimServer, spec: RunSpec, key: str, *, on_created: Any = None, **state: float) -> tuple[GuardedRun, Any]:
    client = VastClient(key, base_url=sim.url, pacing_scale=SCALE)
    r = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), on_created=on_created)
    for name, value in state.items():
        setattr(r.state, name, value)
    try:
        return r, r.execute()
    finally:
        client.close()


def record(r: GuardedRun) -> dict[str, Any]:
    return json.loads((r.ev.dir / "harness-result.json").read_text())


def assert_own_gone_or_exit_3(sim: SimServer, r: GuardedRun, code: int, message: str) -> None:
    """Exit 130, 0, 1 or 6 say "deleted and proven absent": then nothing of the run's label may be live."""
    live = [i["id"] for i in own_rows(sim, r.run_id) if i["live"]]
    if code != 3:
        assert not live, f"exit {code} while the run's own instance(s) {live} still bill: {message}"
    else:
        assert "vast-e2e reap" in message, message


def assert_not_booked_or_priced(r: GuardedRun, sim: SimServer, decoy: int) -> None:
    """The record never lists the decoy as the run's, and no price of the run's comes from its row."""
    rec = record(r)
    assert decoy not in [i["instance_id"] for i in rec["instances"]], rec["instances"]
    assert str(decoy) not in rec["absence"]["per_instance"], rec["absence"]
    dph = row(sim, decoy)["dph_total"]
    assert not [p for p in rec["price_changes"] if p.get("billed_dph_usd") == pytest.approx(dph)], rec["price_changes"]


def ctrl_c(then: Any = None) -> Any:
    """`on_created`: Ctrl-C as soon as the create answered (after `then`, if given)."""
    def hook(_inst: CreatedInstance) -> None:
        if then is not None:
            then()
        raise Interrupted(signal.SIGINT)
    return hook


# ------------------------------------------------------------------------------------------------- F1a
def test_ctrl_c_in_a_read_outage_never_deletes_the_named_instance(sim, tmp_path):
    """F1a: Ctrl-C right after the create, while the per-id read and the list fail (3.5 s): no read has shown the
    named row's label when the teardown starts. It waits for a read, finds another label, and deletes only the
    instance that carries the run's."""
    key = account()
    decoy = rent_decoy(sim, key)
    sim.set_faults("wrong_contract")

    def outage() -> None:
        sim.set_faults("5xx:show:*;5xx:list:*")
        threading.Timer(3.5, lambda: sim.set_faults(None)).start()

    r, result = run(sim, spec_for(sim, tmp_path, key), key, on_created=ctrl_c(outage), teardown_budget_s=10.0)
    assert_left_alone(sim, decoy)
    assert_own_gone_or_exit_3(sim, r, result.exit_code, result.message)
    assert result.exit_code == 130, result.message  # the outage ended inside the budget: everything settled
    assert own_rows(sim, r.run_id) and not any(i["live"] for i in own_rows(sim, r.run_id))
    assert_not_booked_or_priced(r, sim, decoy)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_in_an_api_blip_never_deletes_the_named_instance_in_a_real_process(sim, tmp_path, sig):
    """F1a as the red team ran it: a real `vast-e2e` process, Vast's timings, the per-id read and the list each
    failing 4 times, the signal 3 s after the create (SIGTERM once went through the cap guard's DELETE)."""
    key = account()
    decoy = rent_decoy(sim, key)
    sim.set_faults("wrong_contract;5xx:show:4;5xx:list:4")
    proc = spawn("--profile", "smoke", "--max-usd", "0.5", "--max-minutes", "30", "--proof-interval", "0.5",
                 "--poll-interval", "0.25", "--api-url", sim.url, "--pacing-scale", str(SCALE),
                 home=tmp_path, key=key, stdout=subprocess.DEVNULL)
    assert wait_for_create(sim, key), "the run never sent its create"
    time.sleep(3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=200)
    assert_left_alone(sim, decoy)
    assert "Traceback" not in err, err[-3000:]
    ours = [i for i in sim.state()["instances"] if (i["label"] or "").startswith("vh-")]
    assert ours, "the run made no instance"
    if proc.returncode != 3:
        assert not [i["id"] for i in ours if i["live"]], (proc.returncode, err[-2000:])
    # 130; 1 when the boot read the decoy's label first (its create unresolved, the run's own found and deleted by
    # the sweep) and the signal came in the teardown, which it does not change; 3 when something is not settled
    assert proc.returncode in (1, 3, 130), err[-2000:]


def wait_for_create(sim: SimServer, key: str, timeout_s: float = 90.0) -> bool:
    """The run's create was answered: an instance of the account carries a `vh-` label."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if [i for i in sim.state()["instances"] if (i["label"] or "").startswith("vh-")]:
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------------------------- F1b
@pytest.mark.slow
@pytest.mark.parametrize("cut_by", ["cap", "boot_timeout"])
def test_a_read_outage_past_the_boot_deadline_never_deletes_the_named_instance(sim, tmp_path, cut_by):
    """F1b: no signal. The per-id read and the list fail for 9 s after the create while the boot's deadline (a short
    cap's, or the profile's boot timeout) comes first: neither the teardown, the cap guard nor a failed boot's
    teardown deletes what the create answer named; once reads answer, the run's own is found by its label."""
    key = account()
    decoy = rent_decoy(sim, key)
    sim.set_faults("wrong_contract")
    spec = spec_for(sim, tmp_path, key, max_minutes=0.12 if cut_by == "cap" else 5.0)  # 7.2 s: boot ends at 5.2 s
    if cut_by == "boot_timeout":
        spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"boot_timeout_s": 2.0})})

    def outage(_inst: CreatedInstance) -> None:
        sim.set_faults("5xx:show:*;5xx:list:*")
        threading.Timer(9.0, lambda: sim.set_faults(None)).start()

    r, result = run(sim, spec, key, on_created=outage, teardown_budget_s=15.0)
    assert_left_alone(sim, decoy)
    assert_own_gone_or_exit_3(sim, r, result.exit_code, result.message)
    assert own_rows(sim, r.run_id) and not any(i["live"] for i in own_rows(sim, r.run_id)), result.message
    assert_not_booked_or_priced(r, sim, decoy)
    if cut_by == "cap":
        assert result.exit_code == 6, result.message


# ------------------------------------------------------------------------------------------------- F1c
def test_ctrl_c_in_a_read_lag_deletes_only_the_runs_label_and_says_130_only_when_it_is_gone(sim, tmp_path):
    """F1c: the decoy was made a moment before the run, so it still lags; the run's own instance lags a little
    longer. Ctrl-C right after the create: the named row's label is read once its lag ends (another label: left
    alone), and the sweep for the run's label outlasts its own lag, so exit 130 is the truth."""
    key = account()
    sim.set_faults("read_lag:2")
    decoy = rent_decoy(sim, key)
    sim.set_faults("read_lag:4;wrong_contract")
    r, result = run(sim, spec_for(sim, tmp_path, key), key, on_created=ctrl_c(), teardown_budget_s=12.0)
    assert_left_alone(sim, decoy)
    assert_own_gone_or_exit_3(sim, r, result.exit_code, result.message)
    assert result.exit_code == 130, result.message
    assert_not_booked_or_priced(r, sim, decoy)


@pytest.mark.slow
def test_a_read_lag_past_the_budget_is_exit_3_naming_the_create_and_reap_then_finds_it(sim, tmp_path):
    """F1c when the lag outlasts the teardown: the named row stays unread and the run's label shows no row. The
    run deletes nothing, says exit 3 naming the unresolved create, the instance it left alone and `reap`; `reap`,
    once the lag is over, deletes the run's own (found by its label) and still leaves the decoy alone."""
    key = account()
    sim.set_faults("read_lag:12")
    decoy = rent_decoy(sim, key)
    sim.set_faults("read_lag:12;wrong_contract")
    spec = spec_for(sim, tmp_path, key)
    r, result = run(sim, spec, key, on_created=ctrl_c(), teardown_budget_s=3.0)
    assert result.exit_code == 3, result.message
    assert f"instance {decoy} named by the create answer" in result.message, result.message
    assert "left alone (not proven ours)" in result.message and "vast-e2e reap" in result.message
    assert_left_alone(sim, decoy)
    assert_not_booked_or_priced(r, sim, decoy)
    assert [i["live"] for i in own_rows(sim, r.run_id)] == [True]  # exit 3 was the truth
    time.sleep(max(0.0, row(sim, decoy)["created_at"] + 12.5 - time.time()))
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output(quiet=True)) == 0
    assert_left_alone(sim, decoy)
    assert [i["live"] for i in own_rows(sim, r.run_id)] == [False]


# ------------------------------------------------------------------------------------------------- F1d
def test_reap_reads_the_label_before_deleting_what_a_ledger_line_names(sim, tmp_path, monkeypatch):
    """F1d in a few seconds: a killed run's ledger names, under its label, the instance its create answer named,
    which still lags. `reap` finds its run dead but cannot read the row: it leaves it alone (exit 3, said), and
    after the lag it reads another label and still leaves it alone."""
    monkeypatch.setattr("vast_harness.caps.meter.TEARDOWN_MIN_S", 1.0)  # a reap that ends inside the lag
    key = account()
    spec = spec_for(sim, tmp_path, key)
    sim.set_faults("read_lag:3")
    decoy = rent_decoy(sim, key)
    run_id = "20261206T092926Z-e01df0"
    label = make_label(run_id, 0, time.time() - 60, left_s=60)  # a run whose cap is over: an orphan's label
    ledger = Ledger.for_spec(spec)
    ledger.append(run_id, "intent", label, offer_id=1)
    ledger.append(run_id, "created", label, offer_id=1, instance_id=decoy)
    out = Said()
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, out) == 3
    assert_left_alone(sim, decoy)
    assert any(f"instance {decoy}" in line and "left alone (not proven ours)" in line for line in out.said), out.said
    time.sleep(max(0.0, row(sim, decoy)["created_at"] + 3.2 - time.time()))
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output(quiet=True)) == 3  # its row carries another label: never deleted
    assert_left_alone(sim, decoy)


def test_reap_proves_an_id_no_read_ever_showed_absent_by_reads_alone_once_older_than_any_lag(sim, tmp_path):
    """A ledger line over an hour old names an id no read ever showed (its create answer was wrong, or its instance
    ended unseen): null reads count now, so reap proves it absent without sending it a DELETE, and settles it."""
    key = account()
    spec = spec_for(sim, tmp_path, key)
    ledger = Ledger.for_spec(spec)
    run_id = "20261206T010203Z-0a0b0c"
    label = make_label(run_id, 0, time.time() - 7200, left_s=60)
    ledger.append(run_id, "intent", label, offer_id=1)
    line = ledger.append(run_id, "created", label, offer_id=1, instance_id=987_654_321)
    lines = ledger.path.read_text().splitlines()  # both lines written two hours ago, by both clocks
    old = [json.loads(text) | {"t_unix": line.t_unix - 7200, "server_unix": (line.server_unix or line.t_unix) - 7200}
           for text in lines]
    ledger.path.write_text("".join(json.dumps(entry) + "\n" for entry in old))
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output(quiet=True)) == 0
    assert not deletes_of(sim, 987_654_321)
    absence = [e for e in Ledger.for_spec(spec).entries() if e.event == "absence"]
    assert [(e.instance_id, e.verdict) for e in absence] == [(987_654_321, "gone")]
    assert 987_654_321 not in Ledger.for_spec(spec).view().pending


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_9_then_reap_with_a_lagging_named_decoy(sim, tmp_path):
    """F1d as the red team ran it: a real run killed with -9 3 s after a create whose answer named the lagging
    decoy, then `reap` from the same state dir: the decoy is never deleted, and the run's own instance is deleted
    (found by its label) or the reap says exit 3."""
    key = account()
    sim.set_faults("read_lag:8")
    decoy = rent_decoy(sim, key)
    sim.set_faults("read_lag:8;wrong_contract")
    proc = spawn("--profile", "smoke", "--max-usd", "0.5", "--max-minutes", "5", "--proof-interval", "0.5",
                 "--poll-interval", "0.25", "--api-url", sim.url, "--pacing-scale", str(SCALE),
                 home=tmp_path, key=key, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for_create(sim, key), "the run never sent its create"
    time.sleep(3)
    proc.kill()
    proc.wait(timeout=30)
    spec = spec_for(sim, tmp_path, key).model_copy(update={"state_dir": tmp_path / "state"})
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        code = reap_all(spec, client, Output(quiet=True))
    assert_left_alone(sim, decoy)
    ours = [i for i in sim.state()["instances"] if (i["label"] or "").startswith("vh-")]
    assert ours
    assert code == 3 or not any(i["live"] for i in ours), code
    time.sleep(max(0.0, max(i["created_at"] for i in ours) + 9 - time.time()))  # every lag is over
    out = Said()
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        code = reap_all(spec, client, out)
    assert_left_alone(sim, decoy)
    assert not [i["id"] for i in sim.state()["instances"] if (i["label"] or "").startswith("vh-") and i["live"]], \
        (code, out.said)


class Said(Output):
    """The user's output, kept: every line reap printed or warned."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.said: list[str] = []

    def warn(self, message: str) -> None:
        self.said.append(message)

    def info(self, message: str) -> None:
        self.said.append(message)

    def reap_report(self, rows: Any, not_proven: list[str], *, ok: bool) -> None:
        self.said.extend(not_proven)


# ------------------------------------------------------------------------------------------------- what is shown
def test_the_report_and_the_notify_end_event_name_the_instance_that_was_not_the_runs(sim, tmp_path):
    """The create answer names the decoy; the boot's read shows its row with another label, so it is disowned. The
    record's `not_ours` is shown: a notice in report.html (summary and absence proof) and a field of the end event."""
    import jsonschema

    from tests.harness.receiver import Receiver

    key = account()
    decoy = rent_decoy(sim, key)
    sim.set_faults("wrong_contract")
    with Receiver() as rx:
        spec = spec_for(sim, tmp_path, key).model_copy(update={"notify": [rx.url("/ok/own")]})
        r, _result = run(sim, spec, key)
        bodies = rx.bodies("/ok")
    assert_left_alone(sim, decoy)
    why = record(r)["absence"]["not_ours"][str(decoy)]
    assert PROD in why, why
    end = bodies[-1]
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "notification.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(end)
    assert end["event"] in ("proven_gone", "not_proven_gone"), bodies
    assert end["outcome"]["not_ours"] == {str(decoy): why}, end["outcome"]
    report = (r.ev.dir / "report.html").read_text()
    summary = report.split('<table class="summary">')[1].split("</table>")[0]
    assert "not the run&#x27;s" in summary and f"instance {decoy}: " in summary, summary
    notice = report.split('<table class="not-ours">')[1].split("</table>")[0]
    assert f"<td>{decoy}</td>" in notice and "the user&#x27;s prod database" in notice, notice
    from vast_harness.reports.markdown import job_summary
    from vast_harness.reports.run import load_run

    page = job_summary(load_run(r.ev.dir))
    section = page.split("#### Not the run's")[1]
    assert f"| {decoy} |" in section and "prod database" in section, page
