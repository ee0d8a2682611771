"""The chaos suite's artifact kind (issue 43, vast_harness/chaos/artifacts.py): a secret inside a binary artifact.

The default set checks the draw and that the judge can fail (an artifact rewritten by masking, a warning left
out, the value in a log or in a file others may read); each variant is one slow test that runs the real CLI in
its own process against the simulator.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from vast_harness import chaos
from vast_harness.chaos.account import VARIANTS, AccountPlan
from vast_harness.chaos.artifacts import ARTIFACT, artifact_violations, expected_artifact
from vast_harness.chaos.judge import secret_leaks
from vast_harness.redact import Redactor

VALUE = "hf_judgeTestValue0123456789"


def test_the_kind_is_drawn_with_each_of_its_variants():
    assert "secret_artifact" in chaos.ACCOUNT_KINDS
    drawn = {p.variant for p in (chaos.draw_account(s) for s in range(400)) if p.kind == "secret_artifact"}
    assert drawn == set(VARIANTS["secret_artifact"])


def test_the_expected_artifact_is_a_torch_save_like_archive_holding_the_value():
    made = expected_artifact("zip", 7, VALUE)
    assert made == expected_artifact("zip", 7, VALUE)  # the judge's copy is the host's, byte for byte
    with zipfile.ZipFile(BytesIO(made)) as zf:
        assert zf.namelist() == ["archive/data.pkl", "archive/data/0", "archive/version"]
    assert VALUE.encode() in made and VALUE.encode() in expected_artifact("raw", 7, VALUE)


def _run_dir(tmp_path: Path, kept: bytes, *, secrets_found: dict[str, list[str]], report: str,
             host: bytes | None = None) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "artifacts" / "out").mkdir(parents=True)
    (run_dir / "artifacts" / ARTIFACT).write_bytes(kept)
    (run_dir / "artifacts" / ARTIFACT).chmod(0o600)
    record = {"artifacts": {"sha256": {ARTIFACT: hashlib.sha256(kept).hexdigest()},
                            "host_sha256": {ARTIFACT: hashlib.sha256(host if host is not None else kept).hexdigest()},
                            "secrets_found": secrets_found}}
    (run_dir / "harness-result.json").write_text(json.dumps(record))
    (run_dir / "report.html").write_text(report)
    return run_dir


def test_the_judge_passes_a_run_that_kept_the_bytes_and_said_so(tmp_path):
    made = expected_artifact("zip", 3, VALUE)
    run_dir = _run_dir(tmp_path, made, secrets_found={ARTIFACT: ["HF_TOKEN"]}, report=f"{ARTIFACT} HF_TOKEN")
    console = f"warning: artifact {ARTIFACT} holds the secret HF_TOKEN: kept byte for byte"
    assert artifact_violations(run_dir / "artifacts" / ARTIFACT, made, run_dir, "HF_TOKEN", console) == []
    assert secret_leaks(tmp_path, VALUE, kept=run_dir / "artifacts" / ARTIFACT) == []


def test_the_judge_catches_a_masked_artifact_a_missing_warning_and_a_leak(tmp_path):
    """What the harness did before issue 43: the archive rewritten by masking (torch.load then refuses it), the
    warning nowhere; and a value in a log or a file others can read is a leak."""
    made = expected_artifact("zip", 3, VALUE)
    masked = Redactor([VALUE]).data(made)
    run_dir = _run_dir(tmp_path, masked, secrets_found={}, report="", host=made)
    kinds = [v.kind for v in artifact_violations(run_dir / "artifacts" / ARTIFACT, made, run_dir, "HF_TOKEN", "")]
    assert kinds == ["artifact_altered", "artifact_altered", "secret_unwarned", "secret_unwarned",
                     "secret_unwarned"]
    (run_dir / "steps").mkdir()
    (run_dir / "steps" / "run.log").write_text(f"wrote it, holding {VALUE}\n")
    kept = run_dir / "artifacts" / ARTIFACT
    kept.write_bytes(made)
    kept.chmod(0o644)
    leaks = secret_leaks(tmp_path, VALUE, kept=kept)
    assert [v.kind for v in leaks] == ["secret_leak", "secret_leak"]
    assert "run/steps/run.log" in leaks[0].detail and "644" in leaks[1].detail


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", VARIANTS["secret_artifact"])
def test_a_secret_inside_a_binary_artifact_holds_every_invariant(variant: str):
    outcome = chaos.run_account(AccountPlan(seed=43, kind="secret_artifact", variant=variant))
    assert not outcome.violations, (outcome.summary(), [v.detail[:500] for v in outcome.violations],
                                    outcome.log[-3000:])
    assert outcome.exit_codes == [0] and outcome.instances == 1
