"""`reap` against the simulator over real HTTP: the ledger's ids are deleted whatever the list does, unresolved
creates are looked up by label, other accounts' instances are never "proven" with this key, and the one-time
SSH keys of killed runs are removed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pydantic import SecretStr

from vast_harness.actions.reap import reap_all, remove_stale_key_dirs
from vast_harness.console.output import Output
from vast_harness.host.ssh import run_key_dir_prefix
from vast_harness.sim import SimServer
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-reap-key"
OTHER_KEY = "sim-other-account-key"


SIM_OPTIONS = dict(seed=9, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")  # faults cleared around each test


def spec_for(sim: SimServer, tmp_path: Path, key: str = KEY) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    return spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(key)})


def rent(sim: SimServer, label: str, key: str = KEY) -> int:
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        return client.create_instance(offer.id, {"image": "img", "disk": 10, "label": label}).new_contract


def live(sim: SimServer) -> set[int]:
    return {i["id"] for i in sim.state()["instances"] if i["live"]}


def reap(sim: SimServer, spec: RunSpec, key: str = KEY, **client_kw) -> int:
    with VastClient(key, base_url=sim.url, pacing_scale=SCALE, **client_kw) as client:
        return reap_all(spec, client, Output(quiet=True))


def test_ledger_ids_are_deleted_even_when_the_list_fails(sim, tmp_path, monkeypatch):
    monkeypatch.setattr("vast_harness.caps.meter.TEARDOWN_MIN_S", 1.0)
    spec = spec_for(sim, tmp_path)
    iid = rent(sim, "vh-listfail")
    Ledger.for_spec(spec).append("r", "created", "vh-listfail", offer_id=1, instance_id=iid)
    sim.set_faults("5xx:list:*:503")  # the live scan (and the proof's list reads) fail
    code = reap(sim, spec, max_retry_s=0.2)
    deletes = [c for c in sim.state()["calls"] if c["method"] == "DELETE" and str(iid) in c["path"]]
    assert deletes, "the ledger's id was not deleted because the list failed"
    assert iid not in live(sim)
    assert code == 3  # the proof and the scan could not complete: not proven, and it says so


def test_a_refused_key_with_nothing_in_the_ledger_is_exit_2_not_may_still_bill(sim, tmp_path):
    # A refused key is bad input (exit 2), as status and offers say for the same key: reap has read nothing, so
    # it must not say "NOT all proven absent" (exit 3, "an instance may still bill").
    from vast_harness.errors import AuthError, exit_code_for

    with SimServer(seed=9, rate_scale=SCALE, api_keys=["the-only-key"]) as strict:
        spec = spec_for(strict, tmp_path, key="not-that-key")
        with pytest.raises(AuthError) as refused:
            reap(strict, spec, key="not-that-key")
        assert exit_code_for(refused.value) == 2 and "401" in str(refused.value)
    # (with an instance of the ledger still to prove, it stays exit 3: that instance may still bill)


def test_unresolved_create_is_found_by_label(sim, tmp_path):
    spec = spec_for(sim, tmp_path)
    label = "vh-unresolved-label"  # a label of the harness's own shape, named by the ledger only
    iid = rent(sim, label)
    ledger = Ledger.for_spec(spec)
    ledger.append("r", "intent", label, offer_id=1)
    ledger.append("r", "create_unresolved", label, offer_id=1)
    assert reap(sim, spec) == 0
    assert iid not in live(sim)


def test_another_accounts_instance_is_never_proven_with_this_key(sim, tmp_path, capsys):
    owner = spec_for(sim, tmp_path, key=OTHER_KEY)
    iid = rent(sim, "vh-foreign", key=OTHER_KEY)
    Ledger.for_spec(owner).append("r", "created", "vh-foreign", offer_id=1, instance_id=iid)
    intruder = spec_for(sim, tmp_path, key=KEY)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = reap_all(intruder, client, Output())
    err = capsys.readouterr()
    assert code == 3
    assert "cannot be proven absent with this key" in err.out
    assert iid in live(sim)
    pending, _ = Ledger(owner.state_dir / "ledger.jsonl").unproven()
    assert iid in pending  # still named for its owner
    assert reap(sim, owner, key=OTHER_KEY) == 0 and iid not in live(sim)


def test_a_bad_ledger_line_does_not_stop_reap(sim, tmp_path):
    spec = spec_for(sim, tmp_path)
    iid = rent(sim, "vh-badline")
    path = spec.state_dir / "ledger.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xfe torn\n")
    Ledger.for_spec(spec).append("r", "created", "vh-badline", offer_id=1, instance_id=iid)
    assert reap(sim, spec) == 0
    assert iid not in live(sim)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_key_dirs_of_killed_runs_are_removed(tmp_path):
    dead = Path(tempfile.mkdtemp(prefix=run_key_dir_prefix("20250101T000000Z-abc123", pid=_dead_pid()), dir=tmp_path))
    mine = Path(tempfile.mkdtemp(prefix=run_key_dir_prefix("20250101T000000Z-def456"), dir=tmp_path))
    legacy_old, legacy_new = tmp_path / "vh-key-oldabcde", tmp_path / "vh-key-newabcde"  # before the pid was in it
    for d in (legacy_old, legacy_new):
        d.mkdir()
    for d in (dead, mine, legacy_old, legacy_new):
        (d / "id_ed25519").write_text("PRIVATE")
    os.utime(legacy_old, (0, 0))
    removed = remove_stale_key_dirs(tmp_path)
    assert set(removed) == {dead, legacy_old}
    assert mine.exists() and legacy_new.exists()


def test_reap_removes_key_dirs(sim, tmp_path, monkeypatch):
    keys = tmp_path / "tmp"
    keys.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(keys))
    dead = Path(tempfile.mkdtemp(prefix=run_key_dir_prefix("run", pid=_dead_pid()), dir=keys))
    assert reap(sim, spec_for(sim, tmp_path)) == 0
    assert not dead.exists()


@pytest.mark.parametrize("stop", ["target_state", "negative_balance"])
def test_a_stopped_instance_of_a_dead_run_is_an_orphan_and_deleted(sim, tmp_path, stop):
    # The dead-man switch cannot act while its container is stopped (Vast stops instances at a $0 balance;
    # storage bills until deletion): reap is what ends it.
    import time

    from vast_harness.state.registry import make_label

    spec = spec_for(sim, tmp_path)
    label = make_label("deadrun", 0, time.time() + 3600, left_s=3600)  # a cap not yet over: the run died early
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        body = {"image": "img", "disk": 10, "label": label}
        if stop == "target_state":
            body["target_state"] = "stopped"
        else:
            sim.backend.card_saved = True  # stopped at $0 and kept: storage bills until someone deletes it
            sim.set_faults("negative_balance:0.0")
        iid = client.create_instance(offer.id, body).new_contract
        deadline = time.monotonic() + 5
        while (row := client.get_instance(iid)) is None or row.actual_status != "stopped":
            assert time.monotonic() < deadline, row
            time.sleep(0.05)
    Ledger.for_spec(spec).append("deadrun", "created", label, offer_id=offer.id, instance_id=iid)  # it ended
    for account in sim.backend.accounts.values():
        account.charged_usd = 0.0  # the balance is back: reap's own calls are not refused
    sim.backend.card_saved = False
    assert reap(sim, spec) == 0
    assert iid not in live(sim)


def test_a_reap_records_the_price_its_list_shows_so_costs_estimates_a_killed_run_at_it(sim, tmp_path, monkeypatch):
    # Red team r9 B4: a run killed with -9 before any read of its instance (so before it learnt that the host
    # bills 50x the search's price); the reap read the row at the higher price but wrote no line of it, and
    # `costs` estimated the run at the search's price, 42x under the bill. The reap writes a `repriced` line.
    from vast_harness.views.costs import estimate_usd

    monkeypatch.setattr("vast_harness.caps.meter.TEARDOWN_MIN_S", 1.0)
    spec = spec_for(sim, tmp_path)
    iid = rent(sim, "vh-killedrepriced")
    searched = sim.backend.instances[iid].offer["dph_total"]
    sim.backend._reprice(sim.backend.instances[iid], 50.0)
    ledger = Ledger.for_spec(spec)
    ledger.append("r-killed", "intent", "vh-killedrepriced", offer_id=1, dph_usd=searched)
    ledger.append("r-killed", "created", "vh-killedrepriced", offer_id=1, instance_id=iid)
    assert reap(sim, spec) == 0
    billed = next(i["billed_usd"] for i in sim.state()["instances"] if i["id"] == iid)
    lines = [e for e in ledger.entries() if e.instance_id == iid or e.label == "vh-killedrepriced"]
    assert any(e.event == "repriced" and e.dph_usd == pytest.approx(50 * searched) for e in lines), lines
    estimate = estimate_usd(lines)
    assert estimate is not None and estimate >= billed > 0


@pytest.mark.parametrize("recorded", [False, True])
def test_an_outbid_husk_of_a_dead_run_is_named_a_husk_and_deleted_with_proof(sim, tmp_path, capsys, recorded):
    # A run killed while its interruptible host was outbid leaves a husk: stopped, storage billing, and it may
    # resume by itself. Reap names it as one (the row is a bid and reads paused; or the run's ledger says outbid)
    # and deletes it with a proof of absence.
    import json
    import time

    from vast_harness.state.registry import make_label

    spec = spec_for(sim, tmp_path)
    label = make_label("deadbid", 0, time.time() + 3600, left_s=3600)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        body = {"image": "img", "disk": 10, "label": label}
        if not recorded:
            body["price"] = offer.min_bid_usd_per_h or 0.05
        iid = client.create_instance(offer.id, body).new_contract
        sim.backend._outbid(sim.backend.instances[iid])  # the bid book, at once (on-demand too, for the ledger case)
        row = client.get_instance(iid)
        assert row is not None and row.paused is not None and row.is_bid is (not recorded)
    ledger = Ledger.for_spec(spec)
    ledger.append("deadbid", "created", label, offer_id=offer.id, instance_id=iid)
    if recorded:
        ledger.append("deadbid", "outbid", label, instance_id=iid, detail="reads stopped")
    capsys.readouterr()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        code = reap_all(spec, client, Output(json_mode=True))
    answer = json.loads(capsys.readouterr().out)
    assert code == 0, answer
    assert answer["husks"] == [iid] and answer["reaped"] == {str(iid): "gone"}, answer
    assert iid not in live(sim)
    proof = json.loads((Path(answer["evidence_dir"]) / "absence-proof.json").read_text())
    assert proof["husks"] == [iid] and proof["orphans"][str(iid)].startswith("husk: ")


def test_a_stopped_on_demand_instance_is_not_called_a_husk(sim, tmp_path, capsys):
    import json
    import time

    from vast_harness.state.registry import make_label

    spec = spec_for(sim, tmp_path)
    label = make_label("deadstop", 0, time.time() + 3600, left_s=3600)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        iid = client.create_instance(offer.id, {"image": "img", "disk": 10, "label": label,
                                                "target_state": "stopped"}).new_contract
    Ledger.for_spec(spec).append("deadstop", "created", label, offer_id=offer.id, instance_id=iid)
    capsys.readouterr()
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output(json_mode=True)) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["husks"] == [] and answer["reaped"] == {str(iid): "gone"}, answer
