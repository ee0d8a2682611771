"""Every CLI flag of the run and the `offers`/`reap` subcommands, driven with empty, negative, zero, NaN, inf,
huge, non-UTF-8 and rich-markup values: exit 2 and one line naming the flag, never a traceback, nothing sent.

Driven through `cli.main` in-process (the real entry point, argv as the OS hands it: non-UTF-8 bytes arrive
surrogate-escaped). The API URL is a `.invalid` host, so a value wrongly accepted can never reach a network.
"""

from __future__ import annotations

import os
import sys

import pytest

from vast_harness.cli import app as cli

NON_UTF8 = os.fsdecode(b"\xff\xfe")
VALUES = {"empty": "", "negative": "-1", "zero": "0", "nan": "nan", "inf": "inf", "huge": "1e300",
          "non-utf8": NON_UTF8, "markup": "[/x]"}
HUGE_INT = "99999999999999999999"
NOWHERE = "https://vast.invalid"  # not loopback, so the real-API floors apply; .invalid never resolves

# flag -> the value kinds that are valid for it (skipped, with the reason in the name of the kind)
VALID_FOR = {
    "--min-pcie-bw": {"zero"},  # no minimum
    "--boot-retries": {"zero"},  # try one host only
    "--evidence-dir": {"negative", "zero", "nan", "inf", "huge", "markup"},  # legal directory names
}
EXTRA = {  # values beyond the common kinds that once slipped through
    "--max-minutes": {"1e400": "1e400"},
    "--api-url": {"bad-ipv6": "http://[bad", "port": "http://127.0.0.1:99999", "long": "https://" + "a" * 300,
                  "ftp": "ftp://x"},
    "--evidence-dir": {"proc": "/proc/vh", "long": "x" * 5000},
    "--remote-env": {"no-key": "=1", "long-value": "A=" + "x" * 10_000, "nul": "A=\x00"},
    "--proof-interval": {"below-floor": "1"},
    "--pacing-scale": {"below-floor": "0.5"},
    "--num-gpus": {"huge-int": HUGE_INT, "seventeen": "17"},
    "--boot-retries": {"huge-int": HUGE_INT},
}
RUN_FLAGS = ["--profile", "--num-gpus", "--min-pcie-bw", "--key-file", "--max-usd", "--max-minutes", "--remote-env",
             "--boot-retries", "--evidence-dir", "--api-url", "--proof-interval", "--pacing-scale", "--poll-interval",
             "--image-expect"]
OFFERS_FLAGS = ["--profile", "--num-gpus", "--min-pcie-bw", "--key-file", "--max-usd", "--max-minutes", "--api-url",
                "--pacing-scale"]
REAP_FLAGS = ["--key-file", "--evidence-dir", "--api-url", "--proof-interval", "--pacing-scale"]
BOOL_FLAGS = {"run": ["--dry-run", "--any-driver", "--eight-gpu-qualified", "--sim", "--json",
                      "--allow-unarmed-deadman", "--image-expect-ack"],
              "offers": ["--any-driver", "--eight-gpu-qualified", "--sim", "--json"], "reap": ["--json"]}


def _cases():
    for command, flags in (("run", RUN_FLAGS), ("offers", OFFERS_FLAGS), ("reap", REAP_FLAGS)):
        for flag in flags:
            values = {k: v for k, v in VALUES.items() if k not in VALID_FOR.get(flag, set())}
            if flag in ("--num-gpus", "--boot-retries"):
                values["huge"] = HUGE_INT
            values |= EXTRA.get(flag, {})
            for kind, value in values.items():
                yield pytest.param(command, flag, value, id=f"{command}{flag}={kind}")
        for flag in BOOL_FLAGS[command]:
            yield pytest.param(command, flag, None, id=f"{command}{flag}=value")


def _argv(command: str, flag: str, value: str | None) -> list[str]:
    base = {"run": ["--profile", "smoke", "--api-url", NOWHERE, "--dry-run"],
            "offers": ["offers", "--profile", "smoke", "--api-url", NOWHERE],
            "reap": ["reap", "--api-url", NOWHERE]}[command]
    if command == "run" and flag == "--evidence-dir":
        base = [a for a in base if a != "--dry-run"]  # a dry run writes nothing, so does not check it
    if value is None:
        return [*base, f"{flag}=nan"]  # a switch given a value
    return [*base, f"{flag}={value}"]


@pytest.mark.parametrize(("command", "flag", "value"), list(_cases()))
def test_bad_flag_value_exits_2_naming_the_flag(command, flag, value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("VAST_API_KEY", "0123456789abcdef")
    monkeypatch.delenv("VAST_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = _argv(command, flag, value)
    monkeypatch.setattr(sys, "argv", ["vast-e2e", *argv])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    assert exited.value.code == 2, (argv, captured.err)
    assert flag in captured.err, captured.err
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.out == ""


def test_evidence_dir_that_is_a_file_is_refused(monkeypatch, capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "--profile", "smoke", "--sim", "--evidence-dir", str(f)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2 and "not a directory" in capsys.readouterr().err


def test_full_evidence_dir_is_refused_before_anything_is_rented(monkeypatch, capsys, tmp_path):
    import errno

    real_write = os.write

    def write(fd, data):
        try:
            if ".vh-write-probe-" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except FileNotFoundError:
            pass
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "--profile", "smoke", "--sim", "--evidence-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--evidence-dir" in err and "No space" in err


@pytest.mark.parametrize(("content", "needle"), [(b"\xff\xfe\x00binary", "not ASCII"),
                                                 ("clé-non-ascii".encode(), "not ASCII"),
                                                 (b"a" * 5_000_000, "bytes"),
                                                 (b"two words", "printable ASCII without spaces"),
                                                 (b"\n\n", "empty")])
def test_odd_key_files_are_refused(content, needle, monkeypatch, capsys, tmp_path):
    key = tmp_path / "vast.key"
    key.write_bytes(content)
    key.chmod(0o600)
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "--profile", "smoke", "--dry-run", "--api-url", NOWHERE,
                                      "--key-file", str(key)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--key-file" in err and needle in err, err


def test_non_ascii_key_in_the_environment_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("VAST_API_KEY", "clé")
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "--profile", "smoke", "--dry-run", "--api-url", NOWHERE])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2 and "VAST_API_KEY" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:1"])
def test_the_floors_are_lifted_only_for_loopback(url):
    from vast_harness.spec.resolve import RunOptions, resolve

    spec = resolve(RunOptions(profile="smoke", api_url=url, proof_interval_s=0.05, pacing_scale=0.01, dry_run=True),
                   environ={"VAST_API_KEY": "k"})
    assert spec.proof_interval_s == 0.05 and spec.pacing_scale == 0.01


@pytest.mark.parametrize("command", [["--profile", "smoke"], ["reap"]], ids=["run", "reap"])
def test_a_bad_state_dir_is_named_as_the_state_dir_not_as_a_flag_never_given(command, monkeypatch, capsys,
                                                                              tmp_path):
    # A state dir that is a file is named as the state dir ($VAST_HARNESS_HOME), not as a flag never given.
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("VAST_HARNESS_HOME", str(afile))
    monkeypatch.setenv("VAST_API_KEY", "k")
    monkeypatch.setattr("vast_harness.spec.resolve.user_state_dir", lambda environ=None: afile)
    monkeypatch.setattr(sys, "argv", ["vast-e2e", *command, "--api-url", NOWHERE])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "the state directory ($VAST_HARNESS_HOME)" in err, err
    assert "--evidence-dir" not in err and "not a directory" in err, err
