"""`check_gpu_evidence.py --kind proofs` on a real run directory from the simulator, then tampered with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from remote.checks.proofs import check
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

EXPECTED_ON_A_NON_PROOFS_RUN = {"profile is 'smoke', not 'proofs'", "remote/mfu-proof.json is missing",
                                "remote/mps-manifest.json is missing", "remote/gpu-tests.xml is missing"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    ev = tmp_path_factory.mktemp("ev")
    with SimServer(seed=11, rate_scale=0.01, boot_seconds=0.05) as sim:
        spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=ev, proof_interval_s=0.1), environ={})
        steps = [Step(name="env-probe", run="echo '{}' > evidence/env.json", timeout_s=10),
                 Step(name="work", run="echo working", timeout_s=10)]
        spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"steps": steps}),
                                       "api_url": sim.url, "api_key": SecretStr("sim-proofs-check-key")})
        with VastClient("k", base_url=sim.url, pacing_scale=0.01) as client:
            run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
            result = run.execute()
            assert result.exit_code == 0, result.message
    return run.ev.dir


def test_generic_claims_hold_on_a_real_run(run_dir):
    failed = set(check(run_dir))
    failed.discard("driver_qualified is not true: no bitwise claim can be made")
    failed = {f for f in failed if not f.startswith("exit_code 4")}
    assert failed == EXPECTED_ON_A_NON_PROOFS_RUN


def test_a_tampered_file_breaks_the_manifest(run_dir, tmp_path):
    copy = tmp_path / "run"
    import shutil

    shutil.copytree(run_dir, copy)
    (copy / "steps" / "work.log").write_text("edited\n")
    (copy / "stray.txt").write_text("x")
    failed = check(copy)
    assert "manifest sha256 mismatch for steps/work.log" in failed
    assert "stray.txt is not in manifest.sha256" in failed


def test_absence_rounds_too_close_or_unknown_fail(run_dir, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    proof = json.loads((copy / "absence-proof.json").read_text())
    proof["interval_s"] = 3600
    rounds = proof["instances"][0]["proof"]["rounds"]
    rounds[-1]["list_by_label"]["status"] = 503
    (copy / "absence-proof.json").write_text(json.dumps(proof))
    failed = check(copy)
    assert any("less than 3600" in f for f in failed)
    assert any("list_by_label is not a 200" in f for f in failed)


def test_the_interval_floor_holds_for_a_real_api_whatever_the_run_recorded(run_dir, tmp_path):
    """A run against a non-loopback API that recorded a 0.1 s interval does not pass: the floor is 10 s."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert not [f for f in check(copy) if "apart" in f]  # loopback: the recorded interval stands
    result = json.loads((copy / "harness-result.json").read_text())
    result |= {"api_url": "https://console.vast.ai", "sim": False}
    (copy / "harness-result.json").write_text(json.dumps(result))
    assert any("less than 10.0 s apart" in f for f in check(copy))
