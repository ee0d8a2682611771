"""One exit-code table: the README's, `errors.ExitCode`, and the one mapping from an error to its code."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from vast_harness import errors
from vast_harness.errors import ExitCode, exit_code_for, worst

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_the_enum():
    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}
    assert codes == {int(c) for c in ExitCode}


def _leaf_errors() -> list[type[BaseException]]:
    return [obj for obj in vars(errors).values()
            if isinstance(obj, type) and issubclass(obj, (errors.HarnessError, errors.Interrupted))]


@pytest.mark.parametrize("cls", _leaf_errors(), ids=lambda c: c.__name__)
def test_every_error_maps_to_a_listed_code(cls):
    assert isinstance(cls.exit_code, ExitCode) or cls is errors.RunCancelled


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
