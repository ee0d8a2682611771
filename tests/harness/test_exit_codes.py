"""One exit-code table: the README's, `errors.ExitCode`, and the one mapping from an error to its code."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from vast_harness import errors
from vast_harness.errors import ExitCode, exit_code_for, worst

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_ROW = re.compile(r"^\| (\d+) \| `(\w+)` \|", flags=re.M)


def test_readme_table_is_the_enum():
    """The README's one table lists every ExitCode, by value and by name, in the enum's order, and nothing else."""
    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [(int(code), name) for code, name in _ROW.findall(section)]
    assert rows == [(int(c), c.name) for c in ExitCode]
    assert len(re.findall(r"^\| \d+ \|", section, flags=re.M)) == len(rows)  # no row outside the pattern


def test_the_docs_link_to_the_readme_table_instead_of_copying_it():
    """One table: a page of docs/ that speaks of exit codes links to the README's, and none draws its own."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        assert not re.search(r"^\| (0|130) \|", text, flags=re.M), f"{page.name} copies the exit-code table"
        if re.search(r"^#+ .*[Ee]xit codes", text, flags=re.M):
            assert "README.md#exit-codes" in text, f"{page.name} has an exit-code section without the link"


def _error_classes() -> dict[str, type[BaseException]]:
    return {name: obj for name, obj in vars(errors).items()
            if isinstance(obj, type) and issubclass(obj, (errors.HarnessError, errors.Interrupted))}


def _doc_tree() -> dict[str, tuple[str, tuple[int, ...]]]:
    """errors.py's docstring tree: each class -> (its parent in the tree, the exit codes its line names)."""
    tree: dict[str, tuple[str, tuple[int, ...]]] = {}
    parents = ["BaseException"]
    for line in (errors.__doc__ or "").splitlines():
        m = re.search(r"[├└]── (\w+)", line)
        if not m:
            continue
        depth = m.start() // 4  # four columns per level ("├── ", "│   ")
        del parents[depth:]
        codes = re.search(r"exit (\d+(?: \| \d+)*)\s*$", line)
        tree[m.group(1)] = (parents[depth - 1], tuple(int(c) for c in codes.group(1).split(" | ")) if codes else ())
        parents.append(m.group(1))
    return tree


def test_the_docstring_tree_is_the_error_hierarchy():
    """Every error class is in errors.py's tree under its real base class: the tree is what a reader (and the
    README's table) relies on to know what each error does, so a class added, moved or renamed must show."""
    tree, classes = _doc_tree(), _error_classes()
    assert set(tree) == set(classes), (set(tree) ^ set(classes))
    for name, (parent, _codes) in tree.items():
        base = classes[name].__bases__[0]
        if parent == "BaseException":  # the tree's roots: HarnessError is an Exception, Interrupted is not
            assert base in (Exception, BaseException), name
        else:
            assert base.__name__ == parent, (name, base.__name__, parent)


@pytest.mark.parametrize("name", sorted(_doc_tree()))
def test_every_error_exits_with_the_code_its_tree_line_names(name):
    """A line naming `exit N` is the class's own code; a line naming none inherits its parent's (and so must
    not override it); `exit A | B` is decided per instance (RunCancelled), each a member of ExitCode."""
    cls, (parent, codes) = _error_classes()[name], _doc_tree()[name]
    assert all(c in ExitCode._value2member_map_ for c in codes), codes
    if len(codes) > 1:
        assert "exit_code" not in vars(cls) and "exit_code" in cls.__init__.__code__.co_varnames
    elif codes:
        assert cls.exit_code == codes[0], (name, cls.exit_code, codes)
    else:
        assert "exit_code" not in vars(cls), f"{name} sets a code its tree line does not name"
        assert cls.exit_code == _error_classes()[parent].exit_code


@pytest.mark.parametrize(("exc", "code"), [
    (errors.ConfigError("x"), 2),
    (errors.LedgerWriteError("x"), 2),
    (errors.AuthError(method="GET", path="/", status=401), 2),
    (errors.RateLimitError(method="GET", path="/", status=429), 1),
    (errors.NoOfferError("x"), 5),
    (errors.CapReachedError("x"), 6),
    (errors.StepFailedError("x"), 1),
    (errors.BootFailed("x"), 1),
    (errors.SshConnectError("x", attempts=[]), 1),
    (errors.TransferAbandoned("x"), 1),
    (errors.CreateUnresolved("x", label="vh-1"), 3),
    (errors.RunCancelled("fleet cap", ExitCode.CAP_REACHED), 6),
    (errors.RunCancelled("signal", ExitCode.INTERRUPTED), 130),
    (errors.Interrupted(signal.SIGTERM), 130),
    (KeyboardInterrupt(), 130),
    (ValueError("a bug"), 1),
])
def test_exit_code_for(exc, code):
    assert exit_code_for(exc) == code


def test_worst_ranks_by_precedence():
    assert worst([0, 4, 6, 3, 130]) == ExitCode.NOT_PROVEN_GONE
    assert worst([0, 130, 1]) == ExitCode.INTERRUPTED
    assert worst([0, 1, 6, 5]) == ExitCode.FAILED
    assert worst([0, 77]) == ExitCode.FAILED  # a code outside the table is no pass
    assert worst([]) == ExitCode.PASSED
    assert set(errors.PRECEDENCE) == set(ExitCode)


def test_describe_names_the_unexpected():
    assert errors.describe(ValueError("boom")) == "unexpected ValueError: boom"
    assert errors.describe(errors.Interrupted(signal.SIGINT)) == "interrupted by SIGINT"
    assert errors.describe(errors.CapReachedError("cap")) == "cap"
