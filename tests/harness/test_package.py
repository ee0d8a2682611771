"""The package's public surface and its one architectural rule: the control plane never imports torch."""

from __future__ import annotations

import subprocess
import sys

import vast_harness


def test_exported_members_match_all():
    exported = {name for name in dir(vast_harness) if not name.startswith("_")}
    modules = {"bundle", "cli", "client", "config", "errors", "evidence", "ledger", "lifecycle", "models", "offers",
               "onstart", "output", "pacing", "plan", "quote", "reap", "resources", "runner", "ssh", "sim"}
    assert exported - modules == set(vast_harness.__all__)


def test_control_plane_does_not_import_torch():
    code = ("import sys, vast_harness, vast_harness.cli, vast_harness.runner, vast_harness.reap; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
