"""How a step ends (issue 43, items 5 and 7): on its command's exit status, even when a background process it
started keeps the output open (the run went on to the time cap, billed every second, and a daemonising `--setup`
kept the command from ever running); with its output in the order the program printed it; and never held by a
step log that blocks (a FIFO in the evidence directory).

Whole runs on the embedded simulator's hosts over real SSH (the simulator's sshd sends the exit status when the
command exits, as OpenSSH's does: tests/sim/test_ssh.py, and tests/harness/test_openssh.py against OpenSSH).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli
from vast_harness.console.output import Output
from vast_harness.errors import ExitCode
from vast_harness.run import stuck
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-train"
SIM_OPTIONS = dict(seed=45, rate_scale=0.01, boot_seconds=0.1, num_offers=200)  # conftest.sim
STEP_ENDS_WITHIN_S = 15.0  # the exit status, a 2 s drain, and a loaded machine's slack; the cap is minutes away
KEY = "sim-step-end-key"


def _record(evidence: Path) -> dict:
    (run_dir,) = [d for d in evidence.iterdir() if (d / "harness-result.json").exists()]
    return json.loads((run_dir / "harness-result.json").read_text())


def _said(p) -> str:
    return " ".join((p.stdout + p.stderr).split())


def test_a_command_that_leaves_a_background_child_ends_on_its_exit_status(tmp_path):
    evidence = tmp_path / "ev"
    started = time.monotonic()
    p = cli("run", "--sim", "--workdir", str(EXAMPLE), "--max-minutes", "3", "--evidence-dir", str(evidence), "--",
            "sh", "-c", "sleep 300 & echo started; exit 0", cwd=tmp_path)
    took_s = time.monotonic() - started
    assert p.returncode == 0, p.stderr[-3000:]
    assert took_s < 90, took_s  # not the 3-minute cap
    (step,) = _record(evidence)["steps"]
    assert step["name"] == "run" and step["rc"] == 0 and step["seconds"] < STEP_ENDS_WITHIN_S
    assert step["output_left_open"] is True and "background process" in step["detail"]
    assert "step run: a background process it started kept its output open" in _said(p)


def test_a_setup_that_starts_a_daemon_lets_the_command_run(tmp_path):
    evidence = tmp_path / "ev"
    p = cli("run", "--sim", "--workdir", str(EXAMPLE), "--max-minutes", "3", "--evidence-dir", str(evidence),
            "--setup", "(while sleep 0.2; do echo tick; done) & echo daemon up", "--", "sh", "-c",
            "echo the command ran", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    record = _record(evidence)
    assert [(s["name"], s["rc"]) for s in record["steps"]] == [("setup-1", 0), ("run", 0)]
    assert record["steps"][0]["output_left_open"] and record["steps"][0]["seconds"] < STEP_ENDS_WITHIN_S
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    assert "the command ran" in (run_dir / "steps" / "run.log").read_text()
    assert "daemon up" in (run_dir / "steps" / "setup-1.log").read_text()


def test_interleaved_stdout_and_stderr_come_back_in_the_order_printed(tmp_path):
    """A shell's writes and a Python program's prints (unbuffered on the host), one stream in print order."""
    evidence = tmp_path / "ev"
    script = ('for i in $(seq 1 150); do echo "sh out $i"; echo "sh err $i" >&2; done; '
              'python -c "import sys\nfor i in range(1, 151): print(\'py out\', i); print(\'py err\', i, '
              'file=sys.stderr)"')
    p = cli("run", "--sim", "--workdir", str(EXAMPLE), "--evidence-dir", str(evidence), "--", "sh", "-c", script,
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    lines = (run_dir / "steps" / "run.log").read_text().splitlines()
    expected = [f"{who} {stream} {i}" for who in ("sh", "py") for i in range(1, 151) for stream in ("out", "err")]
    assert lines == expected


@pytest.mark.usefixtures("clean_sim")
@pytest.mark.parametrize("fifo", ["steps/a.log", "steps.tsv"])
def test_a_fifo_in_the_evidence_dir_never_holds_the_run(fifo: str, sim: SimServer, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    """A FIFO where the step's log (or the steps table) goes: opening it to write would wait for a reader for
    ever. The run refuses it as an evidence file it cannot write, and ends long before its cap (exit 1, the
    instance deleted and proven gone)."""
    monkeypatch.setattr(stuck, "exit_process", lambda code: None)  # a held run must not end the test process
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="a", run="echo hi", timeout_s=30)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "caps": spec.caps.model_copy(update={"max_minutes": 5.0})})
    run_id = "20261206T000000Z-f1f0f0"
    run_dir = tmp_path / "ev" / run_id
    (run_dir / "steps").mkdir(parents=True)
    os.mkfifo(run_dir / fifo)
    with VastClient(KEY, base_url=sim.url, pacing_scale=0.01) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True), run_id=run_id)
        box: dict[str, object] = {}
        worker = threading.Thread(target=lambda: box.update(result=run.execute()), daemon=True)
        started = time.monotonic()
        worker.start()
        worker.join(90)
        held = worker.is_alive()
        if held:  # a reader lets the held open return, so the run can tear down before the client closes
            os.close(os.open(run_dir / fifo, os.O_RDONLY | os.O_NONBLOCK))
            worker.join(90)
        assert not held, f"the run was held by the FIFO at {fifo} for {time.monotonic() - started:.0f} s"
    result = box["result"]
    assert result.exit_code == ExitCode.FAILED, result.message  # type: ignore[attr-defined]
    assert fifo in result.message and "a FIFO" in result.message  # type: ignore[attr-defined]
    ours = [i for i in sim.state()["instances"] if i["label"] in run.book.labels()]
    assert ours and not any(i["live"] for i in ours)
    assert [s.rc for s in run.steps] == [0]
