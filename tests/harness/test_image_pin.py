"""Every profile's image says what it is (a tag) and which bytes (a digest), the tag's CUDA is the CUDA the
offer filter uses, the declared host check agrees with the tag, and the dry run shows tag and digest.

The old pin `pytorch/pytorch@sha256:cf9197f9…` had no tag, was declared "CUDA 12.8, cuDNN 9", and is
publicly `pytorch/pytorch:1.10.0-cuda11.3-cudnn8-runtime`: these tests make such a pin unrepresentable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from vast_harness.errors import ConfigError
from vast_harness.spec.profile import PROFILE_NAMES, ImageRef, load_profile
from vast_harness.spec.resolve import RunOptions, resolve

ROOT = Path(__file__).resolve().parents[2]
PIN = ("pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"
       "@sha256:eee11b3b3872a8c838e35ef48f08b2d5def2080902c7f666831310ca1a0ef2be")


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_profile_pins_tag_and_digest_and_its_cuda_matches_the_tag(name):
    prof = load_profile(name)
    ref = prof.image_ref
    assert ref.tag and re.fullmatch(r"sha256:[0-9a-f]{64}", ref.digest)
    cuda = re.search(r"cuda(\d+\.\d+)", ref.tag)
    assert cuda, f"{name}: tag {ref.tag} names no CUDA"
    assert float(cuda.group(1)) == prof.image_cuda
    if prof.image_expect is not None:
        assert prof.image_expect.cuda == cuda.group(1)
        assert ref.tag.startswith(prof.image_expect.torch + "-")
        assert f"cudnn{prof.image_expect.cudnn}" in ref.tag


def test_the_gpu_profiles_check_the_image_on_the_host_and_smoke_does_not():
    for name in ("mfu", "proofs"):
        prof = load_profile(name)
        assert prof.image == PIN
        probe = next(s for s in prof.steps if s.name == "env-probe")
        assert prof.steps[0] is probe  # before any workload minute
        assert probe.run.endswith("--expect-torch 2.11.0 --expect-cuda 12.8 --expect-cudnn 9"), probe.run
    smoke = load_profile("smoke")
    assert smoke.image_expect is None and "--expect" not in smoke.steps[0].run


def _profile_dir(tmp_path: Path, name: str, edit) -> Path:
    (tmp_path / "harness").mkdir(exist_ok=True)
    text = (ROOT / "profiles" / "harness" / f"{name}.toml").read_text()
    (tmp_path / "harness" / f"{name}.toml").write_text(edit(text))
    return tmp_path


@pytest.mark.parametrize(("name", "edit", "needle"), [
    ("smoke", lambda t: t.replace("pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime@", "pytorch/pytorch@"),
     "pinned by digest with its tag"),
    ("smoke", lambda t: t.replace("image_cuda = 12.8", "image_cuda = 12.4"), "contradicts the image tag"),
    ("smoke", lambda t: t.replace("2.11.0-cuda12.8-cudnn9-runtime", "2.11.0-runtime"), "names no CUDA"),
    ("mfu", lambda t: t.replace('torch = "2.11.0"', 'torch = "2.10.0"'), "image_expect.torch"),
    ("mfu", lambda t: t.replace('cudnn = "9"', 'cudnn = "8"'), "image_expect.cudnn"),
    ("mfu", lambda t: t.replace('cuda = "12.8"', 'cuda = "13.0"'), "image_expect.cuda"),
    ("mfu", lambda t: t.replace(" {image_expect}", ""), "no step runs the check"),
    ("mfu", lambda t: t.replace('cudnn = "9"', 'cudnn = "9; rm -rf ~"'), "image_expect.cudnn"),
])
def test_inconsistent_image_declarations_are_refused(tmp_path, name, edit, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        resolve(RunOptions(profile=name, sim=True), environ={}, profiles_dir=_profile_dir(tmp_path, name, edit))


def test_image_ref_parses_repo_tag_digest():
    ref = ImageRef.parse(PIN)
    assert (ref.repo, ref.tag, ref.cuda) == ("pytorch/pytorch", "2.11.0-cuda12.8-cudnn9-runtime", "12.8")
    assert ref.digest == "sha256:eee11b3b3872a8c838e35ef48f08b2d5def2080902c7f666831310ca1a0ef2be"


@pytest.mark.parametrize("name", PROFILE_NAMES)
@pytest.mark.slow
def test_dry_run_prints_tag_and_digest(name, tmp_path):
    p = cli("--profile", name, "--sim", "--dry-run", "--max-usd", "50", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    ref = load_profile(name).image_ref
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("image "))
    assert f"{ref.repo}:{ref.tag}" in line and ref.digest in line, line
