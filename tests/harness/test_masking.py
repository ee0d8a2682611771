"""The account key and every secret are masked in everything any command prints or writes (issue 49), whatever
input holds them: an error that quotes a URL, a path, a profile name or a `KEY=VALUE` included, and before the
command line is even parsed. Issue 43: what a host prints of the key is masked too, and an artifact comes back
byte for byte (a checkpoint that holds a secret stays loadable), private, with a loud warning naming the secret.

The sweep takes its commands and options from the typer app itself: a new option is swept without a word here.
"""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest
import typer.main

from tests.harness.clirun import ROOT, cli, cli_env, cli_process
from vast_harness.cli.app import app
from vast_harness.redact import Redactor

# Realistic shapes: a Vast key is 64 hex characters (this one starts with a letter, so it also passes for an
# environment variable's name); the secret is a Hugging Face token.
KEY = "e4c1d9a7b35f6028" * 4
SECRET = "hf_Qm7TzXw2Lr9Pd4Kv8Ns3Bc6Yj"
SECRET_NAME = "HF_TOKEN"

# The shapes a value is planted in: bare, inside a path and a URL (an http URL, a profile file, a key file, a
# folder), and as KEY=VALUE (a setting, a secret, an image expectation).
SHAPES = {
    "key": KEY,
    "secret": SECRET,
    "url": f"http://h/{KEY}/{SECRET}.toml",
    "pair": f"{KEY}={SECRET}",
}
HELD = "box"  # a kept host's NAME that no hold has: each command refuses it (exit 2) once it has read its input
# How each command is run around the planted value: on the simulator, as a preview, wherever it can be.
BASE = {
    "": ["--profile", "smoke", "--sim", "--dry-run"],
    "run": ["--sim", "--dry-run"],
    "offers": ["--sim"],
    "fleet": ["--gpus", "RTX 4090", "--max-usd", "1", "--sim", "--dry-run"],
    "check": ["--sim"],
    "canary": ["--sim", "--max-minutes", "0.01"],  # refused as under the minimum cap: nothing is rented
    "reap": ["--api-url", "http://127.0.0.1:9"],  # nothing listens: the one command with no --sim gives up fast
    "report": [],
    "logs": [],
    "costs": [],
    "status": ["--sim"],
    "machines": ["--sim"],
    "summary": [],
    "up": [HELD, "--sim", "--dry-run"],
    "exec": [HELD],
    "keep": [HELD],
    "down": [HELD],
    "ssh": [HELD],
}
TAKES_SECRETS = {"", "run", "fleet", "up", "exec"}
TAKES_COMMAND = {"run", "exec"}  # CMD after `--`


def _value_params() -> list[tuple[str, str, bool, bool]]:
    """(command, option or argument name, is an argument, is repeatable) for every parameter that takes a
    value, of every command and of the bare `vast-e2e`."""
    group = typer.main.get_command(app)
    commands = {"": group} | dict(group.commands)  # type: ignore[attr-defined]
    found = []
    for name, command in commands.items():
        for p in command.params:
            if getattr(p, "is_flag", False) or p.name in ("version", "install_completion", "show_completion"):
                continue
            is_arg = not p.opts[0].startswith("-")
            found.append((name, p.opts[0] if not is_arg else p.name, is_arg, bool(getattr(p, "multiple", False))))
    return found


PARAMS = _value_params()
CASES = [pytest.param(cmd, opt, is_arg, id=f"{cmd or 'vast-e2e'} {opt}") for cmd, opt, is_arg, _ in PARAMS]


def _argv(command: str, option: str, is_arg: bool, value: str, *, json_output: bool) -> list[str]:
    base = list(BASE[command])
    if is_arg and option == "name":  # the planted value is the kept host's NAME
        base.remove(HELD)
    if not is_arg and option in base:  # the planted value replaces the base's own
        i = base.index(option)
        del base[i:i + 2]
    argv = [command] if command else []
    argv += base
    if command in TAKES_SECRETS:
        argv += ["--remote-secret", f"{SECRET_NAME}={SECRET}"]
    if json_output:
        argv.append("--json")
    if is_arg:
        before = ["nope"] if option == "step" else []  # STEP comes after RUN
        if command in TAKES_COMMAND:
            return [*argv, "--", value] if option == "command" else [*argv, value, "--", "true"]
        return [*argv, *before, value]
    argv += [option, value]
    if command in TAKES_COMMAND:
        argv += ["--", "true"]
    return argv


