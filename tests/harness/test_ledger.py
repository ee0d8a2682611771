"""The write-ahead ledger: checked, durable writes (no PUT without an intent on disk) and tolerant reads."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import httpx
import pytest
import respx

from vast_harness.console.output import Output
from vast_harness.errors import LedgerWriteError
from vast_harness.instance.lifecycle import CreateRequest, create
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.profile import load_driver_policy
from vast_harness.state.ledger import Ledger, LedgerTarget, account_fingerprint
from vast_harness.vast.client import VastClient

from .conftest import VAST_TEST_BASE, VAST_TEST_KEY


def _is_ledger_fd(fd: int, ledger: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(ledger)
    except OSError:
        return False


@pytest.fixture
def disk(monkeypatch):
    """Make writes to one file fail as a nearly full disk does: short, or ENOSPC. Other fds are untouched."""
    real_write = os.write
    state = {"path": None, "mode": None}

    def write(fd: int, data) -> int:
        if state["path"] is not None and _is_ledger_fd(fd, state["path"]):
            if state["mode"] == "short":
                return real_write(fd, bytes(data)[: max(1, len(data) // 2)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)

    def fail(path: Path, mode: str) -> None:
        state["path"], state["mode"] = path, mode

    return fail


def test_torn_last_line_does_not_swallow_the_next_intent(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append("r1", "intent", "vh-r1", offer_id=1)
    with path.open("ab") as fh:
        fh.write(b'{"t_unix": 1.0, "run_id": "r1", "event": "crea')  # killed mid-write
    ledger.append("r2", "intent", "vh-r2", offer_id=2)
    entries = ledger.entries()
    assert [e.label for e in entries] == ["vh-r1", "vh-r2"]
    assert [b.line_no for b in ledger.bad_lines] == [2]
    assert path.read_bytes().endswith(b"\n")


def test_bad_lines_are_skipped_and_reported_never_fatal(tmp_path):
    path = tmp_path / "ledger.jsonl"
    good = {"t_unix": 1.0, "run_id": "r", "event": "created", "label": "vh-r", "instance_id": 42}
    path.write_bytes(
        b"\xff\xfe not utf-8\n"
        + b"[1, 2]\n"
        + json.dumps(good | {"instance_id": "42"}).encode() + b"\n"  # wrong type: a string id
        + json.dumps(good | {"instance_id": True}).encode() + b"\n"
        + b"[" * 100_000 + b"\n"  # deep nesting
        + json.dumps(good).encode() + b"\n"
    )
    ledger = Ledger(path)
    view = ledger.view()
    assert list(view.pending) == [42]
    assert [b.line_no for b in view.bad_lines] == [1, 2, 3, 4, 5]
    assert "UTF-8" in view.bad_lines[0].reason


@pytest.mark.parametrize("mode", ["short", "enospc"])
def test_no_put_without_a_durable_intent(tmp_path, disk, mode):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    disk(path, mode)
    with respx.mock(base_url=VAST_TEST_BASE, assert_all_called=False) as router:
        put = router.put(url__regex=r"/api/v0/asks/\d+/").mock(return_value=httpx.Response(200, json={
            "success": True, "new_contract": 7}))
        with VastClient(VAST_TEST_KEY, base_url=VAST_TEST_BASE) as client, pytest.raises(LedgerWriteError):
            create(client, ledger, run_id="r", offer_id=5, lag_window_s=30.0,
                   request=CreateRequest(image="img", disk=8, label="vh-r", onstart=""))
        assert not put.called


def test_a_short_write_leaves_the_ledger_as_it_was(tmp_path, disk):
    # A half line left by a short write was harmless to the next append (it starts a fresh line) but was
    # still a torn record for every reader; the write is undone under the lock instead.
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append("r", "delete_ack", "vh-r", instance_id=3)
    before = path.read_bytes()
    disk(path, "short")
    ledger.append("r", "delete_ack", "vh-r", instance_id=4)
    assert ledger.write_failures and path.read_bytes() == before


def test_outcome_write_failure_is_recorded_not_raised(tmp_path, disk):
    """After the PUT, a full disk must not stop the create's follow-up or a teardown."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    disk(path, "enospc")
    ledger.append("r", "delete_ack", "vh-r", instance_id=3)
    assert ledger.write_failures and "delete_ack" in ledger.write_failures[0]


