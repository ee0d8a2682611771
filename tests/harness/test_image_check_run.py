"""On the simulator over real HTTP and SSH: the env-probe step stops a run whose image is not what the
profile declares before any workload minute (exit 1, deleted, proven absent), and no --remote-env value
reaches any file of a run's evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from remote.host import envprobe
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.01
KEY = "sim-image-key"


SIM_OPTIONS = dict(seed=13, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim


def _run(sim: SimServer, tmp_path: Path, profiles_dir: Path | None = None, remote_env: list[str] | None = None,
         remote_secret: list[str] | None = None, **flags):
    kw = {"profiles_dir": profiles_dir} if profiles_dir else {}
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              remote_env=remote_env or [], remote_secret=remote_secret or [], **flags),
                   environ={}, **kw)
    spec = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)}).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = run.execute()
    return run, result


def _declaring_profile(tmp_path: Path) -> Path:
    """smoke, declaring what its tag says (torch 2.11.0, CUDA 12.8, cuDNN 9)."""
    prof_dir = tmp_path / "profiles"
    (prof_dir / "harness").mkdir(parents=True)
    text = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    text = text.replace("\n[caps]", '\n[image_expect]\ntorch = "2.11.0"\ncuda = "12.8"\ncudnn = "9"\n\n[caps]', 1)
    text = text.replace("--out evidence/env.json", "--out evidence/env.json {image_expect}")
    (prof_dir / "harness" / "smoke.toml").write_text(text)
    return prof_dir


def test_an_image_that_is_not_the_declared_one_fails_before_the_workload(sim, tmp_path):
    # the simulated host has the local torch, which is not the declared image
    prof_dir = _declaring_profile(tmp_path)
    actual = envprobe.image_facts()
    assert not envprobe.version_matches("2.11.0", actual["torch"]), "this test needs a torch other than 2.11.0"

    r, result = _run(sim, tmp_path, prof_dir)
    assert result.exit_code == 1, result.message
    assert "env-probe" in result.message
    d = r.ev.dir
    rows = (d / "steps.tsv").read_text().splitlines()
    assert len(rows) == 1 and rows[0].startswith(f"env-probe\t{envprobe.IMAGE_MISMATCH_EXIT}\t")
    assert not (d / "steps" / "tiny-round.log").exists()  # no workload minute
    log = (d / "steps" / "env-probe.log").read_text()
    assert f"torch: the profile declares 2.11.0, the image has {actual['torch']}" in log
    assert (d / "remote" / "env.json").is_file()  # the probe's record still came back
    inst = next(i for i in sim.state()["instances"] if i["id"] == r.created[0].instance_id)
    assert not inst["live"]
    import json
    assert json.loads((d / "harness-result.json").read_text())["absence"]["verdict"] == "gone"


@pytest.mark.slow
def test_secret_values_never_reach_the_evidence_and_settings_do(sim, tmp_path):
    secrets = {"NCCL_SOCKET_IFNAME": "vhcanary-ifname-5521", "VH_PRIVATE_TOKEN": "vhcanary-token-7734"}
    r, result = _run(sim, tmp_path, remote_secret=[f"{k}={v}" for k, v in secrets.items()],
                     remote_env=["NCCL_DEBUG=vhsetting-warn"])
    assert result.exit_code == 0, result.message
    files = [p for p in (tmp_path / "ev").rglob("*") if p.is_file()]
    assert any(p.name == "env.json" for p in files) and any(p.name == "mfu-tiny.json" for p in files)
    for path in files:
        data = path.read_bytes()
        for value in secrets.values():
            assert value.encode() not in data, f"{value} in {path.relative_to(tmp_path)}"
    env_json = (r.ev.dir / "remote" / "env.json").read_text()
    assert '"NCCL_SOCKET_IFNAME": "***"' in env_json and "VH_PRIVATE_TOKEN" in env_json  # names, not values
    assert "vhsetting-warn" in (r.ev.dir / "harness-result.json").read_text()  # a setting is stored as given


def test_a_step_that_prints_a_secret_has_it_masked_and_a_setting_shown(sim, tmp_path, capsys):
    """Settings are not secrets: --remote-env BAR=flash leaves "attention backend: flash" as it is on the
    console and in the log, while a 3-character or multi-line secret is masked."""
    from vast_harness.spec.profile import Step

    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05,
                              remote_secret=["VH_PRIVATE_TOKEN=vhcanary-printed-4410", "SHORT=q7z",
                                             "MULTI=line-one\nline-two"],
                              remote_env=["BAR=flash"]), environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(
        name="leak", run='echo token=$VH_PRIVATE_TOKEN short=$SHORT; echo "$MULTI"; echo "attention backend: $BAR"; '
                         'echo "$MULTI" > evidence/multi.txt; echo hi > "evidence/f-$SHORT.txt"', timeout_s=30)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
        ).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output())
        result = run.execute()
    assert result.exit_code == 0, result.message
    log = (run.ev.dir / "steps" / "leak.log").read_text()
    assert "token=*** short=***" in log and "vhcanary-printed-4410" not in log
    assert "q7z" not in log and "line-one" not in log and "line-two" not in log
    assert "attention backend: flash" in log
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "vhcanary-printed-4410" not in shown and "q7z" not in shown and "line-two" not in shown
    assert "attention backend: flash" in shown
    record = (run.ev.dir / "harness-result.json").read_text()
    assert "q7z" not in record and '"BAR": "flash"' in record
    pulled = (run.ev.dir / "remote" / "multi.txt").read_text()
    assert "line-one" not in pulled and "***" in pulled
    assert json.loads(record)["pull"]["redacted"] == ["f-***.txt", "multi.txt"]
    # a secret in a pulled file's name is masked in the name too (the manifest lists names)
    names = [p.name for p in (run.ev.dir / "remote").iterdir()]
    assert "f-***.txt" in names and not [n for n in names if "q7z" in n]
    assert "q7z" not in (run.ev.dir / "manifest.sha256").read_text()



@pytest.mark.slow
def test_an_image_expect_override_runs_on_the_host_it_names_and_is_recorded(sim, tmp_path):
    # A host that is not a Vast container (the test GPU machine: torch built for CUDA 13) fails the profile's
    # CUDA 12.8 check; --image-expect says what to expect instead, and says so in the evidence and the report.
    import json

    actual = envprobe.image_facts()
    if not actual["torch"] or not actual["cuda"] or not actual["cudnn"]:
        pytest.skip("the local torch reports no CUDA/cuDNN version to expect")
    torch_v = actual["torch"].split("+")[0]
    cuda_v, cudnn_v = actual["cuda"], actual["cudnn"].split(".")[0]
    prof_dir = _declaring_profile(tmp_path)
    r, result = _run(sim, tmp_path, prof_dir, image_expect=f"torch={torch_v},cuda={cuda_v},cudnn={cudnn_v}")
    assert result.exit_code == 0, result.message
    record = json.loads((r.ev.dir / "harness-result.json").read_text())
    assert record["image_expect_override"] == {"torch": torch_v, "cuda": cuda_v, "cudnn": cudnn_v}
    assert f"--expect-cuda {cuda_v}" in (r.ev.dir / "steps" / "env-probe.log").read_text() or \
        r.spec.profile.steps[0].run.endswith(f"--expect-cudnn {cudnn_v}")
    assert "OVERRIDDEN by --image-expect" in (r.ev.dir / "report.html").read_text()
