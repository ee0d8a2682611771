"""A simulator killed -9 leaves its hosts' processes running (a dead-man switch retries its DELETE for ever
against an API that is gone: red team r6 found one after CI) and its sandboxes in the temp dir (issue 43 item
3: 61 MB a run, the bundle and the unpacked workdir). The next simulator ends the processes (a sandbox marker
naming a simulator pid that no longer runs) and removes the sandbox roots whose owner lock it can take; so does
`vast-e2e reap`. Real processes, a real kill -9, Linux /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.harness.clirun import cli
from tests.sim.conftest import KEY, create, wait_for
from vast_harness.sim import SimServer
from vast_harness.sim.sandbox import MARKER_VAR, OWNER_LOCK, ROOT_PREFIX, _alive, marker_for, reap_orphans
from vast_harness.sim.server import spawn_standalone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _sleeper(marker: str) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER_VAR: marker}
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)  # escaped, like a setsid switch


def test_the_hosts_of_a_dead_simulator_are_ended_and_a_live_ones_are_not() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    live_sim = subprocess.Popen(["sleep", "60"])  # stands for another simulator still running
    orphan = _sleeper(f"{dead.pid}-25506161-1")
    of_live = _sleeper(f"{live_sim.pid}-25506162-2")
    ours = _sleeper(marker_for(25506163, 3))  # this process's own hosts
    try:
        assert marker_for(7, 8) == f"{os.getpid()}-7-8"
        assert orphan.pid in reap_orphans()
        assert orphan.wait(timeout=5) != 0
        for proc in (of_live, ours, live_sim):
            assert proc.poll() is None
    finally:
        for proc in (orphan, of_live, ours, live_sim):
            proc.kill()
            proc.wait()


def _sandbox_root(temp: Path, instance_id: int) -> Path:
    (home,) = temp.glob(f"{ROOT_PREFIX}*/C.{instance_id}")
    return home.parent


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir of the test's own, for this process and the simulators it starts: the suite's other
    simulators (other workers') sweep the machine's, and would race these tests for what a kill left there."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def _killed_simulator_with_a_host(temp: Path) -> tuple[Path, int]:
    """A standalone simulator with one running host (a long onstart), killed -9: its sandbox root and the
    onstart's pid, both left behind."""
    proc, url = spawn_standalone(["--seed", "3", "--offers", "20", "--rate-scale", "0"], env=dict(os.environ))
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as api:
            instance_id = create(api, onstart="echo $$ > onstart.pid; sleep 300")["new_contract"]
            root = _sandbox_root(temp, instance_id)
            pid_file = root / f"C.{instance_id}" / "onstart.pid"
            wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip())
    finally:
        proc.kill()  # SIGKILL: the simulator cleans nothing up
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    return root, int(pid_file.read_text())


def test_a_killed_simulators_sandboxes_are_removed_by_the_next_simulator_and_a_live_ones_are_not(temp: Path):
    live = SimServer(seed=1, num_offers=5)  # another simulator, running: its root is held
    try:
        root, onstart = _killed_simulator_with_a_host(temp)
        assert (root / OWNER_LOCK).is_file() and _alive(onstart)  # left behind, the host still running
        with SimServer(seed=2, num_offers=5):  # the next simulated run's start
            assert not root.exists()
            wait_for(lambda: not _alive(onstart))
            assert live.backend.host_root.is_dir()  # a live simulator's sandboxes stay
    finally:
        live.stop()
    assert not live.backend.host_root.exists()  # and a stopped one removes its own
    assert [p.name for p in temp.iterdir()] == []


def test_vast_e2e_reap_removes_a_killed_simulators_sandboxes(temp: Path, tmp_path: Path, fresh: SimServer):
    root, onstart = _killed_simulator_with_a_host(temp)
    assert root.is_dir()
    (tmp_path / "home").mkdir()
    p = cli("reap", "--evidence-dir", str(tmp_path / "ev"), "--proof-interval", "0.05", key=KEY, sim=fresh,
            home=tmp_path / "home", env={"TMPDIR": str(temp)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert not root.exists(), p.stderr[-2000:]
    assert "removed what 1 dead simulator(s) left: 1 sandbox dir(s)" in p.stderr, p.stderr[-2000:]
    wait_for(lambda: not _alive(onstart))
