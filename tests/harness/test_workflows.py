"""The GitHub Actions workflows: actionlint clean, and the facts users rely on, read from the parsed YAML.

actionlint comes from `.ci/install-actionlint.sh` (on PATH, or in $VH_TOOLS_DIR/bin). Missing, the lint
tests fail under CI=true and skip elsewhere; the YAML facts are checked either way.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CI = REPO / ".github" / "workflows" / "ci.yml"
PROOFS = REPO / ".github" / "workflows" / "proofs.yml"
TOOLS_DIR = Path(os.environ.get("VH_TOOLS_DIR", Path.home() / ".cache" / "vast-harness-tools"))


@pytest.fixture(scope="module")
def actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(TOOLS_DIR / "bin"))
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("actionlint is missing: run `bash .ci/install-actionlint.sh` first (CI must lint workflows)")
    pytest.skip("actionlint is not installed (bash .ci/install-actionlint.sh)")


def _lint(actionlint: str, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([actionlint, *map(str, files)], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)


def test_actionlint_finds_nothing_in_either_workflow(actionlint: str):
    result = _lint(actionlint, CI, PROOFS)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_actionlint_does_report_a_broken_workflow(actionlint: str, tmp_path: Path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    env:\n      K: ${{ runner.temp }}\n"
                   "    steps:\n      - run: echo ${{ github.no_such_property }}\n")
    result = _lint(actionlint, bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "runner" in result.stdout and "no_such_property" in result.stdout


# ----------------------------------------------------------------------------------------- YAML facts


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the bare key `on` as true
    return doc


def _steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in doc["jobs"].values() for step in job["steps"]]


def _runs(doc: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in _steps(doc))


def test_ci_runs_the_readme_tests_with_sshd_and_the_smoke_profile_on_the_simulator():
    doc = _load(CI)
    assert "push" in doc["on"]
    runs = _runs(doc)
    assert "pip install uv" in runs
    assert re.search(r"^uv run --extra workload pytest$", runs, re.MULTILINE)
    assert re.search(r"^uv run --extra workload vast-e2e --profile smoke --sim$", runs, re.MULTILINE)
    tests = [s.get("run", "") for s in doc["jobs"]["tests"]["steps"]]
    order = [next(i for i, r in enumerate(tests) if needle in r)
             for needle in (".ci/start-sshd.sh", ".ci/install-actionlint.sh", "pytest")]
    assert order == sorted(order), "sshd and actionlint must be ready before pytest"
    assert all(any(s.get("uses", "").startswith("actions/checkout@") for s in job["steps"])
               for job in doc["jobs"].values())


def test_proofs_is_dispatched_by_hand_with_the_caps_and_gpu_count():
    doc = _load(PROOFS)
    assert set(doc["on"]) == {"workflow_dispatch"}
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"max_usd", "max_minutes", "num_gpus"}
    assert all(spec["required"] and spec["description"] for spec in inputs.values())
    assert doc["concurrency"]["cancel-in-progress"] is False  # never cancel a paid run to start another


def _proofs_run() -> dict[str, Any]:
    return next(s for s in _steps(_load(PROOFS)) if s.get("id") == "run")


def test_proofs_runs_the_profile_through_this_repositorys_action_with_the_inputs():
    """The action (.github/actions/run, tests/harness/test_action.py) is what makes a cancel safe: its run step
    execs vast-e2e, so GitHub's SIGINT reaches it, and its reap, summary and upload run after a cancel too."""
    run = _proofs_run()
    assert run["uses"] == "./.github/actions/run"
    assert run["with"] == {"profile": "proofs", "max-usd": "${{ inputs.max_usd }}",
                           "max-minutes": "${{ inputs.max_minutes }}", "num-gpus": "${{ inputs.num_gpus }}",
                           "api-key": "${{ secrets.VAST_API_KEY }}", "artifact-name": "proofs-evidence-${{ github.run_id }}",
                           "retention-days": "90"}
    assert "reap" not in run["with"] and "upload" not in run["with"]  # the action's defaults: both on
    steps = _steps(_load(PROOFS))
    assert steps.index(run) == len(steps) - 1 and "always()" not in str(run.get("if", ""))


def test_proofs_key_comes_from_the_secret_into_the_action_only_and_is_never_shown():
    doc = _load(PROOFS)
    text = PROOFS.read_text()
    assert text.count("secrets.VAST_API_KEY") == 1 and _proofs_run()["with"]["api-key"] == "${{ secrets.VAST_API_KEY }}"
    assert "secrets" not in _runs(doc) and "set -x" not in _runs(doc) and "printenv" not in _runs(doc)
    assert "secrets" not in str(doc.get("env", {})) and all("secrets" not in str(j.get("env", {}))
                                                          for j in doc["jobs"].values())
    assert "${{" not in _runs(doc), "no expression inside a script: inputs travel through env"


