"""`--num-gpus 4/8` reach the workload: the mfu profile's HT_MFU_WORLDS follows the GPUs per offer, and the
sweep script and the replay step launch that many ranks on the dp<N> model profile."""

from __future__ import annotations

import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from vast_harness.spec.profile import load_profile
from vast_harness.spec.resolve import RunOptions, resolve

ROOT = Path(__file__).resolve().parents[2]


def _worlds(**flags: object) -> str:
    spec = resolve(RunOptions(profile="mfu", sim=True, dry_run=True, **flags), environ={})  # type: ignore[arg-type]
    return spec.remote_env["HT_MFU_WORLDS"]


def test_the_sweep_world_follows_the_gpus_per_offer() -> None:
    assert _worlds() == "2"  # the profile's own filters.num_gpus
    assert _worlds(num_gpus=4) == "4"
    assert _worlds(eight_gpu_qualified=True) == "8"
    assert _worlds(num_gpus=4, remote_env=["HT_MFU_WORLDS=1 4"]) == "1 4"  # an explicit --remote-env wins


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_world_the_sweep_can_ask_for_has_its_model_profile(world: int) -> None:
    def load(w: int) -> dict:
        return tomllib.loads((ROOT / "profiles" / "models" / f"mfu-dense-1b-dp{w}.toml").read_text())

    data = load(world)
    assert data["name"] == f"mfu-dense-1b-dp{world}" and data["world_size"] == world
    # the same workload at every world size: only the name, the description and the world differ
    same = {k: v for k, v in load(2).items() if k not in ("name", "description", "world_size")}
    assert {k: v for k, v in data.items() if k not in ("name", "description", "world_size")} == same


def _fake_python(bin_dir: Path, log: Path) -> None:
    """A python3 that logs its argv and writes the --out file it is given, as run_mfu_dist.py would."""
    bin_dir.mkdir()
    script = bin_dir / "python3"
    script.write_text(f"""#!/bin/bash
echo "$*" >> {log}
prev=""
for a in "$@"; do [ "$prev" = --out ] && echo '{{}}' > "$a"; prev="$a"; done
exit 0
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("world", [4, 8])
def test_the_sweep_and_the_replay_step_launch_that_many_ranks(tmp_path: Path, world: int) -> None:
    log = tmp_path / "argv.log"
    _fake_python(tmp_path / "bin", log)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HT_MFU_WORLDS": str(world), "HT_MFU_MB": "8",
           "HT_MFU_OUT": str(tmp_path / "ev")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "vast_mfu_remote.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = next(s for s in load_profile("mfu").steps if s.name == "replay")
    proc = subprocess.run(["bash", "-c", replay.run], env=env | {"HOME": str(tmp_path)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [line for line in log.read_text().splitlines() if "run_mfu_dist.py" in line]
    assert len(runs) == 2, runs  # one sweep point, one replay
    for line in runs:
        assert f"--nproc-per-node {world} " in line and f"--profile mfu-dense-1b-dp{world} " in line, line
    assert (tmp_path / "ev" / f"mfu-dp{world}-zero2o-mb8-compile-p2pon.json").exists()


def test_the_deterministic_replays_cudnn_wheel_is_installed_hash_pinned_into_a_private_dir() -> None:
    # Without nvidia-cudnn-frontend the replay runs on flash attention (0.95x the fast run, not 0.99x): the
    # profile installs it, hash-pinned, beside the bundle (never into the image's site-packages), best effort.
    from vast_harness.host.bundle import build_bundle

    steps = {s.name: s.run for s in load_profile("mfu").steps}
    deps = steps["host-deps"]
    assert "--require-hashes" in deps and "--target pydeps" in deps and "--no-deps" in deps
    assert "||" in deps  # a host that cannot reach PyPI still runs the profile
    assert list(steps).index("host-deps") < list(steps).index("mfu-sweep")
    for name in ("mfu-sweep", "replay"):
        assert steps[name].startswith("PYTHONPATH=$PWD/pydeps${PYTHONPATH:+:$PYTHONPATH} "), name
    reqs = [ln for ln in (ROOT / "remote" / "host-requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert reqs[0].startswith("nvidia-cudnn-frontend==") and all(
        ln.strip().startswith("--hash=sha256:") and len(ln.strip().split(":")[1].rstrip(" \\")) == 64
        for ln in reqs[1:])
    assert "remote/host-requirements.txt" in {m.name for m in _members(build_bundle())}


def _members(bundle):  # the bundle's tar entries
    import gzip
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle.data))) as tar:
        return tar.getmembers()
