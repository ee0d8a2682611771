"""The exit-code decision as a table: `decide_exit` and `with_guard` are pure functions of what the run knows."""

from __future__ import annotations

import pytest

from vast_harness.errors import ExitCode as E
from vast_harness.run.verdict import ExitFacts, decide_exit, with_guard, work_outcome

OVER = "accrued $1.000000 is over the $0.5 cap"
GONE_BY_OTHER = {7: "a read of it no longer shows it"}

DECIDE = [  # (the run's own code, the facts, the exit code, words the message must hold)
    (E.PASSED, ExitFacts(), E.PASSED, "passed"),
    (E.FAILED, ExitFacts(), E.FAILED, "own"),
    (E.PASSED, ExitFacts(unproven=[7]), E.NOT_PROVEN_GONE, "teardown NOT proven for instance(s) [7]"),
    (E.INTERRUPTED, ExitFacts(unproven=[7]), E.NOT_PROVEN_GONE, "teardown NOT proven"),
    (E.NOT_PROVEN_GONE, ExitFacts(unproven=[7]), E.NOT_PROVEN_GONE, "own"),
    (E.PASSED, ExitFacts(unresolved=["vh-a", "vh-b"]), E.NOT_PROVEN_GONE, "label(s) ['vh-a', 'vh-b']"),
    (E.CAP_REACHED, ExitFacts(unproven=[7], over_cap=OVER), E.NOT_PROVEN_GONE, "may still bill"),
    (E.PASSED, ExitFacts(vanished=GONE_BY_OTHER), E.FAILED, "instance 7 was deleted by someone else"),
    (E.UNQUALIFIED_DRIVER, ExitFacts(vanished=GONE_BY_OTHER), E.FAILED, "proven absent since"),
    (E.CAP_REACHED, ExitFacts(vanished=GONE_BY_OTHER), E.CAP_REACHED, "deleted by someone else"),
    (E.PASSED, ExitFacts(over_cap=OVER), E.CAP_REACHED, f"over the cap: {OVER}"),
    (E.FAILED, ExitFacts(over_cap=OVER), E.CAP_REACHED, "over the cap"),
    (E.UNQUALIFIED_DRIVER, ExitFacts(over_cap=OVER), E.CAP_REACHED, "over the cap"),
    (E.INTERRUPTED, ExitFacts(over_cap=OVER), E.INTERRUPTED, "own"),  # a signal keeps its code
    (E.BAD_INPUT, ExitFacts(over_cap=OVER), E.BAD_INPUT, "own"),
    (E.NO_OFFER, ExitFacts(over_cap=OVER), E.NO_OFFER, "own"),
    (E.PASSED, ExitFacts(write_failures=["a: full"]), E.FAILED, "1 evidence/ledger write(s) failed"),
    (E.PASSED, ExitFacts(write_failures=["a: full"]), E.FAILED, "deleted and proven absent, but 1"),
    # red team r47 F3: a kept host's command never claims a deletion it did not make
    (E.PASSED, ExitFacts(held=True, write_failures=["a: full"]), E.FAILED, "the kept host stays held, but 1"),
    (E.PASSED, ExitFacts(write_failures=["a: x", "b: x", "c: x", "d: x", "e: x"]), E.FAILED, "and 2 more: d, e"),
    (E.FAILED, ExitFacts(write_failures=["a: full"]), E.FAILED, "own"),
    (E.PASSED, ExitFacts(over_cap=OVER, write_failures=["a: full"]), E.CAP_REACHED, "over the cap"),
    (E.UNQUALIFIED_DRIVER, ExitFacts(), E.UNQUALIFIED_DRIVER, "own"),
    (E.UNQUALIFIED_DRIVER, ExitFacts(unqualified_ok=True), E.PASSED, "(exit 0 by --unqualified-ok)"),
    (E.UNQUALIFIED_DRIVER, ExitFacts(unqualified_ok=True, write_failures=["a: x"]), E.FAILED, "write(s) failed"),
]


@pytest.mark.parametrize(("code", "facts", "expected", "says"), DECIDE)
def test_decide_exit(code, facts, expected, says):
    message = "passed" if code == E.PASSED else "own"
    got_code, got_message = decide_exit(code, message, facts)
    assert got_code == expected
    assert says in got_message


WHY = "the time cap is 3.0 s away and the run had not sent its own DELETE: the cap guard sent the DELETE"
GUARD = [  # (code, message, the guard's reason, after the outcome?, the exit code, the message)
    (E.PASSED, "passed", None, False, E.PASSED, "passed"),
    (E.PASSED, "passed", WHY, False, E.CAP_REACHED, WHY),
    (E.FAILED, "step x failed", WHY, False, E.CAP_REACHED, f"{WHY}; then step x failed"),
    (E.FAILED, "", WHY, False, E.CAP_REACHED, WHY),
    (E.INTERRUPTED, "SIGINT", WHY, False, E.INTERRUPTED, f"SIGINT; {WHY}"),
    (E.FAILED, f"cancelled: {WHY}", WHY, False, E.FAILED, f"cancelled: {WHY}"),  # already said
    (E.PASSED, "passed", WHY, True, E.CAP_REACHED, WHY),
    (E.UNQUALIFIED_DRIVER, "passed on a driver", WHY, True, E.CAP_REACHED, WHY),
    (E.FAILED, "step x failed", WHY, True, E.FAILED, f"step x failed; then {WHY}"),
    (E.INTERRUPTED, "SIGTERM", WHY, True, E.INTERRUPTED, f"SIGTERM; {WHY}"),
]


@pytest.mark.parametrize(("code", "message", "why", "after", "expected", "expected_message"), GUARD)
def test_with_guard(code, message, why, after, expected, expected_message):
    assert with_guard(code, message, why, after_outcome=after) == (expected, expected_message)


def test_work_outcome():
    assert work_outcome(True) == (E.PASSED, "passed")
    assert work_outcome(False) == (E.UNQUALIFIED_DRIVER, "passed on a driver outside the qualified list")
