"""How a kept host's hold ends when something other than `down` ends it, and `down` in the odd cases (red team
r45): a dead-man switch stopped (SIGSTOP) or killed by the user's own command, found at the start of the next
command and at the end of the one that did it; `down` of a hold past its deadline, on a full evidence disk, and
after a `down` that was killed mid-way; `up`'s floor of `--idle-minutes`. Each on the hold's own simulator (`up
--sim`) with real SSH hosts whose switch is the real onstart script.
"""

from __future__ import annotations

import errno
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from tests.harness.test_kept_attacks import live, record, spawn, stop_sims, store, up_held, wait_for, workdir
from vast_harness.state.held import Instant

__all__ = ["stop_sims"]  # the fixture, used by name

SWITCH_PID = "$(cat ~/.vh-deadman.pid)"


def gone_for_good(home: Path, url: str, instance_id: int | None, text: str) -> None:
    """Deleted and proven absent by the command (`instance N: gone`), the hold ended; its simulator, stopped with
    the hold's end, or showing the instance not live."""
    assert instance_id is not None
    assert f"instance {instance_id}: gone" in text, text[-3000:]
    assert record(home) is None, "the hold did not end"
    try:
        still = [i for i in live(url) if i["id"] == instance_id]
    except OSError:
        return  # the hold's simulator stopped with it
    assert not still, "the kept host is still live"


