"""The kept host's interruptible families (`vast_harness/chaos/kept.py`): whole `up --interruptible`, `exec` and
`down` sequences on the hold's own simulator with real SSH and the real watcher, outbid at each family's moment,
judged by the run's family rules over the whole hold (never two live at once, no husk left, every start at or
after the last checkpoint, the bill under the cap and the `up`'s worst case, one attempt per instance)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from tests.tools import require_rsync
from vast_harness.chaos.kept import KeptOutcome, run_kept_family
from vast_harness.errors import ExitCode

pytestmark = pytest.mark.usefixtures("rsync")


@pytest.fixture
def rsync() -> str:
    return require_rsync()


def run_family(family: str, home: Path) -> KeptOutcome:
    def commands(args: Sequence[str]) -> tuple[int, str]:
        got = cli(*args, home=home)
        return got.returncode, got.stdout + got.stderr

    return run_kept_family(family, home, commands)


def assert_costs_and_report_list_every_host(got: KeptOutcome, home: Path) -> None:
    """`costs` (the table and --json) and the hold's report.html name every host of the hold (where, when, what
    it billed, why it ended) and the hold's total against its cap and the `up`'s worst case."""
    assert got.evidence_dir is not None
    where = str(got.evidence_dir.parent)
    answer = cli("costs", "--evidence-dir", where, "--json", home=home)
    assert answer.returncode == 0, answer.stderr
    run = next(r for r in json.loads(answer.stdout)["runs"] if r["dir"] == str(got.evidence_dir))
    ids = [a["instance_id"] for a in run["attempts"]]
    assert len(ids) == got.instances and run["instances"] == ids, run
    assert all(a["ended"] and a["started_unix"] > 0 for a in run["attempts"]), run["attempts"]
    assert run["attempts"][0]["ended"].startswith("outbid"), run["attempts"]
    assert run["max_usd"] == got.max_usd and run["worst_case_usd"] == pytest.approx(got.worst_case_usd)
    assert run["worst_case_usd"] >= run["accrued_usd"] >= got.billed_usd > 0, run
    table = cli("costs", "--evidence-dir", where, home=home)
    words = " ".join(table.stdout.split())
    assert f"{got.instances} host(s)" in words and "of the cap $" in words and "(worst case $" in words, table.stdout
    assert all(str(i) in table.stdout for i in ids), table.stdout
    report = (got.evidence_dir / "report.html").read_text()
    hosts = report.split('<table class="attempts">')[1].split("</table>")[0]
    assert hosts.count("<tr>") == got.instances + 1  # the header's row and one per host
    total = report.split('class="attempts-total">')[1].split("</p>")[0]
    assert "of the cap $" in total and "the worst case $" in total, total


def exits(got: KeptOutcome) -> list[tuple[str, int]]:
    return [(command, int(code)) for command, code in got.exits]


@pytest.mark.slow
def test_more_outbids_than_max_interruptions_end_the_hold_with_every_husk_gone(tmp_path: Path) -> None:
    got = run_family("outbid_past_the_limit", tmp_path)
    assert got.violations == [], got.output[-4000:]
    assert exits(got) == [("up", 0), ("exec", 0), ("exec", ExitCode.FAILED)], got.output[-4000:]
    assert "--max-interruptions 1" in " ".join(got.output.split())
    assert got.instances == 2 and got.outbids == 2 and len(got.attempts) == 2
    assert all(a["ended"].startswith("outbid") for a in got.attempts), got.attempts
    assert_costs_and_report_list_every_host(got, tmp_path)


@pytest.mark.slow
def test_an_outbid_during_the_ups_setup_is_replaced_and_the_setup_runs_again(tmp_path: Path) -> None:
    got = run_family("outbid_during_setup", tmp_path)
    assert got.violations == [], got.output[-4000:]
    assert exits(got) == [("up", 0), ("exec", 0), ("down", 0)], got.output[-4000:]
    assert got.instances == 2 and got.outbids == 1
    assert got.attempts[0]["ended"].startswith("outbid"), got.attempts
    assert got.evidence_dir is not None
    steps = (got.evidence_dir / "steps.tsv").read_text()
    assert "setup-1\t" in steps and "setup-1.r1\t" in steps, steps  # cut, then run again on the replacement
    assert "setup-1.r1\t0\t" in steps, steps
    assert_costs_and_report_list_every_host(got, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "hosts"), [
    ("outbid_during_exec", 2),
    ("outbid_between_execs", 2),
    ("outbid_between_execs_watcher_killed", 2),
    ("outbid_during_down", 1),
    ("husk_resumes_after_delete", 2),
])
def test_a_kept_hosts_outbid_is_salvaged_deleted_and_replaced_within_the_judges_rules(family: str, hosts: int,
                                                                                      tmp_path: Path) -> None:
    got = run_family(family, tmp_path)
    assert got.violations == [], got.output[-4000:]
    assert all(code == 0 for _, code in got.exits), got.output[-4000:]
    assert got.instances == hosts and got.outbids >= 1, got
    if hosts == 2:  # the exec after the outbid resumed from the salvaged checkpoint
        assert got.resumes and all(start is not None and start >= step for step, start in got.resumes), got.resumes
        assert got.resumes[-1][0] > 0, got.resumes
        assert_costs_and_report_list_every_host(got, tmp_path)
    if family == "husk_resumes_after_delete":
        assert got.resumed >= 1, got
