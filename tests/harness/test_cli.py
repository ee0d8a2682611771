"""The CLI as a user runs it, against the simulator over HTTP: output, exit codes, no key leaks (in this process
through tests/harness/clirun.py, and as a process of its own where a leak could hide outside Python's streams)."""

from __future__ import annotations

import json
from functools import partial

import pytest

from tests.harness import clirun
from vast_harness.sim import SimServer

LEAKY_KEY = "vhLEAKCANARY-9d8c7b6a5f4e3d2c1b0a"
SEED_FLAGS = ["--profile", "mfu", "--num-gpus", "2", "--min-pcie-bw", "50", "--max-usd", "3", "--max-minutes", "50",
              "--remote-env", "HT_MFU_WORLDS=2", "--remote-env", "HT_MFU_COMPILE=1", "--remote-env", "HT_MFU_MB=8"]


SIM_OPTIONS = dict(seed=5, rate_scale=0.01, num_offers=1000)  # conftest.sim


cli = partial(clirun.cli, key=LEAKY_KEY)
cli_process = partial(clirun.cli_process, key=LEAKY_KEY)


def test_dry_run_shows_offer_steps_caps_settings_as_given_and_secrets_masked(sim, tmp_path):
    """A setting (--remote-env) shows as given, so a user can confirm an override; a secret never shows."""
    p = cli(*[f for f in SEED_FLAGS if f != "50"][:5], "20", *SEED_FLAGS[6:], "--max-usd", "30", "--dry-run",
            "--remote-secret", "HF_TOKEN=abc", "--evidence-dir", str(tmp_path), sim=sim)
    assert p.returncode == 0, p.stderr
    for needle in ("Chosen offer", "env-probe", "mfu-sweep", "Worst case", "HT_MFU_MB=8", "HT_MFU_WORLDS=2",
                   "HF_TOKEN=***", "nothing was created"):
        assert needle in p.stdout, needle
    assert "abc" not in p.stdout + p.stderr
    calls = sim.state()["calls"]
    assert not [c for c in calls if c["method"] in ("PUT", "DELETE") and "/asks/" in c["path"]]


def test_dry_run_json_is_one_object(sim, tmp_path):
    p = cli_process("--profile", "smoke", "--dry-run", "--json", "--evidence-dir", str(tmp_path), sim=sim)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["dry_run"] is True and data["offer"]["id"] > 0
    assert data["quote"]["worst_case_usd"] <= data["caps"]["max_usd"]
    assert data["remote_env"] == {"OMP_NUM_THREADS": "1"} and data["remote_secrets"] == []


def test_seed_invocation_with_no_fitting_offer_exits_5_with_reasons(sim, tmp_path):
    p = cli(*SEED_FLAGS, "--max-usd", "0.01", "--dry-run", sim=sim)
    assert p.returncode == 5, p.stderr
    assert "no offer satisfies" in p.stderr and "why" in (p.stdout + p.stderr)


def test_a_dry_run_refuses_the_time_cap_the_run_would_refuse(sim):
    # The preview refuses a cap (here 0.5 min) the run would refuse: exit 2 in both, no plan shown.
    p = cli("--profile", "smoke", "--max-minutes", "0.5", "--dry-run", sim=sim)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "--max-minutes 0.5 cannot cover boot, the receipt and teardown" in p.stderr and "Chosen offer" not in p.stdout


def test_offers_subcommand_ranks_and_explains(sim):
    p = cli("offers", "--profile", "smoke", "--json", sim=sim)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    worst = [r["worst_case_usd"] for r in data["ranked"]]
    assert worst == sorted(worst) and data["rejected"] and all(r["reasons"] for r in data["rejected"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "nope", "--dry-run"], "unknown profile"),
        (["--profile", "smoke", "--remote-env", "BROKEN", "--dry-run"], "--remote-env"),
        (["--profile", "smoke", "--max-usd", "0", "--dry-run"], "--max-usd must be positive"),
        (["--profile", "smoke", "--max-minutes", "-5", "--dry-run"], "--max-minutes must be positive"),
        (["--profile", "smoke", "--api-url", "file:///etc/passwd", "--dry-run"], "not an http"),
        (["--profile", "smoke", "--key-file", "/nonexistent/vast.key", "--dry-run"], "cannot read"),
        (["--dry-run"], "--profile is required"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(args, needle):
    p = cli(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr
    assert "Traceback" not in p.stderr


def test_world_readable_key_file_is_refused(tmp_path):
    key = tmp_path / "vast.key"
    key.write_text(LEAKY_KEY)
    key.chmod(0o644)
    p = clirun.cli("--profile", "smoke", "--key-file", str(key), "--dry-run")
    assert p.returncode == 2 and "chmod 600" in p.stderr


def test_auth_failure_is_exit_2(tmp_path):
    with SimServer(seed=1, rate_scale=0.01, api_keys=["the-only-key"]) as strict:
        p = cli("--profile", "smoke", "--dry-run", sim=strict)
    assert p.returncode == 2, p.stderr
    assert LEAKY_KEY not in p.stderr + p.stdout


@pytest.mark.slow
def test_key_never_leaves_the_authorization_header(sim, tmp_path):
    """A distinctive key through dry run, offers, a failing run and reap: searched in every output and file."""
    key_file = tmp_path / "vast.key"
    key_file.write_text(LEAKY_KEY + "\n")
    key_file.chmod(0o600)
    ev = tmp_path / "ev"
    run = clirun.cli_process  # a process of its own: a leak written past Python's streams shows too
    outputs = [
        run("--profile", "smoke", "--dry-run", "--key-file", str(key_file), "--evidence-dir", str(ev), sim=sim),
        run("offers", "--profile", "mfu", "--key-file", str(key_file), sim=sim),
        run("--profile", "smoke", "--key-file", str(key_file), "--evidence-dir", str(ev), "--proof-interval", "0.05",
            "--poll-interval", "0.05", "--max-usd", "0.3", sim=sim, timeout=300),
        run("reap", "--key-file", str(key_file), "--evidence-dir", str(ev), "--proof-interval", "0.05", sim=sim),
    ]
    for p in outputs:
        assert LEAKY_KEY not in p.stdout and LEAKY_KEY not in p.stderr
    files = [f for f in ev.rglob("*") if f.is_file()]
    assert files, "the run wrote evidence"
    for f in files:
        assert LEAKY_KEY not in f.read_text(errors="replace"), f
    assert not [c for c in sim.state()["calls"] if c.get("key_in_url")]


@pytest.mark.parametrize(
    ("args", "code"),
    [(["--profile", "mfu", "--max-usd", "0.01", "--dry-run", "--json"], 5),
     (["--profile", "mfu", "--max-usd", "-1", "--dry-run", "--json"], 2)],
    ids=["no-offer", "bad-input"],
)
def test_json_mode_prints_exactly_one_object_even_on_failure(sim, args, code):
    p = cli(*args, sim=sim)
    assert p.returncode == code, p.stderr
    data = json.loads(p.stdout)  # raises if there were two objects or none
    assert data["exit_code"] == code and data["error"]
    if code == 5:
        assert data["rejected"] and all(r["reasons"] for r in data["rejected"])
