"""Kept hosts (`vast-e2e up`, `exec`, `keep`, `down`, `ssh`; docs/kept-host.md) on the simulator over loopback,
with real SSH hosts whose dead-man switch is the real onstart script: the two "done when" cycles (up, three execs
and the idle switch, then reap's proof; up, exec, down), each bad input, and what `status`, `reap` and `costs`
make of a hold. Processes of their own (kill -9, two at once, a signal) are in test_kept_attacks.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clirun import SIM_PACING_SCALE, cli
from vast_harness.sim import SimServer
from vast_harness.state.held import HeldHost, HeldStore, Instant

SIM_OPTIONS = dict(seed=11, rate_scale=0.01, num_offers=300, boot_seconds=0.3)
KEY = "kept-key-1"
FAST = ("--proof-interval", "0.5", "--poll-interval", "0.25")


def api(sim: SimServer) -> tuple[str, ...]:
    return ("--api-url", sim.url, "--pacing-scale", SIM_PACING_SCALE)


def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text("import os\nprint('files:', ' '.join(sorted(os.listdir('.'))))\n")
    (wd / "data.txt").write_text("x" * 5000)
    (wd / "old.txt").write_text("to be removed")
    return wd


def up(home: Path, name: str, wd: Path, sim: SimServer, *extra: str, minutes: str = "4",
       idle: str = "0.25") -> Any:
    return cli("up", name, "--workdir", str(wd), "--max-minutes", minutes, "--idle-minutes", idle, *FAST, *api(sim),
               *extra, home=home, key=KEY)


def run_exec(home: Path, name: str, sim: SimServer | None, *command: str, options: tuple[str, ...] = (),
             key: str = KEY) -> Any:
    where = api(sim) if sim is not None else ()
    return cli("exec", name, *options, *where, "--poll-interval", "0.25", "--", *command, home=home, key=key)


def record(home: Path, name: str, *, sim: bool = False) -> HeldHost | None:
    return HeldStore(home / "state" / ("sim" if sim else "")).load(name)


def instance(sim: SimServer, instance_id: int) -> dict[str, Any]:
    return next(i for i in sim.state()["instances"] if i["id"] == instance_id)


def wait_gone(sim: SimServer, instance_id: int, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        inst = instance(sim, instance_id)
        if not inst["live"]:
            return inst
        time.sleep(0.2)
    raise AssertionError(f"instance {instance_id} still live after {within_s} s: {instance(sim, instance_id)}")


@pytest.mark.slow  # waits for the host's 15 s idle switch
def test_up_three_execs_then_the_idle_switch_deletes_it_and_reap_proves_it(tmp_path, sim):
    """Done when (1): up, exec x3, idle autostop; every host proven absent within the caps."""
    home, wd = tmp_path, workdir(tmp_path)
    p = up(home, "box", wd, sim)
    assert p.returncode == 0, p.stderr[-3000:]
    held = record(home, "box")
    assert held is not None and held.state == "held" and held.instance_id is not None
    assert sorted(held.manifest) == ["data.txt", "old.txt", "train.py"]
    # 1: nothing changed since the up; 2: one file changed, one removed; 3: one file added
    p = run_exec(home, "box", sim, "python", "train.py")
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    assert "nothing changed since the last upload" in text and "files: data.txt old.txt train.py" in text
    (wd / "data.txt").write_text("y" * 5000)
    (wd / "old.txt").unlink()
    p = run_exec(home, "box", sim, "python", "train.py")
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    assert "upload: 1 changed file(s)" in text and "1 removed" in text
    assert "files: data.txt train.py" in text  # the host lost what the workdir lost
    (wd / "new.txt").write_text("new")
    p = run_exec(home, "box", sim, "python", "train.py", options=("--artifact", "new.txt"))
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    assert "upload: 1 changed file(s)" in text and "files: data.txt new.txt train.py" in text
    held = record(home, "box")
    assert held is not None and held.execs == 3 and held.last_exec_rc == 0 and not held.exec_unfinished
    assert sorted(held.manifest) == ["data.txt", "new.txt", "train.py"]
    hold_dir = Path(held.evidence_dir)
    assert (hold_dir / "artifacts" / "new.txt").read_text() == "new"
    tsv = (hold_dir / "steps.tsv").read_text().split()
    assert [tsv[i] for i in range(0, len(tsv), 3)] == ["exec-1", "exec-2", "exec-3"]  # the up had no --setup
    # Held: live, and a reap leaves it alone before its deadline
    assert instance(sim, held.instance_id)["live"]
    p = cli("reap", *api(sim), "--proof-interval", "0.5", home=home, key=KEY)
    assert p.returncode == 0, p.stderr[-2000:]
    assert instance(sim, held.instance_id)["live"] and "kept host box, held" in p.stdout + p.stderr
    p = cli("costs", "--json", home=home)  # one run, its dollars the last command's figure, so far
    assert [r["held"] for r in json.loads(p.stdout)["runs"] if r["run_id"] == held.hold_id] == [True]
    # No command: its switch deletes it at its idle deadline, with no process of ours alive
    assert held.idle_deadline is not None
    gone = wait_gone(sim, held.instance_id, within_s=held.idle_deadline.left_s() + 10)
    late_s = gone["destroyed_at"] - (time.time() + held.idle_deadline.left_s())
    assert -2.0 < late_s < 6.0, late_s  # on time: the switch re-reads its deadline a quarter of the idle apart
    assert gone["billed_seconds"] <= held.max_seconds and gone["billed_usd"] <= held.max_usd
    # reap proves it absent and ends the hold; costs counts the hold as one run, an upper bound of the bill
    p = cli("reap", *api(sim), "--proof-interval", "0.5", home=home, key=KEY)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the hold ended (deleted by its dead-man switch" in p.stdout + p.stderr
    assert record(home, "box") is None and not (home / "state" / "held" / "box.key").exists()
    result = json.loads((hold_dir / "harness-result.json").read_text())
    assert result["absence"]["verdict"] == "gone" and result["profile"] == "kept"
    assert gone["billed_usd"] <= result["accrued_usd"] <= held.max_usd
    p = cli("costs", "--json", home=home)
    runs = [r for r in json.loads(p.stdout)["runs"] if r["run_id"] == held.hold_id]
    assert len(runs) == 1 and runs[0]["accrued_usd"] == result["accrued_usd"] and not runs[0]["held"]


def test_up_exec_down_under_sim_with_its_own_simulator(tmp_path):
    """Done when (2), under --sim: the simulator outlives `up`; down proves the host gone and stops it."""
    home, wd = tmp_path, workdir(tmp_path)
    p = cli("up", "box", "--sim", "--workdir", str(wd), "--setup", "echo set-up-ran > marker",
            "--max-minutes", "5", "--idle-minutes", "2", home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    held = record(home, "box", sim=True)
    assert held is not None and held.sim and held.sim_pid is not None
    p = cli("exec", "box", "--", "cat", "marker", home=home)  # no --sim: the hold knows where it is
    assert p.returncode == 0 and "set-up-ran" in p.stdout + p.stderr, p.stderr[-3000:]
    p = cli("status", "--sim", "--json", home=home)
    (row,) = json.loads(p.stdout)["rows"]
    assert row["held"] == "box" and row["state"] == "held" and row["accrued_usd"] <= held.max_usd
    p = cli("down", "box", home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "gone" in p.stdout and "kept host box is down" in p.stdout
    assert record(home, "box", sim=True) is None
    result = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert result["absence"]["verdict"] == "gone" and result["exit_code"] == 0
    deadline = time.monotonic() + 10
    while _alive(held.sim_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(held.sim_pid), "down left the hold's simulator running"


@pytest.fixture
def sim_hold(tmp_path: Path) -> Iterator[tuple[Path, HeldHost]]:
    """A kept host `box` under --sim (its own simulator, the simulator's timings), down at the end if still held."""
    home, wd = tmp_path, workdir(tmp_path)
    p = cli("up", "box", "--sim", "--workdir", str(wd), "--max-minutes", "5", "--idle-minutes", "1", home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    held = record(home, "box", sim=True)
    assert held is not None
    yield home, held
    if record(home, "box", sim=True) is not None:
        HeldStore(home / "state" / "sim").update("box", lambda r: setattr(r, "idle_deadline", None))
        cli("down", "box", home=home)


def sim_instance(held: HeldHost) -> dict[str, Any]:
    with urllib.request.urlopen(f"{held.api_url}/_sim/state", timeout=10) as answer:
        state = json.load(answer)
    return next(i for i in state["instances"] if i["id"] == held.instance_id)


def test_a_failing_command_keeps_the_host_and_exits_like_a_step(sim_hold):
    home, held = sim_hold
    p = cli("exec", "box", "--", "sh", "-c", "echo out; exit 3", home=home)
    assert p.returncode == 1 and "rc=3" in p.stdout + p.stderr and "stays held" in p.stdout + p.stderr
    after = record(home, "box", sim=True)
    assert after is not None and after.state == "held" and after.last_exec_rc == 3
    assert sim_instance(held)["live"]
    assert cli("exec", "box", "--", "true", home=home).returncode == 0
    p = cli("down", "box", home=home)
    assert p.returncode == 0 and f"instance {held.instance_id}: gone" in p.stdout, p.stderr[-2000:]
    assert record(home, "box", sim=True) is None


def test_keep_pushes_the_idle_deadline_never_the_caps(sim_hold):
    home, before = sim_hold
    assert before.idle_deadline is not None and before.host_cap_epoch is not None
    time.sleep(1.5)
    p = cli("keep", "box", home=home)
    assert p.returncode == 0, p.stderr[-2000:]
    after = record(home, "box", sim=True)
    assert after is not None and after.idle_deadline is not None and after.host_cap_epoch is not None
    assert after.idle_deadline.mono > before.idle_deadline.mono + 1.0  # pushed
    assert after.cap_deadline == before.cap_deadline  # the cap's, never
    assert after.host_cap_epoch <= before.host_cap_epoch  # the switch's cap: tightened at most
    assert after.host_idle_epoch is not None and before.host_idle_epoch is not None
    assert after.host_idle_epoch > before.host_idle_epoch


@pytest.mark.parametrize("case", ["unknown", "bad-name", "held-twice", "expired", "foreign-url"])
def test_bad_input_is_exit_2_listing_the_held_hosts(sim_hold, case):
    home, held = sim_hold
    if case == "unknown":
        p = cli("exec", "nope", "--", "true", home=home)
        q = cli("down", "nope", home=home)
        assert q.returncode == 2 and "box (instance" in q.stdout + q.stderr
    elif case == "bad-name":
        p = cli("exec", "No_Such", "--", "true", home=home)
    elif case == "held-twice":
        p = cli("up", "box", "--sim", "--workdir", held.workdir or ".", home=home)
    elif case == "expired":  # its deadline passed (moved back in the record): exec refuses it, pointing to down
        store = HeldStore(home / "state" / "sim")
        store.update("box", lambda r: setattr(r, "idle_deadline", Instant.now(-5)))
        p = cli("exec", "box", "--", "true", home=home)
        assert "past its deadline" in p.stdout + p.stderr and "vast-e2e down box" in p.stdout + p.stderr
    else:
        p = cli("exec", "box", "--api-url", "http://127.0.0.1:9", "--", "true", home=home, key=KEY)
    text = p.stdout + p.stderr
    assert p.returncode == 2, text[-2000:]
    if case != "bad-name":
        assert "box (instance" in text, text[-2000:]  # the held hosts are listed
    assert sim_instance(held)["live"]  # a refusal touches nothing


def test_exec_with_a_key_of_another_account_is_refused(tmp_path, sim):
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, "box", wd, sim, idle="1").returncode == 0
    held = record(home, "box")
    assert held is not None
    p = run_exec(home, "box", sim, "true", key="another-account")
    assert p.returncode == 2 and "another account" in p.stdout + p.stderr and "box (instance" in p.stdout + p.stderr
    assert instance(sim, held.instance_id or 0)["live"]


@pytest.mark.slow  # the liar's absence proof waits out Vast's 30 s read-lag window
def test_up_takes_a_runs_receipt_and_replaces_a_lying_host_then_each_exec_finds_it(tmp_path, clean_sim):
    """The same rent as a run's: a host that fails its receipt is deleted and the next offer held; the host's
    first idle deadline leaves the receipt its budget; every exec's record and steps have the up's receipt."""
    sim, home, wd = clean_sim, tmp_path, workdir(tmp_path)
    sim.set_faults("pcie_slow:0.3:1")  # the first host's host<->device copies at 30% of its offer's pcie_bw
    p = up(home, "box", wd, sim, idle="0.25")
    assert p.returncode == 0, p.stderr[-3000:]
    held = record(home, "box")
    assert held is not None and held.instance_id is not None and held.receipt is not None
    assert held.receipt_path is not None
    liar, honest = sorted((i for i in sim.state()["instances"] if held.hold_id in (i["label"] or "")),
                          key=lambda i: i["created_at"])
    assert liar["receipt_faults"] and not liar["live"] and honest["live"] and honest["id"] == held.instance_id
    assert held.receipt.instance_id == honest["id"] and held.receipt.verdict == "passed"
    up_record = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert [r["instance_id"] for r in up_record["receipts_refused"]] == [liar["id"]]
    # The onstart's idle deadline: the idle time, the connect's minute and the receipt's 90 s budget and 20 s grace
    idle_first_s = int(re.search(r"\$\(date \+%s\)\+(\d+)\)\) > ~/\.vh-deadman\.idle",
                                 sim.backend.instances[honest["id"]].onstart).group(1))  # type: ignore[union-attr]
    assert idle_first_s >= 15 + 60 + 90 + 20, idle_first_s
    p = run_exec(home, "box", sim, "sh", "-c", 'test -s "$VH_RECEIPT" && echo "receipt at $VH_RECEIPT"')
    assert p.returncode == 0 and "receipt at " in p.stdout + p.stderr, (p.stdout + p.stderr)[-2000:]
    exec_record = json.loads((Path(held.evidence_dir) / "harness-result.json").read_text())
    assert exec_record["receipt"]["instance_id"] == honest["id"] and exec_record["receipt"]["verdict"] == "passed"
    # no `down`: its proof takes the real read-lag window; the switch deletes the host 15 s after this exec


def test_exec_uploads_by_a_runs_rules_never_the_key_file_a_credential_only_by_include(tmp_path, sim):
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, "box", wd, sim, idle="1").returncode == 0
    key_file = wd / "apikey.txt"  # the exec's own key file, inside the workdir: no name says it is a key
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    (wd / ".env").write_text("HF_TOKEN=hf_not_for_the_host\n")
    (wd / "notes.txt").write_text(f"my key: {KEY}\n")  # a copy of the account's key, whatever the file's name
    listing = ("sh", "-c", "echo FILES: $(ls -A)")

    def on_host(text: str) -> list[str]:
        found = re.search(r"FILES: (.*)", text)
        assert found is not None, text[-2000:]
        return found.group(1).split()

    p = run_exec(home, "box", sim, *listing, options=("--key-file", str(key_file)))
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-2000:]
    assert "left out of the upload" in text and "apikey.txt (" in text and ".env (" in text
    assert "notes.txt (holds the account's API key" in " ".join(text.split())
    assert on_host(text) == ["data.txt", "old.txt", "train.py"]
    held = record(home, "box")
    assert held is not None and "apikey.txt" not in held.manifest and ".env" not in held.manifest
    p = run_exec(home, "box", sim, *listing, options=("--key-file", str(key_file), "--include", ".env"))
    text = p.stdout + p.stderr
    assert p.returncode == 0 and "upload: 1 changed file(s)" in text, text[-2000:]
    assert on_host(text) == [".env", "data.txt", "old.txt", "train.py"]
    p = run_exec(home, "box", sim, "true", options=("--key-file", str(key_file), "--include", "apikey.txt"))
    assert p.returncode == 2 and "never uploaded" in " ".join((p.stdout + p.stderr).split()), p.stderr[-2000:]
    held = record(home, "box")
    assert held is not None and ".env" in held.manifest and "apikey.txt" not in held.manifest
    (wd / "data.txt").write_text(f"now with the key: {KEY}\n")  # a file the host has: its copy goes too
    p = run_exec(home, "box", sim, *listing, options=("--key-file", str(key_file), "--include", ".env"))
    text = p.stdout + p.stderr
    assert p.returncode == 0 and on_host(text) == [".env", "old.txt", "train.py"], text[-2000:]
    held = record(home, "box")
    assert held is not None and "data.txt" not in held.manifest


