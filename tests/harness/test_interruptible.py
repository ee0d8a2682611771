"""`--interruptible` (docs/interruptible.md): bad input refused before renting, the worst case over k
interruptions, and whole runs on the simulator under the bid book's faults, judged by the chaos family's rules
(never two live instances at once, no husk left, the resume at or after the last checkpoint, the bill under the
caps and under the dry run's worst case)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from tests.tools import require_rsync
from vast_harness.chaos.interrupt import SWITCH_FAMILIES, InterruptOutcome, run_family, run_seeded, run_switch_family
from vast_harness.errors import ExitCode

needs_rsync = pytest.mark.usefixtures("rsync")


@pytest.fixture
def rsync() -> str:
    return require_rsync()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_text("print('hi')\n")
    return wd


@pytest.mark.parametrize(("flags", "said"), [
    (["--resume", "python r.py"], "only with --interruptible"),
    (["--interruptible", "--resume", "python r.py"], "--resume needs --checkpoint"),
    (["--interruptible", "--checkpoint", "../elsewhere"], "outside the workdir"),
    (["--interruptible", "--checkpoint", "/abs"], "outside the workdir"),
    (["--interruptible", "--bid", "200"], "outside Vast's bid range"),
    (["--interruptible", "--bid", "cheap"], "'auto' or a price"),
    (["--interruptible", "--bid", "0.001"], "below the min_bid of every offer"),
    (["--on-outbid", "wait:5"], "only with --interruptible"),
    (["--interruptible", "--on-outbid", "wait:0"], "minutes must be > 0"),
    (["--interruptible", "--on-outbid", "wait:soon"], "'replace' or 'wait:MINUTES'"),
    (["--interruptible", "--on-outbid", "later"], "'replace' or 'wait:MINUTES'"),
])
def test_bad_input_is_exit_2_before_anything_is_rented(workdir: Path, tmp_path: Path, flags: list[str],
                                                       said: str) -> None:
    result = cli("run", "--sim", "--workdir", str(workdir), "--evidence-dir", str(tmp_path / "ev"), *flags,
                 "--", "python", "train.py", home=tmp_path)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert said in " ".join((result.stdout + result.stderr).split())
    assert not list((tmp_path / "ev").rglob("ledger.jsonl")) or "intent" not in "".join(
        p.read_text() for p in (tmp_path / "ev").rglob("ledger.jsonl"))


def test_the_dry_run_quotes_k_interruptions_at_the_bid(workdir: Path, tmp_path: Path) -> None:
    base = ["run", "--sim", "--dry-run", "--workdir", str(workdir), "--evidence-dir", str(tmp_path / "ev")]
    none = cli(*base, "--", "python", "train.py", home=tmp_path)
    two = cli(*base, "--interruptible", "--checkpoint", "ckpt", "--", "python", "train.py", home=tmp_path)
    four = cli(*base, "--interruptible", "--checkpoint", "ckpt", "--max-interruptions", "4", "--", "python",
               "train.py", home=tmp_path)
    for result in (none, two, four):
        assert result.returncode == 0, result.stderr
    text = {name: " ".join((r.stdout + r.stderr).split()) for name, r in (("none", none), ("two", two), ("four", four))}
    assert "bid $" in text["two"] and "min_bid $" in text["two"] and "2 interruption(s)" in text["two"]
    assert "4 interruption(s)" in text["four"] and "interruption" not in text["none"]

    def worst(words: str) -> float:
        return float(words.split("-> worst case $")[1].split(";")[0].split()[0])

    assert worst(text["four"]) > worst(text["two"]) > worst(text["none"])


@needs_rsync
@pytest.mark.parametrize("family", ["outbid_running", "outbid_boot", "outbid_twice", "outbid_during_copy",
                                    "husk_resumes_after_delete"])
def test_an_outbid_run_is_salvaged_replaced_and_resumed_within_the_judges_rules(family: str, tmp_path: Path) -> None:
    got = run_family(family, tmp_path, seed=1)
    assert got.violations == [], got.output
    assert got.exit_code == ExitCode.PASSED, got.output
    assert got.instances >= 2  # the husk and its replacement, one after the other
    if family == "outbid_boot":  # paused before it ran: deleted and replaced like a host that did not boot
        assert "stopped" in got.output
    else:
        assert got.resumes, got.output  # the judge checked each start against the checkpoints
        assert "outbid (" in got.output
    assert_costs_and_report_list_every_host(got, tmp_path)


def assert_costs_and_report_list_every_host(got: InterruptOutcome, work: Path) -> None:
    """The console, `costs` and report.html name every host of the run, why it ended, and the total against the
    caps."""
    assert got.run_dir is not None
    said = [line for line in got.output.splitlines() if re.match(r"host \d+ \(machine ", line)]
    assert len(said) == got.instances and f"{got.instances} host(s): $" in got.output, got.output
    answer = cli("costs", "--evidence-dir", str(work / "ev"), "--json", home=work)
    assert answer.returncode == 0, answer.stderr
    run = next(r for r in json.loads(answer.stdout)["runs"] if r["dir"] == str(got.run_dir))
    assert len(run["attempts"]) == got.instances
    assert all(a["ended"] for a in run["attempts"]), run["attempts"]
    assert any(a["ended"].startswith("outbid") for a in run["attempts"]), run["attempts"]
    assert run["max_usd"] > 0 and run["worst_case_usd"] >= run["accrued_usd"] > 0
    assert sum(a["accrued_usd"] for a in run["attempts"]) <= run["accrued_usd"] + 1e-6
    table = cli("costs", "--evidence-dir", str(work / "ev"), home=work)
    words = " ".join(table.stdout.split())
    assert f"{got.instances} host(s)" in words and "of the cap $" in words, table.stdout
    report = (got.run_dir / "report.html").read_text()
    hosts = report.split('<table class="attempts">')[1].split("</table>")[0]
    assert hosts.count("<tr>") == got.instances + 1  # the header's row and one per host
    assert 'class="bad">outbid' in hosts and "of the cap $" in report


@needs_rsync
def test_outbids_past_the_limit_stop_the_run_with_every_husk_gone(tmp_path: Path) -> None:
    got = run_family("outbid_past_the_limit", tmp_path, seed=1, max_interruptions=0)
    assert got.violations == [], got.output
    assert got.exit_code == ExitCode.FAILED and "--max-interruptions 0" in got.message, got.output
    assert got.instances == 1
    assert_costs_and_report_list_every_host(got, tmp_path)


PROPERTY_SEEDS = int(os.environ.get("VH_INTERRUPT_SEEDS", "8"))


@needs_rsync
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(PROPERTY_SEEDS))
def test_the_dry_runs_worst_case_bounds_every_simulated_bill_over_seeded_outbids(seed: int, tmp_path: Path) -> None:
    """The property: over seeded random outbid timings and counts (during boot, after running, twice, a husk
    that resumes by itself after a DELETE that deleted nothing) and a random --max-interruptions, whatever the
    run's outcome, the simulator's bill (/_sim/state) is under the cap and the dry run's worst case, the run's
    own figure is between the two, no husk is left and no two instances of the run lived at once."""
    got = run_seeded(seed, tmp_path)
    assert got.violations == [], f"{got.family}\n{got.output}"
    assert got.exit_code in (ExitCode.PASSED, ExitCode.FAILED, ExitCode.CAP_REACHED), f"{got.family}: {got.message}"
    assert 0 < got.billed_usd <= got.accrued_usd <= got.worst_case_usd, got.family


@pytest.mark.parametrize("family", ["outbid_during_delete", "outbid_during_delete_then_resume"])
def test_an_outbid_during_the_final_delete_is_deleted_again_and_proven_not_recovered(family: str,
                                                                                     tmp_path: Path) -> None:
    # The teardown's DELETE races the outbid: answered 200, nothing deleted, the instance paused (and, in the
    # second, resuming by itself). The proof reads it still there and deletes it again; the finished run is not
    # "recovered" onto another host.
    got = run_family(family, tmp_path, seed=1)
    assert got.violations == [], got.output
    assert got.exit_code == ExitCode.PASSED, got.output
    assert got.instances == 1 and got.outbids == 1 and got.deletes >= 2, got
    if family.endswith("resume"):
        assert got.resumed == 1, got


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SWITCH_FAMILIES))
def test_an_outbid_during_the_switch_countdown_leaves_no_husk(family: str, tmp_path: Path) -> None:
    # The harness is gone; the outbid kills the switch with its container. A husk that stays paused is reap's
    # (named a husk, deleted, proven); one that resumes after the deadline is deleted by its switch at once, from
    # the deadline it wrote on its disk (a switch counting afresh is a violation).
    got = run_switch_family(family, tmp_path, seed=1)
    assert got.violations == [], got.output
    assert got.outbids == 1 and got.instances == 1, got
    if family.endswith("resumes_late"):
        assert got.resumed == 1, got
    else:
        assert got.exit_code == ExitCode.PASSED and "husk" in got.output, got.output


def test_on_outbid_wait_goes_on_on_the_same_host_when_it_resumes(tmp_path: Path) -> None:
    # --on-outbid wait:1: the husk resumes by itself 0.5 s after its pause; the run reconnects, its disk as it
    # was (no upload, which would wipe the checkpoint), and the command resumes from its own folder there.
    got = run_family("outbid_wait_resumes", tmp_path, seed=1)
    assert got.violations == [], got.output
    assert got.exit_code == ExitCode.PASSED, got.output
    assert got.instances == 1 and got.outbids == 1 and got.resumed == 1, got
    assert got.starts and got.starts[0] > 0, got.output  # from the checkpoint, not from scratch
    assert got.run_dir is not None
    record = json.loads((got.run_dir / "harness-result.json").read_text())
    (host,) = record["attempts"]
    assert host["pauses"] == 1 and host["paused_s"] > 0 and host["ended"] == "finished", host


@needs_rsync
def test_on_outbid_wait_that_runs_out_salvages_and_replaces(tmp_path: Path) -> None:
    got = run_family("outbid_wait_runs_out", tmp_path, seed=1)
    assert got.violations == [], got.output
    assert got.exit_code == ExitCode.PASSED, got.output
    assert got.instances == 2 and got.outbids == 1 and got.resumed == 0, got
    assert "did not resume within" in got.output and got.starts and got.starts[0] > 0, got.output
