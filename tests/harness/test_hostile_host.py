"""A hostile host against the evidence: a file name that tries to forge a manifest line, and an evidence file
that grows forever while it is pulled. Real runs on the simulator over real SSH, checked with real tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.evidence.run import RunEvidence
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-hostile-key"
FORGED = "x\n" + "0" * 64 + "  harness-result.json"

needs_sha256sum = pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs GNU sha256sum")


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=23, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as server:
        yield server


def spec_with_steps(sim: SimServer, tmp_path: Path, *steps: Step):
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": list(steps)})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
        ).with_timings(teardown_margin_s=2.0)


def _check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sha256sum", "--strict", "-c", "manifest.sha256"], cwd=directory, capture_output=True,
                          text=True, check=False)


@needs_sha256sum
def test_a_forging_file_name_stays_one_escaped_manifest_line(tmp_path: Path):
    ev = RunEvidence(tmp_path / "run")
    (ev.dir / "harness-result.json").write_text("{}\n")
    (ev.dir / "remote" / FORGED).write_text("forged\n")
    (ev.dir / "remote" / "back\\slash\rcr").write_text("odd\n")
    ev.write_manifest()
    lines = (ev.dir / "manifest.sha256").read_text().splitlines()
    assert len(lines) == 3  # one per file, none forged
    check = _check(ev.dir)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == 3


@needs_sha256sum
def test_a_host_file_named_to_forge_the_manifest_does_not(sim, tmp_path: Path):
    """The host names a file "x\\n<64 zeros>  harness-result.json": the forged line must not make `sha256sum -c`
    fail harness-result.json; every entry checks out."""
    make = Step(name="forge", run="python3 -c \"import sys; open('evidence/' + sys.argv[1], 'w').write('x')\" "
                                  "\"$(printf 'x\\n%064d  harness-result.json' 0)\"", timeout_s=20)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec_with_steps(sim, tmp_path, make), client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    assert result.exit_code in (0, 4), result.message
    # the host's file came back under an escaped name (a newline in a local name is one more hostile byte), mapped
    escaped = FORGED.replace("\n", "\\x0a")
    assert (run.ev.dir / "remote" / escaped).is_file() and not (run.ev.dir / "remote" / FORGED).exists()
    assert run.pull is not None and run.pull.renamed == {FORGED: escaped}
    check = _check(run.ev.dir)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "harness-result.json: OK" in check.stdout and "FAILED" not in check.stdout


@pytest.mark.slow
def test_an_evidence_file_growing_for_ever_is_incomplete_evidence_not_a_cap(sim, tmp_path, monkeypatch):
    """A host file appended to for ever while pulled: the pull's own bound ends it with money and time to spare.
    That was exit 6 "cap reached ... 0 left on the host"; it is exit 1 naming what was left."""
    import json
    import time

    from vast_harness.run import host_work as hostwork

    monkeypatch.setattr(hostwork, "PULL_MAX_S", 3.0)
    sim.set_faults("slow_sftp:400000")  # the host writes faster than the link reads
    grow = Step(name="grow", run="echo a > evidence/a.json; echo z > evidence/zz.json; mkdir evidence/sub; "
                                 "sh -c 'while :; do head -c 100000 /dev/zero >> evidence/grow.log; sleep 0.05; done' "
                                 "</dev/null >/dev/null 2>&1 & sleep 0.3", timeout_s=20)
    try:
        with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
            run = GuardedRun(spec_with_steps(sim, tmp_path, grow), client, load_driver_policy(), Output(quiet=True))
            started = time.monotonic()
            result = run.execute()
    finally:
        sim.set_faults(None)
    assert result.exit_code == 1, result.message
    assert "pull's own 3 s bound" in result.message and "incomplete" in result.message
    assert "grow.log (cut while copying)" in result.message and "zz.json" in result.message
    assert time.monotonic() - started < 30
    record = json.loads((run.ev.dir / "harness-result.json").read_text())
    assert record["exit_code"] == 1 and record["absence"]["verdict"] == "gone"
    assert record["pull"]["left"][0] == "grow.log" and "zz.json" in record["pull"]["left"]
    assert "sub/" in record["pull"]["left"]
    assert record["accrued_usd"] < run.spec.caps.max_usd