def test_proofs_checks_its_time_cap_before_the_action_rents():
    steps = _steps(_load(PROOFS))
    check = next(i for i, s in enumerate(steps) if "max_minutes must be in (0, 180]" in s.get("run", ""))
    assert check < steps.index(_proofs_run())
    assert steps[check]["env"] == {"MAX_MINUTES": "${{ inputs.max_minutes }}"}


def test_the_action_pins_uv_and_installs_locked():
    action = (REPO / ".github" / "actions" / "run" / "action.yml").read_text()
    assert re.search(r'pip install [^\n]*"uv==\d+\.\d+\.\d+"', action)
    assert re.search(r"uv\" sync --project \"\$root\" --locked", action)


def test_ci_lints_with_ruff_before_the_tests():
    """Both CI entry points run `ruff check .` (rules pinned in pyproject.toml) before pytest."""
    for where, text in (("ci.yml", _runs(_load(CI))), (".ci/run", (REPO / ".ci" / "run").read_text())):
        lines = [line.strip() for line in text.splitlines()]
        lint = next((i for i, line in enumerate(lines) if line == "uv run ruff check ."), None)
        tests = next(i for i, line in enumerate(lines) if line.startswith("uv run --extra workload pytest"))
        assert lint is not None and lint < tests, f"{where}: `uv run ruff check .` must run before pytest"


def test_ci_yml_runs_what_ci_run_runs():
    """The installers, the checks and both pytest sessions of .ci/run are steps of ci.yml's tests job, in the
    same order, with the whole chaos suite in both."""
    script = (REPO / ".ci" / "run").read_text()

    def commands(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip().startswith(("uv run ", "bash .ci/"))]

    job = _load(CI)["jobs"]["tests"]
    assert commands(script) == commands("\n".join(step.get("run", "") for step in job["steps"]))
    assert {"uv run --extra workload mypy", "uv run lint-imports", "uv run --extra workload pytest -m slow"} <= set(commands(script))
    assert "export VH_CHAOS_FULL=1" in script and job["env"]["VH_CHAOS_FULL"] == "1"
    # Every test runs in CI: the README's command leaves out exactly the set the second session runs.
    addopts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert shlex.split(addopts)[-2:] == ["-m", "not slow"]


def test_ci_uploads_the_smoke_evidence_from_where_a_sim_run_writes_it():
    from vast_harness.state.dirs import SIM_SUBDIR

    job = _load(CI)["jobs"]["smoke-sim"]
    assert job["env"]["VAST_HARNESS_HOME"] == "${{ github.workspace }}/.evidence/vast"  # the state dir
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == f".evidence/vast/{SIM_SUBDIR}/"  # --sim runs keep their own state there
    assert "always()" in upload["if"]


def test_the_apt_installer_installs_only_what_is_missing_in_one_call_and_then_nothing(tmp_path: Path):
    """`.ci/apt-install.sh PKG[:COMMAND]...` (what .ci/run and ci.yml install with): apt-get here is a stand-in on
    PATH that records its calls and "installs" a package as a command of that name."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake_apt = bin_dir / "apt-get"
    fake_apt.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {calls}
if [ "$1" = install ]; then
  for arg in "$@"; do
    case "$arg" in -*|install) ;; *) printf '#!/bin/sh\\n' > "{bin_dir}/$arg"; chmod +x "{bin_dir}/$arg";; esac
  done
fi
""")
    (bin_dir / "sudo").write_text('#!/usr/bin/env bash\nexec "$@"\n')
    for tool in (fake_apt, bin_dir / "sudo"):
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def install(*packages: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REPO / ".ci" / "apt-install.sh"), *packages], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    wanted = ("vh-fake-tool-a", "vh-fake-pkg-b:vh-fake-cmd-b", "bash:/bin/bash")
    first = install(*wanted)
    assert first.returncode == 1, first.stderr  # vh-fake-pkg-b "installed" no vh-fake-cmd-b: said, not passed
    assert "vh-fake-cmd-b is still missing" in first.stderr
    assert calls.read_text().splitlines() == [
        "update -qq", "install -y -qq --no-install-recommends vh-fake-tool-a vh-fake-pkg-b"]  # bash: present
    (bin_dir / "vh-fake-cmd-b").write_text("#!/bin/sh\n")
    (bin_dir / "vh-fake-cmd-b").chmod(0o755)
    calls.unlink()
    again = install(*wanted)
    assert again.returncode == 0 and not calls.exists(), again.stderr  # everything answers: no apt at all
    assert install().returncode == 2