def _leaks(text: str | bytes, *, secret_known: bool) -> list[str]:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    found = ["the key"] if KEY.encode() in data else []
    if secret_known and SECRET.encode() in data:
        found.append("the secret")
    return found


def _files_with(root: Path, *, secret_known: bool) -> list[str]:
    return [f"{p.relative_to(root)}: {', '.join(hits)}" for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and (hits := _leaks(p.read_bytes(), secret_known=secret_known))]


def test_the_sweep_covers_every_command_and_the_options_that_echo_input():
    commands = {c for c, *_ in PARAMS}
    assert commands == set(BASE), "a command without a BASE: say how the sweep runs it"
    options = {(c, o) for c, o, *_ in PARAMS}
    for echoed in [("", "--api-url"), ("", "--profile"), ("run", "--workdir"), ("run", "command"),
                   ("fleet", "--gpus"), ("canary", "--out"), ("logs", "step"), ("", "--max-usd")]:
        assert echoed in options


@pytest.mark.parametrize(("command", "option", "is_arg"), CASES)
def test_no_input_makes_a_command_print_or_write_the_key_or_a_secret(command, option, is_arg, tmp_path):
    """Issue 49's sweep: the key (VAST_API_KEY) and a secret (--remote-secret, where the command takes one)
    planted in the option in each shape: neither is in stdout, stderr (the --json object too) or any file under
    the state and evidence directories, whatever the command made of the value."""
    secret_known = command in TAKES_SECRETS
    for shape, value in SHAPES.items():
        if shape == "secret" and not secret_known:
            continue  # nothing tells this command the value is a secret
        home = tmp_path / shape
        home.mkdir()
        json_output = shape in ("secret", "url")
        p = cli(*_argv(command, option, is_arg, value, json_output=json_output), home=home, key=KEY)
        said = f"{shape}: exit {p.returncode}"
        assert _leaks(p.stdout, secret_known=secret_known) == [], (said, p.stdout[-2000:])
        assert _leaks(p.stderr, secret_known=secret_known) == [], (said, p.stderr[-2000:])
        assert _files_with(home, secret_known=secret_known) == [], said
        if json_output and p.stdout.strip():
            json.loads(p.stdout)  # masked, and still the one JSON object


def test_the_plain_http_refusal_says_why_without_the_key(tmp_path):
    """Issue 49's own case, in a process of its own: exit 2, the refusal, no key; with --json too."""
    url = f"http://h/{KEY}"
    p = cli_process("--profile", "smoke", "--api-url", url, home=tmp_path, key=KEY)
    assert p.returncode == 2 and "plain http to another machine" in p.stderr and "***" in p.stderr
    assert KEY not in p.stdout + p.stderr
    # no prefix of it either: a message that cuts a long value must mask it first
    assert KEY[:16] not in p.stdout + p.stderr
    p = cli("--profile", "smoke", "--api-url", url, "--json", home=tmp_path, key=KEY)
    assert p.returncode == 2 and KEY[:16] not in p.stdout + p.stderr
    assert json.loads(p.stdout)["exit_code"] == 2


def test_a_url_that_holds_the_key_is_refused_even_over_https(tmp_path):
    """The key goes in a header only: a URL holding it would put it in the host's onstart, the server's logs and
    the evidence. Refused (exit 2) before anything is sent, without echoing it."""
    p = cli("--profile", "smoke", "--dry-run", "--api-url", f"https://console.vast.ai/{KEY}", home=tmp_path, key=KEY)
    assert p.returncode == 2 and "holds the account key" in p.stderr
    assert KEY[:16] not in p.stdout + p.stderr


def test_an_error_of_run_workload_never_carries_the_key_or_a_secret(tmp_path, monkeypatch):
    """The Python entry point raises ConfigError: its text (str, repr, args) is masked, even where the value
    was refused before the key was read."""
    from vast_harness import api
    from vast_harness.errors import ConfigError

    monkeypatch.setenv("VAST_API_KEY", KEY)
    for kwargs in [{"api_url": f"http://h/{KEY}"}, {"artifacts": [f"/abs/{SECRET}"]},
                   {"workdir": tmp_path / KEY}, {"command": f"python {KEY}"}, {"max_usd": KEY}]:
        with pytest.raises(ConfigError) as refused:
            api.run_workload(kwargs.pop("command", ["true"]), remote_secrets={SECRET_NAME: SECRET},  # type: ignore[arg-type]
                             evidence_dir=tmp_path / "ev", **kwargs)  # type: ignore[arg-type]
        text = f"{refused.value} {refused.value!r} {refused.value.args}"
        assert KEY[:16] not in text and SECRET not in text, (kwargs, text)


