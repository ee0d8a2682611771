"""The exit-code decision, as pure functions of what the run knows once its teardown is over.

Precedence, highest first: an instance not proven gone or a create of unknown outcome (3: it may still bill)
beats a cap overrun (6: never a pass, never hidden behind a failure) beats lost evidence (1: a pass with
incomplete evidence is no pass). A signal (130), bad input (2) and no offer (5) keep their own code over a
cap overrun. The cap guard's DELETE turns a pass, and a failure that followed it, into the cap's stop (6).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from vast_harness.errors import ExitCode

Outcome = tuple[ExitCode, str]
WRITE_FAILURES_NAMED = 3  # the first few failed writes are quoted in the message; the rest only named
_PASSES = (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER)


class ExitFacts(BaseModel):
    """What the teardown, the meter and the writes say, read once the teardown is over."""

    model_config = ConfigDict(frozen=True)

    unproven: list[int] = Field(default_factory=list)  # instances whose teardown did not prove them gone
    unresolved: list[str] = Field(default_factory=list)  # labels whose create no answer or read settled (sorted)
    vanished: dict[int, str] = Field(default_factory=dict)  # instance -> how we learnt someone else deleted it
    # instance -> why: a create answer named it, no read showed its label, and no DELETE of the run's went to it
    left_alone: dict[int, str] = Field(default_factory=dict)
    over_cap: str | None = None  # why the run went over a cap (CostMeter.over_cap)
    write_failures: list[str] = Field(default_factory=list)  # evidence or ledger writes that missed the disk
    unqualified_ok: bool = False  # --unqualified-ok: a pass on an unqualified driver exits 0
    held: bool = False  # the instance outlives the run (a kept host's command): nothing was deleted


def work_outcome(driver_qualified: bool) -> Outcome:
    """The outcome of a run whose work all succeeded."""
    if driver_qualified:
        return ExitCode.PASSED, "passed"
    return ExitCode.UNQUALIFIED_DRIVER, "passed on a driver outside the qualified list"


def with_guard(code: ExitCode, message: str, guard_reason: str | None, *, after_outcome: bool = False) -> Outcome:
    """The run's outcome once the cap guard has sent its DELETE under it (`guard_reason`): a pass is not one,
    and a failure that followed (the host gone mid-step) is the cap's: exit 6, naming the guard.
    `after_outcome`: the guard fired after the run had its outcome (in the teardown's prelude): a failure
    keeps its code."""
    why = guard_reason
    if why is None or why in message:
        return code, message
    if code == ExitCode.INTERRUPTED:  # the signal's own code; the guard only sent its DELETE for it
        return code, f"{message}; {why}"
    if after_outcome:
        if code in _PASSES:
            return ExitCode.CAP_REACHED, why
        return code, f"{message}; then {why}"
    return ExitCode.CAP_REACHED, why if message in ("", "passed") else f"{why}; then {message}"


def decide_exit(code: ExitCode, message: str, facts: ExitFacts) -> Outcome:
    """The exit code from what is known: unproven teardown beats a cap overrun beats lost evidence."""
    # exit 3 outranks a cap overrun, but never hides it: the message says both
    over = f"; and over the cap: {facts.over_cap}" if facts.over_cap and facts.over_cap not in message else ""
    # Said whatever the code: an instance the run did not delete because it is not proven the run's.
    alone = "; ".join(why for _, why in sorted(facts.left_alone.items()) if why not in message)
    if alone:
        message = f"{message}; {alone}" if message else alone
    if facts.unproven:
        if code != ExitCode.NOT_PROVEN_GONE:
            message = (f"teardown NOT proven for instance(s) {facts.unproven}: they may still bill. "
                       f"The ledger names them; run `vast-e2e reap`{over}. ({message})")
        return ExitCode.NOT_PROVEN_GONE, message
    if facts.unresolved:  # a create that may yet appear: the ledger's create_unresolved names it
        if code != ExitCode.NOT_PROVEN_GONE:
            message = (f"create outcome unknown for label(s) {facts.unresolved}: an instance "
                       f"may appear and bill. Run `vast-e2e reap`, which keeps looking for them{over}. ({message})")
        return ExitCode.NOT_PROVEN_GONE, message
    if facts.vanished and "deleted by someone else" not in message:
        who = "; ".join(f"instance {i} was deleted by someone else: no DELETE of ours ({how})"
                        for i, how in sorted(facts.vanished.items()))
        code = ExitCode.FAILED if code in _PASSES else code
        message = f"{who}; proven absent since ({message})"
    # over a cap is never a pass, nor hidden behind a failure: a signal, bad input or no offer keep theirs
    if facts.over_cap and code in (ExitCode.PASSED, ExitCode.FAILED, ExitCode.UNQUALIFIED_DRIVER):
        if code == ExitCode.PASSED and message == "passed":  # not "(passed)": the run did not pass
            message = "the work itself passed"
        return ExitCode.CAP_REACHED, f"over the cap: {facts.over_cap} ({message})"
    failures = facts.write_failures
    if failures and code in _PASSES:
        more = failures[WRITE_FAILURES_NAMED:]  # named all the same: the record itself may be one that failed
        rest = f"; and {len(more)} more: {', '.join(f.split(':', 1)[0] for f in more)}" if more else ""
        state = "the kept host stays held" if facts.held else "the instance is deleted and proven absent"
        return ExitCode.FAILED, (f"{state}, but {len(failures)} evidence/ledger "
                                 f"write(s) failed, so the evidence is incomplete: "
                                 f"{'; '.join(failures[:WRITE_FAILURES_NAMED])}{rest} ({message})")
    if code == ExitCode.UNQUALIFIED_DRIVER and facts.unqualified_ok:  # driver_qualified: false stays
        return ExitCode.PASSED, f"{message} (exit 0 by --unqualified-ok)"
    return code, message


__all__ = ["ExitFacts", "Outcome", "decide_exit", "with_guard", "work_outcome"]
