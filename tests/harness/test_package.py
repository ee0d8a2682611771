"""The package's public surface and its one architectural rule: the control plane never imports torch."""

from __future__ import annotations

import ast
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
    code = ("import sys, vast_harness, vast_harness.cli.app, vast_harness.run.runner, vast_harness.ops.reap; "
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of `modules` a module imports at module level: also inside if/try/with and under
    `if TYPE_CHECKING:` (an annotation-only import is still an arrow between two modules, and a circle of
    them is two types in the wrong homes), not in functions (those are deliberate lazy imports). A package's
    own __init__, which Python runs before any of its submodules, counts only when named itself."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import sub` is the submodule when there is one, else pkg's name
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.If):
            stack.extend([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            stack.extend([*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)])
        elif isinstance(node, ast.With):
            stack.extend(node.body)
    return found & modules


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for top in ("vast_harness", "remote") for p in sorted((REPO / top).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        imported = _top_level_imports(ast.parse(path.read_text()), name, path.name == "__init__.py", set(files))
        graph[name] = imported - {name}
    return graph


def test_no_import_cycle_in_vast_harness_or_remote():
    """Module-level imports, annotation-only ones included, form no cycle: a runtime cycle makes the import
    order decide which names exist, and a TYPE_CHECKING one means a type lives in the wrong module."""
    graph = _import_graph()
    assert {"vast_harness.spec.resolve", "vast_harness.vast.client", "remote.mps.control"} <= graph.keys()
    assert "vast_harness.vast.url" in graph["vast_harness.vast.client"]  # the graph sees `from x import y` edges
    assert "vast_harness.vast.client" in graph["vast_harness.cli.app"]  # ... and the ones under `if TYPE_CHECKING:`
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_remote_does_not_import_the_harness():
    """remote/ is the workload on the GPU host, shipped without the control plane."""
    graph = _import_graph()
    assert not {m: sorted(i) for m, i in graph.items() if m.startswith("remote") and
                any(x.startswith("vast_harness") for x in i)}


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