_CRASH = textwrap.dedent("""
    import sys, threading
    import vast_harness.cli.app as app_module
    def crash(*args, **kwargs):
        seen = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("thread saw " + sys.argv[-1])))
        seen.start()
        seen.join()
        print("a library printed", sys.argv[-1], file=sys.stderr)
        raise RuntimeError("unexpected, holding " + sys.argv[-1])
    app_module.load_driver_policy = crash
    sys.argv = ["vast-e2e", "--profile", "smoke", "--sim", "--dry-run", "--remote-secret", sys.argv[-1]]
    from vast_harness.cli import main
    main()
""")


def test_a_bugs_traceback_and_whatever_else_reaches_stderr_are_masked():
    """The last resort: an exception the harness did not expect still ends in a traceback (what a bug report
    needs: exit 1), a thread's error and a library's print still reach stderr, each masked."""
    p = subprocess.run([sys.executable, "-c", _CRASH, f"{SECRET_NAME}={SECRET}"], capture_output=True, text=True,
                       env=cli_env(key=KEY), cwd=ROOT, timeout=60)
    assert p.returncode == 1 and "Traceback" in p.stderr and "unexpected, holding" in p.stderr
    assert "a library printed" in p.stderr and "thread saw" in p.stderr
    assert SECRET not in p.stdout + p.stderr and KEY not in p.stdout + p.stderr


def test_a_bugs_traceback_is_masked_in_process_too(tmp_path, monkeypatch):
    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"unexpected, holding {KEY} and {SECRET}")

    monkeypatch.setattr("vast_harness.cli.app.load_driver_policy", crash)
    p = cli("--profile", "smoke", "--sim", "--dry-run", "--remote-secret", f"{SECRET_NAME}={SECRET}",
            home=tmp_path, key=KEY)
    assert p.returncode == 1 and "Traceback" in p.stderr and "unexpected, holding" in p.stderr
    assert KEY not in p.stderr and SECRET not in p.stderr


def test_a_step_that_prints_the_account_key_shows_and_keeps_it_masked(tmp_path):
    """Issue 43: the host has the key (a workdir file, a setting: here a --remote-env) and prints it. The console,
    the step's log, the record, the report and every other file the run kept show *** instead."""
    evidence, work = tmp_path / "ev", tmp_path / "proj"
    work.mkdir()
    (work / "README").write_text("a workdir\n")
    p = cli("run", "--sim", "--workdir", str(work), "--remote-env", f"LEAK={KEY}", "--evidence-dir", str(evidence), "--",
            "sh", "-c", "echo key=$LEAK; echo \"json {\\\"k\\\": \\\"$LEAK\\\"}\" >&2", home=tmp_path, key=KEY)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "key=***" in p.stdout + p.stderr and KEY not in p.stdout + p.stderr
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    assert "key=***" in (run_dir / "steps" / "run.log").read_text()
    assert json.loads((run_dir / "harness-result.json").read_text())["remote_env"] == {"LEAK": "***"}
    assert _files_with(tmp_path, secret_known=False) == []
    logs = cli("logs", "--evidence-dir", str(evidence), home=tmp_path)  # a later command, the key not in its env
    assert logs.returncode == 0 and "key=***" in logs.stdout and KEY not in logs.stdout


_CHECKPOINT = textwrap.dedent("""
    import os, torch
    os.makedirs("out", exist_ok=True)
    # what HF Trainer's training_args.bin holds with push_to_hub: the token, inside a torch.save archive
    torch.save({"hub_token": os.environ["HF_TOKEN"], "lr": 3e-4, "w": torch.arange(6.0)}, "out/training_args.bin")
    with open("out/notes.txt", "w") as fh:
        fh.write("nothing secret\\n")
    print("saved")
""")


