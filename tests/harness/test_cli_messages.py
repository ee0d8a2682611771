"""The CLI's messages, as a new user met them on the command line (issue 34, items 3 and 9, `check`'s money):
cap messages that add up and name where the cap came from, contradicting flags refused, a malformed setting's
key shown, help and docs that agree, completion that offers profiles, runs and --rank-by values."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.harness.clirun import ROOT, cli
from vast_harness.console.money import usd
from vast_harness.errors import ConfigError
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.spec.values import parse_remote_env


def test_money_below_a_cent_keeps_four_decimals_so_a_comparison_adds_up():
    assert usd(0.0128) == "$0.0128" and usd(0.01) == "$0.01" and usd(0.001) == "$0.0010"
    assert usd(3) == "$3.00" and usd(0.05) == "$0.05" and usd(12.3456) == "$12.3456"
    assert usd(-1.6e304) == "$-1.6e+304" and usd(math.inf) == "$inf"  # an API figure gone wrong: not 300 digits


def test_a_cap_rejection_adds_up_and_names_where_the_cap_came_from(tmp_path):
    (tmp_path / "config" / "vast-harness").mkdir(parents=True)
    (tmp_path / "config" / "vast-harness" / "config.toml").write_text("max_usd = 0.001\n")
    done = cli("offers", "--sim", "--profile", "smoke", "--json", home=tmp_path)
    assert done.returncode == 5, done.stderr
    reasons = [r for row in json.loads(done.stdout)["rejected"] for r in row["reasons"]]
    capped = [r for r in reasons if "cost cap" in r]
    assert capped and all(re.search(r"> the cost cap \$0\.0010 \(max_usd \(config file\)\)", r) for r in capped), capped
    assert not any("$0.00 " in r or r.endswith("$0.00") for r in reasons)
    flagged = cli("offers", "--sim", "--profile", "smoke", "--max-usd", "0.0015", "--json", home=tmp_path)
    assert "(--max-usd)" in flagged.stdout and "$0.0015" in flagged.stdout


def test_the_cap_source_is_the_profile_when_nothing_else_set_it(tmp_path):
    spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path), environ={})
    assert spec.max_usd_source == "profile smoke"
    spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path, max_usd=2), environ={})
    assert spec.max_usd_source == "--max-usd"


def test_eight_gpu_qualified_with_another_num_gpus_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--eight-gpu-qualified rents 8 GPUs; --num-gpus 2"):
        resolve(RunOptions(profile="mfu", sim=True, state_dir=tmp_path, eight_gpu_qualified=True, num_gpus=2),
                environ={})
    spec = resolve(RunOptions(profile="mfu", sim=True, state_dir=tmp_path, eight_gpu_qualified=True, num_gpus=8),
                   environ={})
    assert spec.filters.num_gpus == 8
    done = cli("--profile", "mfu", "--sim", "--eight-gpu-qualified", "--num-gpus", "2", "--dry-run", home=tmp_path)
    assert done.returncode == 2 and "--num-gpus 2" in done.stderr


def test_a_settings_malformed_key_is_shown_a_secrets_is_not():
    with pytest.raises(ConfigError, match=r"got '1X'=\.\.\."):
        parse_remote_env(["1X=2"])
    with pytest.raises(ConfigError, match="<malformed>"):
        parse_remote_env(["sk-live-123=2"], flag="--remote-secret", environ={}, secret=True)


def test_help_and_docs_say_the_same_of_secrets():
    shown = cli("-h").stdout
    flat = " ".join(shown.split())
    assert "stored by name only" in flat and "never stored" not in flat
    assert "stored by name only" in (ROOT / "docs" / "cli.md").read_text()
    assert "chromium-driver" in (ROOT / "docs" / "development.md").read_text()


def complete(home: Path, words: str, cword: int) -> list[str]:
    done = cli(home=home, env={"_VAST_E2E_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    return done.stdout.split()


def test_completion_offers_profiles_runs_and_rank_by_values(tmp_path):
    (tmp_path / "mine.toml").write_text("")
    (tmp_path / "state" / "sim" / "20260101T000000Z-abcdef" / "steps").mkdir(parents=True)
    assert complete(tmp_path, "vast-e2e --profile s", 2) == ["smoke"]
    assert complete(tmp_path, "vast-e2e --profile m", 2) == ["mfu", "mine.toml"]
    assert complete(tmp_path, "vast-e2e offers --rank-by u", 3) == ["usd-per-mtok"]
    assert complete(tmp_path, "vast-e2e logs 2026", 2) == ["20260101T000000Z-abcdef"]
    assert complete(tmp_path, "vast-e2e report ", 2) == ["20260101T000000Z-abcdef"]


def test_check_prints_money_as_money(tmp_path):
    done = cli("check", "--sim", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"credit \$\d+\.\d{2}, balance \$\d+\.\d{2}: \$\d+\.\d{2} spendable", done.stdout), done.stdout


@pytest.mark.parametrize(("args", "code"), [(("--max-usd", "0.0001"), 5), (("--max-minutes", "0.01"), 2)])
def test_a_run_refused_before_renting_leaves_no_evidence_report_or_steps_table(tmp_path, args, code):
    done = cli("--profile", "smoke", "--sim", *args, home=tmp_path)
    assert done.returncode == code, done.stderr
    assert not list((tmp_path / "state").glob("**/harness-result.json"))
    assert not [p for p in (tmp_path / "state" / "sim").iterdir() if p.name.startswith("2")]
    assert "Run " not in done.stdout and "report" not in done.stdout  # no empty steps table, no report line
    flat = " ".join(done.stdout.split())
    assert f"exit {code}:" in flat and "no evidence kept" in flat
    costs = json.loads(cli("costs", "--json", home=tmp_path).stdout)
    assert costs["runs"] == []


def test_the_profile_rule_is_said_where_a_run_refuses_its_absence(tmp_path):
    # One rule, said where it bites: a run needs --profile; the read-only commands and fleet default to mfu.
    done = cli("--sim", "--dry-run", home=tmp_path)
    assert done.returncode == 2 and "offers, check and fleet default to mfu" in " ".join(done.stderr.split())
    assert "`offers`, `check` and `fleet` default to `mfu`" in (ROOT / "docs" / "cli.md").read_text()
