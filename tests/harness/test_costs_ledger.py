"""`costs`, `logs` and `report` follow the ledger, not one directory (issue 34, item 2): a run recorded before
the config file moved `evidence_dir` is still found with its dollars, a run whose ledger lines name its
evidence directory is found from any other, and a run killed with -9 and reaped gets an estimated cost
(create to DELETE at its quoted price), marked estimated, never $0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.clirun import ROOT, cli, spawn
from vast_harness.state.ledger import Ledger, LedgerEntry
from vast_harness.views.costs import collect, estimate_usd

SCALE = 0.01
KEY = "sim-costs-key"
SIM_OPTIONS = dict(seed=35, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)


def record(run_dir: Path, accrued_usd: float) -> None:
    (run_dir / "steps").mkdir(parents=True)
    (run_dir / "steps" / "s.log").write_text("hello from s\n")
    (run_dir / "steps.tsv").write_text("s\t0\n")
    (run_dir / "harness-result.json").write_text(json.dumps({
        "run_id": run_dir.name, "exit_code": 0, "accrued_usd": accrued_usd, "profile": "smoke",
        "api_url": "https://console.vast.ai", "instances": [{"instance_id": 5}]}))


def ledger_lines(ledger: Ledger, run_id: str, instance_id: int) -> None:
    ledger.append(run_id, "intent", f"vh-{run_id}", offer_id=1, api_url="https://console.vast.ai", account="a")
    ledger.append(run_id, "created", f"vh-{run_id}", offer_id=1, instance_id=instance_id,
                  api_url="https://console.vast.ai", account="a")


def test_costs_logs_and_report_find_records_the_config_moved_away_from(tmp_path):
    state = tmp_path / "state"
    old = "20260101T000000Z-0a0a0a"  # recorded in the state dir, before the config file set evidence_dir
    record(state / old, 0.25)
    ledger_lines(Ledger(state / "ledger.jsonl"), old, 5)
    moved = tmp_path / "ev"
    (tmp_path / "config" / "vast-harness").mkdir(parents=True)
    (tmp_path / "config" / "vast-harness" / "config.toml").write_text(f'evidence_dir = "{moved}"\n')
    new = "20260102T000000Z-0b0b0b"  # recorded in the config's evidence_dir; its lines name where
    record(moved / new, 0.5)
    ledger_lines(Ledger(state / "ledger.jsonl", evidence_dir=moved / new), new, 6)
    done = cli("costs", "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = {r["run_id"]: r for r in json.loads(done.stdout)["runs"]}
    assert runs[old]["accrued_usd"] == 0.25 and runs[new]["accrued_usd"] == 0.5  # neither "unrecorded"
    assert json.loads(done.stdout)["total"]["real"]["unrecorded_runs"] == 0
    assert cli("logs", old, home=tmp_path).stdout.endswith("hello from s\n")
    # from a third directory, the ledger's line names where the newer run is
    other = tmp_path / "elsewhere"
    other.mkdir()
    shown = cli("logs", new, "s", "--evidence-dir", str(other), home=tmp_path)
    assert shown.returncode == 0 and shown.stdout == "hello from s\n", shown.stderr
    rebuilt = cli("report", old[-6:], home=tmp_path)
    assert rebuilt.returncode == 0 and rebuilt.stdout.strip() == str(state / old / "report.html"), rebuilt.stderr


def line(t: float, run_id: str, event: str, **kw: object) -> LedgerEntry:
    return LedgerEntry.model_validate({"t_unix": t, "run_id": run_id, "event": event, "label": "vh-x"} | kw)


def test_estimate_is_create_to_delete_at_the_quoted_price_or_none():
    lines = [line(0, "r", "intent", offer_id=1, dph_usd=0.36), line(10, "r", "created", instance_id=9),
             line(3610, "reap-x", "delete_ack", instance_id=9), line(3620, "reap-x", "absence", instance_id=9,
                                                                     verdict="gone")]
    assert estimate_usd(lines) == pytest.approx(0.361)  # to the proof of absence, the last line: errs long
    assert estimate_usd(lines[:2]) is None  # never deleted: not an estimate, unrecorded
    # red team r6: the run's own DELETE answered 200 and deleted nothing; killed -9 before its re-read, then
    # the reap's DELETE deleted it: the span runs to the reap's lines, not the first acknowledgement
    noop = [*lines[:2], line(15, "r", "delete_ack", instance_id=9, detail="deleted"), *lines[2:]]
    assert estimate_usd(noop) == pytest.approx(0.361)
    # a reap of another run that happens to carry the same instance id (the simulator's seeded ids) is not ours
    other = [*lines, line(7210, "reap-y", "delete_ack", instance_id=9, label="vh-other")]
    assert estimate_usd(other) == pytest.approx(0.361)
    assert estimate_usd([line(0, "r", "intent", offer_id=1), *lines[1:]]) is None  # no price quoted


def test_the_estimate_bills_the_highest_price_the_run_recorded_from_the_create():
    # Red team r8 B3: a run killed with -9 after its reads saw the host bill 20x the search's price was
    # estimated at the search's price. Each higher price the meter took is a `repriced` line; the estimate
    # bills the highest from the create (when it rose is unknown), like the meter did.
    lines = [line(0, "r", "intent", offer_id=1, dph_usd=0.36), line(10, "r", "created", instance_id=9),
             line(20, "r", "repriced", instance_id=9, dph_usd=3.6), line(30, "r", "repriced", instance_id=9,
                                                                           dph_usd=1.8),
             line(3610, "reap-x", "delete_ack", instance_id=9)]
    assert estimate_usd(lines) == pytest.approx(3.6)
    # another label's line carrying the same instance id (the simulator's seeded ids) is not this run's price
    other = [*lines[:2], line(20, "r2", "repriced", instance_id=9, dph_usd=360.0, label="vh-other"), lines[-1]]
    assert estimate_usd(other) == pytest.approx(0.36)


def test_a_run_killed_during_its_create_is_estimated_from_its_intent_when_a_reap_finds_it_by_label():
    # Red team r10: killed with -9 while its PUT was out, the run wrote its intent and nothing else; a reap
    # found the instance by its label and deleted it. `costs` listed no run at all (no line of the run names an
    # instance). The reap's lines under the run's label name it; billing began no earlier than the intent.
    lines = [line(0, "r", "intent", offer_id=1, dph_usd=0.36),
             line(3600, "reap-x", "delete_ack", instance_id=9), line(3610, "reap-x", "absence", instance_id=9,
                                                                     verdict="gone")]
    assert estimate_usd(lines) == pytest.approx(0.361)


def test_costs_lists_a_run_killed_during_its_create_that_a_reap_found(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("20261204T000000Z-aaaaaa", "intent", "vh-20261204T000000Z-aaaaaa-o1", offer_id=1, dph_usd=0.36)
    ledger.append("reap-1", "delete_ack", "vh-20261204T000000Z-aaaaaa-o1", instance_id=9, detail="deleted")
    ledger.append("reap-1", "absence", "vh-20261204T000000Z-aaaaaa-o1", instance_id=9, verdict="gone")
    runs = collect(tmp_path, [tmp_path / "ledger.jsonl"])
    killed = [r for r in runs if r.run_id == "20261204T000000Z-aaaaaa"]
    assert len(killed) == 1 and killed[0].instances == [9] and killed[0].estimated, runs


@pytest.mark.slow
@pytest.mark.parametrize("faults", ["", "reprice_offer:20"])
def test_a_run_killed_with_9_and_reaped_gets_an_estimated_cost(clean_sim, tmp_path, faults: str):
    clean_sim.set_faults(faults)  # reprice_offer: the host bills 20x the search's price, its reads say so
    steps = ('[[steps]]\nname = "wait"\nrun = "sleep 60"\ntimeout_s = 120\nworkload = false\n')
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    (tmp_path / "p.toml").write_text(text[: text.index("[[steps]]")] + steps)
    run = spawn("--profile", "p.toml", "--api-url", clean_sim.url, "--pacing-scale", str(SCALE), "--poll-interval",
                "0.1", "--max-usd", "2", home=tmp_path, key=KEY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 90
        while not list((tmp_path / "state").glob("2*/steps/wait.log")) and time.monotonic() < end:
            time.sleep(0.2)
        assert list((tmp_path / "state").glob("2*/steps/wait.log")), "the step never started"
        time.sleep(1.0)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    reaped = cli("reap", "--api-url", clean_sim.url, "--pacing-scale", str(SCALE), "--proof-interval", "0.2",
                 home=tmp_path, key=KEY)
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    billed = max((i for i in clean_sim.state()["instances"] if str(i["label"]).startswith("vh-")),
                 key=lambda i: i["created_at"])  # this test's: the simulator outlives a test
    done = cli("costs", "--json", home=tmp_path)
    data = json.loads(done.stdout)
    killed = [r for r in data["runs"] if billed["id"] in r["instances"]]
    assert len(killed) == 1 and killed[0]["estimated"] is True, data["runs"]
    # the estimate spans create to DELETE at the quoted price: at least what the simulator billed for the time
    assert killed[0]["accrued_usd"] == pytest.approx(billed["billed_usd"], rel=0.5) and killed[0]["accrued_usd"] > 0
    assert killed[0]["accrued_usd"] >= billed["billed_usd"]  # an upper bound: the span errs long, the price high
    human = cli("costs", home=tmp_path).stdout
    assert "(estimated)" in human and "unrecorded" not in human.split("Per day")[0]
