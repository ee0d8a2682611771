"""The command line's conventions, as a user meets them (the simulator over HTTP): --version, -h,
bare `vast-e2e`, options before a subcommand honoured or refused, a user's own profile file, the official
CLI's key file and a config file for defaults, and --unqualified-ok."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.harness import clirun
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import DriverPolicy, Step
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

ROOT = Path(__file__).resolve().parents[2]
KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=7, rate_scale=0.01, num_offers=400, api_keys=[KEY]) as server:
        yield server


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A user whose HOME is `home` and whose config sits where HOME puts it (no XDG_CONFIG_HOME)."""
    return clirun.cli(*args, cwd=home, env={"HOME": str(home), "XDG_CONFIG_HOME": None} | (env or {}))


@pytest.mark.slow
def test_version_help_and_bare_invocation(tmp_path):
    version = cli("--version", home=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("vast-e2e ")
    for argv in ([], ["-h"], ["--help"]):
        shown = cli(*argv, home=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "Usage: vast-e2e" in shown.stdout and "offers" in shown.stdout and "--max-usd USD" in shown.stdout
        assert "<bool>" not in shown.stdout and "--sim " in shown.stdout
    assert "--install-completion" in cli("-h", home=tmp_path).stdout
    assert "--rank-by" in cli("offers", "-h", home=tmp_path).stdout


@pytest.mark.slow
def test_an_option_before_a_subcommand_is_honoured_or_refused(sim, tmp_path):
    honoured = cli("--sim", "offers", "--profile", "smoke", "--json", home=tmp_path)
    assert honoured.returncode == 0, honoured.stderr  # --sim given before `offers` reaches it: no key asked for
    assert json.loads(honoured.stdout)["ranked"]
    refused = cli("--max-minutes", "5", "reap", home=tmp_path)
    assert refused.returncode == 2 and "--max-minutes does not apply to `reap`" in refused.stderr
    twice = cli("--profile", "smoke", "offers", "--profile", "mfu", "--sim", home=tmp_path)
    assert twice.returncode == 2 and "--profile given twice" in twice.stderr


@pytest.mark.slow
def test_a_users_own_profile_file_runs_and_a_bad_one_names_the_field(tmp_path):
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text().replace('name = "smoke"', 'name = "mine"')
    mine = tmp_path / "mine.toml"
    mine.write_text(text.replace("max_minutes = 15", "max_minutes = 12"))
    dry = cli("--profile", str(mine), "--sim", "--dry-run", "--json", home=tmp_path)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["profile"] == "mine" and plan["caps"]["max_minutes"] == 12
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("disk_gb = 20", "disk_gb = 2"))
    refused = cli("--profile", str(bad), "--sim", "--dry-run", home=tmp_path)
    assert refused.returncode == 2 and "field disk_gb" in refused.stderr and str(bad) in refused.stderr
    missing = cli("--profile", str(tmp_path / "none.toml"), "--sim", "--dry-run", home=tmp_path)
    assert missing.returncode == 2 and "no such profile file" in missing.stderr


@pytest.mark.slow
def test_the_official_clis_key_file_is_read_under_the_same_permission_rule(sim, tmp_path):
    key_file = tmp_path / ".config" / "vastai" / "vast_api_key"
    key_file.parent.mkdir(parents=True)
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o644)
    args = ("offers", "--profile", "smoke", "--api-url", sim.url, "--pacing-scale", "0.01", "--json")
    too_open = cli(*args, home=tmp_path)
    assert too_open.returncode == 2 and "official CLI's key file" in too_open.stderr and "chmod 600" in too_open.stderr
    key_file.chmod(0o600)
    ok = cli(*args, home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert KEY not in ok.stdout + ok.stderr
    (tmp_path / "elsewhere").mkdir()
    nothing = cli(*args, home=tmp_path / "elsewhere")
    assert nothing.returncode == 2 and "vastai set api-key" in nothing.stderr


@pytest.mark.slow
def test_a_config_file_gives_defaults_below_flags(sim, tmp_path):
    config = tmp_path / "xdg" / "vast-harness" / "config.toml"
    config.parent.mkdir(parents=True)
    key = tmp_path / "k"
    key.write_text(KEY)
    key.chmod(0o600)
    config.write_text(f'key_file = "{key}"\nmax_usd = 0.25\nmax_minutes = 9\nevidence_dir = "{tmp_path / "ev"}"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    args = ("--profile", "smoke", "--dry-run", "--json", "--api-url", sim.url, "--pacing-scale", "0.01")
    dry = cli(*args, home=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["caps"] == {"max_usd": 0.25, "max_minutes": 9}
    flag = cli(*args, "--max-usd", "0.4", home=tmp_path, env=env)
    assert json.loads(flag.stdout)["caps"]["max_usd"] == 0.4  # flag > config file
    config.write_text("max_usd = 0.25\nmax_dollars = 3\n")
    bad = cli(*args, home=tmp_path, env=env)
    assert bad.returncode == 2 and "max_dollars" in bad.stderr and "config.toml" in bad.stderr


@pytest.mark.slow
def test_unqualified_ok_turns_exit_4_into_0_and_the_record_still_says_unqualified(sim, tmp_path):
    nobody_qualified = DriverPolicy(drivers=[])
    codes = {}
    for ok in (False, True):
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / f"ev{ok}", any_driver=True,
                                  unqualified_ok=ok, proof_interval_s=0.05), environ={})
        prof = spec.profile.model_copy(update={"steps": [Step(name="ok", run="true", timeout_s=20)]})
        spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
            ).with_timings(teardown_margin_s=2.0)
        with VastClient(KEY, base_url=sim.url, pacing_scale=0.01) as client:
            run = GuardedRun(spec, client, nobody_qualified, Output(quiet=True))
            codes[ok] = run.execute().exit_code
        record = json.loads((run.ev.dir / "harness-result.json").read_text())
        assert record["driver_qualified"] is False and record["exit_code"] == codes[ok]
    assert codes == {False: 4, True: 0}
    refused = cli("--profile", "smoke", "--sim", "--dry-run", "--unqualified-ok", home=tmp_path)
    assert refused.returncode == 2 and "--any-driver" in refused.stderr


@pytest.mark.skipif(__import__("shutil").which("uv") is None, reason="needs uv (the README's only prerequisite)")
@pytest.mark.slow
def test_the_cli_docs_seed_example_runs_as_written_with_sim(tmp_path):
    import re
    import shlex

    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    block = cli_doc.split("The seed invocation", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    argv = shlex.split(re.sub(r"\\\n\s*", " ", block).strip()) + ["--sim", "--evidence-dir", str(tmp_path)]
    assert argv[:3] == ["uv", "run", "vast-e2e"]
    env = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "VAST_URL", "VIRTUAL_ENV")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env | {"HOME": str(tmp_path)})
    # The design's own command picks the design's hardware (issue 48): a 2x RTX 5090, micro-batch 8 checkpointed
    # to fit its 31.8 GiB (issue 31 once refused it for a fixed 76 GiB the sweep would not use).
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RTX 5090" in done.stdout and "Memory fit on 2x RTX 5090" in done.stdout
    assert "compile, act-ckpt" in done.stdout and "nothing was created" in done.stdout


def test_the_script_without_the_projects_dependencies_says_how_to_run_it(tmp_path):
    done = subprocess.run([sys.executable, "-S", "-s", str(ROOT / "scripts" / "vast_e2e.py"), "-h"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "uv run" in done.stderr and "Traceback" not in done.stderr