def test_a_run_whose_intent_cannot_be_written_rents_nothing(tmp_path, disk):
    from pydantic import SecretStr

    from vast_harness.sim import SimServer
    from vast_harness.spec.resolve import RunOptions, resolve

    with SimServer(seed=11, rate_scale=0.01, boot_seconds=0.1, num_offers=200) as sim:
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev"), environ={})
        spec = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr("sim-ledger-key")})
        disk(spec.state_dir / "ledger.jsonl", "short")
        with VastClient("k", base_url=sim.url, pacing_scale=0.01) as client:
            result = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True)).execute()
        assert result.exit_code == 2 and "ledger" in result.message and "nothing was rented" in result.message
        assert not sim.state()["instances"]
        assert not [c for c in sim.state()["calls"] if c["method"] == "PUT"]


def test_lines_carry_the_target_never_the_key(tmp_path):
    path = tmp_path / "ledger.jsonl"
    target = LedgerTarget(api_url="https://console.vast.ai", account=account_fingerprint(VAST_TEST_KEY))
    Ledger(path, target).append("r", "intent", "vh-r", offer_id=1)
    text = path.read_text()
    assert VAST_TEST_KEY not in text
    entry = Ledger(path).entries()[0]
    assert entry.target == target and len(entry.account or "") == 12


def test_a_create_answered_nothing_created_settles_its_label_and_a_5xx_does_not(tmp_path):
    # A create answered "nothing created" (410 no_such_ask) settles its label: reap does not keep looking for it
    # (exit 3) after an unproven teardown. A 5xx proves nothing, so its label stays open.
    from vast_harness.state.ledger import NOTHING_CREATED

    ledger = Ledger(tmp_path / "ledger.jsonl")
    for label in ("vh-a", "vh-b"):
        ledger.append("r", "intent", label, offer_id=1)
    ledger.append("r", "create_failed", "vh-a", offer_id=1, verdict=NOTHING_CREATED, detail="410 no_such_ask")
    ledger.append("r", "create_failed", "vh-b", offer_id=1, detail="502 (may still have created)")
    assert ledger.unproven() == ({}, {"vh-b"})


def test_reading_a_ledger_creates_no_directory_and_the_first_write_does(tmp_path):
    # Reading the ledger (`vast-e2e status` is read-only) creates no state directory; the first write does.
    path = tmp_path / "no" / "such" / "ledger.jsonl"
    ledger = Ledger(path)
    assert ledger.entries() == [] and ledger.view().pending == {}
    assert not (tmp_path / "no").exists()
    ledger.append("r1", "intent", "vh-x", offer_id=1)
    assert [e.event for e in Ledger(path).entries()] == ["intent"]


def test_a_disowned_instance_is_not_the_runs_and_reopens_its_create(tmp_path):
    """A create answer named an instance whose row carries another label: the ledger neither keeps it pending as
    the run's (reap would refuse it forever) nor counts it as what the run's label made (reap looks for that)."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("r", "intent", "vh-r", offer_id=1)
    ledger.append("r", "created", "vh-r", offer_id=1, instance_id=7)
    assert ledger.unproven() == ({7: ledger.entries()[1]}, set())
    ledger.append("r", "disowned", "vh-r", instance_id=7, detail="its row carries the label 'prod-database'")
    pending, unresolved = ledger.unproven()
    assert pending == {} and unresolved == {"vh-r"}
    ledger.append("r", "created", "vh-r", instance_id=8)  # the run's own, found by its label
    pending, unresolved = ledger.unproven()
    assert set(pending) == {8} and unresolved == set()
