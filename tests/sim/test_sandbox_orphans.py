"""A simulator killed -9 leaves its hosts' processes running (a dead-man switch retries its DELETE for ever
against an API that is gone: red team r6 found one after CI). The next simulator ends them: a process whose
sandbox marker names a simulator pid that no longer runs. Real processes, Linux /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vast_harness.sim.sandbox import MARKER_VAR, marker_for, reap_orphans

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