def test_exec_upload_leaves_out_a_key_in_a_name_or_utf16_and_the_r45_credentials_as_a_run_does(tmp_path, sim):
    """Red team r45 #5 and #6 through exec's delta upload (the same selection as a run's): none of these reach the
    kept host, each is named on the console."""
    home, wd = tmp_path, workdir(tmp_path)
    assert up(home, "box", wd, sim, idle="1").returncode == 0
    (wd / f"name-{KEY}").write_text("nothing secret inside\n")
    (wd / "k_utf16").write_bytes(KEY.encode("utf-16"))
    (wd / ".vault-token").write_text("hvs.not-for-the-host\n")
    (wd / ".huggingface").mkdir()
    (wd / ".huggingface" / "token").write_text("hf_not_for_the_host\n")
    (wd / "aws.ini").write_text("[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
                                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n")
    (wd / "new.txt").write_text("new")
    p = run_exec(home, "box", sim, "sh", "-c", "echo FILES: $(find . -type f | sort)")
    text = p.stdout + p.stderr
    assert p.returncode == 0 and "upload: 1 changed file(s)" in text, text[-2000:]
    found = re.search(r"FILES: (.*)", text)
    assert found is not None and found.group(1).split() == ["./data.txt", "./new.txt", "./old.txt", "./train.py"], \
        text[-2000:]
    said = " ".join(text.split())
    for shown in ("name-*** (its name holds the account's API key)", "k_utf16 (holds the account's API key)",
                  ".vault-token (Vault token", ".huggingface/token (Hugging Face token",
                  "aws.ini (cloud credentials (by its content)"):
        assert shown in said, (shown, said[-2000:])
    assert KEY not in text
    held = record(home, "box")
    assert held is not None and sorted(held.manifest) == ["data.txt", "new.txt", "old.txt", "train.py"]


def test_a_sim_holds_exec_leaves_out_and_masks_the_key_file_its_up_was_given(tmp_path: Path) -> None:
    """Red team r46 F3: `up --sim --key-file K` left out the files holding K; the next `exec` (a `--sim` hold's
    commands need no flags) uploaded them and printed K in clear on the console and in its step log."""
    home, wd = tmp_path, workdir(tmp_path)
    secret = "vk7Q2mZr9XwL4pT8sN3bH6dF1aJ0cE5gUyKqV"
    key_file = home / "key"
    key_file.write_text(secret + "\n")
    key_file.chmod(0o600)
    (wd / "copy_of_key.txt").write_text(f"my key is {secret}\n")
    p = cli("up", "box", "--sim", "--key-file", str(key_file), "--workdir", str(wd), "--max-minutes", "5",
            "--idle-minutes", "1", home=home)
    assert p.returncode == 0 and "copy_of_key.txt" in p.stdout + p.stderr, p.stderr[-3000:]
    try:
        (wd / "new.txt").write_text(f"also {secret}\n")
        p = cli("exec", "box", "--", "sh", "-c", "ls; echo said $(cat new.txt copy_of_key.txt 2>&1)", home=home)
        text = p.stdout + p.stderr
        assert p.returncode == 0 and secret not in text, text[-3000:]
        said = " ".join(text.split())
        assert "copy_of_key.txt (holds the account's API key)" in said and "new.txt (holds" in said, said[-3000:]
        held = record(home, "box", sim=True)
        assert held is not None and "copy_of_key.txt" not in held.manifest and "new.txt" not in held.manifest
        for log in Path(held.evidence_dir).rglob("*.log"):
            assert secret not in log.read_text(errors="replace"), log
        # Red team r47 F1: the key file rewritten (or moved, or removed) after the up: refused, never uploaded
        key_file.write_text("another-key-altogether-0123456789\n")
        p = cli("exec", "box", "--", "cat", "new.txt", home=home)
        text = " ".join((p.stdout + p.stderr).split())
        assert p.returncode == 2 and "no longer holds that key" in text and secret not in text, text[-3000:]
        key_file.unlink()
        given = home / "same-key"
        given.write_text(secret + "\n")
        p = cli("exec", "box", "--key-file", str(given), "--", "ls", home=home)  # that key again: it goes on
        text = p.stdout + p.stderr
        assert p.returncode == 0 and "new.txt" not in text.replace("new.txt (holds", ""), text[-3000:]
    finally:
        p = cli("down", "box", home=home)  # the key file gone: `down` warns and deletes all the same
        assert p.returncode == 0 and "no longer holds that key" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]


