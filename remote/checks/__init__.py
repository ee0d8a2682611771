"""Evidence checkers: a run's files judged by re-deriving their claims, never by trusting a recorded verdict.

The host runs them on what it just wrote (a host that produced bad evidence fails its own step), and the same
files can be checked anywhere later, so they import the standard library only, never torch.
`remote.checks.<kind>.check(path: Path) -> list[str]` of failed claims (empty = valid), one module per kind;
`scripts/check_gpu_evidence.py --kind KIND FILE...` dispatches here through `run()`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

KINDS = ("mfu", "proofs", "mps", "receipt")


class CheckerMissing(RuntimeError):
    """The checker module for a kind is not installed in this tree."""


def load_checker(kind: str) -> Callable[[Path], list[str]]:
    if kind not in KINDS:
        raise CheckerMissing(f"unknown evidence kind {kind!r}; known: {', '.join(KINDS)}")
    try:
        module = importlib.import_module(f"remote.checks.{kind}")
    except ModuleNotFoundError as exc:
        if exc.name != f"remote.checks.{kind}":
            raise
        raise CheckerMissing(f"no checker for kind {kind!r}: remote/checks/{kind}.py is not present") from None
    if not callable(getattr(module, "check", None)):
        raise CheckerMissing(f"remote/checks/{kind}.py has no check(path) function")
    check: Callable[[Path], list[str]] = module.check
    return check


def run(kind: str, paths: list[Path]) -> list[tuple[Path, list[str]]]:
    """Check every file; returns (path, failed claims) per file, in order."""
    check = load_checker(kind)
    return [(p, check(p)) for p in paths]