@pytest.mark.parametrize("sig", ["STOP", "KILL"])
def test_an_exec_that_stops_or_kills_the_switch_ends_the_hold_as_it_returns(tmp_path, stop_sims, sig):
    home = tmp_path
    held = up_held(home, stop_sims)
    p = cli("exec", "box", "--", "sh", "-c", f"kill -{sig} {SWITCH_PID}; echo done", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 1, text[-3000:]
    assert "stays held" not in text and "dead-man switch" in text, text[-3000:]
    assert ("stopped" if sig == "STOP" else "gone") in text, text[-3000:]
    gone_for_good(home, held.api_url, held.instance_id, text)


def test_a_switch_stopped_between_commands_ends_the_hold_at_the_next_one_never_armed(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims)
    # A process the exec leaves behind stops the switch once the exec has returned (its end check saw it run)
    p = cli("exec", "box", "--", "sh", "-c", f"(sleep 1.5; kill -STOP {SWITCH_PID}) >/dev/null 2>&1 &", home=home)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    time.sleep(2.5)
    p = cli("keep", "box", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 1, text[-3000:]
    assert "dead-man: armed" not in text and "stopped" in text, text[-3000:]
    gone_for_good(home, held.api_url, held.instance_id, text)


def test_down_of_a_hold_past_its_deadline_deletes_what_is_still_there(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims)
    # Past its deadline by the record, while its host is still there (a switch that did not act)
    store(home).update("box", lambda r: setattr(r, "idle_deadline", Instant.now(-5)))
    p = cli("exec", "box", "--", "true", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 2 and "vast-e2e down box" in text, text[-3000:]
    assert "Its dead-man switch deletes the host" not in text
    assert live(held.api_url)  # exec touched nothing
    p = cli("down", "box", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-3000:]
    assert f"instance {held.instance_id}: gone" in text
    gone_for_good(home, held.api_url, held.instance_id, text)


def test_down_of_a_hold_whose_switch_already_deleted_it_is_exit_0(tmp_path, stop_sims):
    home = tmp_path
    held = up_held(home, stop_sims, idle="0.2")
    assert held.idle_deadline is not None
    wait_for(lambda: not live(held.api_url), held.idle_deadline.left_s() + 10, "the switch's delete")
    p = cli("down", "box", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-3000:]
    assert "someone else" not in text and "dead-man switch" in text, text[-3000:]
    assert record(home) is None


def test_down_goes_ahead_on_a_full_evidence_disk(tmp_path, stop_sims, monkeypatch):
    home = tmp_path
    held = up_held(home, stop_sims)
    evidence = str(Path(held.evidence_dir).parent)
    real_write = os.write

    def write(fd: int, data: bytes) -> int:  # every write under the evidence directory: no room
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(evidence):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except FileNotFoundError:
            pass
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    p = cli("down", "box", home=home)
    text = p.stdout + p.stderr
    assert "nothing was rented" not in text, text[-3000:]
    # Deleted and proven gone all the same; exit 1 says the evidence (here the ledger beside it) is incomplete
    assert p.returncode == 1 and "deleting kept host box anyway" in text and "No space" in text, text[-3000:]
    assert "deleted and proven absent" in text, text[-3000:]
    gone_for_good(home, held.api_url, held.instance_id, text)


@pytest.mark.parametrize("which", ["the hold's", "its root", "steps"])
def test_a_hold_whose_evidence_directory_is_a_file_exec_refuses_and_down_deletes(tmp_path, stop_sims, which):
    """Red teams r46 F1, r47 F2: the hold's evidence directory (or the --evidence-dir above it) replaced by a
    file; `exec` and `down` ended in a traceback and exit 1 ("proven gone" for `down`), or `down` in exit 2, while
    the instance went on billing."""
    home = tmp_path
    held = up_held(home, stop_sims, "--evidence-dir", str(home / "ev"))
    evidence = {"the hold's": Path(held.evidence_dir), "its root": Path(held.evidence_dir).parent,
                "steps": Path(held.evidence_dir) / "steps"}[which]
    evidence.rename(evidence.with_name(evidence.name + ".moved"))
    evidence.write_text("not a directory\n")
    p = cli("exec", "box", "--", "true", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in text and "evidence" in text, text[-3000:]
    assert "stays held" in text and live(held.api_url), text[-3000:]
    p = cli("down", "box", home=home)
    text = " ".join((p.stdout + p.stderr).split())  # the console wraps its lines
    assert "Traceback" not in text and "deleting kept host box anyway" in text, text[-3000:]
    if which == "its root":  # its evidence goes to the state directory instead, written whole: exit 0
        assert p.returncode == 0 and "evidence goes to" in text, text[-3000:]
    else:
        assert p.returncode == 1 and "deleted and proven absent" in text, text[-3000:]
    gone_for_good(home, held.api_url, held.instance_id, text)


def test_two_downs_at_once_both_exit_0_and_the_record_says_proven_gone(tmp_path, stop_sims):
    """Red team r46 F2: the second of two `down`s at once spent two minutes failing to prove, exit 3 ("may still
    bill"), and overwrote the hold's record with that verdict and 30x the bill. One `down` at a time: the second
    waits for the first, then finds the hold ended."""
    home = tmp_path
    held = up_held(home, stop_sims)
    procs = [spawn("down", "box", home=home) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    texts = [" ".join((o + e).split()) for o, e in outs]
    assert [p.returncode for p in procs] == [0, 0], texts
    assert any("taken down by another `down`" in t for t in texts), texts
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert result["exit_code"] == 0 and result["absence"]["verdict"] == "gone", result
    assert record(home) is None


@pytest.mark.parametrize(("deadline", "switch_acted", "code"),
                         [("time cap", True, 0), ("idle", True, 0), ("time cap", False, 6)])
def test_down_of_a_hold_past_its_deadline_says_what_its_switch_did(tmp_path, stop_sims, deadline, switch_acted, code):
    """Red teams r46 F8, r47 F5: past its deadline the switch had deleted the host; `down` exited 6 saying "the cap
    guard sent the DELETE" (it never did), or recorded a cap overrun that never was (billed until `down` looked).
    The switch's deletion is `down`'s 0, billed until the deadline it was due by; a switch that did not act and a
    host that lived past the cap is the cap's 6 (never 0)."""
    home = tmp_path
    held = up_held(home, stop_sims)
    assert held.sim_key is not None

    def past(r):  # the hold as it stands 3 s past its idle deadline, or its time cap
        if deadline == "idle":
            r.idle_deadline = Instant.now(-3)
        else:
            r.t0 = Instant.now(-r.max_seconds - 3)
            r.cap_deadline = r.t0.plus(r.max_seconds)
            r.idle_deadline = None

    store(home).update("box", past)
    if switch_acted:
        delete = urllib.request.Request(f"{held.api_url}/api/v0/instances/{held.instance_id}/", method="DELETE",
                                        headers={"Authorization": f"Bearer {held.sim_key}"})
        with urllib.request.urlopen(delete, timeout=10) as answer:  # what the switch does, with its own key
            assert answer.status == 200
        wait_for(lambda: not live(held.api_url), 10, "the switch's DELETE")
    p = cli("down", "box", home=home)
    text = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == code and "cap guard sent" not in text, text[-3000:]
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert result["absence"]["verdict"] == "gone" and (result["over_cap"] is None) == switch_acted, result
    if switch_acted:
        assert f"its dead-man switch deleted it at the hold's {deadline} deadline" in text, text[-3000:]
    assert record(home) is None


def test_an_exec_whose_record_cannot_be_written_is_never_a_silent_0(tmp_path, stop_sims):
    """Red team r47 F7: `harness-result.json` replaced by a directory: `exec` exited 0 with no record, no word."""
    home = tmp_path
    held = up_held(home, stop_sims)
    result = Path(held.evidence_dir) / "harness-result.json"
    result.unlink(missing_ok=True)
    result.mkdir()
    (result / "x").write_text("keeps it a non-empty directory\n")
    p = cli("exec", "box", "--", "true", home=home)
    text = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and "harness-result.json" in text and "stays held" in text, text[-3000:]
    assert live(held.api_url) and record(home) is not None


def test_down_after_a_killed_down_is_exit_0_by_our_earlier_delete(tmp_path, stop_sims):
    """A `down` killed after its DELETE (red team r45: killed -9 right after "tearing down") leaves the record
    `ending` and the instance gone: the next `down` proves it gone, by that DELETE, not "someone else"."""
    home = tmp_path
    held = up_held(home, stop_sims)
    assert held.sim_key is not None
    # What the killed down left: the record `ending` (its first act), its DELETE sent (the hold's key)
    store(home).update("box", lambda r: (setattr(r, "state", "ending"), setattr(r, "message", "down")),
                       ending_ok=True)
    delete = urllib.request.Request(f"{held.api_url}/api/v0/instances/{held.instance_id}/", method="DELETE",
                                    headers={"Authorization": f"Bearer {held.sim_key}"})
    with urllib.request.urlopen(delete, timeout=10) as answer:
        assert answer.status == 200
    wait_for(lambda: not live(held.api_url), 10, "the killed down's DELETE")
    p = cli("down", "box", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 0 and "someone else" not in text, text[-3000:]
    assert "an earlier command of this hold" in text, text[-3000:]
    assert record(home) is None


@pytest.mark.parametrize("dry_run", [False, True])
def test_up_refuses_an_idle_minutes_below_the_floor_before_renting(tmp_path, dry_run):
    home = tmp_path
    p = cli("up", "tiny", "--sim", "--workdir", str(workdir(home)), "--max-minutes", "3", "--idle-minutes", "0.01",
            *(["--dry-run"] if dry_run else []), "--json", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 2 and "--idle-minutes" in text and "at least" in text, text[-3000:]
    assert record(home, "tiny") is None


def test_up_whose_setup_stops_the_switch_is_not_held(tmp_path, stop_sims):
    """`up`'s 0 means held: a hold that ended before `up` returned is never exit 0."""
    home = tmp_path
    p = cli("up", "box", "--sim", "--workdir", str(workdir(home)), "--max-minutes", "3", "--idle-minutes", "0.5",
            "--setup", f"kill -STOP {SWITCH_PID}", "--json", home=home)
    text = p.stdout + p.stderr
    assert p.returncode == 1, text[-3000:]
    assert json.loads(p.stdout)["message"] != "held"
    assert record(home) is None