def test_ssh_runs_a_command_and_a_shell_with_the_holds_key(sim_hold):
    home, held = sim_hold
    p = cli("ssh", "box", "--", "cat", "vh/work/data.txt", home=home)
    assert p.returncode == 0, p.stderr[-2000:]
    p = cli("ssh", "box", home=home)  # a shell, its commands from stdin (empty: it ends)
    assert p.returncode == 0, p.stderr[-2000:]
    after = record(home, "box", sim=True)
    assert after is not None and after.state == "held"


def test_the_manifest_is_what_was_sent_even_for_a_file_changed_while_it_was_packed(tmp_path, monkeypatch):
    """The host has the bytes that were packed: a file edited after it was hashed and before it was packed is
    recorded as sent, so the next exec sends the edit again only if it changes once more."""
    from vast_harness.host import bundle as bundle_mod
    from vast_harness.spec.workdir import select_workdir

    wd = workdir(tmp_path)
    selection = select_workdir(wd)
    full = bundle_mod.build_workdir_bundle(selection)
    assert bundle_mod.bundle_manifest(full) == bundle_mod.file_manifest(selection)[0]  # an up's, nothing edited
    (wd / "train.py").write_text("print('v2')\n")
    real_pack = bundle_mod._pack

    def edited_meanwhile(root: Path, members: list[tuple[str, Path]], *args: Any, **kwargs: Any) -> Any:
        (wd / "train.py").write_text("print('v3')\n")  # after the hash, before the pack
        return real_pack(root, members, *args, **kwargs)

    monkeypatch.setattr(bundle_mod, "_pack", edited_meanwhile)
    delta = bundle_mod.build_workdir_delta(selection, bundle_mod.bundle_manifest(full))
    assert delta.changed == ["train.py"] and delta.bundle is not None
    sent = bundle_mod.bundle_manifest(delta.bundle)
    assert sent["train.py"] == hashlib.sha256(b"print('v3')\n").hexdigest() == delta.manifest["train.py"]


def _alive(pid: int | None) -> bool:
    import os

    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
