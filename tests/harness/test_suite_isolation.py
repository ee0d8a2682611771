"""The suite never reaches the user's own harness state, config, cache or the official CLI's key file, and leaves
the checkout as it found it (tests/conftest.py, tests/isolation.py): the session's environment, the audit hook
that fails a test touching a user directory, the end-of-session checks, and a real CLI run in its own process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import isolation
from tests.harness.clirun import ROOT, cli, cli_process
from vast_harness.spec.user import OFFICIAL_CLI_KEY_FILE, config_home
from vast_harness.state import dirs


def session_home() -> Path:
    return Path(os.environ[isolation.SESSION_HOME_ENV])


def test_the_session_has_a_home_of_its_own_and_no_users_key():
    home = session_home()
    assert Path.home() == home and Path("~").expanduser() == home
    for name in isolation.XDG:
        assert Path(os.environ[name]).is_relative_to(home), name
    assert not {"VAST_API_KEY", "VAST_URL"} & set(os.environ)
    env_without_test_state = {k: v for k, v in os.environ.items() if k != dirs.STATE_ENV}
    assert dirs.state_dir(env_without_test_state).is_relative_to(home)
    key_file = config_home(os.environ) / OFFICIAL_CLI_KEY_FILE
    assert key_file.is_relative_to(home)
    users = isolation.guarded_dirs(os.environ)
    assert users and not any(p.is_relative_to(home) for p in users)
    assert any(p.parts[-2:] == ("state", "vast-harness") for p in users)
    assert any(p.parts[-2:] == (".config", "vastai") for p in users)  # where `vastai set api-key` writes


def test_the_guard_records_what_touches_a_user_dir_and_nothing_else(tmp_path):
    theirs, ours = tmp_path / "user" / "vast-harness", tmp_path / "ours"
    theirs.mkdir(parents=True)
    ours.mkdir()
    guard = isolation.UserDirGuard([theirs])
    guard.current = "this test"
    (ours / "ledger.jsonl").write_text("x")
    os.listdir(ours)
    assert guard.seen == []
    (theirs / "ledger.jsonl").write_text("x")  # a write
    (theirs / "ledger.jsonl").read_text()  # a read
    os.listdir(theirs)
    os.rename(theirs / "ledger.jsonl", ours / "moved")
    assert [(who, event) for who, event, _ in guard.seen] == [
        ("this test", "open"), ("this test", "open"), ("this test", "os.listdir"), ("this test", "os.rename")]
    assert not guard.under(tmp_path / "user" / "vast-harness-other") and guard.under(theirs)


def test_the_end_of_session_check_names_only_a_file_this_session_wrote(tmp_path):
    users = [tmp_path / "state"]
    users[0].mkdir()
    (users[0] / "old.jsonl").write_text("a run of long ago\n")
    before = isolation.file_times(users)
    (users[0] / "old.jsonl").write_text("another session on the machine: /tmp/pytest-of-x/pytest-9/\n")
    (users[0] / "ledger.jsonl").write_text(f'{{"evidence": "{tmp_path}/ev"}}\n')
    assert isolation.written_by(before, users, (str(tmp_path),)) == [str(users[0] / "ledger.jsonl")]


def test_the_checkout_check_sees_a_new_file_ignored_or_not(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(".cache/\n")
    before = isolation.checkout_status(tmp_path)
    assert before is not None
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_text("")
    assert isolation.checkout_status(tmp_path) == before
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "lint").write_text("")
    (tmp_path / "new.txt").write_text("")
    assert isolation.checkout_status(tmp_path) - before == {"!! .cache/", "?? new.txt"}
    assert isolation.checkout_status(tmp_path / "nope") is None


def test_a_smoke_run_in_its_own_process_keeps_its_ledger_in_the_sessions_state_dir(monkeypatch, tmp_path):
    # Issue 43: fixtures set the evidence dir, not the state dir, and `costs` listed smoke runs the user never made.
    # A CLI process with no state directory of its own: the session's environment alone must keep it away.
    monkeypatch.delenv(dirs.STATE_ENV)
    smoke = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()  # its steps but one, a quick one
    profile = tmp_path / "quick.toml"
    profile.write_text(smoke[: smoke.index("[[steps]]")] + '[[steps]]\nname = "hi"\nrun = "echo hi"\ntimeout_s = 30\n')
    done = cli_process("--profile", str(profile), "--sim", "--json", "--proof-interval", "0.05", cwd=session_home())
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = json.loads(done.stdout)["run_id"]
    state = Path(os.environ["XDG_STATE_HOME"]) / dirs.APP_DIR / dirs.SIM_SUBDIR
    assert run_id in (state / "ledger.jsonl").read_text()
    assert (state / run_id / "harness-result.json").is_file()
    costs = cli("costs", "--json", cwd=session_home())
    assert run_id in {r["run_id"] for r in json.loads(costs.stdout)["runs"]}, costs.stdout[-2000:]


@pytest.mark.parametrize("var", ["VAST_API_KEY", "VAST_URL"])
def test_a_users_exported_key_or_url_never_reaches_a_test(var):
    assert var not in os.environ
