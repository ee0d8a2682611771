"""The package's public surface and its one architectural rule: the control plane never imports torch."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import vast_harness

REPO = Path(vast_harness.__file__).resolve().parents[1]


def test_exported_members_match_all():
    exported = {name for name in dir(vast_harness) if not name.startswith("_")}
    modules = {m.name for m in pkgutil.iter_modules(vast_harness.__path__)}
    assert exported - modules == set(vast_harness.__all__)


def test_control_plane_does_not_import_torch():
    code = ("import sys, vast_harness, vast_harness.cli.app, vast_harness.run.runner, vast_harness.actions.reap; "
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
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                if name.startswith("vast_harness") and not name.startswith(allowed):
                    bad.setdefault(path.name, []).append(name)
    assert not bad


def test_the_import_contracts_hold():
    """The layers, the simulator's isolation, remote/'s independence and the absence of circles, as declared in
    pyproject.toml [tool.importlinter] (function-level and TYPE_CHECKING imports count). .ci/run runs it too."""
    # --no-cache: the cache would be written into the checkout (.import_linter_cache/)
    proc = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_importing_the_package_loads_nothing_and_installs_no_handler():
    """A lean __init__: `import vast_harness.sim` loads no control-plane module, the public names load when
    first used, and no import installs a signal handler (the CLI's quiet Ctrl-C is set by `cli.main` itself)."""
    code = ("import signal, sys; before = signal.getsignal(signal.SIGINT); import vast_harness.sim, vast_harness.cli; "
            "loaded = sorted(m for m in sys.modules if m.startswith('vast_harness') and not "
            "m.startswith(('vast_harness.sim', 'vast_harness.cli'))); "
            "print(loaded, signal.getsignal(signal.SIGINT) is before); import vast_harness as v; v.ExitCode; "
            "print('vast_harness.errors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split("\n")
    assert out[0] == "['vast_harness', 'vast_harness.resources'] True"
    assert out[1] == "True"


def test_version_starts_without_the_api_client_or_ssh():
    code = ("import sys; sys.argv = ['vast-e2e', '--version']\n"
            "from vast_harness.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('httpx', 'paramiko', 'tenacity') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]"), out
    assert "vast-e2e" in out


def _imports_anywhere(tree: ast.Module) -> set[str]:
    """Every module a file imports, at any depth (functions included: a lazy import still runs)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_control_plane_never_imports_remote():
    """`remote/` ships to the host as data and is not installed: an import of it works in a checkout and dies
    with ModuleNotFoundError from the wheel (the installed `fleet` did). Its data is read as files."""
    bad = {}
    for path in sorted((REPO / "vast_harness").rglob("*.py")):
        names = {n for n in _imports_anywhere(ast.parse(path.read_text())) if n == "remote" or n.startswith("remote.")}
        if names:
            bad[path.relative_to(REPO).as_posix()] = sorted(names)
    assert not bad


def test_the_rule_sees_a_lazy_import():
    tree = ast.parse("def f():\n    from remote.mfu import peak_for\n    import remote\n")
    assert {"remote.mfu", "remote"} <= _imports_anywhere(tree)