def test_a_checkpoint_that_holds_a_secret_comes_back_loadable_exact_private_and_named(tmp_path):
    """Issue 43 item 2: the artifact is the user's output, byte for byte: torch.load reads it, its sha256 is the
    one the host computed (both recorded), it is 0600 in a 0700 folder, and the secret in it is a loud warning
    naming the file and the secret's name (console, record, report), never its value; the report links the file
    and shows none of its content. Everything else stays masked."""
    torch = pytest.importorskip("torch")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "save.py").write_text(_CHECKPOINT)
    evidence = tmp_path / "ev"
    p = cli("run", "--sim", "--workdir", str(work), "--artifact", "out", "--remote-secret", SECRET_NAME,
            "--evidence-dir", str(evidence), "--", "python", "save.py", home=tmp_path, env={SECRET_NAME: SECRET})
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    art = run_dir / "artifacts" / "out" / "training_args.bin"
    loaded = torch.load(art, weights_only=False)
    assert loaded["hub_token"] == SECRET and loaded["w"].tolist() == [0, 1, 2, 3, 4, 5]
    record = json.loads((run_dir / "harness-result.json").read_text())
    arts = record["artifacts"]
    digest = hashlib.sha256(art.read_bytes()).hexdigest()
    assert arts["sha256"]["out/training_args.bin"] == digest == arts["host_sha256"]["out/training_args.bin"]
    assert arts["complete"] and arts["secrets_found"] == {"out/training_args.bin": [SECRET_NAME]}
    assert f"{digest}  artifacts/out/training_args.bin" in (run_dir / "manifest.sha256").read_text()
    for path in [run_dir / "artifacts", *(run_dir / "artifacts").rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    # loud: the console names the file and the secret, the report too; none says the value
    warning = [line for line in p.stderr.splitlines() if "out/training_args.bin" in line and SECRET_NAME in line]
    assert warning and "warning" in warning[0], p.stderr[-3000:]
    report = (run_dir / "report.html").read_text()
    assert "out/training_args.bin" in report and SECRET_NAME in report and 'href="artifacts/out/notes.txt"' in report
    assert "nothing secret" not in report  # linked, never rendered
    assert SECRET not in p.stdout + p.stderr
    kept_text = [f for f in _files_with(tmp_path, secret_known=True) if not f.startswith(f"ev/{run_dir.name}/artifacts")]
    assert kept_text == [], "only the artifact itself holds the secret"


def test_an_artifact_that_differs_from_the_hosts_is_not_a_pass(tmp_path, monkeypatch):
    """The sha256 the host computed is the witness: a file that arrived different (here: changed in the copy)
    fails the run (exit 1) naming it, as a missing artifact does."""
    from vast_harness import api
    from vast_harness.host import ssh

    real_get = ssh.HostSession.get

    def corrupting_get(self: ssh.HostSession, remote: str, local: Path, **kwargs: object) -> int:
        got = real_get(self, remote, local, **kwargs)  # type: ignore[arg-type]
        if local.name == "model.bin":
            local.write_bytes(b"X" + local.read_bytes()[1:])
        return got

    monkeypatch.setattr(ssh.HostSession, "get", corrupting_get)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "job.sh").write_text("head -c 3000 /dev/urandom > model.bin; echo ok > small.txt\n")
    result = api.run_workload(["sh", "job.sh"], workdir=work, artifacts=["model.bin", "small.txt"], sim=True,
                              evidence_dir=tmp_path / "ev")
    assert result.exit_code == 1 and "model.bin" in result.message, result.message
    assert result.record is not None and result.record.artifacts is not None
    assert result.record.artifacts.mismatched == ["model.bin"] and not result.record.artifacts.complete


def test_a_key_file_is_masked_from_before_the_command_line_is_parsed(tmp_path):
    """A key in --key-file (or the official CLI's file): what any message quotes of it is masked, a usage error
    that typer raises while parsing included."""
    key_file = tmp_path / "vast.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    p = cli("--key-file", str(key_file), "--profile", "smoke", "--max-usd", KEY, home=tmp_path)
    assert p.returncode == 2 and "--max-usd" in p.stderr and KEY not in p.stderr
    official = tmp_path / "config" / "vastai" / "vast_api_key"
    official.parent.mkdir(parents=True)
    official.write_text(KEY)
    official.chmod(0o600)
    p = cli("offers", "--sim", "--rank-by", KEY, home=tmp_path)
    assert p.returncode == 2 and "--rank-by" in p.stderr and KEY not in p.stderr


def test_the_masker_forgets_a_commands_values_when_it_ends(tmp_path):
    """One command's secrets are its own: in-process commands one after another do not mask each other's text."""
    from vast_harness.masking import MASKER

    cli("--profile", "smoke", "--sim", "--dry-run", "--remote-secret", "T=smoke", home=tmp_path)
    assert MASKER.text("smoke") == "smoke"


