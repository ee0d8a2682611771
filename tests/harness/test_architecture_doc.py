"""docs/architecture.md checks itself against the code: the layer drawing is pyproject's import-linter layers,
the package table lists every module of every package (and no other), each package says what it is, and the
counts and times the page states are the constants the code uses."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from vast_harness.host.bundle import HOST_PAYLOAD
from vast_harness.host.onstart import ONSTART_LIMIT_CHARS
from vast_harness.market.offers import MAX_PAGES
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import Timeouts

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vast_harness"
PAGE = ROOT / "docs" / "architecture.md"
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
SHARE_WORDS = {0.5: "half", 0.25: "quarter"}


def _page() -> str:
    return PAGE.read_text()


def _flat(text: str) -> str:
    """The page's prose with its line breaks and indents as single spaces, for phrases that wrap."""
    return re.sub(r"\s+", " ", text)


def _drawn_layers(text: str) -> list[set[str]]:
    """The drawing under "Import arrows": each line's names before the description, `│` between siblings; a
    line that starts with `│` goes on naming the layer above."""
    block = text.split("## Import arrows", 1)[1].split("```", 2)[1]
    layers: list[set[str]] = []
    for line in block.splitlines():
        names_part = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if names_part in ("", "│"):
            continue
        names = {n.strip() for n in names_part.split("│") if n.strip()}
        if names_part.startswith("│"):
            layers[-1] |= names
        else:
            layers.append(names)
    return layers


def _declared_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["type"] == "layers")
    return [{n.strip().removeprefix("vast_harness.") for n in layer.split("|")} for layer in layers]


def test_the_drawing_is_the_declared_layers():
    assert _drawn_layers(_page()) == _declared_layers()


def _table_cells(text: str) -> dict[str, str]:
    """The package table: each row's part (`run/`, `api.py`) and its last column, as written."""
    table = text.split("| package | its job | modules |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.strip().splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        part = re.fullmatch(r"`([\w./]+)`", cells[0])
        assert part, line
        assert part.group(1) not in rows, f"{part.group(1)} has two rows"
        rows[part.group(1)] = cells[-1]
    return rows


def _table_rows(text: str) -> dict[str, list[str]]:
    """Each row's part and the modules its last column names."""
    return {part: re.findall(r"`(\w+)`", cell) for part, cell in _table_cells(text).items()}


def _parts() -> dict[str, list[str]]:
    """Each package of the control plane with its modules (entry points like `__main__` aside), and each
    top-level module with none."""
    parts: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            parts[f"{path.name}/"] = sorted(p.stem for p in path.glob("*.py") if not p.stem.startswith("__"))
        elif path.suffix == ".py" and not path.stem.startswith("__"):
            parts[path.name] = []
    return parts


def test_no_module_list_trails_off():
    trailing = [part for part, cell in _table_cells(_page()).items() if "…" in cell or "..." in cell]
    assert not trailing


def test_the_package_table_has_a_row_for_every_part_and_no_other():
    rows, parts = _table_rows(_page()), _parts()
    assert sorted(rows) == sorted(parts), {"no row": sorted(set(parts) - set(rows)),
                                           "no such part": sorted(set(rows) - set(parts))}


@pytest.mark.parametrize("part", sorted(p for p in _parts() if p.endswith("/")))
def test_each_row_lists_exactly_its_package_modules(part):
    listed = _table_rows(_page())[part]
    assert len(listed) == len(set(listed)), f"{part}: a module listed twice"
    actual = set(_parts()[part])
    assert set(listed) == actual, {"not listed": sorted(actual - set(listed)),
                                   "no such module": sorted(set(listed) - actual)}


def test_the_table_check_can_fail():
    """A row that names a module that is not there, and one that misses one, are both caught."""
    page = _page()
    run_row = next(line for line in page.splitlines() if line.startswith("| `run/` |"))
    renamed = page.replace(run_row, run_row.replace("`stuck`", "`stuck_not_a_module`"))
    shortened = page.replace(run_row, run_row.replace("`stuck`", "…"))
    for text in (renamed, shortened):
        assert set(_table_rows(text)["run/"]) != set(_parts()["run/"])


@pytest.mark.parametrize("init", sorted(PACKAGE.glob("*/__init__.py")), ids=lambda p: p.parent.name)
def test_every_package_says_what_it_is(init):
    """A docstring that only repeats the package's name tells a reader nothing: each says what the part holds
    and why it stands apart, in a sentence or more."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    name = init.parent.name
    assert doc.strip().rstrip(".").lower() != name, f"{name}/__init__.py only repeats its name"
    assert len(doc.split()) >= 15, f"{name}/__init__.py: {doc!r}"


def _host_scripts() -> list[str]:
    return [Path(p).name for p in HOST_PAYLOAD if p.startswith("scripts/")]


@pytest.mark.parametrize("phrase", [
    pytest.param(lambda: f"up to {MAX_PAGES} pages of `POST /api/v0/bundles/`", id="offer pages"),
    pytest.param(lambda: f"`host/onstart.py` (< {ONSTART_LIMIT_CHARS} characters)", id="onstart limit"),
    pytest.param(lambda: f"`vast/answer_bound.py`, {Timeouts().total_s:g} s", id="whole-answer bound"),
    pytest.param(lambda: f"may use the first {SHARE_WORDS[TeardownBudget.PRELUDE_SHARE]} of the teardown margin",
                 id="teardown prelude"),
    pytest.param(lambda: f"After a signal the pull gets at most {TeardownBudget.SIGNAL_PULL_MAX_S:g} s",
                 id="signal pull"),
    pytest.param(lambda: f"a {SHARE_WORDS[TeardownBudget.GUARD_SHARE]} of the teardown margin before the cap",
                 id="cap guard"),
    pytest.param(lambda: f"within {TeardownBudget.SIGNAL_DELETE_WITHIN_S:g} s (the run keeps exit 130)",
                 id="guard after a signal"),
    pytest.param(lambda: f"{NUMBER_WORDS[len(_host_scripts())]} of them go to the host", id="host scripts, top"),
    pytest.param(lambda: f"the {NUMBER_WORDS[len(_host_scripts())]} host scripts (`"
                 + "`, `".join(_host_scripts()) + "`)", id="host scripts, bundle"),
])
def test_the_figures_the_page_states_are_the_code_constants(phrase):
    assert phrase() in _flat(_page())
