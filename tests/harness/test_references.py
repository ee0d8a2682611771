"""Every module, script and path the project names exists: in the code's comments and docstrings, in the docs,
and in the scripts, profiles and CI files whole. A module or script that moves cannot leave its old address
behind.

Five forms are checked: a path from the root (`vast_harness/caps/guard.py`, `scripts/bench/chaos.py`,
`tests/remote/test_gpu.py`), a path inside the package (`caps/guard.py`), a dotted module (`vast_harness.
views.status`, with at most one name after it that the module defines), a bare file name (`guard.py`), and a
module's class (`live.PhaseLog`). Other projects' files, which the docs cite with their sources, are listed below.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["vast_harness", "tests", "scripts", "docs", "profiles", "examples", ".ci", ".github"]
SKIPPED = ("tests/sim/vast-openapi/", "tests/harness/fixtures/")  # other projects' text, kept verbatim
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt"}

# Files that are not the project's: other projects' that the docs and comments cite (each with its source where
# it is named), and a test's made-up ones.
FOREIGN_PATHS = {
    "torch/version.py",  # PyTorch's (docs/image-pin.md)
    "src/generated.py",  # a workdir test_run_command.py makes up
    "scripts/lib/common.sh",  # microsoft/physical-ai-toolchain
    "scripts/update-image-digests.sh",  # microsoft/physical-ai-toolchain
    "tests/cli/test_machines_commands.py",  # vast-ai/vast-cli (docs/vast-behaviours.md)
}
FOREIGN_FILES = {
    "machines.py", "api_client.py", "compute.py", "price_increase.py", "test_template.py",  # vast-ai/vast-cli, dstack
    "prep.py",  # a user's own script in docs/run.md's example
}
WHEEL_ONLY = "vast_harness/_data"  # exists in an installed wheel only (vast_harness/resources.py)

_PATH = re.compile(r"(?<![\w/.$-])((?:vast_harness|scripts|tests|remote)/[\w./<>{}*$-]*[\w>}*])")
_IN_PACKAGE = re.compile(r"(?<![\w/.$-])([a-z_]+/[a-z_]+\.py)\b")
_DOTTED = re.compile(r"(?<![\w.])(vast_harness(?:\.\w+)+)")
_BARE = re.compile(r"(?<![\w/.$-])([a-z_][a-z0-9_]*\.py)\b")
_CLASS = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*)\.([A-Z][A-Za-z0-9]*[a-z]\w*)\b")


def _scanned_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for top in SCANNED:
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file() and "__pycache__" not in p.parts
                  and (p.suffix in TEXT_SUFFIXES or p.parent.name == ".ci")]
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(SKIPPED)]


def _python_texts(path: Path) -> list[tuple[int, str]]:
    """A module's comments and docstrings, each with its line (its other strings are data: a test's made-up
    paths, a message's placeholders)."""
    source = path.read_text()
    texts = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                texts.append((first.lineno, first.value.value))
    return texts


def _texts(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return _python_texts(path)
    return list(enumerate(path.read_text().splitlines(), 1))


_MODULE_FILES = [p for top in ("vast_harness", "remote", "scripts", "tests", "examples")
                 for p in (ROOT / top).rglob("*.py")]
_STEMS = {p.stem for p in _MODULE_FILES} | {p.name for p in (ROOT / "vast_harness").rglob("*") if p.is_dir()}
_TAILS = {f"{p.parent.name}/{p.name}" for p in _MODULE_FILES}
_PACKAGES = {p.parent.name for p in (ROOT / "vast_harness").glob("*/__init__.py")}


def _module_file(dotted: list[str]) -> Path | None:
    base = ROOT.joinpath(*dotted)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted_problem(name: str) -> str | None:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        module = _module_file(parts[:k])
        if module is not None:
            break
    else:
        return "no such module"
    if k == len(parts):
        return None
    attr = parts[k]
    if re.search(rf"(?m)(^|[\s(,\"])({attr})\b", module.read_text()):
        return None
    return f"{'.'.join(parts[:k])} defines no {attr}"


def _path_problem(path: str) -> str | None:
    path = path.rstrip(".")
    if any(c in path for c in "<>{}*$") or ".." in path:  # a pattern or a placeholder, not a path
        return None
    if path.startswith(WHEEL_ONLY) or path in FOREIGN_PATHS or (ROOT / path).exists():
        return None
    stem, dot, _attr = path.rpartition(".")
    if dot and (ROOT / f"{stem}.py").is_file():  # `remote/training/determinism.set_determinism`: a module's function
        return None
    return "no such file"


def _class_problem(module: str, name: str) -> str | None:
    if module in _STEMS:
        return None
    try:
        if importlib.util.find_spec(module) is not None:  # the standard library's or a dependency's
            return None
    except (ImportError, ValueError):
        pass
    return f"no module {module} (for {name})"


def _problems(rel: str, texts: list[tuple[int, str]]) -> list[str]:
    found = []
    for line, text in texts:
        for p in _PATH.findall(text):
            if (why := _path_problem(p)) is not None:
                found.append(f"{rel}:{line}: {p}: {why}")
        for p in _IN_PACKAGE.findall(text):
            if p.split("/")[0] in _PACKAGES and not (ROOT / "vast_harness" / p).is_file():
                found.append(f"{rel}:{line}: {p}: no such module in vast_harness/")
            elif p not in _TAILS and p not in FOREIGN_PATHS:  # e.g. remote's `checks/mfu.py`
                found.append(f"{rel}:{line}: {p}: no module of the project ends so")
        for name in _DOTTED.findall(text):
            if (why := _dotted_problem(name)) is not None:
                found.append(f"{rel}:{line}: {name}: {why}")
        for name in _BARE.findall(text):
            if name.removesuffix(".py") not in _STEMS and name not in FOREIGN_FILES:
                found.append(f"{rel}:{line}: {name}: no module of that name")
        for module, name in _CLASS.findall(text):
            if (why := _class_problem(module, name)) is not None:
                found.append(f"{rel}:{line}: {module}.{name}: {why}")
    return found


@pytest.mark.parametrize("top", ["README.md + pyproject.toml", *SCANNED])
def test_every_module_script_and_path_named_exists(top):
    files = [p for p in _scanned_files() if (p.relative_to(ROOT).parts[0] == top if top in SCANNED
                                             else p.parent == ROOT)]
    assert files
    problems = [problem for path in files for problem in _problems(str(path.relative_to(ROOT)), _texts(path))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("comment", [
    "# the one tolerant reader (hostdata.py)",
    "# the run's timeline (progress.PhaseLog)",
    "# see vast_harness/ops/reap.py",
    "# `vast_harness.ops.status.collect`",
    "# `vast_harness.views.status.no_such_name`",
    "# python scripts/chaos.py --replay SEED",
    "# the cap guard (caps/capguard.py)",
    "# a reap's evidence directory (ops/reap.py names it so)",
])
def test_a_stale_reference_is_found(tmp_path, comment):
    """The checks can fail: each form of a reference to something that is not there is reported."""
    module = tmp_path / "probe.py"
    module.write_text(f"{comment}\nx = 1\n")
    assert _problems("probe.py", _python_texts(module)), comment


def test_references_that_exist_pass(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text('"""views/status.py, vast_harness.views.orphans.judge, live.PhaseLog, scripts/bench/chaos.py, '
                      'guard.py, tests/remote/test_gpu.py::test_x, remote/training/determinism.set_determinism"""\n')
    assert _problems("probe.py", _python_texts(module)) == []
