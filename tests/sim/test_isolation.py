"""The simulator depends only on itself: no module of vast_harness/sim imports the harness around it."""

from __future__ import annotations

import ast
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parents[2] / "vast_harness" / "sim"


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the sim package
                names.append("vast_harness.sim" + ("." + node.module if node.module else ""))
            elif node.module:
                names += [node.module] + ([f"{node.module}.{a.name}" for a in node.names]
                                          if node.module == "vast_harness" else [])
    return names


def test_the_simulator_imports_nothing_of_the_harness():
    files = sorted(SIM_DIR.glob("*.py"))
    assert len(files) > 10
    outside = {f"{path.name}: {name}" for path in files for name in _imports(path)
               if (name == "vast_harness" or name.startswith("vast_harness."))
               and not (name == "vast_harness.sim" or name.startswith("vast_harness.sim."))
               and name != "vast_harness.resources"}  # the data-path leaf: standard library only, no harness
    assert not outside, sorted(outside)


def test_the_scan_sees_a_harness_import(tmp_path: Path):
    planted = tmp_path / "x.py"
    planted.write_text("from vast_harness.run.runner import GuardedRun\nfrom vast_harness import ledger\n")
    assert _imports(planted) == ["vast_harness.run.runner", "vast_harness", "vast_harness.ledger"]
