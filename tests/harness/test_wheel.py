"""The harness as an installed wheel: data found without a checkout, the host payload is the manifest, no more.

The slow test builds the wheel, installs it into a fresh venv outside the checkout and runs the smoke profile
on the simulator from a temporary directory. The venv gets the wheel without its dependencies and borrows
them (and torch, which the simulated host's tiny CPU round needs) from the project's environment through a
.pth line: no network, and the checkout itself stays invisible to it (the editable install's .pth in that
environment is not processed, so neither `vast_harness` nor `remote` can come from the checkout).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import pytest

from vast_harness.host.bundle import HOST_PAYLOAD, build_bundle

ROOT = Path(__file__).resolve().parents[2]
DATA = "vast_harness/_data"


def _force_include() -> dict[str, str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]


def _bundle_names() -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(build_bundle().data), mode="r:gz") as tar:
        return tar.getnames()


def test_wheel_packages_every_host_payload_entry_at_the_same_relative_path():
    mapped = _force_include()
    for source, target in mapped.items():
        assert target == f"{DATA}/{source}", (source, target)
    missing = [e for e in HOST_PAYLOAD if not any(e == s or e.startswith(f"{s}/") for s in mapped)]
    assert not missing, f"in bundle.HOST_PAYLOAD but not in the wheel's force-include: {missing}"
    assert "profiles" in mapped  # the harness profiles and the qualified drivers are read by the control plane


def test_every_script_the_profiles_run_travels_and_local_tools_do_not():
    names = set(_bundle_names())
    # the commands only: comments may cite other projects' scripts (the image pin's sources)
    steps = "\n".join(line for p in sorted((ROOT / "profiles" / "harness").glob("*.toml"))
                      for line in p.read_text().splitlines() if not line.lstrip().startswith("#"))
    sweep = (ROOT / "scripts" / "vast_mfu_remote.sh").read_text()
    needed = set(re.findall(r"scripts/[\w.-]+", steps + sweep))
    assert needed and needed <= names, needed - names
    for module in set(re.findall(r"-m (remote(?:\.\w+)+)", steps)):
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__main__.py" in names, module
    for node_id in re.findall(r'"(tests/[\w/.]+)::', steps):
        assert node_id in names, node_id
    local = [n for n in names if n.startswith(("scripts/bench/", "scripts/gpu/")) or n == "scripts/vast_e2e.py"]
    assert not local, local  # benchmarks, GPU-machine drivers and the CLI script never travel
    assert not [n for n in names if n.startswith("vast_harness")]


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "-q", "--no-deps", "--python", str(python), str(wheel)],
                   check=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv (the README's only prerequisite)")
def test_installed_wheel_runs_the_smoke_profile_outside_the_checkout(tmp_path: Path):
    dist = tmp_path / "dist"
    subprocess.run(["uv", "build", "--wheel", "-q", "-o", str(dist), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    wheel = next(dist.glob("vast_harness-*.whl"))
    venv = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "VAST_API_KEY", "VAST_URL", "PYTHONSAFEPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), check=False, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    where = run("python", "-c", "import vast_harness; print(vast_harness.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    assert run("python", "-c", "import remote").returncode != 0  # the workload ships as data, not a package

    dry = run("vast-e2e", "--profile", "smoke", "--sim", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr[-3000:]
    # The installed wheel ships byte for byte the host payload the checkout would.
    assert json.loads(dry.stdout)["bundle"]["sha256"] == build_bundle().sha256

    offers = run("vast-e2e", "offers", "--profile", "smoke", "--sim")
    assert offers.returncode == 0, offers.stderr[-3000:]

    smoke = run("vast-e2e", "--profile", "smoke", "--sim", timeout=300)
    assert smoke.returncode == 0, (smoke.stdout[-2000:], smoke.stderr[-3000:])  # a qualified driver: exactly 0
    # The default evidence dir is the user's state dir (documented; $VAST_HARNESS_HOME, set per test by
    # tests/conftest.py), never site-packages nor the current directory; the ledger is there too.
    state = Path(env["VAST_HARNESS_HOME"]) / "sim"  # --sim runs keep their own state
    results = list(state.glob("*/harness-result.json"))
    assert len(results) == 1, smoke.stdout[-2000:]
    assert json.loads(results[0].read_text())["exit_code"] == smoke.returncode
    assert (state / "ledger.jsonl").is_file() and not list((state / "live").glob("*.json"))  # released
    assert not list(venv.rglob(".evidence")) and not list(work.rglob(".evidence"))

    # The fleet reads the workload's peak table as data: it once imported `remote`, which a wheel lacks.
    gpus = "RTX 5090,RTX 4090"
    fleet_dry = run("vast-e2e", "fleet", "--sim", "--gpus", gpus, "--num-gpus", "1", "--max-usd", "3",
                    "--max-minutes", "15", "--dry-run", "--json")
    assert fleet_dry.returncode == 0, fleet_dry.stderr[-3000:]
    assert "Traceback" not in fleet_dry.stderr
    fleet = run("vast-e2e", "fleet", "--sim", "--gpus", gpus, "--num-gpus", "1", "--max-usd", "3",
                "--max-minutes", "15", "--json", timeout=300)
    assert fleet.returncode in (0, 4), (fleet.stdout[-2000:], fleet.stderr[-3000:])
    assert "Traceback" not in fleet.stderr
    assert Path(json.loads(fleet.stdout)["report"]).is_file()
