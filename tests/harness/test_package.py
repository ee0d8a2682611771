"""The package's public surface and its one architectural rule: the control plane never imports torch."""

from __future__ import annotations

import subprocess
import sys

import vast_harness


def test_exported_members_match_all():
    exported = {name for name in dir(vast_harness) if not name.startswith("_")}
    modules = {"bundle", "cli", "client", "config", "errors", "evidence", "ledger", "lifecycle", "meter", "models", "offers",
               "onstart", "output", "pacing", "plan", "quote", "reap", "resources", "runner", "ssh", "sim", "chaos",
               "report", "svgplot", "fleet", "fleet_report", "tokrate"}
    assert exported - modules == set(vast_harness.__all__)


def test_control_plane_does_not_import_torch():
    code = ("import sys, vast_harness, vast_harness.cli, vast_harness.runner, vast_harness.reap; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_simulator_imports_nothing_of_the_harness():
    """The marketplace must not know the harness that drives it (docs/architecture.md, "Import arrows")."""
    import ast
    from pathlib import Path

    sim_dir = Path(vast_harness.__file__).parent / "sim"
    allowed = ("vast_harness.sim", "vast_harness.resources")  # resources: a stdlib-only data-path leaf
    bad = {}
    for path in sorted(sim_dir.glob("*.py")):
        if path.name == "chaos.py":  # a harness test engine, moving out of sim/ (issue 15, item 5)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                if name.startswith("vast_harness") and not name.startswith(allowed):
                    bad.setdefault(path.name, []).append(name)
    assert not bad
