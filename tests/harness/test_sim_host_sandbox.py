"""A `--sim` run's host is a sandbox: its `python` and `pip` are one environment of its own, and nothing outside
the sandbox is written (issue 43 item 3: `--setup 'pip install -r requirements.txt'`, the line docs/run.md
suggests, ran the machine's global pip while `python` was the harness's venv, wrote ~3 GB into the global
Python and replaced its setuptools). Through the CLI, as a user runs it: a local package installed with pip, a
second with `pip --user`, both imported by the next step; the interpreters' site-packages, the user's site dir
and HOME unchanged; a second run does not see the first's packages."""

from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from tests.sim.localpkg import write_local_package


def _listing(path: Path, *, times: bool) -> dict[str, float]:
    """Names of `path`'s entries, with their modification times when `times` (a package pip replaced has a new
    one); empty when it does not exist. A `__pycache__`'s time is left out: the suite's other workers import
    modules too."""
    if not path.is_dir():
        return {}
    return {e.name: e.stat(follow_symlinks=False).st_mtime if times and e.name != "__pycache__" else 0.0
            for e in os.scandir(path)}


def _outside() -> dict[str, dict[str, float]]:
    """What a pip writing outside the sandbox would change: every site-packages this interpreter and its base
    import from (names and times), the user's site dir and HOME (names: the session shares HOME)."""
    dirs = {p for p in sys.path if "site-packages" in p} | set(site.getsitepackages([sys.base_prefix]))
    found = {d: _listing(Path(d), times=True) for d in sorted(dirs)}
    found |= {d: _listing(Path(d), times=False) for d in (site.getusersitepackages(), os.environ["HOME"])}
    return found


@pytest.mark.slow  # builds and installs a package
def test_pip_on_a_sim_host_installs_into_the_sandbox_and_nothing_outside_changes(tmp_path):
    work = tmp_path / "proj"
    (work / "pkgs").mkdir(parents=True)  # not at the top: `import` from the workdir would find their sources
    write_local_package(work / "pkgs", "vhsimlocal", 40)
    write_local_package(work / "pkgs", "vhsimuser", 2)
    before = _outside()
    evidence = tmp_path / "ev"
    check = ("import vhsimlocal, vhsimuser, sys; print('sum', vhsimlocal.VALUE + vhsimuser.VALUE); "
             "print('prefix', sys.prefix); print('files', vhsimlocal.__file__, vhsimuser.__file__)")
    p = cli("run", "--sim", "--workdir", str(work), "--evidence-dir", str(evidence), "--json",
            "--setup", "pip install ./pkgs/vhsimlocal", "--setup", "python -m pip install --user ./pkgs/vhsimuser",
            "--setup", 'echo "$VAST_SIM_HOST"', "--", "python", "-c", check, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    run_log = (run_dir / "steps" / "run.log").read_text()
    assert "sum 42" in run_log
    prefix = next(line.split()[1] for line in run_log.splitlines() if line.startswith("prefix "))
    files = next(line.split()[1:] for line in run_log.splitlines() if line.startswith("files "))
    assert prefix.endswith("/.sim/python") and prefix != sys.prefix  # the sandbox's own venv
    assert files[0].startswith(prefix) and "/.local/lib/" in files[1]
    said = (run_dir / "steps" / "setup-3.log").read_text()
    assert "simulated host: Python" in said and "network off" in said  # what the host offers, said on it
    assert _outside() == before  # no package, no __pycache__, no user site, nothing new in HOME

    again = cli("run", "--sim", "--workdir", str(work), "--evidence-dir", str(tmp_path / "ev2"), "--json",
                "--", "python", "-c", "import vhsimlocal", cwd=tmp_path)
    assert again.returncode == 1, again.stderr[-2000:]  # a second run's host never sees the first's packages
    record = json.loads(next((tmp_path / "ev2").glob("*/harness-result.json")).read_text())
    assert record["steps"][-1]["rc"] != 0 and record["absence"]["verdict"] == "gone"
    assert _outside() == before