def test_every_writer_masks_what_it_is_handed(tmp_path):
    """The last line of each way out, when a caller forgot: the evidence writer (JSON, a step log, steps.tsv),
    write_whole (reports), the ledger's and the registration's writers, the --json object, and stdout/stderr
    themselves, a value written in pieces included."""
    import html
    import io

    from vast_harness.console.output import Output
    from vast_harness.evidence.run import RunEvidence, write_whole
    from vast_harness.masking import ACCOUNT_KEY, MASKER, MaskingStream
    from vast_harness.state.ledger import write_line
    from vast_harness.state.registry import Registration, RunRegistry

    MASKER.add(KEY, ACCOUNT_KEY)
    MASKER.add(SECRET, SECRET_NAME)
    ev = RunEvidence(tmp_path / "run")
    ev.write_json("x.json", {"url": f"https://h/{KEY}", SECRET: [SECRET, tmp_path / SECRET], "quote": f'"{SECRET}"'})
    assert json.loads((tmp_path / "run" / "x.json").read_text()) == {
        "url": "https://h/***", "***": ["***", str(tmp_path / "***")], "quote": '"***"'}
    log = ev.step_log("s")
    log.write(f"a {SECRET} b")
    log.close()
    ev.append_step_tsv(f"s-{KEY}", 0, 1.0)
    write_whole(tmp_path / "report.html", f"<p>{html.escape(SECRET + '<&>')}</p>")
    write_line(tmp_path / "ledger.jsonl", json.dumps({"detail": f"GET /{KEY}"}).encode() + b"\n")
    held = RunRegistry(tmp_path / "state").register(Registration(
        run_id="r1", pid=1, host="h", started_unix=0.0, api_url=f"https://h/{KEY}", profile="smoke", max_usd=1.0,
        max_minutes=1.0, deadline_unix=0.0))
    held.update(last_round=SECRET)
    assert _files_with(tmp_path, secret_known=True) == []
    held.release()

    sink = io.StringIO()
    stream = MaskingStream(sink)
    stream.write(KEY[:20])
    stream.write(KEY[20:] + " and " + SECRET[:5])
    assert sink.getvalue() == ""  # nothing passed on before its line ends
    stream.write(SECRET[5:] + "\n")
    stream.write(f"pending {SECRET}")
    stream.flush()
    assert sink.getvalue() == "*** and ***\npending ***"

    out = Output(json_mode=True)
    out.stdout = type(out.stdout)(io.StringIO())
    captured = out.stdout._stream  # type: ignore[attr-defined]
    out.emit_json({"path": tmp_path / KEY, SECRET: 1})
    assert json.loads(captured.getvalue()) == {"path": str(tmp_path / "***"), "***": 1}


SECRET_UNICODE = "hf_Zürich9xKq2Lm7Pw"


@pytest.mark.parametrize("shown", [
    unicodedata.normalize("NFD", SECRET_UNICODE),                                   # ü decomposed
    "\u200b".join(SECRET_UNICODE),                                                  # zero-width spaces
    "\u00ad".join(SECRET_UNICODE),                                                  # soft hyphens
    "\u2060".join(SECRET_UNICODE),                                                  # word joiners
    "".join(f"{c}\b{c}" for c in SECRET_UNICODE),                                   # a pager's bold
    "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in SECRET_UNICODE),  # fullwidth
])
def test_a_secret_shown_in_another_unicode_form_is_masked_in_a_hosts_line(shown):
    """Red team r43: each of these reads as the secret on a screen or in an editor and was kept in clear."""
    line = f"token: {shown} done"
    masked = Redactor([SECRET_UNICODE]).line(line)
    assert "***" in masked and "rich9xKq" not in unicodedata.normalize("NFKC", masked.replace("\b", "")), masked


def test_a_decomposed_secret_is_masked_in_bytes_and_found_in_a_kept_file(tmp_path):
    redactor = Redactor([SECRET_UNICODE])
    nfd = unicodedata.normalize("NFD", SECRET_UNICODE).encode()
    assert redactor.data(b"x " + nfd + b" y") == b"x *** y"
    (tmp_path / "f.bin").write_bytes(b"\0" * 10 + nfd)
    assert redactor.found(tmp_path / "f.bin") == {0}


def test_the_format_characters_dropped_are_unicodes_whole_format_category():
    from vast_harness.redact import _FORMAT_CHARS

    listed = {c for c in range(0x110000) if _FORMAT_CHARS.match(chr(c))}
    cf = {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"}
    assert cf <= listed  # a newer Unicode's additions (listed) are unassigned in an older Python's tables
    assert all(unicodedata.category(chr(c)) in ("Cf", "Cn") for c in listed - cf)


def test_a_line_without_the_secret_comes_back_as_it_was_even_with_odd_characters():
    for line in ("plain\tascii line  ", "progress █████▌ 57%", "ｆｕｌｌｗｉｄｔｈ and a\u200bzero-width", "bold\bd"):
        assert Redactor([SECRET_UNICODE]).line(line) == line
